/*
 * libtessera-enforce: the memory queries (cuMemGetInfo, cuDeviceTotalMem and NVML's
 * nvmlDeviceGetMemoryInfo): the claim's view of a limited GPU (a feature; pool.c's charges are
 * brought to the driver's figures first).
 */
#include <pthread.h>
#include <string.h>

#include "feature.h"

/* NVML device handles seen, with their region entry and limit. */
static struct {
    nvmlDevice_t h;
    int g;
    uint64_t limit;
} g_nvml_dev[MAX_ORDINALS];
static int g_nvml_n;


/* ---------------------------------------------------------------------------------------- */
/* memory queries                                                                            */

/* The claim's view of the current device: total and free for a limited GPU. 0 if limited. */
static int limited_view(uint64_t phys_free, uint64_t phys_total, uint64_t *free_out,
                        uint64_t *total_out)
{
    CUdevice dev;
    if (ts_current_dev(&dev) != 0)
        return -1;
    if (G.closed) {
        *free_out = 0;
        *total_out = phys_total;
        return 0;
    }
    dev_info d = ts_dev(dev);
    if (d.g < 0)
        return -1;
    ts_pools_resync(d.g);
    uint64_t total = d.limit < phys_total ? d.limit : phys_total;
    uint64_t used = ts_region_usage(&G.region, d.g, 1) + ts_driver_extra(d.g);
    uint64_t fr = used >= total ? 0 : total - used;
    if (fr > phys_free)
        fr = phys_free; /* never promise what the physical GPU does not have */
    *free_out = fr;
    *total_out = total;
    return 0;
}

TS_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    ts_cuda_init();
    if (!REAL(cuMemGetInfo_v2))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuMemGetInfo_v2)(free_b, total_b);
    uint64_t f, t;
    if (r != CUDA_SUCCESS || !free_b || !total_b || !ts_cuda_enter() ||
        limited_view(*free_b, *total_b, &f, &t) != 0)
        return r;
    *free_b = (size_t)f;
    *total_b = (size_t)t;
    return r;
}

/* The pre-3.2 query (32-bit sizes): the same view, clamped. */
TS_EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total_b)
{
    ts_cuda_init();
    if (!REAL(cuMemGetInfo))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuMemGetInfo)(free_b, total_b);
    uint64_t f, t;
    if (r != CUDA_SUCCESS || !free_b || !total_b || !ts_cuda_enter() ||
        limited_view(*free_b, *total_b, &f, &t) != 0)
        return r;
    *free_b = (unsigned int)(f > 0xffffffffu ? 0xffffffffu : f);
    *total_b = (unsigned int)(t > 0xffffffffu ? 0xffffffffu : t);
    return r;
}

TS_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    ts_cuda_init();
    if (!REAL(cuDeviceTotalMem_v2))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuDeviceTotalMem_v2)(bytes, dev);
    if (r == CUDA_SUCCESS && bytes && ts_core_init() == ST_ACTIVE && !G.closed) {
        dev_info d = ts_dev(dev);
        if (d.g >= 0 && d.limit < *bytes)
            *bytes = (size_t)d.limit;
    }
    return r;
}

TS_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    ts_cuda_init();
    if (!REAL(cuDeviceTotalMem))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuDeviceTotalMem)(bytes, dev);
    if (r == CUDA_SUCCESS && bytes && ts_core_init() == ST_ACTIVE && !G.closed) {
        dev_info d = ts_dev(dev);
        if (d.g >= 0 && d.limit < *bytes)
            *bytes = (unsigned int)d.limit;
    }
    return r;
}


/* ---------------------------------------------------------------------------------------- */
/* NVML                                                                                      */

/* Region entry and limit of an NVML device handle (keyed by UUID; NVML ignores
 * CUDA_VISIBLE_DEVICES and enumerates every GPU of the node that the container can see). */
static int nvml_dev(nvmlDevice_t h, uint64_t *limit)
{
    pthread_mutex_lock(&G.mu);
    for (int i = 0; i < g_nvml_n; i++) {
        if (g_nvml_dev[i].h == h) {
            int g = g_nvml_dev[i].g;
            *limit = g_nvml_dev[i].limit;
            pthread_mutex_unlock(&G.mu);
            return g;
        }
    }
    pthread_mutex_unlock(&G.mu);
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (!R.nvmlDeviceGetUUID || R.nvmlDeviceGetUUID(h, uuid, sizeof(uuid)) != NVML_SUCCESS)
        return -1;
    int g = -1;
    *limit = 0;
    for (uint32_t i = 0; i < G.lim.gpu_count; i++) {
        if (tessera_uuid_equal(G.lim.gpus[i].uuid, uuid)) {
            g = ts_region_gpu(&G.region, G.lim.gpus[i].uuid, G.lim.gpus[i].memory,
                              G.lim.gpus[i].cores);
            *limit = G.lim.gpus[i].memory;
        }
    }
    pthread_mutex_lock(&G.mu);
    if (g_nvml_n < MAX_ORDINALS) {
        g_nvml_dev[g_nvml_n].h = h;
        g_nvml_dev[g_nvml_n].g = g;
        g_nvml_dev[g_nvml_n].limit = *limit;
        g_nvml_n++;
    }
    pthread_mutex_unlock(&G.mu);
    return g;
}

static void nvml_view(nvmlDevice_t h, unsigned long long *total, unsigned long long *free_b,
                      unsigned long long *used)
{
    if (ts_core_init() != ST_ACTIVE)
        return;
    if (G.closed) {
        *free_b = 0;
        return;
    }
    uint64_t limit;
    int g = nvml_dev(h, &limit);
    if (g < 0)
        return;
    ts_pools_resync(g);
    uint64_t t = limit < *total ? limit : *total;
    uint64_t u = ts_region_usage(&G.region, g, 1) + ts_driver_extra(g);
    *total = t;
    *used = u;
    *free_b = u >= t ? 0 : t - u;
}

TS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    ts_nvml_init();
    if (!REAL_NVML(nvmlDeviceGetMemoryInfo))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = REAL_NVML(nvmlDeviceGetMemoryInfo)(device, memory);
    if (r == NVML_SUCCESS && memory)
        nvml_view(device, &memory->total, &memory->free, &memory->used);
    return r;
}

TS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    ts_nvml_init();
    if (!REAL_NVML(nvmlDeviceGetMemoryInfo_v2))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = REAL_NVML(nvmlDeviceGetMemoryInfo_v2)(device, memory);
    if (r == NVML_SUCCESS && memory && ts_core_init() == ST_ACTIVE) {
        unsigned long long before = memory->used;
        nvml_view(device, &memory->total, &memory->free, &memory->used);
        if (memory->used != before)
            memory->reserved = 0; /* the limit view has no driver-reserved part */
    }
    return r;
}

void ts_query_forget(void) { g_nvml_n = 0; }
