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
 *         cc=<major>.<minor>  minor=<device minor number: /dev/nvidia<minor>>
 *         mig=0|1 (current MIG mode)  health=ok|lost (lost: every query of this GPU returns
 *         NVML_ERROR_GPU_IS_LOST, as after an XID 79 "fallen off the bus")
 *     xid ID UUID CODE                  an XID event (ID: increasing integer). An event set
 *                                       delivers the events whose ID is above the largest ID in
 *                                       the file when the set was created.
 *
 * Memory "used" of a GPU is the bytes taken from the fake libcuda by all processes when
 * fake_state.h has a device with the same UUID, else 0. Memory limits set through
 * nvmlDeviceSetMemoryLimits_v1 are kept per (GPU, cgroup path) in this process only.
 */
#ifndef FAKE_NVML_CONFIG_H
#define FAKE_NVML_CONFIG_H

#include <ctype.h>
#include <pthread.h>

#define FCFG_MAX_GPUS 64
#define FCFG_MAX_XIDS 256
#define FCFG_MAX_LIMITS 256
#define FCFG_NVML_ERROR_TIMEOUT 10
#define FCFG_NVML_ERROR_GPU_IS_LOST 15
#define FCFG_XID_EVENT 0x0000000000000008ULL /* nvmlEventTypeXidCriticalError */

typedef struct fcfg_gpu {
    char uuid[48];
    char name[96];
    char pci[32];
    unsigned long long memory;
    int cc_major, cc_minor;
    unsigned minor;
    unsigned mig;
    int lost;
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
    if (g) {
        if (strlen(g->uuid) + 1 > length)
            r = NVML_ERROR_INSUFFICIENT_SIZE;
        else
            memcpy(uuid, g->uuid, strlen(g->uuid) + 1);
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
    if (g) {
        unsigned long long u = 0;
        fake_state *st = fake_state_get();
        for (uint32_t i = 0; i < st->ndev; i++)
            if (!strcmp(st->dev[i].uuid, g->uuid))
                u = __atomic_load_n(&st->dev[i].used, __ATOMIC_ACQUIRE);
        *total = g->memory;
        *used = u;
        if (reserved)
            *reserved = 0;
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

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count)
{
    nvmlReturn_t r;
    fcfg *c = fcfg_lock();
    if (fcfg_dev(c, d, &r))
        *count = 0; /* MIG-enabled fake GPUs have no MIG devices */
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

#endif /* FAKE_NVML_CONFIG_H */
