/* SPDX-License-Identifier: MIT */
/* A worker whose threads are all away from the runtime (its main thread
 * waits on a semaphore here, as a program's computes or joins) is served by
 * its progress thread, which runs a plain call itself while another thread
 * stands in for it: here the stand-by, woken by the first message that
 * arrives meanwhile (lib/rpc/agent.h, "The progress thread serves"; with
 * the inbox handed over as an ordinary park, no message wakes it, and the
 * two blocking scenarios time out):
 *
 *   progress_thread_runs_plain_calls   the hop it exists to remove: a plain
 *       function runs on the progress thread, not on an executor (before,
 *       every one was handed to an executor, and waited for its wake-up).
 *   a_blocking_call_holds_up_nothing   a function that blocks on the
 *       progress thread until a later call releases it: calls made
 *       meanwhile are answered (the stand-in polls), and the later call
 *       runs (on an executor), so the function ends.
 *   a_nested_call_then_a_block   the function first makes a nested
 *       sr_rpc_sync (a wait on the progress thread, which takes the token
 *       back to read its answer unless the stand-in woke first), then
 *       blocks: the token is handed on at the wait's end, and calls made
 *       meanwhile are answered; NEST_LANDED rounds on the progress thread.
 *   a_blocking_call_with_a_call_of_its_own_in_flight   as the blocking
 *       scenario, while worker 0 has a call with a deadline in flight
 *       (as.hold, answered at the end).
 *   a_deadline_passes_while_the_progress_thread_blocks   worker 0's own
 *       call (as.hold, 0.3 s), sent once its stand-by sleeps with no timer
 *       (after a first kept call), must time out while its main thread is
 *       away and its progress thread blocks in as.expired until it has:
 *       only the stand-by can expire it, once the hand-over has poked it
 *       to arm that deadline.
 *   a_timer_set_as_the_holder_falls_asleep_wakes_it   worker 0's stand-in
 *       job (the reordering mode's, set by the test) is held by a hook
 *       between reading its timers and sleeping while as.late, on the
 *       progress thread, starts a 0.2 s call: the poke that call's deadline
 *       makes lands first, and the stand-in must still fire the timeout.
 *   a_backward_pass_runs_on_the_progress_thread   worker 1's distributed
 *       backward reaches worker 0 (as.mul's part of the graph): that part
 *       runs as a module job, which the progress thread keeps and runs
 *       itself, as it runs a plain call (a gradient hook on worker 0's
 *       parameter says where it ran); before, every one was handed to an
 *       executor, and waited for its wake-up. Not under the reordering
 *       mode, which keeps the stand-in jobs: there the check is the
 *       gradients only.
 * Worker 0 checks which covered its calls: the stand-by thread, or, under
 * the reordering mode (the suite's reorder variant), stand-in jobs (no
 * stand-by thread).
 *
 * Events, not sleeps: shared words (shared_event.h) and semaphores, every
 * wait and call bounded by EVENT_WAIT_S; a scenario that must land on the
 * progress thread is repeated until it does, at most ROUNDS times. */
#include <errno.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#define EVENT_WAIT_S 30
#include "agent.h" /* sr__agent, sr__agent_kick, sr__test_before_hold_sleep */
#include "rpc_harness.h"
#include "shared_event.h"
#include "shmrpc/dist_autograd.h"

LEAK_CHECKED_SUITE(away_serve);

#define ROUNDS 50
#define CALLS_MEANWHILE 20
/* as.nest's rounds on the progress thread: whether its nested wait took the
 * token (and so must hand it on) is a race with the stand-in's wake-up,
 * which each round runs again */
#define NEST_LANDED 30

/* Shared by the job's processes (created before sr_spawn, inherited). */
struct board {
    _Atomic uint32_t started;     /* round whose blocking function has started on worker 0 */
    _Atomic uint32_t on_progress; /* round whose blocking function runs on the progress thread */
    _Atomic uint32_t holding;     /* 1: as.hold runs on worker 1 (worker 0's call is in flight) */
    _Atomic uint32_t asleep;      /* 1: a call kept by worker 0 has ended, so its stand-by exists and sleeps */
    _Atomic uint32_t hooked;      /* backward passes that reached worker 0's parameter (its hook ran) */
    _Atomic uint32_t hook_on_progress; /* of which on worker 0's progress thread */
    _Atomic uint32_t late_over;   /* 1: worker 0's as.late is over (worker 1's as.stall may return) */
};
static struct board *board;

static sem_t home;    /* worker 0: its main thread may come back (as.home) */
static sem_t unblock; /* worker 0: the blocking function may return (as.unblock) */
static sem_t held;    /* worker 1: as.hold may return (the driver's end) */
static sem_t expired; /* worker 0: its as.hold call ended (its done callback) */
static bool hold_call; /* worker 0 keeps a call with a deadline in flight (as.hold) */
static double hold_timeout_s = 4 * EVENT_WAIT_S; /* that call's timeout */
static bool hold_late; /* the deadline scenario: as.hold is sent once worker 0's stand-by sleeps */
static _Atomic int hold_rc;                      /* worker 0: how it ended */

static bool on_progress_thread(void)
{
    char name[16] = "";
    prctl(PR_GET_NAME, name);
    return !strcmp(name, "shmrpc-progress");
}

static int fn_where(sr_call *c) { return sr_call_return(c, sr_bool(on_progress_thread())); }

static int fn_home(sr_call *c)
{
    sem_post(&home);
    return sr_call_return(c, NULL);
}

static int fn_unblock(sr_call *c)
{
    sem_post(&unblock);
    return sr_call_return(c, NULL);
}

/* Says it started (and whether on the progress thread), then blocks until
 * as.unblock runs. */
static int block_here(sr_call *c, uint32_t round)
{
    if (on_progress_thread())
        atomic_store(&board->on_progress, round);
    set_and_wake(&board->started, round);
    if (sem_wait_bounded(&unblock))
        return sr_call_fail(c, -ETIMEDOUT, "as.block: as.unblock never ran while the function blocked (round %u)",
                            round);
    return sr_call_return(c, NULL);
}

/* as.block(round) */
static int fn_block(sr_call *c) { return block_here(c, (uint32_t)sr_value_int(sr_call_arg(c, 0))); }

/* as.nest(round): a nested call to worker 1 first, then as.block's part. */
static int fn_nest(sr_call *c)
{
    int rc = sr_rpc_sync(1, "noop", SR_NOARGS, EVENT_WAIT_S, NULL);
    if (rc)
        return sr_call_fail(c, rc, "as.nest: the nested call failed: %s", sr_last_error());
    return block_here(c, (uint32_t)sr_value_int(sr_call_arg(c, 0)));
}

/* worker 0's parameter, made by the first as.mul (in the shared heap, so
 * after sr_init), dropped by away() once the driver is done */
static sr_tensor *param;

static int count_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    (void)grad;
    (void)replace;
    (void)arg;
    if (on_progress_thread())
        atomic_fetch_add(&board->hook_on_progress, 1);
    atomic_fetch_add(&board->hooked, 1);
    return 0;
}

/* as.mul(x): param * x, recorded in the caller's autograd context */
static int fn_mul(sr_call *c)
{
    if (!param) {
        param = sr_ones(SR_F32, 1, (const int64_t[]){4}, SR_REQUIRES_GRAD);
        if (!param || sr_tensor_register_hook(param, count_hook, NULL))
            return sr_call_fail(c, -ENOMEM, "as.mul: the parameter: %s", sr_last_error());
    }
    sr_tensor *y = sr_mul(param, sr_value_tensor(sr_call_arg(c, 0)));
    if (!y)
        return sr_call_fail(c, -EINVAL, "as.mul: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(y);
    sr_tensor_unref(y);
    return sr_call_return(c, v);
}

/* worker 1: answers once the driver is done (sem held) */
static int fn_hold(sr_call *c)
{
    set_and_wake(&board->holding, 1);
    if (sem_wait_bounded(&held))
        return sr_call_fail(c, -ETIMEDOUT, "as.hold: the driver never ended");
    return sr_call_return(c, NULL);
}

/* worker 0: returns once its as.hold call has ended, with how it ended */
static int fn_expired(sr_call *c)
{
    if (sem_wait_bounded(&expired))
        return sr_call_fail(c, -ETIMEDOUT, "as.expired: worker0's as.hold call never ended while it blocked");
    return sr_call_return(c, sr_int(atomic_load(&hold_rc)));
}

static void hold_ended(sr_future *f, void *arg)
{
    (void)arg;
    atomic_store(&hold_rc, sr_future_value(f, NULL));
    sem_post(&expired);
}

/* ---- the late-timer scenario's functions (below) ---- */
static sem_t entered;   /* worker 0: the holder about to sleep ran the hook */
static sem_t kicked;    /* worker 0: as.late set its earlier timer; the hook may return */
static sem_t late_done; /* worker 0: as.late's own call ended (its done callback) */
static _Atomic int late_hooked;

/* Worker 0's stand-in (a token holder), about to sleep with the timers it
 * has read: hold it there until as.late has set an earlier one. */
static void late_hook(void)
{
    if (atomic_exchange(&late_hooked, 1))
        return;
    sem_post(&entered);
    sem_wait_bounded(&kicked);
}

static void late_ended(sr_future *f, void *arg)
{
    (void)f;
    (void)arg;
    sem_post(&late_done);
}

/* worker 1: outlast as.late's 0.2 s timeout, until worker 0 says it ended */
static int fn_stall(sr_call *c)
{
    wait_for(&board->late_over, 1);
    return sr_call_return(c, NULL);
}

/* as.late, on worker 0: -1 when it did not run on the progress thread
 * (the driver calls again); else the milliseconds its own call to worker 1
 * took to time out (0.2 s), which only the stand-in can make it do. */
static int fn_late(sr_call *c)
{
    if (!on_progress_thread())
        return sr_call_return(c, sr_int(-1));
    atomic_store_explicit(&sr__test_before_hold_sleep, late_hook, memory_order_release); /* release: the semaphores */
    sr__agent_kick(sr__agent); /* a stand-in asleep already wakes and goes back to sleep through the hook */
    int rc = sem_wait_bounded(&entered);
    sr_future *f = NULL;
    int64_t t0 = now_ns();
    if (!rc && !(rc = sr_rpc_async(1, "as.stall", SR_NOARGS, 0.2, &f)))
        rc = sr_future_add_done_callback(f, late_ended, NULL);
    sem_post(&kicked); /* whatever happened: the hook returns */
    if (!rc)
        rc = sem_wait_bounded(&late_done);
    int64_t ms = (now_ns() - t0) / 1000000;
    int call_rc = !rc ? sr_future_wait(f, NULL) : rc;
    atomic_store_explicit(&sr__test_before_hold_sleep, NULL, memory_order_relaxed); /* relaxed: a stale hook returns at once */
    set_and_wake(&board->late_over, 1);
    sr_future_unref(f);
    if (rc)
        return sr_call_fail(c, rc, "as.late: the stand-in never slept, or the 0.2 s call never ended (%lld ms)",
                            (long long)ms);
    if (call_rc != -ETIMEDOUT)
        return sr_call_fail(c, -EPROTO, "as.late: the call ended with %d, not -ETIMEDOUT", call_rc);
    return sr_call_return(c, sr_int(ms));
}

static void setup(void)
{
    sem_init(&entered, 0, 0);
    sem_init(&kicked, 0, 0);
    sem_init(&late_done, 0, 0);
    sr_register("as.late", fn_late);
    sr_register("as.stall", fn_stall);
    sem_init(&home, 0, 0);
    sem_init(&unblock, 0, 0);
    sem_init(&held, 0, 0);
    sem_init(&expired, 0, 0);
    sr_register("as.hold", fn_hold);
    sr_register("as.expired", fn_expired);
    sr_register("as.where", fn_where);
    sr_register("as.home", fn_home);
    sr_register("as.unblock", fn_unblock);
    sr_register("as.block", fn_block);
    sr_register("as.nest", fn_nest);
    sr_register("as.mul", fn_mul);
}

static void board_setup(void)
{
    board = shared_page(sizeof(*board));
    *board = (struct board){0};
}

static int (*drive)(void); /* the scenario's driver, run on worker 1 (set before the job starts) */
static int away_or_drive(int rank, int world);

/* One scenario's job: worker 0 away, worker 1 running `driver`. */
static void run_away(const char *name, int (*driver)(void))
{
    board_setup();
    drive = driver;
    RUN_JOB(name, 2, .scenario = away_or_drive, .register_fns = setup);
}

/* Worker 0 (with as.hold in flight if hold_call) is away until the driver
 * calls as.home, then checks which thread stood in for its progress
 * thread; worker 1 drives. */
static int away(void)
{
    sr_future *f = NULL;
    /* a deadline set while the progress thread polls: the stand-by, asleep
     * with no timer, learns of it only from the hand-over's poke */
    WCHECK(!hold_late || wait_for(&board->asleep, 1), "worker1 never said worker0's stand-by sleeps");
    if (hold_call) {
        WCHECK(sr_rpc_async(1, "as.hold", SR_NOARGS, hold_timeout_s, &f) == 0, "as.hold: %s", sr_last_error());
        WCHECK(sr_future_add_done_callback(f, hold_ended, NULL) == 0, "callback: %s", sr_last_error());
    }
    WCHECK(sem_wait_bounded(&home) == 0, "worker0: as.home never came: %s", strerror(errno));
    int rc = f ? sr_future_wait(f, NULL) : 0;
    sr_future_unref(f);
    sr_tensor_unref(param);
    param = NULL;
    WCHECK(rc == 0 || (rc == -ETIMEDOUT && hold_timeout_s < 1), "as.hold: %d %s", rc, sr_last_error());
    bool reordering = getenv("SHMRPC_REORDER_SEED") != NULL;
    int standby = threads_named("shmrpc-standby");
    WCHECK(standby == !reordering, "worker0 has %d stand-by threads, %d expected (the reordering mode: %s)", standby,
           !reordering, reordering ? "on" : "off");
    return 0;
}

static int away_or_drive(int rank, int world)
{
    (void)world;
    int rc = 0;
    if (rank == 0) {
        rc = away();
    } else {
        /* worker 0's first call to keep must find as.hold in flight */
        WCHECK(!hold_call || hold_late || wait_for(&board->holding, 1), "as.hold never reached worker1");
        rc = drive();
        int home_rc = sr_rpc_sync(0, "as.home", SR_NOARGS, EVENT_WAIT_S, NULL); /* as.hold still in flight */
        sem_post(&held);
        WCHECK(home_rc == 0, "as.home: %s", sr_last_error());
    }
    sem_destroy(&home);
    sem_destroy(&unblock);
    sem_destroy(&held);
    sem_destroy(&expired);
    return rc;
}

/* ---- a plain call runs on the progress thread ------------------------------ */

static int drive_where(void)
{
    bool there = false;
    for (int i = 0; i < ROUNDS && !there; i++) {
        sr_value *v = NULL;
        WCHECK(sr_rpc_sync(0, "as.where", SR_NOARGS, EVENT_WAIT_S, &v) == 0, "as.where: %s", sr_last_error());
        there = sr_value_bool(v);
        sr_value_unref(v);
    }
    WCHECK(there, "none of %d plain calls to a worker whose main thread is away ran on its progress thread "
                  "(all went to executors)", ROUNDS);
    return 0;
}

Test(away_serve, progress_thread_runs_plain_calls)
{
    run_away("as_where", drive_where);
}

/* ---- a function that blocks on the progress thread holds up nothing --------- */

static const char *blocking_fn; /* "as.block" or "as.nest" */
static int want_landed;         /* rounds that must land on the progress thread */

/* One round: start the blocking function; if it landed on the progress
 * thread, calls made meanwhile must be answered. Then as.unblock (a plain
 * call, run by an executor while the function blocks) ends it. *landed:
 * whether it ran on the progress thread. */
static int block_round(uint32_t round, bool *landed)
{
    sr_value *r = sr_int(round);
    sr_future *f = NULL;
    WCHECK(sr_rpc_async(0, blocking_fn, SR_ARGS(r), EVENT_WAIT_S, &f) == 0, "%s: %s", blocking_fn, sr_last_error());
    sr_value_unref(r);
    WCHECK(wait_for(&board->started, round), "round %u: %s never started on worker0", round, blocking_fn);
    *landed = atomic_load(&board->on_progress) == round;
    for (int i = 0; *landed && i < CALLS_MEANWHILE; i++)
        WCHECK(sr_rpc_sync(0, "noop", SR_NOARGS, EVENT_WAIT_S, NULL) == 0,
               "round %u: call %d while %s blocked worker0's progress thread: %s", round, i, blocking_fn,
               sr_last_error());
    WCHECK(sr_rpc_sync(0, "as.unblock", SR_NOARGS, EVENT_WAIT_S, NULL) == 0,
           "round %u: as.unblock while %s blocked: %s", round, blocking_fn, sr_last_error());
    int rc = sr_future_wait(f, NULL);
    WCHECK(rc == 0, "round %u: %s: %s", round, blocking_fn, sr_last_error());
    sr_future_unref(f);
    return 0;
}

static int drive_block(void)
{
    int landed = 0;
    for (uint32_t round = 1; round <= (uint32_t)(ROUNDS * want_landed) && landed < want_landed; round++) {
        bool here = false;
        WCHECK(block_round(round, &here) == 0, "see above");
        landed += here;
    }
    WCHECK(landed == want_landed, "in %d rounds %s ran on worker0's progress thread %d times, not %d",
           ROUNDS * want_landed, blocking_fn, landed, want_landed);
    return 0;
}

Test(away_serve, a_blocking_call_holds_up_nothing)
{
    blocking_fn = "as.block";
    want_landed = 1;
    run_away("as_block", drive_block);
}

Test(away_serve, a_blocking_call_with_a_call_of_its_own_in_flight)
{
    blocking_fn = "as.block";
    want_landed = 1;
    hold_call = true;
    run_away("as_held", drive_block);
}

/* The driver of the deadline scenario: as.expired runs on worker 0's
 * progress thread (kept: worker 0 is away) until worker 0's own call has
 * timed out, which only the stand-by's timer (or a stand-in job's) can see. */
static int drive_expired(void)
{
    sr_value *v = NULL;
    WCHECK(sr_rpc_sync(0, "as.where", SR_NOARGS, EVENT_WAIT_S, NULL) == 0, "as.where: %s", sr_last_error());
    set_and_wake(&board->asleep, 1);
    WCHECK(wait_for(&board->holding, 1), "as.hold never reached worker1");
    WCHECK(sr_rpc_sync(0, "as.expired", SR_NOARGS, EVENT_WAIT_S, &v) == 0, "as.expired: %s", sr_last_error());
    int64_t rc = sr_value_int(v);
    sr_value_unref(v);
    WCHECK(rc == -ETIMEDOUT, "worker0's as.hold call ended with %lld, not -ETIMEDOUT", (long long)rc);
    return 0;
}

Test(away_serve, a_deadline_passes_while_the_progress_thread_blocks)
{
    hold_call = true;
    hold_timeout_s = 0.3;
    hold_late = true;
    run_away("as_expired", drive_expired);
}

/* The driver of the late-timer scenario: as.late until it runs on worker
 * 0's progress thread; its call must time out in 0.2 s, well under the
 * bound (the stand-in slept past it, to no deadline at all, before). */
static int drive_late(void)
{
    int64_t ms = -1;
    for (int i = 0; i < ROUNDS && ms < 0; i++) {
        sr_value *v = NULL;
        WCHECK(sr_rpc_sync(0, "as.late", SR_NOARGS, 2 * EVENT_WAIT_S, &v) == 0, "as.late: %s", sr_last_error());
        ms = sr_value_int(v);
        sr_value_unref(v);
    }
    WCHECK(ms >= 0, "as.late never ran on worker0's progress thread in %d calls", ROUNDS);
    WCHECK(ms < EVENT_WAIT_S * 1000 / 2, "worker0's 0.2 s call took %lld ms to time out", (long long)ms);
    return 0;
}

/* A timer set while the token's holder falls asleep (its poke lands
 * before the holder announces its sleep) still wakes it: hold_busy
 * looks for a kick (timer_gen) after D2 (lib/rpc/wait.c). The holder is a
 * stand-in job, which only the reordering mode keeps (the stand-by has its
 * own arming), so the scenario runs in that mode whichever variant runs
 * it; a hook holds the stand-in between reading its timers and sleeping
 * while as.late sets the earlier one. Without the re-check the stand-in
 * slept with no deadline and the call never timed out (a hang of
 * away_serve-reorder seen about once in 40 runs under ASan). */
Test(away_serve, a_timer_set_as_the_holder_falls_asleep_wakes_it)
{
    if (!getenv("SHMRPC_REORDER_SEED"))
        cr_assert(!setenv("SHMRPC_REORDER_SEED", "3", 1) && !setenv("SHMRPC_REORDER_MAX_US", "200", 1), "setenv");
    run_away("as_late", drive_late);
}

Test(away_serve, a_nested_call_then_a_block)
{
    blocking_fn = "as.nest";
    want_landed = NEST_LANDED;
    run_away("as_nest", drive_block);
}

/* ---- a backward pass's part runs on the progress thread -------------------- */

/* One backward pass through as.mul on worker 0: x's gradient is the
 * parameter (ones); *here: whether worker 0 ran its part on its progress
 * thread. */
static int backward_round(uint32_t round, bool *here)
{
    int64_t ctx;
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "context: %s", sr_last_error());
    sr_tensor *x = sr_full(SR_F32, 1, (const int64_t[]){4}, 2.0, SR_REQUIRES_GRAD), *loss = NULL, *g = NULL;
    sr_value *xv = x ? sr_value_from_tensor(x) : NULL, *yv = NULL;
    uint32_t before = atomic_load(&board->hook_on_progress);
    int rc = xv ? sr_rpc_sync(0, "as.mul", SR_ARGS(xv), EVENT_WAIT_S, &yv) : -ENOMEM;
    if (!rc)
        rc = (loss = sr_sum(sr_value_tensor(yv))) ? sr_dist_autograd_backward(ctx, &loss, 1, false) : -ENOMEM;
    if (!rc)
        rc = sr_dist_autograd_get_gradient(ctx, x, &g);
    sr_tensor *gsum = g ? sr_sum(g) : NULL;
    bool ok = !rc && gsum && sr_tensor_item(gsum) == 4.0;
    sr_tensor_unref(gsum);
    WCHECK(ok, "round %u: the backward through worker0 (%d): %s", round, rc,
           rc ? sr_last_error() : "x's gradient is not ones");
    WCHECK(atomic_load(&board->hooked) == round, "round %u: worker0's hook ran %u times in all", round,
           atomic_load(&board->hooked));
    *here = atomic_load(&board->hook_on_progress) != before;
    sr_tensor_unref(g);
    sr_tensor_unref(loss);
    sr_value_unref(yv);
    sr_value_unref(xv);
    sr_tensor_unref(x);
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "context end: %s", sr_last_error());
    return 0;
}

static int drive_backward(void)
{
    bool reordering = getenv("SHMRPC_REORDER_SEED") != NULL, here = false;
    for (uint32_t round = 1; round <= ROUNDS && !here; round++)
        WCHECK(backward_round(round, &here) == 0, "see above");
    WCHECK(here || reordering, "none of %d backward passes through worker0, whose main thread is away, ran its "
                               "part on its progress thread (all went to executors)", ROUNDS);
    return 0;
}

Test(away_serve, a_backward_pass_runs_on_the_progress_thread)
{
    run_away("as_backward", drive_backward);
}
