/*
 * Fake driver virtual memory management: physical allocations (cuMemCreate), address
 * reservations and mappings, shareable handles, multicast objects, sparse-array mappings and
 * logical-endpoint bindings.
 *
 * A physical allocation is freed when nothing references it any more, as in the real driver:
 * no handle (cuMemCreate, cuMemRetainAllocationHandle and cuMemImportFromShareableHandle add
 * one, cuMemRelease drops one), no mapping (cuMemMap / cuMemUnmap), no binding (multicast,
 * sparse array, logical endpoint), and no open exported file descriptor. Exported
 * descriptors are files beside the shared state, each with an open-file-description lock held
 * through the descriptor the application got: when every copy of it is closed, in any process,
 * the lock is gone and the next sweep releases the memory. Objects live in the shared state, so
 * an importer in another process finds what an exporter made.
 */
#include <sys/file.h>

#include "fake_int.h"

#define HANDLE_TAG 0xF00D000000000000ull
static unsigned long long to_handle(int id) { return HANDLE_TAG | (unsigned long long)(id + 1); }
static int to_id(unsigned long long h)
{
    if ((h & 0xFFFF000000000000ull) != HANDLE_TAG)
        return -1;
    unsigned long long i = (h & 0xFFFFFFFFFFFFull) - 1;
    return i < FAKE_MAX_OBJ ? (int)i : -1;
}

/* ---- the shared object table lock (threads and processes) ---- */
static pthread_mutex_t g_obj_mu = PTHREAD_MUTEX_INITIALIZER;

void fk_obj_lock(void)
{
    fake_state_get();
    pthread_mutex_lock(&g_obj_mu);
    if (fake_state_fd >= 0)
        flock(fake_state_fd, LOCK_EX);
}

void fk_obj_unlock(void)
{
    if (fake_state_fd >= 0)
        flock(fake_state_fd, LOCK_UN);
    pthread_mutex_unlock(&g_obj_mu);
}

static fake_obj *obj(int id) { return &fake_state_get()->obj[id]; }

/* A live object the handle h names, or NULL. Object lock held. */
static fake_obj *by_handle(unsigned long long h, int *id)
{
    int i = to_id(h);
    if (i < 0 || !obj(i)->live || obj(i)->refs <= 0)
        return NULL;
    *id = i;
    return obj(i);
}

/* ---- per-process mappings and bindings ---- */
typedef struct mapping {
    CUdeviceptr va;
    size_t size;
    int id;
} mapping;
#define MAX_MAPS 8192
static mapping g_maps[MAX_MAPS];
static int g_nmaps;

typedef struct reservation {
    CUdeviceptr va;
    size_t size;
} reservation;
static reservation g_res[1024];
static int g_nres;
static CUdeviceptr g_next_va = 0x600000000000ull;

enum { B_MULTICAST = 1, B_ARRAY = 2, B_ENDPOINT = 3 };
typedef struct binding {
    int kind;
    uint64_t owner; /* multicast object id, array handle or logical endpoint id */
    size_t offset, size;
    int id; /* the physical object held */
} binding;
#define MAX_BINDS 4096
static binding g_binds[MAX_BINDS];
static int g_nbinds;

static void release_binds(int kind, uint64_t owner);

/* Free the object if nothing references it. Object lock held. */
static void maybe_free(int id)
{
    fake_obj *o = obj(id);
    if (!o->live || o->refs > 0 || o->holds > 0 || o->exports > 0)
        return;
    if (o->phys >= 0)
        fake_give((uint32_t)o->phys, o->bytes);
    if (o->multicast)
        release_binds(B_MULTICAST, (uint64_t)id);
    memset(o, 0, sizeof(*o));
}

static void drop_hold(int id)
{
    obj(id)->holds--;
    maybe_free(id);
}

/* Object lock held. */
static void release_binds(int kind, uint64_t owner)
{
    for (int i = 0; i < g_nbinds;) {
        if (g_binds[i].kind == kind && g_binds[i].owner == owner) {
            int id = g_binds[i].id;
            g_binds[i] = g_binds[--g_nbinds];
            drop_hold(id);
        } else {
            i++;
        }
    }
}

static void export_path(int id, uint32_t seq, char *buf, size_t n)
{
    snprintf(buf, n, "%s.exp.%d.%u", fake_state_path, id, seq);
}

void fk_sweep(void)
{
    fk_obj_lock();
    pthread_mutex_lock(&fk_mu);
    for (int id = 0; id < FAKE_MAX_OBJ; id++) {
        fake_obj *o = obj(id);
        if (!o->live || o->refs > 0 || o->holds > 0 || o->exports <= 0)
            continue;
        for (uint32_t s = 0; s < o->export_seq; s++) {
            char path[600];
            export_path(id, s, path, sizeof(path));
            int fd = open(path, O_RDWR | O_CLOEXEC);
            if (fd < 0)
                continue;
            struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
            if (fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type == F_UNLCK) {
                unlink(path); /* every copy of the exported descriptor is closed */
                o->exports--;
            }
            close(fd);
        }
        maybe_free(id);
    }
    pthread_mutex_unlock(&fk_mu);
    fk_obj_unlock();
}

/* ---- physical allocations ---- */
static int location_phys(const CUmemLocation *l, int *phys)
{
    switch (l->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        *phys = fk_phys(l->id);
        return *phys >= 0 ? 0 : -1;
    case CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN:
        *phys = fk_phys(l->localized.deviceId);
        return *phys >= 0 && l->localized.localityDomainId < FAKE_LOCALITY_DOMAINS ? 0 : -1;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        *phys = -1;
        return 0;
    default:
        return -1;
    }
}

static CUresult new_obj(int phys, uint64_t bytes, int multicast, int loc_type,
                        unsigned long long *handle)
{
    if (phys >= 0 && fake_take((uint32_t)phys, bytes) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fk_obj_lock();
    for (int id = 0; id < FAKE_MAX_OBJ; id++) {
        fake_obj *o = obj(id);
        if (o->live)
            continue;
        memset(o, 0, sizeof(*o));
        o->live = 1;
        o->phys = phys;
        o->bytes = bytes;
        o->refs = 1;
        o->multicast = (uint32_t)multicast;
        o->loc_type = loc_type;
        fk_obj_unlock();
        *handle = to_handle(id);
        return CUDA_SUCCESS;
    }
    fk_obj_unlock();
    if (phys >= 0)
        fake_give((uint32_t)phys, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option)
{
    (void)prop;
    (void)option;
    *granularity = fk_chunk();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    (void)flags;
    COUNT();
    FAULT();
    int phys;
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || location_phys(&prop->location, &phys) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (size == 0 || size % fk_chunk() != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return new_obj(phys, size, 0, prop->location.type, handle);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    COUNT();
    FAULT();
    FAIL_FREE();
    fk_obj_lock();
    pthread_mutex_lock(&fk_mu);
    int id;
    fake_obj *o = by_handle(handle, &id);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (o) {
        o->refs--;
        maybe_free(id);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&fk_mu);
    fk_obj_unlock();
    return r;
}

EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                       CUmemGenericAllocationHandle handle)
{
    FAULT();
    fk_obj_lock();
    int id;
    fake_obj *o = by_handle(handle, &id);
    if (!o || !prop) {
        fk_obj_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    if (o->phys < 0) {
        prop->location.type = CU_MEM_LOCATION_TYPE_HOST;
    } else {
        int ord = fk_ordinal(o->phys);
        prop->location.type = ord < 0 ? CU_MEM_LOCATION_TYPE_INVISIBLE : CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = ord;
    }
    fk_obj_unlock();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags)
{
    (void)addr;
    (void)flags;
    FAULT();
    if (!ptr || size == 0 || g_nres >= 1024)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fk_mu);
    size_t a = alignment ? alignment : fk_chunk();
    CUdeviceptr va = (g_next_va + a - 1) / a * a;
    g_next_va = va + size;
    g_res[g_nres++] = (reservation){va, size};
    pthread_mutex_unlock(&fk_mu);
    *ptr = va;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    FAULT();
    pthread_mutex_lock(&fk_mu);
    for (int i = 0; i < g_nres; i++) {
        if (g_res[i].va == ptr && g_res[i].size == size) {
            for (int m = 0; m < g_nmaps; m++)
                if (g_maps[m].va >= ptr && g_maps[m].va < ptr + size) {
                    pthread_mutex_unlock(&fk_mu);
                    return CUDA_ERROR_INVALID_VALUE; /* still mapped */
                }
            g_res[i] = g_res[--g_nres];
            pthread_mutex_unlock(&fk_mu);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&fk_mu);
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    (void)flags;
    COUNT();
    FAULT();
    fk_obj_lock();
    pthread_mutex_lock(&fk_mu);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    int id;
    fake_obj *o = by_handle(handle, &id);
    int inside = 0;
    for (int i = 0; i < g_nres; i++)
        if (ptr >= g_res[i].va && ptr + size <= g_res[i].va + g_res[i].size)
            inside = 1;
    if (o && inside && size && offset + size <= o->bytes && g_nmaps < MAX_MAPS) {
        r = CUDA_SUCCESS;
        for (int i = 0; i < g_nmaps; i++)
            if (ptr < g_maps[i].va + g_maps[i].size && g_maps[i].va < ptr + size)
                r = CUDA_ERROR_ALREADY_MAPPED;
        if (r == CUDA_SUCCESS) {
            g_maps[g_nmaps++] = (mapping){ptr, size, id};
            o->holds++;
        }
    }
    pthread_mutex_unlock(&fk_mu);
    fk_obj_unlock();
    return r;
}

/* Unmap every mapping inside [ptr, ptr+size); a mapping only partly inside is an error. */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    COUNT();
    FAULT();
    FAIL_FREE();
    fk_obj_lock();
    pthread_mutex_lock(&fk_mu);
    int found = 0;
    for (int i = 0; i < g_nmaps; i++) {
        mapping *m = &g_maps[i];
        if (m->va < ptr + size && ptr < m->va + m->size) {
            if (m->va < ptr || m->va + m->size > ptr + size) {
                pthread_mutex_unlock(&fk_mu);
                fk_obj_unlock();
                return CUDA_ERROR_INVALID_VALUE;
            }
            found++;
        }
    }
    if (!found) {
        pthread_mutex_unlock(&fk_mu);
        fk_obj_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (int i = 0; i < g_nmaps;) {
        if (g_maps[i].va >= ptr && g_maps[i].va + g_maps[i].size <= ptr + size) {
            int id = g_maps[i].id;
            g_maps[i] = g_maps[--g_nmaps];
            drop_hold(id);
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&fk_mu);
    fk_obj_unlock();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count)
{
    (void)ptr;
    (void)size;
    (void)desc;
    (void)count;
    FAULT();
    return CUDA_SUCCESS;
}

/* fk_mu held */
static int mapping_at(CUdeviceptr p)
{
    for (int i = 0; i < g_nmaps; i++)
        if (p >= g_maps[i].va && p < g_maps[i].va + g_maps[i].size)
            return i;
    return -1;
}

int fk_vmm_range(CUdeviceptr p, CUdeviceptr *base, size_t *size)
{
    pthread_mutex_lock(&fk_mu);
    int m = mapping_at(p);
    if (m >= 0) {
        *base = g_maps[m].va;
        *size = g_maps[m].size;
    }
    pthread_mutex_unlock(&fk_mu);
    return m >= 0 ? 0 : -1;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    COUNT();
    FAULT();
    fk_obj_lock();
    pthread_mutex_lock(&fk_mu);
    int m = mapping_at((CUdeviceptr)(uintptr_t)addr);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (m >= 0) {
        obj(g_maps[m].id)->refs++;
        *handle = to_handle(g_maps[m].id);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&fk_mu);
    fk_obj_unlock();
    return r;
}

/* ---- shareable handles ---- */
EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType handleType,
                                             unsigned long long flags)
{
    (void)flags;
    COUNT();
    FAULT();
    if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    fk_obj_lock();
    int id;
    fake_obj *o = by_handle(handle, &id);
    if (!o) {
        fk_obj_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    char path[600];
    export_path(id, o->export_seq, path, sizeof(path));
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    int32_t v = id;
    if (fd < 0 || pwrite(fd, &v, sizeof(v), 0) != (ssize_t)sizeof(v) ||
        fcntl(fd, F_OFD_SETLK, &fl) != 0) {
        if (fd >= 0)
            close(fd);
        fk_obj_unlock();
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    o->export_seq++;
    o->exports++;
    fk_obj_unlock();
    *(int *)shareableHandle = fd;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                               CUmemAllocationHandleType shHandleType)
{
    COUNT();
    FAULT();
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    int fd = (int)(intptr_t)osHandle;
    int32_t id = -1;
    if (pread(fd, &id, sizeof(id), 0) != (ssize_t)sizeof(id) || id < 0 || id >= FAKE_MAX_OBJ)
        return CUDA_ERROR_INVALID_VALUE;
    fk_obj_lock();
    fake_obj *o = obj(id);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (o->live) {
        o->refs++;
        *handle = to_handle(id);
        r = CUDA_SUCCESS;
    }
    fk_obj_unlock();
    return r;
}

/* ---- multicast ---- */
EXPORT CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle,
                                  const CUmulticastObjectProp *prop)
{
    COUNT();
    FAULT();
    if (!prop || prop->size == 0 || prop->size % fk_chunk() != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return new_obj(-1, prop->size, 1, CU_MEM_LOCATION_TYPE_INVALID, mcHandle);
}

EXPORT CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev)
{
    (void)mcHandle;
    FAULT();
    return fk_phys(dev) < 0 ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

static CUresult bind(int kind, uint64_t owner, size_t offset, size_t size, int id)
{
    if (g_nbinds >= MAX_BINDS)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g_binds[g_nbinds++] = (binding){kind, owner, offset, size, id};
    obj(id)->holds++;
    return CUDA_SUCCESS;
}

static CUresult mc_bind_mem(CUmemGenericAllocationHandle mc, size_t mcOffset,
                            CUmemGenericAllocationHandle mem, size_t size)
{
    fk_obj_lock();
    pthread_mutex_lock(&fk_mu);
    int mid, pid;
    fake_obj *m = by_handle(mc, &mid), *p = by_handle(mem, &pid);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (m && p && m->multicast && !p->multicast && mcOffset + size <= m->bytes)
        r = bind(B_MULTICAST, (uint64_t)mid, mcOffset, size, pid);
    pthread_mutex_unlock(&fk_mu);
    fk_obj_unlock();
    return r;
}

EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                   CUmemGenericAllocationHandle memHandle, size_t memOffset,
                                   size_t size, unsigned long long flags)
{
    (void)memOffset;
    (void)flags;
    COUNT();
    FAULT();
    return mc_bind_mem(mcHandle, mcOffset, memHandle, size);
}

EXPORT CUresult cuMulticastBindMem_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                      size_t mcOffset, CUmemGenericAllocationHandle memHandle,
                                      size_t memOffset, size_t size, unsigned long long flags)
{
    (void)dev;
    (void)memOffset;
    (void)flags;
    COUNT();
    FAULT();
    return mc_bind_mem(mcHandle, mcOffset, memHandle, size);
}

static CUresult mc_bind_addr(CUmemGenericAllocationHandle mc, size_t mcOffset, CUdeviceptr memptr,
                             size_t size)
{
    fk_obj_lock();
    pthread_mutex_lock(&fk_mu);
    int mid;
    fake_obj *m = by_handle(mc, &mid);
    int at = mapping_at(memptr);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (m && m->multicast && at >= 0 && mcOffset + size <= m->bytes)
        r = bind(B_MULTICAST, (uint64_t)mid, mcOffset, size, g_maps[at].id);
    pthread_mutex_unlock(&fk_mu);
    fk_obj_unlock();
    return r;
}

EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                    CUdeviceptr memptr, size_t size, unsigned long long flags)
{
    (void)flags;
    COUNT();
    FAULT();
    return mc_bind_addr(mcHandle, mcOffset, memptr, size);
}

EXPORT CUresult cuMulticastBindAddr_v2(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                       size_t mcOffset, CUdeviceptr memptr, size_t size,
                                       unsigned long long flags)
{
    (void)dev;
    (void)flags;
    COUNT();
    FAULT();
    return mc_bind_addr(mcHandle, mcOffset, memptr, size);
}

EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                  size_t mcOffset, size_t size)
{
    (void)dev;
    COUNT();
    FAULT();
    FAIL_FREE();
    fk_obj_lock();
    pthread_mutex_lock(&fk_mu);
    int mid;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (by_handle(mcHandle, &mid)) {
        for (int i = 0; i < g_nbinds;) {
            binding *b = &g_binds[i];
            if (b->kind == B_MULTICAST && b->owner == (uint64_t)mid && b->offset >= mcOffset &&
                b->offset < mcOffset + size) {
                int id = b->id;
                *b = g_binds[--g_nbinds];
                drop_hold(id);
                r = CUDA_SUCCESS;
            } else {
                i++;
            }
        }
    }
    pthread_mutex_unlock(&fk_mu);
    fk_obj_unlock();
    return r;
}

/* ---- sparse arrays ---- */
static CUresult map_array(CUarrayMapInfo *list, unsigned int count)
{
    fk_obj_lock();
    pthread_mutex_lock(&fk_mu);
    CUresult r = CUDA_SUCCESS;
    for (unsigned int k = 0; k < count && r == CUDA_SUCCESS; k++) {
        CUarrayMapInfo *m = &list[k];
        uint64_t owner = (uint64_t)(uintptr_t)m->resource.array;
        if (m->memOperationType == CU_MEM_OPERATION_TYPE_MAP) {
            int id;
            if (m->memHandleType != CU_MEM_HANDLE_TYPE_GENERIC || !by_handle(m->memHandle.memHandle, &id))
                r = CUDA_ERROR_INVALID_VALUE;
            else
                r = bind(B_ARRAY, owner, m->offset, 0, id);
        } else {
            for (int i = 0; i < g_nbinds; i++)
                if (g_binds[i].kind == B_ARRAY && g_binds[i].owner == owner) {
                    int id = g_binds[i].id;
                    g_binds[i] = g_binds[--g_nbinds];
                    drop_hold(id);
                    break;
                }
        }
    }
    pthread_mutex_unlock(&fk_mu);
    fk_obj_unlock();
    return r;
}

EXPORT CUresult cuMemMapArrayAsync(CUarrayMapInfo *list, unsigned int count, CUstream s)
{
    (void)s;
    COUNT();
    FAULT();
    return map_array(list, count);
}

EXPORT CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *list, unsigned int count, CUstream s)
{
    FAULT();
    return cuMemMapArrayAsync(list, count, s);
}

void fk_array_gone(uint64_t array)
{
    fk_obj_lock();
    pthread_mutex_lock(&fk_mu);
    release_binds(B_ARRAY, array);
    pthread_mutex_unlock(&fk_mu);
    fk_obj_unlock();
}

/* ---- logical endpoints (CUDA 13.3+): bindings hold physical memory like multicast ones ---- */
EXPORT CUresult cuLogicalEndpointCreate(CUlogicalEndpointId leId, const void *prop)
{
    (void)leId;
    (void)prop;
    COUNT();
    FAULT();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLogicalEndpointBindMem(CUlogicalEndpointId leId, CUdevice dev, cuuint64_t offset,
                                         CUmemGenericAllocationHandle memHandle, cuuint64_t memOffset,
                                         cuuint64_t size, unsigned long long flags)
{
    (void)dev;
    (void)memOffset;
    (void)flags;
    COUNT();
    FAULT();
    fk_obj_lock();
    pthread_mutex_lock(&fk_mu);
    int id;
    CUresult r = by_handle(memHandle, &id) ? bind(B_ENDPOINT, leId, offset, size, id)
                                           : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&fk_mu);
    fk_obj_unlock();
    return r;
}

EXPORT CUresult cuLogicalEndpointBindAddr(CUlogicalEndpointId leId, CUdevice dev, cuuint64_t offset,
                                          void *ptr, cuuint64_t size, unsigned long long flags)
{
    (void)dev;
    (void)flags;
    COUNT();
    FAULT();
    fk_obj_lock();
    pthread_mutex_lock(&fk_mu);
    int at = mapping_at((CUdeviceptr)(uintptr_t)ptr);
    CUresult r = at >= 0 ? bind(B_ENDPOINT, leId, offset, size, g_maps[at].id)
                         : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&fk_mu);
    fk_obj_unlock();
    return r;
}

EXPORT CUresult cuLogicalEndpointDestroy(CUlogicalEndpointId leId)
{
    COUNT();
    FAULT();
    fk_obj_lock();
    pthread_mutex_lock(&fk_mu);
    release_binds(B_ENDPOINT, leId);
    pthread_mutex_unlock(&fk_mu);
    fk_obj_unlock();
    return CUDA_SUCCESS;
}
