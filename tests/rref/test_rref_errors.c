/* SPDX-License-Identifier: MIT */
/* RRef timeouts and errors: a remote() whose creation times out (raised on
 * the RRef's next use as "RRef creation ..."), a to_here() timeout, local_value
 * on a user, failing and unknown functions, an owner that dies, use after
 * shutdown, and the leak check of graceful shutdown. The 4-worker jobs also
 * run under the reordering mode (tests/meson.build). */
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "module.h" /* the RPC seam: sr__future_wait_until */
#include "rref_internal.h"
#include "rref_fns.h"
#include "segment.h"
#include "waiter.h"

#define EVENT_WAIT_S 30
#include "shared_event.h"

LEAK_CHECKED_SUITE(rref_errors);

#define ERR_JOB(name, sc)                                                                         \
    do {                                                                                          \
        rref_scenario = sc;                                                                       \
        RUN_JOB(name, WORLD, .scenario = fail_fast, .register_fns = register_rref_fns,             \
                .shutdown_timeout = 60);                                                          \
    } while (0)

/* Every counter but the tombstones is zero on every worker: a duplicate
 * delete of a timed-out remote() may leave a tombstone that lives until
 * shutdown (docs/RREF.md). */
static int expect_no_rrefs_left(const char *when)
{
    for (int w = 0; w < sr_world_size(); w++) {
        sr_value *v = NULL;
        WCHECK(sr_rpc_sync(w, "counters", SR_NOARGS, WAIT_S, &v) == 0, "counters: %s", sr_last_error());
        for (size_t i = 0; i < 9; i++)
            WCHECK(i == 7 || sr_value_int(sr_value_list_at(v, i)) == 0, "%s: worker%d counter %zu is %lld", when, w,
                   i, (long long)sr_value_int(sr_value_list_at(v, i)));
        sr_value_unref(v);
    }
    return 0;
}

/* remote() creation timeouts, to another worker and to self: the error is
 * stored on the RRef and raised by its next use (to_here, a fork, a proxy),
 * and the RRef is still deleted properly on its owner. */
static int sc_creation_timeout(int rank, int world)
{
    if (rank == 0) {
        sr_value *ms = sr_int(300), *v = NULL;
        sr_rref *r = NULL, *self = NULL;
        WCHECK(sr_remote(1, "sleep_ms", SR_ARGS(ms), 0.05, &r) == 0, "remote: %s", sr_last_error());
        sr_future *f = NULL;
        WCHECK(sr_rref_confirmation(r, &f) == 0, "confirmation");
        WEXPECT_ERR(sr_future_wait(f, NULL), -ETIMEDOUT, "RRef creation via rpc.remote() timed out");
        sr_future_unref(f);
        WCHECK(!sr_rref_confirmed_by_owner(r), "a timed-out RRef is not confirmed");
        WEXPECT_ERR(sr_rref_to_here(r, WAIT_S, &v), -ETIMEDOUT, "RRef creation");
        sr_value *rv = sr_value_from_rref(r);
        WEXPECT_ERR(sr_rpc_sync(2, "hold", SR_ARGS(rv), WAIT_S, &v), -ETIMEDOUT, "RRef creation");
        WEXPECT_ERR(sr_rref_rpc_sync(r, "sleep_ms", SR_NOARGS, WAIT_S, &v), -ETIMEDOUT, "RRef creation");
        sr_value_unref(rv);
        sr_rref_unref(r);
        /* To self: the OwnerRRef holds the creation error. */
        WCHECK(sr_remote(0, "sleep_ms", SR_ARGS(ms), 0.05, &self) == 0, "remote to self: %s", sr_last_error());
        WEXPECT_ERR(sr_rref_to_here(self, WAIT_S, &v), -ETIMEDOUT, "RRef creation via rpc.remote() timed out");
        WEXPECT_ERR(sr_rref_local_value(self, &v), -ETIMEDOUT, "RRef creation");
        sr_rref_unref(self);
        sr_value_unref(ms);
    }
    /* The slow functions finish (their late answers are dropped), every
     * delete is applied, and nothing is left anywhere. */
    if (barrier())
        return 1;
    sr_value *ms = sr_int(1);
    for (int w = 0; w < world; w++) /* runs after each worker's earlier sleep_ms: one executor */
        WCHECK(sr_rpc_sync(w, "sleep_ms", SR_ARGS(ms), WAIT_S, NULL) == 0, "sleep_ms: %s", sr_last_error());
    sr_value_unref(ms);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    if (barrier())
        return 1;
    return rank == 0 ? expect_no_rrefs_left("after the timed-out remotes") : 0;
}

Test(rref_errors, remote_creation_timeout_is_raised_on_next_use, .timeout = 120)
{
    rref_scenario = sc_creation_timeout;
    RUN_JOB("rreftmo", WORLD, .scenario = fail_fast, .register_fns = register_rref_fns, .shutdown_timeout = 60,
            .opts = {.num_worker_threads = 1});
}

/* Many remote()s that time out at about the time they are created, dropped
 * at once: a delete may overtake its REMOTE_CALL (more so under the
 * reordering mode), which the owner's tombstone turns into a removal instead
 * of a leak. */
static int sc_racing_timeouts(int rank, int world)
{
    enum { N = 40 };
    unsigned seed = 99u + (unsigned)rank;
    for (int i = 0; i < N; i++) {
        sr_value *ms = sr_int(rand_r(&seed) % 3);
        sr_rref *r = NULL;
        WCHECK(sr_remote((rank + 1 + i % (world - 1)) % world, "sleep_ms", SR_ARGS(ms), 0.001, &r) == 0, "remote: %s",
               sr_last_error());
        sr_value_unref(ms);
        if (i % 2) { /* wait for its fate first: created or timed out */
            sr_future *f = NULL;
            sr_rref_confirmation(r, &f);
            sr_future_wait(f, NULL);
            sr_future_unref(f);
        }
        sr_rref_unref(r);
    }
    if (barrier())
        return 1;
    sr_value *ms = sr_int(1);
    for (int w = 0; w < world; w++) /* every worker's queued sleeps are done */
        WCHECK(sr_rpc_sync(w, "sleep_ms", SR_ARGS(ms), WAIT_S, NULL) == 0, "sleep_ms: %s", sr_last_error());
    sr_value_unref(ms);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    if (barrier())
        return 1;
    return rank == 0 ? expect_no_rrefs_left("after racing timeouts") : 0;
}

Test(rref_errors, deletes_racing_timed_out_creations_leave_nothing, .timeout = 120)
{
    rref_scenario = sc_racing_timeouts;
    RUN_JOB("rrefrace", WORLD, .scenario = fail_fast, .register_fns = register_rref_fns, .shutdown_timeout = 60,
            .opts = {.num_worker_threads = 1});
}

/* to_here() with a timeout shorter than the creation, then without; the
 * local_value error names both workers; a failing or unknown function's
 * error is the RRef's value. */
static int sc_errors(int rank, int world)
{
    (void)world;
    if (rank != 2)
        return 0;
    sr_value *ms = sr_int(200), *v = NULL, *three = sr_int(3);
    sr_rref *r = NULL;
    WCHECK(sr_remote(3, "sleep_ms", SR_ARGS(ms), SR_TIMEOUT_NONE, &r) == 0, "remote: %s", sr_last_error());
    WEXPECT_ERR(sr_rref_to_here(r, 0.02, &v), -ETIMEDOUT, "RPC ran for more than set timeout (20 ms)");
    WCHECK(sr_rref_to_here(r, SR_TIMEOUT_NONE, &v) == 0 && sr_value_int(v) == 200, "to_here without timeout: %s", sr_last_error());
    sr_value_unref(v);
    char want[256], s[96];
    snprintf(want, sizeof(want),
             "For %s, can't call localValue() on user WorkerInfo(id=2, name=worker2). "
             "Call it on owner WorkerInfo(id=3, name=worker3)",
             sr_rref_str(r, s, sizeof(s)));
    WEXPECT_ERR(sr_rref_local_value(r, &v), -EINVAL, want);
    sr_rref_unref(r);
    WCHECK(sr_remote(1, "fail", SR_ARGS(three), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    WCHECK(wait_confirmed(r) == 0, "a failing function still creates its RRef");
    WEXPECT_ERR(sr_rref_to_here(r, WAIT_S, &v), -SR_EREMOTE, "Error on Node 1: in 'fail': intentional failure 3");
    WEXPECT_ERR(sr_rref_to_here(r, WAIT_S, &v), -SR_EREMOTE, "Error on Node 1: in 'fail': intentional failure 3");
    sr_rref_unref(r);
    WCHECK(sr_remote(0, "no_such_fn", SR_ARGS(three), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    WEXPECT_ERR(sr_rref_to_here(r, WAIT_S, &v), -ENOENT, "function 'no_such_fn' is not registered on worker0");
    sr_rref_unref(r);
    WEXPECT_ERR(sr_rref_to_here(NULL, WAIT_S, &v), -EINVAL, "the RRef is NULL");
    WEXPECT_ERR(sr_remote(9, "make_list", SR_ARGS(three), WAIT_S, &r), -EINVAL, "out of range");
    sr_value_unref(ms);
    sr_value_unref(three);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    return 0;
}

Test(rref_errors, to_here_timeout_local_value_on_user_and_failing_functions, .timeout = 120)
{
    ERR_JOB("rreferr", sc_errors);
}

/* ---- jobs outside the harness ---- */

static int fn_exit_now(sr_call *c)
{
    (void)c;
    _exit(0); /* leaves without detaching: peers see a death */
}

/* An RRef whose owner died reports that, and the survivor can still shut
 * down locally. */
static int owner_dies_worker(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    register_rref_fns();
    sr_register("exit_now", fn_exit_now);
    WCHECK(sr_init(NULL) == 0, "init: %s", sr_last_error());
    if (rank == 1) {
        sr_shutdown(true, 60); /* serves until exit_now ends the process */
        return 1;
    }
    sr_value *n = sr_int(8), *v = NULL;
    sr_rref *r = NULL;
    WCHECK(sr_remote(1, "make_list", SR_ARGS(n), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    if (expect_pair(r, 8))
        return 1;
    WEXPECT_ERR(sr_rpc_sync(1, "exit_now", SR_NOARGS, WAIT_S, NULL), -EPIPE, "the worker exited with status 0");
    WEXPECT_ERR(sr_rref_to_here(r, WAIT_S, &v), -SR_EOWNERLOST, "the owner worker1 (rank 1, generation 0)");
    sr_rref_unref(r);
    sr_value_unref(n);
    sr_shutdown(false, 0);
    return 0;
}

Test(rref_errors, rref_whose_owner_died_reports_it, .timeout = 60)
{
    sr_spawn_opts o = {.name_prefix = test_ns("rrefdead"), .shm_size = 128 << 20};
    cr_assert_eq(sr_spawn(2, owner_dies_worker, NULL, &o), 0, "%s", sr_last_error());
}

/* A user RRef sent to a worker that dies before accepting the child: the
 * parent's hold (G2) on it goes with the death, so sr_rref_wait_idle ends at
 * once and names the dead worker. Before, the parent's pending child waited
 * for a CHILD_ACCEPT that never comes: wait_idle timed out ("1 pending
 * children"), and graceful shutdown hung until its bound.
 *
 * Deterministic: the owner (rank 1) is stopped (SIGSTOP) while rank 0 sends
 * the RRef to rank 2, makes rank 2 exit, and waits for idleness, so nothing
 * the owner could say (an answer to rank 2, or to a local release of the
 * message) can release the parent: only rank 2's death can. The owner goes
 * on (SIGCONT) after that wait. */
static bool process_stopped(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int64_t until = sr__now_ns() + (int64_t)(WAIT_S * 1e9);
    do {
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = '\0';
        const char *st = strrchr(buf, ')'); /* "pid (comm) S ..." */
        if (st && st[1] == ' ' && st[2] == 'T')
            return true;
        sched_yield();
    } while (sr__now_ns() < until);
    return false;
}

/* The pid of `rank`, from the job's worker table, through a mapping of the
 * segment of our own (the launch fd stays open while the job runs); -1
 * with the error in sr_last_error(). */
static pid_t worker_pid(int rank)
{
    struct sr_launch_env env;
    sr_segment seg;
    if (sr__launch_env_get(&env) || sr__segment_attach(env.fd, &seg))
        return -1;
    pid_t pid = sr__seg_worker(&seg, rank)->pid;
    sr__segment_detach(&seg, false);
    return pid;
}

static int child_dies_parent(void)
{
    sr_value *n = sr_int(4), *v = NULL;
    sr_rref *r = NULL;
    sr_future *send = NULL;
    WCHECK(sr_remote(1, "make_list", SR_ARGS(n), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    if (expect_pair(r, 4)) /* confirmed: rank 0 is a user of rank 1's RRef */
        return 1;
    pid_t owner = worker_pid(1);
    WCHECK(owner > 0, "rank 1's pid: %s", sr_last_error());
    WCHECK(kill(owner, SIGSTOP) == 0 && process_stopped(owner), "rank 1 (pid %d) did not stop", (int)owner);
    sr_value *rv = sr_value_from_rref(r);
    /* rank 2 decodes the RRef (unannounced: its call has not ended) and
     * runs exit_now (a user-to-user fork does not wait for the owner) */
    int sent = sr_rpc_async(2, "exit_now", SR_ARGS(rv), WAIT_S, &send);
    sr_value_unref(rv);
    sr_value *out = NULL;
    int died = sent ? 0 : sr_future_wait(send, &out);
    /* Still stopped: only rank 2's death can release the parent now */
    int64_t t0 = sr__now_ns();
    int rc = died ? sr_rref_wait_idle(WAIT_S / 3) : 0;
    double took = (double)(sr__now_ns() - t0) / 1e9;
    WCHECK(kill(owner, SIGCONT) == 0, "SIGCONT to rank 1: %s", strerror(errno));
    WCHECK(sent == 0, "send: %s", sr_last_error());
    WCHECK(died != 0, "exit_now on rank 2 returned");
    WEXPECT_ERR(rc, -EPIPE, "worker2 died before the RRef child fork");
    WCHECK(took < WAIT_S / 6, "wait_idle took %.1f s", took);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "the death is reported once: %s", sr_last_error());
    sr_future_unref(send);
    sr_rref_unref(r);
    sr_value_unref(n);
    /* rank 1 ends too (its graceful shutdown may already have given up on
     * rank 2, so the answer does not matter) */
    sr_rpc_sync(1, "exit_now", SR_NOARGS, WAIT_S, &v);
    sr_value_unref(v);
    sr_shutdown(false, 0);
    return 0;
}

static int child_dies_worker(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    register_rref_fns();
    sr_register("exit_now", fn_exit_now);
    WCHECK(sr_init(NULL) == 0, "init: %s", sr_last_error());
    if (rank == 2) {
        sr_shutdown(true, 60); /* serves until exit_now ends the process */
        return 1;
    }
    if (rank == 1) {
        sr_shutdown(true, 60); /* serves until exit_now, or fails on rank 2's death */
        return 0;
    }
    return child_dies_parent();
}

Test(rref_errors, rref_child_whose_worker_died_releases_its_parent, .timeout = 60)
{
    sr_spawn_opts o = {.name_prefix = test_ns("rrefchild"), .shm_size = 192 << 20};
    cr_assert_eq(sr_spawn(3, child_dies_worker, NULL, &o), 0, "%s", sr_last_error());
}

/* The owner dies between a call's answer and the fork request that its
 * end sends: a user->user fork kept by its function is told to the owner
 * only after the answer (fork.c, unannounced users). rank 2's async function
 * keep_until_told keeps the RRef and answers only when told; meanwhile the
 * owner (rank 1) exits. The answer then comes, the fork request finds the
 * owner dead, and the kept RRef's confirmation fails naming it; rank 2 is
 * idle (nothing waits for the dead owner), and rank 0's hold on the parent
 * went with the owner's death. Before, the fork request left when the
 * arguments were decoded, the live owner confirmed it, and the
 * confirmation succeeded. */
static sr_future *told; /* rank 2: completes keep_until_told's call */

static int fn_keep_until_told(sr_call *c, sr_future **out)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    if (!r || held_add(r))
        return sr_call_fail(c, -EINVAL, "keep_until_told: not an RRef, or no memory");
    *out = sr_future_ref(told);
    return 0;
}

static int fn_tell(sr_call *c)
{
    sr_future_set_result(told, NULL);
    return sr_call_return(c, NULL);
}

/* held_confirmation(i): the confirmation of held RRef i, waited for:
 * [its error code, the error text] */
static int fn_held_confirmation(sr_call *c)
{
    sr_rref *r = held_at((size_t)sr_value_int(sr_call_arg(c, 0)));
    sr_future *f = NULL;
    int rc = r ? sr_rref_confirmation(r, &f) : -EINVAL;
    if (!rc)
        rc = sr__future_wait_until(f, sr__now_ns() + (int64_t)(WAIT_S * 1e9));
    if (!rc)
        rc = sr_future_value(f, NULL);
    sr_value *items[2] = {sr_int(rc), sr_str(rc ? sr_last_error() : "")};
    sr_future_unref(f);
    sr_rref_unref(r);
    sr_value *l = sr_list(2, items);
    sr_value_unref(items[0]);
    sr_value_unref(items[1]);
    return sr_call_return(c, l);
}

static sr_future *all_done; /* ranks 1, 2: completed by rank 0's "done" */

static int fn_all_done(sr_call *c)
{
    sr_future_set_result(all_done, NULL);
    return sr_call_return(c, NULL);
}

static int owner_dies_before_announce(void)
{
    sr_value *n = sr_int(3), *v = NULL, *zero = sr_int(0);
    sr_rref *r = NULL;
    sr_future *kept = NULL;
    WCHECK(sr_remote(1, "make_list", SR_ARGS(n), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    if (expect_pair(r, 3))
        return 1;
    sr_value *rv = sr_value_from_rref(r);
    WCHECK(sr_rpc_async(2, "keep_until_told", SR_ARGS(rv), WAIT_S, &kept) == 0, "keep: %s", sr_last_error());
    sr_value_unref(rv);
    /* Until keep_until_told's arguments were decoded (the reordering mode
     * may deliver counters first): then its fork is pending, unannounced. */
    int64_t pending = 0, unacked = 0, until = sr__now_ns() + (int64_t)(WAIT_S * 1e9);
    while (pending == 0 && sr__now_ns() < until) {
        WCHECK(sr_rpc_sync(2, "counters", SR_NOARGS, WAIT_S, &v) == 0, "counters: %s", sr_last_error());
        pending = sr_value_int(sr_value_list_at(v, 3));
        unacked = sr_value_int(sr_value_list_at(v, 6));
        sr_value_unref(v);
    }
    WCHECK(pending == 1 && unacked == 0,
           "worker2: %lld pending users and %lld unacknowledged messages, want 1 and 0 (nothing asked yet)",
           (long long)pending, (long long)unacked);
    WEXPECT_ERR(sr_rpc_sync(1, "exit_now", SR_NOARGS, WAIT_S, NULL), -EPIPE, "the worker exited with status 0");
    WCHECK(sr_rpc_sync(2, "tell", SR_NOARGS, WAIT_S, NULL) == 0, "tell: %s", sr_last_error());
    WCHECK(sr_future_wait(kept, NULL) == 0, "the call that kept the RRef failed: %s", sr_last_error());
    sr_future_unref(kept);
    WCHECK(sr_rpc_sync(2, "held_confirmation", SR_ARGS(zero), WAIT_S, &v) == 0, "held_confirmation: %s",
           sr_last_error());
    int64_t code = sr_value_int(sr_value_list_at(v, 0));
    char text[512];
    const char *t = sr_value_str(sr_value_list_at(v, 1));
    snprintf(text, sizeof(text), "%s", t ? t : "");
    sr_value_unref(v);
    WCHECK(code == -SR_EOWNERLOST && strstr(text, "the owner worker1 (rank 1, generation 0)"),
           "the kept RRef's confirmation gave %lld \"%s\", want -SR_EOWNERLOST naming worker1", (long long)code, text);
    sr_value *seed = sr_int(1);
    WCHECK(sr_rpc_sync(2, "drop_held", SR_ARGS(seed), WAIT_S, &v) == 0, "worker2 not idle: %s", sr_last_error());
    sr_value_unref(v);
    sr_value_unref(seed);
    int rc = sr_rref_wait_idle(WAIT_S); /* -EPIPE once if the death released the parent's hold */
    WCHECK(rc == 0 || rc == -EPIPE, "worker0 not idle: %s", sr_last_error());
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "worker0 still not idle: %s", sr_last_error());
    sr_rref_debug_info d;
    WCHECK(sr_rref_debug_info_get(&d) == 0 && d.num_pending_children == 0, "worker0 holds pending children");
    sr_rref_unref(r);
    sr_value_unref(n);
    sr_value_unref(zero);
    sr_rpc_sync(2, "all_done", SR_NOARGS, WAIT_S, NULL);
    sr_shutdown(false, 0);
    return 0;
}

static int announce_dead_worker(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    register_rref_fns();
    sr_register("exit_now", fn_exit_now);
    sr_register_async("keep_until_told", fn_keep_until_told);
    sr_register("tell", fn_tell);
    sr_register("held_confirmation", fn_held_confirmation);
    sr_register("all_done", fn_all_done);
    told = sr_future_new();
    all_done = sr_future_new();
    WCHECK(told && all_done && sr_init(NULL) == 0, "init: %s", sr_last_error());
    if (rank == 0)
        return owner_dies_before_announce();
    if (rank == 1) {
        sr_shutdown(true, 60); /* serves until exit_now ends the process */
        return 1;
    }
    int rc = sr__future_wait_until(all_done, sr__now_ns() + (int64_t)(WAIT_S * 1e9));
    held_drop_all(0);
    sr_shutdown(false, 0);
    return rc ? 1 : 0;
}

Test(rref_errors, owner_dying_between_the_answer_and_the_fork_request_fails_the_confirmation, .timeout = 60)
{
    sr_spawn_opts o = {.name_prefix = test_ns("rrefannounce"), .shm_size = 192 << 20};
    cr_assert_eq(sr_spawn(3, announce_dead_worker, NULL, &o), 0, "%s", sr_last_error());
}

/* After shutdown an RRef is a clear error to use (but may still be unreffed).
 * The worker keeps its RRefs and values across sr_shutdown on purpose, so
 * the tensor and value leak check only logs them. */
static int after_shutdown_worker(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    register_rref_fns();
    sr_set_ignore_leak(true);
    WCHECK(sr_init(NULL) == 0, "init: %s", sr_last_error());
    sr_value *n = sr_int(1), *v = NULL;
    sr_rref *user = NULL, *own = NULL;
    WCHECK(sr_remote(1 - rank, "make_list", SR_ARGS(n), WAIT_S, &user) == 0, "remote: %s", sr_last_error());
    WCHECK(sr_rref_create(n, &own) == 0, "create: %s", sr_last_error());
    if (expect_pair(user, 1))
        return 1;
    WCHECK(sr_shutdown(true, 30) == 0, "shutdown: %s", sr_last_error());
    WEXPECT_ERR(sr_rref_to_here(user, WAIT_S, &v), -SR_ESHUTDOWN, "shut down");
    WEXPECT_ERR(sr_rref_local_value(own, &v), -SR_ESHUTDOWN, "shut down");
    WEXPECT_ERR(sr_remote(0, "make_list", SR_ARGS(n), WAIT_S, &user), -SR_ESHUTDOWN, "not been initialized");
    sr_rref_debug_info d;
    WEXPECT_ERR(sr_rref_debug_info_get(&d), -SR_ESHUTDOWN, "not been initialized");
    WEXPECT_ERR(sr_rref_create(n, &own), -SR_ESHUTDOWN, "not been initialized");
    sr_rref_unref(user);
    sr_rref_unref(own);
    sr_value_unref(n);
    return 0;
}

Test(rref_errors, rref_use_after_shutdown_is_a_clear_error, .timeout = 60)
{
    sr_spawn_opts o = {.name_prefix = test_ns("rrefafter"), .shm_size = 128 << 20};
    cr_assert_eq(sr_spawn(2, after_shutdown_worker, NULL, &o), 0, "%s", sr_last_error());
}

/* The leak check: a fork the owner knows of that no user will ever delete
 * (forged here through the internal fork table) fails graceful shutdown with
 * one "Leaking RRef" line per leak; with sr_rref_set_ignore_leak(true) it is only logged. */
static int leak_worker(int rank, int world, void *arg)
{
    (void)world;
    bool ignore = arg != NULL;
    sr_rref_set_ignore_leak(ignore);
    WCHECK(sr_init(NULL) == 0, "init: %s", sr_last_error());
    if (rank == 1) {
        enum sr_fork_add res;
        sr__rref_lock();
        int rc = sr__forks_add(&sr__rref_ctx.forks, UINT64_C(0x0001000000000000), UINT64_C(0x0000000000000063), -1, 0, &res);
        sr__rref_unlock();
        WCHECK(rc == 0, "forging a fork");
    }
    int rc = sr_shutdown(true, 30);
    if (rank == 1 && !ignore)
        WEXPECT_ERR(rc, -EBUSY, "Leaking RRef (1,0) with fork id (0,99)");
    else
        WCHECK(rc == 0, "rank %d: shutdown: %s", rank, sr_last_error());
    return 0;
}

Test(rref_errors, leak_check_names_each_leaking_rref, .timeout = 60)
{
    sr_spawn_opts o = {.name_prefix = test_ns("rrefleak"), .shm_size = 128 << 20};
    cr_assert_eq(sr_spawn(2, leak_worker, NULL, &o), 0, "%s", sr_last_error());
    cr_assert_eq(sr_spawn(2, leak_worker, (void *)1, &o), 0, "sr_rref_set_ignore_leak: %s", sr_last_error());
}

/* A user forked onwards while itself unannounced (found in review). Rank 0
 * (Z) passes its RRef to rank 2 (A), where it arrives unannounced (R); A's
 * function passes R on to Z, where keep_and_signal keeps it (C, unannounced
 * too, its call still running), and A dies. Z's hold on R goes with A; Z
 * drops its RRef; then C's call ends and C asks the owner. Before the fix
 * the owner had never heard of R, so Z's delete erased the value and C's
 * fork request created an empty record: C was "confirmed" and to_here never
 * got a value. Now R is announced before it is forked onwards, so the owner
 * counts it and keeps the value. */
struct relay_events {
    _Atomic uint32_t kept; /* Z kept C: A may die */
};
static struct relay_events *rev;

static int fn_keep_and_signal(sr_call *c, sr_future **out)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    if (!r || held_add(r))
        return sr_call_fail(c, -EINVAL, "keep_and_signal: not an RRef, or no memory");
    *out = sr_future_ref(told);
    set_and_wake(&rev->kept, 1);
    return 0;
}

static int fn_relay_and_die(sr_call *c)
{
    sr_value *a0 = sr_call_arg(c, 0);
    sr_future *f = NULL;
    if (sr_rpc_async(0, "keep_and_signal", SR_ARGS(a0), WAIT_S, &f) || !wait_for(&rev->kept, 1))
        _exit(3); /* the test fails: the job's report names rank 2 */
    /* Whatever this worker told the owner has arrived (acknowledged): a
     * message still in a dying sender's queue is lost with it, which the
     * reordering mode, holding messages up to 2 ms, would otherwise cause. */
    sr_rref_debug_info d = {0};
    int64_t until = sr__now_ns() + (int64_t)(WAIT_S * 1e9);
    while (sr_rref_debug_info_get(&d) == 0 && d.num_pending_futures && sr__now_ns() < until)
        sched_yield();
    _exit(0); /* leaves without detaching, its call to Z still running */
}

static int relay_dies_driver(void)
{
    sr_value *n = sr_int(3), *v = NULL;
    sr_rref *r = NULL;
    sr_future *relay = NULL;
    WCHECK(sr_remote(1, "make_list", SR_ARGS(n), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    if (expect_pair(r, 3))
        return 1;
    sr_value *rv = sr_value_from_rref(r);
    WCHECK(sr_rpc_async(2, "relay_and_die", SR_ARGS(rv), WAIT_S, &relay) == 0, "relay: %s", sr_last_error());
    sr_value_unref(rv);
    WCHECK(sr_future_wait(relay, NULL) == -EPIPE, "the relay's call should fail with its death: %s", sr_last_error());
    sr_future_unref(relay);
    /* Until the death released the hold on R (the peer-death hook). Not
     * sr_rref_wait_idle: it would announce C, and the owner count it. */
    sr_rref_debug_info d = {0};
    int64_t until = sr__now_ns() + (int64_t)(WAIT_S * 1e9);
    while (sr_rref_debug_info_get(&d) == 0 && d.num_pending_children && sr__now_ns() < until)
        sched_yield();
    WCHECK(d.num_pending_children == 0, "worker0 still holds R %g s after its worker died", (double)WAIT_S);
    sr_rref_unref(r); /* Z's own fork: its delete goes to the owner now */
    sr_rref *c = held_at(0);
    WCHECK(c, "C was not kept");
    sr_future_set_result(told, NULL); /* keep_and_signal's call ends: C asks the owner */
    int rc = sr_rref_to_here(c, 10.0, &v);
    WCHECK(rc == 0 && sr_value_list_len(v) == 2 && sr_value_int(sr_value_list_at(v, 0)) == 3,
           "to_here of the grandchild after its relay died: %d: %s", rc, rc ? sr_last_error() : "wrong value");
    sr_value_unref(v);
    sr_rref_unref(c);
    held_drop_all(0);
    sr_value_unref(n);
    sr_rpc_sync(1, "all_done", SR_NOARGS, WAIT_S, NULL);
    sr_shutdown(false, 0);
    return 0;
}

static int relay_dies_worker(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    register_rref_fns();
    sr_register("relay_and_die", fn_relay_and_die);
    sr_register_async("keep_and_signal", fn_keep_and_signal);
    sr_register("all_done", fn_all_done);
    told = sr_future_new();
    all_done = sr_future_new();
    WCHECK(told && all_done && sr_init(NULL) == 0, "init: %s", sr_last_error());
    if (rank == 0)
        return relay_dies_driver();
    int rc = sr__future_wait_until(all_done, sr__now_ns() + (int64_t)(WAIT_S * 1e9)); /* rank 1, the owner */
    sr_shutdown(false, 0);
    return rc ? 1 : 0;
}

Test(rref_errors, user_forked_onwards_while_unannounced_is_announced_first, .timeout = 60)
{
    rev = shared_page(sizeof(*rev));
    sr_spawn_opts o = {.name_prefix = test_ns("rrefrelay"), .shm_size = 192 << 20};
    int rc = sr_spawn(3, relay_dies_worker, NULL, &o);
    munmap(rev, sizeof(*rev));
    cr_assert_eq(rc, 0, "%s", sr_last_error());
}
