/*
 * Compute-share pacer.
 *
 * Model: the claim may keep a GPU busy for cores% of wall-clock time. Every launch costs the
 * GPU time its work is expected to take; launches are admitted by a GCRA (virtual scheduling)
 * limiter whose theoretical arrival time lives in the claim's shared region (pace_tat_ns of
 * the GPU entry), so all processes and threads of the claim draw on one budget:
 *
 *     inc    = cost * 100 / cores                 (ns of wall clock the launch "uses up")
 *     tat'   = max(tat, now) + inc                (atomic compare-and-swap in the region)
 *     go at  = tat' - inc - TS_PACE_BURST_NS      (sleep until then if it is in the future)
 *
 * The cost of a launch is a per-process estimate for its key (function and grid size, or
 * graph exec): the first launch of a key and every TS_PACE_SAMPLE_EVERY-th one after it is
 * bracketed by two CUDA events on the launch stream; when the end event has completed, the
 * elapsed time updates an exponential moving average (weight 1/4). Until a key has a sample,
 * the GPU-wide average of this process is used (0 at the very start, so the first launches
 * are free). Events are polled at most every TS_PACE_POLL_NS, never waited on.
 */
#include <string.h>
#include <time.h>

#include "internal.h"

#define TS_PACE_BURST_NS 2000000ull /* 2 ms of admitted work may run ahead of the share */
#define TS_PACE_SAMPLE_EVERY 16
#define TS_PACE_POLL_NS 100000ull
#define EST_SLOTS 1024
#define PENDING 4

typedef struct est {
    uint64_t key;
    uint64_t ns;     /* EMA of measured duration, 0 = none yet */
    uint32_t count;  /* launches seen */
    uint8_t used;
} est;

typedef struct pending {
    int busy;
    int g;
    uint64_t key;
    CUcontext ctx;
    CUevent a, b;
} pending;

static struct {
    pthread_mutex_t mu;
    est tab[EST_SLOTS];
    uint64_t gpu_avg[TESSERA_REGION_MAX_GPUS];
    pending p[PENDING];
    uint64_t last_poll;
    int resolved;
    CUresult (*ev_create)(CUevent *, unsigned int);
    CUresult (*ev_record)(CUevent, CUstream);
    CUresult (*ev_query)(CUevent);
    CUresult (*ev_elapsed)(float *, CUevent, CUevent);
    CUresult (*ev_destroy)(CUevent);
    CUresult (*ctx_current)(CUcontext *);
} P = {.mu = PTHREAD_MUTEX_INITIALIZER};

void ts_pacer_forget(void)
{
    memset(P.tab, 0, sizeof(P.tab));
    memset(P.gpu_avg, 0, sizeof(P.gpu_avg));
    memset(P.p, 0, sizeof(P.p)); /* the parent's events are not ours to destroy */
    P.last_poll = 0;
    pthread_mutex_init(&P.mu, NULL);
}

static void resolve(void)
{
    if (P.resolved)
        return;
    *(void **)&P.ev_create = ts_real_cuda("cuEventCreate");
    *(void **)&P.ev_record = ts_real_cuda("cuEventRecord");
    *(void **)&P.ev_query = ts_real_cuda("cuEventQuery");
    *(void **)&P.ev_elapsed = ts_real_cuda("cuEventElapsedTime");
    *(void **)&P.ev_destroy = ts_real_cuda("cuEventDestroy_v2");
    *(void **)&P.ctx_current = ts_real_cuda("cuCtxGetCurrent");
    P.resolved = 1;
}

static int can_sample(void)
{
    return P.ev_create && P.ev_record && P.ev_query && P.ev_elapsed && P.ev_destroy &&
           P.ctx_current;
}

static est *lookup(uint64_t key)
{
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 54) & (EST_SLOTS - 1);
    for (size_t n = 0; n < 8; n++, i = (i + 1) & (EST_SLOTS - 1)) {
        if (!P.tab[i].used) {
            P.tab[i].used = 1;
            P.tab[i].key = key;
            return &P.tab[i];
        }
        if (P.tab[i].key == key)
            return &P.tab[i];
    }
    /* neighbourhood full: recycle the home slot */
    i = (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 54) & (EST_SLOTS - 1);
    memset(&P.tab[i], 0, sizeof(P.tab[i]));
    P.tab[i].used = 1;
    P.tab[i].key = key;
    return &P.tab[i];
}

static void ema(uint64_t *v, uint64_t s) { *v = *v ? (*v * 3 + s) / 4 : s; }

/* mu held */
static void poll_pending(uint64_t now)
{
    if (now - P.last_poll < TS_PACE_POLL_NS)
        return;
    P.last_poll = now;
    for (int i = 0; i < PENDING; i++) {
        pending *p = &P.p[i];
        if (p->busy != 2)
            continue;
        if (P.ev_query(p->b) != CUDA_SUCCESS)
            continue; /* not reached yet (or failed: try again later) */
        float ms = 0;
        if (P.ev_elapsed(&ms, p->a, p->b) == CUDA_SUCCESS && ms >= 0) {
            uint64_t ns = (uint64_t)((double)ms * 1e6);
            ema(&lookup(p->key)->ns, ns);
            ema(&P.gpu_avg[p->g], ns);
        }
        p->busy = 0;
    }
}

static pending *free_pending(CUcontext ctx)
{
    for (int i = 0; i < PENDING; i++) {
        pending *p = &P.p[i];
        if (p->busy)
            continue;
        if (p->a && p->ctx != ctx) {
            /* events belong to another context: drop them */
            P.ev_destroy(p->a);
            P.ev_destroy(p->b);
            p->a = p->b = NULL;
        }
        if (!p->a) {
            if (P.ev_create(&p->a, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
                return NULL;
            if (P.ev_create(&p->b, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
                P.ev_destroy(p->a);
                p->a = NULL;
                return NULL;
            }
            p->ctx = ctx;
        }
        return p;
    }
    return NULL;
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

CUresult ts_pace_launch(int g, uint32_t cores, uint64_t key, CUstream stream,
                        ts_launch_thunk thunk, void *arg)
{
    tessera_region_header *h = ts_region_hdr();
    if (!h || g < 0 || g >= TESSERA_REGION_MAX_GPUS || cores == 0 || cores >= 100)
        return thunk(arg);
    uint64_t now = ts_now_ns();
    pending *sample = NULL;
    uint64_t cost;

    pthread_mutex_lock(&P.mu);
    resolve();
    poll_pending(now);
    est *e = lookup(key);
    cost = e->ns ? e->ns : P.gpu_avg[g];
    if ((e->count++ % TS_PACE_SAMPLE_EVERY) == 0 && can_sample()) {
        CUcontext ctx = NULL;
        if (P.ctx_current(&ctx) == CUDA_SUCCESS && ctx) {
            sample = free_pending(ctx);
            if (sample) {
                sample->busy = 1; /* reserved; 2 once both events are recorded */
                sample->g = g;
                sample->key = key;
            }
        }
    }
    pthread_mutex_unlock(&P.mu);

    tessera_region_gpu *gp = &h->gpus[g];
    __atomic_add_fetch(&gp->launches, 1, __ATOMIC_RELAXED);
    if (cost) {
        uint64_t inc = cost * 100 / cores;
        uint64_t tat = __atomic_load_n(&gp->pace_tat_ns, __ATOMIC_ACQUIRE), base, ntat;
        do {
            base = tat > now ? tat : now;
            ntat = base + inc;
        } while (!__atomic_compare_exchange_n(&gp->pace_tat_ns, &tat, ntat, 1, __ATOMIC_ACQ_REL,
                                              __ATOMIC_ACQUIRE));
        /* admitted once the backlog ahead of this launch is within the burst */
        if (base > now + TS_PACE_BURST_NS) {
            uint64_t go = base - TS_PACE_BURST_NS;
            sleep_until(go);
            __atomic_add_fetch(&gp->paced_ns, go - now, __ATOMIC_RELAXED);
        }
    }

    if (!sample)
        return thunk(arg);
    int ok = P.ev_record(sample->a, stream) == CUDA_SUCCESS;
    CUresult r = thunk(arg);
    ok = ok && r == CUDA_SUCCESS && P.ev_record(sample->b, stream) == CUDA_SUCCESS;
    pthread_mutex_lock(&P.mu);
    sample->busy = ok ? 2 : 0;
    pthread_mutex_unlock(&P.mu);
    return r;
}
