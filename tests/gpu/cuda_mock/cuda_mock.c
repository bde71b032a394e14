/*
 * cuda_mock: a host-memory stand-in for the parts of the CUDA runtime,
 * cuBLAS and NCCL the CUDA backend calls, so the backend's host code
 * (be_cuda*.c: every buffer size, offset, stride and launch argument) runs
 * on a machine without a GPU, with the kernels emulated in C (k_mock.c).
 * A development check, not a test of the CUDA kernels themselves: see
 * tests/gpu/cuda_mock/run.sh. "Device" memory is host memory, every
 * stream runs synchronously, cublasGemmEx is a plain loop in fp32.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <glob.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The backend looks for /dev/nvidia* before it asks the runtime: one node. */
int
glob(const char *pattern, int flags, int (*errfunc)(const char *, int), glob_t *pglob)
{
    (void)flags;
    (void)errfunc;
    if (strcmp(pattern, "/dev/nvidia*") != 0)
        return GLOB_NOMATCH;
    memset(pglob, 0, sizeof(*pglob));
    pglob->gl_pathc = 1;
    pglob->gl_pathv = calloc(2, sizeof(char *));
    pglob->gl_pathv[0] = strdup("/dev/nvidia0");
    return 0;
}

void
globfree(glob_t *pglob)
{
    for (size_t i = 0; pglob->gl_pathv != NULL && i < pglob->gl_pathc; i++)
        free(pglob->gl_pathv[i]);
    free(pglob->gl_pathv);
    pglob->gl_pathv = NULL;
}

/* the backend is built with _FILE_OFFSET_BITS=64: glob is glob64 there */
int glob64(const char *pattern, int flags, int (*errfunc)(const char *, int), glob_t *pglob);
void globfree64(glob_t *pglob);

int
glob64(const char *pattern, int flags, int (*errfunc)(const char *, int), glob_t *pglob)
{
    return glob(pattern, flags, errfunc, pglob);
}

void
globfree64(glob_t *pglob)
{
    globfree(pglob);
}

cudaError_t
cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}

cudaError_t
cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    (void)device;
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "cuda_mock (host memory)");
    p->totalGlobalMem = (size_t)16 << 30;
    p->major = 9;
    return cudaSuccess;
}

cudaError_t
cudaSetDevice(int device)
{
    (void)device;
    return cudaSuccess;
}

cudaError_t
cudaDeviceGetPCIBusId(char *id, int len, int device)
{
    snprintf(id, (size_t)len, "0000:00:%02d.0", device);
    return cudaSuccess;
}

cudaError_t
cudaGetLastError(void)
{
    return cudaSuccess;
}

const char *
cudaGetErrorString(cudaError_t e)
{
    return e == cudaSuccess ? "no error" : "cuda_mock error";
}

const char *
cudaGetErrorName(cudaError_t e)
{
    return e == cudaSuccess ? "cudaSuccess" : "cudaErrorMock";
}

/* Poisoned fresh memory: a kernel reading what nobody wrote gives NaN. */
static void *
mock_alloc(size_t n)
{
    float *p = malloc(n ? n : 1);
    if (p != NULL)
        for (size_t i = 0; i < n / sizeof(float); i++)
            p[i] = __builtin_nanf("");
    return p;
}

cudaError_t
cudaMalloc(void **p, size_t n)
{
    *p = mock_alloc(n);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t
cudaFree(void *p)
{
    free(p);
    return cudaSuccess;
}

cudaError_t
cudaMallocHost(void **p, size_t n)
{
    return cudaMalloc(p, n);
}

cudaError_t
cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    return cudaMalloc(p, n);
}

cudaError_t
cudaFreeHost(void *p)
{
    free(p);
    return cudaSuccess;
}

cudaError_t
cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    (void)kind;
    if (n > 0)
        memmove(dst, src, n);
    return cudaSuccess;
}

cudaError_t
cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s)
{
    (void)s;
    return cudaMemcpy(dst, src, n, kind);
}

cudaError_t
cudaMemset(void *p, int v, size_t n)
{
    memset(p, v, n);
    return cudaSuccess;
}

cudaError_t
cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
    (void)s;
    return cudaMemset(p, v, n);
}

static int mock_stream_obj;

cudaError_t
cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    (void)flags;
    *s = (cudaStream_t)(void *)&mock_stream_obj;
    return cudaSuccess;
}

cudaError_t
cudaStreamCreate(cudaStream_t *s)
{
    return cudaStreamCreateWithFlags(s, 0);
}

cudaError_t
cudaStreamDestroy(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}

cudaError_t
cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}

cudaError_t
cudaStreamQuery(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}

cudaError_t
cudaDeviceSynchronize(void)
{
    return cudaSuccess;
}

/* ------------------------------------------------------------------------ */
/* cuBLAS                                                                    */
/* ------------------------------------------------------------------------ */

static int mock_blas_obj;

cublasStatus_t
cublasCreate_v2(cublasHandle_t *h)
{
    *h = (cublasHandle_t)(void *)&mock_blas_obj;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t
cublasDestroy_v2(cublasHandle_t h)
{
    (void)h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t
cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    (void)h;
    (void)s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t
cublasSetWorkspace_v2(cublasHandle_t h, void *w, size_t n)
{
    (void)h;
    (void)w;
    (void)n;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t
cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
    (void)h;
    (void)m;
    return CUBLAS_STATUS_SUCCESS;
}

const char *
cublasGetStatusString(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "cuda_mock cublas error";
}

static float
mock_ld(const void *p, cudaDataType t, size_t i)
{
    if (t == CUDA_R_32F)
        return ((const float *)p)[i];
    const uint16_t v = ((const uint16_t *)p)[i];
    if (t == CUDA_R_16BF) {
        uint32_t u = (uint32_t)v << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    _Float16 h;
    memcpy(&h, &v, 2);
    return (float)h;
}

/* C (m x n, column-major, ldc) = op(A) (m x k) op(B) (k x n), fp32 accumulation in k order. */
cublasStatus_t
cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
             int n, int k, const void *alpha, const void *A, cudaDataType Atype, int lda,
             const void *B, cudaDataType Btype, int ldb, const void *beta, void *C,
             cudaDataType Ctype, int ldc, cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    (void)handle;
    (void)computeType;
    (void)algo;
    if (Ctype != CUDA_R_32F || transb != CUBLAS_OP_N)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    float *Cf = C;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float acc = 0.0f;
            for (int p = 0; p < k; p++) {
                const size_t ai = transa == CUBLAS_OP_N ? (size_t)p * lda + i : (size_t)i * lda + p;
                acc += mock_ld(A, Atype, ai) * mock_ld(B, Btype, (size_t)j * ldb + p);
            }
            float *c = Cf + (size_t)j * ldc + i;
            *c = al * acc + (be != 0.0f ? be * *c : 0.0f);
        }
    return CUBLAS_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* NCCL: not there                                                           */
/* ------------------------------------------------------------------------ */

ncclResult_t
ncclGetVersion(int *v)
{
    *v = 0;
    return ncclSuccess;
}

const char *
ncclGetErrorString(ncclResult_t r)
{
    (void)r;
    return "cuda_mock: no NCCL";
}

ncclResult_t
ncclGetUniqueId(ncclUniqueId *id)
{
    (void)id;
    return ncclSystemError;
}

ncclResult_t
ncclCommInitRankConfig(ncclComm_t *c, int n, ncclUniqueId id, int r, ncclConfig_t *cfg)
{
    (void)c;
    (void)n;
    (void)id;
    (void)r;
    (void)cfg;
    return ncclSystemError;
}

ncclResult_t
ncclCommInitRank(ncclComm_t *c, int n, ncclUniqueId id, int r)
{
    (void)c;
    (void)n;
    (void)id;
    (void)r;
    return ncclSystemError;
}

ncclResult_t
ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r)
{
    (void)c;
    *r = ncclSystemError;
    return ncclSystemError;
}

ncclResult_t
ncclCommAbort(ncclComm_t c)
{
    (void)c;
    return ncclSuccess;
}

ncclResult_t
ncclCommFinalize(ncclComm_t c)
{
    (void)c;
    return ncclSuccess;
}

ncclResult_t
ncclCommDestroy(ncclComm_t c)
{
    (void)c;
    return ncclSuccess;
}

ncclResult_t
ncclSend(const void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{
    (void)b;
    (void)n;
    (void)t;
    (void)peer;
    (void)c;
    (void)s;
    return ncclSystemError;
}

ncclResult_t
ncclRecv(void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{
    (void)b;
    (void)n;
    (void)t;
    (void)peer;
    (void)c;
    (void)s;
    return ncclSystemError;
}
