/* SPDX-License-Identifier: MIT */
/* Sending (agent.h): through the transport that reaches the peer, with
 * local overflow (outq.c) and the test-only reordering mode (reorder.h);
 * and the kick that tells the progress thread a deadline moved earlier. */
#include <errno.h>

#include "agent.h"
#include "marshal.h"
#include "reorder.h"
#include "thread.h"

int sr__agent_send(sr_agent *a, int to, sr_msg *m)
{
    /* The shutdown control messages are never held: the barrier and the
     * quiescence waves must see the held ones as in flight, not be held too. */
    if (sr_likely(a->reorder == NULL) || m->type == SR_MSG_CTRL || sr__tport_peer_gone(a->tp[to], to))
        return sr__agent_send_now(a, to, m);
    int rc = sr__reorder_hold(a, to, m);
    if (rc > 0) /* the first to go: the progress thread may sleep with a later timer */
        sr__agent_kick(a);
    return rc > 0 ? 0 : rc;
}

/* A deadline moved earlier than the progress thread's armed timer may be.
 * K1: bump timer_gen, then kick the waiter (an eventfd its every sleep
 * reads, whether it sleeps on the doorbell or aside while a user thread
 * holds the inbox). The kick is level-triggered, so it is not lost when the
 * progress thread is between computing its deadline and falling asleep: the
 * sleep then ends at once and the next one arms the new deadline. Kicks are
 * rare (a deadline earlier than every one in flight), so the syscall is
 * made unconditionally. A user thread asleep on the doorbell while holding
 * the token is not kicked: the progress thread, awake for the new deadline,
 * expires the call and so wakes it through its future (holder_sleep). */
void sr__agent_kick(sr_agent *a)
{
    /* release: pairs with K3, so a generation seen means its deadline is seen */
    atomic_fetch_add_explicit(&a->timer_gen, 1, memory_order_release);
    /* K4: pairs with the progress thread's store of progress_away and fence
     * before it hands the token on (progress.c, serve_kept): either we see
     * it away and poke the holder asleep on the doorbell, or the holder,
     * which took the token after that fence, reads the new deadline */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&a->progress_away, memory_order_relaxed)) /* relaxed: ordered by the fence */
        a->wake->poke(a->self);
    else
        a->wake->kick(a->self);
}

int sr__agent_send_quiet(sr_agent *a, int to, sr_msg *m, bool rung_later)
{
    sr__marshal_handoff(m);
    if (a->reorder || sr__outq_busy(&a->outq, to))
        return sr__agent_send(a, to, m);
    sr_tport *t = a->tp[to];
    const struct sr_tport_wake *w = t->ops->wake;
    int rc = !w ? t->ops->send(t, to, m) /* no wake: none to spare */
                : rung_later ? w->send_quiet(t, to, m) : w->send_lazy(t, to, m);
    return rc == -EAGAIN ? sr__agent_send(a, to, m) : rc;
}

/* `to` is rung when this thread's poll burst ends (agent.h, "Poll
 * bursts"): false if the burst has SR_BURST_RINGS others already. */
static bool ring_later(int to)
{
    for (unsigned i = 0; i < sr__thr.ring_n; i++)
        if (sr__thr.ring_to[i] == to)
            return true;
    if (sr__thr.ring_n == SR_BURST_RINGS)
        return false;
    sr__thr.ring_to[sr__thr.ring_n++] = to;
    return true;
}

/* A send from inside a poll burst goes quietly, and its destination is rung
 * once when the burst ends; a transport that wakes nobody (no wake group)
 * sends as usual. */
static int send_in_burst(sr_tport *t, int to, sr_msg *m)
{
    if (t->ops->wake && ring_later(to))
        return t->ops->wake->send_quiet(t, to, m);
    return t->ops->send(t, to, m);
}

int sr__agent_send_now(sr_agent *a, int to, sr_msg *m)
{
    sr__marshal_handoff(m);
    /* Keep this destination's order behind its queued messages (best effort, outq.h). */
    if (sr_likely(!sr__outq_busy(&a->outq, to))) {
        sr_tport *t = a->tp[to];
        int rc = sr__thr.batching ? send_in_burst(t, to, m) : t->ops->send(t, to, m);
        if (rc != -EAGAIN)
            return rc;
    }
    m->src = (uint16_t)a->rank;
    return sr__outq_push(a, to, m);
}

bool sr__agent_shares_heap(const sr_agent *a, int rank)
{
    return rank >= 0 && rank < a->world && !(a->tp[rank]->caps & SR_TPORT_COPIES);
}
