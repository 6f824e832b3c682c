/*
 * libtessera-enforce's interposition layer: which function serves each hooked name,
 * cuGetProcAddress and the process's lifetime (fork).
 *
 * The library is reached four ways, all ending in the same hook functions:
 *  1. direct linking: the library is preloaded (LD_PRELOAD or /etc/ld.so.preload), so its
 *     exported cu* / nvml* symbols win over libcuda.so.1 / libnvidia-ml.so.1;
 *  2. dlsym(): the library exports dlsym; a lookup of a hooked name returns the hook, with any
 *     handle including RTLD_NEXT (loader.c);
 *  3. cuGetProcAddress / cuGetProcAddress_v2 (how CUDA 12/13 runtimes resolve the driver): the
 *     pointer the driver returns is swapped for the hook when it is the real entry point of a
 *     hooked function (matched by address, then by name + version + per-thread flag); an
 *     unknown variant of a hooked name is refused;
 *  4. objects loaded with RTLD_DEEPBIND have their references to hooked names redirected to
 *     the hooks (loader.c); dlmopen into another namespace is refused.
 * Real entry points come from dlopen("libcuda.so.1") / dlopen("libnvidia-ml.so.1") and the real
 * dlsym, so the library never calls itself.
 *
 * The hooks themselves are the features': mem.c (allocations owned by contexts, contexts,
 * limits), vmm.c (cuMemCreate allocations, mappings, exports, multicast), pool.c
 * (stream-ordered pools and graph memory), query.c (memory queries), launch.c (launches, paced
 * by pacer.c). The core (core.c) resolves the real entry points and charges the claim. This
 * file names every hook, so it sits above them all (core.h says the layers).
 */
#include <pthread.h>
#include <string.h>

#include "hooks.h"

/* ---------------------------------------------------------------------------------------- */
/* the hook table                                                                            */

void *const ts_hook_fns[H_CUDA_COUNT] = {
#define X(sym, base, ver, ptsz) (void *)&sym,
#define A(sym, base, ver, ptsz)
    TS_CUDA_HOOKS(X, A)
#undef X
#undef A
};

/* Further base names served by a hook (rows A of TS_CUDA_HOOKS). */
static struct {
    int h; /* index into ts_hooks */
    const char *base;
    int min_version;
    int ptsz;
} g_alias[] = {
#define X(sym, base, ver, ptsz)
#define A(sym, base, ver, ptsz) {H_##sym, base, ver, ptsz},
    TS_CUDA_HOOKS(X, A)
#undef X
#undef A
};
#define N_ALIAS (sizeof(g_alias) / sizeof(g_alias[0]))

void *const ts_nvml_hook_fns[N_NVML_COUNT] = {
#define X(sym) (void *)&sym,
    TS_NVML_HOOKS(X)
#undef X
};

/* What this library is, for a monitor or a person looking at a process's maps (and a symbol
 * the loader tests find with dlsym(RTLD_NEXT) from the executable). */
TS_EXPORT const char tessera_enforce_version[] = "tessera-enforce 2 (checked against cuda.h 13.4)";

/* ---------------------------------------------------------------------------------------- */
/* cuGetProcAddress                                                                          */

/* What a request gets for an entry point of a hooked name that this library does not know (a
 * variant newer than the headers it was checked against): refused, whatever its arguments. */
static CUresult ts_unknown_variant(void)
{
    return ts_refuse("an entry point variant", "it is newer than this library (checked against "
                                               "cuda.h 13.4) and could allocate uncharged");
}

static void *hook_for_proc(const char *symbol, void *p, int version, cuuint64_t flags)
{
    if (!p || !symbol)
        return p;
    for (int i = 0; i < H_CUDA_COUNT; i++)
        if (ts_hooks[i].real == p)
            return ts_hook_fns[i];
    /* Address not one of the exported entry points: choose by name, version and flag the
     * variant that cuda.h would have bound, as the driver does. */
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1, best_ver = -1, known = 0;
    for (int pass = 0; pass < 2 && best < 0; pass++) {
        int ptsz = pass == 0 ? want_ptsz : 0;
        for (size_t i = 0; i < H_CUDA_COUNT + N_ALIAS; i++) {
            int h = i < H_CUDA_COUNT ? (int)i : g_alias[i - H_CUDA_COUNT].h;
            const char *base = i < H_CUDA_COUNT ? ts_hooks[i].base : g_alias[i - H_CUDA_COUNT].base;
            int ver = i < H_CUDA_COUNT ? ts_hooks[i].min_version
                                       : g_alias[i - H_CUDA_COUNT].min_version;
            int pt = i < H_CUDA_COUNT ? ts_hooks[i].ptsz : g_alias[i - H_CUDA_COUNT].ptsz;
            if (strcmp(base, symbol) != 0)
                continue;
            known = 1;
            if (pt != ptsz || ver > version || !ts_hooks[h].real)
                continue;
            if (best < 0 || ver > best_ver) {
                best = h;
                best_ver = ver;
            }
        }
    }
    if (!known)
        return p;
    if (best < 0 || version > TESSERA_CUDA_KNOWN_VERSION) {
        ts_log(TS_ERR, "cuGetProcAddress(%s, %d) returned an entry point this library does not "
                       "know; calls to it are refused",
               symbol, version);
        return (void *)&ts_unknown_variant;
    }
    ts_log(TS_DEBUG, "cuGetProcAddress(%s, %d): unknown address, using %s", symbol, version,
           ts_hooks[best].name);
    return ts_hook_fns[best];
}

TS_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags)
{
    ts_cuda_init();
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
    ts_cuda_init();
    if (!REAL(cuGetProcAddress_v2))
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = REAL(cuGetProcAddress_v2)(symbol, pfn, cudaVersion, flags, status);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = hook_for_proc(symbol, *pfn, cudaVersion, flags);
    return r;
}

/* ---------------------------------------------------------------------------------------- */
/* process lifetime                                                                          */

static void after_fork_child(void)
{
    /* The child must not charge the parent's slot: every layer forgets the parent's state and
     * starts again lazily, the core last (it makes the library uninitialised again). */
    ts_query_forget();
    ts_mem_forget();
    ts_vmm_forget();
    ts_pool_forget();
    ts_pacer_forget();
    ts_core_forget();
}

__attribute__((constructor)) static void ts_ctor(void)
{
    ts_real_dlsym(NULL, NULL); /* resolve the real dlsym before anything else runs */
    pthread_atfork(NULL, NULL, after_fork_child);
}
