/*
 * libtessera-enforce's core: process state, the limits, the real CUDA and NVML entry points,
 * devices and contexts, and charging (the usage region through ts_charge_*). It knows the names
 * of the hooked entry points (hook_list.h) but not the functions serving them, nor any feature
 * (core.h says the layers).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

#ifdef TESSERA_LIMITS_PATH_OVERRIDE /* test builds only */
#define LIMITS_PATH TESSERA_LIMITS_PATH_OVERRIDE
#else
#define LIMITS_PATH TESSERA_LIMITS_PATH
#endif
#ifdef TESSERA_LIMITS_OWNER_OVERRIDE /* test builds only: the owner the fixed file must have */
#define LIMITS_OWNER ((uid_t)TESSERA_LIMITS_OWNER_OVERRIDE)
#else
#define LIMITS_OWNER ((uid_t)0)
#endif

/* ---------------------------------------------------------------------------------------- */
/* the hooked entry points and the driver's                                                 */

hook_entry ts_hooks[] = {
#define X(sym, base, ver, ptsz) {#sym, base, ver, ptsz, NULL},
#define A(sym, base, ver, ptsz)
    TS_CUDA_HOOKS(X, A)
#undef X
#undef A
};

ts_nvml_hook ts_nvml_hooks[] = {
#define X(sym) {#sym, NULL},
    TS_NVML_HOOKS(X)
#undef X
    {NULL, NULL},
};

ts_real R;

/* ---------------------------------------------------------------------------------------- */
/* process state                                                                             */

ts_state G = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
};


tessera_region_header *ts_region_hdr(void) { return G.region.hdr; }

static void fail_closed(const char *what, const char *why)
{
    ts_log(TS_ERR, "%.1024s%s%.1024s; refusing GPU memory", what, why ? ": " : "", why ? why : "");
    G.closed = 1;
    G.state = ST_ACTIVE;
}

/*
 * The fixed limits path. Returns 0 when nothing is there (the path or one of its directories
 * does not exist), 1 with *fd open on it when it is a regular file owned by root and not
 * writable by group or others, and -1 (message in err) for anything else: a symbolic link
 * anywhere on the path (dangling or not), a directory, a device or FIFO, another owner, a
 * writable mode, a file that cannot be opened. Only the first case lets the environment choose
 * the limits; every other one fails closed.
 */
static int open_fixed_limits(const char *path, int *fd, char *err, size_t errlen)
{
    char prefix[TESSERA_LIMITS_MAX_PATH + 1];
    size_t n = strlen(path);
    if (n == 0 || n > TESSERA_LIMITS_MAX_PATH || path[0] != '/') {
        snprintf(err, errlen, "%.1024s: not an absolute path", path);
        return -1;
    }
    for (size_t i = 1; i < n; i++) {
        if (path[i] != '/')
            continue;
        memcpy(prefix, path, i);
        prefix[i] = '\0';
        struct stat st;
        if (lstat(prefix, &st) != 0) {
            if (errno == ENOENT)
                return 0;
            snprintf(err, errlen, "%.1024s: %s", prefix, strerror(errno));
            return -1;
        }
        if (S_ISLNK(st.st_mode)) {
            snprintf(err, errlen, "%.1024s is a symbolic link", prefix);
            return -1;
        }
        if (!S_ISDIR(st.st_mode)) {
            snprintf(err, errlen, "%.1024s is not a directory", prefix);
            return -1;
        }
    }
    int f = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (f < 0) {
        if (errno == ENOENT)
            return 0;
        if (errno == ELOOP)
            snprintf(err, errlen, "%.1024s is a symbolic link", path);
        else
            snprintf(err, errlen, "%.1024s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    const char *bad = NULL;
    if (fstat(f, &st) != 0)
        bad = strerror(errno);
    else if (!S_ISREG(st.st_mode))
        bad = "not a regular file";
    else if (st.st_uid != LIMITS_OWNER)
        bad = "not owned by root";
    else if (st.st_mode & (S_IWGRP | S_IWOTH))
        bad = "writable by group or others";
    if (bad) {
        snprintf(err, errlen, "%.1024s: %s", path, bad);
        close(f);
        return -1;
    }
    *fd = f;
    return 1;
}

/* Read the limits: the fixed path wins; the environment is only a fallback when nothing is at
 * the fixed path (outside Kubernetes). */
static void load_limits_locked(void)
{
    char err[2200];
    const char *path = LIMITS_PATH;
    int fd = -1;
    int fixed = open_fixed_limits(path, &fd, err, sizeof(err));
    if (fixed < 0) {
        fail_closed(err, NULL);
        return;
    }
    int rc;
    if (fixed == 1) {
        rc = tessera_limits_load_fd(fd, path, &G.lim, err, sizeof(err));
        close(fd);
    } else {
        path = getenv(TESSERA_LIMITS_ENV);
        if (!path || !*path) {
            G.state = ST_INERT;
            return;
        }
        rc = tessera_limits_load(path, &G.lim, err, sizeof(err));
    }
    if (rc != 0) {
        fail_closed(path, err);
        return;
    }
    if (ts_region_open(&G.region, G.lim.region, G.lim.context_overhead, err, sizeof(err)) != 0) {
        fail_closed("region", err);
        return;
    }
    for (uint32_t i = 0; i < G.lim.gpu_count; i++) {
        const tessera_limit_gpu *l = &G.lim.gpus[i];
        if (ts_region_gpu(&G.region, l->uuid, l->memory, l->cores) < 0) {
            ts_log(TS_ERR, "region %s: GPU table full; refusing GPU memory", G.lim.region);
            G.closed = 1;
        }
        if ((l->cores > 0 && l->cores < 100) || (l->cores == 0 && G.lim.shares[0]))
            G.pacing = 1; /* a share, or best effort held to what the node's shares leave */
    }
    ts_log(TS_INFO, "limits from %s: %u GPU(s), region %s slot %d", path, G.lim.gpu_count,
           G.lim.region, G.region.slot);
    G.state = ST_ACTIVE;
}

int ts_core_load(void)
{
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

int ts_active(void) { return ts_core_init() == ST_ACTIVE; }

void ts_cuda_resolve(void)
{
    pthread_mutex_lock(&G.mu);
    if (!G.cuda_ready) {
        G.libcuda = ts_real_dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!G.libcuda)
            ts_log(TS_ERR, "dlopen libcuda.so.1: %s", dlerror());
        for (int i = 0; i < H_CUDA_COUNT; i++)
            ts_hooks[i].real = G.libcuda ? ts_real_dlsym(G.libcuda, ts_hooks[i].name) : NULL;
        if (G.libcuda) {
#define L(f) *(void **)&R.f = ts_real_dlsym(G.libcuda, #f)
            L(cuDeviceGetUuid);
            L(cuDeviceGetUuid_v2);
            L(cuDeviceGetAttribute);
            L(cuCtxGetDevice);
            L(cuCtxGetCurrent);
            L(cuCtxPushCurrent_v2);
            L(cuCtxPopCurrent_v2);
            L(cuCtxGetLimit);
            L(cuStreamGetCtx);
            L(cuStreamIsCapturing);
            L(cuMemPoolGetAttribute);
            L(cuDeviceGetGraphMemAttribute);
            L(cuMemGetAllocationGranularity);
            L(cuMemGetAllocationPropertiesFromHandle);
            L(cuGraphGetNodes);
            L(cuGraphNodeGetType);
            L(cuGraphMemAllocNodeGetParams);
            L(cuGraphChildGraphNodeGetGraph);
#undef L
        }
        __atomic_store_n(&G.cuda_ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&G.mu);
}

void ts_nvml_init(void)
{
    if (TS_LIKELY(__atomic_load_n(&G.nvml_ready, __ATOMIC_ACQUIRE)))
        return;
    pthread_mutex_lock(&G.mu);
    if (!G.nvml_ready) {
        G.libnvml = ts_real_dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!G.libnvml)
            ts_log(TS_ERR, "dlopen libnvidia-ml.so.1: %s", dlerror());
        for (int i = 0; ts_nvml_hooks[i].name; i++)
            ts_nvml_hooks[i].real = G.libnvml ? ts_real_dlsym(G.libnvml, ts_nvml_hooks[i].name)
                                              : NULL;
        if (G.libnvml)
            *(void **)&R.nvmlDeviceGetUUID = ts_real_dlsym(G.libnvml, "nvmlDeviceGetUUID");
        __atomic_store_n(&G.nvml_ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&G.mu);
}

void *ts_real_cuda(const char *name)
{
    ts_cuda_init();
    return G.libcuda ? ts_real_dlsym(G.libcuda, name) : NULL;
}

void *ts_real_nvml(const char *name)
{
    ts_nvml_init();
    return G.libnvml ? ts_real_dlsym(G.libnvml, name) : NULL;
}

int ts_cuda_enter(void)
{
    ts_cuda_init();
    return ts_core_init() == ST_ACTIVE;
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
/* UUIDs of the devices ts_dev found uncovered, and whether that was logged. */
static char g_uncovered_uuid[MAX_ORDINALS][TESSERA_UUID_STR_LEN];
static int g_uncovered_logged[MAX_ORDINALS];

dev_info ts_dev(CUdevice dev)
{
    dev_info none = {.resolved = 1, .g = -1, .lim = -1};
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
            v.policy = G.lim.gpus[i].policy;
            v.lim = (int)i;
            break;
        }
    }
    if (v.limit == 0 && G.lim.gpu_count > 0) {
        /* Not limited: the claim's whole devices are listed as unlimited; any other GPU is not
         * this claim's (another claim's, whose limits file the container does not see). */
        v.uncovered = 1;
        for (uint32_t i = 0; i < G.lim.unlimited_count; i++)
            if (tessera_uuid_equal(G.lim.unlimited[i], s))
                v.uncovered = 0;
    }
    ts_log(TS_DEBUG, "device %d is %s: entry %d limit %llu cores %u%s", dev, s, v.g,
           (unsigned long long)v.limit, v.cores, v.uncovered ? " (not the claim's)" : "");
    pthread_mutex_lock(&G.mu);
    if (!d->resolved) {
        d->g = v.g;
        d->limit = v.limit;
        d->cores = v.cores;
        d->policy = v.policy;
        d->lim = v.lim;
        d->uncovered = v.uncovered;
        if (v.uncovered)
            memcpy(g_uncovered_uuid[dev], s, sizeof(s));
        __atomic_store_n(&d->resolved, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&G.mu);
    return v;
}

uint64_t ts_limit_of(int g)
{
    if (g < 0 || !G.region.hdr || g >= TESSERA_REGION_MAX_GPUS)
        return 0;
    for (uint32_t i = 0; i < G.lim.gpu_count; i++)
        if (tessera_uuid_equal(G.lim.gpus[i].uuid, G.region.hdr->gpus[g].uuid))
            return G.lim.gpus[i].memory;
    return 0;
}

/* The device of the last context each thread saw (a context's device never changes; the
 * cache is dropped whenever a context is destroyed, so that a new context at the same address
 * is asked again). One driver call per lookup, the current context, which the allocation
 * records anyway. */
static uint64_t g_ctx_gen;
static __thread __attribute__((tls_model("initial-exec"))) struct {
    CUcontext ctx;
    CUdevice dev;
    uint64_t gen;
} t_dev;

void ts_contexts_changed(void) { __atomic_add_fetch(&g_ctx_gen, 1, __ATOMIC_ACQ_REL); }

int ts_current(CUdevice *dev, CUcontext *ctx_out)
{
    CUcontext c = NULL;
    if (R.cuCtxGetCurrent && R.cuCtxGetCurrent(&c) == CUDA_SUCCESS && c) {
        uint64_t gen = __atomic_load_n(&g_ctx_gen, __ATOMIC_ACQUIRE);
        if (c == t_dev.ctx && gen == t_dev.gen) {
            *dev = t_dev.dev;
        } else {
            if (!R.cuCtxGetDevice || R.cuCtxGetDevice(dev) != CUDA_SUCCESS)
                return -1;
            t_dev.ctx = c;
            t_dev.dev = *dev;
            t_dev.gen = gen;
        }
        if (ctx_out)
            *ctx_out = c;
        return 0;
    }
    if (ctx_out)
        *ctx_out = NULL;
    return R.cuCtxGetDevice && R.cuCtxGetDevice(dev) == CUDA_SUCCESS ? 0 : -1;
}

int ts_current_dev(CUdevice *dev) { return ts_current(dev, NULL); }

CUcontext ts_current_ctx(void)
{
    CUcontext c = NULL;
    if (R.cuCtxGetCurrent)
        R.cuCtxGetCurrent(&c);
    return c;
}

static int default_stream(CUstream s)
{
    return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

CUcontext ts_stream_ctx(CUstream s)
{
    CUcontext c = NULL;
    if (default_stream(s) || !R.cuStreamGetCtx || R.cuStreamGetCtx(s, &c) != CUDA_SUCCESS || !c)
        return ts_current_ctx();
    return c;
}

int ts_stream_dev(CUstream s, CUdevice *dev)
{
    if (default_stream(s) || !R.cuStreamGetCtx)
        return ts_current_dev(dev);
    CUcontext sc = NULL, cur = NULL;
    if (R.cuStreamGetCtx(s, &sc) != CUDA_SUCCESS || sc == NULL)
        return ts_current_dev(dev);
    if (R.cuCtxGetCurrent && R.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == sc)
        return ts_current_dev(dev);
    if (!R.cuCtxPushCurrent_v2 || R.cuCtxPushCurrent_v2(sc) != CUDA_SUCCESS)
        return ts_current_dev(dev);
    int rc = ts_current_dev(dev);
    CUcontext popped;
    R.cuCtxPopCurrent_v2(&popped);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* charging                                                                                  */

/* ---- the driver's per-process figure, reconciled by the node ------------------------------
 * The node driver, which sees host pids and NVML's per-process used memory, writes per GPU of
 * the claim what the claim's processes hold beyond their charges (contexts, modules,
 * __device__ globals and local memory larger than context-overhead, the slack of shared pages)
 * and the host pid of each live slot into <region's directory>/driver/usage, a directory only
 * it writes and the claim's containers mount read-only (tessera.enforcement.reconcile writes
 * it; this is its one reader):
 *     version 2
 *     gpu <UUID> unaccounted <bytes>
 *     pid <slot index> <slot generation> <pid in the slot's namespace> <host pid>
 * The unaccounted bytes are held back from the claim's limit at every charge and counted as
 * used by the queries; the pid lines (version 2 and later) let the pacer find the claim's
 * processes in NVML's per-process utilisation when they live in a pid namespace of their own.
 * Read again at most once a second; a missing or unreadable file counts 0 and maps no pid. */
#define DRV_USAGE_MAX (64 * 1024)
static struct {
    pthread_mutex_t mu;
    uint64_t read_at; /* ts_now_ns() of the last reading, 0 never */
    uint64_t extra[TESSERA_REGION_MAX_GPUS];
    uint64_t gen[TESSERA_REGION_MAX_SLOTS]; /* the mapped slot's generation, 0 none */
    int32_t ns_pid[TESSERA_REGION_MAX_SLOTS];
    uint32_t host_pid[TESSERA_REGION_MAX_SLOTS];
    char buf[DRV_USAGE_MAX + 1];
} g_drv = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* g_drv.mu held */
static void driver_usage_read(void)
{
    uint64_t extra[TESSERA_REGION_MAX_GPUS] = {0};
    char path[TESSERA_LIMITS_MAX_PATH + 32];
    const char *slash = strrchr(G.lim.region, '/');
    size_t dir = slash ? (size_t)(slash - G.lim.region) : 0;
    int fd = -1;
    if (dir + sizeof("/driver/usage") <= sizeof(path)) {
        memcpy(path, G.lim.region, dir);
        memcpy(path + dir, "/driver/usage", sizeof("/driver/usage"));
        fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    }
    struct stat st;
    char *buf = g_drv.buf;
    size_t n = 0;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
        while (n < DRV_USAGE_MAX) {
            ssize_t r = read(fd, buf + n, DRV_USAGE_MAX - n);
            if (r <= 0)
                break;
            n += (size_t)r;
        }
    if (fd >= 0)
        close(fd);
    buf[n] = '\0';
    memset(g_drv.gen, 0, sizeof(g_drv.gen));
    unsigned version = 0;
    for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char uuid[65];
        unsigned long long bytes, gen;
        unsigned slot, hp;
        int nsp;
        if (sscanf(line, "version %u", &version) == 1)
            continue;
        if (version >= 2 &&
            sscanf(line, "pid %u %llu %d %u", &slot, &gen, &nsp, &hp) == 4 &&
            slot < TESSERA_REGION_MAX_SLOTS && gen && hp) {
            g_drv.gen[slot] = gen;
            g_drv.ns_pid[slot] = nsp;
            g_drv.host_pid[slot] = hp;
            continue;
        }
        if (sscanf(line, "gpu %64s unaccounted %llu", uuid, &bytes) != 2)
            continue;
        for (int g = 0; G.region.hdr && g < TESSERA_REGION_MAX_GPUS; g++)
            if (tessera_uuid_equal(uuid, G.region.hdr->gpus[g].uuid))
                extra[g] = bytes;
    }
    memcpy(g_drv.extra, extra, sizeof(extra));
}

/* g_drv.mu held: the file read at most once a second */
static void driver_usage_fresh(void)
{
    uint64_t now = ts_now_ns();
    if (!g_drv.read_at || now - g_drv.read_at >= 1000000000ull) {
        driver_usage_read();
        g_drv.read_at = now;
    }
}

uint32_t ts_driver_host_pid(uint32_t slot, uint64_t generation, int32_t ns_pid)
{
    if (slot >= TESSERA_REGION_MAX_SLOTS || !generation)
        return 0;
    pthread_mutex_lock(&g_drv.mu);
    driver_usage_fresh();
    uint32_t hp = g_drv.gen[slot] == generation && g_drv.ns_pid[slot] == ns_pid
                      ? g_drv.host_pid[slot]
                      : 0;
    pthread_mutex_unlock(&g_drv.mu);
    return hp;
}

uint64_t ts_driver_extra(int g)
{
    if (g < 0 || g >= TESSERA_REGION_MAX_GPUS)
        return 0;
    pthread_mutex_lock(&g_drv.mu);
    driver_usage_fresh();
    uint64_t e = g_drv.extra[g];
    pthread_mutex_unlock(&g_drv.mu);
    return e;
}

/* What gives memory back before a charge is refused (ts_set_reclaimer); NULL: nothing yet. */
static ts_reclaim_fn g_reclaimer;

void ts_set_reclaimer(ts_reclaim_fn fn)
{
    if (__atomic_load_n(&g_reclaimer, __ATOMIC_RELAXED) != fn)
        __atomic_store_n(&g_reclaimer, fn, __ATOMIC_RELEASE);
}

static uint64_t reclaim(int g)
{
    ts_reclaim_fn f = __atomic_load_n(&g_reclaimer, __ATOMIC_ACQUIRE);
    return f ? f(g) : 0;
}

int ts_charge_g(int g, uint64_t bytes, uint32_t nctx, uint64_t limit, const char *what)
{
    uint64_t extra = ts_driver_extra(g);
    limit = limit > extra ? limit - extra : 0;
    if (ts_region_charge(&G.region, g, bytes, nctx, limit) == 0)
        return 0;
    /* Before refusing: pools and graph pools may have released memory the claim still pays
     * for (a synchronize in another thread, a trim); bring their charges to the driver's
     * figures and try once more. */
    if (reclaim(g) > 0 && ts_region_charge(&G.region, g, bytes, nctx, limit) == 0)
        return 0;
    ts_log(TS_WARN, "%s of %llu bytes refused: claim uses %llu of %llu", what,
           (unsigned long long)bytes, (unsigned long long)ts_region_usage(&G.region, g, 0),
           (unsigned long long)limit);
    return -1;
}

int ts_refuse_uncovered(CUdevice dev, const char *what)
{
    if (dev >= 0 && dev < MAX_ORDINALS && !__atomic_exchange_n(&g_uncovered_logged[dev], 1,
                                                                 __ATOMIC_ACQ_REL))
        ts_log(TS_ERR,
               "%s on GPU %s refused: the GPU is visible but not in this container's limits "
               "file (claim %s): this container has more than one Tessera claim; use one claim "
               "with several requests, or one claim per container",
               what, g_uncovered_uuid[dev], G.lim.claim[0] ? G.lim.claim : "not named");
    return -2;
}

int ts_charge_dev(CUdevice dev, uint64_t bytes, uint32_t nctx, int *g_out, const char *what)
{
    *g_out = -1;
    if (G.closed)
        return -1;
    dev_info d = ts_dev(dev);
    *g_out = d.g;
    if (d.uncovered)
        return ts_refuse_uncovered(dev, what);
    if (d.g < 0)
        return 0;
    return ts_charge_g(d.g, bytes, nctx, d.limit, what) == 0 ? 1 : -1;
}

void ts_credit(int g, uint64_t bytes, uint32_t nctx)
{
    if (g >= 0 && (bytes || nctx))
        ts_region_credit(&G.region, g, bytes, nctx);
}

/* ---------------------------------------------------------------------------------------- */
/* process lifetime                                                                          */

void ts_core_forget(void)
{
    /* The child must not charge the parent's slot: forget it and start again lazily. */
    if (G.region.hdr && G.region.fd >= 0)
        ts_region_forget(&G.region);
    pthread_mutex_init(&G.mu, NULL);
    memset(G.dev, 0, sizeof(G.dev));
    G.closed = 0;
    G.pacing = 0;
    ts_allocs_forget();
    pthread_mutex_init(&g_drv.mu, NULL); /* a thread of the parent may have held it */
    g_drv.read_at = 0;
    __atomic_store_n(&G.state, ST_UNINIT, __ATOMIC_RELEASE);
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
