/* SPDX-License-Identifier: MIT */
/* The RPC agent: one per worker process (internal).
 *
 * Files, one job each; no two of them call each other both ways:
 *   api.c       the public entry points: init, shutdown, names, sync calls
 *   shutdown.c  the graceful shutdown's barrier and quiescence waves
 *   leave.c     an elastic job's shutdown: one worker leaves, draining pairwise
 *   progress.c  the progress thread; the waits' entry points
 *   wait.c      the consumer token and the waits of user threads
 *   poll.c      reading the inbox and routing each message by type
 *   exits.c     peer exits, our own corrupt inbox
 *   refuse.c, held.c   a message's generation stamps: refused, or held
 *               until its sender's return is taken
 *   serve.c     the callee: decoding, gating, running and answering requests
 *   calls.c     the caller: checking and starting a call, the calls in
 *               flight, their answers
 *   exec.c      the executor pool and the jobs a waiting thread keeps
 *   send.c, outq.c, reorder.c   sending, local overflow, test-only reordering
 *   life.c      the agent's lifetime and references
 *   thread.h    every thread-local of the layer (but the object caches)
 *   objcache.c  per-thread caches of freed futures and call records
 *   modules.c   the module seam's side in the core (module.h)
 *   counters.c  the worker's counters in the segment, the profiler's gauges
 *   leaks.c     the tensors and values still held after sr_shutdown (leaks.h)
 * Where a callee must reach back into its caller it is handed a function
 * (the futures' hooks, the outgoing queues' fail_calls, the reordering
 * pump's send, the deferred calls' retake), never a direct call.
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
 *                 alone (the transport's sleep_aside), with no periodic timer:
 *                 the releasing user hands the token over with a kick.
 *   FREE          nobody polls: transient, or while the progress thread runs
 *                 a plain call and an executor stands in ("The progress
 *                 thread serves"); any thread may take it.
 * Releasing a USER token re-announces SLEEPING on the doorbell, fences, and
 * re-checks the inbox (the Dekker handshake of doorbell.h) before handing the
 * token back to the parked progress thread, so no message is stranded.
 * Whoever makes the token PARKED or FREE wakes the idle waiters sleeping for
 * it (token_freed, token_seq; wait.c T1/T2), so an idle waiter takes over
 * serving when the token is free, not on a timer.
 * The token's states are the agent's (one token covers every transport's
 * inbox); the doorbell side of each step (announcing AWAKE, SLEEPING or
 * SLEEPING_USER, the D2 fence and re-check, the sleeps on segment words,
 * kicks) is the transport's, behind its wake ops (transport.h: hold, park,
 * hold_sleep, sleep, sleep_aside, kick, poke, nudge).
 *
 * Nested waits. Completions run callbacks on the thread that completes the
 * future: for a response, the thread that holds the token. A user callback
 * may block (sr_rpc_sync inside `then`, PyTorch's test_callback_with_ret),
 * and only the blocked thread can read the answer. So a wait on a thread
 * that holds the token polls on instead of sleeping on the future:
 *   - on the progress thread, it runs the progress loop (progress_step) until
 *     the future completes, sleeping on the doorbell without parking the
 *     token: a user that took it would hold it until its own future
 *     completed, which may wait for this callback to return (progress.c,
 *     progress_wait);
 *   - on a user thread that holds the token (USER), it keeps the token and
 *     polls and sleeps on the doorbell (holder_wait), in NESTED mode.
 * The unread rest of a burst belongs to the agent (burst, burst_at), so a
 * nested poll reads it first. A user holder sleeps on its future's word
 * together with the doorbell (futex_waitv); the progress thread, and a user
 * holder without futex_waitv, set the future's POLLER bit before they sleep,
 * and the completer, on any thread, then rings the doorbell and kicks the
 * progress thread (future_internal.h). Every token holder expires due calls
 * and bounds its sleep by the earliest deadline, so timeouts fire whoever
 * polls. Callbacks must not hold a lock a message handler takes.
 *
 * Poll bursts. The token holder reads up to BURST messages at a time
 * (poll.c). While it dispatches a burst of two or more, every send it makes
 * (answers, a callback's new calls, module messages) goes quietly, and each
 * destination's doorbell is rung once when the burst ends (transport.h,
 * send_quiet and ring_peer; doorbell.h R1): one D3 fence and one load of
 * the peer's doorbell line per destination and burst, not per message, and
 * a sleeping peer is woken once for all of them. A burst of one rings as it
 * sends. The thread rings what it owes before any wait of its own
 * (sr__agent_wait: a nested wait in a callback), so no peer sleeps on a
 * message it was not rung for while this thread waits on it, and sends
 * without batching while it waits (only a burst it reads in the wait
 * batches, and rings at its own end); a callback
 * that blocks on anything else (a lock) holds back the rings of the
 * burst's earlier messages until it returns.
 *
 * Lifetime. The agent is published (sr__agent_publish) by sr_init. Every
 * public entry point takes a reference with sr__agent_get(fn), which fails
 * with -SR_ESHUTDOWN naming fn once it is unpublished, and drops it with
 * sr__agent_put; a thread counts its references on a line of its own, with
 * no atomic read-modify-write, and sr_shutdown pays for the ordering with
 * an asymmetric fence (life.c). sr_shutdown, once the executors are stopped, unpublishes
 * the agent, pokes every waiter, and waits until no reference is left;
 * only then does it stop the progress thread and free the agent. A waiter
 * lets go of its reference while it sleeps on a future (sleep_on), so a
 * future that never completes never holds up sr_shutdown; one woken after
 * the agent is gone goes on waiting without it (SR__WAIT_DETACHED). Threads
 * of the runtime take no references: sr_shutdown joins them.
 *
 * Requests run inline on the polling thread when that cannot delay anything
 * it owes: async functions and scalar built-ins always (they must not
 * block); built-ins given a tensor (they compute) when the poller is idle
 * (sr_shutdown's waits). Plain functions go to the executor pool: one may
 * make a nested blocking call, which the polling thread could not serve;
 * except on an idle poller (sr_shutdown, sr_serve_until), a serving
 * waiter, or the progress thread while no user thread serves, which keeps
 * one plain call of a burst and runs it itself once it has handed the token
 * back (serve.c, defer; the progress thread with an executor standing in,
 * "The progress thread serves").
 *
 * Serving waiters (leader/follower). A user thread that waits in
 * sr_future_wait for a future that is not an RPC call's own (a local future
 * that a call completes, a `then`, an aggregate: WAIT mode) and holds the
 * token is the worker's leader: it polls, runs async functions and cheap built-ins
 * inline as any poller does, and keeps one plain call (or a computing
 * built-in given a tensor) of a burst, and the module jobs its polling
 * starts, to run itself, so no executor is woken for them. Before it runs
 * one it hands the token back (user_release: the doorbell re-armed, the
 * progress thread parked on it), so leadership passes to whoever polls
 * next: the progress thread, woken by the next message's doorbell, or
 * another waiter. Its own answer is therefore read, and its future
 * completed, while it runs the call; the wait returns as soon as that call
 * (and the kept jobs before it) has finished, never later, and never takes
 * another call once its future is done. Before the call's answer goes out it
 * takes the token back if it is free (sr__agent_pretake), so the caller's
 * next request finds a poller awake. The call runs as on an executor: grad
 * mode on and every module's thread context (distributed autograd's current
 * context) cleared, then restored (serve.c, run_here). A function run so
 * may wait itself (a nested sr_rpc_sync): that wait serves too, one level
 * deeper, up to SR_SERVE_DEPTH_MAX levels, past which its thread's waits
 * send plain calls to the executors; the waiter below is suspended
 * meanwhile, which is safe because it holds no token and its future is
 * completed by whoever polls. A caller (sr_rpc_sync, or sr_future_wait on
 * the future sr_rpc_async gave: sr__future_is_call) serves no plain call:
 * its answer is due at once, and its thread is the caller's to go on with
 * (a function run there could not finish before the caller's continuation,
 * e.g. a pthread_join of the caller's own thread; test_replace's senders).
 * Nor does a callback that waits while it holds the token (holder_wait:
 * NESTED), a wait on the progress thread, or a module's wait
 * (sr__module_wait: module code may hold its own locks there).
 *
 * The progress thread serves (leader/follower, when no user thread does:
 * none is in a serving wait, serving_waiters).
 * A worker whose threads are all away from the runtime (computing, joined,
 * on a condition variable) is served by its progress thread alone, and a
 * plain call it handed to an executor waited for that executor's wake-up
 * (tens of microseconds on a VM). So its own loop (PROGRESS mode) keeps
 * one plain call of a burst, as a serving waiter does, and runs it itself
 * once an executor stands in for it (progress.c, serve_kept):
 *   1. a stand-in job is queued only if an executor is free to take it at
 *      once (sr__exec_push_now), and only if none is queued and not started
 *      yet: that one takes the latest call's `back` when it starts
 *      (standin_back), so one executor wake-up covers every call that starts
 *      before it runs, not one wake-up per call; with no executor free the
 *      call goes to the executors as before;
 *   2. the progress thread hands the token back (FREE, token_freed) and runs
 *      the call as an executor would (serve.c, sr__dispatch_run_deferred);
 *      before the answer goes out it takes the token back if it is free, so
 *      the caller's next request finds it polling;
 *   3. the stand-in, once awake, polls in NESTED mode while the call runs
 *      (wait.c, sr__agent_stand_in): it takes the token if FREE or PARKED,
 *      sleeps on the doorbell holding it, and otherwise sleeps on `back`
 *      and on the token's hand-back (token_seq), so no message waits for a
 *      function that blocks; it hands the token back when `back` completes;
 *   4. the progress thread completes `back` after the call, then polls
 *      again, sleeping aside until the stand-in hands the token over if it
 *      holds it.
 * A short call is thus answered before the stand-in wakes (which then
 * finds `back` done and returns): the wake is paid off the call's path, and
 * once for a run of short calls (bench_rpc udf, the callee's main thread
 * away: 11-22 us a call before, as a hop to an executor; 1.2-1.8 us). A
 * long one, or one that blocks until a later call runs, is covered by the
 * stand-in, as an executor's would be by the progress thread.
 * The stand-by (progress.c, serve_kept_standby) replaces steps 1-3 (but
 * under the reordering mode, which keeps the stand-in jobs tested, and
 * with other hosts to poll): a thread of its own
 * (shmrpc-standby, started at the first such call) sleeps on the doorbell
 * for the bit only a ring made while the progress thread is away carries
 * (shm/doorbell.h: SLEEPING_STANDBY, AWAKE_STANDBY). The progress thread
 * publishes the call's `back` (away_back), then hands the inbox over as a
 * parking holder would, but with park_away, so the next message wakes the
 * stand-by instead of the thread that cannot poll (messages that came
 * first: it pokes the stand-by to read them, and never polls itself while
 * away, since a callback's wait would hand the token over under the frame
 * that polls); every holder that hands the token back meanwhile does the
 * same (away_standby), and a kick pokes the stand-by. Timers: the stand-by
 * sleeps until the earliest one still ahead when it went to sleep
 * (standby_armed), and the hand-over pokes it if one is due earlier (a
 * deadline set while the progress thread polled, which kicked only that
 * thread); due while the progress thread is away, it stands in. Once
 * woken, the stand-by is a stand-in for that call (step 3). Nothing is
 * woken for a call during which nothing arrives: the stand-in jobs'
 * wake-ups had kept a third thread runnable on two cores,
 * so the spin gate forbade spinning, the progress thread slept between
 * calls, and every call paid the caller's wake syscall (1.2-1.8 us a call;
 * with the stand-by, as when the main thread serves: 0.4 us here, no wake).
 * After the call the progress thread takes the token back if it can and
 * ends the hand-over (away_end); away_back is cleared before `back`
 * completes, so a stand-by that finds a ring and no call away clears the
 * ring (standby_settle, under standin_lock, which the progress thread takes
 * before it parks away). A wait inside
 * the call (a nested sr_rpc_sync) runs the progress loop as any wait on the
 * progress thread (NESTED); since the call began without the token, the
 * wait does not insist on taking it back at its end, and hands it back
 * (FREE) if it took it (progress_away), so the stand-in can poll while the
 * function goes on. What only the progress thread did is done by whoever
 * holds the token meanwhile: every holder expires due calls, sees
 * departures, pumps held messages (the reordering mode) and bounds its
 * sleep by their deadlines; and a kick (an earlier deadline, a message
 * held) pokes the doorbell while the progress thread is away, so a holder
 * asleep on it re-arms (sr__agent_kick, K4). Only where a holder can sleep
 * on the doorbell (SR_TPORT_HOLD_SLEEP): with the eventfd doorbell a
 * stand-in could not be woken by a message.
 * Module jobs that the loop's rounds start (a backward pass's hops through
 * this worker) are kept the same way while the stand-by can cover (not
 * under the reordering mode, nor with other hosts to poll): one at a time,
 * as every thread that keeps jobs does (exec.c, sr__exec_submit), run by
 * serve_kept as a kept call is, with no executor woken for each
 * (bench_dist_autograd, callees away: the seed-002 step 19-25 us before,
 * 9 us as with callees in sr_shutdown).
 */
#ifndef SR_RPC_AGENT_H
#define SR_RPC_AGENT_H

#if !defined(SR__IN_RPC)
#error "agent.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "future_internal.h"
#include "module.h"
#include "outq.h"
#include "shmrpc/rpc.h"
#include "transport.h"
#include "clock.h" /* sr__now_ns, sr__now_coarse_ns */
#include "lock.h" /* sr__lock: slots_lock */
#include "segment.h" /* struct sr_worker_counters */
#include "wire.h"

enum { TOKEN_FREE = 0, TOKEN_PROGRESS = 1, TOKEN_PARKED = 2, TOKEN_USER = 3, TOKEN_USER_WAITING = 4 };

/* Who is polling: decides where plain functions run (serve.c, start_call).
 * NESTED: a wait on the progress thread (a callback's), a callback that
 * waits while it holds the token, a module's wait, the stand-in: plain
 * functions go to the executors. IDLE: sr_shutdown, sr_serve_until. WAIT: a
 * user thread waiting in sr_future_wait for a future that is not a call's
 * ("Serving waiters"). PROGRESS: the progress thread's own loop, which
 * keeps one plain call of a burst when an executor can stand in for it
 * ("The progress thread serves"). */
enum sr_poll_mode { SR_POLL_NESTED = 0, SR_POLL_IDLE = 1, SR_POLL_WAIT = 2, SR_POLL_PROGRESS = 3 };
/* How deep a waiting thread stacks calls it serves (a function run on a
 * waiting thread that waits, and serves the next...): past it, that
 * thread's waits poll in NESTED mode. */
#define SR_SERVE_DEPTH_MAX 4
/* A peer's departure (agent.gone): handled once; a rank whose new
 * generation attached is known again only once its old one's is done.
 * CUT: our own inbox is lost (sr__agent_inbox_lost): neither again. */
enum sr_gone { SR_GONE_NO = 0, SR_GONE_HANDLING = 1, SR_GONE_DONE = 2, SR_GONE_CUT = 3 };

/* A client call in flight. Slots are recycled; the id's high half is a
 * generation, so a late response to a recycled slot is recognised and dropped.
 * Every field is written under slots_lock (calls.c). */
struct sr_call_slot {
    _Atomic uint32_t gen;     /* odd: in use */
    int32_t to;
    int64_t timeout_ms;       /* for the error text */
    sr_future *fut;           /* owned while in use */
    int32_t next_free;
    int32_t heap_at;          /* position in the deadline heap; -1: not there */
    int32_t peer_prev, peer_next; /* the list of calls to `to` */
};

typedef struct sr_registry sr_registry;

struct sr_reorder; /* test-only delivery mode (reorder.h) */

#define BURST 32

typedef struct sr_agent {
    /* The transports (transport.h), opened by sr_init and closed after the
     * agent's threads stopped (api.c). self: the home instance, whose inbox
     * the token holder consumes and whose sleeps it sleeps in; wake: its
     * wake-up group (home always has one). tp: per peer the instance that
     * reaches it. remote: the polled instance (a copying transport reaching
     * the peers home does not), or NULL: the token holder polls it after
     * self, and bounds its sleeps by its poll_ns. */
    sr_transports *tports;
    sr_tport *self;
    const struct sr_tport_wake *wake;
    sr_tport *const *tp;      /* [world] */
    sr_tport *remote;
    int rank, world;
    uint64_t epoch;           /* set by sr__agent_publish: tells agents apart */
    _Atomic bool closing;     /* set by sr__agent_unpublish: waiters leave */

    /* The token holder's: the last burst read from the inbox and how far it
     * has been dispatched (handed over with the token). */
    sr_msg burst[BURST];
    unsigned burst_n, burst_at;
    /* Messages from a generation of their sender not known here yet, in
     * arrival order, until its return is taken (held.c); the token
     * holder's, handed over with the token. */
    struct sr_held *held, **held_tail;
    bool inbox_failed;        /* our inbox was found corrupt and its waits failed (exits.c, sr__agent_inbox_lost) */
    char (*names)[128];       /* [world], filled at init */

    _Atomic uint32_t token;   /* see above */
    enum sr_poll_mode progress_mode; /* the progress loop's: PROGRESS, or NESTED without a stand-in (progress.c) */
    /* The progress thread runs a plain call without the token ("The
     * progress thread serves"). Written by the progress thread only
     * (seq_cst: K4 with sr__agent_kick); read by it, and by kickers. */
    _Atomic bool progress_away;
    /* The stand-in job queued and not started yet, and the `back` of the
     * latest call it is to cover (a reference), under standin_lock: the
     * progress thread sets them, the job (or its shut) takes them
     * (progress.c, stand_in_start). Lock order: standin_lock, then q_lock. */
    sr__lock standin_lock;
    sr_future *standin_back;
    bool standin_queued;
    /* The stand-by (progress.c; "The progress thread serves" above): the
     * thread, started at the first call kept with it, by the progress thread,
     * and joined by sr__agent_stop after it; away_back, the `back` of the call the progress thread runs
     * with the stand-by on (a reference, under standin_lock: set and cleared
     * by the progress thread, read by the stand-by); away_standby, that the
     * current away period hands the inbox over with park_away (written by
     * the progress thread before the token goes, read by holders after they
     * took it); standby_quit, the stand-by is to return (set once, before
     * its doorbell is stopped). */
    pthread_t standby;
    bool standby_started;
    sr_future *away_back;
    _Atomic int64_t standby_armed; /* the timer the stand-by sleeps until (-1 none): written by it, read by the progress thread */
    _Atomic bool away_standby;
    _Atomic bool standby_quit;
    /* User threads in a serving wait (IDLE, WAIT: wait.c,
     * sr__agent_wait_user): while any is, the progress thread keeps no plain
     * call. A hint, counted by the waiters themselves. */
    _Atomic uint32_t serving_waiters;
    _Atomic uint32_t want_token; /* user threads waiting to steal: the spinning progress thread parks */
    _Atomic uint32_t user_polls; /* bumped by every user take (by the token's new holder only): the progress thread stops spinning while users poll */
    _Atomic uint32_t timer_gen;  /* bumped by sr__agent_kick: some deadline moved earlier */
    _Atomic uint32_t armed_gen;  /* written by the progress thread: timer_gen its sleep's deadline saw */
    uint32_t seen_user_polls;    /* progress thread only */
    pthread_t progress;
    _Atomic bool stopping;

    /* client calls (calls.c): the slots, their free list, the deadline heap
     * and the per-destination lists, all under slots_lock (a short
     * section: never held across a wait or a call out of calls.c) */
    sr__lock slots_lock;
    struct sr_call_slot *slots;
    int32_t nslots, free_head;
    /* A min-heap on the deadline, which each entry carries beside its slot's
     * index: sifting compares entries side by side in this array instead of
     * loading each slot's record (a call completed in order removes the top,
     * and its replacement sifts down every level of the heap). */
    struct sr_heap_entry {
        int64_t deadline_ns; /* its call's deadline (coarse clock); only here */
        int32_t slot;
    } *heap;
    int32_t heap_len;
    int32_t *peer_head;         /* [world]: first call to each rank, -1: none */
    /* A lower bound of the earliest deadline (-1: none), written under
     * slots_lock: lowered by a call's begin, set to the heap's top by expiry.
     * Every poller that holds the token expires calls once it passes. */
    _Atomic int64_t earliest_deadline;
    /* Why no answer can reach this worker any more (its inbox is corrupt),
     * or empty: set once under slots_lock by sr__calls_fail_all, which
     * fails the calls in flight; every later begin fails with it. */
    char calls_lost[320];
    /* This worker's counters (segment.h, struct sr_worker_counters: calls
     * made and ended, served in and out, heap in use): its line of the
     * segment's worker table, where the launcher reads them, or own_ctr
     * without a segment. Set at init (counters.c). mon_ns: the heap's
     * sampling interval (SHMRPC_MONITOR_INTERVAL; 0: not sampled), mon_due:
     * when the next sample is due (coarse ns; CAS by the thread that takes it). */
    struct sr_worker_counters *ctr;
    struct sr_worker_counters own_ctr;
    int64_t mon_ns;
    _Atomic int64_t mon_due;
    _Atomic uint64_t stray_responses; /* responses dropped: they came from a rank the call did not go to */
    _Atomic uint64_t refused;         /* messages refused for their generation stamps (refuse.c) */
    _Atomic uint64_t held_early;      /* messages that waited for their sender's return to be taken: the token
                                       * holder counts (held.c), relaxed; a statistic for tests */
    /* Call slots that expiry (take_due) and peer failure (take_peer) looked
     * at, counted for tests/rpc/test_call_scan.c: proportional to the calls they
     * end, never to the table. Relaxed: statistics for tests, nothing is
     * published with it. */
    _Atomic uint64_t calls_examined;

    /* executors, started on demand (exec.c): one at init, another when a
     * job is queued and fewer executors are free than jobs wait, up to
     * exec_max. Under q_lock: the queue, q_len, exec_free, exec_stopping,
     * executors[0..nexec). */
    pthread_mutex_t q_lock;
    pthread_cond_t q_cond;
    struct sr_job_item *q_head, **q_tail;
    uint32_t q_len;           /* under q_lock: jobs queued */
    uint32_t exec_free;       /* under q_lock: executors not in a job (starting, between jobs, asleep) */
    bool exec_stopping;       /* under q_lock: executors drain the queue and exit */
    pthread_t *executors;     /* [exec_max], allocated at init */
    int exec_max;             /* under q_lock (set at init: num_worker_threads; lowered to nexec if a start fails) */
    /* Executors started: written under q_lock, read there or relaxed (a
     * statistic: sr_debug_info_get, tests); it publishes nothing. */
    _Atomic int nexec;
    /* attributes of the executors: the sr_init thread's signal mask and CPU
     * affinity, whichever thread starts one later; set at init */
    pthread_attr_t exec_attr;
    _Atomic uint32_t exec_idle; /* executors asleep on q_cond; counted under q_lock, read relaxed (statistics) */
    _Atomic uint64_t server_async;

    /* messages waiting for space in full peer inboxes, per destination (outq.h) */
    sr_outq outq;

    /* departed peers (segment.h, "Peer exit"): handled once each, by
     * whichever polling thread first sees the exit generation move */
    pthread_mutex_t gone_lock;   /* gone[] and the scan; never held across the handling */
    uint8_t *gone;               /* [world], enum sr_gone, under gone_lock */
    /* Replacement in place (transport.h, SR_TPORT_REPLACES; segment.h):
     * what sr_msg.gens must say for a message from each rank to be taken:
     * its generation as we know it (low nibble) and ours (high nibble), or
     * -1 while the rank is gone (its messages are refused). Written under
     * gone_lock by the thread that handles exits; read by dispatch. */
    _Atomic int16_t *expect;     /* [world] */
    uint32_t gen;                /* our own generation; set at init */
    /* Completed, and replaced by a fresh one, whenever a gone rank's new
     * generation is taken or a departure is handled (exits.c): what
     * sr_wait_for_worker and sr_wait_for_departure wait on.
     * Under gone_lock; waiters hold their own reference. */
    sr_future *returns;
    bool replaces;               /* the job replaces ranks that die, or is elastic; set at init */
    bool elastic;                /* workers leave and join (transport.h, SR_TPORT_ELASTIC); set at init */
    _Atomic uint32_t exits_seen; /* written under gone_lock after a full scan; read relaxed as a hint */

    /* Quiescence counters (shutdown.c, the wave), per peer: user messages
     * sent to each rank and fully processed from it, each counted under
     * the parity of that rank's generation (slot 2: a rank that is gone).
     * The wave sums the slots of the generations alive now, so what a dead
     * generation sent or was sent drops out of both sums together (it is
     * refused or failed, never processed by its successor). Relaxed adds
     * by any thread; a slot is zeroed when a generation of that parity
     * comes back (exits.c). [world] */
    struct sr_quiesce *quiesce;

    /* shutdown coordination (leader = rank 0) */
    pthread_mutex_t ctl_lock;
    uint32_t barrier_epoch, barrier_count;
    sr_future *barrier_fut, *quiescent_fut;
    uint64_t wave, wave_replies, wave_sent, wave_done;
    sr_future *wave_fut;
    uint8_t *ctl_in;             /* leader: [world], who has arrived at this barrier / answered this wave */
    int ctl_gone_rank;           /* the first peer that left without a graceful shutdown; -1: none;
                                    our own rank: our inbox is corrupt */
    int ctl_gone_err;            /* what it fails them with: -EPIPE, -ETIMEDOUT (it left after its own
                                    shutdown timed out), -EPROTO (our inbox) */
    char ctl_gone[256];          /* how it left: fails every shutdown wait, now and later */
    /* A leave (leave.c), under ctl_lock: the round's number, its future
     * (completed when every peer asked has answered, failed with -EAGAIN
     * when one of them left meanwhile), who was asked (leave_want) and has
     * answered (ctl_in), and what each answered. [world] each. */
    uint64_t leave_round;
    sr_future *leave_fut;
    uint32_t leave_pending;
    uint8_t *leave_want;
    uint64_t *leave_sent, *leave_done;

    sr_registry *reg;
    _Atomic int64_t default_timeout_ms; /* 0: infinite */

    struct sr_reorder *reorder; /* NULL unless SHMRPC_REORDER_SEED is set (tests only) */

    /* Lost wake-ups of a user thread asleep on the doorbell, counted for
     * tests/rpc/test_idle_wake.c: doorbell sleeps (holder_sleep) that
     * slept until their deadline while a message waited in the inbox and the
     * doorbell no longer said SLEEPING_USER. Someone took it away without
     * waking us, so the producer saw AWAKE and rang nobody. (Not exactly zero
     * by construction: a sleep that ends between a producer's exchange and
     * its wake syscall counts too, a window of about a microsecond.) */
    _Atomic uint64_t idle_missed_wakes;
} sr_agent;

/* Count one event in a counter of ctr (relaxed: a statistic, see segment.h). */
static inline void sr__count(_Atomic uint64_t *c) { atomic_fetch_add_explicit(c, 1, memory_order_relaxed); }
/* The same for a counter whose every writer holds one lock (calls_made and
 * calls_ended: slots_lock; served_in: the consumer token): a load and a
 * store, no locked instruction. The lock orders the writers; readers only
 * load (relaxed: a statistic). */
static inline void sr__count_locked(_Atomic uint64_t *c)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}
/* counters.c: point ctr at our line of the segment (or own_ctr), zeroed;
 * read SHMRPC_MONITOR_INTERVAL. 0, or -EINVAL for a bad value. */
int sr__counters_init(sr_agent *a);
/* A call starts or is served: sample the heap if the monitor wants it now. */
void sr__counters_sample_slow(sr_agent *a);
static inline void sr__counters_sample(sr_agent *a)
{
    if (sr_unlikely(a->mon_ns))
        sr__counters_sample_slow(a);
}
/* made - ended, served_in - served_out: never below 0 */
uint64_t sr__counters_in_flight(const struct sr_worker_counters *c);
uint64_t sr__counters_serving(const struct sr_worker_counters *c);

/* A reference to the published agent, or NULL (and, if fn is not NULL, an
 * -SR_ESHUTDOWN error naming fn) before sr_init and from sr_shutdown on. */
sr_agent *sr__agent_get(const char *fn);
void sr__agent_put(sr_agent *a);
/* The published agent without a reference: only for code that knows it is
 * alive (white-box tests inside a running job, which read sr__agent). */
sr_agent *sr__agent_peek(void);
#define sr__agent (sr__agent_peek())
void sr__agent_publish(sr_agent *a);
/* Tests only (life.c): the per-thread reference slots handed out at most
 * (lowered before sr_init), and the references taken on the process-wide
 * count instead. */
extern _Atomic uint32_t sr__ref_slots_max;
extern _Atomic uint64_t sr__ref_global_taken;
/* No new reference; wake the waiters; wait for the references to go. */
void sr__agent_unpublish(sr_agent *a);
/* What sr__rpc_rank and friends (module.h) report: set before the modules'
 * init, reset (-1, 0, false) after their fini. */
void sr__modules_identity(int rank, int world, bool reorder);

int sr__agent_start(sr_agent *a);
void sr__agent_stop(sr_agent *a);

/* Send one message, queueing it locally if the peer's inbox is full or older
 * messages for that peer are queued (outq.h; or, in the test-only reordering
 * mode, holding it back for a random delay). */
int sr__agent_send(sr_agent *a, int to, sr_msg *m);
/* Send now, bypassing the reordering mode (it releases held messages here). */
int sr__agent_send_now(sr_agent *a, int to, sr_msg *m);
/* Send without waking the destination: for messages nobody blocks on, read
 * whenever the destination next polls. rung_later: this thread sends or
 * rings `to` loudly next (the transport's send_quiet); otherwise the
 * transport's send_lazy, which still rings when a message sent behind this
 * one may be waiting on it (a consumer stops at the first unpublished slot). */
int sr__agent_send_quiet(sr_agent *a, int to, sr_msg *m, bool rung_later);
/* Wake the progress thread so that it re-arms its timer (a deadline it does
 * not know about moved earlier). */
void sr__agent_kick(sr_agent *a);
/* rank shares our heap (our host's segment): its tensors arrive by
 * reference, zero-copy; across hosts they arrive as copies (transport.h). */
bool sr__agent_shares_heap(const sr_agent *a, int rank);

/* Requests (calls.c): check a call's arguments and capture its timeout (ms, 0:
 * none), and start one (struct sr_req: module.h). The call completes f; the
 * call slot's reference to f is one f brought (a call's own future,
 * sr__future_new_call: dropped if the call does not start) or one taken.
 * Both take a replaced rank's new generation first (sr__agent_refresh). */
int sr__call_check(sr_agent *a, int to, const char *fn, sr_args args, double timeout_s, int64_t *ms);
int sr__rpc_start(sr_agent *a, int to, const struct sr_req *q, const char *fn, sr_args args, int64_t ms,
                  sr_future *f);

/* Handle the peers whose exit was published since the last look: fail the
 * calls to them, tell the modules and the shutdown protocol (once per peer).
 * Any polling thread; one relaxed load when nothing changed. */
void sr__agent_check_exits(sr_agent *a);

/* Does m carry the generations we expect of its sender and of us
 * (agent.h, expect)? One load and a compare; the rest out of line. */
bool sr__agent_stamp_slow(sr_agent *a, const sr_msg *m);
static inline bool sr__agent_stamp_ok(sr_agent *a, const sr_msg *m)
{
    return sr_likely(m->src < (unsigned)a->world &&
                     /* relaxed: see expect */
                     (int16_t)m->gens == atomic_load_explicit(&a->expect[m->src], memory_order_relaxed)) ||
           sr__agent_stamp_slow(a, m);
}
/* expect's value for rank r while it is alive: its generation as the
 * transport knows it, and ours. */
static inline int16_t sr__agent_stamp_for(sr_agent *a, int r)
{
    sr_tport *t = a->tp[r];
    uint32_t g = (t->caps & SR_TPORT_REPLACES) ? t->ops->live->generation(t, r) : 0;
    return (int16_t)((g & 0xfu) | (a->gen & 0xfu) << 4);
}
/* NULL when rank is known alive (its messages are taken); else a reference
 * to the future completed at the next return of a rank (agent.returns).
 * Handles the exits published so far first. */
sr_future *sr__agent_await_rank(sr_agent *a, int rank);
/* NULL when rank is gone; else a reference to the future completed at the
 * next departure or return of a rank (agent.returns). */
sr_future *sr__agent_await_departure(sr_agent *a, int rank);
/* rank's generation as this worker knows it, or -EPIPE while it is gone
 * (rank in range). Handles the exits published so far first. */
int64_t sr__agent_generation(sr_agent *a, int rank);
/* held.c (agent.h, held): m is from a generation of its sender newer than
 * the one known here (a return not taken yet) and for ours; add it to the
 * held messages (-ENOMEM); is one from src held; is one due (its
 * generation known now, or a later one: refused as it is dispatched); take the
 * next one due, or the first whatever it is (false: none). The token
 * holder's, all; at the end refuse.c lets go of those left. */
bool sr__held_newer(sr_agent *a, const sr_msg *m);
int sr__held_add(sr_agent *a, const sr_msg *m);
bool sr__held_from(const sr_agent *a, unsigned src);
bool sr__held_due_slow(sr_agent *a);
bool sr__held_next(sr_agent *a, sr_msg *out);
bool sr__held_pop(sr_agent *a, sr_msg *out);
void sr__agent_release_held(sr_agent *a);
/* The rest of the burst, or a held message due: what a token holder's
 * sleep re-checks (after D2: a return rings our doorbell once taken). */
static inline bool sr__agent_burst_left(sr_agent *a)
{
    return a->burst_at < a->burst_n || (sr_unlikely(a->held != NULL) && sr__held_due_slow(a));
}
/* Fill expect for every rank (init). */
void sr__agent_stamps_init(sr_agent *a);
/* refuse.c: let go of everything m carries (each tensor's block reference,
 * each RRef fork, then its payload block): a message refused, or queued and
 * never sent. */
void sr__msg_release(const sr_msg *m);

struct sr_quiesce {
    _Atomic uint64_t sent[3], done[3];
};

/* Which of rank r's quiescence slots counts now (agent.quiesce). */
static inline unsigned sr__quiesce_slot(sr_agent *a, int r)
{
    int16_t e = atomic_load_explicit(&a->expect[r], memory_order_relaxed); /* relaxed: see expect */
    return e < 0 ? 2u : (unsigned)e & 1u;
}
/* A user message to `to` is about to be sent: counted before it can
 * arrive. Returns the slot, for sr__quiesce_unsent. */
static inline unsigned sr__quiesce_sent(sr_agent *a, int to)
{
    if ((unsigned)to >= (unsigned)a->world)
        return 3; /* the send fails: nothing counted */
    unsigned s = sr__quiesce_slot(a, to);
    /* seq_cst: the leave's pairing (segment.h, E2: counted, then the
     * destination's state loaded); else relaxed would do (the wave argument).
     * The same locked add on x86. */
    atomic_fetch_add_explicit(&a->quiesce[to].sent[s], 1, memory_order_seq_cst);
    return s;
}
/* It was never sent after all: counted as done in the same slot, so that
 * both sums only ever grow (the wave argument, shutdown.c); in an elastic
 * job, taken back. */
static inline void sr__quiesce_unsent(sr_agent *a, int to, unsigned slot)
{
    if (slot >= 3)
        return;
    if (a->elastic) /* the counts pair up per peer and no wave sums them (leave.c): taken back. seq_cst: as the count */
        atomic_fetch_sub_explicit(&a->quiesce[to].sent[slot], 1, memory_order_seq_cst);
    else
        atomic_fetch_add_explicit(&a->quiesce[to].done[slot], 1, memory_order_relaxed); /* relaxed: as above */
}
/* A user message from `from`, stamped gens, is fully processed. */
static inline void sr__quiesce_done(sr_agent *a, int from, uint8_t gens)
{
    if ((unsigned)from < (unsigned)a->world) /* relaxed: as above */
        atomic_fetch_add_explicit(&a->quiesce[from].done[gens & 1u], 1, memory_order_relaxed);
}
/* Elastic jobs (leave.c): a leave, instead of the collective graceful
 * shutdown; the peer's side of its rounds (under ctl_lock, from
 * sr__ctrl_dispatch); and the refusal
 * of a call to a peer that is leaving (after the call was counted). A
 * departure that ends a round early is exits.c's (leave_round_peer_gone). */
int sr__leave(sr_agent *a, int64_t deadline);
void sr__leave_report(sr_agent *a, int from, uint64_t round);
void sr__leave_answer(sr_agent *a, int from, const uint64_t args[3]);
int sr__leave_refuse(sr_agent *a, int to, const char *who);

/* The sums the wave reports: the slots of the generations alive now. */
void sr__quiesce_totals(sr_agent *a, uint64_t *sent, uint64_t *done);
static inline bool sr__agent_exits_pending(sr_agent *a)
{
    /* relaxed (exits_seen): a hint; sr__agent_check_exits re-reads under its lock */
    return sr__tport_exits(a->self) != atomic_load_explicit(&a->exits_seen, memory_order_relaxed);
}

/* Before a call: a rank replaced since this worker last polled is known,
 * whoever calls (sr_rpc_*, a module's request: remote(), distributed
 * autograd) and whether or not any thread polled since: its old
 * generation's death handled, its new one taken, so that the call is
 * stamped for the new one (not failed with -EPIPE as sent to the dead one)
 * and a module reads the new generation. Two loads when nothing changed. */
static inline void sr__agent_refresh(sr_agent *a)
{
    if (a->replaces && sr__agent_exits_pending(a))
        sr__agent_check_exits(a);
}

/* Wait for f, polling the inbox when this thread can take the token.
 * counted: the caller holds a reference (sr__agent_get), which the wait lets
 * go of while it sleeps; SR__WAIT_DETACHED: the agent was unpublished
 * meanwhile, and the reference is gone. Otherwise 0, -ETIMEDOUT or
 * -SR_ESHUTDOWN (a nested wait cut short by sr_shutdown). */
#define SR__WAIT_DETACHED 3
int sr__agent_wait(sr_agent *a, sr_future *f, int64_t deadline_ns, enum sr_poll_mode mode, bool counted);
/* The same for a caller holding a reference: drops it, and finishes a
 * detached wait on the future alone. */
int sr__agent_wait_counted(sr_agent *a, sr_future *f, int64_t deadline_ns, enum sr_poll_mode mode);
/* Take the token before sending a request this thread will wait for, so
 * that the response finds the inbox held (doorbell AWAKE) instead of waking
 * the parked progress thread when the caller is preempted between its send
 * and its wait. The next sr__agent_wait on this thread uses it; every other
 * way out calls sr__agent_unhold (a no-op once a wait used it). An idle
 * waiter uses it the same way before answering a plain call it ran
 * (sr__dispatch_run_deferred): the caller's next request finds it held. */
void sr__agent_pretake(sr_agent *a);
/* Whether this thread polls a's inbox now: the progress thread, or a user
 * thread holding the token (a callback it runs waits: a nested wait). */
bool sr__agent_polling_here(const sr_agent *a);
void sr__agent_unhold(sr_agent *a);
/* Tests only (tests/rpc/test_away_serve.c): called by a token holder about
 * to sleep on the doorbell, once it has read its timers; NULL otherwise. */
typedef void (*sr__hold_hook)(void);
extern _Atomic(sr__hold_hook) sr__test_before_hold_sleep;

/* ---- between the agent's own files --------------------------------------
 * life.c (lifetime), send.c (sending), poll.c (reading the inbox), wait.c
 * (the consumer token and the waits), progress.c (the progress thread),
 * exits.c (peer exits). Calls run one way: progress -> wait -> poll ->
 * exits, and each of them -> send and life. */

/* sr_shutdown has begun (sr__agent_unpublish): waiters leave. */
static inline bool sr__agent_closing(sr_agent *a)
{
    return atomic_load_explicit(&a->closing, memory_order_relaxed); /* relaxed: a hint, re-checked after D2 before sleeping */
}

/* Messages for the token holder: the rest of the last burst, or the inbox
 * (or a corrupt inbox not yet found: a poll finds it; transport.h, pending). */
static inline bool sr__agent_inbox_ready(sr_agent *a)
{
    return sr__agent_burst_left(a) || a->self->ops->pending(a->self) ||
           (a->remote && a->remote->ops->pending(a->remote));
}

/* The same, or a space event (transport.h, flow): the spin loops' check. */
static inline bool sr__agent_poll_ready(const sr_agent *a)
{
    return a->burst_at < a->burst_n || sr__tport_space_kicked(a->self) || a->self->ops->pending(a->self) ||
           (a->remote && a->remote->ops->pending(a->remote));
}

/* The earlier of two deadlines (-1: none). */
static inline int64_t sr__earlier(int64_t d, int64_t e)
{
    return e >= 0 && (d < 0 || e < d) ? e : d;
}

/* poll.c: consume one burst (the caller holds the token); the count. */
unsigned sr__agent_poll_burst(sr_agent *a, enum sr_poll_mode mode);
/* poll.c: ring the destinations this thread's burst sent to quietly (agent.h, "Poll bursts"). */
void sr__burst_ring(sr_agent *a);
/* poll.c: when the token holder must poll the copying transport again, -1 never. */
int64_t sr__agent_remote_due(const sr_agent *a);
/* poll.c: expire overdue calls (one relaxed load on the busy path). */
void sr__agent_expire_due(sr_agent *a);
/* exits.c: our own inbox is corrupt: fail every wait that needs an answer. */
void sr__agent_inbox_lost(sr_agent *a);
/* wait.c: the token became PARKED or FREE: wake the idle waiters (T2). */
void sr__token_freed(void);
/* wait.c: an executor polls while the progress thread runs a call, until
 * back completes ("The progress thread serves"). */
void sr__agent_stand_in(sr_agent *a, sr_future *back);
/* The progress thread, holding the token and away with the stand-by on
 * (away_standby): hand the inbox over so that a message wakes the stand-by
 * (wake->park_away), the token PARKED. When messages came first (the rest
 * of a burst included), the stand-by is poked to read them: this thread
 * never polls while away, since a callback's wait there would hand the
 * token over under the frame that polls. */
void sr__agent_park_away(sr_agent *a);
/* wait.c: sr__agent_wait on any thread but the progress thread. */
int sr__agent_wait_user(sr_agent *a, sr_future *f, int64_t deadline, enum sr_poll_mode mode, bool counted);

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
/* No answer can reach this worker any more (why: its inbox is corrupt):
 * fail every call in flight with -EPROTO, and every later sr__call_begin. */
void sr__calls_fail_all(sr_agent *a, const char *why);
/* An answer (RESP, ERR, KEEP_RET) to one of our calls: complete its future. */
void sr__calls_response(sr_agent *a, const sr_msg *m);

/* Serving (serve.c) */
/* Plain calls an idle poller took (or a serving waiter, or the progress
 * thread): run them on this thread after handing the token back (see
 * start_call); before the last one's answer is sent, the token is taken back
 * (retake: sr__agent_pretake, or the progress thread's), and the wait or
 * the loop goes on with it.
 * has_deferred: such calls or kept module jobs wait to run here. */
bool sr__dispatch_has_deferred(void);
/* retake(a): called before the last deferred call's answer goes out
 * (sr__agent_pretake: the waiter takes the token back). */
void sr__dispatch_run_deferred(void (*retake)(sr_agent *a));
/* This thread is about to wait while it holds the inbox (a nested wait):
 * what it kept to run itself goes to the executors instead. */
void sr__dispatch_hand_off(sr_agent *a);
/* A request (REQ, KEEP_CALL, MOD_REQ): decode, gate and run it, and answer. */
void sr__serve_request(sr_agent *a, const sr_msg *m, enum sr_poll_mode mode);

/* The executor pool (exec.c): at most n executors, started on demand. The
 * first starts here (so that a worker that cannot start threads fails
 * sr_init); each later one when a job is queued and there are more jobs
 * queued than executors free to take them (a busy executor may block in
 * its function for good: PyTorch's num_worker_threads). */
int sr__exec_start(sr_agent *a, int n);
/* Queue fn(arg) for an executor, starting one if none is free; shut(arg)
 * ends it unrun if the pool shuts down first (sr__exec_fini). 0, or
 * -ENOMEM (nothing queued). */
int sr__exec_push(sr_agent *a, void (*fn)(void *arg), void (*shut)(void *arg), void *arg);
/* The same, only if an executor is free to take it at once (more free
 * executors than queued jobs; the pool is not grown for it): -EBUSY
 * otherwise, and the job is not queued. For the progress thread's stand-in
 * (progress.c), which must not wait behind functions that may block. */
int sr__exec_push_now(sr_agent *a, void (*fn)(void *arg), void (*shut)(void *arg), void *arg);
/* Whether module jobs (sr__exec_submit) that this thread's polling starts
 * are kept for this thread instead of the executors: on for threads that
 * only wait (an idle waiter in sr_shutdown, a module waiting for its own
 * request), which run them once they have handed the inbox back. Returns
 * the previous setting. */
bool sr__exec_take_jobs(bool on);
/* The jobs this thread kept: are there any; run them; give them to the executors. */
bool sr__exec_has_kept(void);
void sr__exec_run_kept(void);
void sr__exec_hand_off_kept(sr_agent *a);
/* Stop: the executors drain the queue and exit; the queue stays usable (a
 * polling thread may still queue a request) until sr__exec_fini, which
 * ends what came too late (a call: answered with -SR_ESHUTDOWN) and
 * destroys the queue. */
void sr__exec_stop(sr_agent *a);
void sr__exec_fini(sr_agent *a);

/* Shutdown control (shutdown.c) */
void sr__ctrl_dispatch(sr_agent *a, const sr_msg *m);
/* A peer left without a graceful shutdown: every shutdown wait, armed now or
 * later, fails with -EPIPE and `text` ("worker2 exited with status 0 without
 * sr_shutdown"). The first departure is the one reported. One that left
 * after its own graceful shutdown timed out did not die: the waits time out
 * too (-ETIMEDOUT, naming who had not arrived). rank == our own: our inbox
 * is corrupt, so no peer's message can reach us (text says so); the waits
 * fail with -EPROTO. */
void sr__ctrl_peer_gone(sr_agent *a, int rank, const char *text);
int sr__graceful(sr_agent *a, int64_t deadline_ns);

#endif
