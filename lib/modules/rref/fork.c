/* SPDX-License-Identifier: MIT */
/* Forking: what the codec calls when an RRef value is sent and received.
 *
 * Sending (prepareChildFork): every send makes a new fork id, on the sender.
 *   - The sender owns the RRef: it adds the fork to its own fork table at
 *     once (early fork registration) and enters the context, so the value
 *     cannot go while the child is in flight.
 *   - The sender is a user: it keeps itself as the child's parent
 *     (pending child) until the child is accepted (G2), even when the child
 *     goes to the owner ("useful phantom fork id").
 * Receiving (notifyOwnerAndParentOfFork), on worker X, parent P = the fork
 * id's rank, owner O:
 *   X == O == P  an owner sent it to itself: the fork is removed again, and
 *                the OwnerRRef itself comes out;
 *   X == O != P  a user sent it to the owner: the OwnerRRef comes out and
 *                the owner tells P (CHILD_ACCEPT);
 *   X != O == P  the owner sent it: a UserRRef confirmed on arrival;
 *   X != O != P  a user sent it to a user: a pending UserRRef that asks the
 *                owner (FORK_REQUEST); the ACK confirms it and X then tells
 *                P (CHILD_ACCEPT). A function receiving it runs at once.
 *
 * Unannounced users. A user->user fork that arrives in a call's arguments
 * does not ask its owner at once: it is *unannounced* (in ctx.unannounced,
 * noted in the call's state), and the call's end decides:
 *   - its last reference went with the arguments (the usual case: the
 *     function used it and let it go): the owner never hears of it; its
 *     parent is told at once (CHILD_ACCEPT, which rides with the call's
 *     answer), so the owner is not woken at all for such a fork;
 *   - something kept it: call_done, after the answer, sends the
 *     FORK_REQUEST, and it goes on as any pending user.
 * It is announced earlier when someone needs the owner's confirmation
 * (sr_rref_confirmation) or a thread waits for idleness (sr_rref_wait_idle
 * announces all, and no fork is left unannounced while one waits).
 * Safe because the parent's hold (G2) covers the child for as long as the
 * child lives unannounced: the parent's fork is known to the owner, or is
 * itself held by its parent, and so on up to a known one (RREF.md, "the
 * same as Z does not exist at all"); a child that dies unannounced was
 * never counted, so nothing is owed to the owner. Uses that reach the owner
 * meanwhile (a fetch, a fork to the owner, a proxy) are those of any
 * unconfirmed user. Every other decode (a result, a fetched value, a
 * released buffer) announces at once: nothing bounds how long its receiver
 * keeps it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "error.h"
#include "hooks.h"
#include "rref_internal.h"

int sr__rref_sendable(const sr_rref *r, const char *fn)
{
    char s[96];
    /* relaxed: a hint; a delete racing this send is the sender's own race */
    bool live = sr__rref_live(r), deleted = atomic_load_explicit(&((sr_rref *)r)->deleted, memory_order_relaxed);
    if (!live)
        return sr__fail(-SR_ESHUTDOWN, fn, "%s belongs to an RPC round that has shut down",
                        sr_rref_str(r, s, sizeof(s)));
    int rc = sr__rref_check_owner(r, fn);
    if (rc) /* its owner died: the value is gone */
        return rc;
    /* acquire: pairs with the release store in sr__rref_set_create_error */
    int err = atomic_load_explicit(&((sr_rref *)r)->create_err, memory_order_acquire);
    if (err == -EPIPE) /* the owner died before its REMOTE_RET */
        return sr__rref_fail_lost(r, fn);
    if (err)
        return sr__fail(err, fn, "%s", r->create_msg ? r->create_msg : "RRef creation via rpc.remote() failed");
    if (deleted)
        return sr__fail(-EINVAL, fn, "%s has been deleted and cannot be sent", sr_rref_str(r, s, sizeof(s)));
    return 0;
}

/* Register r itself as the OwnerRRef of its id (early fork registration). */
static bool own_record_locked(sr_rref *r)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr_rref *o = sr__map_get(&c->owners, r->rref_id);
    if (o)
        return o == r;
    if (sr__map_put(&c->owners, r->rref_id, r))
        return false;
    sr_rref_ref(r);
    return true;
}

/* Record a user's child sent to `to` (G2): its parent is held until the
 * child is accepted, or the child's worker or the owner dies. Lock held. */
static int child_record_locked(sr_rref *r, uint64_t fid, int to)
{
    struct rref_ctx *c = &sr__rref_ctx;
    if (sr__map_put(&c->child_to, fid, (void *)(uintptr_t)(to + 2)))
        return -ENOMEM;
    if (sr__map_put(&c->children, fid, r)) {
        sr__map_del(&c->child_to, fid);
        return -ENOMEM;
    }
    sr_rref_ref(r); /* G2: the parent lives until the child is accepted */
    return 0;
}

/* A user forked onwards while unannounced asks its owner first. Its parent's
 * hold covers it only while it lives here: if this worker died, the parent
 * would be released (the peer-death hook) while the new child, elsewhere,
 * still waits to be announced, and the owner, never told of this user,
 * could delete the value under it. Lock held; 0 or -ENOMEM. */
static int announce_before_fork_locked(sr_rref *r, struct after *d)
{
    if (!r->unannounced)
        return 0;
    sr_rref_ref(r); /* the pending table's (sr__user_announce_locked); the caller holds one */
    return sr__user_announce_locked(r, d);
}

int sr__rref_fork(sr_rref *r, int to, uint64_t *fork_id)
{
    struct rref_ctx *c = &sr__rref_ctx;
    struct after d;
    sr__after_init(&d);
    enum sr_fork_add res;
    uint64_t fid = sr__rref_new_ids(1);
    if (fid == SR_RREF_NO_ID)
        return -EOVERFLOW;
    int rc = 0;
    char why[256];
    if (!r->is_owner && (sr__rref_check_owner(r, "sr_rref") || sr__rpc_peer_gone(r->owner, why, sizeof(why))))
        return sr__rref_fail_lost(r, "sr_rref"); /* the fork could never be accepted */
    sr__rref_lock();
    if (!sr__rref_live_locked(r))
        rc = sr__fail(-SR_ESHUTDOWN, "sr_rref", "the RRef belongs to an RPC round that has shut down");
    else if (r->is_owner && !own_record_locked(r))
        rc = sr__fail(-ENOMEM, "sr_rref", "cannot register the OwnerRRef for its fork");
    else if (r->is_owner)
        rc = sr__forks_add(&c->forks, r->rref_id, fid, to, sr__rpc_peer_generation(to), &res);
    else if (!(rc = announce_before_fork_locked(r, &d)))
        rc = child_record_locked(r, fid, to);
    if (rc && r->is_owner)
        sr__owner_maybe_erase_locked(r->rref_id, &d);
    sr__rref_unlock();
    sr__after_run(&d);
    if (rc == -SR_EOWNERLOST) /* found lost by its announcement */
        return sr__rref_fail_lost(r, "sr_rref");
    *fork_id = fid;
    /* Checked after the child is recorded: a destination that left before
     * may have had its peer-death hook run already, which would never
     * release this parent (a later death finds the record). */
    if (!rc && to >= 0 && sr__rpc_peer_gone(to, why, sizeof(why))) { /* an owner's early registration too */
        sr__rref_unfork(r, fid);
        return sr__fail(-EPIPE, "sr_rref", "cannot pass on an RRef to worker%d, which is gone: %s", to, why);
    }
    return rc;
}

void sr__rref_unfork(sr_rref *r, uint64_t fid)
{
    struct rref_ctx *c = &sr__rref_ctx;
    struct after d;
    sr__after_init(&d);
    enum sr_fork_del res;
    sr__rref_lock();
    if (sr__rref_live_locked(r) && r->is_owner) {
        sr__forks_del(&c->forks, r->rref_id, fid, 1, true, &res);
        sr__owner_maybe_erase_locked(r->rref_id, &d);
    } else if (sr__rref_live_locked(r) && sr__map_get(&c->children, fid) == r) {
        sr__map_del(&c->children, fid);
        sr__map_del(&c->child_to, fid);
        d.unref[d.nunref++] = r;
        sr__idle_check_locked(&d);
    }
    sr__rref_unlock();
    sr__after_run(&d);
}

int sr__rref_wire_check(uint64_t rid, uint64_t fid, unsigned owner, char *why, size_t len)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr__rref_lock();
    bool active = c->active;
    int world = c->world;
    sr__rref_unlock();
    if (!active)
        snprintf(why, len, "an RRef can only be decoded by an initialised worker");
    else if (owner >= (unsigned)world || SR_RREF_ID_RANK(rid) >= world || SR_RREF_ID_RANK(fid) >= world)
        snprintf(why, len, "RRef (owner %u, rref id %#" PRIx64 ", fork id %#" PRIx64 ") names a rank outside [0, %d)",
                 owner, rid, fid, world);
    else if (fid == rid)
        snprintf(why, len, "RRef fork id %#" PRIx64 " equals its rref id", fid);
    else
        return 0;
    return -EBADMSG;
}

/* X == O: the OwnerRRef (a reference), with what its fork needs done. */
static sr_rref *arrive_at_owner(uint64_t rid, uint64_t fid, struct after *d)
{
    struct rref_ctx *c = &sr__rref_ctx;
    enum sr_fork_del res;
    int parent = SR_RREF_ID_RANK(fid);
    if (parent == c->rank) { /* sent to itself: the early registration is undone */
        sr_rref *r = sr_rref_ref(sr__map_get(&c->owners, rid));
        if (!r)
            return NULL;
        sr__forks_del(&c->forks, rid, fid, 1, true, &res);
        sr__owner_maybe_erase_locked(rid, d);
        return r;
    }
    bool gone = !sr__map_get(&c->owners, rid) && sr__rref_gone_for_good_locked(rid);
    sr_rref *r = gone ? NULL : sr__owner_get_or_create_locked(rid, true);
    if (gone) /* deleted already: the parent's hold is of no use now */
        sr__ctrl_queue_locked(d, parent, SR_RREF_CHILD_ACCEPT, rid, fid, 0);
    if (!r)
        return NULL;
    sr__ctrl_queue_locked(d, parent, SR_RREF_CHILD_ACCEPT, rid, fid, 0);
    return sr_rref_ref(r);
}

/* A user->user fork in a call's arguments waits for the call's end to ask
 * its owner, unless a thread waits for idleness. Lock held; false: ask now. */
static bool arrive_unannounced_locked(sr_rref *r)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr_call *call = sr__call_decoding();
    /* relaxed: ++ under the lock we hold (nudge_owners), so a waiter that
     * came in announced everything and no fork is left unannounced after */
    if (!call || atomic_load_explicit(&c->idle_waiters, memory_order_relaxed))
        return false;
    /* the parent waits for idleness and asked for its children up to this one
     * (an ANNOUNCE that overtook the request carrying it) */
    uintptr_t upto = (uintptr_t)sr__map_get(&c->announce_upto, (uint64_t)SR_RREF_ID_RANK(r->fork_id));
    if (upto && r->fork_id < upto)
        return false;
    if (sr__map_put(&c->unannounced, r->fork_id, r))
        return false;
    if (sr__rref_call_note(call, r->fork_id)) {
        sr__map_del(&c->unannounced, r->fork_id);
        return false;
    }
    r->unannounced = true;
    return true;
}

/* A user of a dead owner generation (lost.c): every use fails, no owner is
 * asked (its rank's new generation never had the value) and the parent, if
 * alive, is released (G2 protects nothing now). Lock held. */
static sr_rref *arrive_lost_locked(sr_rref *r, struct after *d)
{
    atomic_store_explicit(&r->deleted, true, memory_order_relaxed); /* relaxed: not yet shared */
    int parent = SR_RREF_ID_RANK(r->fork_id);
    if (parent == sr__rref_ctx.rank)
        sr__child_accepted_locked(r->fork_id, d);
    else if (parent != r->owner)
        sr__ctrl_queue_locked(d, parent, SR_RREF_CHILD_ACCEPT, r->rref_id, r->fork_id, 0);
    return r;
}

/* X != O: a new UserRRef (one reference for the caller). */
static sr_rref *arrive_at_user(uint64_t rid, uint64_t fid, int owner, uint32_t owner_gen, struct after *d)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr_rref *r = sr__rref_alloc(false, owner, rid, fid);
    if (!r)
        return NULL;
    r->owner_gen = owner_gen;
    if (sr__rref_owner_lost_locked(r)) /* sent before its owner died: lost, nothing to register */
        return arrive_lost_locked(r, d);
    r->registered = true;
    if (SR_RREF_ID_RANK(fid) == owner) { /* from the owner, which registered it already */
        r->adds_sent = 1;
        atomic_store_explicit(&r->confirmed, true, memory_order_relaxed); /* relaxed: not yet shared */
        sr__map_put(&c->users, fid, r);
        return r;
    }
    if (arrive_unannounced_locked(r))
        return r;
    bool listed = (r->confirm = sr_future_new()) && !sr__map_put(&c->pending_users, fid, r);
    if (!listed || sr__ctrl_queue_locked(d, owner, SR_RREF_FORK_REQUEST, rid, fid, 0)) {
        if (listed)
            sr__map_del(&c->pending_users, fid);
        r->registered = false;
        atomic_store_explicit(&r->deleted, true, memory_order_relaxed); /* relaxed: under the lock */
        d->unref[d->nunref++] = r;
        return NULL;
    }
    sr_rref_ref(r); /* the pending table's */
    return r;
}

int sr__rref_from_wire(uint64_t rid, uint64_t fid, unsigned owner, uint32_t owner_gen, sr_rref **out)
{
    struct rref_ctx *c = &sr__rref_ctx;
    struct after d;
    sr__after_init(&d);
    char s[32];
    sr__rref_lock();
    sr_rref *r = !c->active ? NULL
                 : owner == (unsigned)c->rank && owner_gen == c->my_gen ? arrive_at_owner(rid, fid, &d)
                                              : arrive_at_user(rid, fid, (int)owner, owner_gen, &d);
    bool active = c->active;
    bool gone = !r && active && owner == (unsigned)c->rank && owner_gen == c->my_gen &&
                SR_RREF_ID_RANK(fid) != c->rank && sr__rref_gone_for_good_locked(rid);
    sr__rref_unlock();
    sr__after_run(&d);
    if (!r && gone)
        return sr__fail(-EIDRM, "sr_rref", "worker%d: the received RRef %s has been deleted on its owner", c->rank,
                        sr__id_str(rid, s, sizeof(s)));
    if (!r)
        return sr__fail(active ? -ENOMEM : -SR_ESHUTDOWN, "sr_rref",
                        "cannot materialise the received RRef %s (fork %" PRIx64 ")", sr__id_str(rid, s, sizeof(s)),
                        fid);
    *out = r;
    return 0;
}

/* ---- unannounced users --------------------------------------------------------- */

bool sr__rref_ref_live(sr_rref *r)
{
    /* relaxed: pairs with nothing; a count that the acq_rel decrement of
     * sr_rref_unref brought to 0 is never raised again (its destroy runs) */
    uint32_t n = atomic_load_explicit(&r->refs, memory_order_relaxed);
    while (n && !atomic_compare_exchange_weak_explicit(&r->refs, &n, n + 1, memory_order_relaxed,
                                                       memory_order_relaxed))
        ;
    return n != 0;
}

int sr__user_announce_locked(sr_rref *r, struct after *d)
{
    struct rref_ctx *c = &sr__rref_ctx;
    if (sr__rref_owner_lost_locked(r)) { /* its owner died: no one to ask, and its rank's new generation
                                            must not hear of it; it goes as if let go, releasing its parent */
        sr__unannounced_gone_locked(r, d);
        d->unref[d->nunref++] = r;
        return -SR_EOWNERLOST;
    }
    if ((r->confirm || (r->confirm = sr_future_new())) && !sr__map_put(&c->pending_users, r->fork_id, r)) {
        if (!sr__ctrl_queue_locked(d, r->owner, SR_RREF_FORK_REQUEST, r->rref_id, r->fork_id, 0)) {
            sr__map_del(&c->unannounced, r->fork_id);
            r->unannounced = false;
            return 0; /* the reference is the pending table's now */
        }
        sr__map_del(&c->pending_users, r->fork_id);
    }
    d->unref[d->nunref++] = r; /* still unannounced: its parent keeps covering it */
    return sr__fail(-ENOMEM, "sr_rref", "worker%d: out of memory asking the owner worker%d to confirm a fork",
                    c->rank, r->owner);
}

void sr__rref_announce_forks(const uint64_t *fids, size_t n)
{
    struct rref_ctx *c = &sr__rref_ctx;
    for (size_t i = 0; i < n;) {
        struct after d;
        sr__after_init(&d);
        sr__rref_lock();
        for (int k = 0; k < AFTER_MAX / 2 && i < n; i++) { /* each may use two unrefs or sends of d */
            sr_rref *r = c->active ? sr__map_get(&c->unannounced, fids[i]) : NULL;
            if (r && sr__rref_ref_live(r)) { /* else gone with the arguments, or going: no one asks */
                sr__user_announce_locked(r, &d);
                k++;
            }
        }
        sr__rref_unlock();
        sr__after_run(&d);
    }
}

void sr__rref_announce_all(int parent)
{
    struct rref_ctx *c = &sr__rref_ctx;
    for (bool more = true; more;) {
        struct after d;
        sr_rref *got[AFTER_MAX / 2];
        int n = 0;
        size_t pos = 0;
        uint64_t fid;
        void *p;
        sr__after_init(&d);
        sr__rref_lock();
        /* each announcement may use two unrefs or sends of d (a lost owner's) */
        while (c->active && n < AFTER_MAX / 2 && sr__map_next(&c->unannounced, &pos, &fid, &p))
            if ((parent < 0 || SR_RREF_ID_RANK(fid) == parent) && sr__rref_ref_live(p))
                got[n++] = p;
        more = n == AFTER_MAX / 2;
        for (int i = 0; i < n; i++) /* after the walk: announcing edits the map */
            more &= sr__user_announce_locked(got[i], &d) != -ENOMEM; /* no memory: stop, not loop */
        sr__rref_unlock();
        sr__after_run(&d);
    }
}

/* The highest pending child fork id per destination rank (lock held); a
 * rank with none keeps 0. */
static void children_upto_locked(uint64_t *upto, int world)
{
    struct rref_ctx *c = &sr__rref_ctx;
    size_t pos = 0;
    uint64_t fid;
    void *p;
    while (sr__map_next(&c->child_to, &pos, &fid, &p)) {
        int to = (int)(uintptr_t)p - 2;
        if (to >= 0 && to < world && to != c->rank && fid + 1 > upto[to])
            upto[to] = fid + 1;
    }
}

void sr__rref_announce_children(void)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr__rref_lock();
    int world = c->world;
    uint64_t *upto = c->active && c->children.n ? calloc((size_t)world, sizeof(*upto)) : NULL;
    if (upto)
        children_upto_locked(upto, world);
    sr__rref_unlock();
    for (int r = 0; upto && r < world; r++)
        if (upto[r])
            sr__ctrl_announce(r, upto[r] - 1);
    free(upto); /* no memory: the children are announced when their calls end */
}
