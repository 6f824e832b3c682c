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
 * elapsed time updates a moving average that follows the samples' lower envelope (weight 1/2
 * down, 1/16 up). Until a key has a sample,
 * the GPU-wide average of this process is used (0 at the very start, so the first launches
 * are free). Events are polled at most every TS_PACE_POLL_NS, never waited on.
 *
 * On a time-sliced GPU an event-timed cost also holds the time other contexts ran (and the
 * time sibling kernels on other streams of the claim ran), so the estimate is too high and the
 * claim under-uses its share. An outer loop corrects that: once per TS_PACE_CTL_NS one process
 * of the claim reads the GPU time the driver itself reports for the claim's processes (NVML's
 * per-process utilisation, nvmlDeviceGetProcessUtilization, for the host pids of the region's
 * live slots: a slot's own pid in the initial pid namespace, else the host pid the node driver
 * mapped that slot to in driver/usage, matched to the slot's generation and pid) and scales
 * every cost by a factor kept in the region (pace_scale):
 *
 *     scale' = scale * (1 + (measured/target - 1) / 2)       (clamped to [1/64, 16])
 *
 * (a strict claim above its cap takes the full step, scale * measured/target), applied only while the pacer is holding the claim back (paced_ns grew) or when the claim is
 * above its share, so a claim that does not want its share keeps its factor. The measurement
 * never comes from the library's own bookkeeping, and only the claim's own region is written.
 *
 * The target is cores under the strict policy. Under work-conserving, and for a best-effort
 * claim (cores 0: an equal part of what the node's shares file says the GPU's guarantees
 * leave), it also grows into GPU time NVML shows idle, in proportion to the claim's part; while
 * the GPU is full and the other tenants are below their guarantees, the grown part gives back
 * their shortfall (and halves when that is over 2 points).
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <time.h>

#include "feature.h"

#define TS_PACE_BURST_NS 2000000ull /* 2 ms of admitted work may run ahead of the share */
#define TS_PACE_SAMPLE_EVERY 16
#define TS_PACE_POLL_NS 100000ull
#define EST_SLOTS 1024
#define PENDING 4
#define TS_PACE_CTL_NS 100000000ull /* outer loop period */
/* pace_scale in the region: bits 63-44 the cost factor (4.12 fixed point, 0 = 1.0), 43-32 the
 * idle time taken (tenths of a percent), 31-0 when the word was last set (ms, truncated) */
#define SCALE_ONE 4096ull
#define SCALE_MIN (SCALE_ONE / 64)
#define SCALE_MAX (SCALE_ONE * 16)
#define PS_SCALE(w) (((w) >> 44) ? ((w) >> 44) : SCALE_ONE)
#define PS_BONUS(w) (((w) >> 32) & 0xfffull)
#define PS_WORD(scale, bonus, ms) (((uint64_t)(scale) << 44) | ((uint64_t)(bonus) << 32) | (uint64_t)(ms))
#define PROC_PID_INIT_INO 0xEFFFFFFCull /* /proc/self/ns/pid of the initial namespace */
#define CTL_SAMPLES 64
#define TS_PACE_IDLE 3 /* percent of GPU time idle below which the GPU counts as full */

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

/* the outer loop's process-local state */
static struct {
    pthread_mutex_t mu;
    int resolved;
    int ok;
    nvmlReturn_t (*count)(unsigned int *);
    nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t *);
    nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned int);
    nvmlReturn_t (*util)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned int *,
                         unsigned long long);
    nvmlDevice_t dev[TESSERA_REGION_MAX_GPUS];
    int have[TESSERA_REGION_MAX_GPUS]; /* 0 not looked up, 1 found, -1 not found */
    uint64_t last_ts[TESSERA_REGION_MAX_GPUS];
    uint64_t paced_seen[TESSERA_REGION_MAX_GPUS];
    uint64_t next_try[TESSERA_REGION_MAX_GPUS];
    uint64_t base[TESSERA_REGION_MAX_GPUS]; /* the share held to, tenths of a percent */
    int64_t others[TESSERA_REGION_MAX_GPUS]; /* the other tenants' guarantees, tenths; -1 */
} C = {.mu = PTHREAD_MUTEX_INITIALIZER};

void ts_pacer_forget(void)
{
    memset(C.last_ts, 0, sizeof(C.last_ts));
    memset(C.paced_seen, 0, sizeof(C.paced_seen));
    memset(C.next_try, 0, sizeof(C.next_try));
    pthread_mutex_init(&C.mu, NULL);
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

/* The estimate follows the lower envelope of the samples: down with weight 1/2, up with
 * weight 1/16. A sample is the kernel's own time plus, on a shared GPU, any time another
 * context ran between its events; the shortest samples are the cleanest, and an estimate that
 * jumped with every inflated sample would swing the admitted work faster than the outer loop
 * can follow. */
static void ema(uint64_t *v, uint64_t s)
{
    if (!*v)
        *v = s;
    else if (s < *v)
        *v = (*v + s) / 2;
    else
        *v = (*v * 15 + s) / 16;
}

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

static int ctl_resolve(void)
{
    if (C.resolved)
        return C.ok;
    C.resolved = 1;
    nvmlReturn_t (*init)(void);
    *(void **)&init = ts_real_nvml("nvmlInit_v2");
    *(void **)&C.count = ts_real_nvml("nvmlDeviceGetCount_v2");
    *(void **)&C.by_index = ts_real_nvml("nvmlDeviceGetHandleByIndex_v2");
    *(void **)&C.uuid = ts_real_nvml("nvmlDeviceGetUUID");
    *(void **)&C.util = ts_real_nvml("nvmlDeviceGetProcessUtilization");
    C.ok = init && C.count && C.by_index && C.uuid && C.util && init() == NVML_SUCCESS;
    if (!C.ok)
        ts_log(TS_DEBUG, "pacer: no NVML per-process utilisation; costs are not corrected");
    return C.ok;
}

static int ctl_device(int g, const char *uuid)
{
    if (C.have[g])
        return C.have[g] > 0;
    C.have[g] = -1;
    unsigned int n = 0;
    if (C.count(&n) != NVML_SUCCESS)
        return 0;
    for (unsigned int i = 0; i < n; i++) {
        nvmlDevice_t d;
        char u[TESSERA_REGION_UUID_LEN + 48];
        if (C.by_index(i, &d) == NVML_SUCCESS && C.uuid(d, u, sizeof(u)) == NVML_SUCCESS &&
            strncasecmp(u, uuid, sizeof(u)) == 0) {
            C.dev[g] = d;
            C.have[g] = 1;
            return 1;
        }
    }
    return 0;
}

/* The node's shares file of a GPU (<shares dir>/<UUID>, tessera.enforcement.shares): the
 * cores guaranteed to the GPU's limited claims and how many best-effort claims it has; 0 and
 * *g, *n set when read. */
static int read_shares(const char *dir, const char *uuid, uint32_t *g, uint32_t *n)
{
    char path[TESSERA_LIMITS_MAX_PATH + TESSERA_UUID_STR_LEN + 2], buf[512];
    if (snprintf(path, sizeof(path), "%s/%s", dir, uuid) >= (int)sizeof(path))
        return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return -1;
    ssize_t len = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (len <= 0)
        return -1;
    buf[len] = '\0';
    unsigned long gv = 101, nv = 0;
    int version = 0;
    for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        unsigned long v;
        char key[32];
        if (sscanf(line, "%31s %lu", key, &v) != 2)
            continue;
        if (!strcmp(key, "version"))
            version = (int)v;
        else if (!strcmp(key, "guaranteed"))
            gv = v;
        else if (!strcmp(key, "best-effort"))
            nv = v;
    }
    if (version != 1 || gv > 100)
        return -1;
    *g = (uint32_t)gv;
    *n = (uint32_t)nv;
    return 0;
}

/* From NVML's newest samples of GPU g: the claim's share (sum over the host pids of the
 * region's live slots, percent) and the GPU's idle time (100 - every process's share).
 * 0 when there is a new sample with one of the claim's pids. C.mu held. */
static int ctl_measure(tessera_region_header *h, int g, int *mine, int *idle)
{
    nvmlProcessUtilizationSample_t sm[CTL_SAMPLES];
    unsigned int n = CTL_SAMPLES;
    nvmlReturn_t r = C.util(C.dev[g], sm, &n, C.last_ts[g]);
    if (r != NVML_SUCCESS || n > CTL_SAMPLES)
        return -1;
    tessera_region_slot *slots = (tessera_region_slot *)((char *)h + h->header_size);
    uint32_t hw = __atomic_load_n(&h->slot_high_water, __ATOMIC_ACQUIRE);
    if (hw > TESSERA_REGION_MAX_SLOTS)
        hw = TESSERA_REGION_MAX_SLOTS;
    uint64_t newest = 0;
    for (unsigned int i = 0; i < n; i++)
        if (sm[i].timeStamp > newest)
            newest = sm[i].timeStamp;
    /* the host pids of the live slots */
    static uint32_t host[TESSERA_REGION_MAX_SLOTS]; /* C.mu held */
    uint32_t nh = 0;
    for (uint32_t k = 0; k < hw; k++) {
        tessera_region_slot *sl = &slots[k];
        if (__atomic_load_n(&sl->state, __ATOMIC_ACQUIRE) != TESSERA_SLOT_LIVE)
            continue;
        int32_t pid = __atomic_load_n(&sl->pid, __ATOMIC_RELAXED);
        uint32_t hp = sl->pid_ns == PROC_PID_INIT_INO
                          ? (uint32_t)pid
                          : ts_driver_host_pid(k, __atomic_load_n(&sl->generation,
                                                                  __ATOMIC_RELAXED), pid);
        if (hp)
            host[nh++] = hp;
    }
    int total = 0, all = 0, matched = 0;
    for (unsigned int i = 0; i < n; i++) {
        if (sm[i].timeStamp != newest)
            continue;
        all += (int)sm[i].smUtil;
        for (uint32_t k = 0; k < nh; k++) {
            if (host[k] != sm[i].pid)
                continue;
            total += (int)sm[i].smUtil;
            matched = 1;
            break;
        }
    }
    C.last_ts[g] = newest;
    *mine = total;
    *idle = all >= 100 ? 0 : 100 - all;
    return matched ? 0 : -1;
}

/* The share the pacer holds GPU g's claim to, in tenths of a percent (1000: not paced), and
 * in *others what the GPU's other tenants are guaranteed together (tenths; -1: unknown, no
 * shares file). */
static uint32_t ctl_base(uint32_t cores, int lim, int64_t *others)
{
    uint32_t gv, nv;
    int known = lim >= 0 && G.lim.shares[0] &&
                read_shares(G.lim.shares, G.lim.gpus[lim].uuid, &gv, &nv) == 0;
    if (cores) {
        /* the others: the rest of the guarantees, and the best-effort tenants' part */
        *others = known ? (int64_t)(gv > cores ? gv - cores : 0) * 10 + (nv ? (100 - gv) * 10 : 0)
                        : -1;
        return cores * 10;
    }
    if (!known) {
        *others = -1;
        return 1000;
    }
    /* best effort: an equal part of what the limited claims' guarantees leave */
    uint32_t base = (100 - gv) * 10 / (nv ? nv : 1);
    *others = 1000 - (int64_t)base;
    return base;
}

/* The outer loop: at most once per TS_PACE_CTL_NS per claim, correct the cost factor and,
 * under a work-conserving policy or best effort, the part of the idle GPU time taken. */
static void ctl_step(tessera_region_header *h, int g, uint32_t word, uint64_t now)
{
    uint32_t cores = word & 0xff, policy = (word >> 8) & 0xff;
    int lim = (int)(word >> 16);
    tessera_region_gpu *gp = &h->gpus[g];
    uint32_t now_ms = (uint32_t)(now / 1000000ull);
    uint64_t w = __atomic_load_n(&gp->pace_scale, __ATOMIC_ACQUIRE);
    if ((uint32_t)(now_ms - (uint32_t)w) < TS_PACE_CTL_NS / 1000000ull)
        return;
    if (pthread_mutex_trylock(&C.mu) != 0)
        return;
    if (now >= C.next_try[g]) { /* the node's shares file, re-read every second */
        C.base[g] = ctl_base(cores, lim, &C.others[g]);
        C.next_try[g] = now + 1000000000ull;
    }
    uint64_t scale = PS_SCALE(w), bonus = PS_BONUS(w);
    /* claim this period for this process */
    if (!__atomic_compare_exchange_n(&gp->pace_scale, &w, PS_WORD(scale, bonus, now_ms), 0,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) ||
        !ctl_resolve() || !ctl_device(g, gp->uuid)) {
        pthread_mutex_unlock(&C.mu);
        return;
    }
    int u, idle;
    int ok = ctl_measure(h, g, &u, &idle) == 0;
    uint64_t paced = __atomic_load_n(&gp->paced_ns, __ATOMIC_ACQUIRE);
    int held = paced != C.paced_seen[g];
    C.paced_seen[g] = paced;
    uint64_t base = C.base[g], ns = scale, nb = bonus;
    if (ok && (policy == TESSERA_POLICY_WORK_CONSERVING || cores == 0)) {
        /* idle time is shared in proportion to the guaranteed shares. While the GPU is full
         * and the other tenants together are below their guarantees (one of them may be held
         * back by this claim's turns), the taken part gives back what they miss, and halves
         * when that is more than 2 points; else it is kept. Giving back the shortfall itself,
         * with no dead band, matters with several best-effort tenants: each one's small excess
         * is inside any band, and the guarantee loses their sum. */
        int64_t used = 100 - idle - u; /* the others' share, percent */
        int64_t oth = C.others[g];
        int64_t short_by = oth < 0 ? (used > 0 ? 1000 : 0) : oth - used * 10; /* tenths */
        if (idle > TS_PACE_IDLE) {
            nb = bonus + (uint64_t)(idle - TS_PACE_IDLE) * base / 100;
        } else if (short_by > 0) {
            nb = bonus > (uint64_t)short_by ? bonus - (uint64_t)short_by : 0;
            if (short_by > 20 && nb > bonus / 2)
                nb = bonus / 2;
        }
        if (base + nb > 1000)
            nb = 1000 - base;
    }
    uint64_t target = base + bonus; /* tenths of a percent */
    if (ok && target && target < 1000 && (held || (uint64_t)u * 10 > target)) {
        /* scale * (1 + (u/target - 1)/2); a strict claim above its cap: the full step,
         * scale * u/target (a cap errs towards under-use) */
        if (policy == TESSERA_POLICY_STRICT && cores && (uint64_t)u * 10 > target)
            ns = scale * (uint64_t)u * 10 / target;
        else
            ns = scale * (target + (uint64_t)u * 10) / (2ull * target);
        ns = ns < SCALE_MIN ? SCALE_MIN : ns > SCALE_MAX ? SCALE_MAX : ns;
    }
    if (ns != scale || nb != bonus) {
        uint64_t cur = PS_WORD(scale, bonus, now_ms);
        __atomic_compare_exchange_n(&gp->pace_scale, &cur, PS_WORD(ns, nb, now_ms), 0,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        ts_log(TS_DEBUG, "pacer: GPU %d measured %d%% (idle %d%%) of %.1f%%: scale %.3f -> %.3f",
               g, u, idle, (double)target / 10, (double)scale / SCALE_ONE,
               (double)ns / SCALE_ONE);
    }
    pthread_mutex_unlock(&C.mu);
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

CUresult ts_pace_launch(int g, uint32_t word, uint64_t key, CUstream stream,
                        ts_launch_thunk thunk, void *arg)
{
    tessera_region_header *h = ts_region_hdr();
    uint32_t cores = word & 0xff;
    if (!h || g < 0 || g >= TESSERA_REGION_MAX_GPUS || cores >= 100)
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
    ctl_step(h, g, word, now);
    uint64_t pw = __atomic_load_n(&gp->pace_scale, __ATOMIC_RELAXED);
    /* the share held to: cores (or a best-effort part) plus the idle time taken, in 0.1 % */
    uint64_t target = (cores ? cores * 10ull : C.base[g]) + PS_BONUS(pw);
    if (cost && target && target < 1000) {
        uint64_t inc = cost * PS_SCALE(pw) / SCALE_ONE * 1000 / target;
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
