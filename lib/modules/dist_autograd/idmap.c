/* SPDX-License-Identifier: MIT */
/* A map from 64-bit keys to pointers. See idmap.h. */
#include "idmap.h"

#include <errno.h>
#include <stdlib.h>

static size_t slot(const struct sr_idmap *m, uint64_t key)
{
    return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & (m->cap - 1);
}

static size_t find(const struct sr_idmap *m, uint64_t key)
{
    size_t i = slot(m, key);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & (m->cap - 1);
    return i;
}

void *sr__idmap_get(const struct sr_idmap *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    size_t i = find(m, key);
    return m->keys[i] ? m->vals[i] : NULL;
}

static int grow(struct sr_idmap *m)
{
    struct sr_idmap n = {.cap = m->cap ? m->cap * 2 : 16};
    n.keys = calloc(n.cap, sizeof(*n.keys));
    n.vals = calloc(n.cap, sizeof(*n.vals));
    if (!n.keys || !n.vals) {
        free(n.keys);
        free(n.vals);
        return -ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i])
            continue;
        size_t j = find(&n, m->keys[i]);
        n.keys[j] = m->keys[i];
        n.vals[j] = m->vals[i];
    }
    n.len = m->len;
    sr__idmap_free(m);
    *m = n;
    return 0;
}

int sr__idmap_put(struct sr_idmap *m, uint64_t key, void *val)
{
    if (!key) /* the empty slots' key: a value put there would be lost */
        return -EINVAL;
    if ((m->len + 1) * 4 > m->cap * 3 && grow(m))
        return -ENOMEM;
    size_t i = find(m, key);
    if (!m->keys[i]) {
        m->keys[i] = key;
        m->len++;
    }
    m->vals[i] = val;
    return 0;
}

void *sr__idmap_del(struct sr_idmap *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    size_t i = find(m, key);
    if (!m->keys[i])
        return NULL;
    void *val = m->vals[i];
    /* Backward shift: move later members of the probe run into the hole. */
    for (size_t j = (i + 1) & (m->cap - 1); m->keys[j]; j = (j + 1) & (m->cap - 1)) {
        size_t home = slot(m, m->keys[j]);
        if (((j - home) & (m->cap - 1)) >= ((j - i) & (m->cap - 1))) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->keys[i] = 0;
    m->vals[i] = NULL;
    m->len--;
    return val;
}

void sr__idmap_free(struct sr_idmap *m)
{
    free(m->keys);
    free(m->vals);
    *m = (struct sr_idmap){0};
}
