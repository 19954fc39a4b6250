/* SPDX-License-Identifier: MIT */
/* Owners that died (docs/RREF.md, "A dead worker, a replaced rank").
 *
 * A UserRRef carries its owner's generation (owner_gen: the wire says it,
 * a remote() user takes the generation its REMOTE_CALL goes to). When the
 * peer-death hook runs for a rank, the generation that died is noted here
 * (ctx.lost); from then on every use of a user of that generation fails at
 * once with -SR_EOWNERLOST naming the owner, and its delete is not sent: the
 * value lived in the dead process only, and the rank's replacement (a new
 * generation, with ids of its own) never had it.
 *
 * On the owner side the dead generation's forks go: every fork it held (a
 * REMOTE_CALL or FORK_REQUEST it sent, an early registration sent to it) is
 * removed from the fork table once the survivors announced the children it
 * had passed on (below), so an OwnerRRef that no live user holds is
 * unregistered, and the leak check at shutdown sees only the live forks. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "error.h"
#include "hooks.h"
#include "rref_internal.h"

bool sr__rref_gone_for_good_locked(uint64_t rid)
{
    struct rref_ctx *c = &sr__rref_ctx;
    int rank = SR_RREF_ID_RANK(rid);
    if (rank == c->rank) /* made here, registered before any fork of it left; or by a predecessor */
        return true;
    const struct sr_rref_lost *l = sr__map_get(&c->lost, (uint64_t)rank);
    return l && SR_RREF_ID_GEN(rid) != (l->floor & 0xffu); /* made by a dead generation: its calls are refused */
}

bool sr__rref_owner_lost_locked(const sr_rref *r)
{
    struct rref_ctx *c = &sr__rref_ctx;
    if (r->is_owner)
        return false;
    if (r->owner == c->rank) /* an earlier generation of this rank owned it */
        return r->owner_gen != c->my_gen;
    const struct sr_rref_lost *l = sr__map_get(&c->lost, r->owner);
    return l && r->owner_gen < l->floor;
}

int sr__rref_check_owner(const sr_rref *r, const char *fn)
{
    /* relaxed: a hint; a death handled after it is seen by the next use, as
     * a call to a peer that dies after it began fails when it is handled */
    if (r->is_owner || (!atomic_load_explicit(&sr__rref_ctx.deaths, memory_order_relaxed) &&
                        r->owner != sr__rref_ctx.rank))
        return 0;
    sr__rref_lock();
    bool lost = sr__rref_live_locked(r) && sr__rref_owner_lost_locked(r);
    sr__rref_unlock();
    return lost ? sr__rref_fail_lost(r, fn) : 0;
}

int sr__rref_fail_lost(const sr_rref *r, const char *fn)
{
    char s[96], how[200] = "";
    sr__rref_lock();
    const struct sr_rref_lost *l = sr__rref_live_locked(r) ? sr__map_get(&sr__rref_ctx.lost, r->owner) : NULL;
    if (l)
        snprintf(how, sizeof(how), "%s", l->how);
    sr__rref_unlock();
    if (!l && !sr__rpc_peer_gone(r->owner, how, sizeof(how)))
        snprintf(how, sizeof(how), "%s died", sr_worker_name(r->owner));
    return sr__fail(-SR_EOWNERLOST, fn, "the owner %s (rank %d, generation %" PRIu32 ") of %s is lost: %s",
                    sr_worker_name(r->owner), r->owner, r->owner_gen, sr_rref_str(r, s, sizeof(s)), how);
}

int sr__rref_lost_note_locked(int rank, uint32_t gen, const char *why)
{
    struct rref_ctx *c = &sr__rref_ctx;
    struct sr_rref_lost *l = sr__map_get(&c->lost, (uint64_t)rank);
    if (!l) {
        if (!(l = calloc(1, sizeof(*l))) || sr__map_put(&c->lost, (uint64_t)rank, l)) {
            free(l);
            return sr__fail(-ENOMEM, "sr_rref", "out of memory to note that worker%d died", rank);
        }
        /* relaxed: a hint for sr__rref_check_owner; the map is read under the lock */
        atomic_fetch_add_explicit(&c->deaths, 1, memory_order_relaxed);
    }
    if (gen + 1 > l->floor)
        l->floor = gen + 1;
    snprintf(l->how, sizeof(l->how), "%s", why);
    return 0;
}

/* An OwnerRRef awaiting the REMOTE_CALL of a remote() that the dead
 * generation made (a use overtook the call): the call never comes now (what
 * the dead sent is refused). Lock held; the first one (borrowed), or NULL. */
static sr_rref *awaiting_of_locked(int rank, uint32_t gen)
{
    size_t pos = 0;
    uint64_t rid;
    void *p;
    while (sr__map_next(&sr__rref_ctx.owners, &pos, &rid, &p))
        if (((sr_rref *)p)->awaiting && SR_RREF_ID_RANK(rid) == rank && SR_RREF_ID_GEN(rid) == (gen & 0xffu))
            return p;
    return NULL;
}

sr_rref *sr__rref_drop_awaiting_locked(int rank, uint32_t gen, struct after *d)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr_rref *r = awaiting_of_locked(rank, gen);
    if (!r)
        return NULL;
    r->awaiting = false;
    c->awaiting--;
    sr_rref_ref(r); /* for the caller, which fails its value outside the lock */
    sr__owner_maybe_erase_locked(r->rref_id, d);
    return r;
}

/* ---- the dead generation's forks on this owner ----------------------------------- *
 *
 * A fork held by the dead process may have been passed on by it, to a
 * worker that has not announced it yet (flow 4: a call still running): the
 * dead fork is what kept the value alive for that child (G2). So the owner
 * drops the dead generation's forks only once every live worker has said
 * (ORPHANS_DONE) that it announced its children of the dead and that the
 * owners acknowledged every fork request it had made until then: those
 * forks are counted before the dead ones go. */

struct sr_rref_drop {
    bool armed;      /* this owner handled the death itself */
    uint32_t left;   /* workers whose ORPHANS_DONE is still awaited */
    uint8_t wait[];  /* [world]: 1 while awaited */
};

static uint64_t death_key(int rank, uint32_t gen) { return (uint64_t)rank << 32 | gen; }

/* The record of (rank, gen), made on first sight (an ORPHANS_DONE may come
 * before this owner handles the death); NULL without memory. */
static struct sr_rref_drop *drop_get_locked(int rank, uint32_t gen)
{
    struct rref_ctx *c = &sr__rref_ctx;
    struct sr_rref_drop *r = sr__map_get(&c->drops, death_key(rank, gen));
    if (r || !(r = calloc(1, sizeof(*r) + (size_t)c->world)))
        return r;
    for (int w = 0; w < c->world; w++) {
        r->wait[w] = w != c->rank && w != rank && !sr__rpc_peer_gone(w, NULL, 0);
        r->left += r->wait[w];
    }
    if (sr__map_put(&c->drops, death_key(rank, gen), r)) {
        free(r);
        return NULL; /* without memory the forks stay until shutdown (sr__rref_drops_run(true)) */
    }
    return r;
}

static void unwait(struct sr_rref_drop *r, int w)
{
    if (r->wait[w]) {
        r->wait[w] = 0;
        r->left--;
    }
}

void sr__rref_death_armed_locked(int rank, uint32_t gen)
{
    struct rref_ctx *c = &sr__rref_ctx;
    struct sr_rref_drop *r = drop_get_locked(rank, gen);
    if (r)
        r->armed = true;
    size_t pos = 0;
    uint64_t k;
    void *p;
    while (sr__map_next(&c->drops, &pos, &k, &p)) /* the dead owes nothing now: its own forks go */
        unwait(p, rank);
}

void sr__rref_orphans_done_locked(int from, int rank, uint32_t gen)
{
    struct sr_rref_drop *r = rank >= 0 && rank < sr__rref_ctx.world ? drop_get_locked(rank, gen) : NULL;
    if (r && from >= 0 && from < sr__rref_ctx.world)
        unwait(r, from);
}

/* One batch of a ready record's forks; false when none is ready. */
static bool drop_batch_locked(struct after *d, bool force)
{
    struct rref_ctx *c = &sr__rref_ctx;
    size_t pos = 0;
    uint64_t k, rids[AFTER_MAX];
    void *p;
    while (sr__map_next(&c->drops, &pos, &k, &p)) {
        struct sr_rref_drop *r = p;
        if (!r->armed || (r->left && !force))
            continue;
        size_t n = sr__forks_drop_holder(&c->forks, (int)(k >> 32), (uint32_t)k, rids, AFTER_MAX - d->nunref);
        for (size_t i = 0; i < n; i++)
            sr__owner_maybe_erase_locked(rids[i], d); /* at most one unref each */
        if (!n)
            free(sr__map_del(&c->drops, k));
        return true;
    }
    return false;
}

void sr__rref_drops_run(bool force)
{
    for (bool more = true; more;) {
        struct after d;
        sr__after_init(&d);
        sr__rref_lock();
        more = sr__rref_ctx.active && sr__rref_ctx.drops.n && drop_batch_locked(&d, force);
        sr__rref_unlock();
        sr__after_run(&d);
    }
}
