/*
 * gpu_check - the CUDA side of the GPU check (native/gpu-check/run.sh). Not built by the
 * tests: it needs a real NVIDIA driver. Kernels are PTX, JIT-compiled by the driver, so no
 * nvcc is needed. Built with gcc (entry points through dlopen/dlsym of libcuda.so.1) or, with
 * -DGC_DIRECT_LINK, linked against libcuda directly (nvcc builds).
 *
 *   gpu_check info                        device name, UUID, SMs, total memory
 *   gpu_check oom CHUNK_MIB HOLD_S        allocate CHUNK_MIB chunks until refused, touch them,
 *                                         then keep launching kernels for HOLD_S seconds
 *   gpu_check calib US                    iterations of the work kernel that take US microseconds
 *   gpu_check work SECONDS ITERS [STREAMS] launch the work kernel back to back for SECONDS
 *                                         (round-robin over STREAMS created streams, default:
 *                                         the NULL stream)
 *   gpu_check evstamp SECONDS ITERS       every 20 ms, bracket one work kernel with two events
 *                                         on a created stream that is otherwise idle; print the
 *                                         elapsed times' min/median/max (µs): the event-stamp
 *                                         question of docs/enforcement.md section 5
 *   gpu_check launches N                  N empty-kernel launches + sync; ns per launch
 *   gpu_check allocs N MIB                N alloc/free pairs of MIB; ns per pair
 *   gpu_check idle SECONDS                context + module + 256 bytes, then sleep (context size)
 *   gpu_check hold MIB SECONDS            allocate and touch MIB, then launch kernels SECONDS
 * Every mode prints key=value lines.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tessera_cuda.h"

typedef struct CUmod_st *CUmodule;

#define API(X)                     \
    X(cuInit)                      \
    X(cuDeviceGet)                 \
    X(cuDeviceGetName)             \
    X(cuDeviceGetAttribute)        \
    X(cuDeviceGetUuid)             \
    X(cuDevicePrimaryCtxRetain)    \
    X(cuCtxSetCurrent)             \
    X(cuCtxSynchronize)            \
    X(cuMemGetInfo_v2)             \
    X(cuMemAlloc_v2)               \
    X(cuMemFree_v2)                \
    X(cuMemsetD8_v2)               \
    X(cuModuleLoadData)            \
    X(cuModuleGetFunction)         \
    X(cuLaunchKernel)              \
    X(cuStreamCreate)              \
    X(cuEventCreate)               \
    X(cuEventRecord)               \
    X(cuEventSynchronize)          \
    X(cuEventElapsedTime)

CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);

static struct {
#define X(f) __typeof__(&f) f;
    API(X)
#undef X
} T;

static const char PTX[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry empty()\n{\n ret;\n}\n"
    ".visible .entry work(.param .u64 iters, .param .u64 out)\n{\n"
    " .reg .u64 %i, %n, %o;\n .reg .pred %p;\n .reg .f32 %x;\n"
    " ld.param.u64 %n, [iters];\n ld.param.u64 %o, [out];\n"
    " mov.u64 %i, 0;\n mov.f32 %x, 0f3F800000;\n"
    "LOOP:\n fma.rn.f32 %x, %x, 0f3F7FFFFF, 0f3A83126F;\n add.u64 %i, %i, 1;\n"
    " setp.lt.u64 %p, %i, %n;\n @%p bra LOOP;\n"
    " st.global.f32 [%o], %x;\n ret;\n}\n";

static CUfunction k_empty, k_work;
static CUdeviceptr out_buf;
static int n_sm;

#define CK(call)                                                                     \
    do {                                                                             \
        CUresult r_ = (call);                                                        \
        if (r_ != CUDA_SUCCESS) {                                                    \
            printf("error=%s result=%d line=%d\n", #call, r_, __LINE__);             \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void load(void)
{
#ifdef GC_DIRECT_LINK
#define X(f) T.f = f;
    API(X)
#undef X
#else
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("error=dlopen %s\n", dlerror());
        exit(1);
    }
#define X(f)                                                          \
    if (!(*(void **)&T.f = dlsym(h, #f)) &&                           \
        !(*(void **)&T.f = dlsym(h, #f "_v2"))) {                     \
        printf("error=missing %s\n", #f);                             \
        exit(1);                                                      \
    }
    API(X)
#undef X
#endif
}

static void setup(void)
{
    CUdevice d;
    CUcontext ctx;
    CUmodule m;
    CK(T.cuInit(0));
    CK(T.cuDeviceGet(&d, 0));
    CK(T.cuDevicePrimaryCtxRetain(&ctx, d));
    CK(T.cuCtxSetCurrent(ctx));
    CK(T.cuDeviceGetAttribute(&n_sm, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d));
    CK(T.cuModuleLoadData(&m, PTX));
    CK(T.cuModuleGetFunction(&k_empty, m, "empty"));
    CK(T.cuModuleGetFunction(&k_work, m, "work"));
    CK(T.cuMemAlloc_v2(&out_buf, 256));
}

static CUresult work_on(unsigned long long iters, CUstream s)
{
    void *args[] = {&iters, &out_buf};
    return T.cuLaunchKernel(k_work, (unsigned)n_sm, 1, 1, 128, 1, 1, 0, s, args, NULL);
}

static CUresult work(unsigned long long iters) { return work_on(iters, NULL); }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double time_work(unsigned long long iters)
{
    CUevent a, b;
    float ms;
    CK(T.cuEventCreate(&a, 0));
    CK(T.cuEventCreate(&b, 0));
    CK(T.cuEventRecord(a, NULL));
    CK(work(iters));
    CK(T.cuEventRecord(b, NULL));
    CK(T.cuEventSynchronize(b));
    CK(T.cuEventElapsedTime(&ms, a, b));
    return ms * 1000.0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    load();
    setup();
    const char *mode = argv[1];
    if (!strcmp(mode, "info")) {
        char name[128];
        CUuuid u;
        size_t fr, tot;
        CK(T.cuDeviceGetName(name, sizeof(name), 0));
        CK(T.cuDeviceGetUuid(&u, 0));
        CK(T.cuMemGetInfo_v2(&fr, &tot));
        printf("name=%s\nsms=%d\ntotal=%zu\nfree=%zu\nuuid=GPU-", name, n_sm, tot, fr);
        for (int i = 0; i < 16; i++)
            printf("%02x%s", (unsigned char)u.bytes[i], (i == 3 || i == 5 || i == 7 || i == 9) ? "-" : "");
        printf("\n");
    } else if (!strcmp(mode, "oom") && argc == 4) {
        size_t chunk = strtoull(argv[2], NULL, 10) << 20;
        double hold = atof(argv[3]);
        size_t got = 0, fr, tot;
        CUdeviceptr p;
        CUresult r;
        while ((r = T.cuMemAlloc_v2(&p, chunk)) == CUDA_SUCCESS) {
            CK(T.cuMemsetD8_v2(p, 0xab, chunk));
            got += chunk;
        }
        CK(T.cuMemGetInfo_v2(&fr, &tot));
        printf("allocated=%zu\nrefused_with=%d\nmeminfo_free=%zu\nmeminfo_total=%zu\n", got, r, fr,
               tot);
        double end = now_s() + hold;
        unsigned long n = 0;
        while (now_s() < end) {
            CK(work(1000));
            CK(T.cuCtxSynchronize());
            n++;
        }
        printf("kernels_after_oom=%lu\n", n);
    } else if (!strcmp(mode, "calib") && argc == 3) {
        double us = atof(argv[2]);
        unsigned long long it = 10000;
        time_work(it); /* warm up */
        for (int k = 0; k < 6; k++) {
            double t = time_work(it);
            it = (unsigned long long)((double)it * us / (t > 1 ? t : 1));
        }
        printf("iters=%llu\nkernel_us=%.1f\n", it, time_work(it));
    } else if (!strcmp(mode, "work") && (argc == 4 || argc == 5)) {
        double secs = atof(argv[2]);
        unsigned long long it = strtoull(argv[3], NULL, 10);
        int ns = argc == 5 ? atoi(argv[4]) : 0;
        CUstream st[8] = {NULL};
        if (ns < 0 || ns > 8)
            return 2;
        for (int i = 0; i < ns; i++)
            CK(T.cuStreamCreate(&st[i], 0));
        double t0 = now_s(), end = t0 + secs;
        unsigned long n = 0;
        while (now_s() < end) {
            CK(work_on(it, ns ? st[n % (unsigned long)ns] : NULL));
            n++;
        }
        CK(T.cuCtxSynchronize());
        printf("kernels=%lu\nwall_s=%.3f\n", n, now_s() - t0);
    } else if (!strcmp(mode, "evstamp") && argc == 4) {
        double secs = atof(argv[2]);
        unsigned long long it = strtoull(argv[3], NULL, 10);
        CUstream st;
        CUevent a, b;
        CK(T.cuStreamCreate(&st, 0));
        CK(T.cuEventCreate(&a, 0));
        CK(T.cuEventCreate(&b, 0));
        static double el[4096];
        int n = 0;
        double end = now_s() + secs;
        while (now_s() < end && n < 4096) {
            float ms;
            CK(T.cuEventRecord(a, st));
            CK(work_on(it, st));
            CK(T.cuEventRecord(b, st));
            CK(T.cuEventSynchronize(b));
            CK(T.cuEventElapsedTime(&ms, a, b));
            el[n++] = ms * 1000.0;
            struct timespec ts = {0, 20000000};
            nanosleep(&ts, NULL);
        }
        qsort(el, (size_t)n, sizeof(el[0]), cmp_double);
        printf("samples=%d\nmin_us=%.1f\nmedian_us=%.1f\np90_us=%.1f\nmax_us=%.1f\n", n, el[0],
               el[n / 2], el[n * 9 / 10], el[n - 1]);
    } else if (!strcmp(mode, "launches") && argc == 3) {
        unsigned long n = strtoul(argv[2], NULL, 10);
        for (int k = 0; k < 1000; k++)
            CK(T.cuLaunchKernel(k_empty, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CK(T.cuCtxSynchronize());
        double t0 = now_s();
        for (unsigned long k = 0; k < n; k++)
            CK(T.cuLaunchKernel(k_empty, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CK(T.cuCtxSynchronize());
        printf("ns_per_launch=%.1f\n", (now_s() - t0) * 1e9 / (double)n);
    } else if (!strcmp(mode, "allocs") && argc == 4) {
        unsigned long n = strtoul(argv[2], NULL, 10);
        size_t b = strtoull(argv[3], NULL, 10) << 20;
        CUdeviceptr p;
        double t0 = now_s();
        for (unsigned long k = 0; k < n; k++) {
            CK(T.cuMemAlloc_v2(&p, b));
            CK(T.cuMemFree_v2(p));
        }
        printf("ns_per_alloc_free=%.1f\n", (now_s() - t0) * 1e9 / (double)n);
    } else if (!strcmp(mode, "idle") && argc == 3) {
        printf("ready=1\n");
        struct timespec ts = {(time_t)atoi(argv[2]), 0};
        nanosleep(&ts, NULL);
    } else if (!strcmp(mode, "hold") && argc == 4) {
        size_t b = strtoull(argv[2], NULL, 10) << 20;
        CUdeviceptr p;
        CK(T.cuMemAlloc_v2(&p, b));
        CK(T.cuMemsetD8_v2(p, 0xcd, b));
        printf("ready=1\n");
        double end = now_s() + atof(argv[3]);
        unsigned long n = 0;
        while (now_s() < end) {
            CK(work(1000));
            CK(T.cuCtxSynchronize());
            n++;
        }
        printf("kernels=%lu\n", n);
    } else {
        return 2;
    }
    return 0;
}
