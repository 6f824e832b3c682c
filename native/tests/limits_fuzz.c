/*
 * limits_fuzz SEED ITERS - deterministic random-input fuzzing of the limits-file parser.
 *
 * Inputs are mutations of valid files (bit flips, byte insertions and deletions, splices of
 * keywords and numbers, truncation) and pure random bytes. Each input is parsed from an
 * exact-size heap buffer (so AddressSanitizer sees any read past the end); accepted inputs
 * are formatted and parsed again, and the second parse must succeed and format identically
 * (canonical form is a fixed point). Prints "accepted=N rejected=M"; exit 1 on a violation.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tessera_limits.h"

static uint64_t s;
static uint64_t rnd(void)
{
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
}

static const char *seeds[] = {
    "version 1\nregion /run/tessera/claims/abc/usage\n"
    "gpu GPU-11111111-2222-3333-4444-555555555555 memory 8589934592 cores 30\n",
    "# written by tessera\nversion 1\nclaim default/train 6f1c\nregion /r\ncontext-overhead 314572800\n"
    "gpu GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee memory 1 cores 0\n"
    "gpu MIG-AAAAAAAA-bbbb-cccc-dddd-eeeeeeeeeeef memory 18446744073709551615 cores 100\n",
    "version 1\r\nregion\t/x \r\n  gpu GPU-00000000-0000-0000-0000-000000000000   memory 5 cores 7\r\n",
};
static const char *words[] = {"version", "region", "gpu", "memory", "cores", "claim",
                              "context-overhead", "1", "0", "100", "101", "18446744073709551616",
                              "GPU-", "MIG-", "#", "\n", " ", "\t", "\r", "/", "-", "\0"};

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: limits_fuzz SEED ITERS\n");
        return 2;
    }
    s = strtoull(argv[1], NULL, 10) | 1;
    unsigned long iters = strtoul(argv[2], NULL, 10);
    static tessera_limits a, b;
    static char fa[1 << 16], fb[1 << 16];
    char err[128];
    char *buf = malloc(1 << 16);
    unsigned long acc = 0, rej = 0;
    for (unsigned long it = 0; it < iters; it++) {
        size_t n;
        if (rnd() % 16 == 0) {
            n = rnd() % 512;
            for (size_t i = 0; i < n; i++)
                buf[i] = (char)rnd();
        } else {
            const char *sd = seeds[rnd() % 3];
            n = strlen(sd);
            memcpy(buf, sd, n);
            int muts = 1 + (int)(rnd() % 6);
            for (int m = 0; m < muts; m++) {
                size_t pos = n ? rnd() % (n + 1) : 0;
                switch (rnd() % 6) {
                case 0: /* flip a bit */
                    if (n)
                        buf[pos % n] ^= (char)(1 << (rnd() % 8));
                    break;
                case 1: /* delete a run */
                    if (n) {
                        size_t k = 1 + rnd() % 8;
                        pos %= n;
                        if (pos + k > n)
                            k = n - pos;
                        memmove(buf + pos, buf + pos + k, n - pos - k);
                        n -= k;
                    }
                    break;
                case 2: { /* insert a word */
                    const char *w = words[rnd() % (sizeof(words) / sizeof(words[0]))];
                    size_t k = *w ? strlen(w) : 1;
                    if (n + k < 4096) {
                        memmove(buf + pos + k, buf + pos, n - pos);
                        memcpy(buf + pos, w, k);
                        n += k;
                    }
                    break;
                }
                case 3: /* truncate */
                    n = pos;
                    break;
                case 4: /* random byte */
                    if (n)
                        buf[pos % n] = (char)rnd();
                    break;
                default: /* duplicate a chunk */
                    if (n && n * 2 < 4096) {
                        char chunk[4096];
                        size_t k = rnd() % n;
                        memcpy(chunk, buf, k);
                        memmove(buf + pos + k, buf + pos, n - pos);
                        memcpy(buf + pos, chunk, k);
                        n += k;
                    }
                }
            }
        }
        char *exact = malloc(n ? n : 1);
        memcpy(exact, buf, n);
        if (tessera_limits_parse(exact, n, &a, err, sizeof(err)) == 0) {
            acc++;
            size_t la = tessera_limits_format(&a, fa, sizeof(fa));
            if (tessera_limits_parse(fa, la, &b, err, sizeof(err)) != 0) {
                printf("canonical form rejected: %s\n", err);
                return 1;
            }
            size_t lb = tessera_limits_format(&b, fb, sizeof(fb));
            if (la != lb || memcmp(fa, fb, la) != 0) {
                printf("canonical form not a fixed point\n");
                return 1;
            }
        } else {
            rej++;
            if (strncmp(err, "line ", 5) != 0) {
                printf("error message without line: %s\n", err);
                return 1;
            }
        }
        free(exact);
    }
    free(buf);
    printf("accepted=%lu rejected=%lu\n", acc, rej);
    return 0;
}
