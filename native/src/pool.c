/*
 * Stream-ordered pools and graph memory, charged at what the driver really holds.
 *
 * A pool keeps a reserve of device memory: freeing an allocation returns it to the reserve,
 * and the reserve shrinks only when the pool trims (at a stream, event or context synchronize,
 * down to its release threshold; at cuMemPoolTrimTo; when the pool is destroyed). So a device
 * pool is charged its reserve, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, not its allocations:
 *
 *  - before an allocation of B bytes the reserve can grow by at most USED + B - RESERVED,
 *    rounded up to the allocation granularity; that much is charged first (refused if it does
 *    not fit, after every pool of this process has been trimmed to the driver's figures);
 *  - after the allocation the pool's charge is set to its reserve (the rest credited, or, if
 *    the driver grew the reserve by more than announced, charged, and the allocation undone
 *    when that does not fit);
 *  - after a synchronize, cuMemPoolTrimTo, a context reset, before any refusal and on every
 *    memory query, pools whose charge is above their threshold are brought down to their
 *    reserve;
 *  - a pool destroyed with allocations outstanding keeps its reserve until they are freed,
 *    which this library does not follow pointer by pointer: its charge stays until the process
 *    exits;
 *  - a reserve that cannot be read changes no charge (pool_settle): after a kernel fault the
 *    driver fails every call with CUDA_ERROR_ILLEGAL_ADDRESS while the process keeps its memory
 *    until it exits, so a failed reading is never taken for an empty pool; the charge stays as
 *    last read until a reading succeeds or the process exits. An allocation from a pool whose
 *    reserve cannot be read is refused (its growth cannot be bounded).
 * Host pools are not charged. Managed pools are charged per allocation, like cuMemAllocManaged.
 * Imported pools cannot allocate. A pool this library never saw created or obtained is
 * located with CU_MEMPOOL_ATTR_LOCATION_TYPE/ID (CUDA 13.2+) or refused.
 *
 * Graph memory is held by each device's graph pool: a launch (or an upload, or instantiation
 * with the UPLOAD flag) of an exec with memory nodes reserves their memory. The exec's memory
 * nodes are found at instantiation (walking child graphs); before the launch, the most the
 * graph pool can grow (used + nodes - reserved, rounded up) is charged; after it, the device's
 * graph charge is set to CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT. cuDeviceGraphMemTrim, exec
 * destruction and context resets bring it down; a reading that fails changes nothing, as for
 * pools, and a launch whose graph pool cannot be read is refused. Allocations made while a
 * stream is captured belong to the graph and are accounted when it runs.
 */
#include <string.h>

#include "feature.h"

#define TS_KIND_POOLH 9 /* pool handle -> index in g_pools (bytes) */
#define TS_KIND_EXEC 10 /* graph exec -> index in g_execs (bytes) */

/* P_UNCOVERED: on a GPU the limits file does not cover (not the claim's): refused. */
enum { P_DEVICE = 1, P_HOST, P_MANAGED, P_IMPORTED, P_UNKNOWN, P_UNCOVERED };

typedef struct pool {
    CUmemoryPool h; /* NULL: free entry */
    int kind;
    CUdevice dev; /* device pools; managed pools with a device location; else -1 */
    int g;
    CUmemLocation loc;
    uint64_t charged;   /* bytes of the claim this pool's reserve holds */
    uint64_t threshold; /* release threshold */
    uint64_t gran;      /* reserve growth granularity */
    int zombie;         /* destroyed with allocations outstanding */
} ts_pool;

#define MAX_GRAPH_DEVS 8
typedef struct exec_mem {
    CUgraphExec h;
    int n;
    CUdevice dev[MAX_GRAPH_DEVS];
    uint64_t bytes[MAX_GRAPH_DEVS];
} exec_mem;

static pthread_mutex_t g_mu = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static ts_table g_index = {.mu = PTHREAD_MUTEX_INITIALIZER};
static ts_pool *g_pools;
static int g_npools, g_cappools;
static exec_mem *g_execs;
static int g_nexecs, g_capexecs;
static int g_exec_count; /* execs with memory nodes (atomic) */
static uint64_t g_graph_charged[MAX_ORDINALS];
static int g_graph_g[MAX_ORDINALS];
static uint64_t g_charged_total; /* sum of pool and graph charges: 0 means nothing to resync */

/* Credits deferred to when a stream reaches a cuMemFreeAsync of a non-pool allocation. */
typedef struct pending {
    CUevent ev;
    int g;
    uint64_t bytes;
} pending;
static pending *g_pending;
static int g_npending, g_cappending;

static struct {
    int resolved;
    CUresult (*ev_create)(CUevent *, unsigned int);
    CUresult (*ev_record)(CUevent, CUstream);
    CUresult (*ev_query)(CUevent);
    CUresult (*ev_destroy)(CUevent);
} E;

static int grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return 0;
    int nc = *cap ? *cap * 2 : 16;
    while (nc < need)
        nc *= 2;
    void *np = realloc(*p, (size_t)nc * elem);
    if (!np)
        return -1;
    *p = np;
    *cap = nc;
    return 0;
}

void ts_pool_forget(void)
{
    pthread_mutex_t fresh = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
    g_mu = fresh;
    ts_table_clear(&g_index);
    free(g_pools);
    free(g_execs);
    free(g_pending);
    g_pools = NULL;
    g_execs = NULL;
    g_pending = NULL;
    g_npools = g_cappools = g_nexecs = g_capexecs = g_npending = g_cappending = 0;
    g_exec_count = 0;
    memset(g_graph_charged, 0, sizeof(g_graph_charged));
    g_charged_total = 0;
}

int ts_graph_has_memory(void) { return __atomic_load_n(&g_exec_count, __ATOMIC_RELAXED) > 0; }

static uint64_t roundup(uint64_t v, uint64_t g) { return g ? (v + g - 1) / g * g : v; }

/* What pools and graph pools hold of the claim, in total (0: nothing to bring down). */
static void charge_more(int g, uint64_t bytes) /* g_mu held */
{
    (void)g;
    ts_set_reclaimer(ts_pools_resync); /* from now on there can be something to give back */
    __atomic_add_fetch(&g_charged_total, bytes, __ATOMIC_RELAXED);
}

static void charge_less(int g, uint64_t bytes) /* g_mu held */
{
    ts_credit(g, bytes, 0);
    uint64_t t = __atomic_load_n(&g_charged_total, __ATOMIC_RELAXED);
    __atomic_store_n(&g_charged_total, t >= bytes ? t - bytes : 0, __ATOMIC_RELAXED);
}

/* A reserve (of a pool or a graph pool) could not be read: its charge stays as it is. Says so
 * once per process; returns 0 (bytes credited). */
static uint64_t unreadable(const char *what, uint64_t charged)
{
    static int told;
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
        ts_log(TS_WARN, "the reserve of %s cannot be read; its charge of %llu bytes stays until "
                        "it can (said once)",
               what, (unsigned long long)charged);
    return 0;
}

/* ---- pools ---- */

static uint64_t pool_attr(CUmemoryPool h, CUmemPool_attribute a, int *ok)
{
    cuuint64_t v = 0;
    *ok = R.cuMemPoolGetAttribute && R.cuMemPoolGetAttribute(h, a, &v) == CUDA_SUCCESS;
    return v;
}

/* Entry of a pool handle, -1 if unknown. g_mu held. */
static int pool_find(CUmemoryPool h)
{
    ts_entry e;
    return ts_table_get(&g_index, TS_KIND_POOLH, (uintptr_t)h, &e) == 0 ? (int)e.bytes : -1;
}

/* Record a pool and where its memory lives. g_mu held. */
static int pool_learn(CUmemoryPool h, const CUmemLocation *loc, CUmemAllocationType at,
                      int imported)
{
    if (!h)
        return -1;
    int i = pool_find(h);
    if (i >= 0)
        return i;
    ts_pool p = {h, P_UNKNOWN, -1, -1, *loc, 0, 0, 2u << 20, 0};
    if (imported) {
        p.kind = P_IMPORTED;
    } else if (at == CU_MEM_ALLOCATION_TYPE_MANAGED) {
        p.kind = P_MANAGED;
        if (loc->type == CU_MEM_LOCATION_TYPE_DEVICE)
            p.dev = loc->id;
        else if (loc->type == CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN)
            p.dev = loc->localized.deviceId;
    } else if (at == CU_MEM_ALLOCATION_TYPE_PINNED) {
        switch (loc->type) {
        case CU_MEM_LOCATION_TYPE_DEVICE:
        case CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN:
            p.kind = P_DEVICE;
            p.dev = loc->type == CU_MEM_LOCATION_TYPE_DEVICE ? loc->id : loc->localized.deviceId;
            dev_info d = ts_dev(p.dev);
            p.g = d.g;
            if (d.uncovered)
                p.kind = P_UNCOVERED; /* a GPU that is not the claim's: refused */
            else if (p.g < 0)
                p.kind = P_HOST; /* a whole device of the claim: not limited here */
            break;
        case CU_MEM_LOCATION_TYPE_HOST:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
            p.kind = P_HOST;
            break;
        case CU_MEM_LOCATION_TYPE_INVISIBLE:
            p.kind = P_IMPORTED;
            break;
        default:
            break;
        }
    }
    if (p.kind == P_DEVICE) {
        int ok;
        p.threshold = pool_attr(h, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &ok);
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof(prop));
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location = *loc;
        size_t gr = 0;
        if (R.cuMemGetAllocationGranularity &&
            R.cuMemGetAllocationGranularity(&gr, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) ==
                CUDA_SUCCESS &&
            gr)
            p.gran = gr;
        /* what it already holds (a default pool used before this process was limited) */
        uint64_t reserved = pool_attr(h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &ok);
        if (ok && reserved) {
            ts_region_force(&G.region, p.g, reserved);
            p.charged = reserved;
            charge_more(p.g, reserved);
        }
    }
    for (i = 0; i < g_npools && g_pools[i].h; i++) {
    }
    if (i == g_npools) {
        if (grow((void **)&g_pools, &g_cappools, g_npools + 1, sizeof(ts_pool)) != 0)
            return -1;
        g_npools++;
    }
    g_pools[i] = p;
    ts_table_put(&g_index, TS_KIND_POOLH, (uintptr_t)h, (uint64_t)i, -1, 0);
    return i;
}

/* A pool nobody showed us: ask the driver where it is (CUDA 13.2+ attributes). g_mu held. */
static int pool_resolve(CUmemoryPool h)
{
    int i = pool_find(h);
    if (i >= 0)
        return i;
    int t = 0, id = 0, at = 0;
    CUmemLocation loc;
    memset(&loc, 0, sizeof(loc));
    if (R.cuMemPoolGetAttribute &&
        R.cuMemPoolGetAttribute(h, CU_MEMPOOL_ATTR_LOCATION_TYPE, &t) == CUDA_SUCCESS &&
        R.cuMemPoolGetAttribute(h, CU_MEMPOOL_ATTR_LOCATION_ID, &id) == CUDA_SUCCESS &&
        R.cuMemPoolGetAttribute(h, CU_MEMPOOL_ATTR_ALLOCATION_TYPE, &at) == CUDA_SUCCESS) {
        loc.type = (CUmemLocationType)t;
        if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN) {
            loc.localized.deviceId = (unsigned char)id;
        } else {
            loc.id = id;
        }
        return pool_learn(h, &loc, (CUmemAllocationType)at, 0);
    }
    return -1;
}

/* Set a device pool's charge to its reserve, as read from the driver (ok: the reading succeeded).
 * Returns bytes credited. A reading that failed changes nothing: it says nothing about the
 * memory, which the pool may well still hold (after a kernel fault the driver fails every call
 * with CUDA_ERROR_ILLEGAL_ADDRESS while the process keeps its memory until it exits), so the
 * charge stays as it is until a reading succeeds or the process exits. g_mu held. */
static uint64_t pool_settle(ts_pool *p, uint64_t reserved, int ok)
{
    if (!ok)
        return unreadable("a pool", p->charged);
    if (reserved < p->charged) {
        uint64_t d = p->charged - reserved;
        charge_less(p->g, d);
        p->charged = reserved;
        return d;
    }
    if (reserved > p->charged) { /* held without our knowing: charge it, even past the limit */
        uint64_t d = reserved - p->charged;
        ts_log(TS_WARN, "a pool holds %llu bytes more than was charged; charging them",
               (unsigned long long)d);
        ts_region_force(&G.region, p->g, d);
        charge_more(p->g, d);
        p->charged = reserved;
    }
    return 0;
}

/* Read a device pool's reserve and settle its charge on it (pool_settle). g_mu held. */
static uint64_t pool_reread(ts_pool *p)
{
    int ok;
    uint64_t reserved = pool_attr(p->h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &ok);
    return pool_settle(p, reserved, ok);
}

/* Deferred credits whose stream has passed the free. g_mu held. */
static void poll_pending(void)
{
    for (int i = 0; i < g_npending;) {
        if (E.ev_query(g_pending[i].ev) == CUDA_SUCCESS) {
            ts_credit(g_pending[i].g, g_pending[i].bytes, 0);
            E.ev_destroy(g_pending[i].ev);
            g_pending[i] = g_pending[--g_npending];
        } else {
            i++;
        }
    }
}

static uint64_t graph_settle(CUdevice dev); /* below */

uint64_t ts_pools_resync(int g)
{
    if (__atomic_load_n(&g_charged_total, __ATOMIC_RELAXED) == 0 &&
        __atomic_load_n(&g_npending, __ATOMIC_RELAXED) == 0)
        return 0;
    uint64_t credited = 0;
    pthread_mutex_lock(&g_mu);
    poll_pending();
    for (int i = 0; i < g_npools; i++) {
        ts_pool *p = &g_pools[i];
        if (!p->h || p->kind != P_DEVICE || p->zombie || !p->charged || (g >= 0 && p->g != g))
            continue;
        credited += pool_reread(p);
    }
    for (CUdevice d = 0; d < MAX_ORDINALS; d++)
        if (g_graph_charged[d] && (g < 0 || g_graph_g[d] == g))
            credited += graph_settle(d);
    pthread_mutex_unlock(&g_mu);
    return credited;
}

/* After a synchronize: pools above their release threshold may have trimmed. */
static void after_sync(void)
{
    if (__atomic_load_n(&g_charged_total, __ATOMIC_RELAXED) == 0 &&
        __atomic_load_n(&g_npending, __ATOMIC_RELAXED) == 0)
        return;
    pthread_mutex_lock(&g_mu);
    poll_pending();
    for (int i = 0; i < g_npools; i++) {
        ts_pool *p = &g_pools[i];
        if (!p->h || p->kind != P_DEVICE || p->zombie || p->charged <= p->threshold)
            continue;
        pool_reread(p);
    }
    pthread_mutex_unlock(&g_mu);
}

static int capturing(CUstream s)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD || !R.cuStreamIsCapturing)
        return 0;
    return R.cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

typedef CUresult (*alloc_call)(void *);
struct async_args {
    CUresult (*fn)();
    CUdeviceptr *dptr;
    size_t bytes;
    CUmemoryPool pool;
    CUstream s;
};
static CUresult call_async(void *p)
{
    struct async_args *a = p;
    CUresult (*fn)(CUdeviceptr *, size_t, CUstream) = (void *)a->fn;
    return fn(a->dptr, a->bytes, a->s);
}
static CUresult call_from_pool(void *p)
{
    struct async_args *a = p;
    CUresult (*fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) = (void *)a->fn;
    return fn(a->dptr, a->bytes, a->pool, a->s);
}

/* Allocate from pool entry i around call(a). */
static CUresult pool_alloc(int i, alloc_call call, struct async_args *a, const char *what)
{
    ts_pool *p = &g_pools[i];
    if (p->kind == P_HOST)
        return call(a);
    if (p->kind == P_UNCOVERED)
        return TS_CHARGE_ERR(ts_refuse_uncovered(p->dev, what));
    if (p->kind == P_MANAGED) { /* charged per allocation, like cuMemAllocManaged */
        CUdevice dev = p->dev;
        if (dev < 0 && ts_stream_dev(a->s, &dev) != 0)
            return call(a);
        int g = -1;
        int c = ts_charge_dev(dev, a->bytes, 0, &g, what);
        if (c < 0)
            return TS_CHARGE_ERR(c);
        CUresult r = call(a);
        if (c > 0) {
            if (r == CUDA_SUCCESS)
                ts_remember(TS_KIND_DPTR, *a->dptr, a->bytes, g, ts_stream_ctx(a->s));
            else
                ts_credit(g, a->bytes, 0);
        }
        return r;
    }
    if (p->kind != P_DEVICE)
        return ts_refuse(what, p->kind == P_IMPORTED ? "an imported pool cannot allocate"
                                                      : "a pool at a location this library "
                                                        "cannot account");
    int ok1, ok2;
    uint64_t used = pool_attr(p->h, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &ok1);
    uint64_t reserved = pool_attr(p->h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &ok2);
    if (!ok1 || !ok2)
        return ts_refuse(what, "the pool's reserve cannot be read");
    uint64_t need = used + a->bytes > reserved ? roundup(used + a->bytes - reserved, p->gran) : 0;
    uint64_t limit = ts_limit_of(p->g);
    if (need) {
        if (ts_charge_g(p->g, need, 0, limit, what) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        p = &g_pools[i]; /* the resync in ts_charge_g cannot move entries, but stay safe */
        p->charged += need;
        charge_more(p->g, need);
    }
    CUresult r = call(a);
    int ok;
    uint64_t after = pool_attr(p->h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &ok);
    if (r == CUDA_SUCCESS && ok && after > p->charged) {
        /* the reserve grew by more than announced: charge it, or undo the allocation */
        uint64_t extra = after - p->charged;
        if (ts_charge_g(p->g, extra, 0, limit, what) == 0) {
            p->charged += extra;
            charge_more(p->g, extra);
        } else {
            REAL(cuMemFreeAsync)(*a->dptr, a->s);
            if (REAL(cuStreamSynchronize))
                REAL(cuStreamSynchronize)(a->s);
            if (REAL(cuMemPoolTrimTo))
                REAL(cuMemPoolTrimTo)(p->h, p->charged);
            *a->dptr = 0;
            r = CUDA_ERROR_OUT_OF_MEMORY;
            after = pool_attr(p->h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &ok);
        }
    }
    /* what was announced stays charged if the reserve cannot be read now */
    pool_settle(p, after, ok);
    return r;
}

static CUresult alloc_async(CUresult (*fn)(), CUdeviceptr *dptr, size_t bytes, CUstream s,
                            const char *what)
{
    struct async_args a = {fn, dptr, bytes, NULL, s};
    if (!fn)
        return CUDA_ERROR_NOT_FOUND;
    CUdevice dev;
    if (!ts_cuda_enter() || bytes == 0 || !dptr || capturing(s) || ts_stream_dev(s, &dev) != 0)
        return call_async(&a);
    if (G.closed)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUmemoryPool h = NULL;
    if (!REAL(cuDeviceGetMemPool)) /* the pool it would come from cannot be found */
        return ts_refuse(what, "the driver lacks cuDeviceGetMemPool, so the pool a "
                               "stream-ordered allocation comes from cannot be charged");
    if (REAL(cuDeviceGetMemPool)(&h, dev) != CUDA_SUCCESS || !h)
        return call_async(&a); /* the driver will fail it the same way */
    pthread_mutex_lock(&g_mu);
    int i = pool_find(h);
    if (i < 0) {
        CUmemLocation loc;
        memset(&loc, 0, sizeof(loc));
        loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
        loc.id = dev;
        i = pool_learn(h, &loc, CU_MEM_ALLOCATION_TYPE_PINNED, 0);
    }
    CUresult r = i < 0 ? ts_refuse(what, "out of host memory") : pool_alloc(i, call_async, &a, what);
    pthread_mutex_unlock(&g_mu);
    return r;
}

TS_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    ts_cuda_init();
    return alloc_async((CUresult(*)())REAL(cuMemAllocAsync), dptr, bytesize, hStream,
                       "cuMemAllocAsync");
}

TS_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    ts_cuda_init();
    return alloc_async((CUresult(*)())REAL(cuMemAllocAsync_ptsz), dptr, bytesize, hStream,
                       "cuMemAllocAsync");
}

static CUresult alloc_from_pool(CUresult (*fn)(), CUdeviceptr *dptr, size_t bytes, CUmemoryPool h,
                                CUstream s)
{
    struct async_args a = {fn, dptr, bytes, h, s};
    if (!fn)
        return CUDA_ERROR_NOT_FOUND;
    if (!ts_cuda_enter() || bytes == 0 || !dptr || !h || capturing(s))
        return call_from_pool(&a);
    if (G.closed)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_mu);
    int i = pool_resolve(h);
    CUresult r = i < 0 ? ts_refuse("cuMemAllocFromPoolAsync", "a pool whose location this library "
                                                              "cannot tell")
                       : pool_alloc(i, call_from_pool, &a, "cuMemAllocFromPoolAsync");
    pthread_mutex_unlock(&g_mu);
    return r;
}

TS_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                           CUstream hStream)
{
    ts_cuda_init();
    return alloc_from_pool((CUresult(*)())REAL(cuMemAllocFromPoolAsync), dptr, bytesize, pool,
                           hStream);
}

TS_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                CUmemoryPool pool, CUstream hStream)
{
    ts_cuda_init();
    return alloc_from_pool((CUresult(*)())REAL(cuMemAllocFromPoolAsync_ptsz), dptr, bytesize, pool,
                           hStream);
}

/* Credit bytes on g when stream s reaches this point (an event recorded behind the free). */
static void defer_credit(CUstream s, int g, uint64_t bytes)
{
    if (!E.resolved) {
        *(void **)&E.ev_create = ts_real_cuda("cuEventCreate");
        *(void **)&E.ev_record = ts_real_cuda("cuEventRecord");
        *(void **)&E.ev_query = ts_real_cuda("cuEventQuery");
        *(void **)&E.ev_destroy = ts_real_cuda("cuEventDestroy_v2");
        E.resolved = 1;
    }
    CUevent ev = NULL;
    if (E.ev_create && E.ev_record && E.ev_query && E.ev_destroy &&
        E.ev_create(&ev, 0x2 /* CU_EVENT_DISABLE_TIMING */) == CUDA_SUCCESS) {
        if (E.ev_record(ev, s) == CUDA_SUCCESS &&
            grow((void **)&g_pending, &g_cappending, g_npending + 1, sizeof(pending)) == 0) {
            ts_set_reclaimer(ts_pools_resync);
            g_pending[g_npending++] = (pending){ev, g, bytes};
            poll_pending();
            return;
        }
        E.ev_destroy(ev);
    }
    ts_credit(g, bytes, 0); /* no event: the free is credited when it was asked for */
}

static CUresult free_async(CUresult (*fn)(CUdeviceptr, CUstream), CUdeviceptr dptr, CUstream s)
{
    if (!fn)
        return CUDA_ERROR_NOT_FOUND;
    if (!ts_cuda_enter() || capturing(s))
        return fn(dptr, s);
    uint64_t bytes;
    int g;
    CUcontext owner;
    if (ts_forget(TS_KIND_DPTR, dptr, &bytes, &g, &owner) != 0)
        return fn(dptr, s); /* a pool allocation: it returns to its pool's reserve */
    CUresult r = fn(dptr, s);
    if (r != CUDA_SUCCESS) {
        /* still held by the driver, and still owned by the context it was allocated in (not
         * the stream's: were that one destroyed, the claim would be credited memory the driver
         * still holds) */
        ts_remember(TS_KIND_DPTR, dptr, bytes, g, owner);
        return r;
    }
    pthread_mutex_lock(&g_mu);
    defer_credit(s, g, bytes);
    pthread_mutex_unlock(&g_mu);
    return r;
}

TS_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    ts_cuda_init();
    return free_async(REAL(cuMemFreeAsync), dptr, hStream);
}

TS_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    ts_cuda_init();
    return free_async(REAL(cuMemFreeAsync_ptsz), dptr, hStream);
}

/* ---- pool bookkeeping ---- */

TS_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool_out, const CUmemPoolProps *props)
{
    int active = ts_cuda_enter();
    if (!REAL(cuMemPoolCreate))
        return CUDA_ERROR_NOT_FOUND;
    if (active && props && props->allocType == CU_MEM_ALLOCATION_TYPE_PINNED) {
        CUmemLocationType t = props->location.type;
        if (t != CU_MEM_LOCATION_TYPE_DEVICE && t != CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN &&
            t != CU_MEM_LOCATION_TYPE_HOST && t != CU_MEM_LOCATION_TYPE_HOST_NUMA &&
            t != CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
            return ts_refuse("cuMemPoolCreate", "a memory location type this library cannot "
                                                "account");
    } else if (active && props && props->allocType != CU_MEM_ALLOCATION_TYPE_MANAGED) {
        return ts_refuse("cuMemPoolCreate", "an allocation type this library cannot account");
    }
    CUresult r = REAL(cuMemPoolCreate)(pool_out, props);
    if (r == CUDA_SUCCESS && active && pool_out && props) {
        pthread_mutex_lock(&g_mu);
        pool_learn(*pool_out, &props->location, props->allocType, 0);
        pthread_mutex_unlock(&g_mu);
    }
    return r;
}

TS_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool h)
{
    if (!ts_cuda_enter() || !REAL(cuMemPoolDestroy))
        return REAL(cuMemPoolDestroy) ? REAL(cuMemPoolDestroy)(h) : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_mu);
    int i = pool_find(h);
    int ok = 0;
    uint64_t used = i >= 0 ? pool_attr(h, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &ok) : 0;
    CUresult r = REAL(cuMemPoolDestroy)(h);
    if (r == CUDA_SUCCESS && i >= 0) {
        ts_entry e;
        ts_table_take(&g_index, TS_KIND_POOLH, (uintptr_t)h, &e);
        ts_pool *p = &g_pools[i];
        if (p->kind == P_DEVICE && ok && used == 0) {
            charge_less(p->g, p->charged); /* its reserve went with it */
            memset(p, 0, sizeof(*p));
        } else if (p->kind == P_DEVICE && p->charged) {
            /* released by the driver when its outstanding allocations are freed: charged until
             * this process exits */
            p->zombie = 1;
            p->h = (CUmemoryPool)(uintptr_t)(0x1ull | ((uint64_t)i << 4)); /* not a live handle */
        } else {
            memset(p, 0, sizeof(*p));
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

TS_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool h, size_t minBytesToKeep)
{
    if (!ts_cuda_enter() || !REAL(cuMemPoolTrimTo))
        return REAL(cuMemPoolTrimTo) ? REAL(cuMemPoolTrimTo)(h, minBytesToKeep)
                                     : CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuMemPoolTrimTo)(h, minBytesToKeep);
    pthread_mutex_lock(&g_mu);
    int i = pool_find(h);
    if (r == CUDA_SUCCESS && i >= 0 && g_pools[i].kind == P_DEVICE)
        pool_reread(&g_pools[i]);
    pthread_mutex_unlock(&g_mu);
    return r;
}

TS_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool h, CUmemPool_attribute attr, void *value)
{
    int active = ts_cuda_enter();
    if (!REAL(cuMemPoolSetAttribute))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuMemPoolSetAttribute)(h, attr, value);
    if (r == CUDA_SUCCESS && active && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && value) {
        pthread_mutex_lock(&g_mu);
        int i = pool_find(h);
        if (i >= 0)
            g_pools[i].threshold = *(cuuint64_t *)value;
        pthread_mutex_unlock(&g_mu);
    }
    return r;
}

TS_EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                                      CUmemAllocationHandleType handleType,
                                                      unsigned long long flags)
{
    int active = ts_cuda_enter();
    if (!REAL(cuMemPoolImportFromShareableHandle))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuMemPoolImportFromShareableHandle)(pool_out, handle, handleType, flags);
    if (r == CUDA_SUCCESS && active && pool_out) {
        CUmemLocation none;
        memset(&none, 0, sizeof(none));
        pthread_mutex_lock(&g_mu);
        pool_learn(*pool_out, &none, CU_MEM_ALLOCATION_TYPE_PINNED, 1);
        pthread_mutex_unlock(&g_mu);
    }
    return r;
}

static void learn_device_pool(CUmemoryPool h, CUdevice dev)
{
    CUmemLocation loc;
    memset(&loc, 0, sizeof(loc));
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = dev;
    pthread_mutex_lock(&g_mu);
    pool_learn(h, &loc, CU_MEM_ALLOCATION_TYPE_PINNED, 0);
    pthread_mutex_unlock(&g_mu);
}

TS_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    int active = ts_cuda_enter();
    if (!REAL(cuDeviceGetDefaultMemPool))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuDeviceGetDefaultMemPool)(pool_out, dev);
    if (r == CUDA_SUCCESS && active && pool_out)
        learn_device_pool(*pool_out, dev);
    return r;
}

TS_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    int active = ts_cuda_enter();
    if (!REAL(cuDeviceGetMemPool))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuDeviceGetMemPool)(pool_out, dev);
    if (r == CUDA_SUCCESS && active && pool_out) {
        pthread_mutex_lock(&g_mu);
        int known = pool_find(*pool_out) >= 0;
        pthread_mutex_unlock(&g_mu);
        if (!known)
            learn_device_pool(*pool_out, dev);
    }
    return r;
}

TS_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool h)
{
    ts_cuda_init();
    return REAL(cuDeviceSetMemPool) ? REAL(cuDeviceSetMemPool)(dev, h) : CUDA_ERROR_NOT_FOUND;
}

/* CUDA 13: the pools of a location and allocation type. */
static CUresult get_pool(CUresult (*fn)(CUmemoryPool *, CUmemLocation *, CUmemAllocationType),
                         CUmemoryPool *pool_out, CUmemLocation *loc, CUmemAllocationType type)
{
    int active = ts_cuda_enter();
    if (!fn)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = fn(pool_out, loc, type);
    if (r == CUDA_SUCCESS && active && pool_out && loc) {
        pthread_mutex_lock(&g_mu);
        if (pool_find(*pool_out) < 0 && pool_resolve(*pool_out) < 0)
            pool_learn(*pool_out, loc, type, 0);
        pthread_mutex_unlock(&g_mu);
    }
    return r;
}

TS_EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location,
                                          CUmemAllocationType type)
{
    ts_cuda_init();
    return get_pool(REAL(cuMemGetDefaultMemPool), pool_out, location, type);
}

TS_EXPORT CUresult cuMemGetMemPool(CUmemoryPool *pool_out, CUmemLocation *location,
                                   CUmemAllocationType type)
{
    ts_cuda_init();
    return get_pool(REAL(cuMemGetMemPool), pool_out, location, type);
}

TS_EXPORT CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type,
                                   CUmemoryPool h)
{
    ts_cuda_init();
    return REAL(cuMemSetMemPool) ? REAL(cuMemSetMemPool)(location, type, h) : CUDA_ERROR_NOT_FOUND;
}

/* ---- synchronisation: where pools trim ---- */

#define SYNC_HOOK(sym, params, args)                                                         \
    TS_EXPORT CUresult sym params                                                            \
    {                                                                                        \
        ts_cuda_init();                                                                      \
        if (!REAL(sym))                                                                      \
            return CUDA_ERROR_NOT_FOUND;                                                     \
        CUresult r = REAL(sym) args;                                                         \
        if (r == CUDA_SUCCESS && ts_active())                                                \
            after_sync();                                                                    \
        return r;                                                                            \
    }
SYNC_HOOK(cuCtxSynchronize, (void), ())
SYNC_HOOK(cuCtxSynchronize_v2, (CUcontext ctx), (ctx))
SYNC_HOOK(cuStreamSynchronize, (CUstream s), (s))
SYNC_HOOK(cuStreamSynchronize_ptsz, (CUstream s), (s))
SYNC_HOOK(cuEventSynchronize, (CUevent e), (e))

/* ---- graph memory ---- */

static uint64_t graph_attr(CUdevice dev, CUgraphMem_attribute a, int *ok)
{
    cuuint64_t v = 0;
    *ok = R.cuDeviceGetGraphMemAttribute && R.cuDeviceGetGraphMemAttribute(dev, a, &v) == CUDA_SUCCESS;
    return v;
}

/* Set the device's graph charge to its graph pool's reserve. Returns bytes credited. A reading
 * that failed changes nothing, as for pools (pool_settle). g_mu held. */
static uint64_t graph_settle(CUdevice dev)
{
    int ok;
    uint64_t reserved = graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &ok);
    if (!ok)
        return unreadable("a graph memory pool", g_graph_charged[dev]);
    int g = g_graph_g[dev];
    if (reserved < g_graph_charged[dev]) {
        uint64_t d = g_graph_charged[dev] - reserved;
        charge_less(g, d);
        g_graph_charged[dev] = reserved;
        return d;
    }
    if (reserved > g_graph_charged[dev]) {
        uint64_t d = reserved - g_graph_charged[dev];
        ts_log(TS_ERR, "the graph memory pool of device %d holds %llu bytes more than was "
                       "charged; charging them",
               dev, (unsigned long long)d);
        ts_region_force(&G.region, g, d);
        charge_more(g, d);
        g_graph_charged[dev] = reserved;
    }
    return 0;
}

/* Why walk() could not account a graph (its refusal's reason), per thread. */
static __thread const char *g_walk_why;

/* The memory nodes of a graph and its child graphs, per device. -1 if they cannot be accounted,
 * with the reason in g_walk_why: a node at a location the library does not know, or a graph
 * whose nodes cannot be enumerated (a driver without cuGraphGetNodes, cuGraphNodeGetType,
 * cuGraphMemAllocNodeGetParams or cuGraphChildGraphNodeGetGraph, or one of them failing).
 * Charging nothing for such a graph let its memory nodes take the GPU past the limit. */
static int walk(CUgraph graph, exec_mem *m, int depth)
{
    g_walk_why = "a memory node at a location this library cannot account";
    if (depth > 16)
        return -1;
    if (!R.cuGraphGetNodes || !R.cuGraphNodeGetType || !R.cuGraphMemAllocNodeGetParams ||
        !R.cuGraphChildGraphNodeGetGraph) {
        g_walk_why = "the driver lacks cuGraphGetNodes, cuGraphNodeGetType, "
                     "cuGraphMemAllocNodeGetParams or cuGraphChildGraphNodeGetGraph, so the "
                     "graph's memory nodes cannot be found and charged";
        return -1;
    }
    size_t n = 0;
    if (R.cuGraphGetNodes(graph, NULL, &n) != CUDA_SUCCESS) {
        g_walk_why = "the graph's nodes cannot be enumerated (cuGraphGetNodes failed)";
        return -1;
    }
    if (n == 0)
        return 0;
    CUgraphNode *nodes = calloc(n, sizeof(*nodes));
    if (!nodes) {
        g_walk_why = "out of host memory";
        return -1;
    }
    int rc = 0;
    if (R.cuGraphGetNodes(graph, nodes, &n) != CUDA_SUCCESS) {
        g_walk_why = "the graph's nodes cannot be enumerated (cuGraphGetNodes failed)";
        rc = -1;
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        CUgraphNodeType t;
        if (R.cuGraphNodeGetType(nodes[i], &t) != CUDA_SUCCESS) {
            g_walk_why = "a graph node's type cannot be read (cuGraphNodeGetType failed)";
            rc = -1;
            break;
        }
        if (t == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            CUDA_MEM_ALLOC_NODE_PARAMS p;
            if (R.cuGraphMemAllocNodeGetParams(nodes[i], &p) != CUDA_SUCCESS) {
                g_walk_why = "a memory node's size cannot be read "
                             "(cuGraphMemAllocNodeGetParams failed)";
                rc = -1;
                break;
            }
            CUmemLocation *l = &p.poolProps.location;
            CUdevice dev;
            if (l->type == CU_MEM_LOCATION_TYPE_DEVICE)
                dev = l->id;
            else if (l->type == CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN)
                dev = l->localized.deviceId;
            else if (l->type == CU_MEM_LOCATION_TYPE_HOST || l->type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
                     l->type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
                continue; /* host memory */
            else {
                rc = -1;
                break;
            }
            dev_info d = ts_dev(dev);
            if (d.uncovered) {
                ts_refuse_uncovered(dev, "a graph memory node");
                rc = -1;
                break;
            }
            if (d.g < 0)
                continue; /* a whole device of the claim: not limited */
            int k = 0;
            while (k < m->n && m->dev[k] != dev)
                k++;
            if (k == m->n) {
                if (m->n == MAX_GRAPH_DEVS) {
                    rc = -1;
                    break;
                }
                m->dev[m->n] = dev;
                m->bytes[m->n++] = 0;
            }
            m->bytes[k] += p.bytesize;
        } else if (t == CU_GRAPH_NODE_TYPE_GRAPH) {
            CUgraph child;
            if (R.cuGraphChildGraphNodeGetGraph(nodes[i], &child) != CUDA_SUCCESS) {
                g_walk_why = "a child graph cannot be read (cuGraphChildGraphNodeGetGraph "
                             "failed)";
                rc = -1;
                break;
            }
            rc = walk(child, m, depth + 1);
        }
    }
    free(nodes);
    return rc;
}

/* Run call(arg), which makes the graph pools reserve m's memory nodes: charge first the most
 * they can grow, then settle on what they reserved. g_mu held. */
static CUresult graph_account(const exec_mem *m, CUresult (*call)(void *), void *arg)
{
    uint64_t need[MAX_GRAPH_DEVS] = {0};
    for (int k = 0; k < m->n; k++) {
        CUdevice dev = m->dev[k];
        dev_info d = ts_dev(dev);
        if (d.g < 0 || dev < 0 || dev >= MAX_ORDINALS)
            continue;
        g_graph_g[dev] = d.g;
        int ok1, ok2;
        uint64_t used = graph_attr(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &ok1);
        uint64_t reserved = graph_attr(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &ok2);
        if (!ok1 || !ok2) {
            for (int j = 0; j < k; j++)
                if (need[j]) {
                    charge_less(ts_dev(m->dev[j]).g, need[j]);
                    g_graph_charged[m->dev[j]] -= need[j];
                }
            return ts_refuse("a graph launch", "the graph memory pool cannot be read");
        }
        if (reserved > g_graph_charged[dev])
            graph_settle(dev); /* something reserved it already: account it first */
        size_t gran = 2u << 20;
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof(prop));
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        if (R.cuMemGetAllocationGranularity)
            R.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
        uint64_t want = used + m->bytes[k];
        need[k] = want > reserved ? roundup(want - reserved, gran ? gran : 1) : 0;
        if (need[k] && ts_charge_g(d.g, need[k], 0, d.limit, "graph memory") != 0) {
            for (int j = 0; j < k; j++)
                if (need[j]) {
                    charge_less(ts_dev(m->dev[j]).g, need[j]);
                    g_graph_charged[m->dev[j]] -= need[j];
                }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        g_graph_charged[dev] += need[k];
        charge_more(d.g, need[k]);
    }
    CUresult r = call(arg);
    for (int k = 0; k < m->n; k++)
        if (m->dev[k] >= 0 && m->dev[k] < MAX_ORDINALS && ts_dev(m->dev[k]).g >= 0)
            graph_settle(m->dev[k]);
    return r;
}

CUresult ts_graph_run(CUgraphExec exec, CUstream s, int upload, CUresult (*call)(void *), void *arg)
{
    (void)s;
    (void)upload;
    pthread_mutex_lock(&g_mu);
    ts_entry e;
    CUresult r;
    if (ts_table_get(&g_index, TS_KIND_EXEC, (uintptr_t)exec, &e) == 0) {
        exec_mem m = g_execs[e.bytes];
        r = graph_account(&m, call, arg);
    } else {
        r = call(arg);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* Instantiate: find the graph's memory nodes; with the UPLOAD flag the reserve is made now. */
static CUresult instantiate(CUgraphExec *pe, CUgraph graph, unsigned long long flags,
                            CUresult (*call)(void *), void *arg)
{
    if (!ts_cuda_enter() || !pe)
        return call(arg);
    exec_mem m;
    memset(&m, 0, sizeof(m));
    if (walk(graph, &m, 0) != 0)
        return ts_refuse("graph instantiation", g_walk_why);
    if (m.n == 0)
        return call(arg);
    pthread_mutex_lock(&g_mu);
    CUresult r = (flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) ? graph_account(&m, call, arg)
                                                              : call(arg);
    if (r == CUDA_SUCCESS) {
        int i = 0;
        while (i < g_nexecs && g_execs[i].h)
            i++;
        if (i < g_nexecs || grow((void **)&g_execs, &g_capexecs, g_nexecs + 1, sizeof(exec_mem)) == 0) {
            if (i == g_nexecs)
                g_nexecs++;
            m.h = *pe;
            g_execs[i] = m;
            ts_table_put(&g_index, TS_KIND_EXEC, (uintptr_t)*pe, (uint64_t)i, -1, 0);
            __atomic_add_fetch(&g_exec_count, 1, __ATOMIC_RELAXED);
        } else {
            ts_log(TS_ERR, "out of host memory tracking a graph with memory nodes");
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

struct inst_args {
    void *fn;
    CUgraphExec *pe;
    CUgraph g;
    unsigned long long flags;
    CUDA_GRAPH_INSTANTIATE_PARAMS *params;
    CUgraphNode *err;
    char *log;
    size_t n;
};
static CUresult call_with_flags(void *p)
{
    struct inst_args *a = p;
    return ((CUresult(*)(CUgraphExec *, CUgraph, unsigned long long))a->fn)(a->pe, a->g, a->flags);
}
static CUresult call_with_params(void *p)
{
    struct inst_args *a = p;
    return ((CUresult(*)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *))a->fn)(
        a->pe, a->g, a->params);
}
static CUresult call_legacy(void *p)
{
    struct inst_args *a = p;
    return ((CUresult(*)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t))a->fn)(
        a->pe, a->g, a->err, a->log, a->n);
}

TS_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g, unsigned long long flags)
{
    ts_cuda_init();
    if (!REAL(cuGraphInstantiateWithFlags))
        return CUDA_ERROR_NOT_FOUND;
    struct inst_args a = {(void *)REAL(cuGraphInstantiateWithFlags), pe, g, flags, NULL, NULL, NULL, 0};
    return instantiate(pe, g, flags, call_with_flags, &a);
}

#define INSTANTIATE_PARAMS(sym)                                                               \
    TS_EXPORT CUresult sym(CUgraphExec *pe, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *params) \
    {                                                                                         \
        ts_cuda_init();                                                                       \
        if (!REAL(sym))                                                                       \
            return CUDA_ERROR_NOT_FOUND;                                                      \
        struct inst_args a = {(void *)REAL(sym), pe, g, 0, params, NULL, NULL, 0};            \
        return instantiate(pe, g, params ? params->flags : 0, call_with_params, &a);          \
    }
INSTANTIATE_PARAMS(cuGraphInstantiateWithParams)
INSTANTIATE_PARAMS(cuGraphInstantiateWithParams_ptsz)

#define INSTANTIATE_LEGACY(sym)                                                               \
    TS_EXPORT CUresult sym(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n) \
    {                                                                                         \
        ts_cuda_init();                                                                       \
        if (!REAL(sym))                                                                       \
            return CUDA_ERROR_NOT_FOUND;                                                      \
        struct inst_args a = {(void *)REAL(sym), pe, g, 0, NULL, err, log, n};                \
        return instantiate(pe, g, 0, call_legacy, &a);                                        \
    }
INSTANTIATE_LEGACY(cuGraphInstantiate)
INSTANTIATE_LEGACY(cuGraphInstantiate_v2)

TS_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    ts_cuda_init();
    if (!REAL(cuGraphExecDestroy))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuGraphExecDestroy)(exec);
    if (r == CUDA_SUCCESS && ts_graph_has_memory()) {
        pthread_mutex_lock(&g_mu);
        ts_entry e;
        if (ts_table_take(&g_index, TS_KIND_EXEC, (uintptr_t)exec, &e) == 0) {
            exec_mem m = g_execs[e.bytes];
            memset(&g_execs[e.bytes], 0, sizeof(exec_mem));
            __atomic_sub_fetch(&g_exec_count, 1, __ATOMIC_RELAXED);
            for (int k = 0; k < m.n; k++)
                if (m.dev[k] >= 0 && m.dev[k] < MAX_ORDINALS && g_graph_charged[m.dev[k]])
                    graph_settle(m.dev[k]);
        }
        pthread_mutex_unlock(&g_mu);
    }
    return r;
}

TS_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    ts_cuda_init();
    if (!REAL(cuDeviceGraphMemTrim))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuDeviceGraphMemTrim)(dev);
    if (r == CUDA_SUCCESS && ts_active() && dev >= 0 && dev < MAX_ORDINALS) {
        pthread_mutex_lock(&g_mu);
        if (g_graph_charged[dev])
            graph_settle(dev);
        pthread_mutex_unlock(&g_mu);
    }
    return r;
}
