/*
 * Fake driver memory: allocations owned by contexts, arrays, the pre-3.2 entry points,
 * stream-ordered pools and graph memory.
 *
 * What the fake models, as the real driver does (the tests' expected values depend on it):
 *  - an allocation belongs to the context that was current (or the stream's context); when
 *    the context is destroyed or reset its allocations are freed;
 *  - a pool holds a reserve of device memory that grows in chunks of FAKE_POOL_CHUNK bytes
 *    (default 2 MiB) when its allocations need more; freeing an allocation returns it to the
 *    reserve, not to the device; a synchronize (stream, context, event) releases the reserve
 *    down to the pool's release threshold (default 0), cuMemPoolTrimTo down to its argument,
 *    never below what is in use; a destroyed pool with live allocations keeps its reserve
 *    until they are freed; host pools take no device memory; managed pools take device memory
 *    per allocation;
 *  - graphs: each device has one graph memory pool per process; launching an exec allocates
 *    its memory nodes from it (growing its reserve in chunks), free nodes and cuMemFreeAsync
 *    return memory to it, cuDeviceGraphMemTrim releases what is unused; cuGraphUpload and the
 *    UPLOAD instantiate flag reserve without allocating; a stream under capture records
 *    cuMemAllocAsync / cuMemFreeAsync as memory nodes instead of running them.
 */
#include "fake_int.h"

/* ---- per-process allocation table ----------------------------------------------------------- */
enum { K_FREE = 0, K_PLAIN = 1, K_ARRAY = 3, K_MIPMAP = 4, K_POOL = 5, K_GRAPH = 6 };

typedef struct alloc {
    unsigned long long key;
    uint64_t bytes;
    int phys;
    int kind;
    struct CUctx_st *ctx;
    struct CUmemPoolHandle_st *pool;
    uint64_t held; /* K_PLAIN/K_ARRAY/K_MIPMAP: device bytes of its own pages (0: in a shared page) */
    int page;      /* the shared page of a small allocation, -1 if none */
} alloc;
#define MAX_ALLOCS 65536
static alloc g_allocs[MAX_ALLOCS];
static uint64_t g_next = 0x700000000000ull;
static uint64_t g_next_v1 = 0x10000000ull;
static uint64_t g_next_graph = 0x500000000000ull;

static uint64_t roundup(uint64_t v, uint64_t c) { return (v + c - 1) / c * c; }

/* fk_mu held */
static alloc *find_alloc(unsigned long long key)
{
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (g_allocs[i].kind && g_allocs[i].key == key)
            return &g_allocs[i];
    return NULL;
}

/* fk_mu held */
static alloc *new_alloc(unsigned long long key, uint64_t bytes, int phys, int kind,
                        struct CUctx_st *ctx, struct CUmemPoolHandle_st *pool)
{
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (!g_allocs[i].kind) {
            g_allocs[i] = (alloc){key, bytes, phys, kind, ctx, pool, 0, -1};
            return &g_allocs[i];
        }
    }
    return NULL;
}

/* ---- device pages of allocations owned by contexts --------------------------------------------
 * As the real driver does, cuMemAlloc and its kin take device memory in pages of FAKE_ALLOC_PAGE
 * bytes (default: the allocation granularity, FAKE_POOL_CHUNK or 2 MiB; 1 takes exact sizes): an allocation of at
 * least one page gets pages of its own (rounded up); smaller ones are packed, in this process,
 * into shared pages of their device, and a shared page goes back when its last allocation is
 * freed. */
#define MAX_SHARED_PAGES 1024
static struct {
    int phys;      /* -1: slot unused */
    uint64_t left; /* bytes not yet handed out (never reused before the page goes) */
    int live;      /* allocations in it */
} g_spages[MAX_SHARED_PAGES];
static int g_spages_init;
static int g_spages_hi; /* entries in use are below this index */

static uint64_t alloc_page(void)
{
    const char *c = getenv("FAKE_ALLOC_PAGE");
    uint64_t v = c ? strtoull(c, NULL, 10) : 0;
    return v ? v : fk_chunk();
}

/* Take the device memory of an allocation of bytes on phys: *held for its own pages, or *page.
 * fk_mu held. 0 on success, -1 when the fake GPU is full. */
static int take_pages(int phys, uint64_t bytes, uint64_t *held, int *page)
{
    uint64_t pg = alloc_page();
    uint64_t sz = (bytes + 511) & ~511ull; /* 512-byte alignment inside a shared page */
    *held = 0;
    *page = -1;
    if (pg <= 1 || bytes >= pg) {
        uint64_t b = pg <= 1 ? bytes : roundup(bytes, pg);
        if (fake_take((uint32_t)phys, b) != 0)
            return -1;
        *held = b;
        return 0;
    }
    if (!g_spages_init) {
        for (int i = 0; i < MAX_SHARED_PAGES; i++)
            g_spages[i].phys = -1;
        g_spages_init = 1;
    }
    int freeslot = g_spages_hi < MAX_SHARED_PAGES ? g_spages_hi : -1;
    for (int i = 0; i < g_spages_hi; i++) {
        if (g_spages[i].phys == phys && g_spages[i].left >= sz) {
            g_spages[i].left -= sz;
            g_spages[i].live++;
            *page = i;
            return 0;
        }
        if (g_spages[i].phys < 0 && (freeslot < 0 || freeslot == g_spages_hi))
            freeslot = i;
    }
    if (freeslot < 0 || fake_take((uint32_t)phys, pg) != 0)
        return -1;
    if (freeslot == g_spages_hi)
        g_spages_hi++;
    g_spages[freeslot].phys = phys;
    g_spages[freeslot].left = pg - sz;
    g_spages[freeslot].live = 1;
    *page = freeslot;
    return 0;
}

/* fk_mu held */
static void give_pages(int phys, uint64_t held, int page)
{
    if (held)
        fake_give((uint32_t)phys, held);
    if (page >= 0 && --g_spages[page].live == 0) {
        fake_give((uint32_t)g_spages[page].phys, alloc_page());
        g_spages[page].phys = -1;
    }
}

static struct CUctx_st *stream_ctx(CUstream s)
{
    if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD && s->ctx)
        return s->ctx;
    return fk_cur();
}

static CUresult do_alloc(int ordinal, uint64_t bytes, int kind, unsigned long long *key, int v1)
{
    int p = fk_phys(ordinal);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    uint64_t held;
    int page;
    if (take_pages(p, bytes, &held, &page) != 0) {
        pthread_mutex_unlock(&fk_mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t *next = v1 ? &g_next_v1 : &g_next;
    alloc *a = new_alloc(*next, bytes, p, kind, fk_cur(), NULL);
    if (a) {
        a->held = held;
        a->page = page;
        *key = *next;
        *next += (bytes + 4095) & ~4095ull;
    } else {
        give_pages(p, held, page);
    }
    pthread_mutex_unlock(&fk_mu);
    return a ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static int cur_ordinal(void) { return fk_cur() ? fk_cur()->dev : -1; }

/* ---- pools ------------------------------------------------------------------------------------ */
#define POOL_MAGIC 0x504f4f4cu
struct CUmemPoolHandle_st {
    uint32_t magic;
    CUmemLocationType loc_type;
    int loc_id;  /* ordinal for device pools, NUMA node for host pools */
    int phys;    /* physical device whose memory the reserve takes, -1 for host memory */
    CUmemAllocationType alloc_type;
    uint64_t reserved, used, threshold;
    int destroyed;
    int is_default;
};
#define MAX_POOLS 4096
static struct CUmemPoolHandle_st *g_pools[MAX_POOLS];
static struct CUmemPoolHandle_st *g_current[FAKE_MAX_DEV];
static struct CUmemPoolHandle_st *g_default_dev[FAKE_MAX_DEV];
static struct CUmemPoolHandle_st *g_default_host;
static struct CUmemPoolHandle_st *g_default_managed;


/* fk_mu held */
static struct CUmemPoolHandle_st *new_pool(CUmemLocationType t, int id, int phys,
                                           CUmemAllocationType at)
{
    struct CUmemPoolHandle_st *p = calloc(1, sizeof(*p));
    p->magic = POOL_MAGIC;
    p->loc_type = t;
    p->loc_id = id;
    p->phys = phys;
    p->alloc_type = at;
    for (int i = 0; i < MAX_POOLS; i++)
        if (!g_pools[i]) {
            g_pools[i] = p;
            break;
        }
    return p;
}

static int valid_pool(struct CUmemPoolHandle_st *p) { return p && p->magic == POOL_MAGIC && !p->destroyed; }

/* Device of a location: ordinal and physical index; -1/-1 for host memory; -2 if invalid. */
static int location_device(const CUmemLocation *l, int *phys)
{
    switch (l->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        *phys = fk_phys(l->id);
        return *phys < 0 ? -2 : l->id;
    case CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN:
        if (l->localized.localityDomainId >= FAKE_LOCALITY_DOMAINS)
            return -2;
        *phys = fk_phys(l->localized.deviceId);
        return *phys < 0 ? -2 : l->localized.deviceId;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        *phys = -1;
        return -1;
    default:
        return -2;
    }
}

/* Release reserve down to keep (never below what is in use). fk_mu held. */
static void pool_trim(struct CUmemPoolHandle_st *p, uint64_t keep)
{
    if (p->alloc_type == CU_MEM_ALLOCATION_TYPE_MANAGED)
        return;
    uint64_t floor = roundup(p->used, fk_chunk());
    if (keep < floor)
        keep = floor;
    if (keep < p->reserved) {
        if (p->phys >= 0)
            fake_give((uint32_t)p->phys, p->reserved - keep);
        p->reserved = keep;
    }
}

/* fk_mu held */
static CUresult pool_alloc(struct CUmemPoolHandle_st *p, uint64_t bytes, CUstream s,
                           unsigned long long *key)
{
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int phys = p->phys;
    if (p->alloc_type == CU_MEM_ALLOCATION_TYPE_MANAGED) {
        if (phys < 0)
            phys = fk_phys(fk_stream_ordinal(s));
        if (phys < 0)
            return CUDA_ERROR_INVALID_CONTEXT;
        if (fake_take((uint32_t)phys, bytes) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        p->reserved += bytes;
    } else if (p->used + bytes > p->reserved) {
        uint64_t grow = roundup(p->used + bytes - p->reserved, fk_chunk());
        if (phys >= 0 && fake_take((uint32_t)phys, grow) != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        p->reserved += grow;
    }
    p->used += bytes;
    if (!new_alloc(g_next, bytes, phys, K_POOL, stream_ctx(s), p)) {
        p->used -= bytes;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *key = g_next;
    g_next += (bytes + 4095) & ~4095ull;
    return CUDA_SUCCESS;
}

/* An allocation of pool p was freed. fk_mu held. */
static void pool_free(struct CUmemPoolHandle_st *p, uint64_t bytes, int phys)
{
    p->used -= bytes;
    if (p->alloc_type == CU_MEM_ALLOCATION_TYPE_MANAGED) {
        p->reserved -= bytes;
        if (phys >= 0)
            fake_give((uint32_t)phys, bytes);
    }
    if (p->destroyed && p->used == 0) {
        p->destroyed = 0; /* so that pool_trim releases everything */
        pool_trim(p, 0);
        for (int i = 0; i < MAX_POOLS; i++)
            if (g_pools[i] == p)
                g_pools[i] = NULL;
        p->magic = 0;
        free(p);
    }
}

void fk_sync_pools(void)
{
    pthread_mutex_lock(&fk_mu);
    for (int i = 0; i < MAX_POOLS; i++) {
        struct CUmemPoolHandle_st *p = g_pools[i];
        if (p && p->reserved > p->threshold)
            pool_trim(p, p->threshold / fk_chunk() * fk_chunk());
    }
    pthread_mutex_unlock(&fk_mu);
}

/* fk_mu held */
static struct CUmemPoolHandle_st *default_dev_pool(CUdevice dev)
{
    int p = fk_phys(dev);
    if (p < 0)
        return NULL;
    if (!g_default_dev[dev]) {
        g_default_dev[dev] = new_pool(CU_MEM_LOCATION_TYPE_DEVICE, dev, p, CU_MEM_ALLOCATION_TYPE_PINNED);
        g_default_dev[dev]->is_default = 1;
    }
    return g_default_dev[dev];
}

/* fk_mu held */
static struct CUmemPoolHandle_st *current_pool(CUdevice dev)
{
    if (dev < 0 || dev >= FAKE_MAX_DEV)
        return NULL;
    return g_current[dev] ? g_current[dev] : default_dev_pool(dev);
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    FAULT();
    pthread_mutex_lock(&fk_mu);
    struct CUmemPoolHandle_st *p = default_dev_pool(dev);
    pthread_mutex_unlock(&fk_mu);
    if (!p)
        return CUDA_ERROR_INVALID_DEVICE;
    *pool = p;
    return CUDA_SUCCESS;
}

OLD_LACKS CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    FAULT();
    if (fk_phys(dev) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fk_mu);
    *pool = current_pool(dev);
    pthread_mutex_unlock(&fk_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    FAULT();
    if (fk_phys(dev) < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!valid_pool(pool) || pool->alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED || pool->loc_id != dev ||
        pool->phys < 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    g_current[dev] = pool;
    pthread_mutex_unlock(&fk_mu);
    return CUDA_SUCCESS;
}

/* CUDA 13: pools by location and allocation type. */
EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *loc,
                                       CUmemAllocationType type)
{
    COUNT();
    FAULT();
    if (!loc)
        return CUDA_ERROR_INVALID_VALUE;
    int phys;
    pthread_mutex_lock(&fk_mu);
    struct CUmemPoolHandle_st *p = NULL;
    if (type == CU_MEM_ALLOCATION_TYPE_MANAGED) {
        if (!g_default_managed)
            g_default_managed = new_pool(CU_MEM_LOCATION_TYPE_NONE, 0, -1, CU_MEM_ALLOCATION_TYPE_MANAGED);
        p = g_default_managed;
    } else if (type == CU_MEM_ALLOCATION_TYPE_PINNED) {
        int dev = location_device(loc, &phys);
        if (dev >= 0 && loc->type == CU_MEM_LOCATION_TYPE_DEVICE) {
            p = default_dev_pool(dev);
        } else if (dev == -1) {
            if (!g_default_host)
                g_default_host = new_pool(CU_MEM_LOCATION_TYPE_HOST, 0, -1, CU_MEM_ALLOCATION_TYPE_PINNED);
            p = g_default_host;
        }
    }
    pthread_mutex_unlock(&fk_mu);
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    *pool_out = p;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *loc, CUmemAllocationType type)
{
    COUNT();
    FAULT();
    if (loc && loc->type == CU_MEM_LOCATION_TYPE_DEVICE && type == CU_MEM_ALLOCATION_TYPE_PINNED)
        return cuDeviceGetMemPool(pool, loc->id);
    return cuMemGetDefaultMemPool(pool, loc, type);
}

EXPORT CUresult cuMemSetMemPool(CUmemLocation *loc, CUmemAllocationType type, CUmemoryPool pool)
{
    FAULT();
    if (loc && loc->type == CU_MEM_LOCATION_TYPE_DEVICE && type == CU_MEM_ALLOCATION_TYPE_PINNED)
        return cuDeviceSetMemPool(loc->id, pool);
    return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    COUNT();
    FAULT();
    if (!props)
        return CUDA_ERROR_INVALID_VALUE;
    int phys = -1;
    int dev = -1;
    if (props->allocType == CU_MEM_ALLOCATION_TYPE_MANAGED) {
        if (props->location.type != CU_MEM_LOCATION_TYPE_NONE)
            dev = location_device(&props->location, &phys);
        if (dev == -2)
            return CUDA_ERROR_INVALID_VALUE;
    } else if (props->allocType == CU_MEM_ALLOCATION_TYPE_PINNED) {
        dev = location_device(&props->location, &phys);
        if (dev == -2)
            return CUDA_ERROR_INVALID_VALUE;
    } else {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&fk_mu);
    *pool = new_pool(props->location.type, dev >= 0 ? dev : props->location.id, phys,
                     props->allocType);
    pthread_mutex_unlock(&fk_mu);
    return CUDA_SUCCESS;
}

/* Test introspection: a pool made without going through cuMemPoolCreate, as code that finds
 * the driver's entry points by itself would. */
EXPORT CUresult fakecuda_pool_create(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    return cuMemPoolCreate(pool, props);
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    COUNT();
    FAULT();
    FAIL_FREE();
    if (!valid_pool(pool) || pool->is_default)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    for (int d = 0; d < FAKE_MAX_DEV; d++)
        if (g_current[d] == pool)
            g_current[d] = NULL;
    if (pool->used) {
        pool->destroyed = 1; /* released with its last allocation */
    } else {
        pool_trim(pool, 0);
        for (int i = 0; i < MAX_POOLS; i++)
            if (g_pools[i] == pool)
                g_pools[i] = NULL;
        pool->magic = 0;
        free(pool);
    }
    pthread_mutex_unlock(&fk_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    COUNT();
    FAULT();
    FAIL_FREE();
    if (!valid_pool(pool))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    pool_trim(pool, roundup(minBytesToKeep, fk_chunk()));
    pthread_mutex_unlock(&fk_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    FAULT();
    if (!valid_pool(pool) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
        pool->threshold = *(cuuint64_t *)value;
        return CUDA_SUCCESS;
    }
    return attr <= CU_MEMPOOL_ATTR_USED_MEM_HIGH ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

OLD_LACKS CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    FAULT();
    if (!valid_pool(pool) || !value)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *(cuuint64_t *)value = pool->threshold;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        *(cuuint64_t *)value = pool->reserved;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *(cuuint64_t *)value = pool->used;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_ALLOCATION_TYPE:
    case CU_MEMPOOL_ATTR_LOCATION_TYPE:
    case CU_MEMPOOL_ATTR_LOCATION_ID:
        if (getenv("FAKE_POOL_NO_LOCATION")) /* a driver before CUDA 13.2 */
            return CUDA_ERROR_INVALID_VALUE;
        *(int *)value = attr == CU_MEMPOOL_ATTR_ALLOCATION_TYPE ? (int)pool->alloc_type
                        : attr == CU_MEMPOOL_ATTR_LOCATION_TYPE ? (int)pool->loc_type
                                                                : pool->loc_id;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* Pools shared by another process: not modelled (the enforcement library only records them). */
EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                                   CUmemAllocationHandleType handleType,
                                                   unsigned long long flags)
{
    (void)pool_out;
    (void)handle;
    (void)handleType;
    (void)flags;
    FAULT();
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- graphs ----------------------------------------------------------------------------------- */
#define GRAPH_MAGIC 0x47524150u
#define EXEC_MAGIC 0x45584543u
#define MAX_NODES 128
struct CUgraphNode_st {
    CUgraphNodeType type;
    uint64_t bytes;
    int phys; /* -1: host graph allocation */
    CUmemPoolProps props;
    CUdeviceptr dptr;
    CUgraph child;
};
struct CUgraph_st {
    uint32_t magic;
    struct CUgraphNode_st *nodes[MAX_NODES];
    int n;
};
struct CUgraphExec_st {
    uint32_t magic;
    int n_alloc, n_free;
    struct {
        uint64_t bytes;
        int phys;
        CUdeviceptr dptr;
    } a[MAX_NODES];
    CUdeviceptr f[MAX_NODES];
    unsigned long long flags;
};
static uint64_t g_gp_reserved[FAKE_MAX_DEV], g_gp_used[FAKE_MAX_DEV];
static uint64_t g_gp_reserved_high[FAKE_MAX_DEV], g_gp_used_high[FAKE_MAX_DEV];

EXPORT CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    (void)flags;
    FAULT();
    struct CUgraph_st *g = calloc(1, sizeof(*g));
    g->magic = GRAPH_MAGIC;
    *phGraph = g;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphDestroy(CUgraph g)
{
    FAULT();
    if (!g || g->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < g->n; i++)
        free(g->nodes[i]);
    g->magic = 0;
    free(g);
    return CUDA_SUCCESS;
}

static CUresult add_node(CUgraph g, struct CUgraphNode_st *n, CUgraphNode *out)
{
    if (!g || g->magic != GRAPH_MAGIC || g->n >= MAX_NODES) {
        free(n);
        return CUDA_ERROR_INVALID_VALUE;
    }
    g->nodes[g->n++] = n;
    if (out)
        *out = n;
    return CUDA_SUCCESS;
}

/* fk_mu not held */
static CUresult alloc_node(CUgraph g, const CUmemPoolProps *props, uint64_t bytes,
                           CUdeviceptr *dptr, CUgraphNode *out)
{
    int phys;
    if (bytes == 0 || location_device(&props->location, &phys) == -2)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *n = calloc(1, sizeof(*n));
    n->type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    n->bytes = bytes;
    n->phys = phys;
    n->props = *props;
    pthread_mutex_lock(&fk_mu);
    n->dptr = g_next_graph;
    g_next_graph += roundup(bytes, 1 << 20);
    pthread_mutex_unlock(&fk_mu);
    *dptr = n->dptr;
    return add_node(g, n, out);
}

EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                       const CUgraphNode *deps, size_t ndeps,
                                       CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    (void)deps;
    (void)ndeps;
    COUNT();
    FAULT();
    if (!params)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_node(hGraph, &params->poolProps, params->bytesize, &params->dptr, phGraphNode);
}

EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                      const CUgraphNode *deps, size_t ndeps, CUdeviceptr dptr)
{
    (void)deps;
    (void)ndeps;
    FAULT();
    struct CUgraphNode_st *n = calloc(1, sizeof(*n));
    n->type = CU_GRAPH_NODE_TYPE_MEM_FREE;
    n->dptr = dptr;
    return add_node(hGraph, n, phGraphNode);
}

EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                         const CUgraphNode *deps, size_t ndeps, CUgraph child)
{
    (void)deps;
    (void)ndeps;
    FAULT();
    if (!child || child->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *n = calloc(1, sizeof(*n));
    n->type = CU_GRAPH_NODE_TYPE_GRAPH;
    n->child = child;
    return add_node(hGraph, n, phGraphNode);
}

EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode n, CUgraph *phGraph)
{
    FAULT();
    if (!n || n->type != CU_GRAPH_NODE_TYPE_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    *phGraph = n->child;
    return CUDA_SUCCESS;
}

OLD_LACKS CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *numNodes)
{
    FAULT();
    if (!g || g->magic != GRAPH_MAGIC || !numNodes)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodes) {
        size_t k = 0;
        for (; k < *numNodes && k < (size_t)g->n; k++)
            nodes[k] = g->nodes[k];
        *numNodes = k;
    } else {
        *numNodes = (size_t)g->n;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType *type)
{
    FAULT();
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    *type = n->type;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode n, CUDA_MEM_ALLOC_NODE_PARAMS *out)
{
    FAULT();
    if (!n || n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC || !out)
        return CUDA_ERROR_INVALID_VALUE;
    memset(out, 0, sizeof(*out));
    out->poolProps = n->props;
    out->bytesize = n->bytes;
    out->dptr = n->dptr;
    return CUDA_SUCCESS;
}

static void flatten(struct CUgraphExec_st *e, CUgraph g)
{
    for (int i = 0; i < g->n; i++) {
        struct CUgraphNode_st *n = g->nodes[i];
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && e->n_alloc < MAX_NODES) {
            e->a[e->n_alloc].bytes = n->bytes;
            e->a[e->n_alloc].phys = n->phys;
            e->a[e->n_alloc].dptr = n->dptr;
            e->n_alloc++;
        } else if (n->type == CU_GRAPH_NODE_TYPE_MEM_FREE && e->n_free < MAX_NODES) {
            e->f[e->n_free++] = n->dptr;
        } else if (n->type == CU_GRAPH_NODE_TYPE_GRAPH) {
            flatten(e, n->child);
        }
    }
}

static void gp_note(int phys)
{
    if (g_gp_reserved[phys] > g_gp_reserved_high[phys])
        g_gp_reserved_high[phys] = g_gp_reserved[phys];
    if (g_gp_used[phys] > g_gp_used_high[phys])
        g_gp_used_high[phys] = g_gp_used[phys];
}

/* Grow the graph pools so that the exec's allocations that are not live fit. fk_mu held. */
static CUresult gp_reserve(struct CUgraphExec_st *e)
{
    uint64_t need[FAKE_MAX_DEV] = {0};
    for (int i = 0; i < e->n_alloc; i++) {
        alloc *a = find_alloc(e->a[i].dptr);
        if (e->a[i].phys >= 0 && (!a || (e->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)))
            need[e->a[i].phys] += a ? 0 : e->a[i].bytes;
    }
    uint64_t grown[FAKE_MAX_DEV] = {0};
    for (int p = 0; p < FAKE_MAX_DEV; p++) {
        if (need[p] && g_gp_used[p] + need[p] > g_gp_reserved[p]) {
            uint64_t grow = roundup(g_gp_used[p] + need[p] - g_gp_reserved[p], fk_chunk());
            if (fake_take((uint32_t)p, grow) != 0) {
                for (int q = 0; q < p; q++) {
                    if (grown[q]) {
                        fake_give((uint32_t)q, grown[q]);
                        g_gp_reserved[q] -= grown[q];
                    }
                }
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            g_gp_reserved[p] += grow;
            grown[p] = grow;
            gp_note(p);
        }
    }
    return CUDA_SUCCESS;
}

static CUresult instantiate(CUgraphExec *pe, CUgraph g, unsigned long long flags)
{
    if (!pe || !g || g->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *e = calloc(1, sizeof(*e));
    e->magic = EXEC_MAGIC;
    e->flags = flags;
    flatten(e, g);
    if (flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) {
        pthread_mutex_lock(&fk_mu);
        CUresult r = gp_reserve(e);
        pthread_mutex_unlock(&fk_mu);
        if (r != CUDA_SUCCESS) {
            free(e);
            return r;
        }
    }
    *pe = e;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g, unsigned long long flags)
{
    COUNT();
    FAULT();
    return instantiate(pe, g, flags);
}

EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *pe, CUgraph g,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    COUNT();
    FAULT();
    CUresult r = instantiate(pe, g, params ? params->flags : 0);
    if (params)
        params->result_out = r == CUDA_SUCCESS ? 0 : 1;
    return r;
}

EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *pe, CUgraph g,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    FAULT();
    return cuGraphInstantiateWithParams(pe, g, params);
}

EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log,
                                      size_t n)
{
    (void)err;
    (void)log;
    (void)n;
    COUNT();
    FAULT();
    return instantiate(pe, g, 0);
}

EXPORT CUresult cuGraphInstantiate(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log,
                                   size_t n)
{
    FAULT();
    return cuGraphInstantiate_v2(pe, g, err, log, n);
}

CUresult fk_graph_exec_launch(CUgraphExec e, CUstream s, int upload_only)
{
    if (!e || e->magic != EXEC_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    if (!upload_only && !(e->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)) {
        for (int i = 0; i < e->n_alloc; i++) {
            if (find_alloc(e->a[i].dptr)) { /* its allocation from the last launch is live */
                pthread_mutex_unlock(&fk_mu);
                return CUDA_ERROR_INVALID_VALUE;
            }
        }
    }
    CUresult r = gp_reserve(e);
    if (r != CUDA_SUCCESS || upload_only) {
        pthread_mutex_unlock(&fk_mu);
        return r;
    }
    struct CUctx_st *c = stream_ctx(s);
    for (int i = 0; i < e->n_alloc; i++) {
        alloc *old = find_alloc(e->a[i].dptr);
        if (old) { /* auto-free on launch */
            if (old->phys >= 0)
                g_gp_used[old->phys] -= old->bytes;
            old->kind = K_FREE;
        }
        new_alloc(e->a[i].dptr, e->a[i].bytes, e->a[i].phys, K_GRAPH, c, NULL);
        if (e->a[i].phys >= 0) {
            g_gp_used[e->a[i].phys] += e->a[i].bytes;
            gp_note(e->a[i].phys);
        }
    }
    for (int i = 0; i < e->n_free; i++) {
        alloc *a = find_alloc(e->f[i]);
        if (a && a->kind == K_GRAPH) {
            if (a->phys >= 0)
                g_gp_used[a->phys] -= a->bytes;
            a->kind = K_FREE;
        }
    }
    pthread_mutex_unlock(&fk_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
    COUNT();
    FAULT();
    if (!e || e->magic != EXEC_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    e->magic = 0;
    free(e); /* graph allocations that are live outlive the exec */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    COUNT();
    FAULT();
    FAIL_FREE();
    int p = fk_phys(dev);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fk_mu);
    uint64_t keep = roundup(g_gp_used[p], fk_chunk());
    if (keep < g_gp_reserved[p]) {
        fake_give((uint32_t)p, g_gp_reserved[p] - keep);
        g_gp_reserved[p] = keep;
    }
    pthread_mutex_unlock(&fk_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value)
{
    FAULT();
    int p = fk_phys(dev);
    if (p < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    cuuint64_t *v = value;
    pthread_mutex_lock(&fk_mu);
    CUresult r = CUDA_SUCCESS;
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
        *v = g_gp_used[p];
        break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
        *v = g_gp_used_high[p];
        break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
        *v = g_gp_reserved[p];
        break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
        *v = g_gp_reserved_high[p];
        break;
    default:
        r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&fk_mu);
    return r;
}

/* ---- stream-ordered allocation -------------------------------------------------------------- */
static int capturing(CUstream s)
{
    return s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD && s->capturing;
}

static CUresult alloc_from(struct CUmemPoolHandle_st *p, CUdeviceptr *dptr, size_t bytes, CUstream s)
{
    if (!valid_pool(p))
        return CUDA_ERROR_INVALID_VALUE;
    if (capturing(s)) { /* an allocation node of the graph being captured, owned by the graph */
        CUmemPoolProps props;
        memset(&props, 0, sizeof(props));
        props.allocType = p->alloc_type;
        props.location.type = p->loc_type;
        props.location.id = p->loc_id;
        return alloc_node(s->graph, &props, bytes, dptr, NULL);
    }
    pthread_mutex_lock(&fk_mu);
    unsigned long long key;
    CUresult r = pool_alloc(p, bytes, s, &key);
    pthread_mutex_unlock(&fk_mu);
    if (r == CUDA_SUCCESS)
        *dptr = key;
    return r;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    COUNT();
    FAULT();
    int dev = fk_stream_ordinal(s);
    if (dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fk_mu);
    struct CUmemPoolHandle_st *p = current_pool(dev);
    pthread_mutex_unlock(&fk_mu);
    return alloc_from(p, dptr, bytesize, s);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream s)
{
    FAULT();
    return cuMemAllocAsync(dptr, bytesize, s);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream s)
{
    COUNT();
    FAULT();
    return alloc_from(pool, dptr, bytesize, s);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream s)
{
    FAULT();
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, s);
}

/* Free any allocation by key. fk_mu held. */
static CUresult free_locked(unsigned long long key)
{
    alloc *a = find_alloc(key);
    if (!a)
        return CUDA_ERROR_INVALID_VALUE;
    alloc v = *a;
    a->kind = K_FREE;
    if (v.kind == K_POOL)
        pool_free(v.pool, v.bytes, v.phys);
    else if (v.kind == K_GRAPH)
        g_gp_used[v.phys >= 0 ? v.phys : 0] -= v.phys >= 0 ? v.bytes : 0; /* host graph memory takes none */
    else
        give_pages(v.phys, v.held, v.page);
    return CUDA_SUCCESS;
}

static CUresult free_any(unsigned long long key)
{
    pthread_mutex_lock(&fk_mu);
    CUresult r = free_locked(key);
    pthread_mutex_unlock(&fk_mu);
    return r;
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
    COUNT();
    FAULT();
    if (capturing(s)) {
        CUgraphNode n;
        return cuGraphAddMemFreeNode(&n, s->graph, NULL, 0, dptr);
    }
    FAIL_FREE();
    return free_any(dptr);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s) { return cuMemFreeAsync(dptr, s); }

/* ---- plain allocations ------------------------------------------------------------------------ */
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    COUNT();
    FAULT();
    if (!fk_cur())
        return CUDA_ERROR_INVALID_CONTEXT;
    return do_alloc(cur_ordinal(), bytesize, K_PLAIN, dptr, 0);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    (void)flags;
    COUNT();
    FAULT();
    if (!fk_cur())
        return CUDA_ERROR_INVALID_CONTEXT;
    return do_alloc(cur_ordinal(), bytesize, K_PLAIN, dptr, 0);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t w, size_t h,
                                   unsigned int elem)
{
    (void)elem;
    COUNT();
    FAULT();
    if (!fk_cur())
        return CUDA_ERROR_INVALID_CONTEXT;
    const char *a = getenv("FAKE_PITCH_ALIGN");
    size_t align = a ? strtoul(a, NULL, 10) : 512;
    size_t pitch = (w + align - 1) / align * align;
    CUresult r = do_alloc(cur_ordinal(), (uint64_t)pitch * h, K_PLAIN, dptr, 0);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    return r;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    COUNT();
    FAULT();
    FAIL_FREE();
    return free_any(dptr);
}

/* The pre-3.2 entry points: 32-bit device pointers and sizes. */
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    COUNT();
    FAULT();
    if (!fk_cur())
        return CUDA_ERROR_INVALID_CONTEXT;
    unsigned long long key;
    CUresult r = do_alloc(cur_ordinal(), bytesize, K_PLAIN, &key, 1);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)key;
    return r;
}

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int w,
                                unsigned int h, unsigned int elem)
{
    (void)elem;
    COUNT();
    FAULT();
    if (!fk_cur())
        return CUDA_ERROR_INVALID_CONTEXT;
    unsigned int pitch = (w + 511) / 512 * 512;
    unsigned long long key;
    CUresult r = do_alloc(cur_ordinal(), (uint64_t)pitch * h, K_PLAIN, &key, 1);
    if (r == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)key;
        *pPitch = pitch;
    }
    return r;
}

EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    COUNT();
    FAULT();
    FAIL_FREE();
    return free_any(dptr);
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

static CUresult array_alloc(uint64_t b, int kind, void **ph)
{
    unsigned long long key;
    CUresult r = do_alloc(cur_ordinal(), b, kind, &key, 0);
    if (r == CUDA_SUCCESS)
        *ph = (void *)(uintptr_t)key;
    return r;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *ph, const CUDA_ARRAY_DESCRIPTOR *d)
{
    COUNT();
    FAULT();
    uint64_t b = fmt_bytes(d->Format) * d->NumChannels * d->Width * (d->Height ? d->Height : 1);
    return array_alloc(b, K_ARRAY, (void **)ph);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *ph, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    COUNT();
    FAULT();
    uint64_t b = fmt_bytes(d->Format) * d->NumChannels * d->Width * (d->Height ? d->Height : 1) *
                 (d->Depth ? d->Depth : 1);
    return array_alloc(b, K_ARRAY, (void **)ph);
}

EXPORT CUresult cuArrayCreate(CUarray *ph, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    COUNT();
    FAULT();
    uint64_t b = fmt_bytes(d->Format) * d->NumChannels * d->Width * (d->Height ? d->Height : 1);
    return array_alloc(b, K_ARRAY, (void **)ph);
}

EXPORT CUresult cuArray3DCreate(CUarray *ph, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    COUNT();
    FAULT();
    uint64_t b = fmt_bytes(d->Format) * d->NumChannels * d->Width * (d->Height ? d->Height : 1) *
                 (d->Depth ? d->Depth : 1);
    return array_alloc(b, K_ARRAY, (void **)ph);
}

HIDDEN void fk_array_gone(uint64_t array); /* fake_vmm.c: sparse mappings of a destroyed array */

EXPORT CUresult cuArrayDestroy(CUarray a)
{
    COUNT();
    FAULT();
    FAIL_FREE();
    fk_array_gone((uint64_t)(uintptr_t)a);
    return free_any((uint64_t)(uintptr_t)a);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *ph, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                       unsigned int levels)
{
    COUNT();
    FAULT();
    uint64_t b = 0;
    size_t w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned i = 0; i < levels; i++) {
        b += fmt_bytes(d->Format) * d->NumChannels * (w ? w : 1) * (h ? h : 1) * (z ? z : 1);
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        z = z > 1 ? z / 2 : z;
    }
    return array_alloc(b, K_MIPMAP, (void **)ph);
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a)
{
    COUNT();
    FAULT();
    FAIL_FREE();
    fk_array_gone((uint64_t)(uintptr_t)a);
    return free_any((uint64_t)(uintptr_t)a);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    COUNT();
    FAULT();
    struct CUctx_st *c = fk_cur();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    fk_sweep();
    fake_dev *d = &fake_state_get()->dev[fk_phys(c->dev)];
    uint64_t used = __atomic_load_n(&d->used, __ATOMIC_ACQUIRE);
    *total_b = d->total;
    *free_b = d->total - used;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total_b)
{
    FAULT();
    size_t f, t;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS) {
        *free_b = f > 0xffffffffu ? 0xffffffffu : (unsigned int)f;
        *total_b = t > 0xffffffffu ? 0xffffffffu : (unsigned int)t;
    }
    return r;
}

HIDDEN int fk_vmm_range(CUdeviceptr p, CUdeviceptr *base, size_t *size);

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    FAULT();
    pthread_mutex_lock(&fk_mu);
    for (int i = 0; i < MAX_ALLOCS; i++) {
        alloc *a = &g_allocs[i];
        if (a->kind && a->kind != K_ARRAY && a->kind != K_MIPMAP && dptr >= a->key &&
            dptr < a->key + a->bytes) {
            if (pbase)
                *pbase = a->key;
            if (psize)
                *psize = a->bytes;
            pthread_mutex_unlock(&fk_mu);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&fk_mu);
    CUdeviceptr b;
    size_t s;
    if (fk_vmm_range(dptr, &b, &s) != 0)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = b;
    if (psize)
        *psize = s;
    return CUDA_SUCCESS;
}

/* ---- context teardown ------------------------------------------------------------------------- */
void fk_ctx_gone(struct CUctx_st *c)
{
    pthread_mutex_lock(&fk_mu);
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (g_allocs[i].kind && g_allocs[i].ctx == c)
            free_locked(g_allocs[i].key);
    /* the device's pools and graph pool give back what is no longer in use */
    int p = fk_phys(c->dev);
    for (int i = 0; i < MAX_POOLS; i++)
        if (g_pools[i] && g_pools[i]->phys == p)
            pool_trim(g_pools[i], 0);
    if (p >= 0) {
        uint64_t keep = roundup(g_gp_used[p], fk_chunk());
        if (keep < g_gp_reserved[p]) {
            fake_give((uint32_t)p, g_gp_reserved[p] - keep);
            g_gp_reserved[p] = keep;
        }
    }
    pthread_mutex_unlock(&fk_mu);
}
