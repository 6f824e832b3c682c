/*
 * A fake libnvidia-ml.so.1: the devices of fake_state.h in physical order (NVML ignores
 * CUDA_VISIBLE_DEVICES), their UUIDs and memory (used = bytes taken from the fake driver by
 * all processes), and a utilisation that a test sets with FAKE_GPU_UTIL (percent).
 *
 * With $FAKE_NVML_CONFIG naming a node description file, the devices come from that file
 * instead (see fake_nvml_config.h), with everything the Tessera node driver reads through
 * nvidia-ml-py: names, memory, PCI bus ids, compute capability, minor numbers, MIG mode,
 * driver/CUDA versions, lost GPUs, XID events and the r615 per-cgroup memory-limit calls,
 * NUMA affinity and NVLink peers, and MIG: GPU-instance profiles, existing GPU and compute
 * instances (MIG devices), and their creation and destruction (recorded in a log).
 *
 * With $FAKE_SCHED (the contention model, fake_sched.h), nvmlDeviceGetProcessUtilization
 * reports each process's share of the GPU's time over the model's last sample period, as the
 * real driver reports SM utilisation per host pid.
 */
#define FAKE_STATE_DEFINE
#include "fake_sched.h"
#include "fake_state.h"
#include "tessera_cuda.h"

#define EXPORT __attribute__((visibility("default")))

struct nvmlDevice_st {
    unsigned int index;
    int cfg;         /* 1: a GPU of $FAKE_NVML_CONFIG, 2: a MIG device of one (index: its GPU) */
    unsigned gi, ci; /* a MIG device's GPU instance and compute instance */
};
static struct nvmlDevice_st g_dev[FAKE_MAX_DEV];

#include "fake_nvml_config.h"

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    fake_state_get();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
    if (fcfg_active())
        return fcfg_count(n);
    *n = fake_state_get()->ndev;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (fcfg_active())
        return fcfg_handle_by_index(index, device);
    if (index >= fake_state_get()->ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    g_dev[index].index = index;
    *device = &g_dev[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    if (device->cfg)
        return fcfg_uuid(device, uuid, length);
    const char *u = fake_state_get()->dev[device->index].uuid;
    if (strlen(u) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(uuid, u, strlen(u) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m)
{
    if (device->cfg)
        return fcfg_memory(device, &m->total, &m->used, &m->free, NULL);
    fake_dev *d = &fake_state_get()->dev[device->index];
    m->total = d->total;
    m->used = __atomic_load_n(&d->used, __ATOMIC_ACQUIRE);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *m)
{
    if (m->version != nvmlMemory_v2)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (device->cfg)
        return fcfg_memory(device, &m->total, &m->used, &m->free, &m->reserved);
    fake_dev *d = &fake_state_get()->dev[device->index];
    m->total = d->total;
    m->reserved = 1 << 20;
    m->used = __atomic_load_n(&d->used, __ATOMIC_ACQUIRE);
    m->free = m->total - m->reserved - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *u)
{
    (void)device;
    const char *s = getenv("FAKE_GPU_UTIL");
    u->gpu = s ? (unsigned)atoi(s) : 0;
    u->memory = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                    nvmlProcessUtilizationSample_t *u,
                                                    unsigned int *count,
                                                    unsigned long long last_seen)
{
    fs_state *st = device->cfg || device->index >= FS_DEV ? NULL : fs_get();
    if (!st || !count)
        return st ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
    fs_lock(st);
    fs_dev *d = &st->dev[device->index];
    fs_advance(st, d, fake_now_ns());
    unsigned n = 0;
    for (uint32_t i = 0; i < d->nctx; i++) {
        fs_ctx *c = &d->ctx[i];
        if (!c->pid || !c->util_ts_us || c->util_ts_us <= last_seen)
            continue;
        if (u && n < *count) {
            memset(&u[n], 0, sizeof(u[n]));
            u[n].pid = (unsigned)c->pid;
            u[n].timeStamp = c->util_ts_us;
            u[n].smUtil = c->util_pct;
        }
        n++;
    }
    fs_unlock(st);
    if (!u || n > *count) {
        *count = n;
        return u ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    *count = n;
    return n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

/*
 * What nvidia-ml-py (the `tessera monitor` exporter) calls besides the above: nvmlInit() is
 * nvmlInitWithFlags(0), errors are rendered with nvmlErrorString, and the device's name is
 * HAMi's device_type label (FAKE_GPU_NAME, default "Tessera Fake GPU").
 */
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return nvmlInit_v2();
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    const char *cfg = fcfg_error_string((int)result);
    if (cfg)
        return cfg;
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    default:
        return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    if (device->cfg)
        return fcfg_name(device, name, length);
    const char *n = getenv("FAKE_GPU_NAME");
    if (!n || !*n)
        n = "Tessera Fake GPU";
    if (strlen(n) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(name, n, strlen(n) + 1);
    return NVML_SUCCESS;
}

/*
 * Per-process used memory (nvmlDeviceGetComputeRunningProcesses, v1-v3): every live process
 * that holds memory of the device, with what the fake itself counts it holding (fake_proc:
 * its contexts, the pages of its allocations, pool and graph-pool reserves, VMM allocations it
 * made), never the enforcement library's charge. Pids are this machine's (the tests run in one
 * PID namespace, as a node agent with the host's would see them). MIG devices list none.
 */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} fake_process_info_v2; /* nvmlProcessInfo_v2_t and nvmlProcessInfo_t (v3) */

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} fake_process_info_v1;

static int phys_of(nvmlDevice_t device)
{
    fake_state *st = fake_state_get();
    if (!device->cfg)
        return (int)device->index;
    if (device->cfg != 1)
        return -1;
    char uuid[96];
    if (nvmlDeviceGetUUID(device, uuid, sizeof(uuid)) != NVML_SUCCESS)
        return -1;
    for (uint32_t i = 0; i < st->ndev; i++)
        if (!strcmp(st->dev[i].uuid, uuid))
            return (int)i;
    return -1;
}

static nvmlReturn_t running(nvmlDevice_t device, unsigned int *count, void *infos, int v1)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    fake_state *st = fake_state_get();
    int p = phys_of(device);
    unsigned int n = 0, cap = infos ? *count : 0;
    for (int i = 0; p >= 0 && i < FAKE_MAX_PROCS; i++) {
        int32_t pid = __atomic_load_n(&st->procs[i].pid, __ATOMIC_ACQUIRE);
        uint64_t used = __atomic_load_n(&st->procs[i].used[p], __ATOMIC_ACQUIRE);
        if (pid <= 0 || used == 0 || (kill(pid, 0) != 0 && errno != EPERM))
            continue;
        if (n < cap) {
            if (v1) {
                fake_process_info_v1 *o = (fake_process_info_v1 *)infos + n;
                o->pid = (unsigned)pid;
                o->usedGpuMemory = used;
            } else {
                fake_process_info_v2 *o = (fake_process_info_v2 *)infos + n;
                o->pid = (unsigned)pid;
                o->usedGpuMemory = used;
                o->gpuInstanceId = 0xFFFFFFFFu;
                o->computeInstanceId = 0xFFFFFFFFu;
            }
        }
        n++;
    }
    *count = n;
    return n > cap ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                           unsigned int *count, void *infos)
{
    return running(device, count, infos, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                           unsigned int *count, void *infos)
{
    return running(device, count, infos, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                        void *infos)
{
    return running(device, count, infos, 1);
}
