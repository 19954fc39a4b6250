/* SPDX-License-Identifier: MIT */
/* The id map. See map.h. */
#include "map.h"

#include <errno.h>
#include <stdlib.h>

#include "error.h"

#define MIN_CAP 16

static size_t slot_of(const sr_u64map *m, uint64_t k)
{
    /* Fibonacci hashing: ids differ mostly in their low bits. */
    return (size_t)((k * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & (m->cap - 1);
}

void *sr__map_get(const sr_u64map *m, uint64_t k)
{
    if (!m->n)
        return NULL;
    for (size_t i = slot_of(m, k);; i = (i + 1) & (m->cap - 1)) {
        if (!m->vals[i])
            return NULL;
        if (m->keys[i] == k)
            return m->vals[i];
    }
}

static int grow(sr_u64map *m)
{
    size_t cap = m->cap ? m->cap * 2 : MIN_CAP;
    sr_u64map big = {.keys = calloc(cap, sizeof(uint64_t)), .vals = calloc(cap, sizeof(void *)), .cap = cap};
    if (!big.keys || !big.vals) {
        free(big.keys);
        free(big.vals);
        return sr__fail(-ENOMEM, "sr_rref", "out of memory growing an RRef table to %zu entries", cap);
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->vals[i])
            sr__map_put(&big, m->keys[i], m->vals[i]); /* cannot grow again: n < cap / 2 */
    free(m->keys);
    free(m->vals);
    *m = big;
    return 0;
}

int sr__map_put(sr_u64map *m, uint64_t k, void *v)
{
    if ((m->n + 1) * 2 > m->cap) { /* keep the load at most one half */
        int rc = grow(m);
        if (rc)
            return rc;
    }
    size_t i = slot_of(m, k);
    while (m->vals[i] && m->keys[i] != k)
        i = (i + 1) & (m->cap - 1);
    if (!m->vals[i])
        m->n++;
    m->keys[i] = k;
    m->vals[i] = v;
    return 0;
}

/* Is slot j's home in the cyclic range (hole, j]? Then it must not move into hole. */
static int home_between(size_t home, size_t hole, size_t j)
{
    return hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
}

void *sr__map_del(sr_u64map *m, uint64_t k)
{
    if (!m->n)
        return NULL;
    size_t i = slot_of(m, k);
    while (m->vals[i] && m->keys[i] != k)
        i = (i + 1) & (m->cap - 1);
    void *v = m->vals[i];
    if (!v)
        return NULL;
    /* Backward shift: pull later entries of the probe run into the hole. */
    size_t hole = i;
    for (size_t j = (i + 1) & (m->cap - 1); m->vals[j]; j = (j + 1) & (m->cap - 1)) {
        if (home_between(slot_of(m, m->keys[j]), hole, j))
            continue;
        m->keys[hole] = m->keys[j];
        m->vals[hole] = m->vals[j];
        hole = j;
    }
    m->vals[hole] = NULL;
    m->n--;
    return v;
}

void sr__map_free(sr_u64map *m)
{
    free(m->keys);
    free(m->vals);
    *m = (sr_u64map){0};
}

int sr__map_next(const sr_u64map *m, size_t *pos, uint64_t *k, void **v)
{
    for (; *pos < m->cap; ++*pos)
        if (m->vals[*pos]) {
            *k = m->keys[*pos];
            *v = m->vals[*pos];
            ++*pos;
            return 1;
        }
    return 0;
}
