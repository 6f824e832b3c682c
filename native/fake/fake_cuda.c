/*
 * A fake libcuda.so.1 for CPU-only tests of the enforcement library.
 *
 * Devices, their UUIDs and memory come from fake_state.h. CUDA_VISIBLE_DEVICES is honoured
 * like the real driver (indices or GPU-UUID prefixes; the list stops at the first entry that
 * matches nothing). Memory is taken from the shared device state, so several processes see one
 * device. Kernels are simulated: a launch with gridDimX = N occupies this process's queue on
 * the device for N microseconds (a graph launch for (uintptr_t)graph microseconds); events are
 * stamped with the simulated queue time. fakecuda_* functions expose call counts, simulated
 * busy time and physical usage to the test programs.
 */
#include <pthread.h>

#include "fake_state.h"
#include "tessera_cuda.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- call counting ---------------------------------------------------------------------- */
static struct {
    char name[48];
    uint64_t n;
} g_calls[128];
static pthread_mutex_t g_calls_mu = PTHREAD_MUTEX_INITIALIZER;

static void count(const char *name)
{
    pthread_mutex_lock(&g_calls_mu);
    for (int i = 0; i < 128; i++) {
        if (!g_calls[i].name[0]) {
            snprintf(g_calls[i].name, sizeof(g_calls[i].name), "%s", name);
            g_calls[i].n = 1;
            break;
        }
        if (strcmp(g_calls[i].name, name) == 0) {
            g_calls[i].n++;
            break;
        }
    }
    pthread_mutex_unlock(&g_calls_mu);
}
#define COUNT() count(__func__)

EXPORT uint64_t fakecuda_calls(const char *name)
{
    uint64_t n = 0;
    pthread_mutex_lock(&g_calls_mu);
    for (int i = 0; i < 128 && g_calls[i].name[0]; i++)
        if (strcmp(g_calls[i].name, name) == 0)
            n = g_calls[i].n;
    pthread_mutex_unlock(&g_calls_mu);
    return n;
}

/* ---- devices ----------------------------------------------------------------------------- */
static int g_visible[FAKE_MAX_DEV];
static int g_nvisible = -1;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static void init_visible(void)
{
    if (g_nvisible >= 0)
        return;
    fake_state *st = fake_state_get();
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;
    if (!cvd) {
        for (uint32_t i = 0; i < st->ndev; i++)
            g_visible[n++] = (int)i;
    } else {
        char buf[512];
        snprintf(buf, sizeof(buf), "%s", cvd);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && n < FAKE_MAX_DEV;
             t = strtok_r(NULL, ",", &save)) {
            int idx = -1;
            if (strncmp(t, "GPU-", 4) == 0) {
                for (uint32_t i = 0; i < st->ndev; i++)
                    if (strncmp(st->dev[i].uuid, t, strlen(t)) == 0)
                        idx = (int)i;
            } else {
                char *end;
                long v = strtol(t, &end, 10);
                if (*end == '\0' && v >= 0 && v < (long)st->ndev)
                    idx = (int)v;
            }
            if (idx < 0)
                break;
            g_visible[n++] = idx;
        }
    }
    g_nvisible = n;
}

static int phys(CUdevice d)
{
    init_visible();
    return (d >= 0 && d < g_nvisible) ? g_visible[d] : -1;
}

/* ---- contexts and streams ------------------------------------------------------------------ */
#define CTX_MAGIC 0xC7C7C7C7u
struct CUctx_st {
    uint32_t magic;
    int dev; /* ordinal */
    int primary;
};
struct CUstream_st {
    struct CUctx_st *ctx;
};
struct CUevent_st {
    uint64_t t;
    int recorded;
};
struct CUmemPoolHandle_st {
    int dev;
};

static struct CUctx_st g_primary[FAKE_MAX_DEV];
static int g_primary_refs[FAKE_MAX_DEV];
static __thread struct CUctx_st *t_cur;
static __thread struct CUctx_st *t_stack[16];
static __thread int t_sp;
static struct CUmemPoolHandle_st g_default_pool[FAKE_MAX_DEV];

static uint64_t g_queue_end[FAKE_MAX_DEV];
static uint64_t g_busy[FAKE_MAX_DEV];

EXPORT CUresult cuInit(unsigned int flags)
{
    (void)flags;
    COUNT();
    init_visible();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v)
{
    *v = 12040;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count_out)
{
    init_visible();
    *count_out = g_nvisible;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (phys(ordinal) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    int p = phys(dev);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    fake_uuid_bytes(fake_state_get()->dev[p].uuid, uuid->bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    int p = phys(dev);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = fake_state_get()->dev[p].total;
    return CUDA_SUCCESS;
}

static CUresult new_ctx(struct CUctx_st *c, CUdevice dev, int primary)
{
    int p = phys(dev);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    uint64_t cb = fake_state_get()->dev[p].ctx_bytes;
    if (cb && fake_take((uint32_t)p, cb) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = CTX_MAGIC;
    c->dev = dev;
    c->primary = primary;
    return CUDA_SUCCESS;
}

static void drop_ctx(struct CUctx_st *c)
{
    int p = phys(c->dev);
    uint64_t cb = fake_state_get()->dev[p].ctx_bytes;
    if (cb)
        fake_give((uint32_t)p, cb);
    c->magic = 0;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    COUNT();
    struct CUctx_st *c = calloc(1, sizeof(*c));
    CUresult r = new_ctx(c, dev, 0);
    if (r != CUDA_SUCCESS) {
        free(c);
        return r;
    }
    *pctx = c;
    t_cur = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags,
                               CUdevice dev)
{
    (void)p;
    (void)n;
    return cuCtxCreate_v2(pctx, flags, dev);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags,
                               CUdevice dev)
{
    (void)p;
    return cuCtxCreate_v2(pctx, flags, dev);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    COUNT();
    if (!ctx || ctx->magic != CTX_MAGIC || ctx->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    drop_ctx(ctx);
    if (t_cur == ctx)
        t_cur = NULL;
    free(ctx);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    COUNT();
    int p = phys(dev);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (g_primary_refs[dev] == 0)
        r = new_ctx(&g_primary[dev], dev, 1);
    if (r == CUDA_SUCCESS) {
        g_primary_refs[dev]++;
        *pctx = &g_primary[dev];
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    COUNT();
    if (phys(dev) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_ERROR_INVALID_CONTEXT;
    if (g_primary_refs[dev] > 0) {
        if (--g_primary_refs[dev] == 0) {
            drop_ctx(&g_primary[dev]);
            if (t_cur == &g_primary[dev])
                t_cur = NULL;
        }
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    COUNT();
    if (phys(dev) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    if (g_primary_refs[dev] > 0)
        drop_ctx(&g_primary[dev]);
    g_primary_refs[dev] = 0;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    *pctx = t_cur;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    if (ctx && ctx->magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    t_cur = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    if (!t_cur || t_cur->magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = t_cur->dev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    if (t_sp >= 16)
        return CUDA_ERROR_UNKNOWN;
    t_stack[t_sp++] = t_cur;
    t_cur = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    if (t_sp <= 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx)
        *pctx = t_cur;
    t_cur = t_stack[--t_sp];
    return CUDA_SUCCESS;
}

static int stream_ordinal(CUstream s)
{
    if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD && s->ctx)
        return s->ctx->dev;
    return t_cur ? t_cur->dev : -1;
}

EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned int flags)
{
    (void)flags;
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUstream_st *s = calloc(1, sizeof(*s));
    s->ctx = t_cur;
    *ps = s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx)
{
    if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD)
        *pctx = s->ctx;
    else
        *pctx = t_cur;
    return CUDA_SUCCESS;
}

static void wait_until(uint64_t t)
{
    uint64_t now = fake_now_ns();
    if (t > now) {
        struct timespec ts = {(time_t)((t - now) / 1000000000ull), (long)((t - now) % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
}

EXPORT CUresult cuCtxSynchronize(void)
{
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_mu);
    uint64_t t = g_queue_end[t_cur->dev];
    pthread_mutex_unlock(&g_mu);
    wait_until(t);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    (void)s;
    return cuCtxSynchronize();
}

/* ---- memory ----------------------------------------------------------------------------------- */
typedef struct alloc {
    unsigned long long key;
    uint64_t bytes;
    int phys;
    int kind;
} alloc;
#define MAX_ALLOCS 65536
static alloc g_allocs[MAX_ALLOCS];
static uint64_t g_next = 0x700000000000ull;

static CUresult do_alloc(int ordinal, uint64_t bytes, int kind, unsigned long long *key)
{
    int p = phys(ordinal);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (fake_take((uint32_t)p, bytes) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (!g_allocs[i].kind) {
            g_allocs[i].key = g_next;
            g_allocs[i].bytes = bytes;
            g_allocs[i].phys = p;
            g_allocs[i].kind = kind;
            *key = g_next;
            g_next += (bytes + 4095) & ~4095ull;
            pthread_mutex_unlock(&g_mu);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_mu);
    fake_give((uint32_t)p, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult do_free(uint64_t key, int kind)
{
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (g_allocs[i].kind == kind && g_allocs[i].key == key) {
            g_allocs[i].kind = 0;
            pthread_mutex_unlock(&g_mu);
            fake_give((uint32_t)g_allocs[i].phys, g_allocs[i].bytes);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_ERROR_INVALID_VALUE;
}

static int cur_ordinal(void) { return t_cur ? t_cur->dev : -1; }

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    COUNT();
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    return do_alloc(cur_ordinal(), bytesize, 1, dptr);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    (void)flags;
    COUNT();
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    return do_alloc(cur_ordinal(), bytesize, 1, dptr);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t w, size_t h,
                                   unsigned int elem)
{
    (void)elem;
    COUNT();
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    const char *a = getenv("FAKE_PITCH_ALIGN");
    size_t align = a ? strtoul(a, NULL, 10) : 512;
    size_t pitch = (w + align - 1) / align * align;
    CUresult r = do_alloc(cur_ordinal(), (uint64_t)pitch * h, 1, dptr);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    return r;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    COUNT();
    return do_free(dptr, 1);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    COUNT();
    return do_alloc(stream_ordinal(s), bytesize, 1, dptr);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    COUNT();
    return do_alloc(stream_ordinal(s), bytesize, 1, dptr);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream s)
{
    (void)s;
    COUNT();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return do_alloc(pool->dev, bytesize, 1, dptr);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream s)
{
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, s);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
    (void)s;
    COUNT();
    return do_free(dptr, 1);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) { return cuMemFreeAsync(dptr, s); }

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    if (phys(dev) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    g_default_pool[dev].dev = dev;
    *pool = &g_default_pool[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    return cuDeviceGetDefaultMemPool(pool, dev);
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    if (!props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || phys(props->location.id) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUmemPoolHandle_st *p = calloc(1, sizeof(*p));
    p->dev = props->location.id;
    *pool = p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    free(pool);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    (void)flags;
    COUNT();
    if (!prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    return do_alloc(prop->location.id, size, 2, handle);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    COUNT();
    return do_free(handle, 2);
}

static uint64_t fmt_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    default:
        return 4;
    }
}

EXPORT CUresult cuArrayCreate_v2(CUarray *ph, const CUDA_ARRAY_DESCRIPTOR *d)
{
    COUNT();
    unsigned long long key;
    uint64_t b = fmt_bytes(d->Format) * d->NumChannels * d->Width * (d->Height ? d->Height : 1);
    CUresult r = do_alloc(cur_ordinal(), b, 3, &key);
    if (r == CUDA_SUCCESS)
        *ph = (CUarray)(uintptr_t)key;
    return r;
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *ph, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    COUNT();
    unsigned long long key;
    uint64_t b = fmt_bytes(d->Format) * d->NumChannels * d->Width * (d->Height ? d->Height : 1) *
                 (d->Depth ? d->Depth : 1);
    CUresult r = do_alloc(cur_ordinal(), b, 3, &key);
    if (r == CUDA_SUCCESS)
        *ph = (CUarray)(uintptr_t)key;
    return r;
}

EXPORT CUresult cuArrayDestroy(CUarray a)
{
    COUNT();
    return do_free((uint64_t)(uintptr_t)a, 3);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *ph, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                       unsigned int levels)
{
    COUNT();
    uint64_t b = 0;
    size_t w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned i = 0; i < levels; i++) {
        b += fmt_bytes(d->Format) * d->NumChannels * (w ? w : 1) * (h ? h : 1) * (z ? z : 1);
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        z = z > 1 ? z / 2 : z;
    }
    unsigned long long key;
    CUresult r = do_alloc(cur_ordinal(), b, 4, &key);
    if (r == CUDA_SUCCESS)
        *ph = (CUmipmappedArray)(uintptr_t)key;
    return r;
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a)
{
    COUNT();
    return do_free((uint64_t)(uintptr_t)a, 4);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    COUNT();
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    fake_dev *d = &fake_state_get()->dev[phys(t_cur->dev)];
    uint64_t used = __atomic_load_n(&d->used, __ATOMIC_ACQUIRE);
    *total_b = d->total;
    *free_b = d->total - used;
    return CUDA_SUCCESS;
}

/* ---- kernels and events ------------------------------------------------------------------- */
static CUresult simulate(int ordinal, uint64_t dur_ns)
{
    if (ordinal < 0 || phys(ordinal) < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    for (;;) {
        uint64_t now = fake_now_ns();
        pthread_mutex_lock(&g_mu);
        uint64_t end = g_queue_end[ordinal];
        if (end > now + 20000000ull) { /* queue full: the launch blocks, as the real one does */
            pthread_mutex_unlock(&g_mu);
            wait_until(end - 20000000ull);
            continue;
        }
        uint64_t start = end > now ? end : now;
        g_queue_end[ordinal] = start + dur_ns;
        g_busy[ordinal] += dur_ns;
        pthread_mutex_unlock(&g_mu);
        return CUDA_SUCCESS;
    }
}

#define KERNEL(sym)                                                                              \
    EXPORT CUresult sym(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,         \
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,     \
                        CUstream s, void **params, void **extra)                                 \
    {                                                                                            \
        (void)f, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)params,      \
            (void)extra;                                                                         \
        COUNT();                                                                                 \
        return simulate(stream_ordinal(s), (uint64_t)gx * 1000ull);                              \
    }
KERNEL(cuLaunchKernel)
KERNEL(cuLaunchKernel_ptsz)

#define COOP(sym)                                                                                \
    EXPORT CUresult sym(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,         \
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,     \
                        CUstream s, void **params)                                               \
    {                                                                                            \
        (void)f, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)params;      \
        COUNT();                                                                                 \
        return simulate(stream_ordinal(s), (uint64_t)gx * 1000ull);                              \
    }
COOP(cuLaunchCooperativeKernel)
COOP(cuLaunchCooperativeKernel_ptsz)

#define KEX(sym)                                                                                 \
    EXPORT CUresult sym(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)      \
    {                                                                                            \
        (void)f, (void)params, (void)extra;                                                      \
        COUNT();                                                                                 \
        return simulate(stream_ordinal(c->hStream), (uint64_t)c->gridDimX * 1000ull);            \
    }
KEX(cuLaunchKernelEx)
KEX(cuLaunchKernelEx_ptsz)

#define GRAPH(sym)                                                                               \
    EXPORT CUresult sym(CUgraphExec g, CUstream s)                                               \
    {                                                                                            \
        COUNT();                                                                                 \
        return simulate(stream_ordinal(s), (uint64_t)(uintptr_t)g * 1000ull);                    \
    }
GRAPH(cuGraphLaunch)
GRAPH(cuGraphLaunch_ptsz)

EXPORT CUresult cuEventCreate(CUevent *pe, unsigned int flags)
{
    (void)flags;
    COUNT();
    *pe = calloc(1, sizeof(struct CUevent_st));
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
    free(e);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
    COUNT();
    int o = stream_ordinal(s);
    if (o < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t now = fake_now_ns();
    pthread_mutex_lock(&g_mu);
    uint64_t end = g_queue_end[o];
    pthread_mutex_unlock(&g_mu);
    e->t = end > now ? end : now;
    e->recorded = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventQuery(CUevent e)
{
    return (!e->recorded || fake_now_ns() >= e->t) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(CUevent e)
{
    if (e->recorded)
        wait_until(e->t);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    if (cuEventQuery(a) != CUDA_SUCCESS || cuEventQuery(b) != CUDA_SUCCESS)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)((int64_t)(b->t - a->t)) / 1e6);
    return CUDA_SUCCESS;
}

/* ---- test introspection ------------------------------------------------------------------- */
EXPORT uint64_t fakecuda_busy_ns(int ordinal) { return ordinal >= 0 && ordinal < FAKE_MAX_DEV ? g_busy[ordinal] : 0; }
EXPORT uint64_t fakecuda_used(int ordinal)
{
    int p = phys(ordinal);
    return p < 0 ? 0 : __atomic_load_n(&fake_state_get()->dev[p].used, __ATOMIC_ACQUIRE);
}
EXPORT uint64_t fakecuda_peak(int ordinal)
{
    int p = phys(ordinal);
    return p < 0 ? 0 : __atomic_load_n(&fake_state_get()->dev[p].peak, __ATOMIC_ACQUIRE);
}

/* ---- cuGetProcAddress ----------------------------------------------------------------------- */
/* Trampolines: distinct addresses for the same entry points (FAKE_PROCADDR_TRAMPOLINE=1), as a
 * driver may hand out internal pointers that differ from its exported symbols. */
static CUresult tramp_cuMemAlloc_v2(CUdeviceptr *d, size_t b) { return cuMemAlloc_v2(d, b); }
static CUresult tramp_cuMemGetInfo_v2(size_t *f, size_t *t) { return cuMemGetInfo_v2(f, t); }
static CUresult tramp_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                     unsigned int gz, unsigned int bx, unsigned int by,
                                     unsigned int bz, unsigned int shm, CUstream s, void **p,
                                     void **e)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, p, e);
}

#define FAKE_PROCS(X)                                                                   \
    X(cuInit, "cuInit", 2000, 0)                                                        \
    X(cuDriverGetVersion, "cuDriverGetVersion", 2020, 0)                                \
    X(cuDeviceGet, "cuDeviceGet", 2000, 0)                                              \
    X(cuDeviceGetCount, "cuDeviceGetCount", 2000, 0)                                    \
    X(cuDeviceGetUuid, "cuDeviceGetUuid", 9020, 0)                                      \
    X(cuDeviceGetUuid_v2, "cuDeviceGetUuid", 11040, 0)                                  \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0)                                 \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020, 0)                                           \
    X(cuCtxCreate_v3, "cuCtxCreate", 11040, 0)                                          \
    X(cuCtxCreate_v4, "cuCtxCreate", 12050, 0)                                          \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0)                                         \
    X(cuCtxGetCurrent, "cuCtxGetCurrent", 4000, 0)                                      \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000, 0)                                      \
    X(cuCtxGetDevice, "cuCtxGetDevice", 2000, 0)                                        \
    X(cuCtxPushCurrent_v2, "cuCtxPushCurrent", 4000, 0)                                 \
    X(cuCtxPopCurrent_v2, "cuCtxPopCurrent", 4000, 0)                                   \
    X(cuCtxSynchronize, "cuCtxSynchronize", 2000, 0)                                    \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0)                    \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0)              \
    X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0)                  \
    X(cuStreamCreate, "cuStreamCreate", 2000, 0)                                        \
    X(cuStreamGetCtx, "cuStreamGetCtx", 9020, 0)                                        \
    X(cuStreamSynchronize, "cuStreamSynchronize", 2000, 0)                              \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0)                                         \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0)                                             \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0)                                   \
    X(cuMemFree_v2, "cuMemFree", 3020, 0)                                               \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0)                                  \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0)                                     \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1)                                \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0)                     \
    X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1)                \
    X(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0)                                       \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1)                                  \
    X(cuMemPoolCreate, "cuMemPoolCreate", 11020, 0)                                     \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, 0)                                   \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, 0)                 \
    X(cuDeviceGetMemPool, "cuDeviceGetMemPool", 11020, 0)                               \
    X(cuMemCreate, "cuMemCreate", 10020, 0)                                             \
    X(cuMemRelease, "cuMemRelease", 10020, 0)                                           \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020, 0)                                       \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0)                                   \
    X(cuArrayDestroy, "cuArrayDestroy", 2000, 0)                                        \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0)                        \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0)                      \
    X(cuLaunchKernel, "cuLaunchKernel", 4000, 0)                                        \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, 1)                                   \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0)                                   \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1)                              \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0)                  \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1)             \
    X(cuGraphLaunch, "cuGraphLaunch", 10000, 0)                                         \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1)                                    \
    X(cuEventCreate, "cuEventCreate", 2000, 0)                                          \
    X(cuEventRecord, "cuEventRecord", 2000, 0)                                          \
    X(cuEventQuery, "cuEventQuery", 2000, 0)                                            \
    X(cuEventSynchronize, "cuEventSynchronize", 2000, 0)                                \
    X(cuEventElapsedTime, "cuEventElapsedTime", 2000, 0)                                \
    X(cuEventDestroy_v2, "cuEventDestroy", 4000, 0)                                     \
    X(cuGetProcAddress, "cuGetProcAddress", 11030, 0)                                   \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)

static const struct {
    const char *base;
    int ver;
    int ptsz;
    void *fn;
} g_procs[] = {
#define X(sym, base, ver, ptsz) {base, ver, ptsz, (void *)&sym},
    FAKE_PROCS(X)
#undef X
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    COUNT();
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1;
    for (int pass = 0; pass < 2 && best < 0; pass++) {
        int ptsz = pass == 0 ? want_ptsz : 0;
        for (int i = 0; i < (int)(sizeof(g_procs) / sizeof(g_procs[0])); i++)
            if (strcmp(g_procs[i].base, symbol) == 0 && g_procs[i].ptsz == ptsz &&
                g_procs[i].ver <= ver && (best < 0 || g_procs[i].ver > g_procs[best].ver))
                best = i;
    }
    if (best < 0) {
        *pfn = NULL;
        if (status)
            *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = g_procs[best].fn;
    const char *tr = getenv("FAKE_PROCADDR_TRAMPOLINE");
    if (tr && *tr == '1') {
        if (*pfn == (void *)&cuMemAlloc_v2)
            *pfn = (void *)&tramp_cuMemAlloc_v2;
        else if (*pfn == (void *)&cuMemGetInfo_v2)
            *pfn = (void *)&tramp_cuMemGetInfo_v2;
        else if (*pfn == (void *)&cuLaunchKernel)
            *pfn = (void *)&tramp_cuLaunchKernel;
    }
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, ver, flags, NULL);
}
