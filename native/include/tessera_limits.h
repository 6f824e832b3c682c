/*
 * tessera_limits.h - the limits file: what one container of a claim may use.
 *
 * The Tessera DRA driver writes this file at NodePrepareResources time and mounts it read-only
 * into every container of the claim at TESSERA_LIMITS_PATH. The enforcement library reads it
 * once per process. Python writer and parser: tessera.enforcement.limits (they must agree with
 * the C parser below byte for byte; tests/native round-trips and fuzzes both).
 *
 * Versions. The first statement names the file's version; a library reads every version from
 * TESSERA_LIMITS_VERSION_MIN to TESSERA_LIMITS_VERSION and refuses a newer one ("version N is
 * newer than this library reads (versions 1..2)"), which fails the container closed. Each
 * version adds statements; the node driver writes the lowest version that expresses a claim's
 * content (tessera.enforcement.limits.required_version, the one place that decides), so a claim
 * using no newer statement stays readable by an older library, and it refuses to prepare a
 * claim whose file the installed library could not read. The versions this library reads are
 * also in its ELF section TESSERA_FORMATS_SECTION ("limits 1..2\n"), which the driver reads
 * from the file without loading it (docs/install.md, "Supported skew").
 *
 *     version 1   claim, region, context-overhead, shares, gpu
 *     version 2   + unlimited
 *
 * A version-1 file with `unlimited` lines is what drivers before version 2 wrote (the statement
 * was added inside version 1); this library reads it, with the same meaning, so a container
 * restarted on a claim prepared by such a driver keeps working. No writer emits it.
 *
 * Format, version 2 (ASCII, line based):
 *
 *     # comment lines start with '#'; blank lines are ignored
 *     version <1|2>
 *     claim <namespace>/<name> <uid>          (optional, informational, at most once)
 *     region <absolute path>                  (required, exactly once)
 *     context-overhead <bytes>                (optional, at most once; default 0)
 *     shares <absolute path>                  (optional, at most once: the node's per-GPU
 *                                              shares directory, read-only, see below)
 *     gpu <UUID> memory <bytes> cores <0-100> [policy strict|work-conserving]
 *                                             (one line per GPU of the claim, 1..16 lines;
 *                                              policy defaults to strict)
 *     unlimited <UUID>                        (version 2; 0..32 lines: a device of the claim
 *                                              the container may use without limit, a whole GPU
 *                                              or MIG device or an adminAccess result)
 *
 * Rules:
 *  - `version <N>` is the first line that is neither blank nor a comment, 1 <= N <= 2.
 *  - Tokens are separated by one or more spaces or tabs; leading/trailing blanks and a final
 *    '\r' are ignored. A '#' only starts a comment at the start of a line (after blanks).
 *  - Numbers are unsigned decimal ASCII digits only (no sign, no suffix, no leading '+'), at
 *    most 20 digits and at most 2^64-1. memory >= 1. cores 0..100.
 *  - <UUID> is "GPU-" or "MIG-" followed by the canonical 8-4-4-4-12 hex form; hex digits are
 *    case-insensitive and normalised to lower case. Each UUID appears at most once, in a
 *    `gpu` or an `unlimited` line.
 *  - A CUDA device whose UUID is in neither a `gpu` nor an `unlimited` line is not the claim's:
 *    the library refuses contexts and memory on it (a second claim's GPU, whose own limits
 *    file the container does not see).
 *  - <path> is absolute ('/' first), at most 4095 bytes, no blanks, no control characters.
 *  - Unknown keywords, extra tokens, lines longer than 4095 bytes (before the '\r' is removed),
 *    and any byte that is not printable ASCII, space or tab (NUL, other controls, >= 0x7f) are
 *    errors.
 *  - cores 0 means best effort; cores 100 means the whole GPU (no limiter). Under `strict`,
 *    0 < cores < 100 is a cap; under `work-conserving` it is the guaranteed share, and the
 *    claim may also use idle GPU time (docs/enforcement.md section 5). A best-effort GPU is
 *    paced only when `shares` names the directory where the node driver keeps, per GPU, the
 *    cores guaranteed to the limited claims (tessera.enforcement.shares).
 *
 * Canonical form (what the Python writer emits, and what tessera_limits_format prints; the
 * version is the one the file declares, the lowest that expresses its content when the driver
 * wrote it):
 *     version N\n[claim ...\n]region ...\ncontext-overhead N\n[shares ...\n]
 *     gpu ... memory N cores N[ policy work-conserving]\n...[unlimited UUID\n...]
 * with the GPU lines, then the unlimited lines, each in file order.
 */
#ifndef TESSERA_LIMITS_H
#define TESSERA_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#define TESSERA_LIMITS_PATH "/etc/tessera/limits"
/* Fallback outside Kubernetes, read only when nothing is at TESSERA_LIMITS_PATH (the file and
 * its directories absent). At the fixed path the library accepts only a readable regular file
 * owned by root and not writable by group or others; anything else fails closed. */
#define TESSERA_LIMITS_ENV "TESSERA_LIMITS_FILE"

/* The versions this library reads: TESSERA_LIMITS_VERSION_MIN..TESSERA_LIMITS_VERSION (the
 * newest). A new statement comes with a new version (and an entry in
 * tessera.enforcement.limits.STATEMENT_SINCE). */
#define TESSERA_LIMITS_VERSION_MIN 1
#define TESSERA_LIMITS_VERSION 2
/* ELF section holding "limits <min>..<max>\n", read by the driver without loading the library. */
#define TESSERA_FORMATS_SECTION ".tessera_formats"
#define TESSERA_LIMITS_MAX_GPUS 16
/* DRA's limit on the results of one claim (resource.k8s.io/v1 AllocationResultsMaxSize). */
#define TESSERA_LIMITS_MAX_UNLIMITED 32
#define TESSERA_LIMITS_MAX_LINE 4095
#define TESSERA_LIMITS_MAX_PATH 4095
#define TESSERA_LIMITS_MAX_FILE (1024 * 1024)
/* "GPU-" + 36 characters + NUL */
#define TESSERA_UUID_STR_LEN 41
#define TESSERA_CLAIM_MAX 512

typedef struct tessera_limit_gpu {
    char uuid[TESSERA_UUID_STR_LEN]; /* normalised: prefix + lower-case canonical form */
    uint64_t memory;                 /* bytes, >= 1 */
    uint32_t cores;                  /* percent of SMs, 0..100 */
    uint32_t policy;                 /* TESSERA_POLICY_* */
} tessera_limit_gpu;

#define TESSERA_POLICY_STRICT 0u          /* cores is a cap */
#define TESSERA_POLICY_WORK_CONSERVING 1u /* cores is guaranteed; idle time may be used too */

typedef struct tessera_limits {
    uint32_t version;                          /* as the file declares it, 1..2 */
    char claim[TESSERA_CLAIM_MAX];             /* "" when absent: "<ns>/<name> <uid>" */
    char region[TESSERA_LIMITS_MAX_PATH + 1];  /* absolute path */
    uint64_t context_overhead;                 /* bytes charged per CUDA context */
    char shares[TESSERA_LIMITS_MAX_PATH + 1];  /* per-GPU shares directory, "" when absent */
    uint32_t gpu_count;
    tessera_limit_gpu gpus[TESSERA_LIMITS_MAX_GPUS];
    uint32_t unlimited_count;
    char unlimited[TESSERA_LIMITS_MAX_UNLIMITED][TESSERA_UUID_STR_LEN]; /* normalised UUIDs */
} tessera_limits;

/*
 * Parse `len` bytes at `buf`. Returns 0 on success; on error returns -1 and writes a message
 * "line N: ..." (NUL-terminated, truncated to errlen) into err. Never reads past buf+len.
 */
int tessera_limits_parse(const char *buf, size_t len, tessera_limits *out, char *err,
                         size_t errlen);

/* Read and parse a file (at most TESSERA_LIMITS_MAX_FILE bytes). Same return convention. */
int tessera_limits_load(const char *path, tessera_limits *out, char *err, size_t errlen);
/* The same from an open descriptor (read from offset 0; not closed); name is for messages. */
int tessera_limits_load_fd(int fd, const char *name, tessera_limits *out, char *err,
                           size_t errlen);

/* Canonical text of `l` into buf; returns the length it needs (like snprintf). */
size_t tessera_limits_format(const tessera_limits *l, char *buf, size_t buflen);

/* Compare the 36-character canonical parts of two UUID strings ("GPU-"/"MIG-" ignored). */
int tessera_uuid_equal(const char *a, const char *b);

#endif /* TESSERA_LIMITS_H */
