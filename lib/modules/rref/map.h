/* SPDX-License-Identifier: MIT */
/* A small hash map from 64-bit ids to non-NULL pointers (internal).
 *
 * Open addressing with linear probing and backward-shift deletion, so there
 * are no deleted markers and lookups stay short. An empty slot is one whose
 * value is NULL, so every key (0 included) may be stored, but not a NULL
 * value. Not thread-safe: the RRef context guards its maps with its lock.
 *
 * Iterate with sr__map_next(); do not insert or delete while iterating
 * (collect first).
 */
#ifndef SR_RREF_MAP_H
#define SR_RREF_MAP_H

#if !defined(SR__IN_RREF)
#error "map.h is private to the rref module layer (docs/ARCHITECTURE.md)"
#endif
#include <stddef.h>
#include <stdint.h>

typedef struct sr_u64map {
    uint64_t *keys;
    void **vals;
    size_t cap; /* 0 or a power of two */
    size_t n;
} sr_u64map;

/* The value stored under k, or NULL. */
void *sr__map_get(const sr_u64map *m, uint64_t k);
/* Store v (non-NULL) under k, replacing any value. 0 or -ENOMEM. */
int sr__map_put(sr_u64map *m, uint64_t k, void *v);
/* Remove k; returns its value, or NULL if it was absent. */
void *sr__map_del(sr_u64map *m, uint64_t k);
/* Free the table (not the values). */
void sr__map_free(sr_u64map *m);
/* Iteration: start with *pos = 0; returns 1 with *k, *v set, or 0 at the end. */
int sr__map_next(const sr_u64map *m, size_t *pos, uint64_t *k, void **v);

#endif
