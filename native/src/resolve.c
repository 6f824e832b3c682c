/*
 * libtessera-enforce's way to the real dlsym, dlopen and dlmopen (core): libc's, found with
 * dlvsym, so that the library never reaches its own interposed ones (loader.c).
 *
 * The code on the dlsym path runs before constructors (sanitizer runtimes call dlsym while
 * initialising), so it is not instrumented and calls no libc string functions.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include "core.h"

static ts_dlsym_fn g_real_dlsym;
static ts_dlopen_fn g_real_dlopen;
static ts_dlmopen_fn g_real_dlmopen;

TS_NOSAN ts_dlsym_fn ts_real_dlsym_fn(void)
{
    ts_dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (TS_LIKELY(f != NULL))
        return f;
    /* dlvsym is not interposed; RTLD_NEXT from here finds libc's (or libdl's) dlsym. */
    f = (ts_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!f)
        f = (ts_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!f)
        f = (ts_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17"); /* aarch64 */
    if (!f) {
        static const char msg[] = "tessera: cannot find the real dlsym\n";
        ssize_t w = write(2, msg, sizeof(msg) - 1);
        (void)w;
        abort();
    }
    __atomic_store_n(&g_real_dlsym, f, __ATOMIC_RELEASE);
    return f;
}

TS_NOSAN void *ts_real_dlsym(void *handle, const char *name)
{
    ts_dlsym_fn f = ts_real_dlsym_fn();
    return name ? f(handle, name) : NULL;
}

TS_NOSAN ts_dlopen_fn ts_real_dlopen_fn(void)
{
    ts_dlopen_fn f = __atomic_load_n(&g_real_dlopen, __ATOMIC_ACQUIRE);
    if (TS_UNLIKELY(!f)) {
        f = (ts_dlopen_fn)ts_real_dlsym_fn()(RTLD_NEXT, "dlopen");
        __atomic_store_n(&g_real_dlopen, f, __ATOMIC_RELEASE);
    }
    return f;
}

TS_NOSAN ts_dlmopen_fn ts_real_dlmopen_fn(void)
{
    ts_dlmopen_fn f = __atomic_load_n(&g_real_dlmopen, __ATOMIC_ACQUIRE);
    if (TS_UNLIKELY(!f)) {
        f = (ts_dlmopen_fn)ts_real_dlsym_fn()(RTLD_NEXT, "dlmopen");
        __atomic_store_n(&g_real_dlmopen, f, __ATOMIC_RELEASE);
    }
    return f;
}

TS_NOSAN void *ts_real_dlopen(const char *file, int mode) { return ts_real_dlopen_fn()(file, mode); }
