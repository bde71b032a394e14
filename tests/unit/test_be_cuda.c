/*
 * Unit tests for be_cuda's device check (built only with the CUDA backend;
 * needs no device): when the gpu suite may skip and when it must fail.
 * The rule: skip only when there is no device to use (no /dev/nvidia*
 * node, cudaErrorNoDevice, fewer devices than the ordinal); any other
 * runtime answer (a driver older than the runtime needs...) is a failure
 * that names the runtime's error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cuda_runtime.h>
#include <glob.h>
#include <string.h>

#include "be.h"
#include "be_cuda_priv.h"

static void
test_no_device_nodes_skip(void **state)
{
    (void)state;
    wk_diag d = {{0}};
    /* whatever the runtime would have said: without device nodes there is nothing to use */
    assert_int_equal(be_cuda_device_classify(false, cudaErrorInsufficientDriver, 0, 0, &d),
                     WK_ENOENT);
    assert_non_null(strstr(d.msg, "/dev/nvidia"));
}

static void
test_no_device_skips(void **state)
{
    (void)state;
    wk_diag d = {{0}};
    assert_int_equal(be_cuda_device_classify(true, cudaErrorNoDevice, 0, 0, &d), WK_ENOENT);
    assert_non_null(strstr(d.msg, "no CUDA device"));
    assert_int_equal(be_cuda_device_classify(true, cudaSuccess, 1, 1, &d), WK_ENOENT);
    assert_non_null(strstr(d.msg, "no CUDA device 1 (1 present)"));
    assert_int_equal(be_cuda_device_classify(true, cudaSuccess, 2, -1, NULL), WK_ENOENT);
}

static void
test_broken_device_fails(void **state)
{
    (void)state;
    const cudaError_t broken[] = {cudaErrorInsufficientDriver, cudaErrorInitializationError,
                                  cudaErrorDevicesUnavailable, cudaErrorUnknown,
                                  cudaErrorCompatNotSupportedOnDevice};
    for (size_t i = 0; i < sizeof(broken) / sizeof(broken[0]); i++) {
        wk_diag d = {{0}};
        assert_int_equal(be_cuda_device_classify(true, broken[i], 0, 0, &d), WK_EDEVICE);
        /* the runtime's own words and the error's name, so the log says what to fix */
        assert_non_null(strstr(d.msg, cudaGetErrorString(broken[i])));
        assert_non_null(strstr(d.msg, cudaGetErrorName(broken[i])));
    }
}

static void
test_device_answers(void **state)
{
    (void)state;
    wk_diag d = {{0}};
    assert_int_equal(be_cuda_device_classify(true, cudaSuccess, 1, 0, &d), WK_OK);
    assert_int_equal(be_cuda_device_classify(true, cudaSuccess, 8, 7, &d), WK_OK);
}

/* On this machine: the live check agrees with the device nodes it finds. */
static void
test_live_check(void **state)
{
    (void)state;
    glob_t g;
    const bool nodes = glob("/dev/nvidia*", 0, NULL, &g) == 0 && g.gl_pathc > 0;
    if (nodes)
        globfree(&g);
    wk_diag d = {{0}};
    wk_err e = be_cuda_device_check(0, &d);
    if (!nodes) {
        assert_int_equal(e, WK_ENOENT);
        assert_non_null(strstr(d.msg, "/dev/nvidia"));
        return; /* the runtime was never asked (and, driverless, would answer an error) */
    }
    assert_true(e == WK_OK || e == WK_ENOENT || e == WK_EDEVICE);
    /* where a device answers, the check leaves the runtime's last error clean */
    if (e == WK_OK)
        assert_int_equal(cudaPeekAtLastError(), cudaSuccess);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_device_nodes_skip),
        cmocka_unit_test(test_no_device_skips),
        cmocka_unit_test(test_broken_device_fails),
        cmocka_unit_test(test_device_answers),
        cmocka_unit_test(test_live_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
