/*
 * k_launch: how a launcher reports the error of its own launches, and only
 * those. Internal to kernels/.
 *
 * The runtime keeps one "last error" per host thread. Any failing runtime
 * call sets it, including answers the caller handles and moves on from (a
 * polled cudaStreamQuery's cudaErrorNotReady, a cudaMalloc that ran out of
 * memory), and <<< >>> reports only through it. A launcher that read it
 * after its launch would return such a leftover and fail a healthy step.
 * So every launcher clears it on entry (k_launch_begin) and returns what
 * its own launches left (k_launch_end). A sticky error (a device fault)
 * survives the clear and is reported, as it must be.
 */
#ifndef K_LAUNCH_CUH
#define K_LAUNCH_CUH

#include <cuda_runtime.h>

static inline void
k_launch_begin(void)
{
    (void)cudaGetLastError();
}

static inline int
k_launch_end(void)
{
    return (int)cudaGetLastError();
}

#endif /* K_LAUNCH_CUH */
