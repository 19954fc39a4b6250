/* Owners that died (docs/RREF.md, "A dead owner, a replaced rank").
 *
 * A UserRRef carries its owner's generation (owner_gen: the wire says it,
 * a remote() user takes the generation its REMOTE_CALL goes to). When the
 * peer-death hook runs for a rank, the generation that died is noted here
 * (ctx.lost); from then on every use of a user of that generation fails at
 * once with -SR_EOWNERLOST naming the owner, and its delete is not sent: the
 * value lived in the dead process only, and the rank's replacement (a new
 * generation, with ids of its own) never had it.
 *
 * On the owner side the dead rank's forks go: every fork it held (a
 * REMOTE_CALL or FORK_REQUEST it sent, an early registration sent to it) is
 * removed from the fork table, so an OwnerRRef that no live user holds is
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

bool sr__rref_drop_holder_locked(int rank, struct after *d)
{
    struct rref_ctx *c = &sr__rref_ctx;
    uint64_t rids[AFTER_MAX];
    size_t n = sr__forks_drop_holder(&c->forks, rank, rids, AFTER_MAX - d->nunref);
    for (size_t i = 0; i < n; i++)
        sr__owner_maybe_erase_locked(rids[i], d); /* at most one unref each */
    return n == 0;
}
