/*
 * tp_cuda MODE CMD... - drive the CUDA driver API (and NVML) step by step for the tests.
 *
 * MODE chooses how entry points are obtained, the three ways applications reach the driver:
 *   link      direct calls to the symbols (linked with -lcuda -lnvidia-ml)
 *   dlsym     dlopen("libcuda.so.1") + dlsym for every function
 *   procaddr  dlsym only cuGetProcAddress_v2, then everything through it (as cudart does)
 *
 * Every command prints one line, "<cmd> <CUresult> [details]". Objects made by commands are
 * numbered from 0 in order of creation, per kind: handles (h), mappings (m), exported file
 * descriptors (f), pools (p), graphs (g), graph execs (e).
 *
 *   init | dev N | ctx N | destroyctx | release N | reset N
 *   alloc B | managed B | pitch W H E | async B | pool B | mkpool B | vmm B | array W H
 *   array3d W H D | mipmap W H L | free | freeall
 *   meminfo | totalmem N | uuid N | nvml I | nvml2 I | nvmlproc I | calls NAME | used N | peak N
 *   launch N GRID | ready | hold | wait | sleep MS | sync | ssync | afree
 *   (free, afree, pfree, freeall: a failed free leaves the allocation on the stack; freeall stops
 *   at the first failure. wait: prints "waiting" and blocks until a line on stdin)
 *   VMM:   reserve B | create B dev|host|domain|invisible | map H | unmap M | unmaprange M0 M1
 *          vrelease H | retain M | export H | import F B | importpath PATH B | closefd F
 *          mc B | mcbind HM HP
 *          mcbindaddr HM M | mcunbind HM | sparse H | lebind H
 *   pools: poolcreate dev|host|domain|numa|managed | rawpool | palloc P B | getpool dev|host|managed
 *          curpool | setpool P | thresh P V | trim P V | pdestroy P | reserved P | pfree
 *   graphs: gcreate | galloc G B | gfree G | ginst G FLAGS | glaunch E | gupload E
 *          gdestroy E | gtrim | gfreeptr G | capture B | gmem
 *   contexts: setlimit stack|heap|fifo|pending|l2 V | green N | greendestroy | attach | detach
 *          glctx N | restore
 *   resolution: v1alloc B | procalloc VER B | procmatch NAME BASE VER PTSZ | nextalloc B
 *          marker | deepbind B | dlmopen | rtldnext | unlockslot
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "tessera_cuda.h"

/* The fake's older driver (fake-old) lacks these: weak, so that tp_cuda still loads there. */
#pragma weak cuMemPoolGetAttribute
#pragma weak cuDeviceGetMemPool

uint64_t fakecuda_calls(const char *name);
uint64_t fakecuda_used(int ordinal);
uint64_t fakecuda_peak(int ordinal);
CUresult fakecuda_pool_create(CUmemoryPool *pool, const CUmemPoolProps *props);
void *tp_next(const char *name); /* libtpnext.so */

/* X(function, base name for cuGetProcAddress, version to ask for) */
#define FNS(X)                                                          \
    X(cuInit, "cuInit", 2000)                                           \
    X(cuDeviceGet, "cuDeviceGet", 2000)                                 \
    X(cuDeviceGetUuid, "cuDeviceGetUuid", 9020)                         \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020)                    \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000)       \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000) \
    X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000)     \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000)                         \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020)                              \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 4000)                            \
    X(cuCtxSetLimit, "cuCtxSetLimit", 3010)                             \
    X(cuCtxAttach, "cuCtxAttach", 2000)                                 \
    X(cuCtxDetach, "cuCtxDetach", 2000)                                 \
    X(cuGreenCtxCreate, "cuGreenCtxCreate", 12040)                      \
    X(cuGreenCtxDestroy, "cuGreenCtxDestroy", 12040)                    \
    X(cuCtxFromGreenCtx, "cuCtxFromGreenCtx", 12040)                    \
    X(cuGLCtxCreate_v2, "cuGLCtxCreate", 3020)                          \
    X(cuCheckpointProcessRestore, "cuCheckpointProcessRestore", 12080)  \
    X(cuCtxSynchronize, "cuCtxSynchronize", 2000)                       \
    X(cuStreamCreate, "cuStreamCreate", 2000)                           \
    X(cuStreamSynchronize, "cuStreamSynchronize", 2000)                 \
    X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010)           \
    X(cuStreamEndCapture, "cuStreamEndCapture", 10000)                  \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020)                            \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020)                                \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000)                     \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020)                      \
    X(cuMemFree_v2, "cuMemFree", 3020)                                  \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020)                        \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020)        \
    X(cuMemFreeAsync, "cuMemFreeAsync", 11020)                          \
    X(cuMemPoolCreate, "cuMemPoolCreate", 11020)                        \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", 11020)                      \
    X(cuMemPoolTrimTo, "cuMemPoolTrimTo", 11020)                        \
    X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", 11020)            \
    X(cuMemPoolGetAttribute, "cuMemPoolGetAttribute", 11020)            \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020)    \
    X(cuDeviceGetMemPool, "cuDeviceGetMemPool", 11020)                  \
    X(cuDeviceSetMemPool, "cuDeviceSetMemPool", 11020)                  \
    X(cuMemGetDefaultMemPool, "cuMemGetDefaultMemPool", 13000)          \
    X(cuMemGetMemPool, "cuMemGetMemPool", 13000)                        \
    X(cuMemAddressReserve, "cuMemAddressReserve", 10020)                \
    X(cuMemCreate, "cuMemCreate", 10020)                                \
    X(cuMemRelease, "cuMemRelease", 10020)                              \
    X(cuMemMap, "cuMemMap", 10020)                                      \
    X(cuMemUnmap, "cuMemUnmap", 10020)                                  \
    X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 11000) \
    X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020) \
    X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020) \
    X(cuMemMapArrayAsync, "cuMemMapArrayAsync", 11010)                  \
    X(cuMulticastCreate, "cuMulticastCreate", 12010)                    \
    X(cuMulticastBindMem, "cuMulticastBindMem", 12010)                  \
    X(cuMulticastBindAddr, "cuMulticastBindAddr", 12010)                \
    X(cuMulticastUnbind, "cuMulticastUnbind", 12010)                    \
    X(cuLogicalEndpointBindMem, "cuLogicalEndpointBindMem", 13030)      \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020)                          \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020)                      \
    X(cuArrayDestroy, "cuArrayDestroy", 2000)                           \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000)           \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000)         \
    X(cuGraphCreate, "cuGraphCreate", 10000)                            \
    X(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", 11040)          \
    X(cuGraphAddMemFreeNode, "cuGraphAddMemFreeNode", 11040)            \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 11040) \
    X(cuGraphLaunch, "cuGraphLaunch", 10000)                            \
    X(cuGraphUpload, "cuGraphUpload", 11010)                            \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", 10000)                  \
    X(cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim", 11040)              \
    X(cuDeviceGetGraphMemAttribute, "cuDeviceGetGraphMemAttribute", 11040) \
    X(cuLaunchKernel, "cuLaunchKernel", 4000)

static struct {
#define X(f, b, v) __typeof__(&f) f;
    FNS(X)
#undef X
    __typeof__(&nvmlInit_v2) nvmlInit_v2;
    __typeof__(&nvmlDeviceGetHandleByIndex_v2) nvmlDeviceGetHandleByIndex_v2;
    __typeof__(&nvmlDeviceGetMemoryInfo) nvmlDeviceGetMemoryInfo;
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) nvmlDeviceGetMemoryInfo_v2;
} T;

static __typeof__(&cuGetProcAddress_v2) g_gpa;
static void *g_libcuda;

static void load(const char *mode)
{
    if (strcmp(mode, "link") == 0) {
#define X(f, b, v) T.f = f;
        FNS(X)
#undef X
        T.nvmlInit_v2 = nvmlInit_v2;
        T.nvmlDeviceGetHandleByIndex_v2 = nvmlDeviceGetHandleByIndex_v2;
        T.nvmlDeviceGetMemoryInfo = nvmlDeviceGetMemoryInfo;
        T.nvmlDeviceGetMemoryInfo_v2 = nvmlDeviceGetMemoryInfo_v2;
        g_gpa = cuGetProcAddress_v2;
        return;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    void *hn = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h || !hn) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(2);
    }
    g_libcuda = h;
    *(void **)&T.nvmlInit_v2 = dlsym(hn, "nvmlInit_v2");
    *(void **)&T.nvmlDeviceGetHandleByIndex_v2 = dlsym(hn, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&T.nvmlDeviceGetMemoryInfo = dlsym(hn, "nvmlDeviceGetMemoryInfo");
    *(void **)&T.nvmlDeviceGetMemoryInfo_v2 = dlsym(hn, "nvmlDeviceGetMemoryInfo_v2");
    *(void **)&g_gpa = dlsym(h, "cuGetProcAddress_v2");
    if (strcmp(mode, "dlsym") == 0) {
#define X(f, b, v) *(void **)&T.f = dlsym(h, #f);
        FNS(X)
#undef X
    } else if (strcmp(mode, "procaddr") == 0) {
        CUdriverProcAddressQueryResult st;
#define X(f, b, v)                                                            \
    if (g_gpa(b, (void **)&T.f, v, CU_GET_PROC_ADDRESS_DEFAULT, &st) != 0) \
        fprintf(stderr, "cuGetProcAddress %s failed\n", b);
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

#define MAXOBJ 256
static CUmemGenericAllocationHandle H[MAXOBJ];
static size_t Hsize[MAXOBJ];
static int nH;
static struct {
    CUdeviceptr va;
    size_t size;
} M[MAXOBJ];
static int nM;
static int F[MAXOBJ], nF;
static CUmemoryPool P[MAXOBJ];
static int nP;
static CUgraph Gr[MAXOBJ];
static CUdeviceptr Glast[MAXOBJ];
static int nG;
static CUgraphExec E[MAXOBJ];
static int nE;
static CUdeviceptr g_va, g_va_end;
static CUgreenCtx g_green;

static void push(int kind, uint64_t h) { stack[sp++] = (item){kind, h}; }

/* Free the newest allocation; it stays on the stack if the free fails. */
static CUresult pop_free(void)
{
    item it = stack[sp - 1];
    CUresult r;
    switch (it.kind) {
    case 1:
        r = T.cuMemFree_v2(it.h);
        break;
    case 2:
        r = T.cuMemFreeAsync(it.h, NULL);
        break;
    case 3:
        r = T.cuMemRelease(it.h);
        break;
    case 4:
        r = T.cuArrayDestroy((CUarray)(uintptr_t)it.h);
        break;
    default:
        r = T.cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)it.h);
        break;
    }
    if (r == CUDA_SUCCESS)
        sp--;
    return r;
}

static void location(const char *what, CUmemLocation *l)
{
    memset(l, 0, sizeof(*l));
    if (!strcmp(what, "host")) {
        l->type = CU_MEM_LOCATION_TYPE_HOST;
    } else if (!strcmp(what, "numa")) {
        l->type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    } else if (!strcmp(what, "domain")) {
        l->type = CU_MEM_LOCATION_TYPE_DEVICE_LOCALITY_DOMAIN;
        l->localized.deviceId = 0;
        l->localized.localityDomainId = 1;
    } else if (!strcmp(what, "invisible")) {
        l->type = CU_MEM_LOCATION_TYPE_INVISIBLE;
    } else if (!strcmp(what, "none")) {
        l->type = CU_MEM_LOCATION_TYPE_NONE;
    } else if (!strcmp(what, "dev1")) {
        l->type = CU_MEM_LOCATION_TYPE_DEVICE;
        l->id = 1;
    } else {
        l->type = CU_MEM_LOCATION_TYPE_DEVICE;
        l->id = 0;
    }
}

static CUlimit limit_named(const char *n)
{
    if (!strcmp(n, "stack"))
        return CU_LIMIT_STACK_SIZE;
    if (!strcmp(n, "heap"))
        return CU_LIMIT_MALLOC_HEAP_SIZE;
    if (!strcmp(n, "fifo"))
        return CU_LIMIT_PRINTF_FIFO_SIZE;
    if (!strcmp(n, "pending"))
        return CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT;
    if (!strcmp(n, "l2"))
        return CU_LIMIT_PERSISTING_L2_CACHE_SIZE;
    return (CUlimit)atoi(n);
}

/* Address of a symbol defined in this executable (exported with -rdynamic): a lookup with
 * RTLD_NEXT from here must start after the executable. */
__attribute__((visibility("default"))) int tp_marker;

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
#define SARG() (i + 1 < argc ? argv[++i] : (fprintf(stderr, "missing arg\n"), exit(2), ""))
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
        } else if (!strcmp(c, "reset")) {
            int n = (int)ARG();
            CUresult r = T.cuDevicePrimaryCtxReset_v2(n);
            sp = 0; /* the driver freed all of it */
            printf("reset %d %d\n", n, r);
        } else if (!strcmp(c, "ctx")) {
            int n = (int)ARG();
            printf("ctx %d %d\n", n, T.cuCtxCreate_v2(&g_ctx_created, 0, n));
        } else if (!strcmp(c, "destroyctx")) {
            CUresult r = T.cuCtxDestroy_v2(g_ctx_created);
            if (r == CUDA_SUCCESS)
                sp = 0;
            printf("destroyctx %d\n", r);
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
                static CUmemoryPool made;
                if (!made) {
                    CUmemPoolProps pp;
                    memset(&pp, 0, sizeof(pp));
                    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
                    pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
                    pp.location.id = 0;
                    T.cuMemPoolCreate(&made, &pp);
                }
                pool = made;
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
        } else if (!strcmp(c, "afree")) { /* the newest allocation, with cuMemFreeAsync */
            CUresult r = sp ? T.cuMemFreeAsync(stack[sp - 1].h, NULL) : (CUresult)-1;
            if (r == CUDA_SUCCESS)
                sp--;
            printf("afree %d\n", (int)r);
        } else if (!strcmp(c, "freeall")) {
            CUresult r = CUDA_SUCCESS;
            while (sp && r == CUDA_SUCCESS)
                r = pop_free();
            printf("freeall %d\n", r != CUDA_SUCCESS);
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
        } else if (!strcmp(c, "nvmlproc")) {
            /* the driver's own figure of this process on NVML device I (per-process used
             * memory, nvmlDeviceGetComputeRunningProcesses_v3) */
            unsigned idx = (unsigned)ARG();
            struct {
                unsigned int pid;
                unsigned long long used;
                unsigned int gi, ci;
            } info[64];
            nvmlReturn_t (*fn)(nvmlDevice_t, unsigned int *, void *);
            *(void **)&fn = dlsym(RTLD_DEFAULT, "nvmlDeviceGetComputeRunningProcesses_v3");
            nvmlDevice_t d;
            T.nvmlInit_v2();
            unsigned int n = 64;
            nvmlReturn_t r = T.nvmlDeviceGetHandleByIndex_v2(idx, &d);
            if (r == NVML_SUCCESS)
                r = fn ? fn(d, &n, info) : NVML_ERROR_FUNCTION_NOT_FOUND;
            unsigned long long mine = 0;
            for (unsigned k = 0; r == NVML_SUCCESS && k < n; k++)
                if (info[k].pid == (unsigned)getpid())
                    mine = info[k].used;
            printf("nvmlproc %d used=%llu\n", r, mine);
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
        } else if (!strcmp(c, "sync")) {
            printf("sync %d\n", T.cuCtxSynchronize());
        } else if (!strcmp(c, "ssync")) {
            printf("ssync %d\n", T.cuStreamSynchronize(NULL));
        /* ---- VMM ---- */
        } else if (!strcmp(c, "reserve")) {
            size_t b = ARG();
            CUresult r = T.cuMemAddressReserve(&g_va, b, 0, 0, 0);
            g_va_end = g_va + b;
            printf("reserve %d\n", r);
        } else if (!strcmp(c, "create")) {
            size_t b = ARG();
            const char *where = SARG();
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof(prop));
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            location(where, &prop.location);
            CUresult r = T.cuMemCreate(&H[nH], b, &prop, 0);
            Hsize[nH] = b;
            printf("create %d h%d\n", r, r == CUDA_SUCCESS ? nH++ : -1);
        } else if (!strcmp(c, "map")) {
            int h = (int)ARG();
            size_t b = Hsize[h];
            CUresult r = g_va + b <= g_va_end ? T.cuMemMap(g_va, b, 0, H[h], 0) : CUDA_ERROR_INVALID_VALUE;
            if (r == CUDA_SUCCESS) {
                M[nM].va = g_va;
                M[nM].size = b;
                g_va += b;
            }
            printf("map %d m%d\n", r, r == CUDA_SUCCESS ? nM++ : -1);
        } else if (!strcmp(c, "unmap")) {
            int m = (int)ARG();
            printf("unmap %d\n", T.cuMemUnmap(M[m].va, M[m].size));
        } else if (!strcmp(c, "unmaprange")) {
            int a = (int)ARG(), b = (int)ARG();
            printf("unmaprange %d\n", T.cuMemUnmap(M[a].va, M[b].va + M[b].size - M[a].va));
        } else if (!strcmp(c, "vrelease")) {
            int h = (int)ARG();
            printf("vrelease %d\n", T.cuMemRelease(H[h]));
        } else if (!strcmp(c, "retain")) {
            int m = (int)ARG();
            CUresult r = T.cuMemRetainAllocationHandle(&H[nH], (void *)(uintptr_t)M[m].va);
            Hsize[nH] = M[m].size;
            printf("retain %d h%d\n", r, r == CUDA_SUCCESS ? nH++ : -1);
        } else if (!strcmp(c, "export")) {
            int h = (int)ARG();
            CUresult r = T.cuMemExportToShareableHandle(&F[nF], H[h],
                                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            printf("export %d f%d\n", r, r == CUDA_SUCCESS ? nF++ : -1);
        } else if (!strcmp(c, "import")) {
            int f = (int)ARG();
            size_t b = ARG();
            CUresult r = T.cuMemImportFromShareableHandle(&H[nH], (void *)(intptr_t)F[f],
                                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
            Hsize[nH] = b;
            printf("import %d h%d\n", r, r == CUDA_SUCCESS ? nH++ : -1);
        } else if (!strcmp(c, "importpath")) { /* a descriptor another process exported */
            const char *path = SARG();
            size_t b = ARG();
            F[nF] = open(path, O_RDWR | O_CLOEXEC);
            CUresult r = T.cuMemImportFromShareableHandle(&H[nH], (void *)(intptr_t)F[nF++],
                                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
            Hsize[nH] = b;
            printf("importpath %d h%d\n", r, r == CUDA_SUCCESS ? nH++ : -1);
        } else if (!strcmp(c, "closefd")) {
            int f = (int)ARG();
            printf("closefd %d\n", close(F[f]));
        } else if (!strcmp(c, "mc")) {
            size_t b = ARG();
            CUmulticastObjectProp prop = {1, b, 0, 0};
            CUresult r = T.cuMulticastCreate(&H[nH], &prop);
            Hsize[nH] = b;
            printf("mc %d h%d\n", r, r == CUDA_SUCCESS ? nH++ : -1);
        } else if (!strcmp(c, "mcbind")) {
            int m = (int)ARG(), p = (int)ARG();
            printf("mcbind %d\n", T.cuMulticastBindMem(H[m], 0, H[p], 0, Hsize[p], 0));
        } else if (!strcmp(c, "mcbindaddr")) {
            int m = (int)ARG(), mp = (int)ARG();
            printf("mcbindaddr %d\n", T.cuMulticastBindAddr(H[m], 0, M[mp].va, M[mp].size, 0));
        } else if (!strcmp(c, "mcunbind")) {
            int m = (int)ARG();
            printf("mcunbind %d\n", T.cuMulticastUnbind(H[m], 0, 0, Hsize[m]));
        } else if (!strcmp(c, "sparse")) {
            int h = (int)ARG();
            CUarrayMapInfo mi;
            memset(&mi, 0, sizeof(mi));
            mi.resource.array = (CUarray)(uintptr_t)0x5000;
            mi.memOperationType = CU_MEM_OPERATION_TYPE_MAP;
            mi.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
            mi.memHandle.memHandle = H[h];
            printf("sparse %d\n", T.cuMemMapArrayAsync(&mi, 1, NULL));
        } else if (!strcmp(c, "lebind")) {
            int h = (int)ARG();
            printf("lebind %d\n", T.cuLogicalEndpointBindMem(1, 0, 0, H[h], 0, Hsize[h], 0));
        /* ---- pools ---- */
        } else if (!strcmp(c, "poolcreate")) {
            const char *where = SARG();
            CUmemPoolProps pp;
            memset(&pp, 0, sizeof(pp));
            pp.allocType = !strcmp(where, "managed") ? CU_MEM_ALLOCATION_TYPE_MANAGED
                                                     : CU_MEM_ALLOCATION_TYPE_PINNED;
            location(!strcmp(where, "managed") ? "none" : where, &pp.location);
            CUresult r = T.cuMemPoolCreate(&P[nP], &pp);
            printf("poolcreate %d p%d\n", r, r == CUDA_SUCCESS ? nP++ : -1);
        } else if (!strcmp(c, "rawpool")) { /* a device-1 pool the library never saw made */
            CUmemPoolProps pp;
            memset(&pp, 0, sizeof(pp));
            pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            location("dev1", &pp.location);
            CUresult r = fakecuda_pool_create(&P[nP], &pp);
            printf("rawpool %d p%d\n", r, r == CUDA_SUCCESS ? nP++ : -1);
        } else if (!strcmp(c, "getpool")) {
            const char *where = SARG();
            CUmemLocation loc;
            location(!strcmp(where, "managed") ? "none" : where, &loc);
            CUresult r = T.cuMemGetDefaultMemPool(
                &P[nP], &loc,
                !strcmp(where, "managed") ? CU_MEM_ALLOCATION_TYPE_MANAGED : CU_MEM_ALLOCATION_TYPE_PINNED);
            printf("getpool %d p%d\n", r, r == CUDA_SUCCESS ? nP++ : -1);
        } else if (!strcmp(c, "curpool")) {
            CUmemLocation loc;
            location("dev", &loc);
            CUresult r = T.cuMemGetMemPool(&P[nP], &loc, CU_MEM_ALLOCATION_TYPE_PINNED);
            printf("curpool %d p%d\n", r, r == CUDA_SUCCESS ? nP++ : -1);
        } else if (!strcmp(c, "setpool")) {
            int p = (int)ARG();
            printf("setpool %d\n", T.cuDeviceSetMemPool(0, P[p]));
        } else if (!strcmp(c, "palloc")) {
            int p = (int)ARG();
            size_t b = ARG();
            CUdeviceptr d = 0;
            CUresult r = T.cuMemAllocFromPoolAsync(&d, b, P[p], NULL);
            if (r == CUDA_SUCCESS)
                push(2, d);
            printf("palloc %zu %d\n", b, r);
        } else if (!strcmp(c, "thresh")) {
            int p = (int)ARG();
            cuuint64_t v = ARG();
            printf("thresh %d\n", T.cuMemPoolSetAttribute(P[p], CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
        } else if (!strcmp(c, "trim")) {
            int p = (int)ARG();
            size_t v = ARG();
            printf("trim %d\n", T.cuMemPoolTrimTo(P[p], v));
        } else if (!strcmp(c, "pdestroy")) {
            int p = (int)ARG();
            printf("pdestroy %d\n", T.cuMemPoolDestroy(P[p]));
        } else if (!strcmp(c, "reserved")) {
            int p = (int)ARG();
            cuuint64_t v = 0;
            CUresult r = T.cuMemPoolGetAttribute(P[p], CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v);
            printf("reserved %d %llu\n", r, (unsigned long long)v);
        } else if (!strcmp(c, "pfree")) { /* free the newest allocation */
            printf("pfree %d\n", sp ? (int)pop_free() : -1);
        /* ---- graphs ---- */
        } else if (!strcmp(c, "gcreate")) {
            CUresult r = T.cuGraphCreate(&Gr[nG], 0);
            printf("gcreate %d g%d\n", r, r == CUDA_SUCCESS ? nG++ : -1);
        } else if (!strcmp(c, "galloc")) {
            int g = (int)ARG();
            size_t b = ARG();
            CUDA_MEM_ALLOC_NODE_PARAMS p;
            memset(&p, 0, sizeof(p));
            p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            p.poolProps.location.id = 0;
            p.bytesize = b;
            CUgraphNode n;
            CUresult r = T.cuGraphAddMemAllocNode(&n, Gr[g], NULL, 0, &p);
            Glast[g] = p.dptr;
            printf("galloc %d\n", r);
        } else if (!strcmp(c, "gfree")) {
            int g = (int)ARG();
            CUgraphNode n;
            printf("gfree %d\n", T.cuGraphAddMemFreeNode(&n, Gr[g], NULL, 0, Glast[g]));
        } else if (!strcmp(c, "ginst")) {
            int g = (int)ARG();
            unsigned long long flags = ARG();
            CUresult r = T.cuGraphInstantiateWithFlags(&E[nE], Gr[g], flags);
            printf("ginst %d e%d\n", r, r == CUDA_SUCCESS ? nE++ : -1);
        } else if (!strcmp(c, "glaunch")) {
            int e = (int)ARG();
            printf("glaunch %d\n", T.cuGraphLaunch(E[e], NULL));
        } else if (!strcmp(c, "gupload")) {
            int e = (int)ARG();
            printf("gupload %d\n", T.cuGraphUpload(E[e], NULL));
        } else if (!strcmp(c, "gdestroy")) {
            int e = (int)ARG();
            printf("gdestroy %d\n", T.cuGraphExecDestroy(E[e]));
        } else if (!strcmp(c, "gtrim")) {
            printf("gtrim %d\n", T.cuDeviceGraphMemTrim(0));
        } else if (!strcmp(c, "gfreeptr")) {
            int g = (int)ARG();
            printf("gfreeptr %d\n", T.cuMemFreeAsync(Glast[g], NULL));
        } else if (!strcmp(c, "gmem")) {
            cuuint64_t u = 0, rs = 0;
            T.cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &u);
            CUresult r = T.cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &rs);
            printf("gmem %d used=%llu reserved=%llu\n", r, (unsigned long long)u, (unsigned long long)rs);
        } else if (!strcmp(c, "capture")) {
            size_t b = ARG();
            CUstream s;
            CUdeviceptr d = 0;
            CUresult r = T.cuStreamCreate(&s, 0);
            if (r == CUDA_SUCCESS)
                r = T.cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
            CUresult ra = r == CUDA_SUCCESS ? T.cuMemAllocAsync(&d, b, s) : r;
            if (r == CUDA_SUCCESS)
                r = T.cuStreamEndCapture(s, &Gr[nG]);
            Glast[nG] = d;
            printf("capture %d alloc=%d g%d\n", r, ra, r == CUDA_SUCCESS ? nG++ : -1);
        /* ---- contexts ---- */
        } else if (!strcmp(c, "setlimit")) {
            CUlimit l = limit_named(SARG());
            size_t v = ARG();
            printf("setlimit %d\n", T.cuCtxSetLimit(l, v));
        } else if (!strcmp(c, "green")) {
            int n = (int)ARG();
            CUresult r = T.cuGreenCtxCreate(&g_green, NULL, n, 0);
            CUcontext ctx = NULL;
            if (r == CUDA_SUCCESS && T.cuCtxFromGreenCtx(&ctx, g_green) == CUDA_SUCCESS)
                T.cuCtxSetCurrent(ctx);
            printf("green %d\n", r);
        } else if (!strcmp(c, "greendestroy")) {
            CUresult r = T.cuGreenCtxDestroy(g_green);
            sp = 0;
            printf("greendestroy %d\n", r);
        } else if (!strcmp(c, "attach")) {
            CUcontext ctx;
            printf("attach %d\n", T.cuCtxAttach(&ctx, 0));
        } else if (!strcmp(c, "detach")) {
            CUresult r = T.cuCtxDetach(g_ctx_created);
            sp = 0;
            printf("detach %d\n", r);
        } else if (!strcmp(c, "glctx")) {
            int n = (int)ARG();
            CUcontext ctx;
            printf("glctx %d\n", T.cuGLCtxCreate_v2(&ctx, 0, n));
        } else if (!strcmp(c, "restore")) {
            CUcheckpointGpuPair pair;
            memset(&pair, 0, sizeof(pair));
            CUcheckpointRestoreArgs a;
            memset(&a, 0, sizeof(a));
            a.gpuPairs = &pair;
            a.gpuPairsCount = 1;
            printf("restore %d\n", T.cuCheckpointProcessRestore(getpid(), &a));
        /* ---- resolution ---- */
        } else if (!strcmp(c, "v1alloc")) {
            unsigned b = (unsigned)ARG();
            CUresult (*v1)(CUdeviceptr_v1 *, unsigned int);
            *(void **)&v1 = g_libcuda ? dlsym(g_libcuda, "cuMemAlloc") : (void *)&cuMemAlloc;
            CUdeviceptr_v1 p = 0;
            printf("v1alloc %d\n", v1 ? (int)v1(&p, b) : -1);
        } else if (!strcmp(c, "procalloc")) {
            int ver = (int)ARG();
            size_t b = ARG();
            void *fn = NULL;
            CUresult r = g_gpa("cuMemAlloc", &fn, ver, CU_GET_PROC_ADDRESS_DEFAULT, NULL);
            if (r == CUDA_SUCCESS && ver < 3020) {
                CUdeviceptr_v1 p = 0;
                r = ((CUresult(*)(CUdeviceptr_v1 *, unsigned int))fn)(&p, (unsigned)b);
            } else if (r == CUDA_SUCCESS) {
                CUdeviceptr p = 0;
                r = ((CUresult(*)(CUdeviceptr *, size_t))fn)(&p, b);
                if (r == CUDA_SUCCESS)
                    push(1, p);
            }
            printf("procalloc %d %d\n", ver, r);
        } else if (!strcmp(c, "nextalloc")) {
            size_t b = ARG();
            CUresult (*f)(CUdeviceptr *, size_t);
            *(void **)&f = tp_next("cuMemAlloc_v2");
            CUdeviceptr p = 0;
            CUresult r = f ? f(&p, b) : CUDA_ERROR_NOT_FOUND;
            if (r == CUDA_SUCCESS)
                push(1, p);
            printf("nextalloc %zu %d\n", b, r);
        } else if (!strcmp(c, "procmatch")) {
            /* does cuGetProcAddress(BASE, VER[, per-thread]) give what dlsym(NAME) gives? */
            const char *name = SARG(), *base = SARG();
            int ver = (int)ARG(), ptsz = (int)ARG();
            void *fn = NULL;
            CUresult r = g_gpa(base, &fn, ver,
                               ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
                                    : CU_GET_PROC_ADDRESS_DEFAULT,
                               NULL);
            void *d = dlsym(RTLD_DEFAULT, name);
            printf("procmatch %s %d %s\n", name, r, r == CUDA_SUCCESS && fn && fn == d ? "hook" : "other");
        } else if (!strcmp(c, "marker")) {
            /* RTLD_NEXT from the executable starts after it: finds the library's marker */
            void *n = dlsym(RTLD_NEXT, "tessera_enforce_version");
            void *own = dlsym(RTLD_NEXT, "tp_marker");
            printf("marker %s %s\n", n ? "found" : "missing", own ? "found" : "missing");
        } else if (!strcmp(c, "rtldnext")) {
            void *n = dlsym(RTLD_NEXT, "cuMemAlloc_v2");
            void *d = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
            printf("rtldnext %s\n", n && n == d ? "same" : "different");
        } else if (!strcmp(c, "deepbind")) {
            size_t b = ARG();
            void *h = dlopen("libtpplugin.so", RTLD_NOW | RTLD_DEEPBIND);
            if (!h) {
                printf("deepbind dlopen-failed %s\n", dlerror());
                continue;
            }
            int (*direct)(CUdeviceptr *, size_t), (*table)(CUdeviceptr *, size_t),
                (*viadlsym)(CUdeviceptr *, size_t);
            *(void **)&direct = dlsym(h, "plugin_direct");
            *(void **)&table = dlsym(h, "plugin_table");
            *(void **)&viadlsym = dlsym(h, "plugin_dlsym");
            CUdeviceptr p1 = 0, p2 = 0, p3 = 0;
            int r1 = direct(&p1, b), r2 = table(&p2, b), r3 = viadlsym(&p3, b);
            if (r1 == 0)
                push(1, p1);
            if (r2 == 0)
                push(1, p2);
            if (r3 == 0)
                push(1, p3);
            printf("deepbind direct=%d table=%d dlsym=%d\n", r1, r2, r3);
        } else if (!strcmp(c, "dlmopen")) {
            void *h = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW);
            const char *e = h ? NULL : dlerror();
            printf("dlmopen %s %s\n", h ? "loaded" : "refused", e ? e : "-");
        } else if (!strcmp(c, "unlockslot")) {
            /* try to release every lock this process holds on any file, and to unmap every
             * mapping of the region file */
            int fds = 0;
            DIR *dir = opendir("/proc/self/fd");
            struct dirent *de;
            while (dir && (de = readdir(dir))) {
                int fd = atoi(de->d_name);
                if (fd <= 2)
                    continue;
                struct flock fl;
                memset(&fl, 0, sizeof(fl));
                fl.l_type = F_UNLCK;
                fl.l_whence = SEEK_SET;
                if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
                    fds++;
                fcntl(fd, F_SETLK, &fl);
            }
            if (dir)
                closedir(dir);
            const char *region = getenv("TP_REGION");
            int unmapped = 0, sealed = 0;
            FILE *maps = fopen("/proc/self/maps", "r");
            char line[1024];
            while (region && maps && fgets(line, sizeof(line), maps)) {
                unsigned long lo, hi;
                if (!strstr(line, region) || sscanf(line, "%lx-%lx", &lo, &hi) != 2)
                    continue;
                if (hi - lo > 4096)
                    continue; /* the region itself: the library still needs it */
                if (munmap((void *)lo, hi - lo) == 0)
                    unmapped++;
                else if (errno == EPERM)
                    sealed++;
            }
            if (maps)
                fclose(maps);
            printf("unlockslot fds=%d unmapped=%d sealed=%d\n", fds, unmapped, sealed);
        } else if (!strcmp(c, "wait")) { /* until a line on stdin: the test reads the region */
            printf("waiting\n");
            fflush(stdout);
            char line[16];
            if (!fgets(line, sizeof(line), stdin))
                return 3;
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
