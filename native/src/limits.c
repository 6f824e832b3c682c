/* Parser and formatter of the limits file; the format is specified in tessera_limits.h. */
#include "tessera_limits.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_TOKENS 8

#define XSTR_(x) #x
#define XSTR(x) XSTR_(x)

/*
 * The limits file versions this library reads, for the node driver: it reads this section from
 * the file, without loading the library (tessera.enforcement.library_formats), and writes no
 * claim a file of a version outside it. Not referenced by the code; `used` keeps it.
 */
__attribute__((used, section(TESSERA_FORMATS_SECTION))) static const char
    tessera_formats[] = "limits " XSTR(TESSERA_LIMITS_VERSION_MIN) ".." XSTR(
        TESSERA_LIMITS_VERSION) "\n";

static int fail(char *err, size_t errlen, unsigned line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, unsigned line, const char *fmt, ...)
{
    if (err && errlen) {
        int n = snprintf(err, errlen, "line %u: ", line);
        if (n >= 0 && (size_t)n < errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

static int is_blank(char c) { return c == ' ' || c == '\t'; }

/* Unsigned decimal, digits only, fits in uint64. */
static int parse_u64(const char *s, size_t n, uint64_t *out)
{
    if (n == 0 || n > 20)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* "GPU-"/"MIG-" + 8-4-4-4-12 hex; normalised into out (TESSERA_UUID_STR_LEN bytes). */
static int parse_uuid(const char *s, size_t n, char *out)
{
    if (n != TESSERA_UUID_STR_LEN - 1)
        return -1;
    if (memcmp(s, "GPU-", 4) != 0 && memcmp(s, "MIG-", 4) != 0)
        return -1;
    memcpy(out, s, 4);
    for (size_t i = 4; i < n; i++) {
        size_t k = i - 4;
        if (k == 8 || k == 13 || k == 18 || k == 23) {
            if (s[i] != '-')
                return -1;
            out[i] = '-';
        } else {
            int h = hexval(s[i]);
            if (h < 0)
                return -1;
            out[i] = "0123456789abcdef"[h];
        }
    }
    out[n] = '\0';
    return 0;
}

/* 1 when the normalised uuid is already in a gpu or unlimited line of l. */
static int uuid_listed(const tessera_limits *l, const char *uuid)
{
    for (uint32_t k = 0; k < l->gpu_count; k++)
        if (strcmp(l->gpus[k].uuid, uuid) == 0)
            return 1;
    for (uint32_t k = 0; k < l->unlimited_count; k++)
        if (strcmp(l->unlimited[k], uuid) == 0)
            return 1;
    return 0;
}

static int tok_is(const char *t, size_t n, const char *word)
{
    return strlen(word) == n && memcmp(t, word, n) == 0;
}

int tessera_uuid_equal(const char *a, const char *b)
{
    if (strlen(a) != TESSERA_UUID_STR_LEN - 1 || strlen(b) != TESSERA_UUID_STR_LEN - 1)
        return 0;
    for (size_t i = 4; i < TESSERA_UUID_STR_LEN - 1; i++) {
        char x = a[i], y = b[i];
        if (x >= 'A' && x <= 'F')
            x = (char)(x - 'A' + 'a');
        if (y >= 'A' && y <= 'F')
            y = (char)(y - 'A' + 'a');
        if (x != y)
            return 0;
    }
    return 1;
}

int tessera_limits_parse(const char *buf, size_t len, tessera_limits *out, char *err,
                         size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (err && errlen)
        err[0] = '\0';
    int seen_version = 0, seen_region = 0, seen_claim = 0, seen_overhead = 0;
    unsigned lineno = 0;
    size_t pos = 0;
    while (pos < len) {
        lineno++;
        size_t start = pos;
        while (pos < len && buf[pos] != '\n')
            pos++;
        size_t end = pos; /* exclusive */
        if (pos < len)
            pos++; /* skip '\n' */
        if (end - start > TESSERA_LIMITS_MAX_LINE)
            return fail(err, errlen, lineno, "line longer than %d bytes", TESSERA_LIMITS_MAX_LINE);
        if (end > start && buf[end - 1] == '\r')
            end--;
        for (size_t i = start; i < end; i++) {
            unsigned char c = (unsigned char)buf[i];
            if (c == '\0')
                return fail(err, errlen, lineno, "NUL byte");
            if ((c < 0x20 && c != '\t') || c >= 0x7f)
                return fail(err, errlen, lineno, "control or non-ASCII byte 0x%02x", c);
        }
        /* tokenize */
        const char *tok[MAX_TOKENS];
        size_t tlen[MAX_TOKENS];
        size_t nt = 0;
        size_t i = start;
        while (i < end && is_blank(buf[i]))
            i++;
        if (i == end || buf[i] == '#')
            continue;
        while (i < end) {
            size_t ts = i;
            while (i < end && !is_blank(buf[i]))
                i++;
            if (nt == MAX_TOKENS)
                return fail(err, errlen, lineno, "too many fields");
            tok[nt] = buf + ts;
            tlen[nt] = i - ts;
            nt++;
            while (i < end && is_blank(buf[i]))
                i++;
        }
        if (!seen_version) {
            uint64_t v;
            if (nt != 2 || !tok_is(tok[0], tlen[0], "version"))
                return fail(err, errlen, lineno, "expected 'version <N>' first");
            if (parse_u64(tok[1], tlen[1], &v) != 0)
                return fail(err, errlen, lineno, "expected 'version <N>' first");
            if (v > TESSERA_LIMITS_VERSION)
                return fail(err, errlen, lineno,
                            "version %llu is newer than this library reads (versions %d..%d): "
                            "upgrade the node's enforcement library",
                            (unsigned long long)v, TESSERA_LIMITS_VERSION_MIN,
                            TESSERA_LIMITS_VERSION);
            if (v < TESSERA_LIMITS_VERSION_MIN)
                return fail(err, errlen, lineno,
                            "version %llu is not a limits file version (this library reads "
                            "versions %d..%d)",
                            (unsigned long long)v, TESSERA_LIMITS_VERSION_MIN,
                            TESSERA_LIMITS_VERSION);
            out->version = (uint32_t)v;
            seen_version = 1;
            continue;
        }
        if (tok_is(tok[0], tlen[0], "version")) {
            return fail(err, errlen, lineno, "duplicate 'version'");
        } else if (tok_is(tok[0], tlen[0], "region")) {
            if (seen_region)
                return fail(err, errlen, lineno, "duplicate 'region'");
            if (nt != 2)
                return fail(err, errlen, lineno, "expected 'region <absolute path>'");
            if (tok[1][0] != '/')
                return fail(err, errlen, lineno, "region path must be absolute");
            if (tlen[1] > TESSERA_LIMITS_MAX_PATH)
                return fail(err, errlen, lineno, "region path too long");
            memcpy(out->region, tok[1], tlen[1]);
            out->region[tlen[1]] = '\0';
            seen_region = 1;
        } else if (tok_is(tok[0], tlen[0], "claim")) {
            if (seen_claim)
                return fail(err, errlen, lineno, "duplicate 'claim'");
            if (nt != 3)
                return fail(err, errlen, lineno, "expected 'claim <namespace>/<name> <uid>'");
            if (tlen[1] + 1 + tlen[2] >= TESSERA_CLAIM_MAX)
                return fail(err, errlen, lineno, "claim too long");
            if (memchr(tok[1], '/', tlen[1]) == NULL)
                return fail(err, errlen, lineno, "claim must be <namespace>/<name>");
            memcpy(out->claim, tok[1], tlen[1]);
            out->claim[tlen[1]] = ' ';
            memcpy(out->claim + tlen[1] + 1, tok[2], tlen[2]);
            out->claim[tlen[1] + 1 + tlen[2]] = '\0';
            seen_claim = 1;
        } else if (tok_is(tok[0], tlen[0], "context-overhead")) {
            if (seen_overhead)
                return fail(err, errlen, lineno, "duplicate 'context-overhead'");
            if (nt != 2 || parse_u64(tok[1], tlen[1], &out->context_overhead) != 0)
                return fail(err, errlen, lineno, "expected 'context-overhead <bytes>'");
            seen_overhead = 1;
        } else if (tok_is(tok[0], tlen[0], "shares")) {
            if (out->shares[0])
                return fail(err, errlen, lineno, "duplicate 'shares'");
            if (nt != 2)
                return fail(err, errlen, lineno, "expected 'shares <absolute path>'");
            if (tok[1][0] != '/')
                return fail(err, errlen, lineno, "shares path must be absolute");
            if (tlen[1] > TESSERA_LIMITS_MAX_PATH)
                return fail(err, errlen, lineno, "shares path too long");
            memcpy(out->shares, tok[1], tlen[1]);
            out->shares[tlen[1]] = '\0';
        } else if (tok_is(tok[0], tlen[0], "gpu")) {
            uint64_t mem, cores;
            if ((nt != 6 && nt != 8) || !tok_is(tok[2], tlen[2], "memory") ||
                !tok_is(tok[4], tlen[4], "cores") || (nt == 8 && !tok_is(tok[6], tlen[6], "policy")))
                return fail(err, errlen, lineno,
                            "expected 'gpu <UUID> memory <bytes> cores <0-100>' "
                            "[policy strict|work-conserving]");
            if (out->gpu_count == TESSERA_LIMITS_MAX_GPUS)
                return fail(err, errlen, lineno, "more than %d gpus", TESSERA_LIMITS_MAX_GPUS);
            tessera_limit_gpu *g = &out->gpus[out->gpu_count];
            if (parse_uuid(tok[1], tlen[1], g->uuid) != 0)
                return fail(err, errlen, lineno, "bad GPU UUID");
            if (uuid_listed(out, g->uuid))
                return fail(err, errlen, lineno, "duplicate gpu %s", g->uuid);
            if (parse_u64(tok[3], tlen[3], &mem) != 0 || mem == 0)
                return fail(err, errlen, lineno, "memory must be a positive byte count");
            if (parse_u64(tok[5], tlen[5], &cores) != 0 || cores > 100)
                return fail(err, errlen, lineno, "cores must be 0..100");
            g->policy = TESSERA_POLICY_STRICT;
            if (nt == 8 && tok_is(tok[7], tlen[7], "work-conserving"))
                g->policy = TESSERA_POLICY_WORK_CONSERVING;
            else if (nt == 8 && !tok_is(tok[7], tlen[7], "strict"))
                return fail(err, errlen, lineno, "policy must be strict or work-conserving");
            g->memory = mem;
            g->cores = (uint32_t)cores;
            out->gpu_count++;
        } else if (tok_is(tok[0], tlen[0], "unlimited")) {
            char u[TESSERA_UUID_STR_LEN];
            if (nt != 2)
                return fail(err, errlen, lineno, "expected 'unlimited <UUID>'");
            if (out->unlimited_count == TESSERA_LIMITS_MAX_UNLIMITED)
                return fail(err, errlen, lineno, "more than %d unlimited devices",
                            TESSERA_LIMITS_MAX_UNLIMITED);
            if (parse_uuid(tok[1], tlen[1], u) != 0)
                return fail(err, errlen, lineno, "bad GPU UUID");
            if (uuid_listed(out, u))
                return fail(err, errlen, lineno, "duplicate gpu %s", u);
            memcpy(out->unlimited[out->unlimited_count++], u, sizeof(u));
        } else {
            return fail(err, errlen, lineno, "unknown keyword '%.*s'", (int)(tlen[0] > 32 ? 32 : tlen[0]),
                        tok[0]);
        }
    }
    if (!seen_version)
        return fail(err, errlen, lineno, "empty file (expected 'version <N>')");
    if (!seen_region)
        return fail(err, errlen, lineno, "missing 'region'");
    if (out->gpu_count == 0)
        return fail(err, errlen, lineno, "no 'gpu' lines");
    return 0;
}

int tessera_limits_load_fd(int fd, const char *name, tessera_limits *out, char *err,
                           size_t errlen)
{
    char *buf = malloc(TESSERA_LIMITS_MAX_FILE + 1);
    if (!buf) {
        if (err && errlen)
            snprintf(err, errlen, "out of host memory");
        return -1;
    }
    size_t len = 0;
    int rc = -1;
    for (;;) {
        ssize_t n = pread(fd, buf + len, TESSERA_LIMITS_MAX_FILE + 1 - len, (off_t)len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (err && errlen)
                snprintf(err, errlen, "read %s: %s", name, strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > TESSERA_LIMITS_MAX_FILE) {
            if (err && errlen)
                snprintf(err, errlen, "%s: larger than %d bytes", name, TESSERA_LIMITS_MAX_FILE);
            goto out;
        }
    }
    rc = tessera_limits_parse(buf, len, out, err, errlen);
out:
    free(buf);
    return rc;
}

int tessera_limits_load(const char *path, tessera_limits *out, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (err && errlen)
            snprintf(err, errlen, "open %s: %s", path, strerror(errno));
        return -1;
    }
    int rc = tessera_limits_load_fd(fd, path, out, err, errlen);
    close(fd);
    return rc;
}

size_t tessera_limits_format(const tessera_limits *l, char *buf, size_t buflen)
{
    size_t need = 0;
#define EMIT(...)                                                                              \
    do {                                                                                       \
        int n_ = snprintf(need < buflen ? buf + need : NULL, need < buflen ? buflen - need : 0, \
                          __VA_ARGS__);                                                        \
        if (n_ > 0)                                                                            \
            need += (size_t)n_;                                                                \
    } while (0)
    EMIT("version %u\n", l->version);
    if (l->claim[0])
        EMIT("claim %s\n", l->claim);
    EMIT("region %s\n", l->region);
    EMIT("context-overhead %llu\n", (unsigned long long)l->context_overhead);
    if (l->shares[0])
        EMIT("shares %s\n", l->shares);
    for (uint32_t i = 0; i < l->gpu_count; i++)
        EMIT("gpu %s memory %llu cores %u%s\n", l->gpus[i].uuid,
             (unsigned long long)l->gpus[i].memory, l->gpus[i].cores,
             l->gpus[i].policy == TESSERA_POLICY_WORK_CONSERVING ? " policy work-conserving" : "");
    for (uint32_t i = 0; i < l->unlimited_count; i++)
        EMIT("unlimited %s\n", l->unlimited[i]);
#undef EMIT
    return need;
}
