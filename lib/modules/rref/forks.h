/* SPDX-License-Identifier: MIT */
/* The owner's fork table (internal): which forks (users) of each owned RRef
 * are alive, with tombstones for deletes that must cancel later adds.
 *
 * Pure bookkeeping with no locking and no messages, so the rules can be
 * tested on their own (tests/rref/test_rref_forks.c). The RRef context calls it
 * under its lock.
 *
 * Delivery may reorder, delay and duplicate control messages (retries), so:
 *   - An add is counted per fork: the first one makes the fork live, later
 *     ones (retried FORK_REQUESTs) only count.
 *   - A delete carries adds_sent, how many add messages its sender made for
 *     the fork (a REMOTE_CALL or an early registration is one; a
 *     FORK_REQUEST and each of its retries one each). Adds still in flight
 *     when the delete arrives (adds_sent - adds received) would resurrect
 *     the fork, so the delete leaves a tombstone that cancels exactly that
 *     many later adds.
 *   - A delete for a fork never seen is either a duplicate (the sender was
 *     confirmed, so its add arrived long ago: ignored) or it overtook its
 *     creating REMOTE_CALL (a timed-out remote(), unconfirmed: tombstone).
 *   - A duplicate delete finds the tombstone or nothing, and changes nothing.
 * Fork ids are never reused, so a tombstone can only ever match its own
 * fork's late adds.
 */
#ifndef SR_RREF_FORKS_H
#define SR_RREF_FORKS_H

#if !defined(SR__IN_RREF)
#error "forks.h is private to the rref module layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "map.h"

typedef struct sr_fork_table {
    sr_u64map forks;  /* fork_id -> struct sr_fork * (live or tombstone) */
    sr_u64map counts; /* rref_id -> live forks, stored as a non-zero uintptr_t */
    size_t live, tombs;
} sr_fork_table;

enum sr_fork_add {
    SR_FORK_ADDED,     /* the fork is now live */
    SR_FORK_DUPLICATE, /* it was live already (a retried request) */
    SR_FORK_CANCELLED, /* a tombstone absorbed it: its delete came first */
};

enum sr_fork_del {
    SR_FORK_REMOVED,   /* the fork was live and is gone (maybe leaving a tombstone) */
    SR_FORK_TOMBSTONE, /* unknown: a tombstone now waits for its adds */
    SR_FORK_IGNORED,   /* a duplicate: nothing changed */
};

/* 0 or -ENOMEM (then nothing changed). holder: the rank that holds the
 * fork (the sender of a REMOTE_CALL or FORK_REQUEST, the destination of an
 * early registration), -1 when not known; holder_gen its generation. */
int sr__forks_add(sr_fork_table *t, uint64_t rref_id, uint64_t fork_id, int holder, uint32_t holder_gen,
                  enum sr_fork_add *res);
int sr__forks_del(sr_fork_table *t, uint64_t rref_id, uint64_t fork_id, uint32_t adds_sent, bool confirmed,
                  enum sr_fork_del *res);

/* Live forks of rref_id. */
size_t sr__forks_count(const sr_fork_table *t, uint64_t rref_id);
/* Up to cap live fork ids of rref_id, ascending; returns the total count. */
size_t sr__forks_list(const sr_fork_table *t, uint64_t rref_id, uint64_t *out, size_t cap);
/* Every live fork as (rref_id, fork_id) pairs, up to cap; returns the total. */
size_t sr__forks_all(const sr_fork_table *t, uint64_t (*out)[2], size_t cap);
/* The holder's generation died: remove up to cap of the live forks it held (no
 * tombstone: nothing it sent is taken any more), their rref ids in rids
 * (one per fork); returns how many. */
size_t sr__forks_drop_holder(sr_fork_table *t, int holder, uint32_t holder_gen, uint64_t *rids, size_t cap);
void sr__forks_free(sr_fork_table *t);

#endif
