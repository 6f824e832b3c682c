/*
 * A fake libcuda.so.1 for CPU-only tests of the enforcement library: devices, contexts,
 * streams, events, launches, synchronisation and cuGetProcAddress. Memory is in fake_mem.c
 * (allocations, pools, graphs) and fake_vmm.c (cuMemCreate objects, exports, multicast).
 *
 * Devices, their UUIDs and memory come from fake_state.h. CUDA_VISIBLE_DEVICES is honoured
 * like the real driver (indices or GPU-UUID prefixes; the list stops at the first entry that
 * matches nothing). Memory is taken from the shared device state, so several processes see one
 * device. Kernels are simulated: a launch with gridDimX = N occupies this process's queue on
 * the device for N microseconds (a graph launch with a small integer as its handle for that
 * many microseconds); events are stamped with the simulated queue time. fakecuda_* functions
 * expose call counts, simulated busy time and physical usage to the test programs. With
 * $FAKE_SCHED set, launches, events and synchronisation go through the contention model of
 * fake_sched.h instead: one time-sliced GPU shared by every process of the test.
 *
 * The fake models what the real driver does with memory, independently of the library's own
 * accounting: contexts own their allocations and free them when destroyed or reset; device
 * limits (stack, heap, printf FIFO) take memory; see fake_mem.c and fake_vmm.c for the rest.
 * FAKE_FAIL_FREE (fake_int.h) makes the entry points that give memory back fail; FAKE_FAULT
 * (fake_int.h) makes a launch fault and the driver fail every later call, as after a kernel
 * fault.
 */
#define FAKE_STATE_DEFINE
#include "fake_int.h"
#include "fake_sched.h"

/* ---- call counting ---------------------------------------------------------------------- */
static struct {
    char name[48];
    uint64_t n;
} g_calls[256];
static pthread_mutex_t g_calls_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;

void fk_count(const char *name)
{
    pthread_mutex_lock(&g_calls_mu);
    for (int i = 0; i < 256; i++) {
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

EXPORT uint64_t fakecuda_calls(const char *name)
{
    uint64_t n = 0;
    pthread_mutex_lock(&g_calls_mu);
    for (int i = 0; i < 256 && g_calls[i].name[0]; i++)
        if (strcmp(g_calls[i].name, name) == 0)
            n = g_calls[i].n;
    pthread_mutex_unlock(&g_calls_mu);
    return n;
}

/* ---- failing frees and faults ------------------------------------------------------------ */
static uint64_t g_failed_frees; /* atomic: calls failed by FAKE_FAIL_FREE in this process */
static int g_faulted;           /* atomic: a kernel of this process faulted (FAKE_FAULT) */

/* Whether name is in the list spec[0..len): "all", or entry-point names separated by commas. */
static int names_match(const char *spec, size_t len, const char *name)
{
    if (len == 3 && strncmp(spec, "all", 3) == 0)
        return 1;
    size_t n = strlen(name);
    for (const char *t = spec; t < spec + len;) {
        const char *e = memchr(t, ',', (size_t)(spec + len - t));
        size_t tl = e ? (size_t)(e - t) : (size_t)(spec + len - t);
        if (tl == n && strncmp(t, name, n) == 0)
            return 1;
        t += tl + 1;
    }
    return 0;
}

int fk_fail_free(const char *name)
{
    const char *spec = getenv("FAKE_FAIL_FREE");
    if (!spec || !*spec)
        return 0;
    const char *colon = strchr(spec, ':');
    if (!names_match(spec, colon ? (size_t)(colon - spec) : strlen(spec), name))
        return 0;
    if (!colon)
        return 1;
    uint64_t limit = strtoull(colon + 1, NULL, 10);
    uint64_t cur = __atomic_load_n(&g_failed_frees, __ATOMIC_ACQUIRE);
    do {
        if (cur >= limit)
            return 0;
    } while (!__atomic_compare_exchange_n(&g_failed_frees, &cur, cur + 1, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    return 1;
}

/* A kernel launch of this process: with FAKE_FAULT set, the first one faults. */
static void fault_at_launch(void)
{
    const char *spec = getenv("FAKE_FAULT");
    if (spec && *spec)
        __atomic_store_n(&g_faulted, 1, __ATOMIC_RELEASE);
}

int fk_faulted(const char *name)
{
    if (!__atomic_load_n(&g_faulted, __ATOMIC_ACQUIRE))
        return 0;
    const char *spec = getenv("FAKE_FAULT");
    return spec && names_match(spec, strlen(spec), name);
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

int fk_phys(CUdevice d)
{
    init_visible();
    return (d >= 0 && d < g_nvisible) ? g_visible[d] : -1;
}

int fk_ordinal(int p)
{
    init_visible();
    for (int i = 0; i < g_nvisible; i++)
        if (g_visible[i] == p)
            return i;
    return -1;
}

uint64_t fk_chunk(void)
{
    const char *c = getenv("FAKE_POOL_CHUNK");
    uint64_t v = c ? strtoull(c, NULL, 10) : 0;
    return v ? v : 2ull << 20;
}

/* ---- contexts and streams ------------------------------------------------------------------ */
struct CUevent_st {
    uint64_t t;
    int recorded;
    int phys;     /* contention model: device of the last record, its event slot and generation */
    uint32_t slot;
    uint64_t gen;
};
struct CUgreenCtx_st {
    struct CUctx_st ctx;
};

static struct CUctx_st g_primary[FAKE_MAX_DEV];
static int g_primary_refs[FAKE_MAX_DEV];
static __thread struct CUctx_st *t_cur;
static __thread struct CUctx_st *t_stack[16];
static __thread int t_sp;

static uint64_t g_queue_end[FAKE_MAX_DEV];
static uint64_t g_busy[FAKE_MAX_DEV];

struct CUctx_st *fk_cur(void) { return t_cur && t_cur->magic == CTX_MAGIC ? t_cur : NULL; }

void fk_ctx_init_limits(struct CUctx_st *c)
{
    memset(c->limit, 0, sizeof(c->limit));
    c->limit[CU_LIMIT_STACK_SIZE] = 1024;
    c->limit[CU_LIMIT_PRINTF_FIFO_SIZE] = 1 << 20;
    c->limit[CU_LIMIT_MALLOC_HEAP_SIZE] = 8 << 20;
    c->limit[CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH] = 2;
    c->limit[CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048;
    c->limit_bytes = 0;
}

EXPORT CUresult cuInit(unsigned int flags)
{
    (void)flags;
    COUNT();
    init_visible();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v)
{
    *v = 13040;
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
    if (fk_phys(ordinal) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    int p = fk_phys(dev);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    fake_uuid_bytes(fake_state_get()->dev[p].uuid, uuid->bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }

EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    if (fk_phys(dev) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    switch ((int)attrib) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *pi = FAKE_SM_COUNT;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR:
        *pi = FAKE_THREADS_PER_SM;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_LOCALITY_DOMAIN_COUNT:
        *pi = FAKE_LOCALITY_DOMAINS;
        return CUDA_SUCCESS;
    default:
        *pi = 0;
        return CUDA_SUCCESS;
    }
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    int p = fk_phys(dev);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = fake_state_get()->dev[p].total;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t b;
    CUresult r = cuDeviceTotalMem_v2(&b, dev);
    if (r == CUDA_SUCCESS)
        *bytes = b > 0xffffffffu ? 0xffffffffu : (unsigned int)b;
    return r;
}

static CUresult new_ctx(struct CUctx_st *c, CUdevice dev, int primary)
{
    int p = fk_phys(dev);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    uint64_t cb = fake_state_get()->dev[p].ctx_bytes;
    if (cb && fake_take((uint32_t)p, cb) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = CTX_MAGIC;
    c->dev = dev;
    c->primary = primary;
    c->usage = 1;
    fk_ctx_init_limits(c);
    return CUDA_SUCCESS;
}

/* The context is destroyed: everything it owned goes back to the device. */
static void drop_ctx(struct CUctx_st *c)
{
    fk_ctx_gone(c);
    int p = fk_phys(c->dev);
    uint64_t cb = fake_state_get()->dev[p].ctx_bytes;
    if (cb)
        fake_give((uint32_t)p, cb);
    if (c->limit_bytes)
        fake_give((uint32_t)p, c->limit_bytes);
    c->limit_bytes = 0;
    c->magic = 0;
    if (t_cur == c)
        t_cur = NULL;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    COUNT();
    FAULT();
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

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    COUNT();
    FAULT();
    return cuCtxCreate_v2(pctx, flags, dev);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags,
                               CUdevice dev)
{
    (void)p;
    (void)n;
    FAULT();
    return cuCtxCreate_v2(pctx, flags, dev);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags,
                               CUdevice dev)
{
    (void)p;
    FAULT();
    return cuCtxCreate_v2(pctx, flags, dev);
}

EXPORT CUresult cuGLCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    COUNT();
    FAULT();
    return cuCtxCreate_v2(pctx, flags, dev);
}

EXPORT CUresult cuGLCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    FAULT();
    return cuGLCtxCreate_v2(pctx, flags, dev);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    COUNT();
    FAULT();
    FAIL_FREE();
    if (!ctx || ctx->magic != CTX_MAGIC || ctx->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    drop_ctx(ctx);
    free(ctx);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

EXPORT CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags)
{
    (void)flags;
    COUNT();
    FAULT();
    struct CUctx_st *c = fk_cur();
    if (!c || c->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    c->usage++;
    *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDetach(CUcontext ctx)
{
    COUNT();
    FAULT();
    if (!ctx || ctx->magic != CTX_MAGIC || ctx->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (--ctx->usage > 0)
        return CUDA_SUCCESS;
    drop_ctx(ctx);
    free(ctx);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
                                 unsigned int flags)
{
    (void)desc;
    (void)flags;
    COUNT();
    FAULT();
    struct CUgreenCtx_st *g = calloc(1, sizeof(*g));
    CUresult r = new_ctx(&g->ctx, dev, 0);
    if (r != CUDA_SUCCESS) {
        free(g);
        return r;
    }
    *phCtx = g;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxFromGreenCtx(CUcontext *pContext, CUgreenCtx hCtx)
{
    FAULT();
    if (!hCtx || hCtx->ctx.magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    *pContext = &hCtx->ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx hCtx)
{
    COUNT();
    FAULT();
    if (!hCtx || hCtx->ctx.magic != CTX_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    drop_ctx(&hCtx->ctx);
    free(hCtx);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    COUNT();
    FAULT();
    int p = fk_phys(dev);
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
    FAULT();
    if (fk_phys(dev) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_ERROR_INVALID_CONTEXT;
    if (g_primary_refs[dev] > 0) {
        if (--g_primary_refs[dev] == 0)
            drop_ctx(&g_primary[dev]);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

/* cudaDeviceReset: the primary context and everything allocated in it are destroyed. */
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    COUNT();
    FAULT();
    if (fk_phys(dev) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    if (g_primary_refs[dev] > 0)
        drop_ctx(&g_primary[dev]);
    g_primary_refs[dev] = 0;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

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

/* Device memory a limit value holds beyond what the context already had (fake model: the
 * stack is per thread, for every thread an SM can hold; heap and printf FIFO are one buffer). */
static uint64_t limit_bytes(CUlimit l, size_t v)
{
    switch (l) {
    case CU_LIMIT_STACK_SIZE:
        return (uint64_t)v * FAKE_SM_COUNT * FAKE_THREADS_PER_SM;
    case CU_LIMIT_PRINTF_FIFO_SIZE:
    case CU_LIMIT_MALLOC_HEAP_SIZE:
        return v;
    case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT:
        return (uint64_t)v * 2048; /* launch records */
    default:
        return 0;
    }
}

EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    COUNT();
    FAULT();
    struct CUctx_st *c = fk_cur();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((unsigned)limit >= FK_LIMITS)
        return CUDA_ERROR_INVALID_VALUE;
    int p = fk_phys(c->dev);
    uint64_t before = limit_bytes(limit, c->limit[limit]);
    uint64_t after = limit_bytes(limit, value);
    if (after > before) {
        if (fake_take((uint32_t)p, after - before) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        c->limit_bytes += after - before;
    } else if (before > after) {
        uint64_t give = before - after;
        if (give > c->limit_bytes)
            give = c->limit_bytes;
        fake_give((uint32_t)p, give);
        c->limit_bytes -= give;
    }
    c->limit[limit] = value;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
    FAULT();
    struct CUctx_st *c = fk_cur();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((unsigned)limit >= FK_LIMITS)
        return CUDA_ERROR_INVALID_VALUE;
    *pvalue = c->limit[limit];
    return CUDA_SUCCESS;
}

int fk_stream_ordinal(CUstream s)
{
    if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD && s->ctx)
        return s->ctx->dev;
    return t_cur ? t_cur->dev : -1;
}

EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned int flags)
{
    (void)flags;
    FAULT();
    if (!t_cur)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUstream_st *s = calloc(1, sizeof(*s));
    s->ctx = t_cur;
    static int next_sidx;
    s->sidx = 1 + __atomic_fetch_add(&next_sidx, 1, __ATOMIC_RELAXED) % (FS_STREAMS - 1);
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

static int real_stream(CUstream s) { return s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD; }

EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
    (void)mode;
    COUNT();
    FAULT();
    if (!real_stream(s))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (s->capturing)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuGraphCreate(&s->graph, 0);
    if (r == CUDA_SUCCESS)
        s->capturing = 1;
    return r;
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *phGraph)
{
    FAULT();
    if (!real_stream(s) || !s->capturing)
        return CUDA_ERROR_INVALID_VALUE;
    s->capturing = 0;
    *phGraph = s->graph;
    s->graph = NULL;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
    *st = real_stream(s) && s->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                         : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

static fs_state *sched_for(int phys);
static void sched_sync(fs_state *st, int p);

static void wait_until(uint64_t t)
{
    uint64_t now = fake_now_ns();
    if (t > now) {
        struct timespec ts = {(time_t)((t - now) / 1000000000ull), (long)((t - now) % 1000000000ull)};
        nanosleep(&ts, NULL);
    }
}

/* Synchronisation waits for the queue, then pools above their release threshold give memory
 * back to the device (the implicit trim of the stream-ordered allocator). */
static CUresult sync_ctx(struct CUctx_st *c)
{
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    fs_state *st = sched_for(fk_phys(c->dev));
    if (st) {
        sched_sync(st, fk_phys(c->dev));
        fk_sync_pools();
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&g_mu);
    uint64_t t = g_queue_end[c->dev];
    pthread_mutex_unlock(&g_mu);
    wait_until(t);
    fk_sync_pools();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void)
{
    COUNT();
    FAULT();
    return sync_ctx(fk_cur());
}

EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    COUNT();
    FAULT();
    return sync_ctx(ctx && ctx->magic == CTX_MAGIC ? ctx : fk_cur());
}

EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    COUNT();
    FAULT();
    if (real_stream(s) && s->capturing)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return sync_ctx(real_stream(s) ? s->ctx : fk_cur());
}

EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }

/* ---- the contention model (fake_sched.h) --------------------------------------------------- */
/* the model when $FAKE_SCHED is set and the device is one it models, else NULL */
static fs_state *sched_for(int phys) { return phys >= 0 && phys < FS_DEV ? fs_get() : NULL; }

static int sched_sidx(CUstream s) { return real_stream(s) ? s->sidx : 0; }

static void sched_sleep(uint64_t ns)
{
    if (ns < 20000)
        ns = 20000;
    if (ns > 2000000)
        ns = 2000000;
    struct timespec ts = {0, (long)ns};
    nanosleep(&ts, NULL);
}

static CUresult sched_launch(fs_state *st, int p, int sidx, uint64_t dur)
{
    for (;;) {
        fs_lock(st);
        fs_advance(st, &st->dev[p], fake_now_ns());
        fs_ctx *c = fs_ctx_of(st, p, 1);
        if (!c) {
            fs_unlock(st);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        fs_stream *q = &c->s[sidx];
        uint64_t wait = 0;
        if (c->queued_ns > FS_QUEUE_MAX_NS) /* push buffer full: the launch blocks */
            wait = c->queued_ns - FS_QUEUE_MAX_NS;
        else if (q->tail - q->head >= FS_RING - 1)
            wait = 100000;
        if (!wait) {
            fs_item *last = q->tail != q->head ? &q->q[(q->tail - 1) % FS_RING] : NULL;
            if (last && last->kind == FS_KERNEL)
                last->left_ns += dur; /* kernels in a row on one stream: one segment */
            else if (dur) {
                fs_item *it = &q->q[q->tail % FS_RING];
                it->kind = FS_KERNEL;
                it->ev = 0;
                it->left_ns = dur;
                q->tail++;
            }
            c->queued_ns += dur;
            fs_unlock(st);
            return CUDA_SUCCESS;
        }
        fs_unlock(st);
        sched_sleep(wait);
    }
}

static CUresult sched_record(fs_state *st, CUevent e, int p, int sidx)
{
    static uint32_t next_slot;
    static uint64_t next_gen;
    for (;;) {
        fs_lock(st);
        fs_dev *d = &st->dev[p];
        fs_advance(st, d, fake_now_ns());
        fs_ctx *c = fs_ctx_of(st, p, 1);
        if (!c) {
            fs_unlock(st);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        fs_stream *q = &c->s[sidx];
        if (q->tail - q->head >= FS_RING - 1) {
            fs_unlock(st);
            sched_sleep(100000);
            continue;
        }
        if (!e->gen)
            e->slot = next_slot++ % FS_EVENTS;
        e->gen = ++next_gen;
        e->phys = p;
        e->t = (uint64_t)(c - d->ctx); /* context index */
        e->recorded = 1;
        fs_event *ev = &c->ev[e->slot];
        ev->gen = e->gen;
        ev->stamped = 0;
        /* scheduled now: the context is the one being served, or the GPU has nothing else */
        int scheduled = d->cur < 0 || &d->ctx[d->cur] == c || !fs_has_work(&d->ctx[d->cur]);
        if (fs_stream_empty(q) && (scheduled || st->stamp_record)) {
            ev->t = d->t;
            ev->stamped = 1;
        } else {
            fs_item *it = &q->q[q->tail % FS_RING];
            it->kind = FS_EVENT;
            it->ev = e->slot;
            it->left_ns = e->gen;
            q->tail++;
        }
        fs_unlock(st);
        return CUDA_SUCCESS;
    }
}

/* 1 when the event has been stamped (or was never recorded), *t its stamp; lock not held */
static int sched_event_done(fs_state *st, CUevent e, uint64_t *t, uint64_t *queued)
{
    fs_lock(st);
    fs_dev *d = &st->dev[e->phys];
    fs_advance(st, d, fake_now_ns());
    fs_ctx *c = &d->ctx[e->t % FS_CTX];
    fs_event *ev = &c->ev[e->slot];
    int done = ev->gen != e->gen || ev->stamped || !c->live;
    if (t)
        *t = ev->gen == e->gen ? ev->t : d->t;
    if (queued)
        *queued = c->queued_ns;
    fs_unlock(st);
    return done;
}

/* wait until this process's context on p has no work left */
static void sched_sync(fs_state *st, int p)
{
    for (;;) {
        fs_lock(st);
        fs_advance(st, &st->dev[p], fake_now_ns());
        fs_ctx *c = fs_ctx_of(st, p, 0);
        int busy = c && fs_has_work(c);
        uint64_t q = c ? c->queued_ns : 0;
        fs_unlock(st);
        if (!busy)
            return;
        sched_sleep(q);
    }
}

/* a process that exits takes its work with it (its busy time stays for the tests to read) */
__attribute__((destructor)) static void sched_exit(void)
{
    fs_state *st = __atomic_load_n(&fs_p, __ATOMIC_ACQUIRE);
    if (!st)
        return;
    fs_lock(st);
    for (int p = 0; p < FS_DEV; p++) {
        fs_advance(st, &st->dev[p], fake_now_ns());
        fs_ctx *c = fs_ctx_of(st, p, 0);
        if (c) {
            c->live = 0;
            c->queued_ns = 0;
            for (int i = 0; i < FS_STREAMS; i++)
                c->s[i].head = c->s[i].tail;
        }
    }
    fs_unlock(st);
}

/* ---- kernels and events ------------------------------------------------------------------- */
static CUresult simulate(int ordinal, uint64_t dur_ns)
{
    if (ordinal < 0 || fk_phys(ordinal) < 0)
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

static CUresult launch(CUstream s, uint64_t dur_ns)
{
    if (real_stream(s) && s->capturing)
        return CUDA_SUCCESS; /* recorded into the graph being captured; not run */
    int o = fk_stream_ordinal(s), p = o < 0 ? -1 : fk_phys(o);
    fs_state *st = sched_for(p);
    CUresult r = st ? sched_launch(st, p, sched_sidx(s), dur_ns) : simulate(o, dur_ns);
    if (r == CUDA_SUCCESS)
        fault_at_launch(); /* launches are asynchronous: the fault shows from the next call */
    return r;
}

#define KERNEL(sym)                                                                              \
    EXPORT CUresult sym(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,         \
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm,     \
                        CUstream s, void **params, void **extra)                                 \
    {                                                                                            \
        (void)f, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)params,      \
            (void)extra;                                                                         \
        COUNT();                                                                                 \
        FAULT();                                                                                 \
        return launch(s, (uint64_t)gx * 1000ull);                                                \
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
        FAULT();                                                                                 \
        return launch(s, (uint64_t)gx * 1000ull);                                                \
    }
COOP(cuLaunchCooperativeKernel)
COOP(cuLaunchCooperativeKernel_ptsz)

#define KEX(sym)                                                                                 \
    EXPORT CUresult sym(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)      \
    {                                                                                            \
        (void)f, (void)params, (void)extra;                                                      \
        COUNT();                                                                                 \
        FAULT();                                                                                 \
        return launch(c->hStream, (uint64_t)c->gridDimX * 1000ull);                              \
    }
KEX(cuLaunchKernelEx)
KEX(cuLaunchKernelEx_ptsz)

/* Graph launches of small-integer handles are simulated work (the pacing tests); real graph
 * execs (fake_mem.c) allocate and free their memory nodes. */
HIDDEN CUresult fk_graph_exec_launch(CUgraphExec g, CUstream s, int upload_only);

#define GRAPH(sym, upload)                                                                       \
    EXPORT CUresult sym(CUgraphExec g, CUstream s)                                               \
    {                                                                                            \
        COUNT();                                                                                 \
        FAULT();                                                                                 \
        if ((uintptr_t)g >= 0x100000)                                                            \
            return fk_graph_exec_launch(g, s, upload);                                           \
        return upload ? CUDA_SUCCESS : launch(s, (uint64_t)(uintptr_t)g * 1000ull);              \
    }
GRAPH(cuGraphLaunch, 0)
GRAPH(cuGraphLaunch_ptsz, 0)
GRAPH(cuGraphUpload, 1)
GRAPH(cuGraphUpload_ptsz, 1)

EXPORT CUresult cuEventCreate(CUevent *pe, unsigned int flags)
{
    (void)flags;
    COUNT();
    FAULT();
    *pe = calloc(1, sizeof(struct CUevent_st));
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
    FAULT();
    free(e);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
    COUNT();
    FAULT();
    int o = fk_stream_ordinal(s);
    if (o < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    fs_state *st = sched_for(fk_phys(o));
    if (st)
        return sched_record(st, e, fk_phys(o), sched_sidx(s));
    e->gen = 0;
    uint64_t now = fake_now_ns();
    pthread_mutex_lock(&g_mu);
    uint64_t end = g_queue_end[o];
    pthread_mutex_unlock(&g_mu);
    e->t = end > now ? end : now;
    e->recorded = 1;
    return CUDA_SUCCESS;
}

/* the stamp of a completed event: 1 and *t, or 0 while the GPU has not reached it */
static int event_stamp(CUevent e, uint64_t *t, uint64_t *queued)
{
    if (e->recorded && e->gen) {
        fs_state *st = fs_get();
        return sched_event_done(st, e, t, queued);
    }
    *t = e->t;
    if (queued)
        *queued = e->recorded && e->t > fake_now_ns() ? e->t - fake_now_ns() : 0;
    return !e->recorded || fake_now_ns() >= e->t;
}

EXPORT CUresult cuEventQuery(CUevent e)
{
    FAULT();
    uint64_t t;
    return event_stamp(e, &t, NULL) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(CUevent e)
{
    COUNT();
    FAULT();
    uint64_t t, q;
    while (!event_stamp(e, &t, &q)) {
        if (e->gen)
            sched_sleep(q);
        else
            wait_until(t);
    }
    fk_sync_pools();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    FAULT();
    uint64_t ta, tb;
    if (!event_stamp(a, &ta, NULL) || !event_stamp(b, &tb, NULL))
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)((int64_t)(tb - ta)) / 1e6);
    return CUDA_SUCCESS;
}

/* Checkpoint/restore: the fake accepts the call (a restore may move the process to other
 * GPUs, which the enforcement library must refuse). */
EXPORT CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
    (void)pid;
    (void)args;
    COUNT();
    FAULT();
    return CUDA_SUCCESS;
}

/* ---- test introspection ------------------------------------------------------------------- */
EXPORT uint64_t fakecuda_busy_ns(int ordinal)
{
    int p = ordinal >= 0 ? fk_phys(ordinal) : -1;
    fs_state *st = sched_for(p);
    if (st) { /* GPU time the contention model gave this process */
        fs_lock(st);
        fs_advance(st, &st->dev[p], fake_now_ns());
        fs_ctx *c = fs_ctx_of(st, p, 0);
        uint64_t b = c ? c->busy_ns : 0;
        fs_unlock(st);
        return b;
    }
    return ordinal >= 0 && ordinal < FAKE_MAX_DEV ? g_busy[ordinal] : 0;
}
EXPORT uint64_t fakecuda_used(int ordinal)
{
    int p = fk_phys(ordinal);
    if (p < 0)
        return 0;
    fk_sweep();
    return __atomic_load_n(&fake_state_get()->dev[p].used, __ATOMIC_ACQUIRE);
}
EXPORT uint64_t fakecuda_peak(int ordinal)
{
    int p = fk_phys(ordinal);
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

/* A future variant the enforcement library cannot know (FAKE_PROCADDR_FUTURE=1 hands it out
 * for cuMemAlloc at versions past TESSERA_CUDA_KNOWN_VERSION). */
static CUresult future_cuMemAlloc_v3(CUdeviceptr *d, size_t b) { return cuMemAlloc_v2(d, b); }

HIDDEN extern const struct fk_proc {
    const char *base;
    int ver;
    int ptsz;
    void *fn;
} fk_procs[];
HIDDEN extern const int fk_nprocs;

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    COUNT();
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1;
    for (int pass = 0; pass < 2 && best < 0; pass++) {
        int ptsz = pass == 0 ? want_ptsz : 0;
        for (int i = 0; i < fk_nprocs; i++)
            if (strcmp(fk_procs[i].base, symbol) == 0 && fk_procs[i].ptsz == ptsz &&
                fk_procs[i].ver <= ver && (best < 0 || fk_procs[i].ver > fk_procs[best].ver))
                best = i;
    }
    if (best < 0) {
        *pfn = NULL;
        if (status)
            *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = fk_procs[best].fn;
    const char *tr = getenv("FAKE_PROCADDR_TRAMPOLINE");
    if (tr && *tr == '1') {
        if (*pfn == (void *)&cuMemAlloc_v2)
            *pfn = (void *)&tramp_cuMemAlloc_v2;
        else if (*pfn == (void *)&cuMemGetInfo_v2)
            *pfn = (void *)&tramp_cuMemGetInfo_v2;
        else if (*pfn == (void *)&cuLaunchKernel)
            *pfn = (void *)&tramp_cuLaunchKernel;
    }
    const char *fu = getenv("FAKE_PROCADDR_FUTURE");
    if (fu && *fu == '1' && ver > TESSERA_CUDA_KNOWN_VERSION && strcmp(symbol, "cuMemAlloc") == 0)
        *pfn = (void *)&future_cuMemAlloc_v3;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, ver, flags, NULL);
}
