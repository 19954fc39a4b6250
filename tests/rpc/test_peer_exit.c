/* SPDX-License-Identifier: MIT */
/* Peers that leave: every wait that involves a departed
 * worker fails at once with -EPIPE, naming the worker and how it left
 * ("worker2 exited with status 0 without sr_shutdown"): the start barrier of
 * sr_init, the barriers and quiescence waves of a graceful sr_shutdown (led
 * by rank 0, which may be the one that left), and calls in flight.
 *
 * Each of these used to hang: sr_shutdown(true, 0) for ever, a call with no
 * timeout for ever, sr_init for its 60 s start timeout. So every job runs
 * under a bound (BOUND_MS): sr_spawn runs in a thread, and a job that has
 * not returned by then fails the test with what hung, instead of blocking it.
 * (Ending the test process then takes the workers down: their death signal
 * is tied to the spawning thread.) Workers check their own results with
 * WCHECK: a failed check exits non-zero, which makes sr_spawn fail naming the
 * rank, with the check's message on stderr.
 *
 * A worker that leaves returns from its function (sr_spawn's "main") with
 * status 0, so the job goes on: only an exit status other than 0 makes the
 * supervisor take the whole job down (lib/job/job.h).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "helpers/watch.h"
#include "rpc_harness.h"
#include "shmrpc/rpc.h"
#include "shmrpc/rref.h"
#include "shmrpc/spawn.h"
#include "worker_check.h"

LEAK_CHECKED_SUITE(peer_exit);

/* Far below the 60 s start timeout, far above a prompt failure under ASan. */
#define BOUND_MS 10000

/* ---- a job under a bound ---------------------------------------------------- */

struct run {
    int world;
    int (*fn)(int, int, void *);
    void *arg;
    char ns[40];
    int rc;
    char err[512];
    int done[2];
};

static void *spawner(void *p)
{
    struct run *r = p;
    sr_spawn_opts o = {.name_prefix = r->ns, .shm_size = (uint64_t)r->world * (64u << 20)};
    r->rc = sr_spawn(r->world, r->fn, r->arg, &o);
    snprintf(r->err, sizeof(r->err), "%s", sr_last_error());
    close(r->done[1]);
    return NULL;
}

/* Run the job; fail the test with `hang` if it has not ended within BOUND_MS,
 * or with sr_spawn's report if a worker's check failed. */
static void run_bounded(const char *name, int world, int (*fn)(int, int, void *), void *arg, const char *hang)
{
    static struct run r; /* outlives this frame if the job hangs and the test fails */
    r = (struct run){.world = world, .fn = fn, .arg = arg};
    snprintf(r.ns, sizeof(r.ns), "%s", test_ns(name));
    cr_assert_eq(pipe2(r.done, O_CLOEXEC), 0, "pipe2: %s", strerror(errno));
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, spawner, &r), 0);
    struct pollfd p = {.fd = r.done[0], .events = POLLIN};
    int64_t t0 = watch_now_ms();
    cr_assert_eq(poll(&p, 1, BOUND_MS), 1, "%s: the job had not ended after %d ms", hang, BOUND_MS);
    pthread_join(t, NULL);
    close(r.done[0]);
    cr_assert_eq(r.rc, 0, "job '%s' failed after %lld ms: %s", name, (long long)(watch_now_ms() - t0), r.err);
}

/* Shared by the job's processes (created before sr_spawn, inherited). */
struct board {
    sem_t shut;  /* the leaving worker has shut down */
    sem_t sent;  /* the call to it is in flight */
};
static struct board *board;

static void board_setup(void)
{
    board = shared_page(sizeof(*board));
    cr_assert_eq(sem_init(&board->shut, 1, 0), 0);
    cr_assert_eq(sem_init(&board->sent, 1, 0), 0);
}

/* Bounded sem_wait: 0, or -ETIMEDOUT after BOUND_MS. */
static int sem_wait_bounded(sem_t *s)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += BOUND_MS / 1000;
    int rc;
    while ((rc = sem_timedwait(s, &dl)) && errno == EINTR)
        ;
    return rc ? -errno : 0;
}

static int fn_exit_now(sr_call *c)
{
    (void)c;
    _exit(0); /* status 0, never detached */
}

/* ---- graceful shutdown with a peer that returned without sr_shutdown ---------- */

struct leave {
    int gone;          /* the rank that returns from main without sr_shutdown */
    double timeout_s;  /* the survivors' sr_shutdown timeout (0: none) */
};

static int leaves_without_shutdown(int rank, int world, void *arg)
{
    (void)world;
    const struct leave *l = arg;
    WCHECK(sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == l->gone)
        return 0; /* out of "main", still attached */
    int rc = sr_shutdown(true, l->timeout_s);
    char want[96];
    snprintf(want, sizeof(want), "worker%d exited with status 0 without sr_shutdown", l->gone);
    WEXPECT_ERR(rc, -EPIPE, want);
    return 0;
}

Test(peer_exit, return_without_shutdown_fails_the_others_shutdown, .timeout = 60)
{
    struct leave l = {.gone = 2, .timeout_s = 0};
    run_bounded("noshut", 3, leaves_without_shutdown, &l,
                "sr_shutdown(true, 0) of ranks 0 and 1 hung after worker2 returned without sr_shutdown");
}

/* Rank 0 leads the barrier and the waves: with it gone nobody could release
 * them, so the survivors fail, naming the leader. */
Test(peer_exit, leader_leaving_fails_the_others_shutdown, .timeout = 60)
{
    struct leave l = {.gone = 0, .timeout_s = 0};
    run_bounded("noshut0", 3, leaves_without_shutdown, &l,
                "sr_shutdown(true, 0) of ranks 1 and 2 hung after the leader worker0 returned without sr_shutdown");
}

/* With a timeout the wait ended, but as a timeout that did not say who was
 * missing: now it fails at once, naming the worker. */
Test(peer_exit, departure_is_named_not_timed_out, .timeout = 60)
{
    struct leave l = {.gone = 1, .timeout_s = 30};
    run_bounded("noshutt", 2, leaves_without_shutdown, &l,
                "sr_shutdown(true, 30) of rank 0 did not fail within the bound after worker1 left");
}

/* A worker leaves while the others are inside sr_shutdown: rank 0 starts a
 * call that ends worker2's process, then shuts down. Quiescence cannot be
 * reached before that call is answered, so worker2 dies at some point of the
 * barriers or the waves; whichever it is, both survivors fail, naming it. */
static int dies_during_shutdown(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    sr_register("exit_now", fn_exit_now);
    WCHECK(sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 0) {
        sr_future *f = NULL;
        WCHECK(sr_rpc_async(2, "exit_now", SR_NOARGS, SR_TIMEOUT_NONE, &f) == 0, "rpc_async: %s", sr_last_error());
        sr_future_unref(f);
    }
    int rc = sr_shutdown(true, 0);
    WCHECK(rank != 2, "worker2 survived its exit_now (sr_shutdown gave %d: %s)", rc, sr_last_error());
    /* it dies in exit_now, before or inside its own sr_shutdown */
    WCHECK(rc == -EPIPE && (strstr(sr_last_error(), "worker2 exited with status 0 during sr_shutdown") ||
                            strstr(sr_last_error(), "worker2 exited with status 0 without sr_shutdown")),
           "expected -EPIPE naming worker2's exit, got %d: %s", rc, sr_last_error());
    return 0;
}

Test(peer_exit, death_inside_shutdown_fails_the_barrier_and_waves, .timeout = 60)
{
    run_bounded("inshut", 3, dies_during_shutdown, NULL,
                "sr_shutdown(true, 0) of ranks 0 and 1 hung after worker2 died inside its own sr_shutdown");
}

/* ---- a timeout names who is missing -------------------------------------------- */

/* worker1 is alive but does not come to the shutdown: the leader's timeout
 * names it (it used to say only "timed out waiting for the other workers"). */
static int late_to_shutdown(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    WCHECK(sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 1) {
        WCHECK(sem_wait_bounded(&board->shut) == 0, "worker0's shutdown never timed out");
        sr_shutdown(false, 0);
        return 0;
    }
    int rc = sr_shutdown(true, 0.5);
    sem_post(&board->shut);
    WEXPECT_ERR(rc, -ETIMEDOUT, "1 worker never answered: worker1");
    return 0;
}

Test(peer_exit, shutdown_timeout_names_the_missing_worker, .timeout = 60)
{
    board_setup();
    run_bounded("late", 2, late_to_shutdown, NULL, "worker0's sr_shutdown(true, 0.5) did not time out");
}

/* worker2 comes to the shutdown, gives up after its own short timeout and
 * exits; worker1 does not come until both others have returned. worker2 is
 * no peer that died: the leader's shutdown fails with -ETIMEDOUT naming
 * worker1, the one that never arrived (it used to fail with -EPIPE naming
 * worker2, "after a non-graceful sr_shutdown"). worker0's own timeout (30 s)
 * is beyond the job's bound: only worker2's departure can end its wait. The
 * late worker1 then finds both gone after their timeouts: its shutdown timed
 * out too, whoever it names. */
static int gives_up_at_shutdown(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    WCHECK(sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 1) {
        WCHECK(sem_wait_bounded(&board->shut) == 0 && sem_wait_bounded(&board->shut) == 0,
               "worker0 and worker2 never returned from sr_shutdown");
        int rc = sr_shutdown(true, 30);
        WEXPECT_ERR(rc, -ETIMEDOUT, "after its sr_shutdown timed out");
        return 0;
    }
    int rc = sr_shutdown(true, rank == 2 ? 0.3 : 30);
    sem_post(&board->shut);
    if (rank == 2)
        WEXPECT_ERR(rc, -ETIMEDOUT, "the leader, worker0, had not released this worker");
    else
        WEXPECT_ERR(rc, -ETIMEDOUT, "1 worker never answered: worker1");
    return 0;
}

Test(peer_exit, timed_out_departure_names_the_missing_worker, .timeout = 60)
{
    board_setup();
    run_bounded("gaveup", 3, gives_up_at_shutdown, NULL,
                "worker0's sr_shutdown(true, 30) did not end after worker2 timed out and left");
}

/* ---- a call in flight to a peer that shut down non-gracefully and left --------- */

static int call_to_departed(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    WCHECK(sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 1) {
        WCHECK(sr_shutdown(false, 0) == 0, "sr_shutdown(false): %s", sr_last_error());
        sem_post(&board->shut);
        WCHECK(sem_wait_bounded(&board->sent) == 0, "worker0 never sent its call");
        return 0; /* the call sits unread in our inbox */
    }
    WCHECK(sem_wait_bounded(&board->shut) == 0, "worker1 never shut down");
    sr_future *f = NULL;
    WCHECK(sr_rpc_async(1, "noop", SR_NOARGS, SR_TIMEOUT_NONE, &f) == 0, "rpc_async: %s", sr_last_error());
    sem_post(&board->sent);
    int rc = sr_future_wait(f, NULL); /* no timeout: only worker1's departure can end it */
    WEXPECT_ERR(rc, -EPIPE, "RPC to worker1 failed: the worker exited with status 0 after a non-graceful sr_shutdown");
    sr_future_unref(f);
    /* A later call fails at send time, saying the same. */
    rc = sr_rpc_sync(1, "noop", SR_NOARGS, SR_TIMEOUT_NONE, NULL);
    WEXPECT_ERR(rc, -EPIPE,
                "worker0: sr_rpc_sync: destination rank 1 is gone: worker1 exited with status 0 after a non-graceful "
                "sr_shutdown");
    sr_shutdown(false, 0);
    return 0;
}

Test(peer_exit, call_in_flight_to_departed_peer_fails_at_once, .timeout = 60)
{
    board_setup();
    run_bounded("inflight", 2, call_to_departed, NULL,
                "a call with no timeout to worker1, which shut down non-gracefully and exited, never failed");
}

/* ---- sr_init when a rank exits before attaching --------------------------------- */

static int exits_before_init(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    if (rank == 2)
        return 0; /* never calls sr_init */
    int64_t t0 = watch_now_ms();
    int rc = sr_init(NULL);
    WEXPECT_ERR(rc, -EPIPE, "rank 2 exited with status 0 before attaching");
    WCHECK(watch_now_ms() - t0 < BOUND_MS, "sr_init took %lld ms to fail", (long long)(watch_now_ms() - t0));
    return 0;
}

Test(peer_exit, rank_exiting_before_init_fails_sr_init_fast, .timeout = 90)
{
    run_bounded("preinit", 3, exits_before_init, NULL,
                "sr_init of ranks 0 and 1 still waited for rank 2, which exited before attaching");
}

/* ---- an RRef whose owner is gone -------------------------------------------------- */

static int fn_hold(sr_call *c)
{
    return sr_call_return(c, sr_int(sr_value_rref(sr_call_arg(c, 0)) ? 1 : 0));
}

/* worker1 holds a UserRRef owned by worker0, which then exits (status 0)
 * without sr_shutdown. Passing the RRef on to worker2 used to leave worker1
 * waiting for ever (no timeouts here): for the child's CHILD_ACCEPT, which
 * worker2 sends only once the dead owner has confirmed it, so
 * sr_rref_wait_idle never returned (earlier, the call itself hung, its
 * request to the owner retried without end). Now the fork fails at once,
 * naming the owner, and nothing is left pending. */
static int owner_gone(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    sr_register("hold", fn_hold);
    sr_register("exit_now", fn_exit_now);
    WCHECK(sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 0) { /* serve until worker1's exit_now ends this process */
        sem_wait_bounded(&board->shut);
        return 1;
    }
    if (rank == 2) { /* serve until worker1 is done */
        WCHECK(sem_wait_bounded(&board->sent) == 0, "worker1 never finished");
        sr_shutdown(false, 0);
        return 0;
    }
    sr_value *v = sr_int(7);
    sr_rref *r = NULL;
    WCHECK(sr_remote(0, "echo", SR_ARGS(v), SR_TIMEOUT_NONE, &r) == 0, "remote: %s", sr_last_error());
    sr_future *conf = NULL;
    WCHECK(sr_rref_confirmation(r, &conf) == 0 && sr_future_wait(conf, NULL) == 0, "confirmation: %s",
           sr_last_error());
    sr_future_unref(conf);
    /* the owner leaves, still attached; its departure is seen here when the call fails */
    WEXPECT_ERR(sr_rpc_sync(0, "exit_now", SR_NOARGS, SR_TIMEOUT_NONE, NULL), -EPIPE, "RPC to worker0 failed");
    sr_value *rv = sr_value_from_rref(r); /* borrowed */
    int rc = sr_rpc_sync(2, "hold", SR_ARGS(rv), SR_TIMEOUT_NONE, NULL);
    WEXPECT_ERR(rc, -SR_EOWNERLOST, "is lost: worker0 exited with status 0 without sr_shutdown");
    WCHECK(sr_rref_wait_idle(0) == 0, "RRef state still pending: %s", sr_last_error());
    sr_value_unref(v);
    sr_rref_unref(r);
    sem_post(&board->sent);
    sr_shutdown(false, 0);
    return 0;
}

Test(peer_exit, passing_on_an_rref_whose_owner_is_gone_fails_at_once, .timeout = 60)
{
    board_setup();
    run_bounded("rrefgone", 3, owner_gone, NULL,
                "passing on an RRef whose owner worker0 had left hung (the call or sr_rref_wait_idle, no timeout)");
}
