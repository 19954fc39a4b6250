/* SPDX-License-Identifier: MIT */
/* Polling the inbox (agent.h): what the token holder reads, a burst at a
 * time, and hands to dispatch; whoever holds the token calls it. */
#include "agent.h"
#include "log.h"
#include "module.h"
#include "thread.h"

/* When the token holder must poll the copying transport again, however
 * idle the rings are (its producers ring no doorbell): -1 never. */
int64_t sr__agent_remote_due(const sr_agent *a)
{
    if (sr_likely(!a->remote) || !a->remote->ops->poll_ns)
        return -1;
    int64_t ns = a->remote->ops->poll_ns(a->remote);
    return ns < 0 ? -1 : sr__now_ns() + ns;
}

/* One burst from the rings, then what fits from the other hosts. */
static unsigned recv_all(sr_agent *a)
{
    unsigned n = a->self->ops->recv_burst(a->self, a->burst, BURST);
    if (a->remote && n < BURST)
        n += a->remote->ops->recv_burst(a->remote, a->burst + n, BURST - n);
    return n;
}

/* One message to whoever handles its type: the callee's side (serve.c),
 * the caller's (calls.c), the shutdown protocol, or a module. */
static void dispatch(sr_agent *a, const sr_msg *m, enum sr_poll_mode mode)
{
    if (!sr__agent_stamp_ok(a, m)) /* another generation's, or its sender's rank is out of range */
        return;
    switch (m->type) {
    case SR_MSG_REQ:
    case SR_MSG_KEEP_CALL:
    case SR_MSG_MOD_REQ:
        sr__serve_request(a, m, mode);
        break;
    case SR_MSG_RESP:
    case SR_MSG_ERR:
    case SR_MSG_KEEP_RET:
        sr__calls_response(a, m);
        break;
    case SR_MSG_CTRL:
        sr__ctrl_dispatch(a, m);
        break;
    default:
        if (!sr__module_msg(a, m))
            sr_logf(SR_LOG_WARN, "dropped a message of unknown type %u from worker%u", m->type, m->src);
    }
}

/* The held messages due (held.c), each dispatched as if it had just
 * arrived. A nested poll may take some of them meanwhile: each is taken
 * off the list before its dispatch. */
static unsigned dispatch_held(sr_agent *a, enum sr_poll_mode mode)
{
    unsigned n = 0;
    sr_msg m;
    while (sr__held_next(a, &m)) {
        dispatch(a, &m, mode);
        n++;
    }
    return n;
}

/* A message from a sender with older messages still held waits behind
 * them, whatever its stamp: its sender's messages are taken in order.
 * Without memory to keep it, it goes now. */
static bool held_before(sr_agent *a, const sr_msg *m)
{
    return sr__held_from(a, m->src) && !sr__held_add(a, m);
}

/* R1 (doorbell.h): ring each destination that this thread's burst sent to
 * quietly, once, after the last of those sends; before the burst's end
 * whenever this thread is about to wait (sr__agent_wait), so that no peer
 * sleeps on a message it was not rung for while we wait for it. */
void sr__burst_ring(sr_agent *a)
{
    for (unsigned i = 0; i < sr__thr.ring_n; i++) {
        sr_tport *t = a->tp[sr__thr.ring_to[i]];
        t->ops->wake->ring_peer(t, sr__thr.ring_to[i]); /* only what has a wake group is noted (send.c) */
    }
    sr__thr.ring_n = 0;
}

/* Consume one burst; the caller holds the token. Returns the count. The
 * burst is the agent's, not this frame's: a callback that waits (a nested
 * wait, agent.h) polls on, and the rest of the burst is what it reads first,
 * so an answer that came in the same burst is never stranded behind it.
 * Sends made while it dispatches two or more messages are batched (agent.h,
 * "Poll bursts"): every destination is rung once, at the end; a burst of
 * one rings as it sends, as a lone call's answer always did. */
unsigned sr__agent_poll_burst(sr_agent *a, enum sr_poll_mode mode)
{
    if (sr_unlikely(a->held != NULL) && a->burst_at == a->burst_n) {
        unsigned n = dispatch_held(a, mode);
        if (n)
            return n;
    }
    if (a->burst_at == a->burst_n) {
        a->burst_at = 0;
        a->burst_n = recv_all(a);
        if (sr_unlikely(!a->burst_n && sr__tport_inbox_bad(a->self)))
            sr__agent_inbox_lost(a);
        if (!a->burst_n) { /* idle (the transport took back the blocks peers released) */
            sr__outq_service(a); /* a full inbox we queue for freed slots: one load when none did */
            return 0;
        }
    }
    unsigned n = 0;
    bool was = sr__thr.batching;
    sr__thr.batching = a->burst_n - a->burst_at > 1;
    while (a->burst_at < a->burst_n) {
        /* Held messages due go first, before the next one is taken from
         * the burst: a nested poll in their dispatch reads the burst on
         * from there, in order. */
        if (sr_unlikely(a->held != NULL)) {
            n += dispatch_held(a, mode);
            if (a->burst_at == a->burst_n)
                break; /* a nested poll read the rest */
        }
        sr_msg m; /* a copy: a nested poll refills the burst */
        sr__msg_copy(&m, &a->burst[a->burst_at++]);
        if (sr_unlikely(a->held != NULL) && held_before(a, &m))
            continue;
        dispatch(a, &m, mode);
        n++;
    }
    if (sr_unlikely(a->held != NULL)) /* one held just now whose return its check took */
        n += dispatch_held(a, mode);
    sr__thr.batching = was;
    sr__burst_ring(a); /* a nested burst rings the outer one's too: its thread may sleep next */
    sr__outq_service(a);
    return n;
}

/* Expire overdue calls; one relaxed load (and a coarse clock read when a
 * deadline exists) on the busy path. Every holder of the token runs it, so
 * calls time out whoever polls (a user thread may hold the inbox while the
 * progress thread sleeps with an older timer). */
void sr__agent_expire_due(sr_agent *a)
{
    int64_t d = atomic_load_explicit(&a->earliest_deadline, memory_order_relaxed); /* relaxed: a hint */
    if (d >= 0 && sr__now_coarse_ns() >= d)
        sr__calls_expire(a, sr__now_ns());
}
