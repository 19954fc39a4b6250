/* SPDX-License-Identifier: MIT */
/* The RPC layer's per-thread state (internal): every thread-local of the
 * layer, in one place. Each says what a thread of the worker is doing for
 * the layer right now; none is shared, so none needs an ordering. */
#ifndef SR_RPC_THREAD_H
#define SR_RPC_THREAD_H

#if !defined(SR__IN_RPC)
#error "thread.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif

#include <stdbool.h>

struct sr_agent;
struct sr_call;

/* The destinations one poll burst rings at its end; the sends to any more
 * ring as they go (poll.c). */
#define SR_BURST_RINGS 8
struct sr_job_item;

struct sr_rpc_thread {
    /* The agent whose progress thread this is (progress.c; it takes no
     * references: sr__agent_stop joins it), or NULL. */
    struct sr_agent *progress;
    /* This user thread holds the consumer token (wait.c: between user_take
     * and user_release). */
    bool holder;
    /* The agent whose token this thread took ahead of its wait
     * (sr__agent_pretake), or NULL. */
    struct sr_agent *pretaken;
    /* The caller whose answer this thread sends next (-1: none), while
     * finish_call drops the call's arguments (sr__answer_follows). */
    int answer_to;
    /* The call whose arguments this thread is decoding (decode_request). */
    struct sr_call *decoding;
    /* Module jobs a polling thread took (sr__exec_take_jobs, when
     * takes_jobs: an idle or serving waiter, the progress thread's own
     * rounds): run by that thread once it has handed the inbox back; one
     * at a time (exec.c, sr__exec_submit), the others go to the executors. */
    struct sr_job_item *jobs_head, *jobs_tail;
    bool takes_jobs;
    /* The plain calls a poller kept to run itself once it has handed the
     * inbox back (an idle or serving waiter, the progress thread; serve.c,
     * defer): one at a time. */
    struct sr_call *deferred_head, *deferred_tail;
    /* How many served calls this thread runs now, one inside another's
     * wait (serve.c, run_here; agent.h, SR_SERVE_DEPTH_MAX). */
    int serve_depth;
    /* The poll burst this thread dispatches (agent.h, "Poll bursts"): while
     * batching, its sends go quietly, and their destinations wait in
     * ring_to (ring_n of them) for one ring each (poll.c, sr__burst_ring). */
    bool batching;
    unsigned ring_n;
    int ring_to[SR_BURST_RINGS];
};

extern _Thread_local struct sr_rpc_thread sr__thr;

/* This thread is dropping the arguments of a call whose answer to `to` it
 * sends next (serve.c, finish_call): a module message to `to` made
 * meanwhile may go quietly, as the answer's doorbell wakes the caller for
 * both (sr__module_send). */
static inline bool sr__answer_follows(int to) { return to >= 0 && to == sr__thr.answer_to; }

#endif
