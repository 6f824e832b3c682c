/*
 * tp_launch - launch loops on the fake GPU (device 0, primary context).
 *
 *   tp_launch util SECONDS GRID_US [KIND [STREAMS]]
 *       launch kernels of GRID_US simulated microseconds for SECONDS of wall clock, then
 *       synchronise; print "util=<percent busy> launches=N elapsed_ms=E".
 *       KIND: kernel (default) | ex | coop | graph | mixed (alternates GRID_US and GRID_US*5)
 *       STREAMS: 1 (default: the NULL stream) .. 8 created streams, launched round-robin.
 *   tp_launch evstamp SECONDS GRID_US
 *       every 20 ms bracket one kernel of GRID_US with two events on a created, otherwise idle
 *       stream; print "median_us=M samples=N" (the event-stamp question, fake_sched.h).
 *   tp_launch bench N
 *       N launches of zero-length kernels; print "ns_per_launch=X" (CPU cost of a launch).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tessera_cuda.h"

uint64_t fakecuda_busy_ns(int ordinal);

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static CUstream g_stream;

static CUresult launch(const char *kind, unsigned grid, unsigned long k)
{
    CUstream st = g_stream;
    CUfunction f = (CUfunction)(uintptr_t)0x1000;
    if (!strcmp(kind, "ex")) {
        CUlaunchConfig c;
        memset(&c, 0, sizeof(c));
        c.gridDimX = grid;
        c.gridDimY = c.gridDimZ = c.blockDimX = c.blockDimY = c.blockDimZ = 1;
        c.hStream = st;
        return cuLaunchKernelEx(&c, f, NULL, NULL);
    }
    if (!strcmp(kind, "coop"))
        return cuLaunchCooperativeKernel(f, grid, 1, 1, 1, 1, 1, 0, st, NULL);
    if (!strcmp(kind, "graph"))
        return cuGraphLaunch((CUgraphExec)(uintptr_t)grid, st);
    if (!strcmp(kind, "mixed")) {
        if (k % 2)
            return cuLaunchKernel((CUfunction)(uintptr_t)0x2000, grid * 5, 1, 1, 1, 1, 1, 0, st,
                                  NULL, NULL);
        return cuLaunchKernel(f, grid, 1, 1, 1, 1, 1, 0, st, NULL, NULL);
    }
    return cuLaunchKernel(f, grid, 1, 1, 1, 1, 1, 0, st, NULL, NULL);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: tp_launch util SECONDS GRID_US [KIND] | bench N\n");
        return 2;
    }
    CUcontext ctx;
    cuInit(0);
    if (cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return 1;
    if (!strcmp(argv[1], "bench")) {
        unsigned long n = strtoul(argv[2], NULL, 10);
        uint64_t t0 = now_ns();
        for (unsigned long k = 0; k < n; k++)
            if (cuLaunchKernel((CUfunction)(uintptr_t)0x1000, 0, 1, 1, 1, 1, 1, 0, NULL, NULL,
                               NULL) != CUDA_SUCCESS)
                return 1;
        printf("ns_per_launch=%.1f\n", (double)(now_ns() - t0) / (double)n);
        return 0;
    }
    if (!strcmp(argv[1], "evstamp") && argc == 4) {
        double secs = atof(argv[2]);
        unsigned grid = (unsigned)strtoul(argv[3], NULL, 10);
        CUstream st;
        CUevent a, b;
        if (cuStreamCreate(&st, 0) || cuEventCreate(&a, 0) || cuEventCreate(&b, 0))
            return 1;
        static double el[1024];
        int n = 0;
        uint64_t stop = now_ns() + (uint64_t)(secs * 1e9);
        while (now_ns() < stop && n < 1024) {
            float ms;
            if (cuEventRecord(a, st) ||
                cuLaunchKernel((CUfunction)(uintptr_t)0x3000, grid, 1, 1, 1, 1, 1, 0, st, NULL,
                               NULL) ||
                cuEventRecord(b, st) || cuEventSynchronize(b) || cuEventElapsedTime(&ms, a, b))
                return 1;
            el[n++] = ms * 1000.0;
            struct timespec ts = {0, 20000000};
            nanosleep(&ts, NULL);
        }
        for (int i = 1; i < n; i++) /* insertion sort: n is small */
            for (int j = i; j > 0 && el[j] < el[j - 1]; j--) {
                double t = el[j];
                el[j] = el[j - 1];
                el[j - 1] = t;
            }
        printf("median_us=%.1f samples=%d\n", n ? el[n / 2] : 0.0, n);
        return 0;
    }
    double secs = atof(argv[2]);
    unsigned grid = (unsigned)strtoul(argv[3], NULL, 10);
    const char *kind = argc > 4 ? argv[4] : "kernel";
    int nstreams = argc > 5 ? atoi(argv[5]) : 1;
    CUstream streams[8] = {NULL};
    if (nstreams < 1 || nstreams > 8)
        return 2;
    for (int i = 0; nstreams > 1 && i < nstreams; i++)
        if (cuStreamCreate(&streams[i], 0) != CUDA_SUCCESS)
            return 1;
    uint64_t t0 = now_ns(), stop = t0 + (uint64_t)(secs * 1e9);
    unsigned long k = 0;
    uint64_t b0 = fakecuda_busy_ns(0);
    while (now_ns() < stop) {
        g_stream = streams[k % (unsigned long)nstreams];
        if (launch(kind, grid, k++) != CUDA_SUCCESS)
            return 1;
    }
    cuCtxSynchronize();
    uint64_t el = now_ns() - t0;
    double util = 100.0 * (double)(fakecuda_busy_ns(0) - b0) / (double)el;
    printf("util=%.2f launches=%lu elapsed_ms=%.1f\n", util, k, (double)el / 1e6);
    return 0;
}
