/* SPDX-License-Identifier: MIT */
/* A worker leaves an elastic job (segment.h, "Elastic jobs"): sr_shutdown
 * with graceful = true, by one worker, without waiting for the others.
 *
 *   1. store LEAVING in our worker line (seq_cst; transport live->closing):
 *      peers start no new call to us from now on (E2);
 *   2. the modules' shutdown_users step (RRefs: wait for pending users and
 *      children, then delete every UserRRef on its owner);
 *   3. rounds with the peers present: each is asked for what it has sent
 *      us and what it has processed of ours (per pair, the quiescence
 *      counters of agent.h); a round succeeds when, for every peer asked,
 *      it sent us no more than we processed and processed all we sent it,
 *      and our own counters did not move during the round;
 *   4. detach as LEFT_JOB (transport live->graceful): peers take us as gone
 *      at once (E3), and their modules fail what depended on us.
 *
 * Why one round suffices. Let t0 and t2 be our reads of our own counters
 * before asking and after the last answer, and t1 the moment a peer P read
 * its counters to answer. Our counters did not move in [t0, t2], so we
 * sent and processed nothing then. P had processed everything we sent
 * (done_P = our sent), so whatever it sends because of our messages was
 * counted before t1 (a request counts as processed after its response was
 * counted as sent) and we processed it (sent_P = our done). A new call
 * from P after t1 is refused at P: P counts it (seq_cst) and then loads our
 * state (seq_cst); our store of LEAVING came before our question, and so
 * before t1, so either P's count is in what it answered or P sees LEAVING
 * and takes it back. No message of P's can be on its way to us once the
 * round succeeded, nor one of ours to P.
 *
 * Our own inbox is one of the pairs: a call this worker made to itself
 * (counted in quiesce[rank] both ways) runs before it goes, and our answer
 * to our own question orders the round after what the inbox held.
 *
 * A peer that leaves or dies during a round fails it with -EAGAIN
 * (exits.c, leave_round_peer_gone): the next round asks the peers present then. A
 * peer that joins after our store of LEAVING sees it before its first call.
 * The rounds run like the shutdown waves (shutdown.c): one after another,
 * while this thread serves the inbox. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "error.h"
#include "module.h"

static void send_ctrl(sr_agent *a, int to, enum sr_ctrl c, uint64_t x, uint64_t y, uint64_t z)
{
    sr_msg m = {.type = SR_MSG_CTRL};
    struct sr_wire w = {.ctrl = (uint8_t)c, .p.args = {x, y, z}};
    sr__wire_put(&m, &w, true);
    sr__agent_send(a, to, &m); /* a peer gone meanwhile fails the round instead */
}

int sr__leave_refuse(sr_agent *a, int to, const char *who)
{
    sr_tport *t = a->tp[to];
    /* the send says how one that is gone left; the caller takes the count back (sr__quiesce_unsent) */
    if (to == a->rank || !(t->caps & SR_TPORT_ELASTIC) || !t->ops->live->leaving(t, to) || t->ops->live->peer_gone(t, to))
        return 0;
    return sr__fail(-EPIPE, who ? who : "sr_rpc", "%s (rank %d) is leaving the job: no call to it may start", a->names[to], to);
}

/* Our counts for peer r: what we sent it and processed from it. seq_cst:
 * read after the answers, against the peers' counts. */
static void own_counts(sr_agent *a, int r, uint64_t *sent, uint64_t *done)
{
    unsigned s = sr__quiesce_slot(a, r);
    *sent = s == 2 ? 0 : atomic_load_explicit(&a->quiesce[r].sent[s], memory_order_seq_cst);
    *done = s == 2 ? 0 : atomic_load_explicit(&a->quiesce[r].done[s], memory_order_seq_cst);
}

static uint64_t own_total(sr_agent *a)
{
    uint64_t sum = 0, s, d;
    for (int r = 0; r < a->world; r++) {
        own_counts(a, r, &s, &d);
        sum += s + d;
    }
    return sum;
}

void sr__leave_report(sr_agent *a, int from, uint64_t round)
{
    if ((unsigned)from >= (unsigned)a->world)
        return; /* stamped by the sender's transport; never index with a bad one */
    uint64_t sent, done;
    own_counts(a, from, &sent, &done); /* seq_cst: after the leaver's store of LEAVING (E2) */
    send_ctrl(a, from, SR_CTRL_LEAVE_RESP, round, sent, done);
}

void sr__leave_answer(sr_agent *a, int from, const uint64_t args[3])
{
    if ((unsigned)from >= (unsigned)a->world || !a->leave_want || args[0] != a->leave_round || !a->leave_want[from] ||
        a->ctl_in[from])
        return;
    a->ctl_in[from] = 1;
    a->leave_sent[from] = args[1];
    a->leave_done[from] = args[2];
    if (--a->leave_pending == 0 && a->leave_fut)
        sr_future_set_result(a->leave_fut, NULL);
}


/* Start a round: ask every peer present, and ourselves (a call to
 * ourselves is drained like any other: the question goes through our own
 * inbox). 0 with *out its future; -ENOMEM. */
static int start_round(sr_agent *a, uint64_t *round, sr_future **out)
{
    sr__agent_check_exits(a); /* after our store of LEAVING: every joiner that could miss it is known */
    sr_future *f = sr_future_new();
    if (!f)
        return sr__fail(-ENOMEM, "sr_shutdown", "out of memory");
    /* gone_lock, then ctl_lock: nothing takes them the other way round
     * (exits.c and shutdown.c take ctl_lock outside gone_lock) */
    pthread_mutex_lock(&a->gone_lock);
    pthread_mutex_lock(&a->ctl_lock);
    uint32_t pending = 0;
    for (int r = 0; r < a->world; r++) { /* ourselves too: what we sent ourselves must run before we go */
        a->leave_want[r] = r == a->rank || a->gone[r] == SR_GONE_NO;
        pending += a->leave_want[r];
        a->ctl_in[r] = 0;
    }
    a->leave_pending = pending;
    *round = ++a->leave_round;
    a->leave_fut = sr_future_ref(f); /* pending >= 1: ourselves */
    pthread_mutex_unlock(&a->ctl_lock);
    pthread_mutex_unlock(&a->gone_lock);
    for (int r = 0; r < a->world; r++)
        if (a->leave_want[r]) /* written above by this thread only; the dispatcher only reads it */
            send_ctrl(a, r, SR_CTRL_LEAVE_REQ, *round, 0, 0);
    *out = f;
    return 0;
}

static void end_round(sr_agent *a, sr_future *f)
{
    pthread_mutex_lock(&a->ctl_lock);
    sr_future_unref(a->leave_fut);
    a->leave_fut = NULL;
    pthread_mutex_unlock(&a->ctl_lock);
    sr_future_unref(f);
}

/* After a complete round: does every peer asked agree with our counts? The
 * first that does not is named in why. */
static bool round_drained(sr_agent *a, char *why, size_t len)
{
    bool ok = true;
    pthread_mutex_lock(&a->ctl_lock);
    for (int r = 0; r < a->world && ok; r++) {
        uint64_t sent, done;
        if (!a->leave_want[r])
            continue;
        own_counts(a, r, &sent, &done);
        ok = a->leave_sent[r] == done && a->leave_done[r] == sent;
        if (!ok)
            snprintf(why, len, "%s (rank %d) had sent %llu messages (%llu processed here) and processed %llu of the "
                     "%llu sent to it", a->names[r], r, (unsigned long long)a->leave_sent[r],
                     (unsigned long long)done, (unsigned long long)a->leave_done[r], (unsigned long long)sent);
    }
    pthread_mutex_unlock(&a->ctl_lock);
    return ok;
}

static int wait_round(sr_agent *a, sr_future *f, int64_t deadline)
{
    bool was = sr__exec_take_jobs(true); /* an idle waiter runs module jobs itself, as in shutdown.c */
    int rc = sr__agent_wait(a, f, deadline, SR_POLL_IDLE, false); /* sr_shutdown's own thread: no reference */
    sr__exec_take_jobs(was);
    return rc ? rc : sr_future_value(f, NULL);
}

/* A round that timed out: who had not answered it (else why keeps the
 * last mismatch of counts). */
static void unanswered(sr_agent *a, char *why, size_t len)
{
    size_t at = 0;
    pthread_mutex_lock(&a->ctl_lock);
    for (int r = 0; r < a->world && at + 16 < len; r++)
        if (a->leave_want[r] && !a->ctl_in[r])
            at += (size_t)snprintf(why + at, len - at, "%s%s (rank %d)", at ? ", " : "no answer from ", a->names[r], r);
    pthread_mutex_unlock(&a->ctl_lock);
}

static int drain(sr_agent *a, int64_t deadline)
{
    char why[400] = "no round completed";
    for (;;) {
        uint64_t round = 0, t0 = own_total(a);
        sr_future *f = NULL;
        int rc = start_round(a, &round, &f);
        if (rc)
            return rc;
        rc = wait_round(a, f, deadline);
        end_round(a, f);
        if (rc == -ETIMEDOUT) {
            unanswered(a, why, sizeof(why));
            return sr__fail(-ETIMEDOUT, "sr_shutdown", "timed out leaving the job (round %llu): %s",
                            (unsigned long long)round, why);
        }
        if (rc == -EAGAIN)
            continue; /* a peer of the round left: ask those present now */
        if (rc)
            return sr__fail(rc, "sr_shutdown", "leaving the job: %s", sr_last_error());
        if (round_drained(a, why, sizeof(why)) && own_total(a) == t0)
            return 0;
    }
}

int sr__leave(sr_agent *a, int64_t deadline)
{
    if (!a->leave_want)
        a->leave_want = calloc((size_t)a->world, 1);
    if (!a->leave_sent)
        a->leave_sent = calloc((size_t)a->world, sizeof(uint64_t));
    if (!a->leave_done)
        a->leave_done = calloc((size_t)a->world, sizeof(uint64_t));
    if (!a->leave_want || !a->leave_sent || !a->leave_done) /* freed with the agent */
        return sr__fail(-ENOMEM, "sr_shutdown", "out of memory");
    a->self->ops->live->closing(a->self); /* E2: LEAVING, before any count is read */
    int rc = sr__modules_shutdown_users(deadline);
    if (!rc)
        rc = drain(a, deadline);
    /* A leave that failed detaches as LEFT or TIMED_OUT: peers take us as
     * gone all the same (E3), and their modules fail what needs us. */
    a->self->ops->live->graceful(a->self, rc);
    return rc;
}
