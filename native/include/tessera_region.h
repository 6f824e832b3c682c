/*
 * tessera_region.h - THE layout of a claim's shared usage region (the only definition).
 *
 * One region file per claim, at the path given by the `region` line of the limits file
 * (the driver creates it at NodePrepareResources and bind-mounts it read-write into every
 * container of the claim). Every process of those containers that uses CUDA maps it with
 * mmap(MAP_SHARED). The monitor reads it with tessera.enforcement.region (Python, same layout;
 * tests/native checks the offsets below against that module).
 *
 * All integers are little-endian host order (x86_64, aarch64), naturally aligned. Fields
 * marked (atomic) are read and written only with 32/64-bit atomic operations; a reader that is
 * not the writer may see each field at a different instant but never a torn value.
 *
 *   offset  size   field
 *   0       8      magic            TESSERA_REGION_MAGIC ("TSSREGN1" in file byte order)
 *   8       4      version          TESSERA_REGION_VERSION
 *   12      4      header_size      bytes before slot 0 (= sizeof(tessera_region_header))
 *   16      4      slot_size        sizeof(tessera_region_slot)
 *   20      4      slot_count       TESSERA_REGION_MAX_SLOTS
 *   24      4      gpu_count        (atomic) entries used in gpus[]
 *   28      4      slot_high_water  (atomic) slots[0, slot_high_water) may be live
 *   32      8      generation       (atomic) incremented each time a slot is claimed
 *   40      8      context_overhead bytes charged per CUDA context (copy of the limits file)
 *   48      16     reserved
 *   64      16*96  gpus[16]         per-GPU entries, see tessera_region_gpu
 *   1600    1024*224 slots[1024]    per-process entries, see tessera_region_slot
 *   file size = 1600 + 1024*224 = 230976 bytes
 *
 * Locking (all locks are Linux open-file-description locks, fcntl F_OFD_SETLK/SETLKW, on
 * one-byte ranges of the region file; the kernel drops them when the process dies, in any PID
 * namespace, so no lock can be left held by a crashed process):
 *  - byte TESSERA_REGION_LOCK_BYTE (0): the region lock. Held to create/initialise the file,
 *    to add a GPU entry, to claim a slot, to reclaim dead slots, and for check-and-charge
 *    (the sum over slots plus the new charge must stay <= the limit).
 *  - byte TESSERA_REGION_SLOT_OFFSET(i): held (write lock) by the live owner of slot i for as
 *    long as it lives. A slot whose state is LIVE but whose byte can be locked by someone
 *    else (F_OFD_GETLK returns F_UNLCK) belongs to a dead process: its usage is reclaimed by
 *    zeroing used[] and contexts[] and setting state FREE, under the region lock.
 *
 * Usage of GPU g by the claim = sum over slots with state LIVE of used[g]. It is never stored
 * as a separate total, so a crash at any instant cannot make a total drift: each 64-bit store
 * of a slot's used[g] either happened or did not, and a dead slot is reclaimed whole.
 * Only the owner of a slot changes its used[] (charges under the region lock, credits with an
 * atomic subtraction); only the region-lock holder reclaims dead slots.
 */
#ifndef TESSERA_REGION_H
#define TESSERA_REGION_H

#include <stddef.h>
#include <stdint.h>

#define TESSERA_REGION_MAGIC 0x314e474552535354ULL /* bytes "TSSREGN1" */
#define TESSERA_REGION_VERSION 1u
#define TESSERA_REGION_MAX_GPUS 16
#define TESSERA_REGION_MAX_SLOTS 1024
#define TESSERA_REGION_UUID_LEN 48
#define TESSERA_REGION_LOCK_BYTE 0

#define TESSERA_SLOT_FREE 0u
#define TESSERA_SLOT_LIVE 1u

#define TESSERA_GPU_IN_USE 1u

typedef struct tessera_region_gpu {
    char uuid[TESSERA_REGION_UUID_LEN]; /* 0: "GPU-..."/"MIG-...", NUL-terminated */
    uint64_t memory_limit;              /* 48: bytes (copy of the limits file) */
    uint32_t cores;                     /* 56: percent of SMs, 0..100 (copy) */
    uint32_t flags;                     /* 60: TESSERA_GPU_IN_USE */
    uint64_t pace_tat_ns;   /* 64: (atomic) pacer's theoretical arrival time, CLOCK_MONOTONIC ns */
    uint64_t launches;      /* 72: (atomic) launches seen by the pacer (all processes) */
    uint64_t paced_ns;      /* 80: (atomic) total ns launches were held back by the pacer */
    uint64_t pace_scale;    /* 88: (atomic) pacer's cost correction: high 32 bits the factor
                               (16.16 fixed point, 0 = 1.0), low 32 bits when it was last set
                               (CLOCK_MONOTONIC ms, truncated) */
} tessera_region_gpu;       /* 96 bytes */

typedef struct tessera_region_slot {
    uint32_t state;       /* 0: (atomic) TESSERA_SLOT_FREE / TESSERA_SLOT_LIVE */
    int32_t pid;          /* 4: pid in the owner's PID namespace (informational) */
    uint64_t pid_ns;      /* 8: inode of the owner's /proc/self/ns/pid, 0 if unknown */
    uint64_t start_time;  /* 16: owner's start time, /proc/self/stat field 22, clock ticks */
    uint64_t generation;  /* 24: value of header.generation when the slot was claimed */
    uint64_t used[TESSERA_REGION_MAX_GPUS];     /* 32: (atomic) bytes charged per GPU entry */
    uint32_t contexts[TESSERA_REGION_MAX_GPUS]; /* 160: (atomic) contexts charged per GPU */
} tessera_region_slot;                          /* 224 bytes */

typedef struct tessera_region_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_size;
    uint32_t slot_size;
    uint32_t slot_count;
    uint32_t gpu_count;
    uint32_t slot_high_water;
    uint64_t generation;
    uint64_t context_overhead;
    uint64_t reserved[2];
    tessera_region_gpu gpus[TESSERA_REGION_MAX_GPUS];
} tessera_region_header; /* 1600 bytes */

#define TESSERA_REGION_HEADER_SIZE ((uint32_t)sizeof(tessera_region_header))
#define TESSERA_REGION_SLOT_SIZE ((uint32_t)sizeof(tessera_region_slot))
#define TESSERA_REGION_SLOT_OFFSET(i) \
    ((uint64_t)TESSERA_REGION_HEADER_SIZE + (uint64_t)(i) * TESSERA_REGION_SLOT_SIZE)
#define TESSERA_REGION_FILE_SIZE TESSERA_REGION_SLOT_OFFSET(TESSERA_REGION_MAX_SLOTS)

_Static_assert(sizeof(tessera_region_gpu) == 96, "region gpu entry is 96 bytes");
_Static_assert(sizeof(tessera_region_slot) == 224, "region slot is 224 bytes");
_Static_assert(sizeof(tessera_region_header) == 1600, "region header is 1600 bytes");
_Static_assert(offsetof(tessera_region_header, gpus) == 64, "gpus at 64");
_Static_assert(offsetof(tessera_region_slot, used) == 32, "used at 32");
_Static_assert(offsetof(tessera_region_slot, contexts) == 160, "contexts at 160");

#endif /* TESSERA_REGION_H */
