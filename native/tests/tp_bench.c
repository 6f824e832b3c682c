/*
 * tp_bench - CPU cost of the hooked calls on the fake driver (bench/bench_enforce.py runs it
 * with and without the library and reports the difference).
 *
 *   tp_bench alloc N BYTES     N cuMemAlloc_v2 + cuMemFree_v2 pairs        -> ns_per_op=X
 *   tp_bench async N BYTES     N cuMemAllocAsync + cuMemFreeAsync pairs    -> ns_per_op=X
 *                              (the device's default pool, served from its reserve after the
 *                              first round: what a caching framework does)
 *   tp_bench vmm N BYTES       N cuMemCreate + cuMemMap + cuMemUnmap + cuMemRelease rounds
 *   tp_bench launch N          N zero-length cuLaunchKernel calls           -> ns_per_op=X
 *
 * Device 0's primary context is current. Each run is preceded by N/10 warm-up operations.
 * Prints wall time and process CPU time per operation (user + system: what the calls cost,
 * without the time the process waited for a CPU on a busy machine).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tessera_cuda.h"

static uint64_t clock_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static size_t g_bytes;
static CUdeviceptr g_va;

static int op_alloc(void)
{
    CUdeviceptr p;
    if (cuMemAlloc_v2(&p, g_bytes) != CUDA_SUCCESS)
        return -1;
    return cuMemFree_v2(p) == CUDA_SUCCESS ? 0 : -1;
}

static int op_async(void)
{
    CUdeviceptr p;
    if (cuMemAllocAsync(&p, g_bytes, NULL) != CUDA_SUCCESS)
        return -1;
    return cuMemFreeAsync(p, NULL) == CUDA_SUCCESS ? 0 : -1;
}

static int op_vmm(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h;
    if (cuMemCreate(&h, g_bytes, &prop, 0) != CUDA_SUCCESS)
        return -1;
    if (cuMemMap(g_va, g_bytes, 0, h, 0) != CUDA_SUCCESS)
        return -1;
    if (cuMemUnmap(g_va, g_bytes) != CUDA_SUCCESS)
        return -1;
    return cuMemRelease(h) == CUDA_SUCCESS ? 0 : -1;
}

static int op_launch(void)
{
    return cuLaunchKernel((CUfunction)(uintptr_t)0x1000, 0, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) ==
                   CUDA_SUCCESS
               ? 0
               : -1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: tp_bench alloc|async|vmm N BYTES | launch N\n");
        return 2;
    }
    unsigned long n = strtoul(argv[2], NULL, 10);
    g_bytes = argc > 3 ? strtoull(argv[3], NULL, 10) : 0;
    int (*op)(void) = NULL;
    if (!strcmp(argv[1], "alloc"))
        op = op_alloc;
    else if (!strcmp(argv[1], "async"))
        op = op_async;
    else if (!strcmp(argv[1], "vmm"))
        op = op_vmm;
    else if (!strcmp(argv[1], "launch"))
        op = op_launch;
    if (!op) {
        fprintf(stderr, "unknown benchmark %s\n", argv[1]);
        return 2;
    }
    CUcontext ctx;
    cuInit(0);
    if (cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return 1;
    if (op == op_vmm && cuMemAddressReserve(&g_va, g_bytes, 0, 0, 0) != CUDA_SUCCESS)
        return 1;
    for (unsigned long k = 0; k < n / 10 + 1; k++)
        if (op() != 0) {
            fprintf(stderr, "%s failed in warm-up\n", argv[1]);
            return 1;
        }
    uint64_t t0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
    for (unsigned long k = 0; k < n; k++)
        if (op() != 0) {
            fprintf(stderr, "%s failed\n", argv[1]);
            return 1;
        }
    uint64_t c1 = clock_ns(CLOCK_PROCESS_CPUTIME_ID), t1 = clock_ns(CLOCK_MONOTONIC);
    printf("ns_per_op=%.1f cpu_ns_per_op=%.1f\n", (double)(t1 - t0) / (double)n,
           (double)(c1 - c0) / (double)n);
    return 0;
}
