/*
 * The core of libtessera-enforce (not installed): what every other file builds on, knowing
 * nothing of the features above it.
 *
 * The library has three layers; a file calls only into its own layer or the ones below
 * (make -C native check, tools/c_layers.py, computes the file graph from the objects and fails
 * on a cycle or an upward edge):
 *   core      log.c (logging, clock), limits.c (the limits file), region.c (the usage region),
 *             alloc.c (the table of live allocations), resolve.c (the real dlsym / dlopen),
 *             core.c (process state, the real CUDA / NVML entry points, devices, contexts,
 *             charging); interfaces in this header;
 *   features  mem.c, vmm.c, pool.c (memory enforcement), query.c (memory queries), pacer.c and
 *             launch.c (launch pacing); interfaces in feature.h;
 *   interposition
 *             hooks.c (which function serves each hooked name, cuGetProcAddress, fork) and
 *             loader.c (dlsym, dlopen, dlmopen); interfaces in hooks.h.
 * The one call from the core up, reclaiming memory before a charge is refused, goes through a
 * pointer a feature sets (ts_set_reclaimer, below).
 */
#ifndef TESSERA_CORE_H
#define TESSERA_CORE_H

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>

#include "alloc_table.h"
#include "hook_list.h"
#include "tessera_cuda.h"
#include "tessera_limits.h"
#include "tessera_region.h"

#define TS_HIDDEN __attribute__((visibility("hidden")))
#define TS_EXPORT __attribute__((visibility("default")))
#define TS_LIKELY(x) __builtin_expect(!!(x), 1)
#define TS_UNLIKELY(x) __builtin_expect(!!(x), 0)
/* dlsym can be called before any constructor runs, by a sanitizer runtime initialising
 * itself, so the code on the dlsym/dlopen path is never instrumented and calls no libc string
 * functions. */
#define TS_NOSAN __attribute__((no_sanitize("address", "undefined")))

/* ---- logging (log.c; stderr, "tessera: "), level from TESSERA_LOG_LEVEL (0 error .. 3 debug) */
TS_HIDDEN void ts_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define TS_ERR 0
#define TS_WARN 1
#define TS_INFO 2
#define TS_DEBUG 3
/* Refuse a call: log why on stderr once per call site and return CUDA_ERROR_NOT_SUPPORTED. */
TS_HIDDEN CUresult ts_refuse(const char *what, const char *why);
TS_HIDDEN uint64_t ts_now_ns(void);

/* ---- region (region.c) ---------------------------------------------------------------- */
typedef struct ts_region {
    int fd;
    tessera_region_header *hdr;
    tessera_region_slot *slots;
    int slot; /* our slot index, -1 if none */
    uint64_t generation; /* the slot's generation when we claimed it */
    pthread_mutex_t mu; /* serialises this process's threads around the OFD region lock */
    char path[TESSERA_LIMITS_MAX_PATH + 1];
    /* What this process holds per GPU entry, kept outside the shared file: if the slot is ever
     * found taken from a live owner (its record overwritten), the usage is charged again. */
    uint64_t mine[TESSERA_REGION_MAX_GPUS];
    uint32_t mine_ctx[TESSERA_REGION_MAX_GPUS];
} ts_region;

/* Open (creating and initialising if new) the region at path and claim a slot. */
TS_HIDDEN int ts_region_open(ts_region *r, const char *path, uint64_t context_overhead,
                             char *err, size_t errlen);
/* Index of uuid in the region's GPU table, adding it (with limit/cores) if absent; -1 if full. */
TS_HIDDEN int ts_region_gpu(ts_region *r, const char *uuid, uint64_t limit, uint32_t cores);
/* Charge bytes (and ncontexts) on gpu entry g if the claim's usage stays <= limit.
 * Reclaims dead slots before giving up. Returns 0 on success, -1 if over the limit. */
TS_HIDDEN int ts_region_charge(ts_region *r, int g, uint64_t bytes, uint32_t ncontexts,
                               uint64_t limit);
/* Charge even past the limit: memory the driver already holds (a graph launch that grew its
 * pool more than announced). The claim is over its limit until it is credited. */
TS_HIDDEN void ts_region_force(ts_region *r, int g, uint64_t bytes);
TS_HIDDEN void ts_region_credit(ts_region *r, int g, uint64_t bytes, uint32_t ncontexts);
/* Sum of used[g] over live slots (after reclaiming dead ones when reclaim != 0). */
TS_HIDDEN uint64_t ts_region_usage(ts_region *r, int g, int reclaim);
TS_HIDDEN int ts_region_reclaim(ts_region *r);
/* Give up our slot (usage returns to the claim); the mapping stays valid. */
TS_HIDDEN void ts_region_leave(ts_region *r);
/* After fork() in the child: forget the parent's mapping without touching its slot. */
TS_HIDDEN void ts_region_forget(ts_region *r);

/* ---- the hooked entry points and their real counterparts (core.c) ------------------------- */
/* Which function serves each hooked name is the interposition layer's (ts_hook_fns, hooks.h):
 * the core only knows the names and the driver's entry points. */
enum {
#define X(sym, base, ver, ptsz) H_##sym,
#define A(sym, base, ver, ptsz)
    TS_CUDA_HOOKS(X, A)
#undef X
#undef A
        H_CUDA_COUNT
};

typedef struct hook_entry {
    const char *name;
    const char *base;
    int min_version;
    int ptsz;
    void *real; /* the driver's entry point of this name (dlsym on libcuda.so.1) */
} hook_entry;

TS_HIDDEN extern hook_entry ts_hooks[];
#define REAL(sym) ((__typeof__(&sym))ts_hooks[H_##sym].real)

/* NVML hooks (TS_NVML_HOOKS); the list ends with a NULL name. */
typedef struct ts_nvml_hook {
    const char *name;
    void *real;
} ts_nvml_hook;
TS_HIDDEN extern ts_nvml_hook ts_nvml_hooks[];
enum {
#define X(sym) N_##sym,
    TS_NVML_HOOKS(X)
#undef X
        N_NVML_COUNT
};
#define REAL_NVML(sym) ((__typeof__(&sym))ts_nvml_hooks[N_##sym].real)

/* Driver entry points the library calls without interposing them. */
typedef struct ts_real {
    CUresult (*cuDeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*cuDeviceGetUuid_v2)(CUuuid *, CUdevice);
    CUresult (*cuDeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*cuCtxGetDevice)(CUdevice *);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuCtxPushCurrent_v2)(CUcontext);
    CUresult (*cuCtxPopCurrent_v2)(CUcontext *);
    CUresult (*cuCtxGetLimit)(size_t *, CUlimit);
    CUresult (*cuStreamGetCtx)(CUstream, CUcontext *);
    CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
    CUresult (*cuMemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*cuDeviceGetGraphMemAttribute)(CUdevice, CUgraphMem_attribute, void *);
    CUresult (*cuMemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *,
                                              CUmemAllocationGranularity_flags);
    CUresult (*cuMemGetAllocationPropertiesFromHandle)(CUmemAllocationProp *,
                                                       CUmemGenericAllocationHandle);
    CUresult (*cuGraphGetNodes)(CUgraph, CUgraphNode *, size_t *);
    CUresult (*cuGraphNodeGetType)(CUgraphNode, CUgraphNodeType *);
    CUresult (*cuGraphMemAllocNodeGetParams)(CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *);
    CUresult (*cuGraphChildGraphNodeGetGraph)(CUgraphNode, CUgraph *);
    nvmlReturn_t (*nvmlDeviceGetUUID)(nvmlDevice_t, char *, unsigned int);
} ts_real;
TS_HIDDEN extern ts_real R;

/* ---- process state (core.c) ----------------------------------------------------------------- */
enum { ST_UNINIT = 0, ST_INERT = 1, ST_ACTIVE = 2, ST_CLOSED = 3 };

#define MAX_ORDINALS 64

typedef struct dev_info {
    int resolved; /* 0 no, 1 yes */
    int g;        /* region GPU entry, -1 = not limited */
    uint64_t limit;
    uint32_t cores;
    uint32_t policy; /* TESSERA_POLICY_* */
    int lim;         /* index in G.lim.gpus, -1 none */
    int uncovered; /* limits loaded, and the GPU is in neither a gpu nor an unlimited line */
} dev_info;

typedef struct ts_state {
    pthread_mutex_t mu;
    int state;      /* ST_* (atomic) */
    int closed;     /* fail closed: limits file present but unusable */
    int cuda_ready; /* real CUDA pointers resolved (atomic) */
    int nvml_ready; /* real NVML pointers resolved (atomic) */
    int pacing;     /* some GPU of the limits has 0 < cores < 100 */
    void *libcuda;
    void *libnvml;
    tessera_limits lim;
    ts_region region;
    dev_info dev[MAX_ORDINALS];
} ts_state;
TS_HIDDEN extern ts_state G;

/* Resolve the real CUDA entry points (once). */
TS_HIDDEN void ts_cuda_resolve(void);
static inline void ts_cuda_init(void)
{
    if (TS_LIKELY(__atomic_load_n(&G.cuda_ready, __ATOMIC_ACQUIRE)))
        return;
    ts_cuda_resolve();
}
/* Resolve the real NVML entry points (once; loads libnvidia-ml.so.1). */
TS_HIDDEN void ts_nvml_init(void);
/* Read the limits (once) and return the state, ST_*. */
TS_HIDDEN int ts_core_load(void);
static inline int ts_core_init(void)
{
    int st = __atomic_load_n(&G.state, __ATOMIC_ACQUIRE);
    if (TS_LIKELY(st != ST_UNINIT))
        return st;
    return ts_core_load();
}
/* Enter a CUDA hook: 1 when the call must be checked (limits present), 0 to pass through. */
TS_HIDDEN int ts_cuda_enter(void);
/* 1 when the limits are active (file present); resolves them on first use. */
TS_HIDDEN int ts_active(void);
/* After fork() in the child: forget the parent's state (its region slot, devices, the driver's
 * figures) and start again lazily. The features forget theirs first (hooks.c). */
TS_HIDDEN void ts_core_forget(void);
/* Limits of a CUDA ordinal (keyed by the UUID the driver reports); g < 0 when not limited. */
TS_HIDDEN dev_info ts_dev(CUdevice dev);
TS_HIDDEN int ts_current_dev(CUdevice *dev);
/* The current device and context in one lookup. */
TS_HIDDEN int ts_current(CUdevice *dev, CUcontext *ctx);
/* A context was destroyed or reset: forget cached context -> device answers. */
TS_HIDDEN void ts_contexts_changed(void);
TS_HIDDEN CUcontext ts_current_ctx(void);
/* Device of a stream's context (the current device for the default streams). */
TS_HIDDEN int ts_stream_dev(CUstream s, CUdevice *dev);
TS_HIDDEN CUcontext ts_stream_ctx(CUstream s);

/* ---- accounting (core.c) ------------------------------------------------------------------ */
/* Charge bytes on device dev (nctx contexts). 0: not limited (nothing charged), 1: charged,
 * -1: refused (over the limit, or the library failed closed), -2: refused because the GPU is
 * not the claim's (ts_refuse_uncovered). *g_out gets the region entry.
 * Before refusing, what this process's pools and graph pools no longer hold is given back. */
TS_HIDDEN int ts_charge_dev(CUdevice dev, uint64_t bytes, uint32_t nctx, int *g_out,
                            const char *what);
/* The error a hook returns for a ts_charge_dev refusal c (< 0). */
#define TS_CHARGE_ERR(c) ((c) == -2 ? CUDA_ERROR_NOT_PERMITTED : CUDA_ERROR_OUT_OF_MEMORY)
/* A GPU the process can see but the limits file does not cover: log why (once per device, one
 * line naming its UUID) and return -2. */
TS_HIDDEN int ts_refuse_uncovered(CUdevice dev, const char *what);
/* The same on a region entry whose limit is known. 0 charged, -1 refused. */
TS_HIDDEN int ts_charge_g(int g, uint64_t bytes, uint32_t nctx, uint64_t limit,
                          const char *what);
TS_HIDDEN void ts_credit(int g, uint64_t bytes, uint32_t nctx);
TS_HIDDEN uint64_t ts_limit_of(int g);
/* Bytes the node found claim-held beyond the charges on region entry g (driver/usage). */
TS_HIDDEN uint64_t ts_driver_extra(int g);
/* The host pid the node driver mapped region slot `slot` to (driver/usage `pid` lines), 0
 * when it mapped none to the slot with this generation and namespace pid. */
TS_HIDDEN uint32_t ts_driver_host_pid(uint32_t slot, uint64_t generation, int32_t ns_pid);

/* Before refusing a charge on entry g, ts_charge_g asks the reclaimer to bring what it holds
 * charged down to what the driver reports (pools and graph pools may have released memory the
 * claim still pays for: a synchronize in another thread, a trim) and tries once more when it
 * gave bytes back; it returns the bytes it credited. pool.c sets it (ts_pools_resync) before
 * it first holds anything it could give back, so the core calls it without knowing pool.c
 * (and without a constructor: hooks run before constructors when another library's
 * constructor calls CUDA). */
typedef uint64_t (*ts_reclaim_fn)(int g);
TS_HIDDEN void ts_set_reclaimer(ts_reclaim_fn fn);

/* ---- allocations owned by contexts (alloc.c) ---------------------------------------------- */
enum ts_kind {
    TS_KIND_NONE = 0,
    TS_KIND_DPTR = 1,   /* cuMemAlloc*, managed, pitch, managed-pool allocations */
    TS_KIND_ARRAY = 3,  /* CUarray */
    TS_KIND_MIPMAP = 4, /* CUmipmappedArray */
    TS_KIND_CTX = 5,    /* CUcontext made by cuCtxCreate / cuGreenCtxCreate (bytes: overhead) */
    TS_KIND_LIMIT = 6   /* cuCtxSetLimit memory of a context */
};
/* The table itself: (kind, handle) -> (bytes, entry, owning context); mem.c also keeps its
 * private kinds there and credits a destroyed context's entries. */
TS_HIDDEN extern ts_table ts_allocs;
TS_HIDDEN void ts_remember(uint8_t kind, uint64_t key, uint64_t bytes, int g, CUcontext ctx);
/* Take and return an entry (its owning context too, if ctx is not NULL); 0 if found. */
TS_HIDDEN int ts_forget(uint8_t kind, uint64_t key, uint64_t *bytes, int *g, CUcontext *ctx);
/* After fork() in the child: an empty table. */
TS_HIDDEN void ts_allocs_forget(void);

/* ---- the real dlsym, dlopen and dlmopen (resolve.c) ------------------------------------- */
typedef void *(*ts_dlsym_fn)(void *, const char *);
typedef void *(*ts_dlopen_fn)(const char *, int);
typedef void *(*ts_dlmopen_fn)(Lmid_t, const char *, int);
/* libc's functions, resolved on first use. A caller that must stay the caller glibc sees
 * (RTLD_NEXT, $ORIGIN) calls the pointer with a sibling call (loader.c). */
TS_HIDDEN ts_dlsym_fn ts_real_dlsym_fn(void);
TS_HIDDEN ts_dlopen_fn ts_real_dlopen_fn(void);
TS_HIDDEN ts_dlmopen_fn ts_real_dlmopen_fn(void);
/* libc's dlsym; name NULL only resolves it. */
TS_HIDDEN void *ts_real_dlsym(void *handle, const char *name);
TS_HIDDEN void *ts_real_dlopen(const char *file, int mode);
/* strcmp(a, b) == 0 for the code on the dlsym path (no libc string functions there). */
TS_NOSAN static inline int ts_streq(const char *a, const char *b)
{
    while (*a && *a == *b) {
        a++;
        b++;
    }
    return *a == *b;
}

/* ---- access to real driver entry points (core.c) --------------------------------------- */
TS_HIDDEN void *ts_real_cuda(const char *name);
TS_HIDDEN void *ts_real_nvml(const char *name); /* loads libnvidia-ml.so.1 on first use */
TS_HIDDEN tessera_region_header *ts_region_hdr(void);

#endif
