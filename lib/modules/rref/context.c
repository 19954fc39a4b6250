/* SPDX-License-Identifier: MIT */
/* The per-worker RRef context: ids, the owner records, idleness, the work
 * deferred past the lock, and the debug views. See rref_internal.h. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "error.h"
#include "hooks.h"
#include "rref_internal.h"

#define LOCAL_ID_MAX ((UINT64_C(1) << 48) - 1)
#define GEN_SHIFT SR_RREF_GEN_SHIFT

struct rref_ctx sr__rref_ctx = {.lock = PTHREAD_MUTEX_INITIALIZER};

void sr__rref_lock(void) { pthread_mutex_lock(&sr__rref_ctx.lock); }
void sr__rref_unlock(void) { pthread_mutex_unlock(&sr__rref_ctx.lock); }

bool sr__rref_live_locked(const sr_rref *r)
{
    /* relaxed: gen is written under the lock we hold */
    return sr__rref_ctx.active && r->gen == atomic_load_explicit(&sr__rref_ctx.gen, memory_order_relaxed);
}

uint64_t sr__rref_new_ids(unsigned n)
{
    struct rref_ctx *c = &sr__rref_ctx;
    /* relaxed: the counter only has to hand out distinct values */
    uint64_t first = atomic_fetch_add_explicit(&c->next_id, n, memory_order_relaxed);
    /* a generation's ids start at its GEN_SHIFT slice: a replacement never reuses its predecessor's */
    if (first + n - 1 > LOCAL_ID_MAX || (first + n - 1) >> GEN_SHIFT != first >> GEN_SHIFT) {
        sr__fail(-EOVERFLOW, "sr_rref", "worker%d has used up its 2^48 RRef ids", c->rank);
        return SR_RREF_NO_ID;
    }
    return (uint64_t)c->rank << 48 | first;
}

const char *sr__id_str(uint64_t id, char *buf, size_t len)
{
    uint64_t local = SR_RREF_ID_LOCAL(id), gen = local >> GEN_SHIFT;
    if (gen) /* made by a replacement: "(1,g2:5)" */
        snprintf(buf, len, "(%d,g%" PRIu64 ":%" PRIu64 ")", SR_RREF_ID_RANK(id), gen,
                 local & ((UINT64_C(1) << GEN_SHIFT) - 1));
    else
        snprintf(buf, len, "(%d,%" PRIu64 ")", SR_RREF_ID_RANK(id), local);
    return buf;
}

sr_rref *sr__owner_get_or_create_locked(uint64_t rid, bool awaiting)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr_rref *r = sr__map_get(&c->owners, rid);
    if (r)
        return r;
    r = sr__rref_alloc(true, c->rank, rid, SR_RREF_NO_ID);
    if (!r || sr__map_put(&c->owners, rid, r)) {
        sr_rref_unref(r); /* a fresh owner: nothing registered, the lock is not re-taken */
        sr__fail(-ENOMEM, "sr_rref", "out of memory for the OwnerRRef of rref id %" PRIx64, rid);
        return NULL;
    }
    r->awaiting = awaiting;
    c->awaiting += awaiting;
    return r;
}

void sr__owner_maybe_erase_locked(uint64_t rid, struct after *d)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr_rref *r = sr__map_get(&c->owners, rid);
    if (!r || r->awaiting || sr__forks_count(&c->forks, rid))
        return;
    sr__map_del(&c->owners, rid);
    d->unref[d->nunref++] = r;
}

bool sr__idle_locked(void)
{
    struct rref_ctx *c = &sr__rref_ctx;
    return !c->pending_users.n && !c->pending_remote && !c->unannounced.n && !c->children.n && !c->unacked.n;
}

void sr__idle_check_locked(struct after *d)
{
    struct rref_ctx *c = &sr__rref_ctx;
    if (c->idle && sr__idle_locked()) {
        d->complete[d->ncomplete++] = c->idle;
        c->idle = NULL;
    }
}

void (*sr__rref_test_before_send)(int to, enum sr_rref_ctrl kind);

void sr__after_run(struct after *d)
{
    for (int i = 0; i < d->nsend; i++) {
        if (sr__rref_test_before_send)
            sr__rref_test_before_send(d->send[i].to, (enum sr_rref_ctrl)d->send[i].m.kind);
        int rc = sr__ctrl_send(d->send[i].to, &d->send[i].m, d->send[i].quiet);
        if (rc)
            sr__ctrl_unsent(d->send[i].to, &d->send[i].m, rc);
        else
            sr__ctrl_after_send(d->send[i].to, d->send[i].nudge);
    }
    /* References go before completions: a thread woken by a completion (a
     * confirmation, idleness) must find every delete they cause queued. */
    for (int i = 0; i < d->nunref; i++)
        sr_rref_unref(d->unref[i]);
    for (int i = 0; i < d->ncomplete; i++) {
        sr_future_set_result(d->complete[i], NULL);
        sr_future_unref(d->complete[i]);
    }
    d->nsend = d->ncomplete = d->nunref = 0;
}

int sr__rref_init(int rank, int world, bool ignore_leaks)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr__rref_lock();
    uint64_t gen = atomic_fetch_add_explicit(&c->gen, 1, memory_order_relaxed) + 1; /* relaxed: under the lock */
    c->active = true;
    c->ignore_leaks = ignore_leaks;
    c->rank = rank;
    c->world = world;
    c->my_gen = sr__rpc_peer_generation(rank);
    /* a generation's tokens are its own too: a late ACK meant for its predecessor matches nothing */
    c->next_token = ((uint64_t)(c->my_gen & 0xffu) << GEN_SHIFT) + 1;
    c->awaiting = 0;
    c->pending_remote = 0;
    c->lost_rank = -1;
    /* relaxed: no other thread of this worker uses RRefs before sr_init returns */
    atomic_store_explicit(&c->deaths, 0, memory_order_relaxed);
    atomic_store_explicit(&c->next_id, (uint64_t)(c->my_gen & 0xffu) << GEN_SHIFT, memory_order_relaxed);
    atomic_store_explicit(&c->deferred, 0, memory_order_relaxed);
    atomic_store_explicit(&c->sent, 0, memory_order_relaxed);
    /* release: pairs with sr__rref_live's acquire; the fields above are set */
    atomic_store_explicit(&c->live_gen, gen, memory_order_release);
    sr__rref_unlock();
    return 0;
}

/* ---- debug -------------------------------------------------------------------- */

SR_API int sr_rref_debug_info_get(sr_rref_debug_info *o)
{
    struct rref_ctx *c = &sr__rref_ctx;
    if (!o)
        return sr__fail(-EINVAL, "sr_rref_debug_info_get", "out is NULL");
    sr__rref_lock();
    if (!c->active) {
        sr__rref_unlock();
        return sr__fail(-SR_ESHUTDOWN, "sr_rref_debug_info_get", "RPC has not been initialized. Call sr_init first.");
    }
    *o = (sr_rref_debug_info){
        .num_owner_rrefs = c->owners.n,
        .num_pending_owners = c->awaiting,
        .num_forks = c->forks.live,
        .num_pending_users = c->pending_users.n + c->pending_remote + c->unannounced.n,
        .num_confirmed_users = c->users.n,
        .num_pending_children = c->children.n,
        .num_pending_futures = c->unacked.n,
        .num_tombstones = c->forks.tombs,
        /* relaxed: statistics */
        .num_deferred_calls = atomic_load_explicit(&c->deferred, memory_order_relaxed),
        .num_retries = 0, /* nothing is ever resent (protocol.c) */
        .num_ctrl_sent = atomic_load_explicit(&c->sent, memory_order_relaxed),
    };
    sr__rref_unlock();
    return 0;
}

SR_API int sr_rref_debug_forks(uint64_t rid, uint64_t *out, size_t cap)
{
    struct rref_ctx *c = &sr__rref_ctx;
    if (cap && !out)
        return sr__fail(-EINVAL, "sr_rref_debug_forks", "out is NULL with cap %zu", cap);
    sr__rref_lock();
    int rc = c->active ? (int)sr__forks_list(&c->forks, rid, out, cap)
                       : sr__fail(-SR_ESHUTDOWN, "sr_rref_debug_forks",
                                  "RPC has not been initialized. Call sr_init first.");
    if (c->active && SR_RREF_ID_RANK(rid) >= c->world)
        rc = sr__fail(-EINVAL, "sr_rref_debug_forks", "rref id %" PRIx64 " names rank %d of %d", rid,
                      SR_RREF_ID_RANK(rid), c->world);
    sr__rref_unlock();
    return rc;
}
