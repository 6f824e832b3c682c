/* The claim's shared usage region: see tessera_region.h for the layout and the locking rules. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core.h"

#define LOAD32(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define LOAD64(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE32(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define STORE64(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

static int ofd_lock(int fd, short type, off_t off, int wait)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = off;
    fl.l_len = 1;
    for (;;) {
        if (fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) == 0)
            return 0;
        if (errno != EINTR)
            return -1;
    }
}

/* 1 if some other open file description holds a lock on byte off (its owner is alive). */
static int ofd_held_by_other(int fd, off_t off)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = off;
    fl.l_len = 1;
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
        return 1; /* cannot tell: treat as alive (never reclaim on doubt) */
    return fl.l_type != F_UNLCK;
}

static void region_lock(ts_region *r)
{
    pthread_mutex_lock(&r->mu);
    if (r->fd >= 0)
        ofd_lock(r->fd, F_WRLCK, TESSERA_REGION_LOCK_BYTE, 1);
}

static void region_unlock(ts_region *r)
{
    if (r->fd >= 0)
        ofd_lock(r->fd, F_UNLCK, TESSERA_REGION_LOCK_BYTE, 0);
    pthread_mutex_unlock(&r->mu);
}

static void self_identity(int32_t *pid, uint64_t *pid_ns, uint64_t *start_time)
{
    struct stat st;
    *pid = (int32_t)getpid();
    *pid_ns = stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
    *start_time = 0;
    FILE *f = fopen("/proc/self/stat", "re");
    if (f) {
        char buf[1024];
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        char *p = strrchr(buf, ')'); /* comm may contain spaces */
        if (p) {
            /* after ')' come fields 3..; start_time is field 22 */
            int field = 2;
            for (char *q = p + 1; *q; q++) {
                if (*q == ' ') {
                    field++;
                    if (field == 22) {
                        *start_time = strtoull(q + 1, NULL, 10);
                        break;
                    }
                }
            }
        }
    }
}

static void init_header(tessera_region_header *h, uint64_t context_overhead)
{
    memset(h, 0, sizeof(*h));
    h->version = TESSERA_REGION_VERSION;
    h->header_size = TESSERA_REGION_HEADER_SIZE;
    h->slot_size = TESSERA_REGION_SLOT_SIZE;
    h->slot_count = TESSERA_REGION_MAX_SLOTS;
    h->context_overhead = context_overhead;
    STORE64(&h->magic, TESSERA_REGION_MAGIC);
}

static int validate(const tessera_region_header *h, char *err, size_t errlen)
{
    if (LOAD64(&h->magic) != TESSERA_REGION_MAGIC) {
        snprintf(err, errlen, "bad magic");
        return -1;
    }
    /* The library reads and writes one layout, its own (the node driver creates the region in
     * it); a reader of several versions is the monitor (tessera.enforcement.region). */
    if (h->version != TESSERA_REGION_VERSION) {
        snprintf(err, errlen, "region version %u, this library uses version %u only", h->version,
                 TESSERA_REGION_VERSION);
        return -1;
    }
    if (h->header_size != TESSERA_REGION_HEADER_SIZE ||
        h->slot_size != TESSERA_REGION_SLOT_SIZE || h->slot_count != TESSERA_REGION_MAX_SLOTS) {
        snprintf(err, errlen, "unsupported layout (version %u)", h->version);
        return -1;
    }
    return 0;
}

/*
 * Hold the liveness lock of slot i so that no code in this process can release it: the lock is
 * taken through a second open file description of the region, a one-page read-only mapping is
 * made through it, and the descriptor is closed. The description (and its lock) then lives as
 * long as the mapping: there is no descriptor left to F_OFD_SETLK F_UNLCK with, and opening the
 * file again creates a different description. The page is not inherited by fork (a child must
 * not keep its parent's slot alive) and is sealed against munmap where the kernel has mseal
 * (Linux 6.10+). It goes away only when the process exits or execs. 0 on success.
 */
static int hold_slot_lock(ts_region *r, uint32_t i)
{
    int fd = open(r->path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (ofd_lock(fd, F_WRLCK, (off_t)TESSERA_REGION_SLOT_OFFSET(i), 0) != 0) {
        close(fd);
        return -1;
    }
    long page = sysconf(_SC_PAGESIZE);
    void *m = mmap(NULL, (size_t)page, PROT_READ, MAP_SHARED, fd, 0);
    close(fd); /* the mapping keeps the description, and the lock, alive */
    if (m == MAP_FAILED)
        return -1; /* closing the descriptor released the lock */
    madvise(m, (size_t)page, MADV_DONTFORK);
#ifdef SYS_mseal
    long sr = syscall(SYS_mseal, m, (size_t)page, 0UL);
#elif defined(__x86_64__) || defined(__aarch64__)
    long sr = syscall(462, m, (size_t)page, 0UL); /* mseal, Linux 6.10+ */
#else
    long sr = -1;
#endif
    if (sr != 0)
        ts_log(TS_DEBUG, "mseal of the slot lock page unavailable (%s)", strerror(errno));
    return 0;
}

/* Claim a free or dead slot; region lock held. */
static int claim_slot(ts_region *r)
{
    tessera_region_header *h = r->hdr;
    int32_t pid;
    uint64_t pid_ns, start_time;
    self_identity(&pid, &pid_ns, &start_time);
    for (uint32_t i = 0; i < TESSERA_REGION_MAX_SLOTS; i++) {
        tessera_region_slot *s = &r->slots[i];
        if (LOAD32(&s->state) == TESSERA_SLOT_LIVE) {
            if (r->fd < 0 || ofd_held_by_other(r->fd, (off_t)TESSERA_REGION_SLOT_OFFSET(i)))
                continue;
            /* dead owner: reclaim below by reusing */
        }
        if (r->fd >= 0 && hold_slot_lock(r, i) != 0)
            continue;
        STORE32(&s->state, TESSERA_SLOT_FREE);
        for (int g = 0; g < TESSERA_REGION_MAX_GPUS; g++) {
            STORE64(&s->used[g], 0);
            STORE32(&s->contexts[g], 0);
        }
        s->pid = pid;
        s->pid_ns = pid_ns;
        s->start_time = start_time;
        s->generation = __atomic_add_fetch(&h->generation, 1, __ATOMIC_ACQ_REL);
        r->generation = s->generation;
        STORE32(&s->state, TESSERA_SLOT_LIVE);
        if (LOAD32(&h->slot_high_water) < i + 1)
            STORE32(&h->slot_high_water, i + 1);
        return (int)i;
    }
    return -1;
}

/* Region lock held. If our slot is no longer ours (another process found it dead and reclaimed
 * it, or it was overwritten), claim a new one and charge again what this process holds. */
static void keep_slot(ts_region *r)
{
    if (r->slot < 0)
        return;
    tessera_region_slot *s = &r->slots[r->slot];
    if (LOAD32(&s->state) == TESSERA_SLOT_LIVE && s->generation == r->generation)
        return;
    int old = r->slot;
    r->slot = claim_slot(r);
    if (r->slot < 0) {
        ts_log(TS_ERR, "slot %d was taken from this live process and no slot is free", old);
        return;
    }
    tessera_region_slot *n = &r->slots[r->slot];
    for (int g = 0; g < TESSERA_REGION_MAX_GPUS; g++) {
        STORE64(&n->used[g], r->mine[g]);
        STORE32(&n->contexts[g], r->mine_ctx[g]);
    }
    ts_log(TS_ERR, "slot %d was taken from this live process; its usage is charged again in slot %d",
           old, r->slot);
}

int ts_region_open(ts_region *r, const char *path, uint64_t context_overhead, char *err,
                   size_t errlen)
{
    memset(r, 0, sizeof(*r));
    r->fd = -1;
    r->slot = -1;
    pthread_mutex_init(&r->mu, NULL);
    snprintf(r->path, sizeof(r->path), "%s", path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        snprintf(err, errlen, "open %s: %s", path, strerror(errno));
        return -1;
    }
    if (ofd_lock(fd, F_WRLCK, TESSERA_REGION_LOCK_BYTE, 1) != 0) {
        snprintf(err, errlen, "lock %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0)
        goto fail_errno;
    int fresh = st.st_size == 0;
    if (fresh) {
        if (ftruncate(fd, (off_t)TESSERA_REGION_FILE_SIZE) != 0)
            goto fail_errno;
    } else if ((uint64_t)st.st_size != TESSERA_REGION_FILE_SIZE) {
        snprintf(err, errlen, "%s: size %lld, expected %llu", path, (long long)st.st_size,
                 (unsigned long long)TESSERA_REGION_FILE_SIZE);
        goto fail;
    }
    void *m = mmap(NULL, TESSERA_REGION_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        goto fail_errno;
    r->fd = fd;
    r->hdr = m;
    r->slots = (tessera_region_slot *)((char *)m + TESSERA_REGION_HEADER_SIZE);
    if (fresh)
        init_header(r->hdr, context_overhead);
    if (validate(r->hdr, err, errlen) != 0) {
        munmap(m, TESSERA_REGION_FILE_SIZE);
        r->hdr = NULL;
        r->fd = -1;
        goto fail;
    }
    r->slot = claim_slot(r);
    ofd_lock(fd, F_UNLCK, TESSERA_REGION_LOCK_BYTE, 0);
    if (r->slot < 0) {
        snprintf(err, errlen, "%s: all %d process slots are live", path, TESSERA_REGION_MAX_SLOTS);
        munmap(m, TESSERA_REGION_FILE_SIZE);
        close(fd);
        r->hdr = NULL;
        r->fd = -1;
        return -1;
    }
    return 0;
fail_errno:
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
fail:
    ofd_lock(fd, F_UNLCK, TESSERA_REGION_LOCK_BYTE, 0);
    close(fd);
    return -1;
}

int ts_region_gpu(ts_region *r, const char *uuid, uint64_t limit, uint32_t cores)
{
    tessera_region_header *h = r->hdr;
    uint32_t n = LOAD32(&h->gpu_count);
    for (uint32_t i = 0; i < n && i < TESSERA_REGION_MAX_GPUS; i++)
        if (tessera_uuid_equal(h->gpus[i].uuid, uuid))
            return (int)i;
    int idx = -1;
    region_lock(r);
    n = LOAD32(&h->gpu_count);
    for (uint32_t i = 0; i < n && i < TESSERA_REGION_MAX_GPUS; i++)
        if (tessera_uuid_equal(h->gpus[i].uuid, uuid))
            idx = (int)i;
    if (idx < 0 && n < TESSERA_REGION_MAX_GPUS) {
        tessera_region_gpu *e = &h->gpus[n];
        memset(e, 0, sizeof(*e));
        snprintf(e->uuid, sizeof(e->uuid), "%s", uuid);
        e->memory_limit = limit;
        e->cores = cores;
        e->flags = TESSERA_GPU_IN_USE;
        STORE32(&h->gpu_count, n + 1);
        idx = (int)n;
    }
    region_unlock(r);
    return idx;
}

static uint64_t usage_locked(ts_region *r, int g)
{
    uint64_t sum = 0;
    uint32_t hw = LOAD32(&r->hdr->slot_high_water);
    for (uint32_t i = 0; i < hw && i < TESSERA_REGION_MAX_SLOTS; i++)
        if (LOAD32(&r->slots[i].state) == TESSERA_SLOT_LIVE)
            sum += LOAD64(&r->slots[i].used[g]);
    return sum;
}

static int reclaim_locked(ts_region *r)
{
    if (r->fd < 0)
        return 0;
    int n = 0;
    uint32_t hw = LOAD32(&r->hdr->slot_high_water);
    for (uint32_t i = 0; i < hw && i < TESSERA_REGION_MAX_SLOTS; i++) {
        tessera_region_slot *s = &r->slots[i];
        if ((int)i == r->slot || LOAD32(&s->state) != TESSERA_SLOT_LIVE)
            continue;
        if (ofd_held_by_other(r->fd, (off_t)TESSERA_REGION_SLOT_OFFSET(i)))
            continue;
        ts_log(TS_INFO, "reclaiming slot %u of dead pid %d", i, s->pid);
        /* Mark free first: a crash between these stores leaves a FREE slot whose stale used[]
         * is ignored by every sum and cleared by the next claim. */
        STORE32(&s->state, TESSERA_SLOT_FREE);
        for (int g = 0; g < TESSERA_REGION_MAX_GPUS; g++) {
            STORE64(&s->used[g], 0);
            STORE32(&s->contexts[g], 0);
        }
        n++;
    }
    return n;
}

int ts_region_charge(ts_region *r, int g, uint64_t bytes, uint32_t ncontexts, uint64_t limit)
{
    if (r->slot < 0)
        return -1;
    int rc = -1;
    region_lock(r);
    keep_slot(r);
    for (int attempt = 0; attempt < 2 && r->slot >= 0; attempt++) {
        uint64_t used = usage_locked(r, g);
        if (used <= limit && bytes <= limit - used) {
            tessera_region_slot *s = &r->slots[r->slot];
            __atomic_add_fetch(&s->used[g], bytes, __ATOMIC_ACQ_REL);
            __atomic_add_fetch(&r->mine[g], bytes, __ATOMIC_ACQ_REL);
            if (ncontexts) {
                __atomic_add_fetch(&s->contexts[g], ncontexts, __ATOMIC_ACQ_REL);
                __atomic_add_fetch(&r->mine_ctx[g], ncontexts, __ATOMIC_ACQ_REL);
            }
            rc = 0;
            break;
        }
        if (attempt == 0 && reclaim_locked(r) == 0)
            break;
    }
    region_unlock(r);
    return rc;
}

void ts_region_force(ts_region *r, int g, uint64_t bytes)
{
    if (r->slot < 0 || bytes == 0)
        return;
    region_lock(r);
    keep_slot(r);
    if (r->slot >= 0) {
        __atomic_add_fetch(&r->slots[r->slot].used[g], bytes, __ATOMIC_ACQ_REL);
        __atomic_add_fetch(&r->mine[g], bytes, __ATOMIC_ACQ_REL);
    }
    region_unlock(r);
}

void ts_region_credit(ts_region *r, int g, uint64_t bytes, uint32_t ncontexts)
{
    if (r->slot < 0)
        return;
    tessera_region_slot *s = &r->slots[r->slot];
    /* Only this process changes its own slot; never go below zero. */
    uint64_t cur = LOAD64(&s->used[g]);
    while (!__atomic_compare_exchange_n(&s->used[g], &cur, cur >= bytes ? cur - bytes : 0, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    cur = LOAD64(&r->mine[g]);
    while (!__atomic_compare_exchange_n(&r->mine[g], &cur, cur >= bytes ? cur - bytes : 0, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    if (ncontexts) {
        uint32_t c = LOAD32(&s->contexts[g]);
        while (!__atomic_compare_exchange_n(&s->contexts[g], &c, c >= ncontexts ? c - ncontexts : 0,
                                            0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        }
        c = LOAD32(&r->mine_ctx[g]);
        while (!__atomic_compare_exchange_n(&r->mine_ctx[g], &c, c >= ncontexts ? c - ncontexts : 0,
                                            0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        }
    }
}

uint64_t ts_region_usage(ts_region *r, int g, int reclaim)
{
    if (!reclaim)
        return usage_locked(r, g);
    region_lock(r);
    reclaim_locked(r);
    uint64_t u = usage_locked(r, g);
    region_unlock(r);
    return u;
}

int ts_region_reclaim(ts_region *r)
{
    region_lock(r);
    int n = reclaim_locked(r);
    region_unlock(r);
    return n;
}

void ts_region_leave(ts_region *r)
{
    if (!r->hdr || r->slot < 0)
        return;
    region_lock(r);
    tessera_region_slot *s = &r->slots[r->slot];
    if (LOAD32(&s->state) == TESSERA_SLOT_LIVE && s->generation == r->generation) {
        STORE32(&s->state, TESSERA_SLOT_FREE);
        for (int g = 0; g < TESSERA_REGION_MAX_GPUS; g++) {
            STORE64(&s->used[g], 0);
            STORE32(&s->contexts[g], 0);
        }
    }
    /* The slot's lock stays held until the process is gone (see hold_slot_lock); a FREE slot
     * is skipped by every sum, and claim_slot takes another one while the lock is held. */
    r->slot = -1;
    region_unlock(r);
}

void ts_region_forget(ts_region *r)
{
    if (r->hdr)
        munmap(r->hdr, TESSERA_REGION_FILE_SIZE);
    if (r->fd >= 0)
        close(r->fd); /* the parent's descriptor stays open in the parent */
    r->hdr = NULL;
    memset(r->mine, 0, sizeof(r->mine));
    memset(r->mine_ctx, 0, sizeof(r->mine_ctx));
    r->slots = NULL;
    r->fd = -1;
    r->slot = -1;
    pthread_mutex_init(&r->mu, NULL);
}
