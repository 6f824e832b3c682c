/*
 * tp_threads THREADS ITERS BYTES HOLD_US - concurrent allocation from many threads.
 * Every thread makes device 0's primary context current, then ITERS times allocates BYTES,
 * holds the allocation HOLD_US microseconds and frees it. Prints "ok=N oom=M other=K".
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tessera_cuda.h"

static unsigned long iters, bytes, hold_us;
static unsigned long n_ok, n_oom, n_other;

static void *worker(void *arg)
{
    (void)arg;
    CUcontext ctx;
    if (cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        __atomic_add_fetch(&n_other, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    for (unsigned long i = 0; i < iters; i++) {
        CUdeviceptr p;
        CUresult r = cuMemAlloc_v2(&p, bytes);
        if (r == CUDA_SUCCESS) {
            __atomic_add_fetch(&n_ok, 1, __ATOMIC_RELAXED);
            if (hold_us) {
                struct timespec ts = {0, (long)hold_us * 1000L};
                nanosleep(&ts, NULL);
            }
            if (cuMemFree_v2(p) != CUDA_SUCCESS)
                __atomic_add_fetch(&n_other, 1, __ATOMIC_RELAXED);
        } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            __atomic_add_fetch(&n_oom, 1, __ATOMIC_RELAXED);
        } else {
            __atomic_add_fetch(&n_other, 1, __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: tp_threads THREADS ITERS BYTES HOLD_US\n");
        return 2;
    }
    int nt = atoi(argv[1]);
    iters = strtoul(argv[2], NULL, 10);
    bytes = strtoul(argv[3], NULL, 10);
    hold_us = strtoul(argv[4], NULL, 10);
    cuInit(0);
    pthread_t th[64];
    for (int i = 0; i < nt && i < 64; i++)
        pthread_create(&th[i], NULL, worker, NULL);
    for (int i = 0; i < nt && i < 64; i++)
        pthread_join(th[i], NULL);
    printf("ok=%lu oom=%lu other=%lu\n", n_ok, n_oom, n_other);
    return 0;
}
