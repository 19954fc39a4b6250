/* SPDX-License-Identifier: MIT */
/* RRef control messages: FORK_REQUEST, CHILD_ACCEPT, USER_DELETE, the ACK
 * that answers the first and the last, and the NUDGE and ANNOUNCE that a
 * thread waiting for idleness sends.
 *
 * Each message is sent exactly once. The rings never lose a message, and a
 * full inbox is the agent's outgoing queue's business (it waits for space),
 * so nothing is ever resent and no timer runs for this layer. What remains
 * of the old retry table is the bookkeeping of messages whose effect this
 * worker must learn about (`unacked`: token -> struct unacked):
 *   - FORK_REQUEST: its ACK confirms the pending user (and, from then on,
 *     the child may accept itself at its parent);
 *   - USER_DELETE: its ACK says the owner applied the delete, which is what
 *     sr_rref_wait_idle (and graceful shutdown) wait for.
 * A CHILD_ACCEPT needs no answer: the parent's own idleness (its pending
 * child, then its delete) already covers what it causes. So one user->user
 * fork that its receiver keeps costs FORK_REQUEST, ACK, CHILD_ACCEPT, and
 * its delete USER_DELETE, ACK; one that a call received and let go costs a
 * CHILD_ACCEPT alone, riding with the call's answer (fork.c, unannounced
 * users). A parent that waits for idleness sends ANNOUNCE to the workers
 * that hold its children, so that they do not wait for their calls' end;
 * like NUDGE, it is not counted (whether it is sent depends on timing).
 *
 * No call waits for any of these messages: a function given a pending user
 * runs at once (use.c). A FORK_REQUEST's ACK wakes its receiver (a
 * confirmation future may wait for it). A USER_DELETE's ACK is only waited
 * for by sr_rref_wait_idle, so it goes quietly — the deleter reads it when
 * it next polls, and a worker that dropped an RRef is not woken for it —
 * unless someone might be waiting:
 *   - a delete queued while a thread is in sr_rref_wait_idle (idle_waiters,
 *     read under the lock) asks for a loud ACK;
 *   - a thread entering sr_rref_wait_idle (idle_waiters++ under the lock,
 *     then a fence N1) sends a NUDGE to the owner of every delete still
 *     unacknowledged; the owner answers a NUDGE loudly (an ACK with token
 *     0) after the ACKs it sent before, so the waiter wakes and finds them;
 *   - a delete that asked for a quiet ACK is followed, once sent, by a
 *     fence N2 and a look at idle_waiters: a waiter that appeared since is
 *     nudged from here too.
 * N1 pairs with N2 (a Dekker handshake): either the deleter sees the waiter
 * and nudges after its delete, or the waiter's NUDGE is queued after the
 * delete (its entry was in the table before the delete was sent). Either
 * way the owner answers the delete before the NUDGE, and the loud answer to
 * the NUDGE reaches the waiter after the quiet ACK. (In the reordering test
 * mode quiet sends are loud, so the order of the two does not matter.)
 *
 * A peer that dies takes its answers with it: the peer-death hook (and a
 * send that finds the peer already dead) drops the entries bound for it and
 * fails a pending user's confirmation with an error naming the dead rank.
 * Handlers stay idempotent (forks.h; a CHILD_ACCEPT with no pending child
 * and an ACK with no entry change nothing), so the reordering test mode and
 * any future duplicate remain harmless.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"
#include "hooks.h"
#include "rref_internal.h"

struct unacked {
    int to;
    uint8_t kind;       /* enum sr_rref_ctrl: FORK_REQUEST or USER_DELETE */
    uint64_t rid, fid;
};

static struct sr_rref_msg ctrl_msg(enum sr_rref_ctrl kind, uint64_t token, uint64_t rid, uint64_t fid,
                                   uint64_t extra)
{
    return (struct sr_rref_msg){.token = token, .kind = (uint8_t)kind, .args = {rid, fid, extra}};
}

/* Under the lock: stamped now with the generation of `to` this worker
 * knows, the one its decision to send was made against. Stamped only at
 * the send, after the lock, a fork request decided for an owner that died
 * meanwhile went to its replacement once that had attached, which took it
 * for a fork of an RRef it never had (rref_death under ASan: "Leaking RRef
 * (0,0) with fork id (0,2)" at the replacement's shutdown). The peer-death
 * hook takes this lock before the rank's next generation becomes
 * reachable, so a decision under it never sees the new generation. */
static void queue_send(struct after *d, int to, struct sr_rref_msg m, bool quiet, bool nudge)
{
    m.to_gen = sr__rpc_peer_generation(to);
    d->send[d->nsend].to = to;
    d->send[d->nsend].quiet = quiet;
    d->send[d->nsend].nudge = nudge;
    d->send[d->nsend++].m = m;
}

int sr__ctrl_queue_locked(struct after *d, int to, enum sr_rref_ctrl kind, uint64_t rid, uint64_t fid,
                          uint64_t extra)
{
    struct rref_ctx *c = &sr__rref_ctx;
    uint64_t token = 0;
    if (kind == SR_RREF_FORK_REQUEST || kind == SR_RREF_USER_DELETE) {
        struct unacked *e = malloc(sizeof(*e));
        if (e)
            *e = (struct unacked){.to = to, .kind = (uint8_t)kind, .rid = rid, .fid = fid};
        if (e && !sr__map_put(&c->unacked, c->next_token, e)) {
            token = c->next_token++;
        } else {
            free(e);
            /* A delete still goes, untracked: applied, only not waited for. A
             * fork request without its entry could never confirm its user. */
            if (kind == SR_RREF_FORK_REQUEST)
                return sr__fail(-ENOMEM, "sr_rref", "worker%d: out of memory tracking a fork request to worker%d",
                                c->rank, to);
        }
    }
    /* relaxed: written under the lock we hold (++) or only lowered (--) */
    bool quiet_ack = kind == SR_RREF_USER_DELETE && token &&
                     !atomic_load_explicit(&c->idle_waiters, memory_order_relaxed);
    queue_send(d, to, ctrl_msg(kind, token, rid, fid, extra | (quiet_ack ? SR_DELETE_QUIET_ACK : 0)), false,
               quiet_ack);
    return 0;
}

/* Counted for graceful shutdown's quiescence waves by the agent; the
 * statistics leave out nudges and their answers (they depend on timing). */
int sr__ctrl_send(int to, const struct sr_rref_msg *m, bool quiet)
{
    const struct sr_rref_msg w = *m; /* stamped (queue_send, ctrl_now): its successor ignores it */
    int rc = sr__module_send(to, sr__rref_module, SR_RREF_MSG_CTRL, &w, sizeof(w), quiet);
    if (!rc && w.kind != SR_RREF_NUDGE && w.kind != SR_RREF_ANNOUNCE && w.kind != SR_RREF_ORPHANS_DONE &&
        (w.kind != SR_RREF_ACK || w.token))
        /* relaxed: statistics */
        atomic_fetch_add_explicit(&sr__rref_ctx.sent, 1, memory_order_relaxed);
    return rc;
}

/* A message sent at once, outside the lock: stamped with the generation of
 * `to` this worker knows now (if it dies before the message is taken, its
 * successor ignores it). */
static void ctrl_now(int to, struct sr_rref_msg m)
{
    m.to_gen = sr__rpc_peer_generation(to);
    sr__ctrl_send(to, &m, false);
}

void sr__ctrl_announce(int to, uint64_t upto)
{
    ctrl_now(to, ctrl_msg(SR_RREF_ANNOUNCE, 0, 0, upto, 0)); /* a dead peer: the peer-death hook releases the children */
}

void sr__ctrl_nudge(int to)
{
    ctrl_now(to, ctrl_msg(SR_RREF_NUDGE, 0, 0, 0, 0)); /* a dead owner: its entries go with it (peer-death hook) */
}

void sr__ctrl_after_send(int to, bool nudge)
{
    if (!nudge)
        return;
    /* N2: pairs with N1 in sr_rref_wait_idle (see the header comment) */
    atomic_thread_fence(memory_order_seq_cst);
    /* relaxed: ordered by N2 */
    if (atomic_load_explicit(&sr__rref_ctx.idle_waiters, memory_order_relaxed))
        sr__ctrl_nudge(to);
}

void sr__unacked_delete_owners_locked(bool *mark, int world)
{
    size_t pos = 0;
    uint64_t token;
    void *p;
    while (sr__map_next(&sr__rref_ctx.unacked, &pos, &token, &p)) {
        struct unacked *e = p;
        if (e->kind == SR_RREF_USER_DELETE && e->to >= 0 && e->to < world)
            mark[e->to] = true;
    }
}

/* err: 0, or the -errno that kept the receiver from applying the message
 * (no memory for a fork or a tombstone): the sender then settles its entry
 * with that error instead of waiting for ever. */
static void queue_ack(struct after *d, int to, uint64_t token, int err, bool quiet)
{
    if (token) /* 0: the sender tracks nothing, so it wants no answer */
        queue_send(d, to, ctrl_msg(SR_RREF_ACK, token, (uint64_t)(int64_t)err, 0, 0), quiet, false);
}

/* ---- handlers --------------------------------------------------------------------- */

/* The request may overtake the REMOTE_CALL that creates the RRef: the
 * OwnerRRef is then created awaiting its value, as a fetch would, so that
 * the user it confirms finds it (a confirmed user's fetch for an unknown
 * RRef is answered "deleted"). */
static void on_fork_request(const struct sr_rref_msg *w, int src, struct after *d)
{
    enum sr_fork_add res;
    uint64_t rid = w->args.a;
    if (!sr__map_get(&sr__rref_ctx.owners, rid) && sr__rref_gone_for_good_locked(rid)) {
        queue_ack(d, src, w->token, -EIDRM, false); /* deleted: its user fails instead of awaiting for ever */
        return;
    }
    int rc = sr__owner_get_or_create_locked(rid, true) ? 0 : -ENOMEM;
    if (!rc)
        rc = sr__forks_add(&sr__rref_ctx.forks, rid, w->args.b, src, sr__rpc_peer_generation(src), &res);
    if (rc)
        sr__owner_maybe_erase_locked(rid, d); /* a record made for nothing goes again */
    queue_ack(d, src, w->token, rc, false);
}

void sr__child_accepted_locked(uint64_t fid, struct after *d)
{
    sr_rref *parent = sr__map_del(&sr__rref_ctx.children, fid);
    sr__map_del(&sr__rref_ctx.child_to, fid);
    if (parent) /* G2: the child is known to the owner, or gone; the parent may go */
        d->unref[d->nunref++] = parent;
}

/* Not acknowledged: the child tracks nothing (see the header comment). */
static void on_child_accept(const struct sr_rref_msg *w, struct after *d)
{
    sr__child_accepted_locked(w->args.b, d);
}

static void on_user_delete(const struct sr_rref_msg *w, int src, struct after *d)
{
    enum sr_fork_del res;
    uint64_t rid = w->args.a, extra = w->args.c;
    int rc = sr__forks_del(&sr__rref_ctx.forks, rid, w->args.b, (uint32_t)(extra >> 2), extra & 1, &res);
    if (!rc)
        sr__owner_maybe_erase_locked(rid, d);
    queue_ack(d, src, w->token, rc, (extra & SR_DELETE_QUIET_ACK) != 0);
}

/* The owner acknowledged a FORK_REQUEST: the user is confirmed, and tells
 * its parent (CHILD_ACCEPT), which may then drop its hold (G2). */
static void finish_fork_request(const struct unacked *e, int err, struct after *d, sr_rref **failed)
{
    sr_rref *r = sr__map_get(&sr__rref_ctx.pending_users, e->fid);
    if (!r)
        return;
    if (err) { /* the owner could not register it: the user fails (its delete would find nothing) */
        atomic_store_explicit(&r->deleted, true, memory_order_relaxed); /* relaxed: under the lock */
        *failed = sr_rref_ref(r);
        sr__user_resolve_locked(r, false, d);
        return;
    }
    r->adds_sent = 1;
    sr__ctrl_queue_locked(d, SR_RREF_ID_RANK(e->fid), SR_RREF_CHILD_ACCEPT, e->rid, e->fid, 0);
    sr__user_resolve_locked(r, true, d);
}

static void on_ack(const struct sr_rref_msg *w, int src, struct after *d, sr_rref **failed)
{
    struct unacked *e = sr__map_del(&sr__rref_ctx.unacked, w->token);
    int err = (int)(int64_t)w->args.a;
    if (!e)
        return; /* a duplicate ACK: nothing waits for it */
    if (e->kind == SR_RREF_FORK_REQUEST)
        finish_fork_request(e, err, d, failed);
    else if (err)
        sr_logf(SR_LOG_WARN, "the owner worker%d could not apply the delete of fork %llx: %s", src, (unsigned long long)e->fid, sr_strerror(err));
    free(e);
}

/* A parent waits for idleness: its children here that are still
 * unannounced ask their owner now, and so do those up to fork id `upto`
 * decoded later (the ANNOUNCE overtook the request that carries them). */
static void on_announce(const struct sr_rref_msg *w, int src)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr__rref_lock();
    uintptr_t was = (uintptr_t)sr__map_get(&c->announce_upto, (uint64_t)src);
    if (c->active && w->args.b + 1 > was) /* no memory: those decoded later wait for their call's end */
        sr__map_put(&c->announce_upto, (uint64_t)src, (void *)(uintptr_t)(w->args.b + 1));
    sr__rref_unlock();
    sr__rref_announce_all(src);
}

void sr__rref_ctrl(int src, uint8_t type, const uint8_t *bytes, size_t len)
{
    (void)type; /* the module has one */
    struct sr_rref_msg w;
    memcpy(&w, bytes, len < sizeof(w) ? len : sizeof(w));
    struct after d;
    sr__after_init(&d);
    sr_rref *failed = NULL;
    if (w.to_gen != sr__rref_ctx.my_gen) /* meant for another generation of this rank (sr__ctrl_send) */
        return;
    if (w.kind == SR_RREF_ANNOUNCE) { /* no answer; its work may need many sends */
        on_announce(&w, src);
        return;
    }
    sr__rref_lock();
    if (!sr__rref_ctx.active) {
        sr__rref_unlock();
        return;
    }
    switch (w.kind) {
    case SR_RREF_FORK_REQUEST: on_fork_request(&w, src, &d); break;
    case SR_RREF_CHILD_ACCEPT: on_child_accept(&w, &d); break;
    case SR_RREF_USER_DELETE: on_user_delete(&w, src, &d); break;
    case SR_RREF_ACK: on_ack(&w, src, &d, &failed); break;
    case SR_RREF_ORPHANS_DONE: sr__rref_orphans_done_locked(src, (int)w.args.a, (uint32_t)w.args.b); break;
    case SR_RREF_NUDGE: /* loudly, after every ACK this worker sent the nudger before */
        queue_send(&d, src, ctrl_msg(SR_RREF_ACK, 0, 0, 0, 0), false, false);
        break;
    default: sr_logf(SR_LOG_WARN, "dropped an RRef message of unknown kind %u from worker%d", w.kind, src);
    }
    sr__idle_check_locked(&d);
    sr__rref_unlock();
    if (failed && failed->confirm)
        sr_future_set_error(failed->confirm, (int)(int64_t)w.args.a,
                            "worker%d: the owner worker%d could not register the fork: %s", sr__rref_ctx.rank, src,
                            sr_strerror((int)(int64_t)w.args.a));
    sr_rref_unref(failed);
    sr__after_run(&d);
    if (w.kind == SR_RREF_ACK)
        sr__rref_orphans_flush(); /* a fork request settled: an ORPHANS_DONE may be owed now */
    else if (w.kind == SR_RREF_ORPHANS_DONE)
        sr__rref_drops_run(false);
}

/* ---- peers that die ----------------------------------------------------------------- */

/* Drop the entry `token` (bound for `rank`, which died): a pending user that
 * asked that owner fails, naming it. Lock held; the confirmation to fail
 * comes back in *failed (a reference). */
static void drop_entry_locked(uint64_t token, struct after *d, sr_rref **failed)
{
    struct rref_ctx *c = &sr__rref_ctx;
    struct unacked *e = sr__map_del(&c->unacked, token);
    sr_rref *r = e && e->kind == SR_RREF_FORK_REQUEST ? sr__map_get(&c->pending_users, e->fid) : NULL;
    if (r) { /* never confirmed: nothing to delete on a dead owner */
        atomic_store_explicit(&r->deleted, true, memory_order_relaxed); /* relaxed: under the lock */
        *failed = sr_rref_ref(r);
        sr__user_resolve_locked(r, false, d);
    }
    free(e);
}

/* why: how the owner left ("worker1 exited with status 0 without
 * sr_shutdown"); NULL: ask the agent. */
static void fail_confirm(sr_rref *r, int rank, const char *why)
{
    char s[96], how[256];
    if (!why && !sr__rpc_peer_gone(rank, how, sizeof(how)))
        snprintf(how, sizeof(how), "worker%d died", rank);
    if (r && r->confirm)
        sr_future_set_error(r->confirm, -SR_EOWNERLOST,
                            "worker%d: the owner %s (rank %d, generation %u) of %s is gone before confirming it: %s",
                            sr__rref_ctx.rank, sr_worker_name(rank), rank, r->owner_gen, sr_rref_str(r, s, sizeof(s)),
                            why ? why : how);
    sr_rref_unref(r);
}

/* Drop one entry bound for rank; false when none is left. */
static bool drop_one_for(int rank, const char *why)
{
    struct rref_ctx *c = &sr__rref_ctx;
    struct after d;
    sr__after_init(&d);
    sr_rref *failed = NULL;
    size_t pos = 0;
    uint64_t token;
    void *p;
    bool found = false;
    sr__rref_lock();
    while (!found && sr__map_next(&c->unacked, &pos, &token, &p))
        if ((found = ((struct unacked *)p)->to == rank))
            drop_entry_locked(token, &d, &failed);
    sr__idle_check_locked(&d);
    sr__rref_unlock();
    fail_confirm(failed, rank, why);
    sr__after_run(&d);
    return found;
}

/* A pending child (G2) whose acceptance needed `rank`: the child went to it,
 * or it owns the RRef (it registers the child, or is the child). Lock held;
 * false when none is left. The first one is remembered, with how the rank
 * left, for the report of sr_rref_wait_idle. */
static bool drop_child_for_locked(int rank, const char *how, struct after *d)
{
    struct rref_ctx *c = &sr__rref_ctx;
    size_t pos = 0;
    uint64_t fid;
    void *p;
    while (sr__map_next(&c->children, &pos, &fid, &p)) {
        sr_rref *parent = p;
        int to = (int)(uintptr_t)sr__map_get(&c->child_to, fid) - 2;
        if (to != rank && parent->owner != rank)
            continue;
        sr__map_del(&c->children, fid);
        sr__map_del(&c->child_to, fid);
        if (c->lost_rank < 0) {
            c->lost_rank = rank;
            c->lost_fid = fid;
            snprintf(c->lost_how, sizeof(c->lost_how), "%s", how);
        }
        d->unref[d->nunref++] = parent; /* G2's reference */
        return true;
    }
    return false;
}

/* Release the parents whose children the dead rank will never accept: its
 * CHILD_ACCEPT (or the owner's confirmation before it) cannot come now, so
 * sr_rref_wait_idle would wait for it for ever. */
static void drop_children_for(int rank, const char *why)
{
    char how[256];
    if (!why && !sr__rpc_peer_gone(rank, how, sizeof(how)))
        snprintf(how, sizeof(how), "worker%d died", rank);
    bool more = true;
    while (more) {
        struct after d;
        sr__after_init(&d);
        sr__rref_lock();
        more = sr__rref_ctx.active && drop_child_for_locked(rank, why ? why : how, &d);
        sr__idle_check_locked(&d);
        sr__rref_unlock();
        sr__after_run(&d);
    }
}

/* The dead generation of rank is lost (lost.c): note it, so every use of its
 * values fails from now on and no delete goes to its successor. */
static void note_lost(int rank, const char *why)
{
    char how[256];
    if (!why && !sr__rpc_peer_gone(rank, how, sizeof(how)))
        snprintf(how, sizeof(how), "worker%d died", rank);
    uint32_t gen = sr__rpc_peer_generation(rank); /* the one that died: its successor is not known yet */
    sr__rref_lock();
    if (sr__rref_ctx.active)
        sr__rref_lost_note_locked(rank, gen, why ? why : how);
    sr__rref_unlock();
}

/* ---- orphans: children of a dead parent (lost.c, "the dead generation's forks") ---- */

void sr__rref_orphans_note_locked(int rank, uint32_t gen)
{
    struct rref_ctx *c = &sr__rref_ctx;
    uint64_t key = (uint64_t)rank << 32 | gen;
    if (sr__map_get(&c->orphans, key) || sr__map_put(&c->orphans, key, (void *)(uintptr_t)c->next_token))
        return; /* without memory no ORPHANS_DONE: the owners drop the dead forks at shutdown */
    /* relaxed: a hint for sr__rref_orphans_flush; the map is read under the lock */
    atomic_fetch_add_explicit(&c->orphans_pending, 1, memory_order_relaxed);
}

/* Up to cap deaths whose orphans' fork requests are all acknowledged, taken
 * out of the table (lock held). */
static size_t orphans_settled_locked(uint64_t *keys, size_t cap)
{
    struct rref_ctx *c = &sr__rref_ctx;
    uint64_t min = UINT64_MAX, k;
    size_t pos = 0, n = 0;
    void *p;
    while (sr__map_next(&c->unacked, &pos, &k, &p))
        if (((struct unacked *)p)->kind == SR_RREF_FORK_REQUEST && k < min)
            min = k;
    for (pos = 0; n < cap && sr__map_next(&c->orphans, &pos, &k, &p);)
        if ((uintptr_t)p <= min)
            keys[n++] = k;
    for (size_t i = 0; i < n; i++)
        sr__map_del(&c->orphans, keys[i]);
    /* relaxed: see sr__rref_orphans_note_locked */
    atomic_fetch_sub_explicit(&c->orphans_pending, (uint32_t)n, memory_order_relaxed);
    return n;
}

void sr__rref_orphans_flush(void)
{
    struct rref_ctx *c = &sr__rref_ctx;
    /* relaxed: a hint; every change of the table is followed by a flush */
    for (size_t n = 4; n == 4 && atomic_load_explicit(&c->orphans_pending, memory_order_relaxed);) {
        uint64_t keys[4];
        sr__rref_lock();
        n = c->active ? orphans_settled_locked(keys, 4) : 0;
        int world = c->world, self = c->rank;
        sr__rref_unlock();
        for (size_t i = 0; i < n; i++)
            for (int w = 0; w < world; w++)
                if (w != self && w != (int)(keys[i] >> 32)) /* a dead one refuses it: nothing to settle */
                    ctrl_now(w, ctrl_msg(SR_RREF_ORPHANS_DONE, 0, keys[i] >> 32, (uint32_t)keys[i], 0));
    }
}

/* Owner side: OwnerRRefs awaiting a REMOTE_CALL the dead generation made
 * fail their waiters (a to_here that overtook the call) instead of waiting
 * for ever, and go once no fork holds them. */
static void drop_awaiting(int rank, const char *why)
{
    uint32_t gen = sr__rpc_peer_generation(rank);
    for (sr_rref *r = (sr_rref *)1; r;) {
        struct after d;
        sr__after_init(&d);
        sr__rref_lock();
        r = sr__rref_ctx.active ? sr__rref_drop_awaiting_locked(rank, gen, &d) : NULL;
        sr__rref_unlock();
        sr__after_run(&d);
        if (r) {
            char s[96];
            sr__rref_owner_fail(r, -EPIPE, "the remote() that was to create %s never arrived: its caller died (%s)",
                                sr_rref_str(r, s, sizeof(s)), why ? why : "");
        }
        sr_rref_unref(r);
    }
}

void sr__rref_peer_died(int rank, const char *why)
{
    uint32_t gen = sr__rpc_peer_generation(rank); /* the one that died: its successor is not known yet */
    note_lost(rank, why);
    drop_awaiting(rank, why);
    while (drop_one_for(rank, why))
        ;
    drop_children_for(rank, why);
    /* its children here that wait for their call's end ask their owners now:
       the dead parent's hold (G2) is gone with it; once every fork request
       made until now is acknowledged, the owners may drop the dead's forks */
    sr__rref_announce_all(rank);
    sr__rref_lock();
    if (sr__rref_ctx.active) {
        sr__rref_death_armed_locked(rank, gen);
        sr__rref_orphans_note_locked(rank, gen);
    }
    sr__rref_unlock();
    sr__rref_orphans_flush();
    sr__rref_drops_run(false);
}

/* A message that could not be sent (its destination is dead, or no memory
 * to queue it): what waits for its answer is settled now, as if the peer
 * had died, so no entry outlives a peer-death hook that already ran. */
void sr__ctrl_unsent(int to, const struct sr_rref_msg *m, int err)
{
    struct sr_rref_msg w = *m;
    struct after d;
    sr__after_init(&d);
    sr_rref *failed = NULL;
    if (err != -EPIPE) /* a dead peer's messages are dropped silently: its death is reported */
        sr_logf(SR_LOG_WARN, "an RRef control message (kind %u) to worker%d could not be sent: %s", w.kind, to,
               sr_last_error());
    if (!w.token || w.kind == SR_RREF_ACK)
        return; /* nothing here waits for it */
    sr__rref_lock();
    if (sr__rref_ctx.active)
        drop_entry_locked(w.token, &d, &failed);
    sr__idle_check_locked(&d);
    sr__rref_unlock();
    fail_confirm(failed, to, NULL);
    sr__after_run(&d);
    sr__rref_orphans_flush();
}
