/*
 * be: backend lookup. The CPU backend is always linked; the CUDA backend
 * exists only when the build found a CUDA toolkit (WKVM_HAVE_CUDA).
 * Never logs.
 */
#include "be.h"

#include <stddef.h>
#include <string.h>

#ifdef WKVM_HAVE_CUDA
extern const be_ops be_cuda_ops;
wk_err be_cuda_device_check_impl(int device, wk_diag *d); /* be_cuda.c */
#endif

const be_ops *
be_cuda_ops_get(void)
{
#ifdef WKVM_HAVE_CUDA
    return &be_cuda_ops;
#else
    return NULL;
#endif
}

wk_err
be_cuda_device_check(int device, wk_diag *d)
{
#ifdef WKVM_HAVE_CUDA
    return be_cuda_device_check_impl(device, d);
#else
    (void)device;
    return wk_diag_set(d, WK_ENOENT, "this build has no CUDA backend (nvcc was not found)");
#endif
}

const be_ops *
be_ops_find(const char *name)
{
    if (name == NULL)
        return NULL;
    if (strcmp(name, "cpu") == 0)
        return &be_cpu_ops;
    if (strcmp(name, "cuda") == 0)
        return be_cuda_ops_get();
    if (strcmp(name, "auto") == 0) {
        /*
         * The CUDA steps are written but have never run on a device (no GPU
         * so far), so "auto" stays on the CPU until the gpu suite has passed
         * on one (bench/gpu.sh runs it); "cuda" selects it explicitly.
         */
        return &be_cpu_ops;
    }
    return NULL;
}
