/* SPDX-License-Identifier: MIT */
/* Graceful shutdown: a barrier, the RRef steps, then quiescence detection
 * (leader: rank 0), the RRef leak check, and a final barrier. The order is
 * the one docs/API.md gives for sr_shutdown (the modules' steps, e.g. RRefs', run through module.h):
 *   barrier; no pending RRef user or child here, then delete every UserRRef
 *   on its owner; barrier (every delete has been sent); quiescence (every
 *   delete has been applied: RRef messages are counted like calls); the leak
 *   check; barrier.
 *
 * Quiescence: every worker counts the user messages it has sent and the ones
 * it has fully processed (a request counts as processed after its response
 * was counted as sent). The counters only grow. The leader collects them in
 * waves; when two consecutive waves give the same totals and sent == done,
 * no user message was in flight or being processed between the two waves,
 * and none can appear later (every worker is inside sr_shutdown, so only
 * functions already running could send, and they would have been counted).
 * This drains fire-and-forget chains, which no local count can see.
 *
 * A peer that leaves without a graceful shutdown (it returned from main
 * without sr_shutdown, shut down with graceful=false, or was killed) can
 * never reach the barrier nor answer a wave: every worker learns of it from
 * the supervisor (segment.h, "Peer exit") and fails its own shutdown waits
 * at once with -EPIPE naming that peer; a wait armed later fails as soon as
 * it is armed. That includes the leader: when rank 0 left, nobody would
 * release a barrier, so there is no re-election; every survivor reports the
 * leader's departure. A peer that left after a graceful shutdown fails
 * nothing: the final barrier orders its departure after every wait here.
 * A peer that came to the shutdown and left after its own timeout did not
 * die: no wait here can complete without it, so every survivor's shutdown
 * times out at once too (-ETIMEDOUT), and the leader names the workers that
 * had not arrived, the cause, rather than the one that gave up waiting.
 * A worker whose own inbox is found corrupt can receive no release nor wave
 * either: its waits fail the same way, with -EPROTO naming it (exits.c,
 * inbox_lost). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "agent.h"
#include "error.h"
#include "log.h"
#include "module.h"

static void send_ctrl(sr_agent *a, int to, enum sr_ctrl c, uint64_t x, uint64_t y, uint64_t z)
{
    sr_msg m = {.type = SR_MSG_CTRL};
    struct sr_wire w = {.ctrl = (uint8_t)c, .p.args = {x, y, z}};
    sr__wire_put(&m, &w, true);
    sr__agent_send(a, to, &m); /* a dead peer fails the wait instead */
}

static void broadcast(sr_agent *a, enum sr_ctrl c, uint64_t x)
{
    for (int r = 0; r < a->world; r++)
        send_ctrl(a, r, c, x, 0, 0);
}

static void complete(sr_future *f)
{
    if (f)
        sr_future_set_result(f, NULL);
}

void sr__ctrl_dispatch(sr_agent *a, const sr_msg *m)
{
    struct sr_wire wire = sr__wire_get(m);
    const struct sr_wire *w = &wire;
    pthread_mutex_lock(&a->ctl_lock);
    switch (w->ctrl) {
    case SR_CTRL_BARRIER: /* leader */
        if (m->src < a->world) /* stamped by the sender's transport; never index with a bad one */
            a->ctl_in[m->src] = 1;
        if (++a->barrier_count == (uint32_t)a->world) {
            a->barrier_count = 0;
            memset(a->ctl_in, 0, (size_t)a->world);
            broadcast(a, SR_CTRL_RELEASE, w->p.args.a);
        }
        break;
    case SR_CTRL_RELEASE:
        complete(a->barrier_fut);
        break;
    case SR_CTRL_COUNT_REQ: {
        uint64_t sent, done;
        sr__quiesce_totals(a, &sent, &done);
        send_ctrl(a, m->src, SR_CTRL_COUNT_RESP, w->p.args.a, sent, done);
        break;
    }
    case SR_CTRL_COUNT_RESP: /* leader */
        if (w->p.args.a == a->wave) {
            if (m->src < a->world)
                a->ctl_in[m->src] = 1;
            a->wave_sent += w->p.args.b;
            a->wave_done += w->p.args.c;
            if (++a->wave_replies == (uint64_t)a->world)
                complete(a->wave_fut);
        }
        break;
    case SR_CTRL_QUIESCENT:
        complete(a->quiescent_fut);
        break;
    case SR_CTRL_LEAVE_REQ: /* a peer leaves an elastic job (leave.c) */
        sr__leave_report(a, m->src, w->p.args.a);
        break;
    case SR_CTRL_LEAVE_RESP:
        sr__leave_answer(a, m->src, (const uint64_t[3]){w->p.args.a, w->p.args.b, w->p.args.c});
        break;
    }
    pthread_mutex_unlock(&a->ctl_lock);
}

static void fail_gone(sr_agent *a, sr_future *f)
{
    if (f && !sr_future_done(f))
        sr_future_set_error(f, a->ctl_gone_err, "%s", a->ctl_gone);
}

/* The peer that left first without a graceful shutdown, by the
 * supervisor's exit order: threads handle departures concurrently (exits.c,
 * sr__agent_check_exits), so the one reported here may have left later. Its
 * exit is published (X1) before that one's, so it is visible now. */
static int first_departure(sr_agent *a, int rank)
{
    uint32_t seq = a->tp[rank]->ops->live->exit_order(a->tp[rank], rank); /* rank's exit was published */
    for (int r = 0; r < a->world; r++) {
        sr_tport *t = a->tp[r];
        if (r != a->rank && r != rank && sr__tport_peer_gone(t, r) && !t->ops->live->left_gracefully(t, r) &&
            t->ops->live->exit_order(t, r) < seq) {
            seq = t->ops->live->exit_order(t, r);
            rank = r;
        }
    }
    return rank;
}

void sr__ctrl_peer_gone(sr_agent *a, int rank, const char *text)
{
    pthread_mutex_lock(&a->ctl_lock);
    if (a->ctl_gone_rank < 0) {
        int first = rank == a->rank ? rank : first_departure(a, rank);
        sr_tport *t = a->tp[first];
        a->ctl_gone_rank = first;
        a->ctl_gone_err = first == a->rank ? -EPROTO : t->ops->live->left_timed_out(t, first) ? -ETIMEDOUT : -EPIPE;
        if (first == rank)
            snprintf(a->ctl_gone, sizeof(a->ctl_gone), "%s", text);
        else
            t->ops->live->gone_text(t, first, a->ctl_gone, sizeof(a->ctl_gone));
    }
    fail_gone(a, a->barrier_fut);
    fail_gone(a, a->wave_fut);
    fail_gone(a, a->quiescent_fut);
    pthread_mutex_unlock(&a->ctl_lock);
    /* The idle waiter of sr_shutdown may sleep on our doorbell while it holds
     * the inbox (wait.c, holder_sleep; with futex_waitv on its future too),
     * and this may run on another thread: its D2 fence pairs with this ring's
     * D3, after the completion. */
    a->wake->ring(a->self);
}

/* Install a fresh future in *slot under ctl_lock (the dispatcher completes
 * it, or a peer's departure fails it). */
static sr_future *arm(sr_agent *a, sr_future **slot)
{
    sr_future *f = sr_future_new();
    if (!f)
        return NULL;
    pthread_mutex_lock(&a->ctl_lock);
    *slot = sr_future_ref(f);
    if (a->ctl_gone_rank >= 0) /* a peer left before this wait began */
        fail_gone(a, f);
    pthread_mutex_unlock(&a->ctl_lock);
    return f;
}

static void disarm(sr_agent *a, sr_future **slot, sr_future *f)
{
    pthread_mutex_lock(&a->ctl_lock);
    sr_future_unref(*slot);
    *slot = NULL;
    pthread_mutex_unlock(&a->ctl_lock);
    sr_future_unref(f);
}

/* A timeout names who was missing: the leader knows who has not arrived
 * (or answered the wave); the others only know that the leader has not
 * released them. gave_up: the wait ended because a peer left after its own
 * timeout (sr__ctrl_peer_gone), which is said too. */
static int timed_out(sr_agent *a, const char *what, bool gave_up)
{
    char list[256] = "", why[sizeof(a->ctl_gone) + 2] = "";
    size_t len = 0;
    int missing = 0;
    pthread_mutex_lock(&a->ctl_lock);
    for (int r = 0; a->rank == 0 && r < a->world; r++)
        if (!a->ctl_in[r] && ++missing && len < sizeof(list) - 16)
            len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s", len ? ", " : "", a->names[r]);
    if (gave_up)
        snprintf(why, sizeof(why), "; %s", a->ctl_gone);
    pthread_mutex_unlock(&a->ctl_lock);
    if (len >= sizeof(list) - 16)
        snprintf(list + len, sizeof(list) - len, ", ...");
    if (missing)
        return sr__fail(-ETIMEDOUT, "sr_shutdown", "timed out waiting for %s: %d worker%s never answered: %s%s", what,
                        missing, missing == 1 ? "" : "s", list, why);
    return sr__fail(-ETIMEDOUT, "sr_shutdown",
                    "timed out waiting for %s (the leader, %s, had not released this worker%s)", what, a->names[0], why);
}

static int await(sr_agent *a, sr_future **slot, sr_future *f, int64_t deadline, const char *what)
{
    sr_logf(SR_LOG_DEBUG, "sr_shutdown: waiting for %s", what);
    bool was = sr__exec_take_jobs(true); /* an idle waiter runs module jobs itself, like plain functions */
    int rc = sr__agent_wait(a, f, deadline, SR_POLL_IDLE, false); /* sr_shutdown's own thread: no reference */
    sr__exec_take_jobs(was);
    bool gave_up = false; /* a peer left after its own timeout (sr__ctrl_peer_gone) */
    if (!rc && (rc = sr_future_value(f, NULL)) < 0 && !(gave_up = rc == -ETIMEDOUT)) /* failed by a departed peer */
        sr__fail(rc, "sr_shutdown", "cannot wait for %s: %s", what, a->ctl_gone);
    disarm(a, slot, f);
    if (rc == -ETIMEDOUT) {
        rc = timed_out(a, what, gave_up);
        sr__log_text(SR_LOG_DEBUG, sr_last_error());
        return rc;
    }
    if (rc)
        sr_logf(SR_LOG_DEBUG, "sr_shutdown: waiting for %s failed (%d)", what, rc);
    return rc;
}

static int barrier(sr_agent *a, int64_t deadline)
{
    sr_future *f = arm(a, &a->barrier_fut);
    if (!f)
        return sr__fail(-ENOMEM, "sr_shutdown", "out of memory");
    send_ctrl(a, 0, SR_CTRL_BARRIER, ++a->barrier_epoch, 0, 0);
    return await(a, &a->barrier_fut, f, deadline, "the other workers to reach shutdown");
}

/* Leader: one wave; returns the totals. */
static int wave(sr_agent *a, int64_t deadline, uint64_t *sent, uint64_t *done)
{
    sr_future *f = arm(a, &a->wave_fut);
    if (!f)
        return sr__fail(-ENOMEM, "sr_shutdown", "out of memory");
    pthread_mutex_lock(&a->ctl_lock);
    a->wave++;
    a->wave_replies = a->wave_sent = a->wave_done = 0;
    memset(a->ctl_in, 0, (size_t)a->world);
    uint64_t id = a->wave;
    pthread_mutex_unlock(&a->ctl_lock);
    broadcast(a, SR_CTRL_COUNT_REQ, id);
    int rc = await(a, &a->wave_fut, f, deadline, "in-flight calls to drain");
    *sent = a->wave_sent;
    *done = a->wave_done;
    if (!rc)
        sr_logf(SR_LOG_DEBUG, "sr_shutdown: wave %" PRIu64 ": %" PRIu64 " messages sent, %" PRIu64 " handled, job-wide",
                id, *sent, *done);
    return rc;
}

static int leader_drain(sr_agent *a, int64_t deadline)
{
    uint64_t s0 = 0, d0 = 1, s1 = 0, d1 = 0;
    for (;;) {
        int rc = wave(a, deadline, &s1, &d1);
        if (rc)
            return rc;
        if (s1 == d1 && s1 == s0 && d1 == d0)
            break;
        s0 = s1;
        d0 = d1;
    }
    sr_logf(SR_LOG_DEBUG, "sr_shutdown: two equal waves: the job is quiescent");
    broadcast(a, SR_CTRL_QUIESCENT, 0);
    return 0;
}

/* The steps, up to and with the final barrier: 0 or its error. *leaks: the
 * leak check's result, with its text in keep. */
static int steps(sr_agent *a, int64_t deadline, int *leaks, char *keep, size_t len)
{
    /* Armed before the barrier: once the barrier releases, our poller may see
     * the leader's QUIESCENT before this thread runs again. */
    sr_future *q = arm(a, &a->quiescent_fut);
    if (!q)
        return sr__fail(-ENOMEM, "sr_shutdown", "out of memory");
    int rc = barrier(a, deadline);
    if (!rc)
        rc = sr__modules_shutdown_users(deadline);
    if (!rc) /* every worker has sent its deletes before the waves count them */
        rc = barrier(a, deadline);
    if (!rc && a->rank == 0)
        rc = leader_drain(a, deadline);
    if (rc) {
        disarm(a, &a->quiescent_fut, q);
        return rc;
    }
    rc = await(a, &a->quiescent_fut, q, deadline, "the leader to declare quiescence");
    if (rc)
        return rc;
    *leaks = sr__modules_shutdown_check();
    snprintf(keep, len, "%s", sr_last_error());
    /* Nobody sends after quiescence but this final barrier, so no worker
     * detaches while a peer still needs its inbox. */
    return barrier(a, deadline);
}

int sr__graceful(sr_agent *a, int64_t deadline)
{
    a->self->ops->live->closing(a->self); /* the home instance has every group */
    int leaks = 0;
    char keep[512];
    int rc = steps(a, deadline, &leaks, keep, sizeof(keep));
    /* Past the final barrier nobody waits for us: peers may take our exit
     * for a graceful one. A timed-out shutdown detaches as TIMED_OUT (we
     * came and gave up: peers time out too, naming who had not arrived),
     * any other failure as LEFT (transport.h, live->graceful). */
    a->self->ops->live->graceful(a->self, rc);
    if (!rc && leaks)
        sr__error_set_text(keep);
    return rc ? rc : leaks;
}

/* The sums a wave reports (agent.h, quiesce). */
void sr__quiesce_totals(sr_agent *a, uint64_t *sent, uint64_t *done)
{
    *sent = *done = 0;
    for (int r = 0; r < a->world; r++) {
        unsigned s = sr__quiesce_slot(a, r);
        if (s == 2)
            continue; /* a rank that is gone: what it was sent and sent is refused or failed */
        /* relaxed (both): the wave argument (two equal waves in a row) */
        *sent += atomic_load_explicit(&a->quiesce[r].sent[s], memory_order_relaxed);
        *done += atomic_load_explicit(&a->quiesce[r].done[s], memory_order_relaxed);
    }
}
