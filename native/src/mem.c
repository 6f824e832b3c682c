/*
 * Allocations owned by a context (cuMemAlloc, pitch, managed, arrays), contexts themselves
 * (each charged context-overhead), context limits (stack, heap, printf FIFO), and the entry
 * points the library refuses outright (pre-3.2 allocations, cuCtxAttach, GL contexts, restores
 * onto other GPUs).
 *
 * An allocation is charged before the real call and credited only after the real free
 * succeeded. Each is recorded with the context that was current: when that context is
 * destroyed (cuCtxDestroy, cuCtxDetach, cuGreenCtxDestroy) or the primary context is reset or
 * released for the last time, the driver frees everything it owned, and so the claim is
 * credited all of it. Without that, cudaDeviceReset left the usage charged and every later
 * allocation was refused with the GPU empty.
 */
#include <string.h>

#include "feature.h"

static pthread_mutex_t g_ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t g_primary_refs[MAX_ORDINALS];
static CUcontext g_primary_ctx[MAX_ORDINALS];

void ts_mem_forget(void)
{
    pthread_mutex_init(&g_ctx_mu, NULL);
    memset(g_primary_refs, 0, sizeof(g_primary_refs));
    memset(g_primary_ctx, 0, sizeof(g_primary_ctx));
}

/* Release an allocation: the real call first, the credit only once it succeeded, so that the
 * claim's charged usage never drops below what the driver still holds. */
#define RELEASE(kind, handle_, call)                                                     \
    do {                                                                                 \
        ts_entry e_;                                                                     \
        int have_ = ts_table_take(&ts_allocs, (kind), (uint64_t)(handle_), &e_) == 0;      \
        CUresult r_ = (call);                                                            \
        if (have_) {                                                                     \
            if (r_ == CUDA_SUCCESS)                                                      \
                ts_credit(e_.g, e_.bytes, (kind) == TS_KIND_CTX ? 1 : 0);                \
            else                                                                         \
                ts_table_put(&ts_allocs, (kind), e_.key, e_.bytes, e_.g, e_.ctx);          \
        }                                                                                \
        return r_;                                                                       \
    } while (0)

/* What an allocation of bytes on device dev takes from the GPU, as charged. The driver hands
 * out device memory in pages of its allocation granularity (cuMemGetAllocationGranularity,
 * minimum, for the device; 2 MiB when it cannot say): an allocation of at least one page gets
 * pages of its own and is charged all of them (cuMemAlloc of 2 MiB + 1 byte holds 4 MiB).
 * Smaller allocations share pages; they are charged their size, and what their pages hold
 * beyond that is left to the reconciliation with the driver's per-process
 * figure (docs/enforcement.md section 4.6). */
static uint64_t g_gran[MAX_ORDINALS];

static uint64_t charged_size(CUdevice dev, uint64_t bytes)
{
    uint64_t gran = 2u << 20;
    if (dev >= 0 && dev < MAX_ORDINALS) {
        uint64_t known = __atomic_load_n(&g_gran[dev], __ATOMIC_RELAXED);
        if (known) {
            gran = known;
        } else {
            size_t got = 0;
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof(prop));
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = dev;
            if (R.cuMemGetAllocationGranularity &&
                R.cuMemGetAllocationGranularity(&got, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
                    CUDA_SUCCESS &&
                got > 0)
                gran = got;
            __atomic_store_n(&g_gran[dev], gran, __ATOMIC_RELAXED);
        }
    }
    if (bytes < gran)
        return bytes;
    uint64_t pages = bytes / gran + (bytes % gran != 0);
    return pages > UINT64_MAX / gran ? UINT64_MAX : pages * gran;
}

/* Charge, call, and record (or undo) one allocation on device dev, owned by context ctx. */
#define ALLOC_ON(dev, ctx, bytes, kind, keyexpr, what, call)               \
    do {                                                                   \
        int g_ = -1;                                                       \
        uint64_t b_ = charged_size((dev), (bytes));                        \
        int c_ = ts_charge_dev((dev), b_, 0, &g_, (what));                 \
        if (c_ < 0)                                                        \
            return TS_CHARGE_ERR(c_);                                      \
        CUresult r_ = (call);                                              \
        if (c_ > 0) {                                                      \
            if (r_ == CUDA_SUCCESS)                                        \
                ts_remember((kind), (uint64_t)(keyexpr), b_, g_, (ctx));   \
            else                                                           \
                ts_credit(g_, b_, 0);                                      \
        }                                                                  \
        return r_;                                                         \
    } while (0)

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    default:
        return 4; /* newer/packed formats: at most 4 bytes per channel element */
    }
}

static uint64_t array3d_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch)
{
    uint64_t b = mul_sat(format_bytes(f), ch ? ch : 1);
    b = mul_sat(b, w ? w : 1);
    b = mul_sat(b, h ? h : 1);
    return mul_sat(b, d ? d : 1);
}

/* ---------------------------------------------------------------------------------------- */
/* allocations                                                                               */

TS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    if (!ts_cuda_enter() || bytesize == 0 || !dptr)
        return REAL(cuMemAlloc_v2) ? REAL(cuMemAlloc_v2)(dptr, bytesize) : CUDA_ERROR_NOT_FOUND;
    CUdevice dev;
    CUcontext ctx;
    if (ts_current(&dev, &ctx) != 0)
        return REAL(cuMemAlloc_v2)(dptr, bytesize);
    ALLOC_ON(dev, ctx, bytesize, TS_KIND_DPTR, *dptr, "cuMemAlloc",
             REAL(cuMemAlloc_v2)(dptr, bytesize));
}

TS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (!ts_cuda_enter() || bytesize == 0 || !dptr)
        return REAL(cuMemAllocManaged) ? REAL(cuMemAllocManaged)(dptr, bytesize, flags)
                                       : CUDA_ERROR_NOT_FOUND;
    CUdevice dev;
    CUcontext ctx;
    if (ts_current(&dev, &ctx) != 0)
        return REAL(cuMemAllocManaged)(dptr, bytesize, flags);
    ALLOC_ON(dev, ctx, bytesize, TS_KIND_DPTR, *dptr, "cuMemAllocManaged",
             REAL(cuMemAllocManaged)(dptr, bytesize, flags));
}

TS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                      size_t Height, unsigned int ElementSizeBytes)
{
    if (!ts_cuda_enter() || !dptr || !pPitch || WidthInBytes == 0 || Height == 0)
        return REAL(cuMemAllocPitch_v2)
                   ? REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes)
                   : CUDA_ERROR_NOT_FOUND;
    CUdevice dev;
    CUcontext ctx;
    if (ts_current(&dev, &ctx) != 0)
        return REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    /* Pre-charge an estimate (rows padded to 512 bytes), then settle on pitch*height. */
    uint64_t est = charged_size(dev, mul_sat((WidthInBytes + 511) & ~(size_t)511, Height));
    int g = -1;
    int c = ts_charge_dev(dev, est, 0, &g, "cuMemAllocPitch");
    if (c < 0)
        return TS_CHARGE_ERR(c);
    CUresult r = REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (c == 0)
        return r;
    if (r != CUDA_SUCCESS) {
        ts_credit(g, est, 0);
        return r;
    }
    uint64_t actual = charged_size(dev, mul_sat(*pPitch, Height));
    if (actual > est) {
        if (ts_charge_g(g, actual - est, 0, ts_dev(dev).limit, "cuMemAllocPitch") != 0) {
            REAL(cuMemFree_v2)(*dptr);
            ts_credit(g, est, 0);
            *dptr = 0;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else if (actual < est) {
        ts_credit(g, est - actual, 0);
    }
    ts_remember(TS_KIND_DPTR, *dptr, actual, g, ctx);
    return r;
}

TS_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    if (!ts_cuda_enter() || !REAL(cuMemFree_v2))
        return REAL(cuMemFree_v2) ? REAL(cuMemFree_v2)(dptr) : CUDA_ERROR_NOT_FOUND;
    RELEASE(TS_KIND_DPTR, dptr, REAL(cuMemFree_v2)(dptr));
}

TS_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    if (!ts_cuda_enter() || !REAL(cuMemFree))
        return REAL(cuMemFree) ? REAL(cuMemFree)(dptr) : CUDA_ERROR_NOT_FOUND;
    RELEASE(TS_KIND_DPTR, (CUdeviceptr)dptr, REAL(cuMemFree)(dptr));
}

/* The pre-3.2 entry points hand out 32-bit device pointers; they are refused under a claim
 * rather than accounted (no framework uses them; cuGetProcAddress gives them for versions
 * below 3020). */
#define V1_REFUSED "the pre-CUDA-3.2 entry point is not supported under a GPU claim"

TS_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    if (ts_cuda_enter())
        return ts_refuse("cuMemAlloc (v1)", V1_REFUSED);
    return REAL(cuMemAlloc) ? REAL(cuMemAlloc)(dptr, bytesize) : CUDA_ERROR_NOT_FOUND;
}

TS_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int w,
                                   unsigned int h, unsigned int elem)
{
    if (ts_cuda_enter())
        return ts_refuse("cuMemAllocPitch (v1)", V1_REFUSED);
    return REAL(cuMemAllocPitch) ? REAL(cuMemAllocPitch)(dptr, pPitch, w, h, elem)
                                 : CUDA_ERROR_NOT_FOUND;
}

TS_EXPORT CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    if (ts_cuda_enter())
        return ts_refuse("cuArrayCreate (v1)", V1_REFUSED);
    return REAL(cuArrayCreate) ? REAL(cuArrayCreate)(pHandle, d) : CUDA_ERROR_NOT_FOUND;
}

TS_EXPORT CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    if (ts_cuda_enter())
        return ts_refuse("cuArray3DCreate (v1)", V1_REFUSED);
    return REAL(cuArray3DCreate) ? REAL(cuArray3DCreate)(pHandle, d) : CUDA_ERROR_NOT_FOUND;
}

TS_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    CUdevice dev;
    CUcontext ctx;
    if (!ts_cuda_enter() || !pHandle || !d || ts_current(&dev, &ctx) != 0)
        return REAL(cuArrayCreate_v2) ? REAL(cuArrayCreate_v2)(pHandle, d) : CUDA_ERROR_NOT_FOUND;
    uint64_t bytes = array3d_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels);
    ALLOC_ON(dev, ctx, bytes, TS_KIND_ARRAY, (uintptr_t)*pHandle, "cuArrayCreate",
             REAL(cuArrayCreate_v2)(pHandle, d));
}

TS_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    CUdevice dev;
    CUcontext ctx;
    if (!ts_cuda_enter() || !pHandle || !d || ts_current(&dev, &ctx) != 0)
        return REAL(cuArray3DCreate_v2) ? REAL(cuArray3DCreate_v2)(pHandle, d)
                                        : CUDA_ERROR_NOT_FOUND;
    uint64_t bytes = array3d_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
    ALLOC_ON(dev, ctx, bytes, TS_KIND_ARRAY, (uintptr_t)*pHandle, "cuArray3DCreate",
             REAL(cuArray3DCreate_v2)(pHandle, d));
}

TS_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    if (!ts_cuda_enter() || !REAL(cuArrayDestroy))
        return REAL(cuArrayDestroy) ? REAL(cuArrayDestroy)(hArray) : CUDA_ERROR_NOT_FOUND;
    RELEASE(TS_KIND_ARRAY, (uintptr_t)hArray, REAL(cuArrayDestroy)(hArray));
}

TS_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                          const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    CUdevice dev;
    CUcontext ctx;
    if (!ts_cuda_enter() || !pHandle || !d || levels == 0 || ts_current(&dev, &ctx) != 0)
        return REAL(cuMipmappedArrayCreate) ? REAL(cuMipmappedArrayCreate)(pHandle, d, levels)
                                            : CUDA_ERROR_NOT_FOUND;
    uint64_t bytes = 0;
    size_t w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned i = 0; i < levels && i < 64; i++) {
        uint64_t lb = array3d_bytes(w, h, z, d->Format, d->NumChannels);
        bytes = bytes > UINT64_MAX - lb ? UINT64_MAX : bytes + lb;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        z = z > 1 ? z / 2 : z;
    }
    ALLOC_ON(dev, ctx, bytes, TS_KIND_MIPMAP, (uintptr_t)*pHandle, "cuMipmappedArrayCreate",
             REAL(cuMipmappedArrayCreate)(pHandle, d, levels));
}

TS_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray h)
{
    if (!ts_cuda_enter() || !REAL(cuMipmappedArrayDestroy))
        return REAL(cuMipmappedArrayDestroy) ? REAL(cuMipmappedArrayDestroy)(h)
                                             : CUDA_ERROR_NOT_FOUND;
    RELEASE(TS_KIND_MIPMAP, (uintptr_t)h, REAL(cuMipmappedArrayDestroy)(h));
}

/* ---------------------------------------------------------------------------------------- */
/* contexts: each context is charged context-overhead bytes; its allocations go with it      */

/* Limits a context was charged for (cuCtxSetLimit). */
#define MAX_LIMIT_CHARGES 64
static struct {
    CUcontext ctx;
    CUlimit limit;
    uint64_t base; /* bytes the context had at the first change: part of context-overhead */
    uint64_t charged;
    int g;
} g_limits[MAX_LIMIT_CHARGES];

void ts_context_gone(CUcontext ctx, CUdevice dev)
{
    ts_contexts_changed();
    int g = ts_dev(dev).g;
    if (ctx) {
        ts_entry buf[256];
        for (;;) { /* take everything the context owned, in batches */
            size_t n = ts_table_owned(&ts_allocs, (uint64_t)(uintptr_t)ctx, buf, 256);
            if (n == 0)
                break;
            for (size_t i = 0; i < n && i < 256; i++) {
                ts_entry e;
                if (ts_table_take(&ts_allocs, buf[i].kind, buf[i].key, &e) == 0)
                    ts_credit(e.g, e.bytes, e.kind == TS_KIND_CTX ? 1 : 0);
            }
        }
        pthread_mutex_lock(&g_ctx_mu);
        for (int i = 0; i < MAX_LIMIT_CHARGES; i++) {
            if (g_limits[i].ctx == ctx) {
                ts_credit(g_limits[i].g, g_limits[i].charged, 0);
                memset(&g_limits[i], 0, sizeof(g_limits[i]));
            }
        }
        pthread_mutex_unlock(&g_ctx_mu);
    }
    if (g >= 0) {
        ts_pools_resync(g); /* pools and graph pools gave back what the context used */
        ts_vmm_recheck(dev);
    }
}

static CUresult ctx_create_common(CUdevice dev, CUresult (*create)(void *), void *arg,
                                  CUcontext *pctx)
{
    int g = -1;
    int c = ts_charge_dev(dev, G.lim.context_overhead, 1, &g, "context creation");
    if (c < 0)
        return TS_CHARGE_ERR(c);
    CUresult r = create(arg);
    if (c > 0) {
        if (r == CUDA_SUCCESS && pctx)
            ts_remember(TS_KIND_CTX, (uintptr_t)*pctx, G.lim.context_overhead, g, *pctx);
        else
            ts_credit(g, G.lim.context_overhead, 1);
    }
    return r;
}

struct ctx_args {
    CUcontext *pctx;
    void *params;
    int n;
    unsigned flags;
    CUdevice dev;
};
static CUresult call_ctx_v2(void *a)
{
    struct ctx_args *x = a;
    return REAL(cuCtxCreate_v2)(x->pctx, x->flags, x->dev);
}
static CUresult call_ctx_v3(void *a)
{
    struct ctx_args *x = a;
    return REAL(cuCtxCreate_v3)(x->pctx, x->params, x->n, x->flags, x->dev);
}
static CUresult call_ctx_v4(void *a)
{
    struct ctx_args *x = a;
    return REAL(cuCtxCreate_v4)(x->pctx, x->params, x->flags, x->dev);
}
static CUresult call_green(void *a)
{
    struct ctx_args *x = a;
    return REAL(cuGreenCtxCreate)((CUgreenCtx *)x->pctx, x->params, x->dev, x->flags);
}

TS_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    if (!ts_cuda_enter())
        return REAL(cuCtxCreate_v2) ? REAL(cuCtxCreate_v2)(pctx, flags, dev) : CUDA_ERROR_NOT_FOUND;
    struct ctx_args a = {pctx, NULL, 0, flags, dev};
    return ctx_create_common(dev, call_ctx_v2, &a, pctx);
}

TS_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                  unsigned int flags, CUdevice dev)
{
    if (!ts_cuda_enter())
        return REAL(cuCtxCreate_v3) ? REAL(cuCtxCreate_v3)(pctx, paramsArray, numParams, flags, dev)
                                    : CUDA_ERROR_NOT_FOUND;
    struct ctx_args a = {pctx, paramsArray, numParams, flags, dev};
    return ctx_create_common(dev, call_ctx_v3, &a, pctx);
}

TS_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                  CUdevice dev)
{
    if (!ts_cuda_enter())
        return REAL(cuCtxCreate_v4) ? REAL(cuCtxCreate_v4)(pctx, params, flags, dev)
                                    : CUDA_ERROR_NOT_FOUND;
    struct ctx_args a = {pctx, params, 0, flags, dev};
    return ctx_create_common(dev, call_ctx_v4, &a, pctx);
}

TS_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    if (ts_cuda_enter())
        return ts_refuse("cuCtxCreate (v1)", V1_REFUSED);
    return REAL(cuCtxCreate) ? REAL(cuCtxCreate)(pctx, flags, dev) : CUDA_ERROR_NOT_FOUND;
}

TS_EXPORT CUresult cuGLCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    if (ts_cuda_enter())
        return ts_refuse("cuGLCtxCreate", "OpenGL interoperability contexts are not supported "
                                          "under a GPU claim (use cuCtxCreate)");
    return REAL(cuGLCtxCreate_v2) ? REAL(cuGLCtxCreate_v2)(pctx, flags, dev) : CUDA_ERROR_NOT_FOUND;
}

TS_EXPORT CUresult cuGLCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    if (ts_cuda_enter())
        return ts_refuse("cuGLCtxCreate (v1)", V1_REFUSED);
    return REAL(cuGLCtxCreate) ? REAL(cuGLCtxCreate)(pctx, flags, dev) : CUDA_ERROR_NOT_FOUND;
}

/* A context made by cuCtxCreate is destroyed: credit it and everything it owned. */
static CUresult destroy_ctx(CUcontext ctx, CUresult (*call)(CUcontext))
{
    CUdevice dev = -1;
    uint64_t bytes;
    int g;
    int have = ts_forget(TS_KIND_CTX, (uintptr_t)ctx, &bytes, &g, NULL) == 0;
    if (have) { /* the device of the context, for the pools it may have trimmed */
        CUcontext popped;
        if (R.cuCtxPushCurrent_v2 && R.cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) {
            ts_current_dev(&dev);
            R.cuCtxPopCurrent_v2(&popped);
        }
    }
    CUresult r = call(ctx);
    if (have) {
        if (r == CUDA_SUCCESS) {
            ts_credit(g, bytes, 1);
            ts_context_gone(ctx, dev);
        } else {
            ts_remember(TS_KIND_CTX, (uintptr_t)ctx, bytes, g, ctx);
        }
    }
    return r;
}

TS_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    if (!ts_cuda_enter() || !REAL(cuCtxDestroy_v2))
        return REAL(cuCtxDestroy_v2) ? REAL(cuCtxDestroy_v2)(ctx) : CUDA_ERROR_NOT_FOUND;
    return destroy_ctx(ctx, REAL(cuCtxDestroy_v2));
}

TS_EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    if (!ts_cuda_enter() || !REAL(cuCtxDestroy))
        return REAL(cuCtxDestroy) ? REAL(cuCtxDestroy)(ctx) : CUDA_ERROR_NOT_FOUND;
    return destroy_ctx(ctx, REAL(cuCtxDestroy));
}

/* cuCtxAttach (deprecated since CUDA 4.0) raises a context's usage count; under a claim it is
 * refused, so that the count stays 1 and cuCtxDetach always destroys. */
TS_EXPORT CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags)
{
    if (ts_cuda_enter())
        return ts_refuse("cuCtxAttach", "deprecated context usage counts are not supported under "
                                        "a GPU claim");
    return REAL(cuCtxAttach) ? REAL(cuCtxAttach)(pctx, flags) : CUDA_ERROR_NOT_FOUND;
}

TS_EXPORT CUresult cuCtxDetach(CUcontext ctx)
{
    if (!ts_cuda_enter() || !REAL(cuCtxDetach))
        return REAL(cuCtxDetach) ? REAL(cuCtxDetach)(ctx) : CUDA_ERROR_NOT_FOUND;
    return destroy_ctx(ctx, REAL(cuCtxDetach));
}

/* Green contexts (CUDA 12.4+) are contexts: charged context-overhead, and what was allocated
 * in the context cuCtxFromGreenCtx gave goes with them. */
#define TS_KIND_GREEN 7 /* green context -> its CUcontext (bytes) */

TS_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
                                    unsigned int flags)
{
    if (!ts_cuda_enter())
        return REAL(cuGreenCtxCreate) ? REAL(cuGreenCtxCreate)(phCtx, desc, dev, flags)
                                      : CUDA_ERROR_NOT_FOUND;
    struct ctx_args a = {(CUcontext *)phCtx, desc, 0, flags, dev};
    return ctx_create_common(dev, call_green, &a, (CUcontext *)phCtx);
}

TS_EXPORT CUresult cuCtxFromGreenCtx(CUcontext *pContext, CUgreenCtx hCtx)
{
    int active = ts_cuda_enter();
    if (!REAL(cuCtxFromGreenCtx))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuCtxFromGreenCtx)(pContext, hCtx);
    if (r == CUDA_SUCCESS && active && pContext)
        ts_table_put(&ts_allocs, TS_KIND_GREEN, (uintptr_t)hCtx, (uintptr_t)*pContext, 0, 0);
    return r;
}

TS_EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx hCtx)
{
    if (!ts_cuda_enter() || !REAL(cuGreenCtxDestroy))
        return REAL(cuGreenCtxDestroy) ? REAL(cuGreenCtxDestroy)(hCtx) : CUDA_ERROR_NOT_FOUND;
    ts_entry conv;
    CUcontext ctx = NULL;
    if (ts_table_get(&ts_allocs, TS_KIND_GREEN, (uintptr_t)hCtx, &conv) == 0)
        ctx = (CUcontext)(uintptr_t)conv.bytes;
    uint64_t bytes;
    int g;
    int have = ts_forget(TS_KIND_CTX, (uintptr_t)hCtx, &bytes, &g, NULL) == 0;
    CUresult r = REAL(cuGreenCtxDestroy)(hCtx);
    if (r == CUDA_SUCCESS) {
        ts_table_take(&ts_allocs, TS_KIND_GREEN, (uintptr_t)hCtx, &conv);
        if (have)
            ts_credit(g, bytes, 1);
        if (ctx) {
            CUdevice dev = -1;
            for (int d = 0; d < MAX_ORDINALS && have; d++)
                if (G.dev[d].resolved && G.dev[d].g == g)
                    dev = d;
            ts_context_gone(ctx, dev);
        }
    } else if (have) {
        ts_remember(TS_KIND_CTX, (uintptr_t)hCtx, bytes, g, (CUcontext)(uintptr_t)hCtx);
    }
    return r;
}

TS_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    if (!ts_cuda_enter() || dev < 0 || dev >= MAX_ORDINALS)
        return REAL(cuDevicePrimaryCtxRetain) ? REAL(cuDevicePrimaryCtxRetain)(pctx, dev)
                                              : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_ctx_mu);
    int g = -1, c = 0;
    if (g_primary_refs[dev] == 0)
        c = ts_charge_dev(dev, G.lim.context_overhead, 1, &g, "primary context");
    CUresult r;
    if (c < 0) {
        r = TS_CHARGE_ERR(c);
    } else {
        r = REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
        if (r == CUDA_SUCCESS) {
            g_primary_refs[dev]++;
            if (pctx)
                g_primary_ctx[dev] = *pctx;
        } else if (c > 0) {
            ts_credit(g, G.lim.context_overhead, 1);
        }
    }
    pthread_mutex_unlock(&g_ctx_mu);
    return r;
}

/* The primary context of dev is gone (last release, or reset): it, and everything allocated in
 * it, is credited. */
static void primary_drop(CUdevice dev, int all)
{
    pthread_mutex_lock(&g_ctx_mu);
    CUcontext gone = NULL;
    if (g_primary_refs[dev] > 0) {
        g_primary_refs[dev] = all ? 0 : g_primary_refs[dev] - 1;
        if (g_primary_refs[dev] == 0) {
            ts_credit(ts_dev(dev).g, G.lim.context_overhead, 1);
            gone = g_primary_ctx[dev];
            g_primary_ctx[dev] = NULL;
        }
    }
    pthread_mutex_unlock(&g_ctx_mu);
    if (gone || all)
        ts_context_gone(gone, dev);
}

static CUresult primary_release(CUdevice dev, CUresult (*call)(CUdevice), int all)
{
    int active = ts_cuda_enter();
    CUresult r = call ? call(dev) : CUDA_ERROR_NOT_FOUND;
    if (r == CUDA_SUCCESS && active && dev >= 0 && dev < MAX_ORDINALS && !G.closed)
        primary_drop(dev, all);
    return r;
}

TS_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    ts_cuda_init();
    return primary_release(dev, REAL(cuDevicePrimaryCtxRelease_v2), 0);
}

TS_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    ts_cuda_init();
    return primary_release(dev, REAL(cuDevicePrimaryCtxRelease), 0);
}

TS_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    ts_cuda_init();
    return primary_release(dev, REAL(cuDevicePrimaryCtxReset_v2), 1);
}

TS_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    ts_cuda_init();
    return primary_release(dev, REAL(cuDevicePrimaryCtxReset), 1);
}

/* ---------------------------------------------------------------------------------------- */
/* cuCtxSetLimit: stack, heap and printf FIFO take device memory                              */

/* Device memory a limit value holds: the stack for every thread the GPU can hold resident,
 * heap and printf FIFO as they are. */
static uint64_t limit_bytes(CUlimit l, size_t v, CUdevice dev)
{
    if (l != CU_LIMIT_STACK_SIZE)
        return v;
    int sms = 0, tps = 0;
    if (!R.cuDeviceGetAttribute ||
        R.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS ||
        R.cuDeviceGetAttribute(&tps, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev) !=
            CUDA_SUCCESS)
        return UINT64_MAX; /* cannot tell: charge everything (refused) */
    return mul_sat(mul_sat(v, (uint64_t)sms), (uint64_t)tps);
}

TS_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    CUdevice dev;
    CUcontext ctx;
    if (!ts_cuda_enter() || !REAL(cuCtxSetLimit) || ts_current_dev(&dev) != 0 ||
        !(ctx = ts_current_ctx()))
        return REAL(cuCtxSetLimit) ? REAL(cuCtxSetLimit)(limit, value) : CUDA_ERROR_NOT_FOUND;
    dev_info d = ts_dev(dev);
    if (d.g < 0 && !G.closed)
        return REAL(cuCtxSetLimit)(limit, value);
    size_t cur = 0;
    switch (limit) {
    case CU_LIMIT_STACK_SIZE:
    case CU_LIMIT_PRINTF_FIFO_SIZE:
    case CU_LIMIT_MALLOC_HEAP_SIZE:
        break;
    case CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH:
    case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT:
    case CU_LIMIT_PER_BLOCK_MEMORY_SIZE:
        /* memory the driver reserves per unit is not published: no increase under a claim */
        if (R.cuCtxGetLimit && R.cuCtxGetLimit(&cur, limit) == CUDA_SUCCESS && value <= cur)
            return REAL(cuCtxSetLimit)(limit, value);
        return ts_refuse("cuCtxSetLimit", "raising the device-runtime or per-block memory limits "
                                          "takes device memory that cannot be accounted");
    case CU_LIMIT_MAX_L2_FETCH_GRANULARITY:
    case CU_LIMIT_PERSISTING_L2_CACHE_SIZE:
    case CU_LIMIT_SHMEM_SIZE:
    case CU_LIMIT_CIG_ENABLED:
    case CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED:
        return REAL(cuCtxSetLimit)(limit, value); /* no device memory */
    default:
        return ts_refuse("cuCtxSetLimit", "a limit this library does not know");
    }
    if (G.closed)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_ctx_mu);
    int slot = -1, free_slot = -1;
    for (int i = 0; i < MAX_LIMIT_CHARGES; i++) {
        if (g_limits[i].ctx == ctx && g_limits[i].limit == limit)
            slot = i;
        else if (!g_limits[i].ctx && free_slot < 0)
            free_slot = i;
    }
    if (slot < 0) {
        if (free_slot < 0 || !R.cuCtxGetLimit || R.cuCtxGetLimit(&cur, limit) != CUDA_SUCCESS) {
            pthread_mutex_unlock(&g_ctx_mu);
            return ts_refuse("cuCtxSetLimit", "cannot read the context's current limit");
        }
        slot = free_slot;
        g_limits[slot].ctx = ctx;
        g_limits[slot].limit = limit;
        g_limits[slot].base = limit_bytes(limit, cur, dev);
        g_limits[slot].charged = 0;
        g_limits[slot].g = d.g;
    }
    uint64_t want_total = limit_bytes(limit, value, dev);
    uint64_t want = want_total > g_limits[slot].base ? want_total - g_limits[slot].base : 0;
    uint64_t had = g_limits[slot].charged;
    CUresult r;
    if (want > had) {
        if (ts_charge_g(d.g, want - had, 0, d.limit, "cuCtxSetLimit") != 0) {
            pthread_mutex_unlock(&g_ctx_mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        r = REAL(cuCtxSetLimit)(limit, value);
        if (r == CUDA_SUCCESS)
            g_limits[slot].charged = want;
        else
            ts_credit(d.g, want - had, 0);
    } else {
        r = REAL(cuCtxSetLimit)(limit, value);
        if (r == CUDA_SUCCESS && want < had) {
            ts_credit(d.g, had - want, 0);
            g_limits[slot].charged = want;
        }
    }
    pthread_mutex_unlock(&g_ctx_mu);
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* checkpoint / restore                                                                      */

TS_EXPORT CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
    if (ts_cuda_enter() && args && args->gpuPairsCount > 0)
        return ts_refuse("cuCheckpointProcessRestore", "restoring onto other GPUs would move "
                                                       "memory outside the claim's accounting");
    return REAL(cuCheckpointProcessRestore) ? REAL(cuCheckpointProcessRestore)(pid, args)
                                            : CUDA_ERROR_NOT_FOUND;
}
