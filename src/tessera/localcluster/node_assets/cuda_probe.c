/*
 * cuda_probe BYTES... - a small CUDA program for the node-driver e2e test, run inside a pod.
 *
 * It reaches the driver the way CUDA runtimes do without linking it: dlopen("libcuda.so.1")
 * and dlsym (in the test image that is the project's fake libcuda, native/fake). It prints one
 * line per step: whether libtessera-enforce.so is mapped (preloaded through /etc/ld.so.preload),
 * cuInit, cuDeviceTotalMem_v2, cuCtxCreate_v2, cuMemGetInfo_v2, then cuMemAlloc_v2 of each
 * BYTES argument in turn (CUresult 2 = CUDA_ERROR_OUT_OF_MEMORY). With PROBE_HOLD set it keeps
 * its allocations and sleeps after printing "holding".
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*fn_init)(unsigned);
typedef int (*fn_dev)(int *, int);
typedef int (*fn_total)(size_t *, int);
typedef int (*fn_ctx)(void **, unsigned, int);
typedef int (*fn_info)(size_t *, size_t *);
typedef int (*fn_alloc)(unsigned long long *, size_t);

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        printf("dlsym %s: %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    char line[4096];
    int preloaded = 0;
    FILE *maps = fopen("/proc/self/maps", "r");
    while (maps && fgets(line, sizeof line, maps))
        if (strstr(line, "libtessera-enforce.so"))
            preloaded = 1;
    if (maps)
        fclose(maps);
    printf("preloaded %s\n", preloaded ? "yes" : "no");
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("dlopen %s\n", dlerror());
        return 1;
    }
    fn_init cu_init = (fn_init)sym(h, "cuInit");
    fn_dev cu_dev = (fn_dev)sym(h, "cuDeviceGet");
    fn_total cu_total = (fn_total)sym(h, "cuDeviceTotalMem_v2");
    fn_ctx cu_ctx = (fn_ctx)sym(h, "cuCtxCreate_v2");
    fn_info cu_info = (fn_info)sym(h, "cuMemGetInfo_v2");
    fn_alloc cu_alloc = (fn_alloc)sym(h, "cuMemAlloc_v2");
    int dev = 0;
    size_t total = 0, free_ = 0, t2 = 0;
    void *ctx = NULL;
    printf("init %d\n", cu_init(0));
    printf("device %d\n", cu_dev(&dev, 0));
    int r = cu_total(&total, dev);
    printf("totalmem %d %zu\n", r, total);
    printf("ctx %d\n", cu_ctx(&ctx, 0, dev));
    r = cu_info(&free_, &t2);
    printf("meminfo %d free=%zu total=%zu\n", r, free_, t2);
    for (int i = 1; i < argc; i++) {
        unsigned long long p = 0;
        printf("alloc %s %d\n", argv[i], cu_alloc(&p, strtoull(argv[i], NULL, 10)));
    }
    if (getenv("PROBE_HOLD")) {
        printf("holding\n");
        for (;;)
            pause();
    }
    return 0;
}
