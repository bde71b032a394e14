/*
 * replay_main: a plain main() for the libFuzzer harnesses in tests/fuzz, so
 * that `meson test` (gcc, no libFuzzer) replays the stored corpus through
 * every harness. Each argument is a file, or a folder whose files are
 * replayed (recursively, in name order). Each file is read whole and handed
 * to LLVMFuzzerTestOneInput() once; a harness reports a broken invariant by
 * aborting, which fails the test. It never generates inputs (tests/fuzz/run-fuzz
 * does that with clang).
 *
 * Exits 0 when every input ran, 1 when an argument cannot be read or when
 * nothing at all was replayed (an empty or missing corpus must not pass).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned long replay_count; /* inputs replayed so far */

/* Reads path whole and runs it; 0 on success, -1 when it cannot be read. */
static int
replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (buf == NULL) {
            fprintf(stderr, "%s: out of memory\n", path);
            fclose(f);
            return -1;
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        cap *= 2;
        uint8_t *nb = realloc(buf, cap);
        if (nb == NULL)
            free(buf);
        buf = nb;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "%s: read error\n", path);
        free(buf);
        return -1;
    }
    /* an exact-size copy, so that ASan sees reads past the input's end */
    uint8_t *in = malloc(n ? n : 1);
    if (in == NULL) {
        free(buf);
        return -1;
    }
    memcpy(in, buf, n);
    free(buf);
    printf("replay: %s (%zu bytes)\n", path, n);
    fflush(stdout);
    LLVMFuzzerTestOneInput(in, n);
    free(in);
    replay_count++;
    return 0;
}

static int
replay_name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replays a file, or every file under a folder; 0 on success. */
static int
replay_path(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        perror(path);
        return -1;
    }
    if (!S_ISDIR(sb.st_mode))
        return replay_file(path);
    DIR *d = opendir(path);
    if (d == NULL) {
        perror(path);
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof(*names));
            if (nn == NULL) {
                rc = -1;
                break;
            }
            names = nn;
        }
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        names[n] = malloc(len);
        if (names[n] == NULL) {
            rc = -1;
            break;
        }
        snprintf(names[n], len, "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    if (n > 0)
        qsort(names, n, sizeof(*names), replay_name_cmp);
    for (size_t i = 0; i < n; i++) {
        if (rc == 0 && replay_path(names[i]) != 0)
            rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

int
main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (replay_path(argv[i]) != 0)
            return 1;
    }
    if (replay_count == 0) {
        fprintf(stderr, "replay: no input found under the arguments\n");
        return 1;
    }
    printf("replay: %lu inputs, no invariant broken\n", replay_count);
    return 0;
}
