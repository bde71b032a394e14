/*
 * gpu_gate: the gpu suite's one rule for when a test may skip. A test skips
 * (exit 77) only when there is no CUDA device to use: no CUDA backend in the
 * build, no /dev/nvidia* node, cudaErrorNoDevice (be_cuda_device_check()
 * says WK_ENOENT). A device that is there but does not answer (a driver
 * older than the runtime needs, a bad state) fails the test with the
 * runtime's message: a broken machine must never look like a quiet skip.
 */
#ifndef GPU_GATE_H
#define GPU_GATE_H

#include <stdio.h>

#include "be.h"

/* -1: go on; else the exit code (77 or 1), after saying why. */
static inline int
gpu_gate(int device)
{
    wk_diag d = {{0}};
    wk_err e = be_cuda_device_check(device, &d);
    if (e == WK_OK)
        return -1;
    if (e == WK_ENOENT) {
        printf("skipped: %s\n", d.msg);
        return 77;
    }
    fprintf(stderr, "FAIL: CUDA device %d is there but unusable: %s\n", device, d.msg);
    return 1;
}

/*
 * The gate for device 0, then the CUDA backend's probe of it: -1 with its
 * name and memory in dev / *mem to go on, else the exit code (a device
 * that passes the check must also answer the probe).
 */
static inline int
gpu_gate_probe(const be_ops *cu, char *dev, size_t dev_len, uint64_t *mem)
{
    const int gate = gpu_gate(0);
    if (gate >= 0)
        return gate;
    wk_err pe = cu != NULL ? cu->probe(0, dev, dev_len, mem) : WK_ENOENT;
    if (pe != WK_OK) {
        fprintf(stderr, "FAIL: device 0 answers the check but not the probe: %s\n",
                wk_err_name(pe));
        return 1;
    }
    return -1;
}

#endif /* GPU_GATE_H */
