/*
 * tp_cuda MODE CMD... - drive the CUDA driver API (and NVML) step by step for the tests.
 *
 * MODE chooses how entry points are obtained, the three ways applications reach the driver:
 *   link      direct calls to the symbols (linked with -lcuda -lnvidia-ml)
 *   dlsym     dlopen("libcuda.so.1") + dlsym for every function
 *   procaddr  dlsym only cuGetProcAddress_v2, then everything through it (CUDA 12.4, as cudart)
 *
 * Commands (one output line each, "<cmd> <CUresult> [details]"):
 *   init | dev N | ctx N | destroyctx | release N
 *   alloc B | managed B | pitch W H E | async B | pool B | mkpool B | vmm B | array W H
 *   array3d W H D | mipmap W H L | free | freeall
 *   meminfo | totalmem N | uuid N | nvml I | nvml2 I
 *   calls NAME | used N | peak N | launch N GRID | rtldnext | ready | hold | sleep MS
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tessera_cuda.h"

uint64_t fakecuda_calls(const char *name);
uint64_t fakecuda_used(int ordinal);
uint64_t fakecuda_peak(int ordinal);

#define FNS(X)                       \
    X(cuInit)                        \
    X(cuDeviceGet)                   \
    X(cuDeviceGetUuid)               \
    X(cuDeviceTotalMem_v2)           \
    X(cuDevicePrimaryCtxRetain)      \
    X(cuDevicePrimaryCtxRelease_v2)  \
    X(cuCtxSetCurrent)               \
    X(cuCtxCreate_v2)                \
    X(cuCtxDestroy_v2)               \
    X(cuMemGetInfo_v2)               \
    X(cuMemAlloc_v2)                 \
    X(cuMemAllocManaged)             \
    X(cuMemAllocPitch_v2)            \
    X(cuMemFree_v2)                  \
    X(cuMemAllocAsync)               \
    X(cuMemAllocFromPoolAsync)       \
    X(cuMemFreeAsync)                \
    X(cuMemPoolCreate)               \
    X(cuDeviceGetDefaultMemPool)     \
    X(cuMemCreate)                   \
    X(cuMemRelease)                  \
    X(cuArrayCreate_v2)              \
    X(cuArray3DCreate_v2)            \
    X(cuArrayDestroy)                \
    X(cuMipmappedArrayCreate)        \
    X(cuMipmappedArrayDestroy)       \
    X(cuLaunchKernel)                \
    X(cuCtxSynchronize)

/* base names for cuGetProcAddress */
static const char *base_of(const char *n)
{
    static char b[64];
    snprintf(b, sizeof(b), "%s", n);
    char *v = strstr(b, "_v2");
    if (v && v[3] == '\0')
        *v = '\0';
    return b;
}

static struct {
#define X(f) __typeof__(&f) f;
    FNS(X)
#undef X
    __typeof__(&nvmlInit_v2) nvmlInit_v2;
    __typeof__(&nvmlDeviceGetHandleByIndex_v2) nvmlDeviceGetHandleByIndex_v2;
    __typeof__(&nvmlDeviceGetMemoryInfo) nvmlDeviceGetMemoryInfo;
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) nvmlDeviceGetMemoryInfo_v2;
} T;

static void load(const char *mode)
{
    if (strcmp(mode, "link") == 0) {
#define X(f) T.f = f;
        FNS(X)
#undef X
        T.nvmlInit_v2 = nvmlInit_v2;
        T.nvmlDeviceGetHandleByIndex_v2 = nvmlDeviceGetHandleByIndex_v2;
        T.nvmlDeviceGetMemoryInfo = nvmlDeviceGetMemoryInfo;
        T.nvmlDeviceGetMemoryInfo_v2 = nvmlDeviceGetMemoryInfo_v2;
        return;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    void *hn = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h || !hn) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(2);
    }
    *(void **)&T.nvmlInit_v2 = dlsym(hn, "nvmlInit_v2");
    *(void **)&T.nvmlDeviceGetHandleByIndex_v2 = dlsym(hn, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&T.nvmlDeviceGetMemoryInfo = dlsym(hn, "nvmlDeviceGetMemoryInfo");
    *(void **)&T.nvmlDeviceGetMemoryInfo_v2 = dlsym(hn, "nvmlDeviceGetMemoryInfo_v2");
    if (strcmp(mode, "dlsym") == 0) {
#define X(f) *(void **)&T.f = dlsym(h, #f);
        FNS(X)
#undef X
    } else if (strcmp(mode, "procaddr") == 0) {
        __typeof__(&cuGetProcAddress_v2) gpa;
        *(void **)&gpa = dlsym(h, "cuGetProcAddress_v2");
        CUdriverProcAddressQueryResult st;
#define X(f)                                                                         \
    if (gpa(base_of(#f), (void **)&T.f, 12040, CU_GET_PROC_ADDRESS_DEFAULT, &st) != 0) \
        fprintf(stderr, "cuGetProcAddress %s failed\n", #f);
        FNS(X)
#undef X
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        exit(2);
    }
}

typedef struct item {
    int kind; /* 1 dptr, 2 async, 3 vmm, 4 array, 5 mipmap */
    uint64_t h;
} item;
static item stack[4096];
static int sp;
static CUcontext g_ctx_created;
static CUmemoryPool g_pool;

static void push(int kind, uint64_t h) { stack[sp++] = (item){kind, h}; }

static CUresult pop_free(void)
{
    item it = stack[--sp];
    switch (it.kind) {
    case 1:
        return T.cuMemFree_v2(it.h);
    case 2:
        return T.cuMemFreeAsync(it.h, NULL);
    case 3:
        return T.cuMemRelease(it.h);
    case 4:
        return T.cuArrayDestroy((CUarray)(uintptr_t)it.h);
    default:
        return T.cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)it.h);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: tp_cuda link|dlsym|procaddr CMD...\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    load(argv[1]);
    for (int i = 2; i < argc; i++) {
        const char *c = argv[i];
#define ARG() (i + 1 < argc ? strtoull(argv[++i], NULL, 10) : (fprintf(stderr, "missing arg\n"), exit(2), 0ull))
        if (!strcmp(c, "init")) {
            printf("init %d\n", T.cuInit(0));
        } else if (!strcmp(c, "dev")) {
            int n = (int)ARG();
            CUcontext ctx;
            CUresult r = T.cuDevicePrimaryCtxRetain(&ctx, n);
            if (r == CUDA_SUCCESS)
                T.cuCtxSetCurrent(ctx);
            printf("dev %d %d\n", n, r);
        } else if (!strcmp(c, "release")) {
            int n = (int)ARG();
            printf("release %d %d\n", n, T.cuDevicePrimaryCtxRelease_v2(n));
        } else if (!strcmp(c, "ctx")) {
            int n = (int)ARG();
            printf("ctx %d %d\n", n, T.cuCtxCreate_v2(&g_ctx_created, 0, n));
        } else if (!strcmp(c, "destroyctx")) {
            printf("destroyctx %d\n", T.cuCtxDestroy_v2(g_ctx_created));
        } else if (!strcmp(c, "alloc") || !strcmp(c, "managed") || !strcmp(c, "async")) {
            size_t b = ARG();
            CUdeviceptr p = 0;
            CUresult r = !strcmp(c, "alloc")     ? T.cuMemAlloc_v2(&p, b)
                         : !strcmp(c, "managed") ? T.cuMemAllocManaged(&p, b, 1)
                                                 : T.cuMemAllocAsync(&p, b, NULL);
            if (r == CUDA_SUCCESS)
                push(!strcmp(c, "async") ? 2 : 1, p);
            printf("%s %zu %d\n", c, b, r);
        } else if (!strcmp(c, "pool") || !strcmp(c, "mkpool")) {
            size_t b = ARG();
            CUmemoryPool pool = NULL;
            if (!strcmp(c, "mkpool")) {
                if (!g_pool) {
                    CUmemPoolProps pp;
                    memset(&pp, 0, sizeof(pp));
                    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
                    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
                    pp.location.id = 0;
                    T.cuMemPoolCreate(&g_pool, &pp);
                }
                pool = g_pool;
            } else {
                T.cuDeviceGetDefaultMemPool(&pool, 0);
            }
            CUdeviceptr p = 0;
            CUresult r = T.cuMemAllocFromPoolAsync(&p, b, pool, NULL);
            if (r == CUDA_SUCCESS)
                push(2, p);
            printf("%s %zu %d\n", c, b, r);
        } else if (!strcmp(c, "pitch")) {
            size_t w = ARG(), h = ARG();
            unsigned e = (unsigned)ARG();
            CUdeviceptr p = 0;
            size_t pitch = 0;
            CUresult r = T.cuMemAllocPitch_v2(&p, &pitch, w, h, e);
            if (r == CUDA_SUCCESS)
                push(1, p);
            printf("pitch %d pitch=%zu\n", r, pitch);
        } else if (!strcmp(c, "vmm")) {
            size_t b = ARG();
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof(prop));
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = 0;
            CUmemGenericAllocationHandle hd = 0;
            CUresult r = T.cuMemCreate(&hd, b, &prop, 0);
            if (r == CUDA_SUCCESS)
                push(3, hd);
            printf("vmm %zu %d\n", b, r);
        } else if (!strcmp(c, "array")) {
            CUDA_ARRAY_DESCRIPTOR d = {ARG(), 0, CU_AD_FORMAT_FLOAT, 1};
            d.Height = ARG();
            CUarray a = NULL;
            CUresult r = T.cuArrayCreate_v2(&a, &d);
            if (r == CUDA_SUCCESS)
                push(4, (uintptr_t)a);
            printf("array %d\n", r);
        } else if (!strcmp(c, "array3d") || !strcmp(c, "mipmap")) {
            CUDA_ARRAY3D_DESCRIPTOR d;
            memset(&d, 0, sizeof(d));
            d.Width = ARG();
            d.Height = ARG();
            d.Format = CU_AD_FORMAT_FLOAT;
            d.NumChannels = 1;
            CUresult r;
            if (!strcmp(c, "array3d")) {
                d.Depth = ARG();
                CUarray a = NULL;
                r = T.cuArray3DCreate_v2(&a, &d);
                if (r == CUDA_SUCCESS)
                    push(4, (uintptr_t)a);
            } else {
                unsigned levels = (unsigned)ARG();
                CUmipmappedArray a = NULL;
                r = T.cuMipmappedArrayCreate(&a, &d, levels);
                if (r == CUDA_SUCCESS)
                    push(5, (uintptr_t)a);
            }
            printf("%s %d\n", c, r);
        } else if (!strcmp(c, "free")) {
            printf("free %d\n", sp ? (int)pop_free() : -1);
        } else if (!strcmp(c, "freeall")) {
            int bad = 0;
            while (sp)
                bad |= pop_free() != CUDA_SUCCESS;
            printf("freeall %d\n", bad);
        } else if (!strcmp(c, "meminfo")) {
            size_t f = 0, t = 0;
            CUresult r = T.cuMemGetInfo_v2(&f, &t);
            printf("meminfo %d free=%zu total=%zu\n", r, f, t);
        } else if (!strcmp(c, "totalmem")) {
            int n = (int)ARG();
            size_t b = 0;
            CUresult r = T.cuDeviceTotalMem_v2(&b, n);
            printf("totalmem %d %zu\n", r, b);
        } else if (!strcmp(c, "uuid")) {
            int n = (int)ARG();
            CUuuid u;
            CUresult r = T.cuDeviceGetUuid(&u, n);
            printf("uuid %d ", r);
            for (int k = 0; k < 16; k++)
                printf("%02x", (unsigned char)u.bytes[k]);
            printf("\n");
        } else if (!strcmp(c, "nvml") || !strcmp(c, "nvml2")) {
            unsigned idx = (unsigned)ARG();
            nvmlDevice_t d;
            T.nvmlInit_v2();
            nvmlReturn_t r = T.nvmlDeviceGetHandleByIndex_v2(idx, &d);
            if (r == NVML_SUCCESS && !strcmp(c, "nvml")) {
                nvmlMemory_t m;
                r = T.nvmlDeviceGetMemoryInfo(d, &m);
                printf("nvml %d total=%llu used=%llu free=%llu\n", r, m.total, m.used, m.free);
            } else if (r == NVML_SUCCESS) {
                nvmlMemory_v2_t m;
                memset(&m, 0, sizeof(m));
                m.version = nvmlMemory_v2;
                r = T.nvmlDeviceGetMemoryInfo_v2(d, &m);
                printf("nvml2 %d total=%llu used=%llu free=%llu reserved=%llu\n", r, m.total,
                       m.used, m.free, m.reserved);
            } else {
                printf("%s %d\n", c, r);
            }
        } else if (!strcmp(c, "calls")) {
            const char *n = argv[++i];
            printf("calls %s %llu\n", n, (unsigned long long)fakecuda_calls(n));
        } else if (!strcmp(c, "used")) {
            int n = (int)ARG();
            printf("used %d %llu\n", n, (unsigned long long)fakecuda_used(n));
        } else if (!strcmp(c, "peak")) {
            int n = (int)ARG();
            printf("peak %d %llu\n", n, (unsigned long long)fakecuda_peak(n));
        } else if (!strcmp(c, "launch")) {
            unsigned long n = ARG(), grid = ARG();
            CUresult r = CUDA_SUCCESS;
            for (unsigned long k = 0; k < n && r == CUDA_SUCCESS; k++)
                r = T.cuLaunchKernel((CUfunction)(uintptr_t)0x1000, (unsigned)grid, 1, 1, 1, 1, 1,
                                     0, NULL, NULL, NULL);
            printf("launch %d\n", r);
        } else if (!strcmp(c, "rtldnext")) {
            /* RTLD_NEXT from the executable must start after it: the preloaded library. */
            void *n = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
            void *d = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
            printf("rtldnext %s\n", n && n == d ? "same" : "different");
        } else if (!strcmp(c, "ready")) {
            printf("ready\n");
        } else if (!strcmp(c, "hold")) {
            printf("holding\n");
            fflush(stdout);
            for (;;)
                pause();
        } else if (!strcmp(c, "sleep")) {
            unsigned long ms = ARG();
            struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        } else {
            fprintf(stderr, "unknown command %s\n", c);
            return 2;
        }
    }
    return 0;
}
