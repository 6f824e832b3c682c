/* libtessera-enforce: logging, the clock and refusals (the bottom of the core). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

/* ---------------------------------------------------------------------------------------- */
/* logging                                                                                   */

static int g_log_level = -1;

void ts_log(int level, const char *fmt, ...)
{
    if (g_log_level < 0) {
        const char *s = getenv("TESSERA_LOG_LEVEL");
        g_log_level = s ? atoi(s) : TS_WARN;
    }
    if (level > g_log_level)
        return;
    char buf[512];
    int n = snprintf(buf, sizeof(buf), "tessera[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(buf))
        vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = strlen(buf);
    if (len < sizeof(buf) - 1) {
        buf[len++] = '\n';
    }
    ssize_t w = write(2, buf, len);
    (void)w;
}

uint64_t ts_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

CUresult ts_refuse(const char *what, const char *why)
{
    ts_log(TS_ERR, "%s refused: %s", what, why);
    return CUDA_ERROR_NOT_SUPPORTED;
}
