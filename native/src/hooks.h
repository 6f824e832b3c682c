/*
 * The interposition layer of libtessera-enforce (not installed): which function serves each
 * hooked name (hooks.c) and the dlsym / dlopen / dlmopen that hand them out (loader.c). It
 * names every feature's hooks and sits above them all.
 */
#ifndef TESSERA_HOOKS_H
#define TESSERA_HOOKS_H

#include "feature.h"

/* The hook of each entry of ts_hooks (same index, H_*) and of ts_nvml_hooks (N_*). */
TS_HIDDEN extern void *const ts_hook_fns[H_CUDA_COUNT];
TS_HIDDEN extern void *const ts_nvml_hook_fns[N_NVML_COUNT];

/* The hook for a name, NULL if the name is not interposed (loader.c). */
TS_HIDDEN void *ts_hook_by_name(const char *name);

#endif
