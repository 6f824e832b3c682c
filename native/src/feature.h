/*
 * Interfaces between the features of libtessera-enforce (not installed) and from the
 * interposition layer down to them. The core (core.h) does not include this header: a feature
 * calls down into the core and sideways into a feature below it (mem.c into pool.c and vmm.c,
 * launch.c into pacer.c and pool.c, query.c into pool.c), never the other way.
 */
#ifndef TESSERA_FEATURE_H
#define TESSERA_FEATURE_H

#include "core.h"

/* ---- allocations owned by contexts, contexts (mem.c) --------------------------------------- */
/* A context is gone with everything it allocated: credit all of it. */
TS_HIDDEN void ts_context_gone(CUcontext ctx, CUdevice dev);
TS_HIDDEN void ts_mem_forget(void);

/* ---- VMM (vmm.c) ---------------------------------------------------------------------------- */
/* After a context reset: drop records whose handles and mappings the driver no longer knows
 * (the driver answers CUDA_ERROR_INVALID_VALUE for the handle; any other failure keeps it). */
TS_HIDDEN void ts_vmm_recheck(CUdevice dev);
TS_HIDDEN void ts_vmm_forget(void);

/* ---- pools and graph memory (pool.c) --------------------------------------------------------- */
/* Bring this process's pool and graph-pool charges on entry g (or all, g < 0) down to what the
 * driver reports they hold. Returns the bytes credited. A pool whose reserve cannot be read
 * keeps its charge. pool.c sets it as the core's reclaimer (ts_set_reclaimer). */
TS_HIDDEN uint64_t ts_pools_resync(int g);
/* Graph launch / upload: account the exec's memory nodes around call(). */
TS_HIDDEN CUresult ts_graph_run(CUgraphExec exec, CUstream s, int upload,
                                CUresult (*call)(void *), void *arg);
TS_HIDDEN int ts_graph_has_memory(void);
TS_HIDDEN void ts_pool_forget(void);

/* ---- memory queries: cuMemGetInfo, cuDeviceTotalMem, NVML (query.c) ------------------------- */
TS_HIDDEN void ts_query_forget(void);

/* ---- pacer (pacer.c); its hooks are launch.c's ---------------------------------------------- */
typedef CUresult (*ts_launch_thunk)(void *arg);
/* What ts_pace_launch is told about a GPU: cores (bits 0-7), policy (8-15), limits index
 * (16-31). */
#define TS_PACE_WORD(cores, policy, lim) \
    ((uint32_t)(cores) | ((uint32_t)(policy) << 8) | ((uint32_t)(lim) << 16))
/* Pace one launch on region GPU entry g with share cores (1..99). key identifies the work
 * (function and grid, or graph); stream is the launch stream. Calls thunk(arg) to launch. */
TS_HIDDEN CUresult ts_pace_launch(int g, uint32_t cores, uint64_t key, CUstream stream,
                                  ts_launch_thunk thunk, void *arg);
TS_HIDDEN void ts_pacer_forget(void);

#endif
