/*
 * The fake GPU's contention model: one GPU shared by several processes, time-sliced.
 *
 * Enabled by $FAKE_SCHED naming a file that every process of a test maps MAP_SHARED (without
 * it the fake keeps its per-process queue model, fake_cuda.c). Included by fake libcuda.so.1
 * and fake libnvidia-ml.so.1, which both advance the model.
 *
 *   * A context is one process on one device (kernels of all of a process's streams share its
 *     turns). Contexts that have work are served round-robin in slices of $FAKE_SLICE_US
 *     (default 2000 µs); a kernel longer than a slice is preempted and resumed at its
 *     context's next turn; a context alone runs continuously; an idle context gives up the
 *     rest of its slice.
 *   * Within a turn, the streams of the context with a kernel at their head share the GPU
 *     equally (each progresses dt/k when k streams have work): the context's GPU time is the
 *     turn's length, however many streams it uses.
 *   * Launches are asynchronous and block while more than 20 ms of the context's work is
 *     queued.
 *   * Events are markers in their stream: stamped with the model time at which the GPU reaches
 *     them while their context is scheduled (the default). With $FAKE_EVENT_STAMP=record (the
 *     pessimistic variant), an event recorded on an idle stream is stamped at record time even
 *     while its context waits for its turn.
 *   * The model is advanced lazily, to wall time (CLOCK_MONOTONIC), on each call under a
 *     process-shared robust mutex; callers that wait sleep.
 *
 * A context's pid is its process's host pid (the first NSpid of /proc/self/status, the pid in
 * the namespace of the /proc the process sees: the host's unless the test mounted its own),
 * as the real driver and NVML report host pids whatever pid namespace the process runs in.
 *
 * What the tests read: each context's busy_ns (GPU time the model gave it), the device's
 * idle_ns and model time t (the layout below; tests/native/fake_sched.py parses it). The fake
 * NVML reports per-process utilisation (nvmlDeviceGetProcessUtilization) from the same
 * figures, sampled every $FAKE_NVML_SAMPLE_US (default 100000 µs) of model time.
 */
#ifndef FAKE_SCHED_H
#define FAKE_SCHED_H

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "fake_state.h"

#define FS_MAGIC 0x4653434845443031ULL /* "FSCHED01" */
#define FS_DEV 2
#define FS_CTX 16
#define FS_STREAMS 8
#define FS_RING 128
#define FS_EVENTS 256
#define FS_QUEUE_MAX_NS 20000000ull

enum { FS_KERNEL = 1, FS_EVENT = 2 };

typedef struct fs_item {
    uint32_t kind;
    uint32_t ev;
    uint64_t left_ns; /* kernel: work left; event: generation */
} fs_item;

typedef struct fs_stream {
    uint32_t head, tail; /* ring indices (tail - head items) */
    fs_item q[FS_RING];
} fs_stream;

typedef struct fs_event {
    uint64_t gen;
    uint64_t t; /* stamp (model ns) */
    uint32_t stamped;
    uint32_t pad;
} fs_event;

/* offsets used by tests/native/fake_sched.py: pid 0, live 4, busy_ns 8, queued_ns 16 */
typedef struct fs_ctx {
    int32_t pid;
    uint32_t live;
    uint64_t busy_ns;    /* GPU time this context was given */
    uint64_t queued_ns;  /* kernel work queued, not yet run */
    uint64_t mark_ns;    /* busy_ns at the start of the current NVML sample period */
    uint64_t util_ts_us; /* end of the last complete sample period (µs) */
    uint32_t util_pct;   /* utilisation over that period, percent */
    uint32_t pad;
    fs_stream s[FS_STREAMS];
    fs_event ev[FS_EVENTS];
} fs_ctx;

/* offsets: t 0, idle_ns 8, cur 16, nctx 20, slice_end 24, period_end 32, ctx 64 */
typedef struct fs_dev {
    uint64_t t;       /* model time reached (CLOCK_MONOTONIC ns) */
    uint64_t idle_ns; /* time no context had work */
    int32_t cur;      /* context being served, -1 none */
    uint32_t nctx;    /* contexts ever used (high-water) */
    uint64_t slice_end;
    uint64_t period_end;
    uint64_t pad[3];
    fs_ctx ctx[FS_CTX];
} fs_dev;

/* offsets: magic 0, slice_ns 8, stamp_record 16, sample_ns 24, mu 64, dev 128 */
typedef struct fs_state {
    uint64_t magic;
    uint64_t slice_ns;
    uint32_t stamp_record;
    uint32_t pad;
    uint64_t sample_ns;
    uint64_t pad2[4];
    pthread_mutex_t mu;
    char pad3[64 - sizeof(pthread_mutex_t) % 64];
    fs_dev dev[FS_DEV];
} fs_state;

/* the layout tests/native/fake_sched.py reads */
_Static_assert(sizeof(fs_ctx) == 22640, "fs_ctx is 22640 bytes");
_Static_assert(sizeof(fs_dev) == 64 + FS_CTX * 22640, "fs_dev: 64-byte header, then contexts");
_Static_assert(__builtin_offsetof(fs_state, dev) == 128, "devices at 128");
_Static_assert(__builtin_offsetof(fs_dev, idle_ns) == 8, "idle_ns at 8");
_Static_assert(__builtin_offsetof(fs_ctx, busy_ns) == 8, "busy_ns at 8");

extern fs_state *fs_p __attribute__((visibility("hidden")));
#ifdef FAKE_STATE_DEFINE
fs_state *fs_p;
#endif

static inline fs_state *fs_get(void)
{
    fs_state *s = __atomic_load_n(&fs_p, __ATOMIC_ACQUIRE);
    if (s)
        return s;
    const char *path = getenv("FAKE_SCHED");
    if (!path || !*path)
        return NULL;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        perror("fake: FAKE_SCHED");
        abort();
    }
    flock(fd, LOCK_EX);
    struct stat st;
    fstat(fd, &st);
    if (st.st_size < (off_t)sizeof(fs_state) && ftruncate(fd, sizeof(fs_state)) != 0)
        abort();
    s = mmap(NULL, sizeof(fs_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s == MAP_FAILED)
        abort();
    if (s->magic != FS_MAGIC) {
        const char *sl = getenv("FAKE_SLICE_US"), *es = getenv("FAKE_EVENT_STAMP"),
                   *sp = getenv("FAKE_NVML_SAMPLE_US");
        s->slice_ns = (sl && *sl ? strtoull(sl, NULL, 10) : 2000) * 1000ull;
        if (!s->slice_ns)
            s->slice_ns = 2000000ull;
        s->stamp_record = es && !strcmp(es, "record");
        s->sample_ns = (sp && *sp ? strtoull(sp, NULL, 10) : 100000) * 1000ull;
        if (!s->sample_ns)
            s->sample_ns = 100000000ull;
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&s->mu, &a);
        uint64_t now = fake_now_ns();
        for (int d = 0; d < FS_DEV; d++) {
            s->dev[d].t = now;
            s->dev[d].cur = -1;
            s->dev[d].period_end = now + s->sample_ns;
        }
        __atomic_store_n(&s->magic, FS_MAGIC, __ATOMIC_RELEASE);
    }
    flock(fd, LOCK_UN);
    close(fd);
    __atomic_store_n(&fs_p, s, __ATOMIC_RELEASE);
    return s;
}

static inline void fs_lock(fs_state *s)
{
    if (pthread_mutex_lock(&s->mu) == EOWNERDEAD)
        pthread_mutex_consistent(&s->mu);
}
static inline void fs_unlock(fs_state *s) { pthread_mutex_unlock(&s->mu); }

static inline int fs_stream_empty(const fs_stream *q) { return q->head == q->tail; }

static inline int fs_has_work(const fs_ctx *c)
{
    if (!c->live)
        return 0;
    for (int i = 0; i < FS_STREAMS; i++)
        if (!fs_stream_empty(&c->s[i]))
            return 1;
    return 0;
}

/* the next context after `from` (wrapping, `from` itself last) that has work, -1 none */
static inline int fs_next(fs_dev *d, int from)
{
    int n = (int)d->nctx;
    for (int k = 1; k <= n; k++) {
        int i = ((from < 0 ? -1 : from) + k) % n;
        if (i < 0)
            i += n;
        if (fs_has_work(&d->ctx[i]))
            return i;
    }
    return -1;
}

static inline void fs_stamp(fs_ctx *c, const fs_item *it, uint64_t t)
{
    fs_event *e = &c->ev[it->ev % FS_EVENTS];
    if (e->gen == it->left_ns) {
        e->t = t;
        e->stamped = 1;
    }
}

/* stamp the events at the heads of c's streams (the GPU reaches them at time t) */
static inline void fs_stamp_heads(fs_ctx *c, uint64_t t)
{
    for (int i = 0; i < FS_STREAMS; i++) {
        fs_stream *q = &c->s[i];
        while (!fs_stream_empty(q) && q->q[q->head % FS_RING].kind == FS_EVENT) {
            fs_stamp(c, &q->q[q->head % FS_RING], t);
            q->head++;
        }
    }
}

static inline void fs_period(fs_state *s, fs_dev *d)
{
    for (uint32_t i = 0; i < d->nctx; i++) {
        fs_ctx *c = &d->ctx[i];
        uint64_t b = c->busy_ns - c->mark_ns;
        c->util_pct = (uint32_t)((b * 100 + s->sample_ns / 2) / s->sample_ns);
        c->util_ts_us = d->period_end / 1000;
        c->mark_ns = c->busy_ns;
    }
    d->period_end += s->sample_ns;
}

/* Advance device d's model to `now`. Lock held. */
static inline void fs_advance(fs_state *s, fs_dev *d, uint64_t now)
{
    while (d->t < now) {
        if (d->t >= d->period_end) {
            fs_period(s, d);
            continue;
        }
        uint64_t lim = now < d->period_end ? now : d->period_end;
        if (d->cur < 0 || !fs_has_work(&d->ctx[d->cur])) {
            d->cur = fs_next(d, d->cur);
            if (d->cur < 0) { /* nothing to do: idle */
                d->idle_ns += lim - d->t;
                d->t = lim;
                continue;
            }
            d->slice_end = d->t + s->slice_ns;
        }
        if (d->t >= d->slice_end) { /* slice over: the next context with work, if any */
            int n = fs_next(d, d->cur);
            if (n >= 0)
                d->cur = n;
            d->slice_end = d->t + s->slice_ns;
        }
        fs_ctx *c = &d->ctx[d->cur];
        fs_stamp_heads(c, d->t);
        int k = 0;
        uint64_t minleft = UINT64_MAX;
        for (int i = 0; i < FS_STREAMS; i++) {
            fs_stream *q = &c->s[i];
            if (fs_stream_empty(q))
                continue;
            k++;
            uint64_t l = q->q[q->head % FS_RING].left_ns;
            if (l < minleft)
                minleft = l;
        }
        if (!k)
            continue; /* only events were left: stamped */
        uint64_t dt = lim - d->t;
        if (minleft * (uint64_t)k < dt)
            dt = minleft * (uint64_t)k;
        if (d->slice_end - d->t < dt && fs_next(d, d->cur) != d->cur)
            dt = d->slice_end - d->t;
        uint64_t per = dt / (uint64_t)k;
        if (!per) {
            per = 1;
            dt = (uint64_t)k;
        }
        for (int i = 0; i < FS_STREAMS; i++) {
            fs_stream *q = &c->s[i];
            if (fs_stream_empty(q))
                continue;
            fs_item *it = &q->q[q->head % FS_RING];
            it->left_ns = it->left_ns > per ? it->left_ns - per : 0;
            if (!it->left_ns)
                q->head++;
        }
        c->busy_ns += dt;
        c->queued_ns = c->queued_ns > dt ? c->queued_ns - dt : 0;
        d->t += dt;
    }
    if (d->cur >= 0)
        fs_stamp_heads(&d->ctx[d->cur], d->t);
}

/* This process's pid as the driver sees it (the module comment), getpid() where /proc
 * shows no NSpid. */
static inline int32_t fs_host_pid(void)
{
    static int32_t cached, cached_for;
    int32_t self = (int32_t)getpid();
    if (cached && cached_for == self)
        return cached;
    int32_t hp = self;
    FILE *f = fopen("/proc/self/status", "re");
    if (f) {
        char line[256];
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "NSpid: %d", &hp) == 1)
                break;
        fclose(f);
    }
    cached = hp;
    cached_for = self;
    return hp;
}

/* a host pid no process has any more (kill cannot see outside a pid namespace: /proc can) */
static inline int fs_pid_gone(int32_t pid)
{
    char path[32];
    snprintf(path, sizeof(path), "/proc/%d", (int)pid);
    return kill(pid, 0) != 0 && errno == ESRCH && access(path, F_OK) != 0;
}

/* this process's context on physical device p (created on first use), lock held */
static inline fs_ctx *fs_ctx_of(fs_state *s, int p, int create)
{
    if (p < 0 || p >= FS_DEV)
        return NULL;
    fs_dev *d = &s->dev[p];
    int32_t pid = fs_host_pid();
    for (uint32_t i = 0; i < d->nctx; i++)
        if (d->ctx[i].pid == pid && d->ctx[i].live)
            return &d->ctx[i];
    if (!create)
        return NULL;
    int slot = -1;
    if (d->nctx < FS_CTX)
        slot = (int)d->nctx++;
    else
        for (int i = 0; i < FS_CTX; i++)
            if (!d->ctx[i].live || fs_pid_gone(d->ctx[i].pid)) {
                slot = i;
                break;
            }
    if (slot < 0)
        return NULL;
    fs_ctx *c = &d->ctx[slot];
    memset(c, 0, sizeof(*c));
    c->pid = pid;
    c->live = 1;
    return c;
}

#endif
