/* SPDX-License-Identifier: MIT */
/* Outgoing queues: messages waiting for space in a full inbox (internal).
 *
 * One FIFO per destination rank, so a destination that stops reading delays
 * only the messages for it, never those for another (head-of-line blocking).
 * A message is queued when its destination's inbox is full, or when older
 * messages for that destination are still queued (order per destination is
 * kept best-effort: a sender that saw the queue empty races one that is
 * queueing; nothing in the protocols relies on more, see reorder.h).
 *
 * No timer. A queue waits for an event: when a send finds the inbox full, the
 * queue registers for its space event (the transport's flow->space_arm) and
 * retries once; the ring's consumer, when it frees slots, kicks this worker
 * (space_kick, then its doorbell); whoever polls this worker's inbox sees the
 * kick and calls sr__outq_service, which retries every destination with
 * queued messages. (transport.h, flow, and ring.h, W1/W2, give the
 * handshakes; only a transport with flow ever says full.) A queue
 * whose destination never drains keeps its messages; the calls they carry
 * fail at their deadline (sr__outq_describe adds why). A destination whose
 * inbox turns out corrupt (-EPROTO) or dead (-EPIPE) has its queue dropped
 * and every call to it failed at once.
 *
 * Threads: any thread may queue or flush; one mutex guards the lists. The
 * per-destination `pending` counters are read without it (the send fast
 * path's one relaxed load).
 *
 * Lifetime: sr__outq_init after the transport is attached, sr__outq_fini
 * after the progress thread and the executors have stopped.
 */
#ifndef SR_RPC_OUTQ_H
#define SR_RPC_OUTQ_H

#if !defined(SR__IN_RPC)
#error "outq.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ring.h"

struct sr_agent;
struct sr_outq_msg;

struct sr_outq_dest {
    struct sr_outq_msg *head, *tail; /* under lock */
    struct sr_outq_dest *next_busy;  /* under lock: the list of non-empty queues */
    int64_t since_ns;                /* under lock: when the queue last became non-empty */
    /* Messages queued; written under lock, read without it (relaxed: a hint
     * that routes a send into the queue to keep per-destination order). */
    _Atomic uint32_t pending;
};

typedef struct sr_outq {
    pthread_mutex_t lock;
    struct sr_outq_dest *dests;      /* [world] */
    struct sr_outq_dest *busy;       /* under lock: destinations with queued messages */
    int world;
    /* Fail the calls to `to` (why: how its messages could not be sent):
     * the caller's path's (sr__calls_fail_peer), given at init, so that
     * the queue calls up into the calls through it alone. */
    void (*fail_calls)(struct sr_agent *a, int to, const char *why);
    /* Counters for tests (relaxed: statistics). space_wakes: flushes started
     * by a consumer's space event; full_retries: sends of a queued message
     * that found its inbox still full. */
    _Atomic uint64_t space_wakes, full_retries;
} sr_outq;

int sr__outq_init(struct sr_agent *a, void (*fail_calls)(struct sr_agent *a, int to, const char *why));
void sr__outq_fini(struct sr_agent *a);

/* Does `to` have queued messages (a new one must queue behind them)? */
static inline bool sr__outq_busy(const sr_outq *q, int to)
{
    /* relaxed: a hint, see pending */
    return (unsigned)to < (unsigned)q->world && atomic_load_explicit(&q->dests[to].pending, memory_order_relaxed);
}

/* Queue m for `to` (m->src already stamped) and try to send the queue's head
 * at once. 0, or -errno (-ENOMEM; the send errors of the transport's send other
 * than -EAGAIN when the message could not be queued). */
int sr__outq_push(struct sr_agent *a, int to, const sr_msg *m);

/* On a space kick (sr__tport_space_kicked): take it and retry every queue.
 * One relaxed load when there is none. Calls no user code with the lock held. */
void sr__outq_service(struct sr_agent *a);

/* The peer died: drop what waits for it (its calls fail by the peer watch). */
void sr__outq_drop_peer(struct sr_agent *a, int to);

/* Append to buf why calls to `to` may not have left this worker (its queue),
 * or nothing when its queue is empty. Returns the bytes written. */
size_t sr__outq_describe(struct sr_agent *a, int to, char *buf, size_t n);

#endif
