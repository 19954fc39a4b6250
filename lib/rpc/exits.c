/* SPDX-License-Identifier: MIT */
/* Peer exits (agent.h, sr__agent_check_exits): the departures a transport
 * publishes, handled once each, and our own inbox found corrupt. */
#include <stdio.h>
#include <string.h>

#include "agent.h"
#include "log.h"
#include "module.h"

/* Under gone_lock: claim the peer whose exit was published first among
 * those not handled yet; -1 when none is left. In publication order, so
 * that the worker that left first is the one a failed wait names, not a
 * peer whose own shutdown failed because of it. *busy: another call is
 * still handling one (its return must not be counted as seen before). */
static int claim_gone(sr_agent *a, bool *busy)
{
    int first = -1;
    uint32_t seq = 0;
    *busy = false;
    for (int r = 0; r < a->world; r++)
        if (a->gone[r] == SR_GONE_HANDLING)
            *busy = true;
        else if (r != a->rank && a->gone[r] == SR_GONE_NO && sr__tport_peer_gone(a->tp[r], r)) {
            uint32_t s = a->tp[r]->ops->live->exit_order(a->tp[r], r);
            if (first < 0 || s < seq)
                first = r, seq = s;
        }
    if (first >= 0)
        a->gone[first] = SR_GONE_HANDLING;
    return first;
}

/* Under gone_lock: the ranks whose old generation is handled and whose new
 * one has attached are known again (segment.h, "Replacement in place"):
 * their quiescence slot of that parity starts from zero, then messages
 * stamped with the new generation are taken. */
static sr_future *renew_returns(sr_agent *a)
{
    sr_future *next = sr_future_new(), *back = NULL;
    if (next) { /* without memory the waiters wake at their own deadline */
        back = a->returns;
        a->returns = next;
    }
    return back;
}

static sr_future *rejoin_returned(sr_agent *a, bool *took)
{
    sr_future *back = NULL;
    for (int r = 0; r < a->world; r++) {
        sr_tport *t = a->tp[r];
        if (a->gone[r] != SR_GONE_DONE || !(t->caps & SR_TPORT_REPLACES) || t->ops->live->rejoin(t, r))
            continue;
        unsigned s = t->ops->live->generation(t, r) & 1u;
        /* relaxed (all): see agent.h, quiesce; expect's store is what makes them count */
        atomic_store_explicit(&a->quiesce[r].sent[s], 0, memory_order_relaxed);
        atomic_store_explicit(&a->quiesce[r].done[s], 0, memory_order_relaxed);
        atomic_store_explicit(&a->expect[r], sr__agent_stamp_for(a, r), memory_order_relaxed);
        /* A joiner names itself (segment.h, E4); sr_worker_rank reads the
         * names under this lock. Written only when it differs: other
         * readers (messages about the rank) read it unlocked. */
        if (a->elastic && strncmp(a->names[r], t->ops->name(t, r), sizeof(a->names[r]) - 1)) {
            memcpy(a->names[r], t->ops->name(t, r), sizeof(a->names[r]));
            a->names[r][sizeof(a->names[r]) - 1] = '\0';
        }
        a->gone[r] = SR_GONE_NO;
        *took = true;
        sr_logf(SR_LOG_INFO, "%s (rank %d) is back: generation %u", a->names[r], r,
                t->ops->live->generation(t, r));
        if (!back)
            back = renew_returns(a);
    }
    return back; /* the caller completes it, outside the lock */
}

int64_t sr__agent_generation(sr_agent *a, int rank)
{
    sr__agent_check_exits(a);
    sr_tport *t = a->tp[rank];
    pthread_mutex_lock(&a->gone_lock);
    int64_t g = a->gone[rank] != SR_GONE_NO ? -EPIPE
                : (t->caps & SR_TPORT_REPLACES) ? (int64_t)t->ops->live->generation(t, rank) : 0;
    pthread_mutex_unlock(&a->gone_lock);
    return g;
}

sr_future *sr__agent_await_departure(sr_agent *a, int rank)
{
    sr__agent_check_exits(a);
    pthread_mutex_lock(&a->gone_lock);
    sr_future *f = a->gone[rank] != SR_GONE_NO || !a->returns ? NULL : sr_future_ref(a->returns);
    pthread_mutex_unlock(&a->gone_lock);
    return f;
}

sr_future *sr__agent_await_rank(sr_agent *a, int rank)
{
    sr__agent_check_exits(a);
    pthread_mutex_lock(&a->gone_lock);
    sr_future *f = a->gone[rank] == SR_GONE_NO || !a->returns ? NULL : sr_future_ref(a->returns);
    pthread_mutex_unlock(&a->gone_lock);
    return f;
}

/* Elastic jobs: a leave of ours waiting for r's answer (leave.c) fails
 * its round, and the next round asks those present. Here, not in leave.c:
 * the leave looks at exits, and exits end its rounds, one way each. */
static void leave_round_peer_gone(sr_agent *a, int rank)
{
    pthread_mutex_lock(&a->ctl_lock);
    if (a->leave_fut && a->leave_want && a->leave_want[rank] && !sr_future_done(a->leave_fut))
        sr_future_set_error(a->leave_fut, -EAGAIN, "%s (rank %d) left during the round", a->names[rank], rank);
    pthread_mutex_unlock(&a->ctl_lock);
    a->wake->ring(a->self); /* the leaver may sleep on our doorbell (shutdown.c, sr__ctrl_peer_gone) */
}

/* A peer's process ended. Calls to it fail whatever the reason; a peer
 * that left after a graceful shutdown owes nothing else (the final barrier
 * ordered it after every wait that involved it), so only the others fail
 * the modules' waits and this worker's own shutdown. */
static void peer_gone(sr_agent *a, int r)
{
    char text[256], how[128];
    sr_tport *t = a->tp[r];
    const struct sr_tport_live *l = t->ops->live; /* r's exit was published: the group exists */
    l->gone_text(t, r, text, sizeof(text));
    l->exit_text(t, r, how, sizeof(how));
    bool graceful = l->left_gracefully(t, r);
    sr_logf(SR_LOG_DEBUG, "%s (rank %d) is gone: the worker %s%s", a->names[r], r, how,
            graceful ? " (a graceful exit)" : "; failing the waits that involve it");
    if (a->replaces && !graceful) /* relaxed: see agent.h, expect; what it still sends is refused */
        atomic_store_explicit(&a->expect[r], -1, memory_order_relaxed);
    sr__outq_drop_peer(a, r); /* nothing queued for it can be delivered now */
    sr__calls_fail_peer(a, r, how); /* "RPC to worker2 failed: the worker exited with ..." */
    if (a->elastic) /* a leave of ours waiting for its answer asks those present instead */
        leave_round_peer_gone(a, r);
    if (graceful)
        return;
    sr__modules_peer_died(r, text);
    /* A rank that is replaced comes back for the shutdown (the supervisor
     * replaces none once a worker entered it, and stops the job when it
     * cannot replace one): its death fails no shutdown wait. */
    if (!a->replaces)
        sr__ctrl_peer_gone(a, r, text);
}

/* Our own inbox is corrupt (transport.h, inbox_text): nothing can be read from it again,
 * so no answer, acknowledgement or release sent to us can arrive. Fail at
 * once every wait that needs one, naming this worker and the corruption:
 * the calls in flight, and every later call at its begin (calls.c); the
 * modules' waits on each peer not handled yet, as if it had left (its
 * messages cannot reach us); the shutdown waits. Run once, by the token
 * holder that found it (inbox_failed is handed over with the token). */
void sr__agent_inbox_lost(sr_agent *a)
{
    if (a->inbox_failed)
        return;
    a->inbox_failed = true;
    char corrupt[320], text[400];
    a->self->ops->inbox_text(a->self, corrupt, sizeof(corrupt));
    sr__calls_fail_all(a, corrupt);
    snprintf(text, sizeof(text), "%s can no longer receive messages: %s", a->names[a->rank], corrupt);
    for (int r = 0; r < a->world; r++) {
        pthread_mutex_lock(&a->gone_lock);
        bool mine = r != a->rank && a->gone[r] == SR_GONE_NO;
        if (mine) /* a later exit of r is not handled again (claim_gone), nor a return (rejoin_returned) */
            a->gone[r] = SR_GONE_CUT;
        pthread_mutex_unlock(&a->gone_lock);
        if (mine)
            sr__modules_peer_died(r, text); /* outside the lock, as in peer_gone */
    }
    sr__ctrl_peer_gone(a, a->rank, text);
}

/* Outside gone_lock: complete `back` (its waiters look again) and, when a
 * return was taken, poke our own doorbell: messages its new generation
 * sent before were held (held.c). The poke writes AWAKE whatever the word
 * says and wakes every sleeper on it, so a token holder about to park
 * announces its sleep again with its D2 fence and re-checks the held
 * messages (sr__agent_burst_left); the fence here orders our store of
 * expect before that write (a release fence: one that reads the write
 * and then fences sees the store). A ring would skip a word that reads
 * SLEEPING from before, which a holder re-uses without a fence. Returns
 * are rare: the poke's syscalls cost nothing that matters. */
static void returned(sr_agent *a, sr_future *back, bool took)
{
    if (back) {
        sr_future_set_result(back, NULL);
        sr_future_unref(back);
    }
    if (took) {
        /* seq_cst: pairs with the D2 fence of a holder that reads the poke's AWAKE (wake->park, transport.h) */
        atomic_thread_fence(memory_order_seq_cst);
        a->wake->poke(a->self);
    }
}

void sr__agent_check_exits(sr_agent *a)
{
    for (;;) {
        uint32_t n = sr__tport_exits(a->self); /* seq_cst: pairs with the supervisor's X2 */
        /* relaxed: a hint, confirmed under the lock */
        if (n == atomic_load_explicit(&a->exits_seen, memory_order_relaxed))
            return;
        pthread_mutex_lock(&a->gone_lock);
        bool busy, took = false;
        int r = claim_gone(a, &busy);
        sr_future *back = r < 0 && a->replaces ? rejoin_returned(a, &took) : NULL;
        /* Every exit counted in n is handled (published before X2), unless
         * a death is still being handled (by another thread, or by this one
         * further up: a call made from a callback its peer_gone completes):
         * that one's return may be counted in n too, and its handler, which
         * comes back here, takes it then. */
        if (r < 0 && !busy)
            atomic_store_explicit(&a->exits_seen, n, memory_order_relaxed); /* relaxed: a hint */
        pthread_mutex_unlock(&a->gone_lock);
        returned(a, back, took);
        if (r < 0)
            return;
        peer_gone(a, r); /* outside the lock: it completes futures, whose callbacks may poll */
        pthread_mutex_lock(&a->gone_lock);
        a->gone[r] = SR_GONE_DONE; /* a new generation of it may be known from now on */
        /* Its new generation may have attached while we handled the old
         * one: another thread's scan then found nothing to claim and marked
         * that exit count seen, so no later scan of ours would take the
         * return until some other exit. Take it now. */
        back = a->replaces ? rejoin_returned(a, &took) : NULL;
        if (!back)
            back = renew_returns(a); /* sr_wait_for_departure's waiters look again */
        pthread_mutex_unlock(&a->gone_lock);
        returned(a, back, took);
    }
}
