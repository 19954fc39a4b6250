/* The RPC agent: one per worker process (internal).
 *
 * Threads and the consumer token. Exactly one thread at a time consumes the
 * worker's inbox: the holder of `token`.
 *   PROGRESS      the progress thread polls (or spins).
 *   PARKED        the progress thread sleeps in io_uring on the doorbell; any
 *                 thread may steal the token (CAS PARKED -> USER).
 *   USER          a user thread waiting for a response polls the inbox itself,
 *                 so it sees its response without a thread hop. It set the
 *                 doorbell to AWAKE, so producers make no wake syscall; the
 *                 progress thread's futex wait stays armed (and does not match
 *                 the producers' wakes of a user sleeper, doorbell.h). With
 *                 nothing to poll, the user sleeps on the doorbell word itself
 *                 (SLEEPING_USER) and on its future, in one futex_waitv: the
 *                 response wakes its caller directly.
 *   USER_WAITING  as USER, but the progress thread woke (a timer, a kick or a
 *                 peer's death) and now sleeps aside in its io_uring on those
 *                 alone (sr_waiter_sleep_aside), with no periodic timer: the
 *                 releasing user hands the token over with sr_waiter_kick.
 *   FREE          transient.
 * Releasing a USER token re-announces SLEEPING on the doorbell, fences, and
 * re-checks the inbox (the Dekker handshake of doorbell.h) before handing the
 * token back to the parked progress thread, so no message is stranded.
 * Whoever makes the token PARKED or FREE wakes the idle waiters sleeping on
 * the token word (token_sleepers; agent.c T1/T2), so an idle waiter takes
 * over serving when the token is free, not on a timer.
 *
 * Requests run inline on the polling thread when that cannot delay anything
 * it owes: async functions and scalar built-ins always (they must not
 * block); built-ins given a tensor (they compute) when the poller is idle
 * (sr_shutdown's waits). Plain functions always go to the executor pool: one
 * may make a nested blocking call, which the polling thread could not serve.
 */
#ifndef SR_RPC_AGENT_H
#define SR_RPC_AGENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "future_internal.h"
#include "module.h"
#include "outq.h"
#include "shmrpc/rpc.h"
#include "wire.h"
#include "xport.h"

enum { TOKEN_FREE = 0, TOKEN_PROGRESS = 1, TOKEN_PARKED = 2, TOKEN_USER = 3, TOKEN_USER_WAITING = 4 };

/* Who is polling: decides whether plain functions may run inline. */
enum sr_poll_mode { SR_POLL_NESTED = 0, SR_POLL_IDLE = 1 };

/* A client call in flight. Slots are recycled; the id's high half is a
 * generation, so a late response to a recycled slot is recognised and dropped. */
struct sr_call_slot {
    _Atomic uint32_t gen;     /* odd: in use */
    int32_t to;
    int64_t deadline_ns;      /* < 0: none */
    int64_t timeout_ms;       /* for the error text */
    sr_future *fut;           /* owned while in use */
    int32_t next_free;
};

typedef struct sr_registry sr_registry;

struct sr_reorder; /* test-only delivery mode (reorder.h) */

typedef struct sr_agent {
    sr_xport *x;
    int rank, world;
    char (*names)[128];       /* [world], filled at init */

    _Atomic uint32_t token;   /* see above */
    _Atomic uint32_t want_token; /* user threads waiting to steal: the spinning progress thread parks */
    _Atomic uint32_t token_sleepers; /* idle waiters asleep on the token word (idle_wait_token) */
    _Atomic uint32_t user_polls; /* bumped by every user take: the progress thread stops spinning while users poll */
    _Atomic uint32_t timer_gen;  /* bumped by sr__agent_kick: some deadline moved earlier */
    _Atomic uint32_t armed_gen;  /* written by the progress thread: timer_gen its sleep's deadline saw */
    uint32_t seen_user_polls;    /* progress thread only */
    pthread_t progress;
    _Atomic bool stopping;

    /* client calls */
    pthread_mutex_t slots_lock; /* slot allocation and free list only */
    struct sr_call_slot *slots;
    int32_t nslots, free_head;
    _Atomic int64_t earliest_deadline; /* a lower bound: the progress thread wakes for it */
    _Atomic uint64_t client_active;
    _Atomic uint64_t stray_responses; /* responses dropped: they came from a rank the call did not go to */

    /* executors */
    pthread_mutex_t q_lock;
    pthread_cond_t q_cond;
    struct sr_job_item *q_head, **q_tail;
    bool exec_stopping;       /* under q_lock: executors drain the queue and exit */
    pthread_t *executors;
    int nexec;
    _Atomic uint32_t exec_idle;
    _Atomic uint64_t server_active, server_async;

    /* messages waiting for space in full peer inboxes, per destination (outq.h) */
    sr_outq outq;

    /* quiescence counters: user messages sent, and fully processed */
    _Atomic uint64_t user_sent, user_done;

    /* shutdown coordination (leader = rank 0) */
    pthread_mutex_t ctl_lock;
    uint32_t barrier_epoch, barrier_count;
    sr_future *barrier_fut, *quiescent_fut;
    uint64_t wave, wave_replies, wave_sent, wave_done;
    sr_future *wave_fut;

    sr_registry *reg;
    _Atomic int64_t default_timeout_ms; /* 0: infinite */

    struct sr_reorder *reorder; /* NULL unless SHMRPC_REORDER_SEED is set (tests only) */

    /* Lost wake-ups of a user thread asleep on the doorbell, counted for
     * tests/test_idle_wake.c: doorbell sleeps (user_doorbell_sleep) that
     * slept until their deadline while a message waited in the inbox and the
     * doorbell no longer said SLEEPING_USER. Someone took it away without
     * waking us, so the producer saw AWAKE and rang nobody. (Not exactly zero
     * by construction: a sleep that ends between a producer's exchange and
     * its wake syscall counts too, a window of about a microsecond.) */
    _Atomic uint64_t idle_missed_wakes;
} sr_agent;

/* The process's agent, or NULL before sr_init / after sr_shutdown. */
extern sr_agent *sr__agent;

int sr__agent_start(sr_agent *a);
void sr__agent_stop(sr_agent *a);

/* Send one message, queueing it locally if the peer's inbox is full or older
 * messages for that peer are queued (outq.h; or, in the test-only reordering
 * mode, holding it back for a random delay). */
int sr__agent_send(sr_agent *a, int to, sr_msg *m);
/* Send now, bypassing the reordering mode (it releases held messages here). */
int sr__agent_send_now(sr_agent *a, int to, sr_msg *m);
/* Send without waking the destination (sr_xport_send_quiet): for answers
 * nobody blocks on, read whenever the destination next polls. */
int sr__agent_send_quiet(sr_agent *a, int to, sr_msg *m);
/* Wake the progress thread so that it re-arms its timer (a deadline it does
 * not know about moved earlier). */
void sr__agent_kick(sr_agent *a);

/* Requests (api.c): check a call's arguments and capture its timeout (ms, 0:
 * none), and start one (struct sr_req: module.h). The call completes f. */
int sr__call_check(sr_agent *a, int to, const char *fn, sr_args args, double timeout_s, int64_t *ms);
int sr__rpc_start(sr_agent *a, int to, const struct sr_req *q, const char *fn, sr_args args, int64_t ms,
                  sr_future *f);

/* Wait for f, polling the inbox when this thread can take the token. */
int sr__agent_wait(sr_agent *a, sr_future *f, int64_t deadline_ns, enum sr_poll_mode mode);
/* Take the token before sending a request this thread will wait for, so
 * that the response finds the inbox held (doorbell AWAKE) instead of waking
 * the parked progress thread when the caller is preempted between its send
 * and its wait. The next sr__agent_wait on this thread uses it; every other
 * way out calls sr__agent_unhold (a no-op once a wait used it). */
void sr__agent_pretake(sr_agent *a);
void sr__agent_unhold(sr_agent *a);

/* Calls (calls.c) */
int sr__calls_init(sr_agent *a, int32_t n);
void sr__calls_fini(sr_agent *a);
int sr__call_begin(sr_agent *a, int to, int64_t timeout_ms, sr_future *fut, uint64_t *id);
/* Take the call out of the table; returns its future (owned), or NULL if stale. */
sr_future *sr__call_end(sr_agent *a, uint64_t id);
/* As sr__call_end, for a response that came from rank `from`: NULL (the
 * call stays in flight) if the call was sent to another rank; such a stray
 * response is counted in stray_responses and reported on stderr. */
sr_future *sr__call_answer(sr_agent *a, uint64_t id, int from);
void sr__calls_expire(sr_agent *a, int64_t now_ns);
void sr__calls_fail_peer(sr_agent *a, int rank, const char *why);

/* Dispatch (dispatch.c) */
/* Plain calls an idle poller took: run them on this thread after handing the
 * token back (see start_call). */
bool sr__dispatch_has_deferred(void);
/* Whether module jobs (sr__exec_submit) that this thread's polling starts
 * are kept for this thread instead of the executors: on for threads that
 * only wait (an idle waiter in sr_shutdown, a module waiting for its own
 * request), which run them once they have handed the inbox back. Returns
 * the previous setting. */
bool sr__dispatch_take_jobs(bool on);
void sr__dispatch_run_deferred(void);
void sr__dispatch(sr_agent *a, const sr_msg *m, enum sr_poll_mode mode);
void sr__exec_run_queued(sr_agent *a, struct sr_job_item *it);
int sr__exec_start(sr_agent *a, int n);
void sr__exec_stop(sr_agent *a);

/* Shutdown control (shutdown.c) */
void sr__ctrl_dispatch(sr_agent *a, const sr_msg *m);
int sr__graceful(sr_agent *a, int64_t deadline_ns);

#endif
