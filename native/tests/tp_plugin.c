/* libtpplugin.so - a plugin linked against libcuda.so.1 that tp_cuda loads with RTLD_DEEPBIND:
 * its references to the driver resolve in its own dependencies first, past the preloaded
 * enforcement library, unless the library redirects them. Three ways to reach cuMemAlloc_v2:
 * a direct call (PLT slot), a function pointer in initialised data (absolute relocation), and
 * dlsym on libcuda.so.1 (the plugin's own dlsym reference). */
#include <dlfcn.h>

#include "tessera_cuda.h"

#define EXPORT __attribute__((visibility("default")))

static CUresult (*const table[])(CUdeviceptr *, size_t) = {cuMemAlloc_v2};

EXPORT int plugin_direct(CUdeviceptr *p, size_t bytes) { return cuMemAlloc_v2(p, bytes); }

EXPORT int plugin_table(CUdeviceptr *p, size_t bytes) { return table[0](p, bytes); }

EXPORT int plugin_dlsym(CUdeviceptr *p, size_t bytes)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CUresult (*f)(CUdeviceptr *, size_t) = h ? (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2") : 0;
    return f ? (int)f(p, bytes) : -1;
}

EXPORT int plugin_free(CUdeviceptr p) { return cuMemFree_v2(p); }
