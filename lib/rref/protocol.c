/* RRef control messages: FORK_REQUEST, CHILD_ACCEPT, USER_DELETE and their
 * ACK, with retries.
 *
 * Every control message but the ACK is idempotent and kept in the retry
 * table (token -> message) until its ACK arrives; the progress thread resends
 * overdue ones with exponential backoff (sr__rref_tick). Handlers tolerate
 * duplicates: see forks.h for the owner's side; a duplicate CHILD_ACCEPT finds
 * no pending child, a duplicate ACK no retry entry. A FORK_REQUEST's ACK is
 * also the owner's confirmation of the new user.
 *
 * The retry timer: retry_hint is a lower bound on the earliest retry, read
 * without the lock by the progress thread to size its sleep, written only
 * under the lock. Inserting an entry lowers it only if the entry is due
 * sooner (rare: retries are due a fixed interval after their send, so later
 * entries are due later), and then kicks the progress thread to re-arm its
 * timer. The tick recomputes it. So in steady traffic the progress thread
 * wakes about once per retry interval, not once per message.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "error.h"
#include "hooks.h"
#include "rref_internal.h"

#define RETRY_MAX_NS (1000ll * 1000000)
#define TICK_BATCH 64

struct retry {
    sr_msg m;           /* resent as is */
    int to;
    uint8_t kind;       /* enum sr_rref_ctrl */
    uint32_t sends;     /* copies sent so far */
    int64_t next_ns, interval_ns;
};

/* Lock held. True if the hint moved earlier. */
static bool lower_hint_locked(int64_t t)
{
    struct rref_ctx *c = &sr__rref_ctx;
    /* relaxed: written only under the lock; readers treat it as a hint */
    int64_t h = atomic_load_explicit(&c->retry_hint, memory_order_relaxed);
    if (h >= 0 && h <= t)
        return false;
    atomic_store_explicit(&c->retry_hint, t, memory_order_relaxed);
    return true;
}

static sr_msg ctrl_msg(enum sr_rref_ctrl kind, uint64_t token, uint64_t rid, uint64_t fid, uint64_t extra)
{
    sr_msg m = {.type = SR_MSG_RREF_CTRL};
    struct sr_wire w = {.call_id = token, .ctrl = (uint8_t)kind, .p.args = {rid, fid, extra}};
    sr_wire_put(&m, &w, true);
    return m;
}

int sr__ctrl_queue_locked(struct after *d, int to, enum sr_rref_ctrl kind, uint64_t rid, uint64_t fid,
                          uint64_t extra, bool retry)
{
    struct rref_ctx *c = &sr__rref_ctx;
    uint64_t token = 0;
    struct retry *e = retry ? malloc(sizeof(*e)) : NULL;
    if (e) {
        token = c->next_token++;
        int64_t now = sr_now_coarse_ns(); /* a retry is due tens of ms later: a few ms of error do not matter */
        *e = (struct retry){.to = to, .kind = (uint8_t)kind, .sends = 1, .next_ns = now + c->retry_first_ns,
                            .interval_ns = c->retry_first_ns};
        e->m = ctrl_msg(kind, token, rid, fid, extra);
        if (sr__map_put(&c->retries, token, e)) { /* no memory: sent once, without the safety net */
            free(e);
            e = NULL;
            token = 0;
        } else if (lower_hint_locked(e->next_ns)) {
            d->kick = true;
        }
    }
    d->send[d->nsend].to = to;
    d->send[d->nsend].quiet = false;
    d->send[d->nsend++].m = ctrl_msg(kind, token, rid, fid, extra);
    return 0;
}

/* Counted for graceful shutdown's quiescence waves by the agent; a dead
 * peer's message never arrives, and its retry entry goes with the peer. */
int sr__ctrl_send(int to, sr_msg *m, bool quiet) { return sr__module_send(to, m, quiet); }

/* The ACK of a FORK_REQUEST confirms a user that a function may be waiting
 * on: it wakes its receiver. Other ACKs only cancel a retry, so they go
 * quietly: the receiver reads them when it next polls, and its retry timer
 * polls before it resends (agent.c). This keeps a user that dropped an RRef
 * from being woken for the acknowledgement of its delete. */
static void queue_ack(struct after *d, int to, uint64_t token, bool quiet)
{
    if (!token)
        return; /* sent without a retry entry: nobody waits for the ACK */
    d->send[d->nsend].to = to;
    d->send[d->nsend].quiet = quiet;
    d->send[d->nsend++].m = ctrl_msg(SR_RREF_ACK, token, 0, 0, 0);
}

/* ---- handlers --------------------------------------------------------------------- */

static void on_fork_request(const struct sr_wire *w, int src, struct after *d)
{
    enum sr_fork_add res;
    if (sr__forks_add(&sr__rref_ctx.forks, w->p.args.a, w->p.args.b, &res))
        return; /* no memory: no ACK, so the user asks again later */
    queue_ack(d, src, w->call_id, false);
}

static void on_child_accept(const struct sr_wire *w, int src, struct after *d)
{
    sr_rref *parent = sr__map_del(&sr__rref_ctx.children, w->p.args.b);
    if (parent) /* G2: the child is known to the owner; the parent may go */
        d->unref[d->nunref++] = parent;
    queue_ack(d, src, w->call_id, true);
}

static void on_user_delete(const struct sr_wire *w, int src, struct after *d)
{
    enum sr_fork_del res;
    uint64_t rid = w->p.args.a, extra = w->p.args.c;
    if (sr__forks_del(&sr__rref_ctx.forks, rid, w->p.args.b, (uint32_t)(extra >> 1), extra & 1, &res))
        return; /* no memory for the tombstone: no ACK, the user sends it again */
    sr__owner_maybe_erase_locked(rid, d);
    queue_ack(d, src, w->call_id, true);
}

/* The owner acknowledged a FORK_REQUEST: the user is confirmed, and tells
 * its parent (CHILD_ACCEPT), which may then drop its hold (G2). */
static void finish_fork_request(const struct retry *e, struct after *d)
{
    struct sr_wire w = sr_wire_get(&e->m);
    uint64_t rid = w.p.args.a, fid = w.p.args.b;
    sr_rref *r = sr__map_get(&sr__rref_ctx.pending_users, fid);
    if (!r)
        return;
    r->adds_sent = e->sends;
    sr__ctrl_queue_locked(d, SR_RREF_ID_RANK(fid), SR_RREF_CHILD_ACCEPT, rid, fid, 0, true);
    sr__user_resolve_locked(r, true, d);
}

static void on_ack(const struct sr_wire *w, struct after *d)
{
    struct retry *e = sr__map_del(&sr__rref_ctx.retries, w->call_id);
    if (!e)
        return; /* a duplicate ACK (its message was retried) */
    if (e->kind == SR_RREF_FORK_REQUEST)
        finish_fork_request(e, d);
    free(e);
}

void sr__rref_ctrl(const sr_msg *m)
{
    struct sr_wire w = sr_wire_get(m);
    struct after d;
    sr__after_init(&d);
    sr__rref_lock();
    if (!sr__rref_ctx.active) {
        sr__rref_unlock();
        return;
    }
    switch (w.ctrl) {
    case SR_RREF_FORK_REQUEST: on_fork_request(&w, m->src, &d); break;
    case SR_RREF_CHILD_ACCEPT: on_child_accept(&w, m->src, &d); break;
    case SR_RREF_USER_DELETE: on_user_delete(&w, m->src, &d); break;
    case SR_RREF_ACK: on_ack(&w, &d); break;
    default: fprintf(stderr, "worker%d: dropped an RRef message of unknown kind %u from worker%u\n", sr__rref_ctx.rank, w.ctrl,
                     m->src);
    }
    sr__idle_check_locked(&d);
    sr__rref_unlock();
    sr__after_run(&d);
}

/* ---- retries -------------------------------------------------------------------- */

int64_t sr__rref_next_deadline(void)
{
    /* relaxed: a hint for the progress thread's sleep; the table holds the truth */
    return atomic_load_explicit(&sr__rref_ctx.retry_hint, memory_order_relaxed);
}

/* Copy out up to TICK_BATCH overdue messages and reschedule them. Lock held. */
static int collect_due_locked(int64_t now, sr_msg *out, int *to)
{
    struct rref_ctx *c = &sr__rref_ctx;
    size_t pos = 0;
    uint64_t token;
    void *p;
    int n = 0;
    int64_t next = -1;
    while (sr__map_next(&c->retries, &pos, &token, &p)) {
        struct retry *e = p;
        if (e->next_ns <= now && n < TICK_BATCH) {
            out[n] = e->m;
            to[n++] = e->to;
            e->sends++;
            e->interval_ns = e->interval_ns * 2 < RETRY_MAX_NS ? e->interval_ns * 2 : RETRY_MAX_NS;
            e->next_ns = now + e->interval_ns;
        }
        if (next < 0 || e->next_ns < next)
            next = e->next_ns;
    }
    /* relaxed: written under the lock; see the header comment */
    atomic_store_explicit(&c->retry_hint, next, memory_order_relaxed);
    return n;
}

void sr__rref_tick(void)
{
    int64_t hint = sr__rref_next_deadline(), now;
    if (hint < 0 || (now = sr_now_ns()) < hint) /* the clock only when a retry is pending */
        return;
    sr_msg msgs[TICK_BATCH];
    int to[TICK_BATCH];
    sr__rref_lock();
    int n = sr__rref_ctx.active ? collect_due_locked(now, msgs, to) : 0;
    sr__rref_unlock();
    for (int i = 0; i < n; i++)
        sr__ctrl_send(to[i], &msgs[i], false);
    /* relaxed: statistics */
    atomic_fetch_add_explicit(&sr__rref_ctx.resent, (uint64_t)n, memory_order_relaxed);
}

/* Drop one retry entry bound for rank; false when none is left. */
static bool drop_one_for(int rank)
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
    while (!found && sr__map_next(&c->retries, &pos, &token, &p)) {
        struct retry *e = p;
        if (e->to != rank)
            continue;
        found = true;
        sr__map_del(&c->retries, token);
        struct sr_wire w = sr_wire_get(&e->m);
        sr_rref *r = e->kind == SR_RREF_FORK_REQUEST ? sr__map_get(&c->pending_users, w.p.args.b) : NULL;
        if (r) { /* never confirmed: nothing to delete on a dead owner */
            atomic_store_explicit(&r->deleted, true, memory_order_relaxed); /* relaxed: under the lock */
            failed = sr_rref_ref(r);
            sr__user_resolve_locked(r, false, &d);
        }
        free(e);
    }
    sr__idle_check_locked(&d);
    sr__rref_unlock();
    if (failed && failed->confirm)
        sr_future_set_error(failed->confirm, -EPIPE, "worker%d: the owner worker%d of this RRef died", c->rank, rank);
    sr_rref_unref(failed);
    sr__after_run(&d);
    return found;
}

void sr__rref_peer_died(int rank)
{
    while (drop_one_for(rank))
        ;
}
