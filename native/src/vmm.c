/*
 * Virtual memory management: physical allocations made with cuMemCreate are charged when they
 * are created and credited when the driver really frees them, which is when nothing refers to
 * them any more:
 *
 *   handles   cuMemCreate (1), cuMemRetainAllocationHandle (+1), cuMemImportFromShareableHandle
 *             of a handle this process already holds (+1), cuMemRelease (-1);
 *   holds     cuMemMap (+1 per mapping), cuMemUnmap (-1 for every mapping it removes),
 *             multicast bindings (cuMulticastBindMem / BindAddr, +1; cuMulticastUnbind or the
 *             end of the multicast object, -1);
 *   exports   an allocation exported with cuMemExportToShareableHandle stays charged to this
 *             process until it exits: the shareable handle keeps the memory alive for as long as
 *             any copy of it is open, in any process, and that is not visible from here.
 *
 * So the sample idiom (create, map, release the handle at once) and NCCL's query (retain, then
 * release) keep the memory charged until the last unmap, as the driver keeps it allocated.
 * An allocation imported from another process is charged to the importer too, from its first
 * mapping (the size of an imported handle is known only then: the largest mapping is
 * charged), on the GPU its properties name, until its last handle and mapping are gone; while
 * the exporter also holds it, a claim pays for it twice (over-counted, never under). Sparse
 * array mappings and logical-endpoint bindings of charged memory are refused. Host-located
 * allocations are not charged; device and locality-domain ones are; locations this library
 * does not know are refused.
 */
#include <string.h>

#include "feature.h"

#define TS_KIND_VMMH 8 /* handle value -> record index (bytes), references through it (ctx) */

typedef struct rec {
    uint8_t used;
    uint8_t exported;
    uint8_t multicast;
    uint8_t imported; /* from another process: charged from its first mapping */
    int g;      /* region entry charged, -1 for none (multicast objects) */
    CUdevice dev;
    uint64_t bytes;
    int refs;   /* handle references */
    int holds;  /* mappings and multicast bindings */
} rec;

typedef struct mapping {
    CUdeviceptr va;
    size_t size;
    int idx;
} mapping;

typedef struct bind {
    int mc;   /* multicast record */
    CUdevice dev; /* -1: bound for every device (cuMulticastBindMem/BindAddr) */
    size_t offset, size;
    int idx;  /* physical record held */
} bind;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static ts_table g_handles = {.mu = PTHREAD_MUTEX_INITIALIZER};
static rec *g_rec;
static int g_nrec, g_caprec;
static mapping *g_map;
static int g_nmap, g_capmap;
static bind *g_bind;
static int g_nbind, g_capbind;

void ts_vmm_forget(void)
{
    pthread_mutex_init(&g_mu, NULL);
    ts_table_clear(&g_handles);
    free(g_rec);
    free(g_map);
    free(g_bind);
    g_rec = NULL;
    g_map = NULL;
    g_bind = NULL;
    g_nrec = g_caprec = g_nmap = g_capmap = g_nbind = g_capbind = 0;
}

static int grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap)
        return 0;
    int nc = *cap ? *cap * 2 : 64;
    while (nc < need)
        nc *= 2;
    void *np = realloc(*p, (size_t)nc * elem);
    if (!np)
        return -1;
    *p = np;
    *cap = nc;
    return 0;
}

/* g_mu held */
static int rec_new(uint64_t bytes, int g, CUdevice dev, int multicast)
{
    for (int i = 0; i < g_nrec; i++)
        if (!g_rec[i].used) {
            g_rec[i] = (rec){1, 0, (uint8_t)multicast, 0, g, dev, bytes, 1, 0};
            return i;
        }
    if (grow((void **)&g_rec, &g_caprec, g_nrec + 1, sizeof(rec)) != 0)
        return -1;
    g_rec[g_nrec] = (rec){1, 0, (uint8_t)multicast, 0, g, dev, bytes, 1, 0};
    return g_nrec++;
}

/* Record of a handle value, -1 if not tracked. g_mu held. */
static int lookup(CUmemGenericAllocationHandle h)
{
    ts_entry e;
    return ts_table_get(&g_handles, TS_KIND_VMMH, h, &e) == 0 ? (int)e.bytes : -1;
}

/* One more reference through handle value h to record idx. g_mu held. */
static void handle_ref(CUmemGenericAllocationHandle h, int idx)
{
    ts_entry e;
    uint64_t n = ts_table_get(&g_handles, TS_KIND_VMMH, h, &e) == 0 ? e.ctx + 1 : 1;
    ts_table_put(&g_handles, TS_KIND_VMMH, h, (uint64_t)idx, -1, n);
    g_rec[idx].refs++;
}

static void release_binds_of(int mc);

/* Free the record if the driver holds the allocation no more. g_mu held. */
static void rec_settle(int idx)
{
    rec *r = &g_rec[idx];
    if (!r->used || r->refs > 0 || r->holds > 0)
        return;
    if (r->exported) {
        ts_log(TS_DEBUG, "exported allocation of %llu bytes released here; it stays charged until "
                         "this process exits",
               (unsigned long long)r->bytes);
        return;
    }
    if (r->g >= 0)
        ts_credit(r->g, r->bytes, 0);
    int mc = r->multicast;
    r->used = 0;
    if (mc)
        release_binds_of(idx);
}

/* g_mu held */
static void release_binds_of(int mc)
{
    for (int i = 0; i < g_nbind;) {
        if (g_bind[i].mc == mc) {
            int idx = g_bind[i].idx;
            g_bind[i] = g_bind[--g_nbind];
            g_rec[idx].holds--;
            rec_settle(idx);
        } else {
            i++;
        }
    }
}

/* Index of the first mapping with va >= p. g_mu held. */
static int map_lower(CUdeviceptr p)
{
    int lo = 0, hi = g_nmap;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (g_map[mid].va < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Record mapped at address p, -1 if none. g_mu held. */
static int mapped_at(CUdeviceptr p)
{
    int i = map_lower(p + 1) - 1; /* last mapping starting at or before p */
    if (i >= 0 && p < g_map[i].va + g_map[i].size)
        return g_map[i].idx;
    return -1;
}

/* Device and accounting of an allocation location: 1 device memory on *dev, 0 host memory
 * (not charged), -1 a location this library cannot account. */
static int device_of(const CUmemLocation *l, CUdevice *dev)
{
    switch (l->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        *dev = l->id;
        return 1;
    case CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN:
        *dev = l->localized.deviceId;
        return 1;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        return 0;
    default:
        return -1;
    }
}

TS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!ts_cuda_enter() || !handle || !prop || size == 0)
        return REAL(cuMemCreate) ? REAL(cuMemCreate)(handle, size, prop, flags)
                                 : CUDA_ERROR_NOT_FOUND;
    CUdevice dev = -1;
    int where = device_of(&prop->location, &dev);
    if (where < 0)
        return ts_refuse("cuMemCreate", "a memory location type this library cannot account");
    if (where == 0)
        return REAL(cuMemCreate)(handle, size, prop, flags); /* host memory */
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return ts_refuse("cuMemCreate", "an allocation type this library cannot account");
    int g = -1;
    int c = ts_charge_dev(dev, size, 0, &g, "cuMemCreate");
    if (c < 0)
        return TS_CHARGE_ERR(c);
    CUresult r = REAL(cuMemCreate)(handle, size, prop, flags);
    if (c == 0)
        return r;
    if (r != CUDA_SUCCESS) {
        ts_credit(g, size, 0);
        return r;
    }
    pthread_mutex_lock(&g_mu);
    int idx = rec_new(size, g, dev, 0);
    if (idx < 0) {
        ts_log(TS_ERR, "out of host memory tracking an allocation; it stays charged");
    } else {
        g_rec[idx].refs = 0;
        handle_ref(*handle, idx);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

TS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    if (!ts_cuda_enter() || !REAL(cuMemRelease))
        return REAL(cuMemRelease) ? REAL(cuMemRelease)(handle) : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_mu);
    CUresult r = REAL(cuMemRelease)(handle);
    ts_entry e;
    if (r == CUDA_SUCCESS && ts_table_get(&g_handles, TS_KIND_VMMH, handle, &e) == 0) {
        int idx = (int)e.bytes;
        if (e.ctx <= 1)
            ts_table_take(&g_handles, TS_KIND_VMMH, handle, &e);
        else
            ts_table_put(&g_handles, TS_KIND_VMMH, handle, e.bytes, -1, e.ctx - 1);
        g_rec[idx].refs--;
        rec_settle(idx);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

TS_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    if (!ts_cuda_enter() || !REAL(cuMemMap))
        return REAL(cuMemMap) ? REAL(cuMemMap)(ptr, size, offset, handle, flags)
                              : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_mu);
    int idx = lookup(handle);
    uint64_t more = 0;
    int g = -1;
    if (idx >= 0 && g_rec[idx].imported && size > g_rec[idx].bytes) {
        /* another process's allocation: charge what this mapping shows of it */
        g = g_rec[idx].g;
        if (g < 0) {
            CUmemAllocationProp prop;
            CUdevice dev;
            if (R.cuMemGetAllocationPropertiesFromHandle &&
                R.cuMemGetAllocationPropertiesFromHandle(&prop, handle) == CUDA_SUCCESS &&
                device_of(&prop.location, &dev) == 1) {
                g = ts_dev(dev).g;
                g_rec[idx].dev = dev;
            }
        }
        if (g >= 0) {
            more = size - g_rec[idx].bytes;
            if (ts_charge_g(g, more, 0, ts_limit_of(g), "cuMemMap of an imported allocation") != 0) {
                pthread_mutex_unlock(&g_mu);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
    }
    CUresult r = REAL(cuMemMap)(ptr, size, offset, handle, flags);
    if (more) {
        if (r == CUDA_SUCCESS) {
            g_rec[idx].g = g;
            g_rec[idx].bytes += more;
        } else {
            ts_credit(g, more, 0);
        }
    }
    if (r == CUDA_SUCCESS && idx >= 0) {
        if (grow((void **)&g_map, &g_capmap, g_nmap + 1, sizeof(mapping)) != 0) {
            ts_log(TS_ERR, "out of host memory tracking a mapping; its allocation stays charged");
            g_rec[idx].holds++; /* never dropped */
        } else {
            int at = map_lower(ptr);
            memmove(&g_map[at + 1], &g_map[at], (size_t)(g_nmap - at) * sizeof(mapping));
            g_map[at] = (mapping){ptr, size, idx};
            g_nmap++;
            g_rec[idx].holds++;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

TS_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    if (!ts_cuda_enter() || !REAL(cuMemUnmap))
        return REAL(cuMemUnmap) ? REAL(cuMemUnmap)(ptr, size) : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_mu);
    CUresult r = REAL(cuMemUnmap)(ptr, size);
    if (r == CUDA_SUCCESS) {
        /* every mapping inside the range is gone; one only partly inside keeps its hold */
        int i = map_lower(ptr);
        while (i < g_nmap && g_map[i].va < ptr + size) {
            if (g_map[i].va + g_map[i].size <= ptr + size) {
                int idx = g_map[i].idx;
                memmove(&g_map[i], &g_map[i + 1], (size_t)(g_nmap - i - 1) * sizeof(mapping));
                g_nmap--;
                g_rec[idx].holds--;
                rec_settle(idx);
            } else {
                ts_log(TS_WARN, "cuMemUnmap covered part of a mapping; its allocation stays charged");
                i++;
            }
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

TS_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    if (!ts_cuda_enter() || !REAL(cuMemRetainAllocationHandle) || !handle)
        return REAL(cuMemRetainAllocationHandle) ? REAL(cuMemRetainAllocationHandle)(handle, addr)
                                                 : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_mu);
    CUresult r = REAL(cuMemRetainAllocationHandle)(handle, addr);
    if (r == CUDA_SUCCESS) {
        int idx = lookup(*handle);
        if (idx < 0)
            idx = mapped_at((CUdeviceptr)(uintptr_t)addr); /* a new value for a known allocation */
        if (idx >= 0)
            handle_ref(*handle, idx);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

TS_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                                CUmemGenericAllocationHandle handle,
                                                CUmemAllocationHandleType handleType,
                                                unsigned long long flags)
{
    if (!ts_cuda_enter() || !REAL(cuMemExportToShareableHandle))
        return REAL(cuMemExportToShareableHandle)
                   ? REAL(cuMemExportToShareableHandle)(shareableHandle, handle, handleType, flags)
                   : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_mu);
    CUresult r = REAL(cuMemExportToShareableHandle)(shareableHandle, handle, handleType, flags);
    int idx = lookup(handle);
    if (r == CUDA_SUCCESS && idx >= 0)
        g_rec[idx].exported = 1;
    pthread_mutex_unlock(&g_mu);
    return r;
}

TS_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                  void *osHandle,
                                                  CUmemAllocationHandleType shHandleType)
{
    if (!ts_cuda_enter() || !REAL(cuMemImportFromShareableHandle) || !handle)
        return REAL(cuMemImportFromShareableHandle)
                   ? REAL(cuMemImportFromShareableHandle)(handle, osHandle, shHandleType)
                   : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_mu);
    CUresult r = REAL(cuMemImportFromShareableHandle)(handle, osHandle, shHandleType);
    if (r == CUDA_SUCCESS) {
        int idx = lookup(*handle);
        if (idx < 0) { /* another process's allocation: charged when it is mapped */
            idx = rec_new(0, -1, -1, 0);
            if (idx >= 0) {
                g_rec[idx].refs = 0;
                g_rec[idx].imported = 1;
            }
        }
        if (idx >= 0)
            handle_ref(*handle, idx); /* our own allocation again: one more reference */
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* ---- multicast: a binding holds the physical allocation like a mapping ---- */

TS_EXPORT CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle,
                                     const CUmulticastObjectProp *prop)
{
    int active = ts_cuda_enter();
    if (!REAL(cuMulticastCreate))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuMulticastCreate)(mcHandle, prop);
    if (r == CUDA_SUCCESS && active && mcHandle) {
        pthread_mutex_lock(&g_mu);
        int idx = rec_new(0, -1, -1, 1);
        if (idx >= 0) {
            g_rec[idx].refs = 0;
            handle_ref(*mcHandle, idx);
        }
        pthread_mutex_unlock(&g_mu);
    }
    return r;
}

/* g_mu held */
static void add_bind(CUmemGenericAllocationHandle mc, CUdevice dev, size_t off, size_t size,
                     int idx)
{
    int m = lookup(mc);
    if (m < 0) { /* a multicast object made before tracking: its bindings last until exit */
        m = rec_new(0, -1, -1, 1);
        if (m < 0)
            return;
    }
    if (grow((void **)&g_bind, &g_capbind, g_nbind + 1, sizeof(bind)) != 0) {
        g_rec[idx].holds++; /* never dropped */
        return;
    }
    g_bind[g_nbind++] = (bind){m, dev, off, size, idx};
    g_rec[idx].holds++;
}

static CUresult bind_mem(CUresult r, CUmemGenericAllocationHandle mc, CUdevice dev, size_t off,
                         CUmemGenericAllocationHandle mem, size_t size)
{
    int idx = lookup(mem);
    if (r == CUDA_SUCCESS && idx >= 0)
        add_bind(mc, dev, off, size, idx);
    pthread_mutex_unlock(&g_mu);
    return r;
}

TS_EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                      CUmemGenericAllocationHandle memHandle, size_t memOffset,
                                      size_t size, unsigned long long flags)
{
    if (!ts_cuda_enter() || !REAL(cuMulticastBindMem))
        return REAL(cuMulticastBindMem)
                   ? REAL(cuMulticastBindMem)(mcHandle, mcOffset, memHandle, memOffset, size, flags)
                   : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_mu);
    CUresult r = REAL(cuMulticastBindMem)(mcHandle, mcOffset, memHandle, memOffset, size, flags);
    return bind_mem(r, mcHandle, -1, mcOffset, memHandle, size);
}

TS_EXPORT CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                         size_t mcOffset, CUmemGenericAllocationHandle memHandle,
                                         size_t memOffset, size_t size, unsigned long long flags)
{
    if (!ts_cuda_enter() || !REAL(cuMulticastBindMem_v2))
        return REAL(cuMulticastBindMem_v2)
                   ? REAL(cuMulticastBindMem_v2)(mcHandle, dev, mcOffset, memHandle, memOffset,
                                                 size, flags)
                   : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_mu);
    CUresult r = REAL(cuMulticastBindMem_v2)(mcHandle, dev, mcOffset, memHandle, memOffset, size,
                                              flags);
    return bind_mem(r, mcHandle, dev, mcOffset, memHandle, size);
}

static CUresult bind_addr(CUresult r, CUmemGenericAllocationHandle mc, CUdevice dev, size_t off,
                          CUdeviceptr memptr, size_t size)
{
    int idx = mapped_at(memptr);
    if (r == CUDA_SUCCESS && idx >= 0)
        add_bind(mc, dev, off, size, idx);
    pthread_mutex_unlock(&g_mu);
    return r;
}

TS_EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                       CUdeviceptr memptr, size_t size, unsigned long long flags)
{
    if (!ts_cuda_enter() || !REAL(cuMulticastBindAddr))
        return REAL(cuMulticastBindAddr)
                   ? REAL(cuMulticastBindAddr)(mcHandle, mcOffset, memptr, size, flags)
                   : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_mu);
    CUresult r = REAL(cuMulticastBindAddr)(mcHandle, mcOffset, memptr, size, flags);
    return bind_addr(r, mcHandle, -1, mcOffset, memptr, size);
}

TS_EXPORT CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                          size_t mcOffset, CUdeviceptr memptr, size_t size,
                                          unsigned long long flags)
{
    if (!ts_cuda_enter() || !REAL(cuMulticastBindAddr_v2))
        return REAL(cuMulticastBindAddr_v2)
                   ? REAL(cuMulticastBindAddr_v2)(mcHandle, dev, mcOffset, memptr, size, flags)
                   : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_mu);
    CUresult r = REAL(cuMulticastBindAddr_v2)(mcHandle, dev, mcOffset, memptr, size, flags);
    return bind_addr(r, mcHandle, dev, mcOffset, memptr, size);
}

TS_EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                     size_t mcOffset, size_t size)
{
    if (!ts_cuda_enter() || !REAL(cuMulticastUnbind))
        return REAL(cuMulticastUnbind) ? REAL(cuMulticastUnbind)(mcHandle, dev, mcOffset, size)
                                       : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&g_mu);
    CUresult r = REAL(cuMulticastUnbind)(mcHandle, dev, mcOffset, size);
    int m = lookup(mcHandle);
    if (r == CUDA_SUCCESS && m >= 0) {
        for (int i = 0; i < g_nbind;) {
            bind *b = &g_bind[i];
            if (b->mc == m && (b->dev < 0 || b->dev == dev) && b->offset >= mcOffset &&
                b->offset < mcOffset + size) {
                int idx = b->idx;
                *b = g_bind[--g_nbind];
                g_rec[idx].holds--;
                rec_settle(idx);
            } else {
                i++;
            }
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* ---- refused: holds this library does not track ---- */

static int charged_handle(CUmemGenericAllocationHandle h)
{
    pthread_mutex_lock(&g_mu);
    int idx = lookup(h);
    int charged = idx >= 0 && g_rec[idx].g >= 0;
    pthread_mutex_unlock(&g_mu);
    return charged;
}

static int charged_mapping(CUdeviceptr p)
{
    pthread_mutex_lock(&g_mu);
    int idx = mapped_at(p);
    int charged = idx >= 0 && g_rec[idx].g >= 0;
    pthread_mutex_unlock(&g_mu);
    return charged;
}

#define SPARSE_REFUSED "mapping limited GPU memory into a sparse array is not supported under a claim"

static CUresult map_array(CUresult (*real)(CUarrayMapInfo *, unsigned int, CUstream),
                          CUarrayMapInfo *list, unsigned int count, CUstream s)
{
    if (!real)
        return CUDA_ERROR_NOT_FOUND;
    if (ts_cuda_enter() && list) {
        for (unsigned int i = 0; i < count; i++)
            if (list[i].memOperationType == CU_MEM_OPERATION_TYPE_MAP &&
                list[i].memHandleType == CU_MEM_HANDLE_TYPE_GENERIC &&
                charged_handle(list[i].memHandle.memHandle))
                return ts_refuse("cuMemMapArrayAsync", SPARSE_REFUSED);
    }
    return real(list, count, s);
}

TS_EXPORT CUresult cuMemMapArrayAsync(CUarrayMapInfo *mapInfoList, unsigned int count,
                                      CUstream hStream)
{
    ts_cuda_init();
    return map_array(REAL(cuMemMapArrayAsync), mapInfoList, count, hStream);
}

TS_EXPORT CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *mapInfoList, unsigned int count,
                                           CUstream hStream)
{
    ts_cuda_init();
    return map_array(REAL(cuMemMapArrayAsync_ptsz), mapInfoList, count, hStream);
}

#define ENDPOINT_REFUSED "binding limited GPU memory to a logical endpoint is not supported under a claim"

TS_EXPORT CUresult cuLogicalEndpointBindMem(CUlogicalEndpointId leId, CUdevice dev,
                                            cuuint64_t offset,
                                            CUmemGenericAllocationHandle memHandle,
                                            cuuint64_t memOffset, cuuint64_t size,
                                            unsigned long long flags)
{
    if (ts_cuda_enter() && charged_handle(memHandle))
        return ts_refuse("cuLogicalEndpointBindMem", ENDPOINT_REFUSED);
    return REAL(cuLogicalEndpointBindMem)
               ? REAL(cuLogicalEndpointBindMem)(leId, dev, offset, memHandle, memOffset, size, flags)
               : CUDA_ERROR_NOT_FOUND;
}

TS_EXPORT CUresult cuLogicalEndpointBindAddr(CUlogicalEndpointId leId, CUdevice dev,
                                             cuuint64_t offset, void *ptr, cuuint64_t size,
                                             unsigned long long flags)
{
    if (ts_cuda_enter() && charged_mapping((CUdeviceptr)(uintptr_t)ptr))
        return ts_refuse("cuLogicalEndpointBindAddr", ENDPOINT_REFUSED);
    return REAL(cuLogicalEndpointBindAddr)
               ? REAL(cuLogicalEndpointBindAddr)(leId, dev, offset, ptr, size, flags)
               : CUDA_ERROR_NOT_FOUND;
}

/* ---- after a context reset ---- */

void ts_vmm_recheck(CUdevice dev)
{
    if (!R.cuMemGetAllocationPropertiesFromHandle)
        return;
    pthread_mutex_lock(&g_mu);
    /* Handles the driver no longer knows lost their references with the reset. Only the
     * driver's answer that the handle is invalid says so: any other failure (after a kernel
     * fault the driver fails every call with CUDA_ERROR_ILLEGAL_ADDRESS, and the process keeps
     * its memory until it exits) says nothing, and the handle stays charged. */
    ts_entry buf[256];
    size_t n = 0;
    pthread_mutex_lock(&g_handles.mu);
    for (size_t i = 0; i < g_handles.cap && n < 256; i++)
        if (g_handles.e[i].kind == TS_KIND_VMMH)
            buf[n++] = g_handles.e[i];
    pthread_mutex_unlock(&g_handles.mu);
    for (size_t i = 0; i < n; i++) {
        int idx = (int)buf[i].bytes;
        CUmemAllocationProp prop;
        if (g_rec[idx].dev != dev ||
            R.cuMemGetAllocationPropertiesFromHandle(&prop, buf[i].key) != CUDA_ERROR_INVALID_VALUE)
            continue;
        ts_entry e = buf[i];
        ts_table_take(&g_handles, TS_KIND_VMMH, buf[i].key, &e);
        g_rec[idx].refs -= (int)e.ctx;
        rec_settle(idx);
    }
    pthread_mutex_unlock(&g_mu);
}
