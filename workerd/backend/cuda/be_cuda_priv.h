/*
 * be_cuda_priv: what only tests need of be_cuda.c. Compiled only with the
 * CUDA backend.
 */
#ifndef BE_CUDA_PRIV_H
#define BE_CUDA_PRIV_H

#include <stdbool.h>

#include "wk_err.h"

/*
 * The decision behind be_cuda_device_check() (be.h), from what it saw:
 * have_nodes (a /dev/nvidia* node exists), ce (cudaGetDeviceCount's
 * cudaError_t), n_dev (the count it gave) and the ordinal asked for.
 * Pure: touches no device.
 */
wk_err be_cuda_device_classify(bool have_nodes, int ce, int n_dev, int device, wk_diag *d);

#endif /* BE_CUDA_PRIV_H */
