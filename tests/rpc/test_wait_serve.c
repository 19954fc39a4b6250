/* SPDX-License-Identifier: MIT */
/* A thread that waits in sr_future_wait on a future that is not an RPC
 * call's own serves the calls its own polling finds (lib/rpc/agent.h,
 * "Serving waiters"):
 *
 *   waiting_thread_runs_plain_calls   the hop it exists to remove: a plain
 *       function called by a peer runs on the thread waiting in
 *       sr_future_wait, not on an executor (before, every such call was
 *       handed to an executor, and each hand-off was a futex wake).
 *   nested_waits_across_three_workers   a function run on a waiting thread
 *       that itself calls and waits, NEST levels deep around three workers:
 *       it completes, and no thread stacks more than SERVE_DEPTH_MAX calls
 *       served by its waits, plus the one an executor was given (past the
 *       bound the executors serve).
 *   blocking_call_holds_up_no_wait   a function that blocks, run on a
 *       waiting thread, until (1) that thread's own future has completed and
 *       (2) another thread's sr_rpc_sync has returned: both complete while it
 *       blocks (the waiter handed the inbox over before running it), and the
 *       wait returns once it has finished.
 *   peer_death_while_the_waiter_serves   the peer dies while the waiter runs
 *       its call: the waiter's own call to it fails with -EPIPE meanwhile,
 *       and the wait returns that error once the call has finished.
 *
 * Events, not sleeps: shared words (shared_event.h) and semaphores, every
 * wait bounded by EVENT_WAIT_S; a scenario that must land on the waiting
 * thread is repeated until it does, at most ROUNDS times. */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define EVENT_WAIT_S 30
#include "rpc_harness.h"
#include "shared_event.h"

LEAK_CHECKED_SUITE(wait_serve);

#define SERVE_DEPTH_MAX 4 /* lib/rpc/agent.h, SR_SERVE_DEPTH_MAX */
#define NEST 30           /* bounce levels: 10 per worker, past the bound */
#define ROUNDS 200

/* Shared by the job's processes (created before sr_spawn, inherited). */
struct board {
    _Atomic uint32_t b_started; /* round number whose block call has started */
    _Atomic uint32_t max_nest[3]; /* per worker: most bounce frames on one thread */
    _Atomic uint32_t block_here; /* ws.block ran on worker 0's waiting thread */
};
static struct board *board;

static pthread_t waiter;         /* the worker's thread that waits (the harness's) */
static sr_future *stop;          /* completed by ws.stop */
static sr_future *own;           /* worker 0: the waiter's call this round */
static sr_future *ev;            /* worker 0: completed when own is (what the waiter waits on) */
static sem_t own_done, u_done;   /* worker 0: own completed; the other thread's call returned */
static sem_t u_go;               /* worker 0: the other thread may call */
static _Thread_local unsigned nest;

static bool on_waiter(void) { return pthread_equal(pthread_self(), waiter); }

static int fn_where(sr_call *c) { return sr_call_return(c, sr_bool(on_waiter())); }

static int fn_stop(sr_call *c)
{
    sr_future_set_result(stop, NULL);
    return sr_call_return(c, NULL);
}

static int pass_on(sr_future *parent, void *arg, sr_value **result)
{
    (void)arg;
    return sr_future_value(parent, result);
}

/* ws.bounce(n): 0 when n is 0, else 1 + ws.bounce(n - 1) on the next
 * worker, waited for through a `then` (a wait on a call's own future serves
 * no plain call: agent.h, "Serving waiters"). */
static int fn_bounce(sr_call *c)
{
    int64_t n = sr_value_int(sr_call_arg(c, 0));
    if (n == 0)
        return sr_call_return(c, sr_int(0));
    int me = sr_rank(), world = sr_world_size();
    nest++;
    uint32_t seen = atomic_load(&board->max_nest[me]);
    while (nest > seen && !atomic_compare_exchange_weak(&board->max_nest[me], &seen, nest))
        ;
    sr_value *arg = sr_int(n - 1), *out = NULL;
    sr_future *f = NULL, *g = NULL;
    int rc = sr_rpc_async((me + 1) % world, "ws.bounce", SR_ARGS(arg), 0, &f);
    sr_value_unref(arg);
    if (!rc)
        rc = sr_future_then(f, pass_on, NULL, &g);
    if (!rc)
        rc = sr_future_wait(g, &out); /* not the call's own future: this wait serves */
    sr_future_unref(f);
    sr_future_unref(g);
    nest--;
    if (rc)
        return sr_call_fail(c, rc, "%s", sr_last_error());
    int64_t v = sr_value_int(out);
    sr_value_unref(out);
    return sr_call_return(c, sr_int(v + 1));
}

/* ws.block(round): on worker 0, started by worker 1 while worker 0's waiter
 * waits for `own`. Says it started (and whether on the waiter), lets the
 * other thread call, and blocks until own has completed and that call has
 * returned. */
static int fn_block(sr_call *c)
{
    if (on_waiter())
        atomic_store(&board->block_here, 1);
    set_and_wake(&board->b_started, (uint32_t)sr_value_int(sr_call_arg(c, 0)));
    sem_post(&u_go);
    if (sem_wait_bounded(&own_done))
        return sr_call_fail(c, -ETIMEDOUT, "ws.block: the waiter's own future never completed while it blocked");
    if (sem_wait_bounded(&u_done))
        return sr_call_fail(c, -ETIMEDOUT, "ws.block: the other thread's sr_rpc_sync never returned while it blocked");
    return sr_call_return(c, sr_none());
}

/* ws.hold(round, die): on worker 1, the waiter's own call. Starts ws.block
 * on worker 0 and returns (or, die, exits) once it has started, so that
 * the answer comes while ws.block runs. */
static int fn_hold(sr_call *c)
{
    uint32_t round = (uint32_t)sr_value_int(sr_call_arg(c, 0));
    bool die = sr_value_bool(sr_call_arg(c, 1));
    sr_future *b = NULL;
    sr_value *r = sr_int(round);
    int rc = sr_rpc_async(0, "ws.block", SR_ARGS(r), 0, &b);
    sr_value_unref(r);
    if (rc)
        return sr_call_fail(c, rc, "%s", sr_last_error());
    if (!wait_for(&board->b_started, round))
        return sr_call_fail(c, -ETIMEDOUT, "ws.hold: ws.block of round %u never started on worker0", round);
    if (die)
        _exit(0); /* status 0: the job goes on; worker 0 sees worker1 gone */
    sr_future_unref(b); /* its answer comes later; nobody waits for it here */
    return sr_call_return(c, sr_none());
}

static void own_completed(sr_future *f, void *arg)
{
    (void)arg;
    int rc = sr_future_wait(f, NULL); /* done: its error and message, at once */
    if (rc)
        sr_future_set_error(ev, rc, "%s", sr_last_error());
    else
        sr_future_set_result(ev, NULL);
    sem_post(&own_done);
}

static void setup(void)
{
    waiter = pthread_self();
    stop = sr_future_new();
    sem_init(&own_done, 0, 0);
    sem_init(&u_done, 0, 0);
    sem_init(&u_go, 0, 0);
    sr_register("ws.where", fn_where);
    sr_register("ws.stop", fn_stop);
    sr_register("ws.bounce", fn_bounce);
    sr_register("ws.block", fn_block);
    sr_register("ws.hold", fn_hold);
}

static void release_state(void)
{
    sr_future_unref(stop);
    sem_destroy(&own_done);
    sem_destroy(&u_done);
    sem_destroy(&u_go);
}

static void board_setup(void)
{
    board = shared_page(sizeof(*board));
    *board = (struct board){0};
}

/* Every worker but `driver` waits in sr_future_wait until told to stop. */
static int wait_for_stop(void)
{
    int rc = sr_future_wait(stop, NULL);
    WCHECK(rc == 0, "sr_future_wait(stop): %d %s", rc, sr_last_error());
    return 0;
}

static int stop_all(int world, int except)
{
    for (int r = 0; r < world; r++)
        if (r != except)
            WCHECK(sr_rpc_sync(r, "ws.stop", SR_NOARGS, 0, NULL) == 0, "ws.stop on worker%d: %s", r, sr_last_error());
    return 0;
}

/* ---- a plain call runs on the waiting thread ------------------------------ */

static int where_scenario(int rank, int world)
{
    int rc = 0;
    if (rank == 0) {
        rc = wait_for_stop();
    } else {
        int64_t until = now_ns() + (int64_t)EVENT_WAIT_S * 1000000000;
        long calls = 0;
        for (bool there = false; !there; calls++) {
            sr_value *v = NULL;
            WCHECK(sr_rpc_sync(0, "ws.where", SR_NOARGS, 0, &v) == 0, "ws.where: %s", sr_last_error());
            there = sr_value_bool(v);
            sr_value_unref(v);
            WCHECK(there || now_ns() < until,
                   "none of %ld calls in %d s ran on the thread waiting in sr_future_wait (all went to executors)",
                   calls + 1, EVENT_WAIT_S);
        }
        rc = stop_all(world, 1);
    }
    release_state();
    return rc;
}

Test(wait_serve, waiting_thread_runs_plain_calls)
{
    board_setup();
    RUN_JOB("ws_where", 2, .scenario = where_scenario, .register_fns = setup);
}

/* ---- nested waits around three workers ------------------------------------- */

static int nest_scenario(int rank, int world)
{
    int rc = 0;
    if (rank != 0) {
        rc = wait_for_stop();
    } else {
        sr_value *arg = sr_int(NEST), *out = NULL;
        int r = sr_rpc_sync(1, "ws.bounce", SR_ARGS(arg), 0, &out);
        sr_value_unref(arg);
        WCHECK(r == 0, "ws.bounce(%d) around %d workers: %s", NEST, world, sr_last_error());
        WCHECK(sr_value_int(out) == NEST, "ws.bounce(%d) returned %lld", NEST, (long long)sr_value_int(out));
        sr_value_unref(out);
        for (int w = 0; w < world; w++) {
            uint32_t m = atomic_load(&board->max_nest[w]);
            WCHECK(m >= 1 && m <= SERVE_DEPTH_MAX + 1,
                   "worker%d stacked %u ws.bounce calls on one thread (bound %d)", w, m, SERVE_DEPTH_MAX + 1);
        }
        rc = stop_all(world, 0);
    }
    release_state();
    return rc;
}

Test(wait_serve, nested_waits_across_three_workers)
{
    board_setup();
    RUN_JOB("ws_nest", 3, .scenario = nest_scenario, .register_fns = setup);
}

/* ---- a blocking call on the waiter holds up no wait --------------------------- */

static int u_target; /* the worker the other thread calls */

/* Worker 0's other thread: once ws.block has started, one sr_rpc_sync. */
static void *other_thread(void *p)
{
    (void)p;
    if (sem_wait_bounded(&u_go))
        return "ws.block never let the other thread call";
    if (sr_rpc_sync(u_target, "ws.where", SR_NOARGS, 0, NULL))
        return "the other thread's sr_rpc_sync failed";
    sem_post(&u_done);
    return NULL;
}

/* One round on worker 0: the waiter's own call (ws.hold on worker 1)
 * starts ws.block here and is answered (or, die, fails) while it runs.
 * Returns the wait's result. */
static int block_round(uint32_t round, bool die)
{
    pthread_t u;
    WCHECK(pthread_create(&u, NULL, other_thread, NULL) == 0, "pthread_create");
    sr_value *args[2] = {sr_int(round), sr_bool(die)};
    WCHECK(sr_rpc_async(1, "ws.hold", SR_ARGS(args[0], args[1]), 0, &own) == 0, "ws.hold: %s", sr_last_error());
    sr_value_unref(args[0]);
    sr_value_unref(args[1]);
    WCHECK((ev = sr_future_new()) != NULL, "sr_future_new");
    WCHECK(sr_future_add_done_callback(own, own_completed, NULL) == 0, "add_done_callback: %s", sr_last_error());
    int rc = sr_future_wait(ev, NULL); /* an event, not the call's own future: this wait serves */
    if (rc)
        rc = sr_future_error_code(own);
    sr_future_unref(own);
    sr_future_unref(ev);
    void *why = NULL;
    pthread_join(u, &why);
    WCHECK(!why, "round %u: %s", round, (const char *)why);
    return rc;
}

/* Rounds until ws.block has run on the waiting thread (at most ROUNDS);
 * *next: the next round's number. 0, or 1 on a failed check. */
static int block_rounds(int *next)
{
    int round = 1;
    for (; round <= ROUNDS && !atomic_load(&board->block_here); round++) {
        int r = block_round((uint32_t)round, false);
        WCHECK(r == 0, "round %d: the waiter's own call failed: %s", round, sr_last_error());
    }
    WCHECK(atomic_load(&board->block_here), "in %d rounds ws.block never ran on the waiting thread", ROUNDS);
    *next = round;
    return 0;
}

static int block_scenario(int rank, int world)
{
    int rc = 0;
    if (rank == 1) {
        rc = wait_for_stop();
    } else {
        int next;
        u_target = 1;
        rc = block_rounds(&next) || stop_all(world, 0);
    }
    release_state();
    return rc;
}

Test(wait_serve, blocking_call_holds_up_no_wait)
{
    board_setup();
    RUN_JOB("ws_block", 2, .scenario = block_scenario, .register_fns = setup);
}

/* ---- the peer dies while the waiter serves ------------------------------------ */

/* Three workers, no graceful shutdown (worker 1 dies): worker 0 first runs
 * rounds until ws.block lands on its waiter, then one in which worker 1
 * exits once ws.block has started; the other thread calls worker 2. */
static int die_worker(int rank, int world, void *arg)
{
    (void)arg;
    setup();
    WCHECK(sr_init(NULL) == 0, "sr_init: %s", sr_last_error());
    if (rank != 0) {
        wait_for_stop(); /* worker 1 exits inside ws.hold */
    } else {
        u_target = 2;
        int round;
        WCHECK(block_rounds(&round) == 0, "see above");
        int rc = block_round((uint32_t)round, true);
        WEXPECT_ERR(rc, -EPIPE, "worker1");
        /* worker 2 shuts down as soon as stop is set: its answer may not come */
        rc = sr_rpc_sync(2, "ws.stop", SR_NOARGS, 0, NULL);
        WCHECK(rc == 0 || rc == -EPIPE, "ws.stop on worker2: %s", sr_last_error());
    }
    (void)world;
    release_state();
    sr_shutdown(false, 0);
    return 0;
}

Test(wait_serve, peer_death_while_the_waiter_serves)
{
    board_setup();
    sr_spawn_opts o = {.name_prefix = test_ns("ws_die"), .shm_size = 3u * (64u << 20)};
    cr_assert_eq(sr_spawn(3, die_worker, NULL, &o), 0, "job 'ws_die' failed: %s", sr_last_error());
}
