/*
 * libtessera-enforce's table of live allocations owned by contexts (part of the accounting
 * core): what was charged for each (kind, handle), on which region entry, for which context.
 * mem.c and pool.c record and take their allocations here; mem.c credits a destroyed
 * context's entries.
 */
#include "core.h"

ts_table ts_allocs = {.mu = PTHREAD_MUTEX_INITIALIZER};

void ts_remember(uint8_t kind, uint64_t key, uint64_t bytes, int g, CUcontext ctx)
{
    if (g >= 0 && ts_table_put(&ts_allocs, kind, key, bytes, g, (uint64_t)(uintptr_t)ctx) != 0)
        ts_log(TS_ERR, "out of host memory tracking an allocation; it stays charged");
}

int ts_forget(uint8_t kind, uint64_t key, uint64_t *bytes, int *g, CUcontext *ctx)
{
    ts_entry e;
    if (ts_table_take(&ts_allocs, kind, key, &e) != 0)
        return -1;
    *bytes = e.bytes;
    *g = e.g;
    if (ctx)
        *ctx = (CUcontext)(uintptr_t)e.ctx;
    return 0;
}

void ts_allocs_forget(void) { ts_table_clear(&ts_allocs); }
