/* libFuzzer harness for the limits-file parser: `make -C native libfuzzer` (needs clang). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tessera_limits.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static tessera_limits a, b;
    static char fa[1 << 16], fb[1 << 16];
    char err[128];
    if (tessera_limits_parse((const char *)data, size, &a, err, sizeof(err)) != 0)
        return 0;
    size_t la = tessera_limits_format(&a, fa, sizeof(fa));
    if (tessera_limits_parse(fa, la, &b, err, sizeof(err)) != 0)
        abort();
    size_t lb = tessera_limits_format(&b, fb, sizeof(fb));
    if (la != lb || memcmp(fa, fb, la) != 0)
        abort();
    return 0;
}
