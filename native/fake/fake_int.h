/* Internal interfaces shared by the translation units of the fake libcuda.so.1. */
#ifndef FAKE_INT_H
#define FAKE_INT_H

#include <pthread.h>

#include "fake_state.h"
#include "tessera_cuda.h"

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))
/* An older driver (the fake built with -DFAKE_OLD_DRIVER, $(BUILD)/fake-old/libcuda.so.1)
 * lacks the entry points the library needs to account graph memory nodes and stream-ordered
 * pools: cuGraphGetNodes, cuMemPoolGetAttribute, cuDeviceGetMemPool are neither exported nor in
 * its cuGetProcAddress table. */
#ifdef FAKE_OLD_DRIVER
#define OLD_LACKS HIDDEN
#else
#define OLD_LACKS EXPORT
#endif

/* ---- call counting (fakecuda_calls) ---- */
HIDDEN void fk_count(const char *name);
#define COUNT() fk_count(__func__)

/* ---- failing frees (FAKE_FAIL_FREE) ----
 * FAKE_FAIL_FREE=WHICH[:N]: the entry points that give memory back fail, before they change
 * anything, with CUDA_ERROR_ILLEGAL_ADDRESS (the error a real driver returns from every call
 * once a kernel has faulted; the fake returns it otherwise only for FAKE_FAULT). WHICH is
 * "all" or a comma-separated list of entry-point names (cuMemFree_v2, cuMemFreeAsync,
 * cuArrayDestroy, cuMemRelease, ...); N is how many such calls of this process fail, after
 * which they succeed again (no N: every one fails). Calls are counted by fakecuda_calls either
 * way. */
HIDDEN int fk_fail_free(const char *name);
#define FAIL_FREE()                     \
    do {                                \
        if (fk_fail_free(__func__))     \
            return CUDA_ERROR_ILLEGAL_ADDRESS; \
    } while (0)

/* ---- a faulted process (FAKE_FAULT) ----
 * FAKE_FAULT=WHICH: the first kernel launch of this process (cuLaunchKernel,
 * cuLaunchCooperativeKernel, cuLaunchKernelEx, their _ptsz variants, a simulated graph launch)
 * faults. The launch itself succeeds (launches are asynchronous); from then on, as a real driver
 * does after a kernel fault (a "sticky" error), every call to an entry point named in WHICH fails
 * with CUDA_ERROR_ILLEGAL_ADDRESS before it changes anything, until the process exits; the
 * memory it holds stays held. WHICH is "all" or a comma-separated list of entry-point names
 * (cuMemPoolGetAttribute,cuDeviceGetGraphMemAttribute: only the reserve queries fail). "all" is
 * every entry point that works on a context, stream, event, memory object, pool or graph: not
 * cuInit, cuDriverGetVersion, the device queries (cuDeviceGet*, cuDeviceTotalMem*,
 * cuMemGetAllocationGranularity), cuGetProcAddress, nor the current-context bookkeeping
 * (cuCtxGetCurrent, cuCtxSetCurrent, cuCtxGetDevice, cuCtxPushCurrent_v2, cuCtxPopCurrent_v2,
 * cuStreamGetCtx, cuStreamIsCapturing), which keep answering. NVML is not affected. Calls are
 * counted by fakecuda_calls either way. */
HIDDEN int fk_faulted(const char *name);
#define FAULT()                                \
    do {                                       \
        if (fk_faulted(__func__))              \
            return CUDA_ERROR_ILLEGAL_ADDRESS; \
    } while (0)

/* ---- devices ---- */
HIDDEN int fk_phys(CUdevice ordinal); /* physical index of a CUDA ordinal, -1 if invalid */
HIDDEN int fk_ordinal(int phys);      /* this process's ordinal of a physical device, -1 */
HIDDEN uint64_t fk_chunk(void);       /* growth granularity of pools and graph pools */
#define FAKE_SM_COUNT 8
#define FAKE_THREADS_PER_SM 1024
#define FAKE_LOCALITY_DOMAINS 2

/* ---- contexts and streams ---- */
#define CTX_MAGIC 0xC7C7C7C7u
#define FK_LIMITS 11
struct CUctx_st {
    uint32_t magic;
    int dev;     /* ordinal */
    int primary; /* 1 for a device's primary context */
    int usage;   /* cuCtxAttach / cuCtxDetach count */
    size_t limit[FK_LIMITS];
    uint64_t limit_bytes; /* device memory taken for limits above their defaults */
};
struct CUstream_st {
    struct CUctx_st *ctx;
    int sidx; /* stream of the contention model (fake_sched.h): 1..FS_STREAMS-1 */
    int capturing;
    CUgraph graph;
};
HIDDEN struct CUctx_st *fk_cur(void);
HIDDEN void fk_ctx_init_limits(struct CUctx_st *c);
HIDDEN extern pthread_mutex_t fk_mu; /* process lock of every per-process table */

/* ---- memory (fake_mem.c) ---- */
HIDDEN void fk_ctx_gone(struct CUctx_st *c); /* free what a destroyed context owned */
HIDDEN void fk_sync_pools(void);             /* the implicit trim at a synchronize */
HIDDEN int fk_stream_ordinal(CUstream s);

/* ---- shared physical objects (fake_vmm.c) ---- */
HIDDEN void fk_obj_lock(void);
HIDDEN void fk_obj_unlock(void);
HIDDEN void fk_sweep(void); /* release objects whose exported descriptors are all closed */

#endif
