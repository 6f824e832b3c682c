/* Per-process table of live allocations: (kind, handle) -> (bytes, region GPU entry, owning
 * context). Kinds are enum ts_kind (core.h) and the private kinds of mem.c / pool.c / vmm.c. */
#ifndef TESSERA_ALLOC_TABLE_H
#define TESSERA_ALLOC_TABLE_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


typedef struct ts_entry {
    uint64_t key;
    uint64_t bytes;
    uint64_t ctx; /* the context that owns it (freed with it), 0 if none */
    int32_t g;
    uint8_t kind; /* 0 = empty */
} ts_entry;

typedef struct ts_table {
    pthread_mutex_t mu;
    ts_entry *e;
    size_t cap; /* power of two */
    size_t n;
} ts_table;

static inline size_t ts_hash(uint64_t key, uint8_t kind, size_t cap)
{
    uint64_t h = (key ^ ((uint64_t)kind << 56)) * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h >> 17) & (cap - 1);
}

static inline int ts_table_grow(ts_table *t)
{
    size_t ncap = t->cap ? t->cap * 2 : 1024;
    ts_entry *ne = calloc(ncap, sizeof(*ne));
    if (!ne)
        return -1;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->e[i].kind)
            continue;
        size_t j = ts_hash(t->e[i].key, t->e[i].kind, ncap);
        while (ne[j].kind)
            j = (j + 1) & (ncap - 1);
        ne[j] = t->e[i];
    }
    free(t->e);
    t->e = ne;
    t->cap = ncap;
    return 0;
}

/* Insert or replace. Returns 0, or -1 when host memory is exhausted. */
static inline int ts_table_put(ts_table *t, uint8_t kind, uint64_t key, uint64_t bytes, int32_t g,
                               uint64_t ctx)
{
    pthread_mutex_lock(&t->mu);
    if ((t->n + 1) * 2 > t->cap && ts_table_grow(t) != 0) {
        pthread_mutex_unlock(&t->mu);
        return -1;
    }
    size_t j = ts_hash(key, kind, t->cap);
    while (t->e[j].kind && !(t->e[j].kind == kind && t->e[j].key == key))
        j = (j + 1) & (t->cap - 1);
    if (!t->e[j].kind)
        t->n++;
    t->e[j].key = key;
    t->e[j].kind = kind;
    t->e[j].bytes = bytes;
    t->e[j].g = g;
    t->e[j].ctx = ctx;
    pthread_mutex_unlock(&t->mu);
    return 0;
}

/* Remove and return the entry; returns 0 if found. */
static inline int ts_table_take(ts_table *t, uint8_t kind, uint64_t key, ts_entry *out)
{
    pthread_mutex_lock(&t->mu);
    if (!t->cap) {
        pthread_mutex_unlock(&t->mu);
        return -1;
    }
    size_t j = ts_hash(key, kind, t->cap);
    while (t->e[j].kind && !(t->e[j].kind == kind && t->e[j].key == key))
        j = (j + 1) & (t->cap - 1);
    if (!t->e[j].kind) {
        pthread_mutex_unlock(&t->mu);
        return -1;
    }
    *out = t->e[j];
    /* backward-shift deletion keeps probe chains intact without tombstones */
    size_t i = j;
    for (;;) {
        t->e[i].kind = 0;
        size_t k = i;
        for (;;) {
            k = (k + 1) & (t->cap - 1);
            if (!t->e[k].kind) {
                t->n--;
                pthread_mutex_unlock(&t->mu);
                return 0;
            }
            size_t home = ts_hash(t->e[k].key, t->e[k].kind, t->cap);
            /* can e[k] move to i? yes if home is not in (i, k] cyclically */
            int in_range = i <= k ? (home > i && home <= k) : (home > i || home <= k);
            if (!in_range)
                break;
        }
        t->e[i] = t->e[k];
        i = k;
    }
}

static inline int ts_table_get(ts_table *t, uint8_t kind, uint64_t key, ts_entry *out)
{
    pthread_mutex_lock(&t->mu);
    int rc = -1;
    if (t->cap) {
        size_t j = ts_hash(key, kind, t->cap);
        while (t->e[j].kind && !(t->e[j].kind == kind && t->e[j].key == key))
            j = (j + 1) & (t->cap - 1);
        if (t->e[j].kind) {
            *out = t->e[j];
            rc = 0;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* Copy up to max entries owned by ctx (with ctx != 0) into out; returns how many there are. */
static inline size_t ts_table_owned(ts_table *t, uint64_t ctx, ts_entry *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->cap; i++) {
        if (t->e[i].kind && t->e[i].ctx == ctx) {
            if (n < max)
                out[n] = t->e[i];
            n++;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}

static inline void ts_table_clear(ts_table *t)
{
    pthread_mutex_init(&t->mu, NULL);
    free(t->e);
    t->e = NULL;
    t->cap = t->n = 0;
}

#endif
