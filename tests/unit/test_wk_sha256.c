/* Unit tests for wk_sha256: known vectors, incremental == one-shot, token-id digest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wk_sha256.h"

static void
test_vectors(void **state)
{
    (void)state;
    char hex[WK_SHA256_HEX_LEN];
    wk_sha256_hex("", 0, hex);
    assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    wk_sha256_hex("abc", 3, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

static void
test_incremental(void **state)
{
    (void)state;
    wk_sha256 s;
    assert_int_equal(wk_sha256_init(&s), WK_OK);
    wk_sha256_update(&s, "a", 1);
    wk_sha256_update(&s, "", 0);
    wk_sha256_update(&s, "bc", 2);
    uint8_t dg[WK_SHA256_LEN];
    wk_sha256_final(&s, dg);
    char hex[WK_SHA256_HEX_LEN];
    wk_sha256_to_hex(dg, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    wk_sha256_fini(&s); /* idempotent after final */
    wk_sha256_fini(NULL);
}

static void
test_token_ids(void **state)
{
    (void)state;
    /* Each id as int64 LE: [1, -1, 300] must equal the digest of those 24 bytes. */
    int32_t ids[] = {1, -1, 300};
    uint8_t raw[24] = {1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                       0x2c, 1, 0, 0, 0, 0, 0, 0};
    char a[WK_SHA256_HEX_LEN], b[WK_SHA256_HEX_LEN];
    assert_int_equal(wk_sha256_token_ids_hex(ids, 3, a), WK_OK);
    wk_sha256_hex(raw, sizeof(raw), b);
    assert_string_equal(a, b);
    /* Longer than the internal buffer. */
    size_t n = 1000;
    int32_t *many = malloc(n * sizeof(*many));
    uint8_t *bytes = calloc(n, 8);
    for (size_t i = 0; i < n; i++) {
        many[i] = (int32_t)(i * 7919);
        for (int k = 0; k < 4; k++)
            bytes[i * 8 + k] = (uint8_t)((uint32_t)many[i] >> (8 * k));
    }
    assert_int_equal(wk_sha256_token_ids_hex(many, n, a), WK_OK);
    wk_sha256_hex(bytes, n * 8, b);
    assert_string_equal(a, b);
    free(many);
    free(bytes);
}

static void
test_file(void **state)
{
    (void)state;
    char path[] = "/tmp/wk_sha256_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("abc", f);
    fclose(f);
    char hex[WK_SHA256_HEX_LEN];
    assert_int_equal(wk_sha256_file_hex(path, hex, NULL), WK_OK);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    unlink(path);
    wk_diag d = {{0}};
    assert_int_equal(wk_sha256_file_hex(path, hex, &d), WK_ENOENT);
    assert_non_null(strstr(d.msg, path));
}

/* A copy goes on independently: two digests from one common prefix. */
static void
test_copy(void **state)
{
    (void)state;
    wk_sha256 a, b;
    uint8_t da[WK_SHA256_LEN], db[WK_SHA256_LEN];
    char ha[WK_SHA256_HEX_LEN], hb[WK_SHA256_HEX_LEN], want[WK_SHA256_HEX_LEN];
    assert_int_equal(wk_sha256_init(&a), WK_OK);
    wk_sha256_update(&a, "ab", 2);
    assert_int_equal(wk_sha256_copy(&b, &a), WK_OK);
    wk_sha256_update(&a, "c", 1);
    wk_sha256_final(&a, da);
    wk_sha256_final(&b, db);
    wk_sha256_to_hex(da, ha);
    wk_sha256_to_hex(db, hb);
    assert_string_equal(ha, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    wk_sha256_hex("ab", 2, want);
    assert_string_equal(hb, want);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_copy),
        cmocka_unit_test(test_incremental),
        cmocka_unit_test(test_token_ids),
        cmocka_unit_test(test_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
