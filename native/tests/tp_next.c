/* libtpnext.so - a library linked into tp_cuda before libcuda.so.1: looks symbols up with
 * dlsym(RTLD_NEXT, ...) from a shared library, as interposers and wrappers do. */
#include <dlfcn.h>

__attribute__((visibility("default"))) void *tp_next(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}
