/*
 * fake_nvml_config.h - a node's GPUs for the fake libnvidia-ml.so.1, described in a text file
 * named by $FAKE_NVML_CONFIG (included by fake_nvml.c only).
 *
 * The file is read again whenever its size or modification time changes, so a test changes a
 * running node (a GPU lost, an XID, a GPU gone) by rewriting it (atomically: write + rename).
 * Format, one statement per line, '#' starts a comment line, tokens separated by blanks,
 * values with blanks in double quotes:
 *
 *     driver-version 615.20.01          nvmlSystemGetDriverVersion
 *     cuda-version 13040                nvmlSystemGetCudaDriverVersion (1000*major + 10*minor)
 *     memory-limits yes|no              nvmlDevice{Get,Set}MemoryLimits_v1 work (r615+) or
 *                                       return NVML_ERROR_NOT_SUPPORTED (older drivers)
 *     gpu UUID key=value...             one GPU, in index order. Keys:
 *         name="NVIDIA H100 80GB HBM3"  memory=<bytes>  pci=<bus id, as NVML prints it>
 *         reserved=<bytes> (FB memory the driver keeps: nvmlMemory_v2_t.reserved, default 0)
 *         cc=<major>.<minor>  minor=<device minor number: /dev/nvidia<minor>>
 *         mig=0|1 (current MIG mode)  health=ok|lost (lost: every query of this GPU returns
 *         NVML_ERROR_GPU_IS_LOST, as after an XID 79 "fallen off the bus")
 *         numa=<node> (nvmlDeviceGetMemoryAffinity, scope node: the GPU's NUMA node)
 *         nvlink=<group> (GPUs with the same non-zero group are NVLink peers:
 *         nvmlDeviceGetP2PStatus(..., NVML_P2P_CAPS_INDEX_NVLINK) answers OK between them,
 *         unless one is in MIG mode)
 *     xid ID UUID CODE                  an XID event (ID: increasing integer). An event set
 *                                       delivers the events whose ID is above the largest ID in
 *                                       the file when the set was created.
 *
 * MIG (after the GPU's `gpu` line):
 *
 *     migprofile UUID const=<NVML_GPU_INSTANCE_PROFILE_* value> id=<profile id> name=<1g.10gb>
 *         slices=<compute slices> memslices=<memory slices> memory=<MiB> sms=<SMs>
 *         starts=<a,b,...>              a GPU-instance profile of the GPU and its placements
 *                                       (nvmlDeviceGetGpuInstanceProfileInfoV, ...Placements)
 *     gi UUID <gi id> profile=<id> start=<s> size=<memory slices> slices=<compute slices>
 *         memory=<MiB> sms=<SMs> name=<profile name>
 *                                       a GPU instance that exists (made by someone else)
 *     ci UUID <gi id> <ci id> profile=<CI profile id> slices=<compute slices> sms=<SMs>
 *         uuid=<MIG-...> name=<profile name as nvidia-smi -L prints it, 1c.3g.71gb>
 *                                       a compute instance (a MIG device) of that GPU instance
 *     mig-state PATH                    GPU and compute instances live in PATH (same gi/ci
 *                                       lines; written from this file's when PATH is missing),
 *                                       shared by every process, so they survive a process as
 *                                       on a real GPU. Without it the instances are this file's
 *                                       and creating or destroying one is refused
 *                                       (NVML_ERROR_NO_PERMISSION).
 *     mig-log PATH                      every creation and destruction appends one line:
 *                                       create-gi UUID gi=<id> profile=<id> start=<s> size=<n>
 *                                       create-ci UUID gi=<id> ci=<id> profile=<id> uuid=<MIG->
 *                                       destroy-ci UUID gi=<id> ci=<id>
 *                                       destroy-gi UUID gi=<id>            (each with pid=<pid>)
 *     mig-crash-after OP [N]            the process kills itself with SIGKILL right after its
 *                                       N-th (default first) successful OP (create-gi,
 *                                       create-ci, destroy-ci, destroy-gi) is in the state file
 *                                       and the log: a deterministic crash between NVML calls.
 *
 * MIG devices (nvmlDeviceGetMigDeviceHandleByIndex) are the compute instances, in GPU-instance
 * then compute-instance id order; their UUID, memory (the GPU instance's) and attributes (SMs)
 * come from the ci/gi lines. Creation checks what NVML checks: MIG mode on, a known profile and
 * placement, free memory slices and compute slices; a GPU instance with compute instances cannot
 * be destroyed (NVML_ERROR_IN_USE). GPU-instance ids are the lowest free from 1, compute-instance
 * ids the lowest free from 0; a created MIG device's UUID is new each time.
 *
 * Memory "used" of a GPU is the bytes taken from the fake libcuda by all processes when
 * fake_state.h has a device with the same UUID, else 0. Memory limits set through
 * nvmlDeviceSetMemoryLimits_v1 are kept per (GPU, cgroup path) in this process only.
 */
#ifndef FAKE_NVML_CONFIG_H
#define FAKE_NVML_CONFIG_H

#include <ctype.h>
#include <pthread.h>

#include <signal.h>

#define FCFG_MAX_GPUS 64
#define FCFG_MAX_XIDS 256
#define FCFG_MAX_LIMITS 256
#define FCFG_MAX_PROF 16
#define FCFG_MAX_STARTS 8
#define FCFG_MAX_GI 8   /* GPU instances per GPU */
#define FCFG_MAX_CI 8   /* compute instances per GPU instance */
#define FCFG_GI_IDS 16  /* GPU-instance ids 0..15 */
#define FCFG_NVML_ERROR_NO_PERMISSION 4
#define FCFG_NVML_ERROR_NOT_FOUND 6
#define FCFG_NVML_ERROR_TIMEOUT 10
#define FCFG_NVML_ERROR_GPU_IS_LOST 15
#define FCFG_NVML_ERROR_IN_USE 19
#define FCFG_NVML_ERROR_INSUFFICIENT_RESOURCES 23
#define FCFG_NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define FCFG_XID_EVENT 0x0000000000000008ULL /* nvmlEventTypeXidCriticalError */

typedef struct fcfg_prof {
    int cnst;                  /* NVML_GPU_INSTANCE_PROFILE_* */
    unsigned id;               /* the profile id NVML reports */
    char name[32];             /* 1g.10gb */
    unsigned slices, memslices, sms;
    unsigned long long mib;
    unsigned nstarts;
    unsigned starts[FCFG_MAX_STARTS];
} fcfg_prof;

typedef struct fcfg_ci {
    unsigned id, profile, slices, sms;
    char uuid[48];
    char name[48];
} fcfg_ci;

typedef struct fcfg_gi {
    unsigned id, profile, start, size, slices, sms;
    unsigned long long mib;
    char name[32];
    unsigned nci;
    fcfg_ci ci[FCFG_MAX_CI];
} fcfg_gi;

/* The GPU and compute instances of every GPU (by UUID). */
typedef struct fcfg_migset {
    unsigned long long serial; /* created MIG devices so far (their UUIDs differ) */
    unsigned ngpu;
    struct {
        char uuid[48];
        unsigned ngi;
        fcfg_gi gi[FCFG_MAX_GI];
    } gpu[FCFG_MAX_GPUS];
} fcfg_migset;

typedef struct fcfg_gpu {
    char uuid[48];
    char name[96];
    char pci[32];
    unsigned long long memory;
    unsigned long long reserved;
    int cc_major, cc_minor;
    unsigned minor;
    unsigned mig;
    int lost;
    int numa;        /* -1: none */
    unsigned nvlink; /* 0: none */
    unsigned nprof;
    fcfg_prof prof[FCFG_MAX_PROF];
} fcfg_gpu;

typedef struct fcfg_xid {
    long long id;
    char uuid[48];
    unsigned long long code;
} fcfg_xid;

typedef struct fcfg {
    char driver_version[80];
    int cuda_version;
    int memory_limits;
    unsigned ngpu;
    fcfg_gpu gpu[FCFG_MAX_GPUS];
    unsigned nxid;
    fcfg_xid xid[FCFG_MAX_XIDS];
    char mig_state[512];
    char mig_log[512];
    char crash_op[32];
    unsigned crash_n;
    fcfg_migset cfg_mig; /* the file's gi/ci lines */
} fcfg;

static pthread_mutex_t g_fcfg_mu = PTHREAD_MUTEX_INITIALIZER;
static fcfg g_fcfg;
static struct timespec g_fcfg_mtime;
static off_t g_fcfg_size = -1;
static struct nvmlDevice_st g_fcfg_dev[FCFG_MAX_GPUS];

static int fcfg_active(void)
{
    const char *p = getenv("FAKE_NVML_CONFIG");
    return p && *p;
}

/* Next token of *s (quoted values keep their blanks); NULL at the end of the line. */
static char *fcfg_token(char **s)
{
    char *p = *s;
    while (*p == ' ' || *p == '\t')
        p++;
    if (!*p)
        return NULL;
    char *start = p, *out = p;
    int quoted = 0;
    while (*p && (quoted || (*p != ' ' && *p != '\t'))) {
        if (*p == '"') {
            quoted = !quoted;
            p++;
            continue;
        }
        *out++ = *p++;
    }
    if (*p)
        p++;
    *out = '\0';
    *s = p;
    return start;
}

/* The entry of GPU `uuid` in a MIG set (added when `add`); NULL when absent or full. */
static unsigned fcfg_mig_find(fcfg_migset *m, const char *uuid, int add)
{
    for (unsigned i = 0; i < m->ngpu; i++)
        if (!strcmp(m->gpu[i].uuid, uuid))
            return i;
    if (!add || m->ngpu >= FCFG_MAX_GPUS)
        return FCFG_MAX_GPUS;
    snprintf(m->gpu[m->ngpu].uuid, sizeof(m->gpu[0].uuid), "%s", uuid);
    m->gpu[m->ngpu].ngi = 0;
    return m->ngpu++;
}

static fcfg_gi *fcfg_mig_gi(fcfg_migset *m, unsigned g, unsigned id)
{
    for (unsigned k = 0; k < m->gpu[g].ngi; k++)
        if (m->gpu[g].gi[k].id == id)
            return &m->gpu[g].gi[k];
    return NULL;
}

/* One `gi`, `ci` or `serial` line (the key already read) into a MIG set. */
static void fcfg_parse_mig_line(const char *key, char *s, fcfg_migset *m)
{
    if (!strcmp(key, "serial")) {
        char *v = fcfg_token(&s);
        if (v)
            m->serial = strtoull(v, NULL, 10);
        return;
    }
    char *uuid = fcfg_token(&s), *gid = fcfg_token(&s);
    if (!uuid || !gid)
        return;
    unsigned g = fcfg_mig_find(m, uuid, 1);
    if (g == FCFG_MAX_GPUS)
        return;
    if (!strcmp(key, "gi")) {
        if (m->gpu[g].ngi >= FCFG_MAX_GI)
            return;
        fcfg_gi *gi = &m->gpu[g].gi[m->gpu[g].ngi++];
        memset(gi, 0, sizeof(*gi));
        gi->id = (unsigned)strtoul(gid, NULL, 10);
        for (char *kv; (kv = fcfg_token(&s));) {
            char *eq = strchr(kv, '=');
            if (!eq)
                continue;
            *eq = '\0';
            const char *v = eq + 1;
            if (!strcmp(kv, "profile"))
                gi->profile = (unsigned)strtoul(v, NULL, 10);
            else if (!strcmp(kv, "start"))
                gi->start = (unsigned)strtoul(v, NULL, 10);
            else if (!strcmp(kv, "size"))
                gi->size = (unsigned)strtoul(v, NULL, 10);
            else if (!strcmp(kv, "slices"))
                gi->slices = (unsigned)strtoul(v, NULL, 10);
            else if (!strcmp(kv, "sms"))
                gi->sms = (unsigned)strtoul(v, NULL, 10);
            else if (!strcmp(kv, "memory"))
                gi->mib = strtoull(v, NULL, 10);
            else if (!strcmp(kv, "name"))
                snprintf(gi->name, sizeof(gi->name), "%s", v);
        }
        return;
    }
    char *cid = fcfg_token(&s);
    fcfg_gi *gi = cid ? fcfg_mig_gi(m, g, (unsigned)strtoul(gid, NULL, 10)) : NULL;
    if (!gi || gi->nci >= FCFG_MAX_CI)
        return;
    fcfg_ci *ci = &gi->ci[gi->nci++];
    memset(ci, 0, sizeof(*ci));
    ci->id = (unsigned)strtoul(cid, NULL, 10);
    for (char *kv; (kv = fcfg_token(&s));) {
        char *eq = strchr(kv, '=');
        if (!eq)
            continue;
        *eq = '\0';
        const char *v = eq + 1;
        if (!strcmp(kv, "profile"))
            ci->profile = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(kv, "slices"))
            ci->slices = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(kv, "sms"))
            ci->sms = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(kv, "uuid"))
            snprintf(ci->uuid, sizeof(ci->uuid), "%s", v);
        else if (!strcmp(kv, "name"))
            snprintf(ci->name, sizeof(ci->name), "%s", v);
    }
}

/* A `migprofile` line into its GPU's profiles. */
static void fcfg_parse_profile(char *s, fcfg *c)
{
    char *uuid = fcfg_token(&s);
    fcfg_gpu *g = NULL;
    for (unsigned i = 0; uuid && i < c->ngpu; i++)
        if (!strcmp(c->gpu[i].uuid, uuid))
            g = &c->gpu[i];
    if (!g || g->nprof >= FCFG_MAX_PROF)
        return;
    fcfg_prof *p = &g->prof[g->nprof++];
    memset(p, 0, sizeof(*p));
    p->cnst = -1;
    for (char *kv; (kv = fcfg_token(&s));) {
        char *eq = strchr(kv, '=');
        if (!eq)
            continue;
        *eq = '\0';
        char *v = eq + 1;
        if (!strcmp(kv, "const"))
            p->cnst = atoi(v);
        else if (!strcmp(kv, "id"))
            p->id = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(kv, "name"))
            snprintf(p->name, sizeof(p->name), "%s", v);
        else if (!strcmp(kv, "slices"))
            p->slices = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(kv, "memslices"))
            p->memslices = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(kv, "sms"))
            p->sms = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(kv, "memory"))
            p->mib = strtoull(v, NULL, 10);
        else if (!strcmp(kv, "starts")) {
            for (char *t = strtok(v, ","); t && p->nstarts < FCFG_MAX_STARTS; t = strtok(NULL, ","))
                p->starts[p->nstarts++] = (unsigned)strtoul(t, NULL, 10);
        }
    }
}

static void fcfg_parse(const char *text, fcfg *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->driver_version, sizeof(c->driver_version), "%s", "550.54.15");
    c->cuda_version = 12040;
    char line[1024];
    while (*text) {
        size_t n = strcspn(text, "\n");
        snprintf(line, sizeof(line), "%.*s", (int)(n < sizeof(line) - 1 ? n : sizeof(line) - 1),
                 text);
        text += n + (text[n] == '\n');
        char *s = line, *key = fcfg_token(&s);
        if (!key || key[0] == '#')
            continue;
        if (!strcmp(key, "driver-version")) {
            char *v = fcfg_token(&s);
            if (v)
                snprintf(c->driver_version, sizeof(c->driver_version), "%s", v);
        } else if (!strcmp(key, "cuda-version")) {
            char *v = fcfg_token(&s);
            if (v)
                c->cuda_version = atoi(v);
        } else if (!strcmp(key, "memory-limits")) {
            char *v = fcfg_token(&s);
            c->memory_limits = v && !strcmp(v, "yes");
        } else if (!strcmp(key, "gpu") && c->ngpu < FCFG_MAX_GPUS) {
            char *uuid = fcfg_token(&s);
            if (!uuid)
                continue;
            fcfg_gpu *g = &c->gpu[c->ngpu++];
            snprintf(g->uuid, sizeof(g->uuid), "%s", uuid);
            snprintf(g->name, sizeof(g->name), "%s", "NVIDIA Fake GPU");
            g->memory = 16ULL << 30;
            g->minor = c->ngpu - 1;
            g->numa = -1;
            for (char *kv; (kv = fcfg_token(&s));) {
                char *eq = strchr(kv, '=');
                if (!eq)
                    continue;
                *eq = '\0';
                const char *v = eq + 1;
                if (!strcmp(kv, "name"))
                    snprintf(g->name, sizeof(g->name), "%s", v);
                else if (!strcmp(kv, "memory"))
                    g->memory = strtoull(v, NULL, 10);
                else if (!strcmp(kv, "reserved"))
                    g->reserved = strtoull(v, NULL, 10);
                else if (!strcmp(kv, "pci"))
                    snprintf(g->pci, sizeof(g->pci), "%s", v);
                else if (!strcmp(kv, "cc"))
                    sscanf(v, "%d.%d", &g->cc_major, &g->cc_minor);
                else if (!strcmp(kv, "minor"))
                    g->minor = (unsigned)strtoul(v, NULL, 10);
                else if (!strcmp(kv, "mig"))
                    g->mig = (unsigned)strtoul(v, NULL, 10);
                else if (!strcmp(kv, "health"))
                    g->lost = !strcmp(v, "lost");
                else if (!strcmp(kv, "numa"))
                    g->numa = atoi(v);
                else if (!strcmp(kv, "nvlink"))
                    g->nvlink = (unsigned)strtoul(v, NULL, 10);
            }
        } else if (!strcmp(key, "migprofile")) {
            fcfg_parse_profile(s, c);
        } else if (!strcmp(key, "gi") || !strcmp(key, "ci")) {
            fcfg_parse_mig_line(key, s, &c->cfg_mig);
        } else if (!strcmp(key, "mig-state") || !strcmp(key, "mig-log")) {
            char *v = fcfg_token(&s);
            if (v)
                snprintf(key[4] == 's' ? c->mig_state : c->mig_log, sizeof(c->mig_state), "%s", v);
        } else if (!strcmp(key, "mig-crash-after")) {
            char *op = fcfg_token(&s), *count = fcfg_token(&s);
            if (op) {
                snprintf(c->crash_op, sizeof(c->crash_op), "%s", op);
                c->crash_n = count ? (unsigned)strtoul(count, NULL, 10) : 1;
            }
        } else if (!strcmp(key, "xid") && c->nxid < FCFG_MAX_XIDS) {
            char *id = fcfg_token(&s), *uuid = fcfg_token(&s), *code = fcfg_token(&s);
            if (!id || !uuid || !code)
                continue;
            fcfg_xid *x = &c->xid[c->nxid++];
            x->id = strtoll(id, NULL, 10);
            snprintf(x->uuid, sizeof(x->uuid), "%s", uuid);
            x->code = strtoull(code, NULL, 10);
        }
    }
}

/* Re-read the file if it changed; call with g_fcfg_mu held. */
static void fcfg_refresh(void)
{
    const char *path = getenv("FAKE_NVML_CONFIG");
    struct stat st;
    if (!path || stat(path, &st) != 0) {
        memset(&g_fcfg, 0, sizeof(g_fcfg));
        g_fcfg_size = -1;
        return;
    }
    if (st.st_size == g_fcfg_size && st.st_mtim.tv_sec == g_fcfg_mtime.tv_sec &&
        st.st_mtim.tv_nsec == g_fcfg_mtime.tv_nsec)
        return;
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    fcfg_parse(buf, &g_fcfg);
    g_fcfg_size = st.st_size;
    g_fcfg_mtime = st.st_mtim;
}

/* Lock, refresh, return the configuration (unlock with fcfg_unlock). */
static fcfg *fcfg_lock(void)
{
    pthread_mutex_lock(&g_fcfg_mu);
    fcfg_refresh();
    return &g_fcfg;
}

static void fcfg_unlock(void) { pthread_mutex_unlock(&g_fcfg_mu); }

/* The GPU of a handle, by UUID (indices move when a GPU disappears). NULL: gone. */
static fcfg_gpu *fcfg_find(fcfg *c, const char *uuid)
{
    for (unsigned i = 0; i < c->ngpu; i++)
        if (!strcmp(c->gpu[i].uuid, uuid))
            return &c->gpu[i];
    return NULL;
}

static char g_fcfg_handle_uuid[FCFG_MAX_GPUS][48];

/* Look up a handle's GPU; sets *ret to the error to return when NULL or lost. */
static fcfg_gpu *fcfg_dev(fcfg *c, nvmlDevice_t d, nvmlReturn_t *ret)
{
    fcfg_gpu *g = fcfg_find(c, g_fcfg_handle_uuid[d->index]);
    if (!g) {
        *ret = (nvmlReturn_t)FCFG_NVML_ERROR_GPU_IS_LOST;
        return NULL;
    }
    if (g->lost) {
        *ret = (nvmlReturn_t)FCFG_NVML_ERROR_GPU_IS_LOST;
        return NULL;
    }
    *ret = NVML_SUCCESS;
    return g;
}

static fcfg_ci *fcfg_mig_ci(fcfg *c, nvmlDevice_t d, fcfg_gi **gi_out);
static nvmlDevice_t fcfg_mig_handle(unsigned slot, unsigned gi, unsigned ci);
static fcfg_migset *fcfg_mig_live(fcfg *c);

static nvmlReturn_t fcfg_handle_for(fcfg *c, unsigned i, nvmlDevice_t *device)
{
    unsigned slot = FCFG_MAX_GPUS;
    for (unsigned k = 0; k < FCFG_MAX_GPUS; k++) {
        if (!strcmp(g_fcfg_handle_uuid[k], c->gpu[i].uuid)) {
            slot = k;
            break;
        }
        if (slot == FCFG_MAX_GPUS && !g_fcfg_handle_uuid[k][0])
            slot = k;
    }
    if (slot == FCFG_MAX_GPUS)
        return NVML_ERROR_UNKNOWN;
    snprintf(g_fcfg_handle_uuid[slot], sizeof(g_fcfg_handle_uuid[slot]), "%s", c->gpu[i].uuid);
    g_fcfg_dev[slot].index = slot;
    g_fcfg_dev[slot].cfg = 1;
    *device = &g_fcfg_dev[slot];
    return c->gpu[i].lost ? (nvmlReturn_t)FCFG_NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

static nvmlReturn_t fcfg_count(unsigned *n)
{
    fcfg *c = fcfg_lock();
    *n = c->ngpu;
    fcfg_unlock();
    return NVML_SUCCESS;
}

static nvmlReturn_t fcfg_handle_by_index(unsigned index, nvmlDevice_t *device)
{
    fcfg *c = fcfg_lock();
    nvmlReturn_t r = index < c->ngpu ? fcfg_handle_for(c, index, device)
                                     : NVML_ERROR_INVALID_ARGUMENT;
    fcfg_unlock();
    return r;
}

static nvmlReturn_t fcfg_uuid(nvmlDevice_t d, char *uuid, unsigned length)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    const char *u = g ? g->uuid : NULL;
    if (g && d->cfg == 2) {
        fcfg_ci *ci = fcfg_mig_ci(c, d, NULL);
        u = ci ? ci->uuid : NULL;
        if (!ci)
            r = (nvmlReturn_t)FCFG_NVML_ERROR_NOT_FOUND;
    }
    if (u) {
        if (strlen(u) + 1 > length)
            r = NVML_ERROR_INSUFFICIENT_SIZE;
        else
            memcpy(uuid, u, strlen(u) + 1);
    }
    fcfg_unlock();
    return r;
}

static nvmlReturn_t fcfg_memory(nvmlDevice_t d, unsigned long long *total,
                                unsigned long long *used, unsigned long long *free_,
                                unsigned long long *reserved)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g && d->cfg == 2) {
        fcfg_gi *gi;
        if (fcfg_mig_ci(c, d, &gi)) {
            *total = gi->mib << 20;
            *used = 0;
            *free_ = *total;
            if (reserved)
                *reserved = 0;
        } else
            r = (nvmlReturn_t)FCFG_NVML_ERROR_NOT_FOUND;
    } else if (g) {
        unsigned long long u = 0;
        fake_state *st = fake_state_get();
        for (uint32_t i = 0; i < st->ndev; i++)
            if (!strcmp(st->dev[i].uuid, g->uuid))
                u = __atomic_load_n(&st->dev[i].used, __ATOMIC_ACQUIRE);
        *total = g->memory;
        *used = u;
        if (reserved)
            *reserved = g->reserved;
        u += g->reserved; /* free leaves the driver's reserve out, as NVML's v2 does */
        *free_ = g->memory > u ? g->memory - u : 0;
    }
    fcfg_unlock();
    return r;
}

/* ---- entry points only the configured mode has ------------------------------------------- */

EXPORT nvmlReturn_t nvmlInit(void)
{
    fake_state_get();
    return NVML_SUCCESS;
}

/* nvmlErrorString for the codes only this mode returns (fake_nvml.c has the others). */
static const char *fcfg_error_string(int r)
{
    switch (r) {
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 6: return "Not Found";
    case 10: return "Timeout";
    case 13: return "Function Not Found";
    case 15: return "GPU is lost";
    case 19: return "In use by another client";
    case 23: return "Insufficient resources";
    case 25: return "Argument version mismatch";
    default: return NULL;
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    fcfg *c = fcfg_lock();
    nvmlReturn_t r = NVML_SUCCESS;
    if (strlen(c->driver_version) + 1 > length)
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    else
        memcpy(version, c->driver_version, strlen(c->driver_version) + 1);
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    fcfg *c = fcfg_lock();
    *v = c->cuda_version;
    fcfg_unlock();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v)
{
    return nvmlSystemGetCudaDriverVersion(v);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    fcfg *c = fcfg_lock();
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    for (unsigned i = 0; i < c->ngpu; i++)
        if (!strcmp(c->gpu[i].uuid, uuid))
            r = fcfg_handle_for(c, i, device);
    if (r == NVML_ERROR_NOT_FOUND && !strncmp(uuid, "MIG-", 4)) {
        /* A MIG device by its UUID (a handle of its GPU first, for the slot). */
        fcfg_migset *m = fcfg_mig_live(c);
        for (unsigned e = 0; e < m->ngpu && r == NVML_ERROR_NOT_FOUND; e++)
            for (unsigned k = 0; k < m->gpu[e].ngi && r == NVML_ERROR_NOT_FOUND; k++)
                for (unsigned j = 0; j < m->gpu[e].gi[k].nci; j++) {
                    if (strcmp(m->gpu[e].gi[k].ci[j].uuid, uuid))
                        continue;
                    nvmlDevice_t parent;
                    for (unsigned i = 0; i < c->ngpu; i++)
                        if (!strcmp(c->gpu[i].uuid, m->gpu[e].uuid) &&
                            fcfg_handle_for(c, i, &parent) == NVML_SUCCESS) {
                            *device = fcfg_mig_handle(parent->index, m->gpu[e].gi[k].id, m->gpu[e].gi[k].ci[j].id);
                            r = NVML_SUCCESS;
                        }
                    break;
                }
    }
    fcfg_unlock();
    return r;
}

/* nvmlDeviceGetName of a configured device (fake_nvml.c's nvmlDeviceGetName calls it). */
static nvmlReturn_t fcfg_name(nvmlDevice_t d, char *name, unsigned int length)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g) {
        if (strlen(g->name) + 1 > length)
            r = NVML_ERROR_INSUFFICIENT_SIZE;
        else
            memcpy(name, g->name, strlen(g->name) + 1);
    }
    fcfg_unlock();
    return r;
}

/* nvmlPciInfo_t as in nvml.h (busIdLegacy[16], domain, bus, device, ids, busId[32]). */
typedef struct fcfg_pci_info {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} fcfg_pci_info;

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, fcfg_pci_info *pci)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g) {
        memset(pci, 0, sizeof(*pci));
        snprintf(pci->busId, sizeof(pci->busId), "%s", g->pci);
        snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%.15s", g->pci);
        sscanf(g->pci, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
        pci->pciDeviceId = 0x233010DE;
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g) {
        *major = g->cc_major;
        *minor = g->cc_minor;
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g)
        *minor = g->minor;
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g)
        *current = *pending = g->mig;
    fcfg_unlock();
    return r;
}

/* ---- per-cgroup memory limits (NVML r615 / CUDA 13.4: nvmlDevice{Set,Get}MemoryLimits_v1) -- */

typedef struct fcfg_set_limits {
    const char *nameSpace;
    unsigned long long softLimit, hardLimit;
} fcfg_set_limits;
typedef struct fcfg_get_limits {
    const char *nameSpace;
    unsigned long long softLimit, hardLimit, currentUsed;
} fcfg_get_limits;

static struct {
    char uuid[48];
    char ns[256];
    unsigned long long soft, hard;
} g_fcfg_limits[FCFG_MAX_LIMITS];

EXPORT nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t d, fcfg_set_limits *l)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g && !c->memory_limits)
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (g && (!l || !l->nameSpace))
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (g) {
        r = NVML_ERROR_UNKNOWN;
        for (int i = 0; i < FCFG_MAX_LIMITS; i++) {
            int same = !strcmp(g_fcfg_limits[i].uuid, g->uuid) &&
                       !strcmp(g_fcfg_limits[i].ns, l->nameSpace);
            if (same || !g_fcfg_limits[i].uuid[0]) {
                snprintf(g_fcfg_limits[i].uuid, 48, "%s", g->uuid);
                snprintf(g_fcfg_limits[i].ns, 256, "%s", l->nameSpace);
                g_fcfg_limits[i].soft = l->softLimit;
                g_fcfg_limits[i].hard = l->hardLimit;
                r = NVML_SUCCESS;
                break;
            }
        }
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t d, fcfg_get_limits *l)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g && !c->memory_limits)
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (g && (!l || !l->nameSpace))
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (g) {
        l->softLimit = 0;
        l->hardLimit = ~0ULL; /* NVML_DEVICE_MEMORY_LIMIT_MAX: no limit */
        l->currentUsed = 0;
        for (int i = 0; i < FCFG_MAX_LIMITS; i++)
            if (!strcmp(g_fcfg_limits[i].uuid, g->uuid) && !strcmp(g_fcfg_limits[i].ns, l->nameSpace)) {
                l->softLimit = g_fcfg_limits[i].soft;
                l->hardLimit = g_fcfg_limits[i].hard;
            }
    }
    fcfg_unlock();
    return r;
}

/* ---- events: XIDs ---------------------------------------------------------------------- */

struct nvmlEventSet_st {
    long long seen;                       /* largest XID id delivered or present at creation */
    unsigned long long mask[FCFG_MAX_GPUS]; /* registered event types per handle slot */
};

typedef struct fcfg_event_data {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} fcfg_event_data;

EXPORT nvmlReturn_t nvmlEventSetCreate(struct nvmlEventSet_st **set)
{
    struct nvmlEventSet_st *s = calloc(1, sizeof(*s));
    if (!s)
        return NVML_ERROR_UNKNOWN;
    fcfg *c = fcfg_lock();
    for (unsigned i = 0; i < c->nxid; i++)
        if (c->xid[i].id > s->seen)
            s->seen = c->xid[i].id;
    fcfg_unlock();
    *set = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(struct nvmlEventSet_st *set)
{
    free(set);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    if (fcfg_dev(c, d, &r))
        *types = FCFG_XID_EVENT;
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types,
                                             struct nvmlEventSet_st *set)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    if (fcfg_dev(c, d, &r)) {
        if (types & ~FCFG_XID_EVENT)
            r = NVML_ERROR_NOT_SUPPORTED;
        else
            set->mask[d->index] |= types;
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(struct nvmlEventSet_st *set, fcfg_event_data *data,
                                        unsigned int timeoutms)
{
    uint64_t deadline = fake_now_ns() + (uint64_t)timeoutms * 1000000ull;
    for (;;) {
        fcfg *c = fcfg_lock();
        const fcfg_xid *best = NULL;
        for (unsigned i = 0; i < c->nxid; i++) {
            const fcfg_xid *x = &c->xid[i];
            if (x->id <= set->seen || (best && x->id >= best->id))
                continue;
            best = x;
        }
        if (best) {
            set->seen = best->id;
            for (unsigned k = 0; k < FCFG_MAX_GPUS; k++) {
                if (!strcmp(g_fcfg_handle_uuid[k], best->uuid) && (set->mask[k] & FCFG_XID_EVENT)) {
                    memset(data, 0, sizeof(*data));
                    data->device = &g_fcfg_dev[k];
                    data->eventType = FCFG_XID_EVENT;
                    data->eventData = best->code;
                    fcfg_unlock();
                    return NVML_SUCCESS;
                }
            }
            fcfg_unlock();
            continue; /* an event for a device this set did not register */
        }
        fcfg_unlock();
        if (fake_now_ns() >= deadline)
            return (nvmlReturn_t)FCFG_NVML_ERROR_TIMEOUT;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* ---- NUMA affinity and NVLink peers -------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t d, unsigned int nodeSetSize,
                                                unsigned long *nodeSet, int scope)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g && (scope != 0 || !nodeSet || nodeSetSize == 0))
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (g && g->numa < 0)
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (g) {
        memset(nodeSet, 0, nodeSetSize * sizeof(*nodeSet));
        unsigned bits = 8 * sizeof(*nodeSet);
        if ((unsigned)g->numa < nodeSetSize * bits)
            nodeSet[(unsigned)g->numa / bits] |= 1UL << ((unsigned)g->numa % bits);
    }
    fcfg_unlock();
    return r;
}

/* The GPU is not a NUMA node of its own (no coherent GPU memory): as on discrete GPUs. */
EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *node)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    if (fcfg_dev(c, d, &r))
        r = NVML_ERROR_NOT_SUPPORTED;
    (void)node;
    fcfg_unlock();
    return r;
}

#define FCFG_P2P_CAPS_INDEX_NVLINK 2
#define FCFG_P2P_STATUS_OK 0
#define FCFG_P2P_STATUS_NOT_SUPPORTED 5

EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t d1, nvmlDevice_t d2, int index, int *status)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *a = fcfg_dev(c, d1, &r), *b = a ? fcfg_dev(c, d2, &r) : NULL;
    if (a && b) {
        int linked = index == FCFG_P2P_CAPS_INDEX_NVLINK && a != b && a->nvlink && a->nvlink == b->nvlink &&
                     !a->mig && !b->mig;
        *status = linked ? FCFG_P2P_STATUS_OK : FCFG_P2P_STATUS_NOT_SUPPORTED;
    }
    fcfg_unlock();
    return r;
}

/* ---- MIG ---------------------------------------------------------------------------------- */

struct nvmlGpuInstance_st {
    unsigned slot, gi;
};
struct nvmlComputeInstance_st {
    unsigned slot, gi, ci;
};
typedef struct nvmlGpuInstance_st *fcfg_gih;
typedef struct nvmlComputeInstance_st *fcfg_cih;

static struct nvmlGpuInstance_st g_gih[FCFG_MAX_GPUS][FCFG_GI_IDS];
static struct nvmlComputeInstance_st g_cih[FCFG_MAX_GPUS][FCFG_GI_IDS][FCFG_MAX_CI];
static struct nvmlDevice_st g_migh[FCFG_MAX_GPUS][FCFG_GI_IDS][FCFG_MAX_CI];
static fcfg_migset g_live; /* the state file's instances */
static unsigned g_crash_count;

/* Read a MIG state file into m; 0 when it does not exist. */
static int fcfg_mig_read(const char *path, fcfg_migset *m)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    memset(m, 0, sizeof(*m));
    char line[1024];
    for (const char *t = text; *t;) {
        size_t len = strcspn(t, "\n");
        snprintf(line, sizeof(line), "%.*s", (int)(len < sizeof(line) - 1 ? len : sizeof(line) - 1), t);
        t += len + (t[len] == '\n');
        char *s = line, *key = fcfg_token(&s);
        if (key && (!strcmp(key, "gi") || !strcmp(key, "ci") || !strcmp(key, "serial")))
            fcfg_parse_mig_line(key, s, m);
    }
    return 1;
}

/* Write m to path atomically (temporary file + rename). */
static int fcfg_mig_write(const char *path, const fcfg_migset *m)
{
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "we");
    if (!f)
        return -1;
    fprintf(f, "serial %llu\n", m->serial);
    for (unsigned g = 0; g < m->ngpu; g++)
        for (unsigned k = 0; k < m->gpu[g].ngi; k++) {
            const fcfg_gi *gi = &m->gpu[g].gi[k];
            fprintf(f, "gi %s %u profile=%u start=%u size=%u slices=%u memory=%llu sms=%u name=%s\n",
                    m->gpu[g].uuid, gi->id, gi->profile, gi->start, gi->size, gi->slices, gi->mib, gi->sms,
                    gi->name);
            for (unsigned j = 0; j < gi->nci; j++) {
                const fcfg_ci *ci = &gi->ci[j];
                fprintf(f, "ci %s %u %u profile=%u slices=%u sms=%u uuid=%s name=%s\n", m->gpu[g].uuid, gi->id,
                        ci->id, ci->profile, ci->slices, ci->sms, ci->uuid, ci->name);
            }
        }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Exclusive lock of the state (other processes); -1 on failure. */
static int fcfg_mig_flock(const fcfg *c)
{
    char lk[600];
    snprintf(lk, sizeof(lk), "%s.lock", c->mig_state);
    int fd = open(lk, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0 && flock(fd, LOCK_EX) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* The instances now (g_fcfg_mu held): the state file's (created from the configuration's when
 * missing), else the configuration's. */
static fcfg_migset *fcfg_mig_live(fcfg *c)
{
    if (!c->mig_state[0])
        return &c->cfg_mig;
    if (fcfg_mig_read(c->mig_state, &g_live))
        return &g_live;
    int fd = fcfg_mig_flock(c);
    if (!fcfg_mig_read(c->mig_state, &g_live)) {
        g_live = c->cfg_mig;
        fcfg_mig_write(c->mig_state, &g_live);
    }
    if (fd >= 0)
        close(fd);
    return &g_live;
}

/* Start a change: lock the state, read it fresh. Returns the lock (close it with
 * fcfg_mig_commit), or -1 with *r set. */
static int fcfg_mig_begin(fcfg *c, nvmlReturn_t *r)
{
    if (!c->mig_state[0]) {
        *r = (nvmlReturn_t)FCFG_NVML_ERROR_NO_PERMISSION;
        return -1;
    }
    int fd = fcfg_mig_flock(c);
    if (fd < 0) {
        *r = NVML_ERROR_UNKNOWN;
        return -1;
    }
    if (!fcfg_mig_read(c->mig_state, &g_live))
        g_live = c->cfg_mig;
    *r = NVML_SUCCESS;
    return fd;
}

/* Finish a change: write the state, log `line`, unlock; then SIGKILL this process if `op` is
 * the configured crash point. */
static nvmlReturn_t fcfg_mig_commit(fcfg *c, int fd, const char *op, const char *line)
{
    nvmlReturn_t r = fcfg_mig_write(c->mig_state, &g_live) == 0 ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
    if (r == NVML_SUCCESS && c->mig_log[0]) {
        int lf = open(c->mig_log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (lf >= 0) {
            char buf[400];
            int n = snprintf(buf, sizeof(buf), "%s %s pid=%d\n", op, line, (int)getpid());
            if (write(lf, buf, (size_t)n) != n)
                r = NVML_ERROR_UNKNOWN;
            close(lf);
        }
    }
    close(fd);
    if (r == NVML_SUCCESS && c->crash_op[0] && !strcmp(c->crash_op, op) && ++g_crash_count == c->crash_n)
        kill(getpid(), SIGKILL);
    return r;
}

/* The MIG-set entry of a handle's GPU (UINT_MAX-like FCFG_MAX_GPUS when it has none yet). */
static unsigned fcfg_mig_of(fcfg_migset *m, unsigned slot, int add)
{
    return fcfg_mig_find(m, g_fcfg_handle_uuid[slot], add);
}

static const fcfg_prof *fcfg_prof_by(const fcfg_gpu *g, int cnst, int id)
{
    for (unsigned i = 0; i < g->nprof; i++)
        if ((cnst >= 0 && g->prof[i].cnst == cnst) || (id >= 0 && g->prof[i].id == (unsigned)id))
            return &g->prof[i];
    return NULL;
}

/* The GPU of a GPU-instance / compute-instance handle, and the instance itself. */
static fcfg_gi *fcfg_gi_of(fcfg *c, fcfg_gih h, fcfg_gpu **g, nvmlReturn_t *r)
{
    if (!h || h->slot >= FCFG_MAX_GPUS) {
        *r = NVML_ERROR_INVALID_ARGUMENT;
        return NULL;
    }
    *g = fcfg_dev(c, &g_fcfg_dev[h->slot], r);
    if (!*g)
        return NULL;
    fcfg_migset *m = fcfg_mig_live(c);
    unsigned e = fcfg_mig_of(m, h->slot, 0);
    fcfg_gi *gi = e < FCFG_MAX_GPUS ? fcfg_mig_gi(m, e, h->gi) : NULL;
    if (!gi)
        *r = (nvmlReturn_t)FCFG_NVML_ERROR_NOT_FOUND;
    return gi;
}

static fcfg_ci *fcfg_ci_in(fcfg_gi *gi, unsigned id)
{
    for (unsigned j = 0; j < gi->nci; j++)
        if (gi->ci[j].id == id)
            return &gi->ci[j];
    return NULL;
}

static fcfg_gih fcfg_gi_handle(unsigned slot, unsigned gi)
{
    g_gih[slot][gi].slot = slot;
    g_gih[slot][gi].gi = gi;
    return &g_gih[slot][gi];
}

static fcfg_cih fcfg_ci_handle(unsigned slot, unsigned gi, unsigned ci)
{
    g_cih[slot][gi][ci] = (struct nvmlComputeInstance_st){slot, gi, ci};
    return &g_cih[slot][gi][ci];
}

static nvmlDevice_t fcfg_mig_handle(unsigned slot, unsigned gi, unsigned ci)
{
    struct nvmlDevice_st *h = &g_migh[slot][gi][ci];
    h->index = slot;
    h->cfg = 2;
    h->gi = gi;
    h->ci = ci;
    return h;
}

/* The compute instance of a MIG-device handle (NULL: gone). */
static fcfg_ci *fcfg_mig_ci(fcfg *c, nvmlDevice_t d, fcfg_gi **gi_out)
{
    fcfg_migset *m = fcfg_mig_live(c);
    unsigned e = fcfg_mig_of(m, d->index, 0);
    fcfg_gi *gi = e < FCFG_MAX_GPUS ? fcfg_mig_gi(m, e, d->gi) : NULL;
    if (gi_out)
        *gi_out = gi;
    return gi ? fcfg_ci_in(gi, d->ci) : NULL;
}

/* Compute slices of a compute-instance profile (NVML_COMPUTE_INSTANCE_PROFILE_*). */
static unsigned fcfg_ci_slices(unsigned p)
{
    static const unsigned slices[] = {1, 2, 3, 4, 7, 8, 6, 1, 7};
    return p < sizeof(slices) / sizeof(slices[0]) ? slices[p] : 0;
}

/* nvmlGpuInstanceProfileInfo_v2_t and _t, nvmlGpuInstanceInfo_t, ... as in nvml.h. */
typedef struct fcfg_gi_prof_v2 {
    unsigned version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount,
        copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[96];
} fcfg_gi_prof_v2;
typedef struct fcfg_gi_prof_v1 {
    unsigned id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount, copyEngineCount,
        decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} fcfg_gi_prof_v1;
typedef struct fcfg_placement {
    unsigned start, size;
} fcfg_placement;
typedef struct fcfg_gi_info {
    nvmlDevice_t device;
    unsigned id, profileId;
    fcfg_placement placement;
} fcfg_gi_info;
typedef struct fcfg_ci_prof_v2 {
    unsigned version, id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
    char name[96];
} fcfg_ci_prof_v2;
typedef struct fcfg_ci_prof_v1 {
    unsigned id, sliceCount, instanceCount, multiprocessorCount, sharedCopyEngineCount,
        sharedDecoderCount, sharedEncoderCount, sharedJpegCount, sharedOfaCount;
} fcfg_ci_prof_v1;
typedef struct fcfg_ci_info {
    nvmlDevice_t device;
    fcfg_gih gpuInstance;
    unsigned id, profileId;
    fcfg_placement placement;
} fcfg_ci_info;
typedef struct fcfg_attrs {
    unsigned multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} fcfg_attrs;

#define FCFG_GI_PROFILE_INFO_V2 0x02000098u
#define FCFG_CI_PROFILE_INFO_V2 0x02000088u

static nvmlReturn_t fcfg_gi_profile(nvmlDevice_t d, unsigned profile, fcfg_gi_prof_v2 *v2, fcfg_gi_prof_v1 *v1)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    const fcfg_prof *p = g ? fcfg_prof_by(g, (int)profile, -1) : NULL;
    if (g && !g->mig)
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (g && !p)
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (g && v2 && v2->version != FCFG_GI_PROFILE_INFO_V2)
        r = (nvmlReturn_t)FCFG_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    else if (g) {
        fcfg_gi_prof_v1 info = {p->id, 0, p->slices, p->nstarts, p->sms, 0, 0, 0, 0, 0, p->mib};
        if (v1)
            *v1 = info;
        if (v2) {
            unsigned version = v2->version;
            memset(v2, 0, sizeof(*v2));
            v2->version = version;
            v2->id = info.id;
            v2->sliceCount = info.sliceCount;
            v2->instanceCount = info.instanceCount;
            v2->multiprocessorCount = info.multiprocessorCount;
            v2->memorySizeMB = info.memorySizeMB;
            snprintf(v2->name, sizeof(v2->name), "MIG %s", p->name);
        }
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned profile, fcfg_gi_prof_v2 *info)
{
    return fcfg_gi_profile(d, profile, info, NULL);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned profile, fcfg_gi_prof_v1 *info)
{
    return fcfg_gi_profile(d, profile, NULL, info);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t d, unsigned profileId,
                                                                  fcfg_placement *placements, unsigned *count)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    const fcfg_prof *p = g ? fcfg_prof_by(g, -1, (int)profileId) : NULL;
    if (g && (!g->mig || !p))
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (g && !count)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (g && placements && *count < p->nstarts)
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    else if (g) {
        for (unsigned i = 0; placements && i < p->nstarts; i++)
            placements[i] = (fcfg_placement){p->starts[i], p->memslices};
        *count = p->nstarts;
    }
    fcfg_unlock();
    return r;
}

/* Why a GPU instance of profile p cannot be placed at start on GPU entry e now (NVML code), or
 * NVML_SUCCESS. */
static nvmlReturn_t fcfg_gi_fits(const fcfg_gpu *g, const fcfg_migset *m, unsigned e, const fcfg_prof *p,
                                 unsigned start)
{
    int known = 0;
    for (unsigned i = 0; i < p->nstarts; i++)
        known |= p->starts[i] == start;
    if (!known)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned compute = 0, total = 0;
    for (unsigned i = 0; i < g->nprof; i++)
        total = g->prof[i].slices > total ? g->prof[i].slices : total;
    if (e < FCFG_MAX_GPUS) {
        if (m->gpu[e].ngi >= FCFG_MAX_GI)
            return (nvmlReturn_t)FCFG_NVML_ERROR_INSUFFICIENT_RESOURCES;
        for (unsigned k = 0; k < m->gpu[e].ngi; k++) {
            const fcfg_gi *gi = &m->gpu[e].gi[k];
            compute += gi->slices;
            if (start < gi->start + gi->size && gi->start < start + p->memslices)
                return (nvmlReturn_t)FCFG_NVML_ERROR_INSUFFICIENT_RESOURCES;
        }
    }
    if (compute + p->slices > total)
        return (nvmlReturn_t)FCFG_NVML_ERROR_INSUFFICIENT_RESOURCES;
    return NVML_SUCCESS;
}

static nvmlReturn_t fcfg_create_gi(nvmlDevice_t d, unsigned profileId, const fcfg_placement *placement,
                                   fcfg_gih *out)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    const fcfg_prof *p = g ? fcfg_prof_by(g, -1, (int)profileId) : NULL;
    if (g && (!g->mig || !p))
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (g && !out)
        r = NVML_ERROR_INVALID_ARGUMENT;
    int fd = g && r == NVML_SUCCESS ? fcfg_mig_begin(c, &r) : -1;
    if (fd >= 0) {
        unsigned e = fcfg_mig_of(&g_live, d->index, 1);
        unsigned start = FCFG_MAX_STARTS * 8;
        if (placement) {
            r = placement->size == p->memslices ? fcfg_gi_fits(g, &g_live, e, p, placement->start)
                                                 : NVML_ERROR_INVALID_ARGUMENT;
            start = placement->start;
        } else {
            r = (nvmlReturn_t)FCFG_NVML_ERROR_INSUFFICIENT_RESOURCES;
            for (unsigned i = 0; i < p->nstarts && r != NVML_SUCCESS; i++)
                if ((r = fcfg_gi_fits(g, &g_live, e, p, p->starts[i])) == NVML_SUCCESS)
                    start = p->starts[i];
        }
        unsigned id = 1;
        while (r == NVML_SUCCESS && e < FCFG_MAX_GPUS && fcfg_mig_gi(&g_live, e, id))
            id++;
        if (r == NVML_SUCCESS && (e >= FCFG_MAX_GPUS || id >= FCFG_GI_IDS))
            r = (nvmlReturn_t)FCFG_NVML_ERROR_INSUFFICIENT_RESOURCES;
        if (r == NVML_SUCCESS) {
            fcfg_gi *gi = &g_live.gpu[e].gi[g_live.gpu[e].ngi++];
            memset(gi, 0, sizeof(*gi));
            *gi = (fcfg_gi){.id = id, .profile = p->id, .start = start, .size = p->memslices,
                            .slices = p->slices, .sms = p->sms, .mib = p->mib};
            snprintf(gi->name, sizeof(gi->name), "%s", p->name);
            char line[200];
            snprintf(line, sizeof(line), "%s gi=%u profile=%u start=%u size=%u", g->uuid, id, p->id, start,
                     p->memslices);
            *out = fcfg_gi_handle(d->index, id);
            r = fcfg_mig_commit(c, fd, "create-gi", line);
        } else
            close(fd);
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t d, unsigned profileId,
                                                             const fcfg_placement *placement, fcfg_gih *gi)
{
    if (!placement)
        return NVML_ERROR_INVALID_ARGUMENT;
    return fcfg_create_gi(d, profileId, placement, gi);
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t d, unsigned profileId, fcfg_gih *gi)
{
    return fcfg_create_gi(d, profileId, NULL, gi);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t d, unsigned profileId, unsigned *count)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    const fcfg_prof *p = g ? fcfg_prof_by(g, -1, (int)profileId) : NULL;
    if (g && (!g->mig || !p))
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (g) {
        fcfg_migset *m = fcfg_mig_live(c);
        unsigned e = fcfg_mig_of(m, d->index, 0), n = 0;
        for (unsigned i = 0; i < p->nstarts; i++)
            n += fcfg_gi_fits(g, m, e, p, p->starts[i]) == NVML_SUCCESS;
        *count = n;
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t d, unsigned profileId, fcfg_gih *gis, unsigned *count)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g && !g->mig)
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (g && (!gis || !count))
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (g) {
        fcfg_migset *m = fcfg_mig_live(c);
        unsigned e = fcfg_mig_of(m, d->index, 0), n = 0;
        for (unsigned k = 0; e < FCFG_MAX_GPUS && k < m->gpu[e].ngi; k++)
            if (m->gpu[e].gi[k].profile == profileId)
                gis[n++] = fcfg_gi_handle(d->index, m->gpu[e].gi[k].id);
        *count = n;
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned id, fcfg_gih *out)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g && !g->mig)
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (g) {
        fcfg_migset *m = fcfg_mig_live(c);
        unsigned e = fcfg_mig_of(m, d->index, 0);
        if (id < FCFG_GI_IDS && e < FCFG_MAX_GPUS && fcfg_mig_gi(m, e, id))
            *out = fcfg_gi_handle(d->index, id);
        else
            r = (nvmlReturn_t)FCFG_NVML_ERROR_NOT_FOUND;
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(fcfg_gih h, fcfg_gi_info *info)
{
    nvmlReturn_t r;
    fcfg_gpu *g;
    fcfg *c = fcfg_lock();
    fcfg_gi *gi = fcfg_gi_of(c, h, &g, &r);
    if (gi)
        *info = (fcfg_gi_info){&g_fcfg_dev[h->slot], gi->id, gi->profile, {gi->start, gi->size}};
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(fcfg_gih h)
{
    nvmlReturn_t r;
    fcfg_gpu *g;
    fcfg *c = fcfg_lock();
    fcfg_gi *gi = fcfg_gi_of(c, h, &g, &r);
    int fd = gi ? fcfg_mig_begin(c, &r) : -1;
    if (fd >= 0) {
        unsigned e = fcfg_mig_of(&g_live, h->slot, 0);
        gi = e < FCFG_MAX_GPUS ? fcfg_mig_gi(&g_live, e, h->gi) : NULL;
        if (!gi) {
            r = (nvmlReturn_t)FCFG_NVML_ERROR_NOT_FOUND;
            close(fd);
        } else if (gi->nci) {
            r = (nvmlReturn_t)FCFG_NVML_ERROR_IN_USE;
            close(fd);
        } else {
            unsigned k = (unsigned)(gi - g_live.gpu[e].gi);
            memmove(gi, gi + 1, (g_live.gpu[e].ngi - k - 1) * sizeof(*gi));
            g_live.gpu[e].ngi--;
            char line[120];
            snprintf(line, sizeof(line), "%s gi=%u", g->uuid, h->gi);
            r = fcfg_mig_commit(c, fd, "destroy-gi", line);
        }
    }
    fcfg_unlock();
    return r;
}

static nvmlReturn_t fcfg_ci_profile(fcfg_gih h, unsigned profile, fcfg_ci_prof_v2 *v2, fcfg_ci_prof_v1 *v1)
{
    nvmlReturn_t r;
    fcfg_gpu *g;
    fcfg *c = fcfg_lock();
    fcfg_gi *gi = fcfg_gi_of(c, h, &g, &r);
    unsigned k = fcfg_ci_slices(profile);
    if (gi && (k == 0 || k > gi->slices || profile == 7 || profile == 8))
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (gi && v2 && v2->version != FCFG_CI_PROFILE_INFO_V2)
        r = (nvmlReturn_t)FCFG_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    else if (gi) {
        unsigned sms = k == gi->slices ? gi->sms : gi->sms * k / gi->slices;
        fcfg_ci_prof_v1 info = {profile, k, gi->slices / k, sms, 0, 0, 0, 0, 0};
        if (v1)
            *v1 = info;
        if (v2) {
            unsigned version = v2->version;
            memset(v2, 0, sizeof(*v2));
            v2->version = version;
            v2->id = info.id;
            v2->sliceCount = k;
            v2->instanceCount = info.instanceCount;
            v2->multiprocessorCount = sms;
            if (k == gi->slices)
                snprintf(v2->name, sizeof(v2->name), "MIG %s", gi->name);
            else
                snprintf(v2->name, sizeof(v2->name), "MIG %uc.%s", k, gi->name);
        }
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(fcfg_gih h, unsigned profile, unsigned eng,
                                                                  fcfg_ci_prof_v2 *info)
{
    (void)eng;
    return fcfg_ci_profile(h, profile, info, NULL);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(fcfg_gih h, unsigned profile, unsigned eng,
                                                                 fcfg_ci_prof_v1 *info)
{
    (void)eng;
    return fcfg_ci_profile(h, profile, NULL, info);
}

static unsigned long long fcfg_fnv(const char *s, unsigned long long h)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(fcfg_gih h, unsigned profileId, fcfg_cih *out)
{
    nvmlReturn_t r;
    fcfg_gpu *g;
    fcfg *c = fcfg_lock();
    fcfg_gi *gi = fcfg_gi_of(c, h, &g, &r);
    unsigned k = fcfg_ci_slices(profileId);
    if (gi && (k == 0 || k > gi->slices || !out))
        r = NVML_ERROR_INVALID_ARGUMENT;
    int fd = gi && r == NVML_SUCCESS ? fcfg_mig_begin(c, &r) : -1;
    if (fd >= 0) {
        unsigned e = fcfg_mig_of(&g_live, h->slot, 0);
        gi = e < FCFG_MAX_GPUS ? fcfg_mig_gi(&g_live, e, h->gi) : NULL;
        unsigned used = 0, id = 0;
        for (unsigned j = 0; gi && j < gi->nci; j++)
            used += gi->ci[j].slices;
        while (gi && fcfg_ci_in(gi, id))
            id++;
        if (!gi)
            r = (nvmlReturn_t)FCFG_NVML_ERROR_NOT_FOUND;
        else if (used + k > gi->slices || gi->nci >= FCFG_MAX_CI || id >= FCFG_MAX_CI)
            r = (nvmlReturn_t)FCFG_NVML_ERROR_INSUFFICIENT_RESOURCES;
        if (r != NVML_SUCCESS) {
            close(fd);
        } else {
            fcfg_ci *ci = &gi->ci[gi->nci++];
            memset(ci, 0, sizeof(*ci));
            ci->id = id;
            ci->profile = profileId;
            ci->slices = k;
            ci->sms = k == gi->slices ? gi->sms : gi->sms * k / gi->slices;
            char giname[sizeof(gi->name)];
            memcpy(giname, gi->name, sizeof(giname));
            if (k == gi->slices)
                snprintf(ci->name, sizeof(ci->name), "%s", giname);
            else
                snprintf(ci->name, sizeof(ci->name), "%uc.%s", k, giname);
            char seed[120];
            snprintf(seed, sizeof(seed), "%s/%u/%u/%llu", g->uuid, gi->id, id, ++g_live.serial);
            unsigned long long a = fcfg_fnv(seed, 1469598103934665603ULL), b = fcfg_fnv(seed, a);
            snprintf(ci->uuid, sizeof(ci->uuid), "MIG-%08llx-%04llx-%04llx-%04llx-%012llx", a >> 32,
                     (a >> 16) & 0xffff, a & 0xffff, b >> 48, b & 0xffffffffffffULL);
            char line[200];
            snprintf(line, sizeof(line), "%s gi=%u ci=%u profile=%u uuid=%s", g->uuid, gi->id, id, profileId,
                     ci->uuid);
            *out = fcfg_ci_handle(h->slot, gi->id, id);
            r = fcfg_mig_commit(c, fd, "create-ci", line);
        }
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(fcfg_gih h, unsigned profileId, fcfg_cih *cis,
                                                       unsigned *count)
{
    nvmlReturn_t r;
    fcfg_gpu *g;
    fcfg *c = fcfg_lock();
    fcfg_gi *gi = fcfg_gi_of(c, h, &g, &r);
    if (gi && (!cis || !count))
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (gi) {
        unsigned n = 0;
        for (unsigned j = 0; j < gi->nci; j++)
            if (gi->ci[j].profile == profileId)
                cis[n++] = fcfg_ci_handle(h->slot, gi->id, gi->ci[j].id);
        *count = n;
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(fcfg_gih h, unsigned id, fcfg_cih *out)
{
    nvmlReturn_t r;
    fcfg_gpu *g;
    fcfg *c = fcfg_lock();
    fcfg_gi *gi = fcfg_gi_of(c, h, &g, &r);
    if (gi && (id >= FCFG_MAX_CI || !fcfg_ci_in(gi, id)))
        r = (nvmlReturn_t)FCFG_NVML_ERROR_NOT_FOUND;
    else if (gi)
        *out = fcfg_ci_handle(h->slot, gi->id, id);
    fcfg_unlock();
    return r;
}

/* The compute instance of a handle (NULL: gone, *r set). */
static fcfg_ci *fcfg_ci_of(fcfg *c, fcfg_cih h, fcfg_gpu **g, fcfg_gi **gi, nvmlReturn_t *r)
{
    if (!h || h->slot >= FCFG_MAX_GPUS) {
        *r = NVML_ERROR_INVALID_ARGUMENT;
        return NULL;
    }
    *gi = fcfg_gi_of(c, &g_gih[h->slot][h->gi], g, r);
    fcfg_ci *ci = *gi ? fcfg_ci_in(*gi, h->ci) : NULL;
    if (*gi && !ci)
        *r = (nvmlReturn_t)FCFG_NVML_ERROR_NOT_FOUND;
    return ci;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(fcfg_cih h, fcfg_ci_info *info)
{
    nvmlReturn_t r;
    fcfg_gpu *g;
    fcfg_gi *gi;
    fcfg *c = fcfg_lock();
    if (h && h->slot < FCFG_MAX_GPUS)
        fcfg_gi_handle(h->slot, h->gi);
    fcfg_ci *ci = fcfg_ci_of(c, h, &g, &gi, &r);
    if (ci)
        *info = (fcfg_ci_info){&g_fcfg_dev[h->slot], &g_gih[h->slot][h->gi], ci->id, ci->profile,
                               {0, ci->slices}};
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(fcfg_cih h, fcfg_ci_info *info)
{
    return nvmlComputeInstanceGetInfo_v2(h, info);
}

EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(fcfg_cih h)
{
    nvmlReturn_t r;
    fcfg_gpu *g;
    fcfg_gi *gi;
    fcfg *c = fcfg_lock();
    if (h && h->slot < FCFG_MAX_GPUS)
        fcfg_gi_handle(h->slot, h->gi);
    fcfg_ci *ci = fcfg_ci_of(c, h, &g, &gi, &r);
    int fd = ci ? fcfg_mig_begin(c, &r) : -1;
    if (fd >= 0) {
        unsigned e = fcfg_mig_of(&g_live, h->slot, 0);
        gi = e < FCFG_MAX_GPUS ? fcfg_mig_gi(&g_live, e, h->gi) : NULL;
        ci = gi ? fcfg_ci_in(gi, h->ci) : NULL;
        if (!ci) {
            r = (nvmlReturn_t)FCFG_NVML_ERROR_NOT_FOUND;
            close(fd);
        } else {
            unsigned j = (unsigned)(ci - gi->ci);
            memmove(ci, ci + 1, (gi->nci - j - 1) * sizeof(*ci));
            gi->nci--;
            char line[120];
            snprintf(line, sizeof(line), "%s gi=%u ci=%u", g->uuid, h->gi, h->ci);
            r = fcfg_mig_commit(c, fd, "destroy-ci", line);
        }
    }
    fcfg_unlock();
    return r;
}

/* ---- MIG devices ------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g) {
        unsigned total = 0;
        for (unsigned i = 0; i < g->nprof; i++)
            total = g->prof[i].slices > total ? g->prof[i].slices : total;
        *count = g->mig ? (total ? total : 7) : 0;
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *out)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g && (!g->mig || d->cfg != 1))
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (g) {
        /* MIG devices in GPU-instance id, then compute-instance id order. */
        fcfg_migset *m = fcfg_mig_live(c);
        unsigned e = fcfg_mig_of(m, d->index, 0), n = 0;
        r = (nvmlReturn_t)FCFG_NVML_ERROR_NOT_FOUND;
        for (unsigned id = 0; e < FCFG_MAX_GPUS && id < FCFG_GI_IDS && r != NVML_SUCCESS; id++) {
            fcfg_gi *gi = fcfg_mig_gi(m, e, id);
            for (unsigned cid = 0; gi && cid < FCFG_MAX_CI && r != NVML_SUCCESS; cid++)
                if (fcfg_ci_in(gi, cid) && n++ == index) {
                    *out = fcfg_mig_handle(d->index, id, cid);
                    r = NVML_SUCCESS;
                }
        }
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *isMig)
{
    *isMig = d && d->cfg == 2;
    return NVML_SUCCESS;
}

static nvmlReturn_t fcfg_mig_ids(nvmlDevice_t d, unsigned *gi_id, unsigned *ci_id)
{
    if (!d || d->cfg != 2)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    if (fcfg_dev(c, d, &r) && !fcfg_mig_ci(c, d, NULL))
        r = (nvmlReturn_t)FCFG_NVML_ERROR_NOT_FOUND;
    if (r == NVML_SUCCESS) {
        if (gi_id)
            *gi_id = d->gi;
        if (ci_id)
            *ci_id = d->ci;
    }
    fcfg_unlock();
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id)
{
    return fcfg_mig_ids(d, id, NULL);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id)
{
    return fcfg_mig_ids(d, NULL, id);
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *out)
{
    nvmlReturn_t r = fcfg_mig_ids(mig, NULL, NULL);
    if (r == NVML_SUCCESS)
        *out = &g_fcfg_dev[mig->index];
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, fcfg_attrs *a)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    fcfg_gpu *g = fcfg_dev(c, d, &r);
    if (g && d->cfg != 2)
        r = NVML_ERROR_NOT_SUPPORTED;
    else if (g) {
        fcfg_gi *gi;
        fcfg_ci *ci = fcfg_mig_ci(c, d, &gi);
        if (!ci)
            r = (nvmlReturn_t)FCFG_NVML_ERROR_NOT_FOUND;
        else
            *a = (fcfg_attrs){ci->sms, 0, 0, 0, 0, 0, gi->slices, ci->slices, gi->mib};
    }
    fcfg_unlock();
    return r;
}

#endif /* FAKE_NVML_CONFIG_H */
