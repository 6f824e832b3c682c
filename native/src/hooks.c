/*
 * libtessera-enforce: CUDA driver API and NVML interposition.
 *
 * Reached three ways, all ending in the same hook functions below:
 *  1. direct linking: the library is preloaded (LD_PRELOAD or /etc/ld.so.preload), so its
 *     exported cu* / nvml* symbols win over libcuda.so.1 / libnvidia-ml.so.1;
 *  2. dlsym(): the library exports dlsym; a lookup of a hooked name returns the hook;
 *  3. cuGetProcAddress / cuGetProcAddress_v2 (how CUDA 12 runtimes resolve the driver): the
 *     pointer the driver returns is swapped for the hook when it is the real entry point of a
 *     hooked function (matched by address, then by name + version + per-thread flag).
 * Real entry points come from dlopen("libcuda.so.1") / dlopen("libnvidia-ml.so.1") and the real
 * dlsym, so the library never calls itself.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc_table.h"
#include "internal.h"

#ifdef TESSERA_LIMITS_PATH_OVERRIDE /* test builds only */
#define LIMITS_PATH TESSERA_LIMITS_PATH_OVERRIDE
#else
#define LIMITS_PATH TESSERA_LIMITS_PATH
#endif

/* ---------------------------------------------------------------------------------------- */
/* logging                                                                                   */

static int g_log_level = -1;

void ts_log(int level, const char *fmt, ...)
{
    if (g_log_level < 0) {
        const char *s = getenv("TESSERA_LOG_LEVEL");
        g_log_level = s ? atoi(s) : TS_WARN;
    }
    if (level > g_log_level)
        return;
    char buf[512];
    int n = snprintf(buf, sizeof(buf), "tessera[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(buf))
        vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = strlen(buf);
    if (len < sizeof(buf) - 1) {
        buf[len++] = '\n';
    }
    ssize_t w = write(2, buf, len);
    (void)w;
}

uint64_t ts_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------------------------------- */
/* the real dlsym                                                                            */

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn g_real_dlsym;

/* dlsym can be called before any constructor runs, by a sanitizer runtime initialising
 * itself, so the code on the dlsym path is never instrumented and calls no libc string
 * functions. */
#define TS_NOSAN __attribute__((no_sanitize("address", "undefined")))

TS_NOSAN static int ts_streq(const char *a, const char *b)
{
    while (*a && *a == *b) {
        a++;
        b++;
    }
    return *a == *b;
}

TS_NOSAN static dlsym_fn real_dlsym(void)
{
    dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (TS_LIKELY(f != NULL))
        return f;
    /* dlvsym is not interposed; RTLD_NEXT from here finds libc's (or libdl's) dlsym. */
    f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!f)
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!f)
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17"); /* aarch64 */
    if (!f) {
        static const char msg[] = "tessera: cannot find the real dlsym\n";
        ssize_t w = write(2, msg, sizeof(msg) - 1);
        (void)w;
        abort();
    }
    __atomic_store_n(&g_real_dlsym, f, __ATOMIC_RELEASE);
    return f;
}

/* ---------------------------------------------------------------------------------------- */
/* hooked CUDA entry points: X(symbol, base name, first CUDA version it serves, per-thread)    */

#define TS_CUDA_HOOKS(X)                                                 \
    X(cuGetProcAddress, "cuGetProcAddress", 11030, 0)                    \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)                 \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0)                          \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0)                  \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0)                              \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0)                    \
    X(cuMemFree_v2, "cuMemFree", 3020, 0)                                \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0)                   \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0)                      \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1)                 \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0)      \
    X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1) \
    X(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0)                        \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1)                   \
    X(cuMemPoolCreate, "cuMemPoolCreate", 11020, 0)                      \
    X(cuMemPoolDestroy, "cuMemPoolDestroy", 11020, 0)                    \
    X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, 0)  \
    X(cuDeviceGetMemPool, "cuDeviceGetMemPool", 11020, 0)                \
    X(cuMemCreate, "cuMemCreate", 10020, 0)                              \
    X(cuMemRelease, "cuMemRelease", 10020, 0)                            \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020, 0)                        \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0)                    \
    X(cuArrayDestroy, "cuArrayDestroy", 2000, 0)                         \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0)         \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0)       \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020, 0)                            \
    X(cuCtxCreate_v3, "cuCtxCreate", 11040, 0)                           \
    X(cuCtxCreate_v4, "cuCtxCreate", 12050, 0)                           \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0)                          \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0)     \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0) \
    X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0)   \
    X(cuLaunchKernel, "cuLaunchKernel", 4000, 0)                         \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, 1)                    \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0)                    \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1)               \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0)   \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1) \
    X(cuGraphLaunch, "cuGraphLaunch", 10000, 0)                          \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1)

#define TS_NVML_HOOKS(X)                   \
    X(nvmlDeviceGetMemoryInfo)             \
    X(nvmlDeviceGetMemoryInfo_v2)

enum {
#define X(sym, base, ver, ptsz) H_##sym,
    TS_CUDA_HOOKS(X)
#undef X
        H_CUDA_COUNT
};

typedef struct hook_entry {
    const char *name;
    const char *base;
    int min_version;
    int ptsz;
    void *hook;
    void *real;
} hook_entry;

static hook_entry g_cuda_hooks[] = {
#define X(sym, base, ver, ptsz) {#sym, base, ver, ptsz, (void *)&sym, NULL},
    TS_CUDA_HOOKS(X)
#undef X
};

static struct {
    const char *name;
    void *hook;
    void *real;
} g_nvml_hooks[] = {
#define X(sym) {#sym, (void *)&sym, NULL},
    TS_NVML_HOOKS(X)
#undef X
};
enum {
#define X(sym) N_##sym,
    TS_NVML_HOOKS(X)
#undef X
};

/* Other real entry points the hooks need (not interposed). */
static struct {
    CUresult (*cuDeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*cuDeviceGetUuid_v2)(CUuuid *, CUdevice);
    CUresult (*cuCtxGetDevice)(CUdevice *);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuCtxPushCurrent_v2)(CUcontext);
    CUresult (*cuCtxPopCurrent_v2)(CUcontext *);
    CUresult (*cuStreamGetCtx)(CUstream, CUcontext *);
    CUresult (*cuMemFree_v2)(CUdeviceptr);
    nvmlReturn_t (*nvmlDeviceGetUUID)(nvmlDevice_t, char *, unsigned int);
} R;

#define REAL(sym) ((__typeof__(&sym))g_cuda_hooks[H_##sym].real)
#define REAL_NVML(sym) ((__typeof__(&sym))g_nvml_hooks[N_##sym].real)

/* ---------------------------------------------------------------------------------------- */
/* process state                                                                             */

enum { ST_UNINIT = 0, ST_INERT = 1, ST_ACTIVE = 2, ST_CLOSED = 3 };

#define MAX_ORDINALS 64

typedef struct dev_info {
    int resolved; /* 0 no, 1 yes */
    int g;        /* region GPU entry, -1 = not limited */
    uint64_t limit;
    uint32_t cores;
} dev_info;

static struct {
    pthread_mutex_t mu;
    int state;           /* ST_* (atomic) */
    int closed;          /* fail closed: limits file present but unusable */
    int cuda_ready;      /* real CUDA pointers resolved (atomic) */
    int nvml_ready;      /* real NVML pointers resolved (atomic) */
    int pacing;          /* some GPU of the limits has 0 < cores < 100 */
    void *libcuda;
    void *libnvml;
    tessera_limits lim;
    ts_region region;
    dev_info dev[MAX_ORDINALS];
    uint32_t primary_refs[MAX_ORDINALS];
    pthread_mutex_t ctx_mu;
    ts_table table;
    struct {
        nvmlDevice_t h;
        int g;
        uint64_t limit;
    } nvml_dev[MAX_ORDINALS];
    int nvml_n;
} G = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .ctx_mu = PTHREAD_MUTEX_INITIALIZER,
    .table = {.mu = PTHREAD_MUTEX_INITIALIZER},
};

tessera_region_header *ts_region_hdr(void) { return G.region.hdr; }

/* Read the limits: the fixed path wins; the environment is only a fallback when the fixed
 * path does not exist at all (outside Kubernetes). */
static void load_limits_locked(void)
{
    char err[256];
    const char *path = LIMITS_PATH;
    if (access(path, F_OK) != 0) {
        if (errno != ENOENT) {
            ts_log(TS_ERR, "%s: %s; refusing GPU memory", path, strerror(errno));
            G.closed = 1;
            G.state = ST_ACTIVE;
            return;
        }
        path = getenv(TESSERA_LIMITS_ENV);
        if (!path || !*path) {
            G.state = ST_INERT;
            return;
        }
    }
    if (tessera_limits_load(path, &G.lim, err, sizeof(err)) != 0) {
        ts_log(TS_ERR, "%s: %s; refusing GPU memory", path, err);
        G.closed = 1;
        G.state = ST_ACTIVE;
        return;
    }
    if (ts_region_open(&G.region, G.lim.region, G.lim.context_overhead, err, sizeof(err)) != 0) {
        ts_log(TS_ERR, "region %s; refusing GPU memory", err);
        G.closed = 1;
        G.state = ST_ACTIVE;
        return;
    }
    for (uint32_t i = 0; i < G.lim.gpu_count; i++) {
        const tessera_limit_gpu *l = &G.lim.gpus[i];
        if (ts_region_gpu(&G.region, l->uuid, l->memory, l->cores) < 0) {
            ts_log(TS_ERR, "region %s: GPU table full; refusing GPU memory", G.lim.region);
            G.closed = 1;
        }
        if (l->cores > 0 && l->cores < 100)
            G.pacing = 1;
    }
    ts_log(TS_INFO, "limits from %s: %u GPU(s), region %s slot %d", path, G.lim.gpu_count,
           G.lim.region, G.region.slot);
    G.state = ST_ACTIVE;
}

static int core_init(void)
{
    int st = __atomic_load_n(&G.state, __ATOMIC_ACQUIRE);
    if (TS_LIKELY(st != ST_UNINIT))
        return st;
    pthread_mutex_lock(&G.mu);
    if (G.state == ST_UNINIT) {
        int s;
        load_limits_locked();
        s = G.state;
        G.state = ST_UNINIT;
        __atomic_store_n(&G.state, s, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&G.mu);
    return __atomic_load_n(&G.state, __ATOMIC_ACQUIRE);
}

static void cuda_init(void)
{
    if (TS_LIKELY(__atomic_load_n(&G.cuda_ready, __ATOMIC_ACQUIRE)))
        return;
    pthread_mutex_lock(&G.mu);
    if (!G.cuda_ready) {
        dlsym_fn ds = real_dlsym();
        G.libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!G.libcuda)
            ts_log(TS_ERR, "dlopen libcuda.so.1: %s", dlerror());
        for (int i = 0; i < H_CUDA_COUNT; i++)
            g_cuda_hooks[i].real = G.libcuda ? ds(G.libcuda, g_cuda_hooks[i].name) : NULL;
        if (G.libcuda) {
            *(void **)&R.cuDeviceGetUuid = ds(G.libcuda, "cuDeviceGetUuid");
            *(void **)&R.cuDeviceGetUuid_v2 = ds(G.libcuda, "cuDeviceGetUuid_v2");
            *(void **)&R.cuCtxGetDevice = ds(G.libcuda, "cuCtxGetDevice");
            *(void **)&R.cuCtxGetCurrent = ds(G.libcuda, "cuCtxGetCurrent");
            *(void **)&R.cuCtxPushCurrent_v2 = ds(G.libcuda, "cuCtxPushCurrent_v2");
            *(void **)&R.cuCtxPopCurrent_v2 = ds(G.libcuda, "cuCtxPopCurrent_v2");
            *(void **)&R.cuStreamGetCtx = ds(G.libcuda, "cuStreamGetCtx");
            R.cuMemFree_v2 = REAL(cuMemFree_v2);
        }
        __atomic_store_n(&G.cuda_ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&G.mu);
}

static void nvml_init(void)
{
    if (TS_LIKELY(__atomic_load_n(&G.nvml_ready, __ATOMIC_ACQUIRE)))
        return;
    pthread_mutex_lock(&G.mu);
    if (!G.nvml_ready) {
        dlsym_fn ds = real_dlsym();
        G.libnvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!G.libnvml)
            ts_log(TS_ERR, "dlopen libnvidia-ml.so.1: %s", dlerror());
        for (size_t i = 0; i < sizeof(g_nvml_hooks) / sizeof(g_nvml_hooks[0]); i++)
            g_nvml_hooks[i].real = G.libnvml ? ds(G.libnvml, g_nvml_hooks[i].name) : NULL;
        if (G.libnvml)
            *(void **)&R.nvmlDeviceGetUUID = ds(G.libnvml, "nvmlDeviceGetUUID");
        __atomic_store_n(&G.nvml_ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&G.mu);
}

void *ts_real_cuda(const char *name)
{
    cuda_init();
    return G.libcuda ? real_dlsym()(G.libcuda, name) : NULL;
}

/* Enter a CUDA hook: 1 when the call must be checked, 0 to pass it through untouched. */
static int cuda_enter(void)
{
    cuda_init();
    return core_init() == ST_ACTIVE;
}

static void format_uuid(const CUuuid *u, char out[TESSERA_UUID_STR_LEN])
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, TESSERA_UUID_STR_LEN,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
}

/* Limits of CUDA device ordinal dev, keyed by the UUID the driver reports for it (so any
 * CUDA_VISIBLE_DEVICES subset or order maps to the right GPU). */
static dev_info get_dev(CUdevice dev)
{
    dev_info none = {1, -1, 0, 0};
    if (dev < 0 || dev >= MAX_ORDINALS)
        return none;
    dev_info *d = &G.dev[dev];
    if (TS_LIKELY(__atomic_load_n(&d->resolved, __ATOMIC_ACQUIRE)))
        return *d;
    CUuuid u;
    CUresult r = CUDA_ERROR_NOT_FOUND;
    if (R.cuDeviceGetUuid_v2)
        r = R.cuDeviceGetUuid_v2(&u, dev);
    if (r != CUDA_SUCCESS && R.cuDeviceGetUuid)
        r = R.cuDeviceGetUuid(&u, dev);
    if (r != CUDA_SUCCESS)
        return none; /* not cached: invalid ordinal or not initialised yet */
    char s[TESSERA_UUID_STR_LEN];
    format_uuid(&u, s);
    dev_info v = none;
    for (uint32_t i = 0; i < G.lim.gpu_count; i++) {
        if (tessera_uuid_equal(G.lim.gpus[i].uuid, s)) {
            v.g = G.closed ? -1 : ts_region_gpu(&G.region, G.lim.gpus[i].uuid,
                                                 G.lim.gpus[i].memory, G.lim.gpus[i].cores);
            v.limit = G.lim.gpus[i].memory;
            v.cores = G.lim.gpus[i].cores;
            break;
        }
    }
    ts_log(TS_DEBUG, "device %d is %s: entry %d limit %llu cores %u", dev, s, v.g,
           (unsigned long long)v.limit, v.cores);
    pthread_mutex_lock(&G.mu);
    if (!d->resolved) {
        d->g = v.g;
        d->limit = v.limit;
        d->cores = v.cores;
        __atomic_store_n(&d->resolved, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&G.mu);
    return v;
}

static int current_dev(CUdevice *dev)
{
    return R.cuCtxGetDevice && R.cuCtxGetDevice(dev) == CUDA_SUCCESS ? 0 : -1;
}

static int stream_dev(CUstream s, CUdevice *dev)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD || !R.cuStreamGetCtx)
        return current_dev(dev);
    CUcontext sc = NULL, cur = NULL;
    if (R.cuStreamGetCtx(s, &sc) != CUDA_SUCCESS || sc == NULL)
        return current_dev(dev);
    if (R.cuCtxGetCurrent && R.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == sc)
        return current_dev(dev);
    if (!R.cuCtxPushCurrent_v2 || R.cuCtxPushCurrent_v2(sc) != CUDA_SUCCESS)
        return current_dev(dev);
    int rc = current_dev(dev);
    CUcontext popped;
    R.cuCtxPopCurrent_v2(&popped);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* charging                                                                                  */

/* Decision for an allocation of `bytes` on device dev: 0 pass through (not limited),
 * 1 charged (caller must credit on failure), -1 refuse with out-of-memory. */
static int charge_dev(CUdevice dev, uint64_t bytes, uint32_t nctx, int *g_out, const char *what)
{
    if (G.closed)
        return -1;
    dev_info d = get_dev(dev);
    *g_out = d.g;
    if (d.g < 0)
        return 0;
    if (ts_region_charge(&G.region, d.g, bytes, nctx, d.limit) != 0) {
        ts_log(TS_WARN, "%s of %llu bytes on device %d refused: claim uses %llu of %llu", what,
               (unsigned long long)bytes, dev,
               (unsigned long long)ts_region_usage(&G.region, d.g, 0),
               (unsigned long long)d.limit);
        return -1;
    }
    return 1;
}

static void credit(int g, uint64_t bytes, uint32_t nctx)
{
    if (g >= 0)
        ts_region_credit(&G.region, g, bytes, nctx);
}

static void remember(uint8_t kind, uint64_t key, uint64_t bytes, int g)
{
    if (g >= 0 && ts_table_put(&G.table, kind, key, bytes, g) != 0)
        ts_log(TS_ERR, "out of host memory tracking an allocation; it stays charged");
}

/* Release an allocation: the real call first, the credit only once it succeeded, so that the
 * claim's charged usage never drops below what the driver still holds. */
#define RELEASE(kind, handle_, call)                                                   \
    do {                                                                           \
        ts_entry e_;                                                               \
        int have_ = ts_table_take(&G.table, (kind), (uint64_t)(handle_), &e_) == 0;    \
        CUresult r_ = (call);                                                      \
        if (have_) {                                                               \
            if (r_ == CUDA_SUCCESS)                                                \
                credit(e_.g, e_.bytes, (kind) == TS_KIND_CTX ? 1 : 0);             \
            else                                                                   \
                remember((kind), e_.key, e_.bytes, e_.g);                         \
        }                                                                          \
        return r_;                                                                 \
    } while (0)

/* Charge, call, and record (or undo) one allocation on device dev. */
#define ALLOC_ON(dev, bytes, kind, keyexpr, what, call)                    \
    do {                                                                   \
        int g_ = -1;                                                       \
        int c_ = charge_dev((dev), (bytes), 0, &g_, (what));               \
        if (c_ < 0)                                                        \
            return CUDA_ERROR_OUT_OF_MEMORY;                               \
        CUresult r_ = (call);                                              \
        if (c_ > 0) {                                                      \
            if (r_ == CUDA_SUCCESS)                                        \
                remember((kind), (uint64_t)(keyexpr), (bytes), g_);        \
            else                                                           \
                credit(g_, (bytes), 0);                                    \
        }                                                                  \
        return r_;                                                         \
    } while (0)

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    default:
        return 4; /* newer/packed formats: at most 4 bytes per channel element */
    }
}

static uint64_t array3d_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch)
{
    uint64_t b = mul_sat(format_bytes(f), ch ? ch : 1);
    b = mul_sat(b, w ? w : 1);
    b = mul_sat(b, h ? h : 1);
    return mul_sat(b, d ? d : 1);
}

/* ---------------------------------------------------------------------------------------- */
/* memory hooks                                                                              */

TS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    if (!cuda_enter() || bytesize == 0 || !dptr)
        return REAL(cuMemAlloc_v2) ? REAL(cuMemAlloc_v2)(dptr, bytesize) : CUDA_ERROR_NOT_FOUND;
    CUdevice dev;
    if (current_dev(&dev) != 0)
        return REAL(cuMemAlloc_v2)(dptr, bytesize);
    ALLOC_ON(dev, bytesize, TS_KIND_DPTR, *dptr, "cuMemAlloc", REAL(cuMemAlloc_v2)(dptr, bytesize));
}

TS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (!cuda_enter() || bytesize == 0 || !dptr)
        return REAL(cuMemAllocManaged) ? REAL(cuMemAllocManaged)(dptr, bytesize, flags)
                                       : CUDA_ERROR_NOT_FOUND;
    CUdevice dev;
    if (current_dev(&dev) != 0)
        return REAL(cuMemAllocManaged)(dptr, bytesize, flags);
    ALLOC_ON(dev, bytesize, TS_KIND_DPTR, *dptr, "cuMemAllocManaged",
             REAL(cuMemAllocManaged)(dptr, bytesize, flags));
}

TS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                      size_t Height, unsigned int ElementSizeBytes)
{
    if (!cuda_enter() || !dptr || !pPitch || WidthInBytes == 0 || Height == 0)
        return REAL(cuMemAllocPitch_v2)
                   ? REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes)
                   : CUDA_ERROR_NOT_FOUND;
    CUdevice dev;
    if (current_dev(&dev) != 0)
        return REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    /* Pre-charge an estimate (rows padded to 512 bytes), then settle on pitch*height. */
    uint64_t est = mul_sat((WidthInBytes + 511) & ~(size_t)511, Height);
    int g = -1;
    int c = charge_dev(dev, est, 0, &g, "cuMemAllocPitch");
    if (c < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemAllocPitch_v2)(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (c == 0)
        return r;
    if (r != CUDA_SUCCESS) {
        credit(g, est, 0);
        return r;
    }
    uint64_t actual = mul_sat(*pPitch, Height);
    if (actual > est) {
        dev_info d = get_dev(dev);
        if (ts_region_charge(&G.region, g, actual - est, 0, d.limit) != 0) {
            R.cuMemFree_v2(*dptr);
            credit(g, est, 0);
            *dptr = 0;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else if (actual < est) {
        credit(g, est - actual, 0);
    }
    remember(TS_KIND_DPTR, *dptr, actual, g);
    return r;
}

TS_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    if (!cuda_enter() || !REAL(cuMemFree_v2))
        return REAL(cuMemFree_v2) ? REAL(cuMemFree_v2)(dptr) : CUDA_ERROR_NOT_FOUND;
    RELEASE(TS_KIND_DPTR, dptr, REAL(cuMemFree_v2)(dptr));
}

#define ASYNC_ALLOC(sym)                                                                     \
    TS_EXPORT CUresult sym(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)             \
    {                                                                                        \
        CUdevice dev;                                                                        \
        if (!cuda_enter() || bytesize == 0 || !dptr || stream_dev(hStream, &dev) != 0)       \
            return REAL(sym) ? REAL(sym)(dptr, bytesize, hStream) : CUDA_ERROR_NOT_FOUND;    \
        ALLOC_ON(dev, bytesize, TS_KIND_DPTR, *dptr, #sym, REAL(sym)(dptr, bytesize, hStream)); \
    }
ASYNC_ALLOC(cuMemAllocAsync)
ASYNC_ALLOC(cuMemAllocAsync_ptsz)

static int pool_dev(CUmemoryPool pool, CUstream s, CUdevice *dev)
{
    ts_entry e;
    if (ts_table_get(&G.table, TS_KIND_POOL, (uint64_t)(uintptr_t)pool, &e) == 0) {
        *dev = (CUdevice)e.bytes;
        return 0;
    }
    return stream_dev(s, dev);
}

#define POOL_ALLOC(sym)                                                                          \
    TS_EXPORT CUresult sym(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream) \
    {                                                                                            \
        CUdevice dev;                                                                            \
        if (!cuda_enter() || bytesize == 0 || !dptr || pool_dev(pool, hStream, &dev) != 0)       \
            return REAL(sym) ? REAL(sym)(dptr, bytesize, pool, hStream) : CUDA_ERROR_NOT_FOUND;  \
        ALLOC_ON(dev, bytesize, TS_KIND_DPTR, *dptr, #sym,                                       \
                 REAL(sym)(dptr, bytesize, pool, hStream));                                      \
    }
POOL_ALLOC(cuMemAllocFromPoolAsync)
POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz)

#define ASYNC_FREE(sym)                                                                \
    TS_EXPORT CUresult sym(CUdeviceptr dptr, CUstream hStream)                         \
    {                                                                                  \
        if (!cuda_enter() || !REAL(sym))                                               \
            return REAL(sym) ? REAL(sym)(dptr, hStream) : CUDA_ERROR_NOT_FOUND;        \
        RELEASE(TS_KIND_DPTR, dptr, REAL(sym)(dptr, hStream));                         \
    }
ASYNC_FREE(cuMemFreeAsync)
ASYNC_FREE(cuMemFreeAsync_ptsz)

static void note_pool(CUmemoryPool pool, CUdevice dev)
{
    if (pool)
        ts_table_put(&G.table, TS_KIND_POOL, (uint64_t)(uintptr_t)pool, (uint64_t)dev, 0);
}

TS_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    cuda_enter();
    if (!REAL(cuMemPoolCreate))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuMemPoolCreate)(pool, poolProps);
    if (r == CUDA_SUCCESS && pool && poolProps &&
        poolProps->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        note_pool(*pool, poolProps->location.id);
    return r;
}

TS_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    cuda_enter();
    ts_entry e;
    ts_table_take(&G.table, TS_KIND_POOL, (uint64_t)(uintptr_t)pool, &e);
    return REAL(cuMemPoolDestroy) ? REAL(cuMemPoolDestroy)(pool) : CUDA_ERROR_NOT_FOUND;
}

TS_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    cuda_enter();
    if (!REAL(cuDeviceGetDefaultMemPool))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuDeviceGetDefaultMemPool)(pool_out, dev);
    if (r == CUDA_SUCCESS && pool_out)
        note_pool(*pool_out, dev);
    return r;
}

TS_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    cuda_enter();
    if (!REAL(cuDeviceGetMemPool))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuDeviceGetMemPool)(pool, dev);
    if (r == CUDA_SUCCESS && pool)
        note_pool(*pool, dev);
    return r;
}

TS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags)
{
    if (!cuda_enter() || !handle || !prop || size == 0 ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return REAL(cuMemCreate) ? REAL(cuMemCreate)(handle, size, prop, flags)
                                 : CUDA_ERROR_NOT_FOUND;
    ALLOC_ON(prop->location.id, size, TS_KIND_VMM, *handle, "cuMemCreate",
             REAL(cuMemCreate)(handle, size, prop, flags));
}

TS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    if (!cuda_enter() || !REAL(cuMemRelease))
        return REAL(cuMemRelease) ? REAL(cuMemRelease)(handle) : CUDA_ERROR_NOT_FOUND;
    RELEASE(TS_KIND_VMM, handle, REAL(cuMemRelease)(handle));
}

TS_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    CUdevice dev;
    if (!cuda_enter() || !pHandle || !d || current_dev(&dev) != 0)
        return REAL(cuArrayCreate_v2) ? REAL(cuArrayCreate_v2)(pHandle, d) : CUDA_ERROR_NOT_FOUND;
    uint64_t bytes = array3d_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels);
    ALLOC_ON(dev, bytes, TS_KIND_ARRAY, (uintptr_t)*pHandle, "cuArrayCreate",
             REAL(cuArrayCreate_v2)(pHandle, d));
}

TS_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    CUdevice dev;
    if (!cuda_enter() || !pHandle || !d || current_dev(&dev) != 0)
        return REAL(cuArray3DCreate_v2) ? REAL(cuArray3DCreate_v2)(pHandle, d)
                                        : CUDA_ERROR_NOT_FOUND;
    uint64_t bytes = array3d_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
    ALLOC_ON(dev, bytes, TS_KIND_ARRAY, (uintptr_t)*pHandle, "cuArray3DCreate",
             REAL(cuArray3DCreate_v2)(pHandle, d));
}

TS_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    if (!cuda_enter() || !REAL(cuArrayDestroy))
        return REAL(cuArrayDestroy) ? REAL(cuArrayDestroy)(hArray) : CUDA_ERROR_NOT_FOUND;
    RELEASE(TS_KIND_ARRAY, (uintptr_t)hArray, REAL(cuArrayDestroy)(hArray));
}

TS_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                          const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    CUdevice dev;
    if (!cuda_enter() || !pHandle || !d || levels == 0 || current_dev(&dev) != 0)
        return REAL(cuMipmappedArrayCreate) ? REAL(cuMipmappedArrayCreate)(pHandle, d, levels)
                                            : CUDA_ERROR_NOT_FOUND;
    uint64_t bytes = 0;
    size_t w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned i = 0; i < levels && i < 64; i++) {
        uint64_t lb = array3d_bytes(w, h, z, d->Format, d->NumChannels);
        bytes = bytes > UINT64_MAX - lb ? UINT64_MAX : bytes + lb;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        z = z > 1 ? z / 2 : z;
    }
    ALLOC_ON(dev, bytes, TS_KIND_MIPMAP, (uintptr_t)*pHandle, "cuMipmappedArrayCreate",
             REAL(cuMipmappedArrayCreate)(pHandle, d, levels));
}

TS_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray h)
{
    if (!cuda_enter() || !REAL(cuMipmappedArrayDestroy))
        return REAL(cuMipmappedArrayDestroy) ? REAL(cuMipmappedArrayDestroy)(h)
                                             : CUDA_ERROR_NOT_FOUND;
    RELEASE(TS_KIND_MIPMAP, (uintptr_t)h, REAL(cuMipmappedArrayDestroy)(h));
}

/* ---------------------------------------------------------------------------------------- */
/* memory queries                                                                            */

TS_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    cuda_init();
    if (!REAL(cuMemGetInfo_v2))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuMemGetInfo_v2)(free_b, total_b);
    CUdevice dev;
    if (r != CUDA_SUCCESS || !cuda_enter() || !free_b || !total_b || current_dev(&dev) != 0)
        return r;
    if (G.closed) {
        *free_b = 0;
        return r;
    }
    dev_info d = get_dev(dev);
    if (d.g < 0)
        return r;
    uint64_t total = d.limit < *total_b ? d.limit : *total_b;
    uint64_t used = ts_region_usage(&G.region, d.g, 1);
    uint64_t fr = used >= total ? 0 : total - used;
    if (fr > *free_b)
        fr = *free_b; /* never promise what the physical GPU does not have */
    *total_b = (size_t)total;
    *free_b = (size_t)fr;
    return r;
}

TS_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    cuda_init();
    if (!REAL(cuDeviceTotalMem_v2))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuDeviceTotalMem_v2)(bytes, dev);
    if (r == CUDA_SUCCESS && bytes && core_init() == ST_ACTIVE && !G.closed) {
        dev_info d = get_dev(dev);
        if (d.g >= 0 && d.limit < *bytes)
            *bytes = (size_t)d.limit;
    }
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* contexts: each context is charged context-overhead bytes                                  */

static CUresult ctx_create_common(CUdevice dev, CUresult (*create)(void *), void *arg,
                                  CUcontext *pctx)
{
    int g = -1;
    int c = charge_dev(dev, G.lim.context_overhead, 1, &g, "context creation");
    if (c < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = create(arg);
    if (c > 0) {
        if (r == CUDA_SUCCESS && pctx)
            remember(TS_KIND_CTX, (uintptr_t)*pctx, G.lim.context_overhead, g);
        else
            credit(g, G.lim.context_overhead, 1);
    }
    return r;
}

struct ctx_args {
    CUcontext *pctx;
    void *params;
    int n;
    unsigned flags;
    CUdevice dev;
};
static CUresult call_ctx_v2(void *a)
{
    struct ctx_args *x = a;
    return REAL(cuCtxCreate_v2)(x->pctx, x->flags, x->dev);
}
static CUresult call_ctx_v3(void *a)
{
    struct ctx_args *x = a;
    return REAL(cuCtxCreate_v3)(x->pctx, x->params, x->n, x->flags, x->dev);
}
static CUresult call_ctx_v4(void *a)
{
    struct ctx_args *x = a;
    return REAL(cuCtxCreate_v4)(x->pctx, x->params, x->flags, x->dev);
}

TS_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    if (!cuda_enter())
        return REAL(cuCtxCreate_v2) ? REAL(cuCtxCreate_v2)(pctx, flags, dev) : CUDA_ERROR_NOT_FOUND;
    struct ctx_args a = {pctx, NULL, 0, flags, dev};
    return ctx_create_common(dev, call_ctx_v2, &a, pctx);
}

TS_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                  unsigned int flags, CUdevice dev)
{
    if (!cuda_enter())
        return REAL(cuCtxCreate_v3) ? REAL(cuCtxCreate_v3)(pctx, paramsArray, numParams, flags, dev)
                                    : CUDA_ERROR_NOT_FOUND;
    struct ctx_args a = {pctx, paramsArray, numParams, flags, dev};
    return ctx_create_common(dev, call_ctx_v3, &a, pctx);
}

TS_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                  CUdevice dev)
{
    if (!cuda_enter())
        return REAL(cuCtxCreate_v4) ? REAL(cuCtxCreate_v4)(pctx, params, flags, dev)
                                    : CUDA_ERROR_NOT_FOUND;
    struct ctx_args a = {pctx, params, 0, flags, dev};
    return ctx_create_common(dev, call_ctx_v4, &a, pctx);
}

TS_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    if (!cuda_enter() || !REAL(cuCtxDestroy_v2))
        return REAL(cuCtxDestroy_v2) ? REAL(cuCtxDestroy_v2)(ctx) : CUDA_ERROR_NOT_FOUND;
    RELEASE(TS_KIND_CTX, (uintptr_t)ctx, REAL(cuCtxDestroy_v2)(ctx));
}

TS_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    if (!cuda_enter() || dev < 0 || dev >= MAX_ORDINALS)
        return REAL(cuDevicePrimaryCtxRetain) ? REAL(cuDevicePrimaryCtxRetain)(pctx, dev)
                                              : CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&G.ctx_mu);
    int g = -1, c = 0;
    if (G.primary_refs[dev] == 0)
        c = charge_dev(dev, G.lim.context_overhead, 1, &g, "primary context");
    CUresult r;
    if (c < 0) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        r = REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
        if (r == CUDA_SUCCESS)
            G.primary_refs[dev]++;
        else if (c > 0)
            credit(g, G.lim.context_overhead, 1);
    }
    pthread_mutex_unlock(&G.ctx_mu);
    return r;
}

static void primary_drop(CUdevice dev, int all)
{
    pthread_mutex_lock(&G.ctx_mu);
    if (G.primary_refs[dev] > 0) {
        G.primary_refs[dev] = all ? 0 : G.primary_refs[dev] - 1;
        if (G.primary_refs[dev] == 0) {
            dev_info d = get_dev(dev);
            credit(d.g, G.lim.context_overhead, 1);
        }
    }
    pthread_mutex_unlock(&G.ctx_mu);
}

TS_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    int active = cuda_enter();
    CUresult r = REAL(cuDevicePrimaryCtxRelease_v2) ? REAL(cuDevicePrimaryCtxRelease_v2)(dev)
                                                    : CUDA_ERROR_NOT_FOUND;
    if (r == CUDA_SUCCESS && active && dev >= 0 && dev < MAX_ORDINALS && !G.closed)
        primary_drop(dev, 0);
    return r;
}

TS_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    int active = cuda_enter();
    CUresult r = REAL(cuDevicePrimaryCtxReset_v2) ? REAL(cuDevicePrimaryCtxReset_v2)(dev)
                                                  : CUDA_ERROR_NOT_FOUND;
    if (r == CUDA_SUCCESS && active && dev >= 0 && dev < MAX_ORDINALS && !G.closed)
        primary_drop(dev, 1);
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* launches: paced to the compute share                                                      */

/* 1 and the GPU entry/cores when launches on the current device must be paced. */
static int pace_target(int *g, uint32_t *cores)
{
    if (TS_LIKELY(!G.pacing) || G.closed)
        return 0;
    CUdevice dev;
    if (current_dev(&dev) != 0)
        return 0;
    dev_info d = get_dev(dev);
    if (d.g < 0 || d.cores == 0 || d.cores >= 100)
        return 0;
    *g = d.g;
    *cores = d.cores;
    return 1;
}

static uint64_t grid_key(CUfunction f, unsigned gx, unsigned gy, unsigned gz)
{
    uint64_t blocks = (uint64_t)gx * gy * gz;
    return (uint64_t)(uintptr_t)f ^ (blocks * 0x9E3779B97F4A7C15ULL);
}

struct launch_args {
    CUresult (*fn)();
    CUfunction f;
    unsigned gx, gy, gz, bx, by, bz, shm;
    CUstream s;
    void **params, **extra;
    const CUlaunchConfig *cfg;
    CUgraphExec graph;
};

static CUresult thunk_kernel(void *p)
{
    struct launch_args *a = p;
    CUresult (*fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                   unsigned, CUstream, void **, void **) = (void *)a->fn;
    return fn(a->f, a->gx, a->gy, a->gz, a->bx, a->by, a->bz, a->shm, a->s, a->params, a->extra);
}

static CUresult thunk_coop(void *p)
{
    struct launch_args *a = p;
    CUresult (*fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                   unsigned, CUstream, void **) = (void *)a->fn;
    return fn(a->f, a->gx, a->gy, a->gz, a->bx, a->by, a->bz, a->shm, a->s, a->params);
}

static CUresult thunk_ex(void *p)
{
    struct launch_args *a = p;
    CUresult (*fn)(const CUlaunchConfig *, CUfunction, void **, void **) = (void *)a->fn;
    return fn(a->cfg, a->f, a->params, a->extra);
}

static CUresult thunk_graph(void *p)
{
    struct launch_args *a = p;
    CUresult (*fn)(CUgraphExec, CUstream) = (void *)a->fn;
    return fn(a->graph, a->s);
}

#define KERNEL_LAUNCH(sym)                                                                      \
    TS_EXPORT CUresult sym(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,     \
                           unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm, \
                           CUstream s, void **params, void **extra)                             \
    {                                                                                           \
        cuda_init();                                                                            \
        if (!REAL(sym))                                                                         \
            return CUDA_ERROR_NOT_FOUND;                                                        \
        int g;                                                                                  \
        uint32_t cores;                                                                         \
        if (TS_LIKELY(core_init() != ST_ACTIVE || !pace_target(&g, &cores)))                    \
            return REAL(sym)(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);                 \
        struct launch_args a = {(CUresult(*)())REAL(sym), f, gx, gy, gz, bx, by, bz, shm, s,    \
                                params, extra, NULL, NULL};                                     \
        return ts_pace_launch(g, cores, grid_key(f, gx, gy, gz), s, thunk_kernel, &a);          \
    }
KERNEL_LAUNCH(cuLaunchKernel)
KERNEL_LAUNCH(cuLaunchKernel_ptsz)

#define COOP_LAUNCH(sym)                                                                        \
    TS_EXPORT CUresult sym(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,     \
                           unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm, \
                           CUstream s, void **params)                                           \
    {                                                                                           \
        cuda_init();                                                                            \
        if (!REAL(sym))                                                                         \
            return CUDA_ERROR_NOT_FOUND;                                                        \
        int g;                                                                                  \
        uint32_t cores;                                                                         \
        if (TS_LIKELY(core_init() != ST_ACTIVE || !pace_target(&g, &cores)))                    \
            return REAL(sym)(f, gx, gy, gz, bx, by, bz, shm, s, params);                        \
        struct launch_args a = {(CUresult(*)())REAL(sym), f, gx, gy, gz, bx, by, bz, shm, s,    \
                                params, NULL, NULL, NULL};                                      \
        return ts_pace_launch(g, cores, grid_key(f, gx, gy, gz), s, thunk_coop, &a);            \
    }
COOP_LAUNCH(cuLaunchCooperativeKernel)
COOP_LAUNCH(cuLaunchCooperativeKernel_ptsz)

#define EX_LAUNCH(sym)                                                                          \
    TS_EXPORT CUresult sym(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) \
    {                                                                                           \
        cuda_init();                                                                            \
        if (!REAL(sym))                                                                         \
            return CUDA_ERROR_NOT_FOUND;                                                        \
        int g;                                                                                  \
        uint32_t cores;                                                                         \
        if (TS_LIKELY(!cfg || core_init() != ST_ACTIVE || !pace_target(&g, &cores)))            \
            return REAL(sym)(cfg, f, params, extra);                                            \
        struct launch_args a = {(CUresult(*)())REAL(sym), f, 0, 0, 0, 0, 0, 0, 0, cfg->hStream, \
                                params, extra, cfg, NULL};                                      \
        return ts_pace_launch(g, cores, grid_key(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ), \
                              cfg->hStream, thunk_ex, &a);                                      \
    }
EX_LAUNCH(cuLaunchKernelEx)
EX_LAUNCH(cuLaunchKernelEx_ptsz)

#define GRAPH_LAUNCH(sym)                                                                     \
    TS_EXPORT CUresult sym(CUgraphExec graph, CUstream s)                                     \
    {                                                                                         \
        cuda_init();                                                                          \
        if (!REAL(sym))                                                                       \
            return CUDA_ERROR_NOT_FOUND;                                                      \
        int g;                                                                                \
        uint32_t cores;                                                                       \
        if (TS_LIKELY(core_init() != ST_ACTIVE || !pace_target(&g, &cores)))                  \
            return REAL(sym)(graph, s);                                                       \
        struct launch_args a = {(CUresult(*)())REAL(sym), NULL, 0, 0, 0, 0, 0, 0, 0, s, NULL,  \
                                NULL, NULL, graph};                                           \
        return ts_pace_launch(g, cores, (uint64_t)(uintptr_t)graph, s, thunk_graph, &a);      \
    }
GRAPH_LAUNCH(cuGraphLaunch)
GRAPH_LAUNCH(cuGraphLaunch_ptsz)

/* ---------------------------------------------------------------------------------------- */
/* cuGetProcAddress                                                                          */

static void *hook_for_proc(const char *symbol, void *p, int version, cuuint64_t flags)
{
    if (!p || !symbol)
        return p;
    for (int i = 0; i < H_CUDA_COUNT; i++)
        if (g_cuda_hooks[i].real == p)
            return g_cuda_hooks[i].hook;
    /* Address not one of the exported entry points: choose by name, version and flag the
     * variant that cuda.h would have bound, as the driver does. */
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1;
    for (int pass = 0; pass < 2 && best < 0; pass++) {
        int ptsz = pass == 0 ? want_ptsz : 0;
        for (int i = 0; i < H_CUDA_COUNT; i++) {
            const hook_entry *h = &g_cuda_hooks[i];
            if (strcmp(h->base, symbol) != 0 || h->ptsz != ptsz || h->min_version > version ||
                !h->real)
                continue;
            if (best < 0 || h->min_version > g_cuda_hooks[best].min_version)
                best = i;
        }
    }
    if (best >= 0) {
        ts_log(TS_DEBUG, "cuGetProcAddress(%s, %d): unknown address, using %s", symbol, version,
               g_cuda_hooks[best].name);
        return g_cuda_hooks[best].hook;
    }
    return p;
}

TS_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags)
{
    cuda_init();
    if (!REAL(cuGetProcAddress))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuGetProcAddress)(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = hook_for_proc(symbol, *pfn, cudaVersion, flags);
    return r;
}

TS_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    cuda_init();
    if (!REAL(cuGetProcAddress_v2))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, status);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = hook_for_proc(symbol, *pfn, cudaVersion, flags);
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* NVML                                                                                      */

/* Region entry and limit of an NVML device handle (keyed by UUID; NVML ignores
 * CUDA_VISIBLE_DEVICES and enumerates every GPU of the node that the container can see). */
static int nvml_dev(nvmlDevice_t h, uint64_t *limit)
{
    pthread_mutex_lock(&G.mu);
    for (int i = 0; i < G.nvml_n; i++) {
        if (G.nvml_dev[i].h == h) {
            int g = G.nvml_dev[i].g;
            *limit = G.nvml_dev[i].limit;
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
    if (G.nvml_n < MAX_ORDINALS) {
        G.nvml_dev[G.nvml_n].h = h;
        G.nvml_dev[G.nvml_n].g = g;
        G.nvml_dev[G.nvml_n].limit = *limit;
        G.nvml_n++;
    }
    pthread_mutex_unlock(&G.mu);
    return g;
}

static void nvml_view(nvmlDevice_t h, unsigned long long *total, unsigned long long *free_b,
                      unsigned long long *used)
{
    if (core_init() != ST_ACTIVE)
        return;
    if (G.closed) {
        *free_b = 0;
        return;
    }
    uint64_t limit;
    int g = nvml_dev(h, &limit);
    if (g < 0)
        return;
    uint64_t t = limit < *total ? limit : *total;
    uint64_t u = ts_region_usage(&G.region, g, 1);
    *total = t;
    *used = u;
    *free_b = u >= t ? 0 : t - u;
}

TS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvml_init();
    if (!REAL_NVML(nvmlDeviceGetMemoryInfo))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = REAL_NVML(nvmlDeviceGetMemoryInfo)(device, memory);
    if (r == NVML_SUCCESS && memory)
        nvml_view(device, &memory->total, &memory->free, &memory->used);
    return r;
}

TS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    nvml_init();
    if (!REAL_NVML(nvmlDeviceGetMemoryInfo_v2))
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = REAL_NVML(nvmlDeviceGetMemoryInfo_v2)(device, memory);
    if (r == NVML_SUCCESS && memory && core_init() == ST_ACTIVE) {
        unsigned long long before = memory->used;
        nvml_view(device, &memory->total, &memory->free, &memory->used);
        if (memory->used != before)
            memory->reserved = 0; /* the limit view has no driver-reserved part */
    }
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* dlsym                                                                                     */

TS_NOSAN static void *hook_by_name(const char *name)
{
    if (name[0] == 'c' && name[1] == 'u') {
        for (int i = 0; i < H_CUDA_COUNT; i++)
            if (ts_streq(g_cuda_hooks[i].name, name))
                return g_cuda_hooks[i].hook;
    } else if (name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l') {
        for (size_t i = 0; i < sizeof(g_nvml_hooks) / sizeof(g_nvml_hooks[0]); i++)
            if (ts_streq(g_nvml_hooks[i].name, name))
                return g_nvml_hooks[i].hook;
    }
    return NULL;
}

TS_NOSAN static void *dlsym_next(void *handle, const char *name) __attribute__((noinline));

/* RTLD_NEXT is relative to the caller's object, which glibc finds from the return address:
 * forward with a sibling call so that the return address is still the application's. */
TS_NOSAN __attribute__((optimize("optimize-sibling-calls"))) TS_EXPORT void *dlsym(void *handle,
                                                                          const char *name)
{
    if (handle == RTLD_NEXT)
        return real_dlsym()(handle, name);
    return dlsym_next(handle, name);
}

TS_NOSAN static void *dlsym_next(void *handle, const char *name)
{
    void *r = real_dlsym()(handle, name);
    if (r && name) {
        void *h = hook_by_name(name);
        if (h)
            return h;
    }
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* process lifetime                                                                          */

static void after_fork_child(void)
{
    /* The child must not charge the parent's slot: forget it and start again lazily. */
    if (G.region.hdr && G.region.fd >= 0)
        ts_region_forget(&G.region);
    pthread_mutex_init(&G.mu, NULL);
    pthread_mutex_init(&G.ctx_mu, NULL);
    pthread_mutex_init(&G.table.mu, NULL);
    free(G.table.e);
    G.table.e = NULL;
    G.table.cap = G.table.n = 0;
    memset(G.dev, 0, sizeof(G.dev));
    memset(G.primary_refs, 0, sizeof(G.primary_refs));
    G.nvml_n = 0;
    G.closed = 0;
    G.pacing = 0;
    ts_pacer_forget();
    __atomic_store_n(&G.state, ST_UNINIT, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void ts_ctor(void)
{
    real_dlsym();
    pthread_atfork(NULL, NULL, after_fork_child);
}

__attribute__((destructor)) static void ts_dtor(void)
{
    /* Give the slot back; later calls (other threads, atexit handlers) pass straight through
     * and the mapping stays valid for any that are already inside a hook. */
    if (__atomic_load_n(&G.state, __ATOMIC_ACQUIRE) == ST_ACTIVE) {
        __atomic_store_n(&G.state, ST_CLOSED, __ATOMIC_RELEASE);
        if (G.region.hdr && G.region.fd >= 0)
            ts_region_leave(&G.region);
    }
}
