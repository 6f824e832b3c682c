/*
 * limits_dump FILE      parse FILE; print the canonical form, or "error: <message>" (exit 1).
 * limits_dump --batch   read records from stdin (4-byte little-endian length, then bytes) and
 *                       print one line per record: "ok <canonical as hex>" or "error".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tessera_limits.h"

static char out[1 << 20];

int main(int argc, char **argv)
{
    static tessera_limits l;
    char err[256];
    if (argc == 2 && strcmp(argv[1], "--batch") == 0) {
        unsigned char hdr[4];
        static char buf[TESSERA_LIMITS_MAX_FILE];
        while (fread(hdr, 1, 4, stdin) == 4) {
            size_t n = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 |
                       (size_t)hdr[3] << 24;
            if (n > sizeof(buf) || fread(buf, 1, n, stdin) != n)
                return 2;
            /* parse from an exact-size heap copy so ASan sees any overread */
            char *exact = malloc(n ? n : 1);
            memcpy(exact, buf, n);
            if (tessera_limits_parse(exact, n, &l, err, sizeof(err)) == 0) {
                size_t len = tessera_limits_format(&l, out, sizeof(out));
                printf("ok ");
                for (size_t i = 0; i < len; i++)
                    printf("%02x", (unsigned char)out[i]);
                printf("\n");
            } else {
                printf("error\n");
            }
            free(exact);
        }
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: limits_dump FILE | --batch\n");
        return 2;
    }
    if (tessera_limits_load(argv[1], &l, err, sizeof(err)) != 0) {
        printf("error: %s\n", err);
        return 1;
    }
    tessera_limits_format(&l, out, sizeof(out));
    fputs(out, stdout);
    return 0;
}
