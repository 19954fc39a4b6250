/* SPDX-License-Identifier: MIT */
/* A map from 64-bit keys to pointers (internal): open addressing with
 * linear probing and backward-shift deletion, so it never holds tombstones.
 * Not thread-safe: its owner's lock guards it. Key 0 is reserved (empty). */
#ifndef SR_DIST_AUTOGRAD_IDMAP_H
#define SR_DIST_AUTOGRAD_IDMAP_H

#if !defined(SR__IN_DIST_AUTOGRAD)
#error "idmap.h is private to the dist_autograd module layer (docs/ARCHITECTURE.md)"
#endif
#include <stddef.h>
#include <stdint.h>

struct sr_idmap {
    uint64_t *keys;
    void **vals;
    size_t cap, len; /* cap: 0 or a power of two */
};

void *sr__idmap_get(const struct sr_idmap *m, uint64_t key);
/* Insert or replace; 0, -ENOMEM, or -EINVAL for key 0. */
int sr__idmap_put(struct sr_idmap *m, uint64_t key, void *val);
/* Remove; returns the value, or NULL if absent. */
void *sr__idmap_del(struct sr_idmap *m, uint64_t key);
void sr__idmap_free(struct sr_idmap *m);
/* Iterate: i from 0 while i < cap; entries with keys[i] != 0 are present. */

#endif
