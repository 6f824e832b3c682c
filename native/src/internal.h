/* Internal interfaces of libtessera-enforce (not installed). */
#ifndef TESSERA_INTERNAL_H
#define TESSERA_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "tessera_cuda.h"
#include "tessera_limits.h"
#include "tessera_region.h"

#define TS_HIDDEN __attribute__((visibility("hidden")))
#define TS_EXPORT __attribute__((visibility("default")))
#define TS_LIKELY(x) __builtin_expect(!!(x), 1)
#define TS_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- logging (stderr, "tessera: "), level from TESSERA_LOG_LEVEL (0 error .. 3 debug) --- */
TS_HIDDEN void ts_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define TS_ERR 0
#define TS_WARN 1
#define TS_INFO 2
#define TS_DEBUG 3

/* ---- region (region.c) ---------------------------------------------------------------- */
typedef struct ts_region {
    int fd;
    tessera_region_header *hdr;
    tessera_region_slot *slots;
    int slot; /* our slot index, -1 if none */
    pthread_mutex_t mu; /* serialises this process's threads around the OFD region lock */
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
TS_HIDDEN void ts_region_credit(ts_region *r, int g, uint64_t bytes, uint32_t ncontexts);
/* Sum of used[g] over live slots (after reclaiming dead ones when reclaim != 0). */
TS_HIDDEN uint64_t ts_region_usage(ts_region *r, int g, int reclaim);
TS_HIDDEN int ts_region_reclaim(ts_region *r);
/* Give up our slot (usage returns to the claim); the mapping stays valid. */
TS_HIDDEN void ts_region_leave(ts_region *r);
/* After fork() in the child: forget the parent's mapping without touching its slot. */
TS_HIDDEN void ts_region_forget(ts_region *r);

/* ---- pacer (pacer.c) ------------------------------------------------------------------ */
typedef CUresult (*ts_launch_thunk)(void *arg);
/* Pace one launch on region GPU entry g with share cores (1..99). key identifies the work
 * (function and grid, or graph); stream is the launch stream. Calls thunk(arg) to launch. */
TS_HIDDEN CUresult ts_pace_launch(int g, uint32_t cores, uint64_t key, CUstream stream,
                                  ts_launch_thunk thunk, void *arg);
TS_HIDDEN void ts_pacer_forget(void);

/* ---- access to real driver entry points (hooks.c) -------------------------------------- */
TS_HIDDEN void *ts_real_cuda(const char *name);
TS_HIDDEN tessera_region_header *ts_region_hdr(void);

TS_HIDDEN uint64_t ts_now_ns(void);

#endif
