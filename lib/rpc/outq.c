/* SPDX-License-Identifier: MIT */
/* Outgoing queues, one per destination, retried on space events. See outq.h. */
#include "outq.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "error.h"
#include "payload.h"

struct sr_outq_msg {
    struct sr_outq_msg *next;
    sr_msg m;
};

int sr__outq_init(sr_agent *a, void (*fail_calls)(sr_agent *a, int to, const char *why))
{
    sr_outq *q = &a->outq;
    q->dests = calloc((size_t)a->world, sizeof(*q->dests));
    if (!q->dests)
        return sr__fail(-ENOMEM, "sr_init", "no memory for %d outgoing queues", a->world);
    q->world = a->world;
    q->fail_calls = fail_calls;
    pthread_mutex_init(&q->lock, NULL);
    return 0;
}

/* A queued message that will never be sent: let go of what it carries (its
 * tensors' references and RRef forks, then its payload: heap.h, the
 * references a message holds) and take it off the quiescence count of sent
 * messages, so the sums stay balanced. */
static void drop_unsent(sr_agent *a, int to, const sr_msg *m)
{
    if (m->type == SR_MSG_CTRL)
        return;
    sr__msg_release(m);
    /* Counted in the slot of the generation of `to` it was queued for: the
     * one of now, unless that generation is gone (its slot no longer counts) */
    unsigned slot = sr__quiesce_slot(a, to);
    if (slot != 2)
        sr__quiesce_unsent(a, to, slot);
}

static void drop_list(sr_agent *a, int to, struct sr_outq_msg *e)
{
    while (e) {
        struct sr_outq_msg *next = e->next;
        if (a)
            drop_unsent(a, to, &e->m);
        free(e);
        e = next;
    }
}

void sr__outq_fini(sr_agent *a)
{
    sr_outq *q = &a->outq;
    if (!q->dests)
        return;
    for (int r = 0; r < q->world; r++)
        drop_list(NULL, r, q->dests[r].head); /* the job is over: nobody counts them any more */
    free(q->dests);
    q->dests = NULL;
    pthread_mutex_destroy(&q->lock);
}

/* Under lock: take d's messages out (and d off the busy list the caller walks). */
static struct sr_outq_msg *take_all(struct sr_outq_dest *d)
{
    struct sr_outq_msg *e = d->head;
    d->head = d->tail = NULL;
    atomic_store_explicit(&d->pending, 0, memory_order_relaxed); /* relaxed: under lock; see pending */
    return e;
}

/* Under lock: send d's messages in order. armed: the caller has registered
 * for the inbox's space event since its last full send. Returns 0 when the
 * queue is empty; -EAGAIN when the inbox stayed full after registering (the
 * consumer will kick us); else the send's error (the queue is left as is). */
static int drain(sr_agent *a, int to, struct sr_outq_dest *d, bool armed)
{
    sr_outq *q = &a->outq;
    while (d->head) {
        struct sr_outq_msg *e = d->head;
        int rc = a->tp[to]->ops->send(a->tp[to], to, &e->m);
        if (rc == -EAGAIN) {
            atomic_fetch_add_explicit(&q->full_retries, 1, memory_order_relaxed); /* relaxed: statistics */
            if (armed)
                return -EAGAIN;
            a->tp[to]->ops->flow->space_arm(a->tp[to], to); /* W1 (ring.h), then one more try; -EAGAIN: flow */
            armed = true;
            continue;
        }
        if (rc)
            return rc;
        d->head = e->next;
        if (!d->head)
            d->tail = NULL;
        /* relaxed: under lock; see pending */
        atomic_store_explicit(&d->pending, atomic_load_explicit(&d->pending, memory_order_relaxed) - 1,
                              memory_order_relaxed);
        d->since_ns = sr__now_ns();
        free(e);
    }
    return 0;
}

/* Under lock: link d into the busy list. */
static void mark_busy(sr_outq *q, struct sr_outq_dest *d)
{
    d->next_busy = q->busy;
    q->busy = d;
    d->since_ns = sr__now_ns();
}

static void unlink_busy(sr_outq *q, struct sr_outq_dest *d)
{
    for (struct sr_outq_dest **pp = &q->busy; *pp; pp = &(*pp)->next_busy)
        if (*pp == d) {
            *pp = d->next_busy;
            d->next_busy = NULL;
            return;
        }
}

int sr__outq_push(sr_agent *a, int to, const sr_msg *m)
{
    sr_outq *q = &a->outq;
    if ((unsigned)to >= (unsigned)q->world)
        return sr__fail(-EINVAL, "sr_rpc", "destination rank %d is out of range [0, %d)", to, q->world);
    struct sr_outq_msg *e = malloc(sizeof(*e));
    if (!e)
        return sr__fail(-ENOMEM, "sr_rpc", "out of memory queueing a message for %s", a->names[to]);
    e->next = NULL;
    e->m = *m;
    pthread_mutex_lock(&q->lock);
    struct sr_outq_dest *d = &q->dests[to];
    int rc = 0;
    if (d->tail) {
        /* Older messages wait: the head's registration with the ring covers this one. */
        d->tail->next = e;
        d->tail = e;
        /* relaxed: under lock; see pending */
        atomic_store_explicit(&d->pending, atomic_load_explicit(&d->pending, memory_order_relaxed) + 1,
                              memory_order_relaxed);
    } else {
        d->head = d->tail = e;
        atomic_store_explicit(&d->pending, 1, memory_order_relaxed); /* relaxed: under lock; see pending */
        mark_busy(q, d);
        /* Register for the space event before the retry (W1): either the
         * retry finds room, or the consumer will kick us. No doorbell of our
         * own to ring, no timer to arm. */
        if (a->tp[to]->ops->flow) /* without it the send that queued this never said full */
            a->tp[to]->ops->flow->space_arm(a->tp[to], to);
        rc = drain(a, to, d, true);
        if (rc != -EAGAIN) {
            unlink_busy(q, d);
            if (rc) /* only our message was queued: the caller sees the error and owns the message */
                free(take_all(d));
        }
    }
    pthread_mutex_unlock(&q->lock);
    return rc == -EAGAIN ? 0 : rc;
}

/* Fail what was queued for `to`, which can never be sent (rc: -EPROTO a
 * corrupt inbox, -EPIPE a dead peer, or another send error), and the calls
 * to `to`: their requests may be among them. Called without the lock. */
static void give_up(sr_agent *a, int to, int rc, struct sr_outq_msg *list, const char *detail)
{
    drop_list(a, to, list);
    if (rc == -EPIPE)
        return; /* the peer watch fails its calls, with the exit status */
    char why[320];
    snprintf(why, sizeof(why), "cannot be sent to (%s)", detail);
    a->outq.fail_calls(a, to, why);
}

/* Retry every destination with queued messages; give up on those whose
 * sends fail for good. */
static void flush_all(sr_agent *a)
{
    sr_outq *q = &a->outq;
    for (;;) {
        struct sr_outq_msg *lost = NULL;
        int rc = 0, to = -1;
        char detail[256];
        pthread_mutex_lock(&q->lock);
        for (struct sr_outq_dest **pp = &q->busy; *pp;) {
            struct sr_outq_dest *d = *pp;
            to = (int)(d - q->dests);
            rc = drain(a, to, d, false);
            if (rc == -EAGAIN) {
                pp = &d->next_busy;
                continue;
            }
            *pp = d->next_busy;
            d->next_busy = NULL;
            if (rc) {
                snprintf(detail, sizeof(detail), "%s", sr_last_error());
                lost = take_all(d);
                break;
            }
        }
        pthread_mutex_unlock(&q->lock);
        if (!lost)
            return;
        give_up(a, to, rc, lost, detail); /* outside the lock: failing a call runs its callbacks */
    }
}

void sr__outq_service(sr_agent *a)
{
    if (sr_likely(!sr__tport_space_kicked(a->self)) || !a->self->ops->flow->space_take(a->self)) /* kicked: flow */
        return;
    atomic_fetch_add_explicit(&a->outq.space_wakes, 1, memory_order_relaxed); /* relaxed: statistics */
    flush_all(a);
}

void sr__outq_drop_peer(sr_agent *a, int to)
{
    sr_outq *q = &a->outq;
    if ((unsigned)to >= (unsigned)q->world || !sr__outq_busy(q, to))
        return;
    pthread_mutex_lock(&q->lock);
    struct sr_outq_dest *d = &q->dests[to];
    unlink_busy(q, d);
    struct sr_outq_msg *lost = take_all(d);
    pthread_mutex_unlock(&q->lock);
    drop_list(a, to, lost);
}

size_t sr__outq_describe(sr_agent *a, int to, char *buf, size_t n)
{
    sr_outq *q = &a->outq;
    if (!n || !sr__outq_busy(q, to))
        return 0;
    pthread_mutex_lock(&q->lock);
    struct sr_outq_dest *d = &q->dests[to];
    uint32_t queued = atomic_load_explicit(&d->pending, memory_order_relaxed); /* relaxed: under lock */
    double idle_s = d->head ? (double)(sr__now_ns() - d->since_ns) / 1e9 : 0;
    pthread_mutex_unlock(&q->lock);
    if (!queued)
        return 0;
    int len;
    const struct sr_tport_flow *fl = a->tp[to]->ops->flow;
    if (fl && fl->probe(a->tp[to], to) == -EPROTO) /* never drains: say why */
        len = snprintf(buf, n, "; %u message%s for %s still wait on %s, because %s", queued, queued == 1 ? "" : "s",
                       a->names[to], a->names[a->rank], sr_last_error());
    else
        len = snprintf(buf, n, "; the inbox of %s has been full for %.3f s, and %u message%s for it still wait on %s",
                       a->names[to], idle_s, queued, queued == 1 ? "" : "s", a->names[a->rank]);
    return len < 0 ? 0 : (size_t)len < n ? (size_t)len : n - 1;
}
