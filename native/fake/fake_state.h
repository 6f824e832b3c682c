/*
 * State of the fake GPUs, shared by fake libcuda.so.1 and fake libnvidia-ml.so.1 and by every
 * process of a test through a MAP_SHARED file ($FAKE_GPU_STATE; process-private without it).
 *
 * Devices come from $FAKE_GPUS = "UUID=BYTES[,UUID=BYTES...]" (default: two 16 GiB GPUs).
 * The first process to open an empty state file initialises it (under flock).
 */
#ifndef FAKE_STATE_H
#define FAKE_STATE_H

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FAKE_MAX_DEV 8
#define FAKE_MAX_OBJ 4096
#define FAKE_MAX_PROCS 256
#define FAKE_MAGIC 0x46414b4547505554ULL

typedef struct fake_dev {
    char uuid[48];
    uint64_t total;
    uint64_t used; /* atomic: bytes allocated from the fake driver, all processes */
    uint64_t peak; /* atomic: highest value of used */
    uint64_t ctx_bytes;
} fake_dev;

/* A physical allocation made with cuMemCreate (or a multicast object), shared by every process
 * of a test so that an importer finds what an exporter made. Its memory is returned when no
 * handle (refs), no mapping or binding (holds) and no exported file descriptor (exports) is
 * left, as the real driver does. */
typedef struct fake_obj {
    uint32_t live;
    int32_t phys; /* physical device, -1 for host memory and multicast objects */
    uint64_t bytes;
    int32_t refs;
    int32_t holds;
    int32_t exports;
    uint32_t export_seq;
    uint32_t multicast;
    int32_t loc_type;
} fake_obj;

/* What one process holds of each device, as the driver counts it (NVML's per-process used
 * memory): every byte it took from a device through fake_take, less what it gave back, its
 * contexts and the pages of its allocations included. Kept by the fake itself, never from the
 * enforcement library's bookkeeping. */
typedef struct fake_proc {
    int32_t pid; /* 0: free entry (atomic) */
    uint32_t pad;
    uint64_t used[FAKE_MAX_DEV]; /* atomic */
} fake_proc;

typedef struct fake_state {
    uint64_t magic;
    uint32_t ndev;
    uint32_t pad;
    fake_dev dev[FAKE_MAX_DEV];
    fake_obj obj[FAKE_MAX_OBJ];
    fake_proc procs[FAKE_MAX_PROCS];
} fake_state;

/* One mapping per library (each of fake libcuda and fake libnvidia-ml defines the storage once
 * with FAKE_STATE_DEFINE), shared by all its translation units. */
extern fake_state *fake_state_p __attribute__((visibility("hidden")));
extern char fake_state_path[512] __attribute__((visibility("hidden")));
extern int fake_state_fd __attribute__((visibility("hidden")));
#ifdef FAKE_STATE_DEFINE
fake_state *fake_state_p;
char fake_state_path[512];
int fake_state_fd = -1;
#endif

static inline fake_state *fake_state_get(void)
{
    fake_state *st = __atomic_load_n(&fake_state_p, __ATOMIC_ACQUIRE);
    if (st)
        return st;
    const char *path = getenv("FAKE_GPU_STATE");
    fake_state *m;
    int fd = -1;
    if (path && *path) {
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0) {
            perror("fake: FAKE_GPU_STATE");
            abort();
        }
        flock(fd, LOCK_EX);
        struct stat s;
        fstat(fd, &s);
        if (s.st_size < (off_t)sizeof(fake_state) && ftruncate(fd, sizeof(fake_state)) != 0)
            abort();
        m = mmap(NULL, sizeof(fake_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        snprintf(fake_state_path, sizeof(fake_state_path), "%s", path);
    } else {
        m = mmap(NULL, sizeof(fake_state), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
        snprintf(fake_state_path, sizeof(fake_state_path), "/tmp/fakecuda.%d", (int)getpid());
    }
    if (m == MAP_FAILED)
        abort();
    if (m->magic != FAKE_MAGIC) {
        const char *spec = getenv("FAKE_GPUS");
        if (!spec || !*spec)
            spec = "GPU-11111111-2222-3333-4444-555555555555=17179869184,"
                   "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee=17179869184";
        char buf[1024];
        snprintf(buf, sizeof(buf), "%s", spec);
        m->ndev = 0;
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && m->ndev < FAKE_MAX_DEV;
             tok = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(tok, '=');
            if (!eq)
                continue;
            *eq = '\0';
            fake_dev *d = &m->dev[m->ndev++];
            snprintf(d->uuid, sizeof(d->uuid), "%s", tok);
            d->total = strtoull(eq + 1, NULL, 10);
        }
        const char *cb = getenv("FAKE_CTX_BYTES");
        for (uint32_t i = 0; i < m->ndev; i++)
            m->dev[i].ctx_bytes = cb ? strtoull(cb, NULL, 10) : 0;
        __atomic_store_n(&m->magic, FAKE_MAGIC, __ATOMIC_RELEASE);
    }
    if (fd >= 0)
        flock(fd, LOCK_UN);
    fake_state_fd = fd; /* kept open: cross-process lock of the shared object table */
    __atomic_store_n(&fake_state_p, m, __ATOMIC_RELEASE);
    return m;
}

/* This process's entry in the per-process table (claimed on first use; an entry of a dead
 * process is taken over); NULL if the table is full. */
static fake_proc *fake_self_cached; /* per translation unit; dropped in a forked child */
static void fake_self_forget(void) { fake_self_cached = NULL; }

static inline fake_proc *fake_self(void)
{
    static int registered;
    if (fake_self_cached)
        return fake_self_cached;
    if (!__atomic_exchange_n(&registered, 1, __ATOMIC_ACQ_REL))
        pthread_atfork(NULL, NULL, fake_self_forget);
    int32_t me = (int32_t)getpid();
    fake_state *st = fake_state_get();
    fake_proc *found = NULL;
    for (int i = 0; i < FAKE_MAX_PROCS && !found; i++)
        if (__atomic_load_n(&st->procs[i].pid, __ATOMIC_ACQUIRE) == me)
            found = &st->procs[i];
    for (int i = 0; i < FAKE_MAX_PROCS && !found; i++) {
        int32_t cur = __atomic_load_n(&st->procs[i].pid, __ATOMIC_ACQUIRE);
        if (cur != 0 && (kill(cur, 0) == 0 || errno == EPERM))
            continue;
        if (__atomic_compare_exchange_n(&st->procs[i].pid, &cur, me, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            for (int d = 0; d < FAKE_MAX_DEV; d++)
                __atomic_store_n(&st->procs[i].used[d], 0, __ATOMIC_RELEASE);
            found = &st->procs[i];
        }
    }
    fake_self_cached = found;
    return found;
}

/* Take bytes from device i; 0 on success, -1 if the fake GPU is full. */
static inline int fake_take(uint32_t i, uint64_t bytes)
{
    fake_dev *d = &fake_state_get()->dev[i];
    uint64_t cur = __atomic_load_n(&d->used, __ATOMIC_ACQUIRE);
    do {
        if (bytes > d->total || cur > d->total - bytes)
            return -1;
    } while (!__atomic_compare_exchange_n(&d->used, &cur, cur + bytes, 0, __ATOMIC_ACQ_REL,
                                          __ATOMIC_ACQUIRE));
    uint64_t now = cur + bytes, pk = __atomic_load_n(&d->peak, __ATOMIC_ACQUIRE);
    while (now > pk &&
           !__atomic_compare_exchange_n(&d->peak, &pk, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    fake_proc *me = fake_self();
    if (me)
        __atomic_add_fetch(&me->used[i], bytes, __ATOMIC_ACQ_REL);
    return 0;
}

static inline void fake_give(uint32_t i, uint64_t bytes)
{
    __atomic_sub_fetch(&fake_state_get()->dev[i].used, bytes, __ATOMIC_ACQ_REL);
    /* memory given back by another process than the one that took it (the last holder of an
     * imported VMM allocation) comes off the giver's figure, floored at 0 */
    fake_proc *me = fake_self();
    if (!me)
        return;
    uint64_t cur = __atomic_load_n(&me->used[i], __ATOMIC_ACQUIRE);
    while (!__atomic_compare_exchange_n(&me->used[i], &cur, cur > bytes ? cur - bytes : 0, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
}

static inline uint64_t fake_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* 16 raw UUID bytes of "GPU-xxxxxxxx-xxxx-..." */
static inline void fake_uuid_bytes(const char *s, char out[16])
{
    int k = 0;
    for (const char *p = s + 4; *p && k < 32; p++) {
        if (*p == '-')
            continue;
        int v = (*p >= '0' && *p <= '9') ? *p - '0' : ((*p | 0x20) - 'a' + 10);
        if (k % 2 == 0)
            out[k / 2] = (char)(v << 4);
        else
            out[k / 2] = (char)(out[k / 2] | v);
        k++;
    }
}

#endif
