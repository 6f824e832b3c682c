/*
 * libtessera-enforce: the launch hooks (cuLaunchKernel, cuLaunchCooperativeKernel,
 * cuLaunchKernelEx, cuGraphLaunch, cuGraphUpload), paced to the compute share by pacer.c; a
 * graph with memory nodes is accounted by pool.c (a feature, calling down into the core and
 * into pacer.c and pool.c).
 */
#include "feature.h"

/* 1 and the GPU entry and its pace word (TS_PACE_WORD: cores, policy, limits index) when
 * launches on the current device must be paced: a share (0 < cores < 100), or best effort
 * (cores 0) when the limits name the node's shares directory. */
static int pace_target(int *g, uint32_t *cores)
{
    if (TS_LIKELY(!G.pacing) || G.closed)
        return 0;
    CUdevice dev;
    if (ts_current_dev(&dev) != 0)
        return 0;
    dev_info d = ts_dev(dev);
    if (d.g < 0 || d.cores >= 100 || (d.cores == 0 && !G.lim.shares[0]))
        return 0;
    *g = d.g;
    *cores = TS_PACE_WORD(d.cores, d.policy, d.lim);
    return 1;
}

static uint64_t grid_key(CUfunction f, unsigned gx, unsigned gy, unsigned gz)
{
    uint64_t blocks = (uint64_t)gx * gy * gz;
    return (uint64_t)(uintptr_t)f ^ (blocks * 0x9E3779B97F4A7C15ULL);
}

struct launch_args {
    CUresult (*fn)();
    CUfunction f;
    unsigned gx, gy, gz, bx, by, bz, shm;
    CUstream s;
    void **params, **extra;
    const CUlaunchConfig *cfg;
    CUgraphExec graph;
};

static CUresult thunk_kernel(void *p)
{
    struct launch_args *a = p;
    CUresult (*fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                   unsigned, CUstream, void **, void **) = (void *)a->fn;
    return fn(a->f, a->gx, a->gy, a->gz, a->bx, a->by, a->bz, a->shm, a->s, a->params, a->extra);
}

static CUresult thunk_coop(void *p)
{
    struct launch_args *a = p;
    CUresult (*fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                   unsigned, CUstream, void **) = (void *)a->fn;
    return fn(a->f, a->gx, a->gy, a->gz, a->bx, a->by, a->bz, a->shm, a->s, a->params);
}

static CUresult thunk_ex(void *p)
{
    struct launch_args *a = p;
    CUresult (*fn)(const CUlaunchConfig *, CUfunction, void **, void **) = (void *)a->fn;
    return fn(a->cfg, a->f, a->params, a->extra);
}

static CUresult thunk_graph(void *p)
{
    struct launch_args *a = p;
    CUresult (*fn)(CUgraphExec, CUstream) = (void *)a->fn;
    return fn(a->graph, a->s);
}

#define KERNEL_LAUNCH(sym)                                                                      \
    TS_EXPORT CUresult sym(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,     \
                           unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm, \
                           CUstream s, void **params, void **extra)                             \
    {                                                                                           \
        ts_cuda_init();                                                                         \
        if (!REAL(sym))                                                                         \
            return CUDA_ERROR_NOT_FOUND;                                                        \
        int g;                                                                                  \
        uint32_t cores;                                                                         \
        if (TS_LIKELY(ts_core_init() != ST_ACTIVE || !pace_target(&g, &cores)))                 \
            return REAL(sym)(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);                 \
        struct launch_args a = {(CUresult(*)())REAL(sym), f, gx, gy, gz, bx, by, bz, shm, s,    \
                                params, extra, NULL, NULL};                                     \
        return ts_pace_launch(g, cores, grid_key(f, gx, gy, gz), s, thunk_kernel, &a);          \
    }
KERNEL_LAUNCH(cuLaunchKernel)
KERNEL_LAUNCH(cuLaunchKernel_ptsz)

#define COOP_LAUNCH(sym)                                                                        \
    TS_EXPORT CUresult sym(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,     \
                           unsigned int bx, unsigned int by, unsigned int bz, unsigned int shm, \
                           CUstream s, void **params)                                           \
    {                                                                                           \
        ts_cuda_init();                                                                         \
        if (!REAL(sym))                                                                         \
            return CUDA_ERROR_NOT_FOUND;                                                        \
        int g;                                                                                  \
        uint32_t cores;                                                                         \
        if (TS_LIKELY(ts_core_init() != ST_ACTIVE || !pace_target(&g, &cores)))                 \
            return REAL(sym)(f, gx, gy, gz, bx, by, bz, shm, s, params);                        \
        struct launch_args a = {(CUresult(*)())REAL(sym), f, gx, gy, gz, bx, by, bz, shm, s,    \
                                params, NULL, NULL, NULL};                                      \
        return ts_pace_launch(g, cores, grid_key(f, gx, gy, gz), s, thunk_coop, &a);            \
    }
COOP_LAUNCH(cuLaunchCooperativeKernel)
COOP_LAUNCH(cuLaunchCooperativeKernel_ptsz)

#define EX_LAUNCH(sym)                                                                            \
    TS_EXPORT CUresult sym(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)  \
    {                                                                                             \
        ts_cuda_init();                                                                           \
        if (!REAL(sym))                                                                           \
            return CUDA_ERROR_NOT_FOUND;                                                          \
        int g;                                                                                    \
        uint32_t cores;                                                                           \
        if (TS_LIKELY(!cfg || ts_core_init() != ST_ACTIVE || !pace_target(&g, &cores)))           \
            return REAL(sym)(cfg, f, params, extra);                                              \
        struct launch_args a = {(CUresult(*)())REAL(sym), f, 0, 0, 0, 0, 0, 0, 0, cfg->hStream,   \
                                params, extra, cfg, NULL};                                        \
        return ts_pace_launch(g, cores, grid_key(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ), \
                              cfg->hStream, thunk_ex, &a);                                        \
    }
EX_LAUNCH(cuLaunchKernelEx)
EX_LAUNCH(cuLaunchKernelEx_ptsz)

/* A graph launch is paced like a kernel; a graph with memory nodes is charged, after the pacer
 * admitted it, the memory its launch makes the device's graph pool reserve (pool.c). */
static CUresult accounted_graph(void *p)
{
    struct launch_args *a = p;
    if (TS_UNLIKELY(ts_graph_has_memory()))
        return ts_graph_run(a->graph, a->s, 0, thunk_graph, a);
    return thunk_graph(a);
}

#define GRAPH_LAUNCH(sym)                                                                     \
    TS_EXPORT CUresult sym(CUgraphExec graph, CUstream s)                                     \
    {                                                                                         \
        ts_cuda_init();                                                                       \
        if (!REAL(sym))                                                                       \
            return CUDA_ERROR_NOT_FOUND;                                                      \
        if (TS_LIKELY(ts_core_init() != ST_ACTIVE))                                           \
            return REAL(sym)(graph, s);                                                       \
        struct launch_args a = {(CUresult(*)())REAL(sym), NULL, 0, 0, 0, 0, 0, 0, 0, s, NULL, \
                                NULL, NULL, graph};                                           \
        int g;                                                                                \
        uint32_t cores;                                                                       \
        if (TS_UNLIKELY(pace_target(&g, &cores)))                                             \
            return ts_pace_launch(g, cores, (uint64_t)(uintptr_t)graph, s, accounted_graph,   \
                                  &a);                                                        \
        return accounted_graph(&a);                                                           \
    }
GRAPH_LAUNCH(cuGraphLaunch)
GRAPH_LAUNCH(cuGraphLaunch_ptsz)

#define GRAPH_UPLOAD(sym)                                                                     \
    TS_EXPORT CUresult sym(CUgraphExec graph, CUstream s)                                     \
    {                                                                                         \
        ts_cuda_init();                                                                       \
        if (!REAL(sym))                                                                       \
            return CUDA_ERROR_NOT_FOUND;                                                      \
        if (ts_core_init() != ST_ACTIVE || !ts_graph_has_memory())                            \
            return REAL(sym)(graph, s);                                                       \
        struct launch_args a = {(CUresult(*)())REAL(sym), NULL, 0, 0, 0, 0, 0, 0, 0, s, NULL, \
                                NULL, NULL, graph};                                           \
        return ts_graph_run(graph, s, 1, thunk_graph, &a);                                    \
    }
GRAPH_UPLOAD(cuGraphUpload)
GRAPH_UPLOAD(cuGraphUpload_ptsz)

