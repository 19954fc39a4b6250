/* SPDX-License-Identifier: MIT */
/* Expiry and peer death cost what they end, not the call table.
 * A worker has 65,536 call slots; every expiry and every peer's
 * death used to scan all of them, in flight or not. Now expiry pops due
 * calls off a deadline heap and a peer's death walks that peer's list
 * (lib/rpc/calls.c). The agent counts the slots they look at
 * (sr_agent.calls_examined), which these tests read from inside worker0:
 *
 *   - expiry: 200 calls with a 30 s timeout are in flight to worker1's
 *     "block", then one with 50 ms. When the short one has failed with
 *     -ETIMEDOUT, the count grew by a few slots (the expired call and the
 *     heap's next top, once per poller that raced to expire), not 65,536;
 *     then worker1 is released and the 200 calls complete.
 *   - peer death: 200 calls are in flight to worker1, which exits with
 *     status 0 without sr_shutdown. Each fails with -EPIPE, and once the
 *     death is handled (a test module's peer_died hook) the count grew by
 *     exactly 200.
 *
 * The old scan counted 65,536 per expiry and per death. Every wait is
 * bounded (WAIT_S) and fails naming what did not happen. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "module.h"
#include "helpers/shared_word.h"
#include "rpc_harness.h"

LEAK_CHECKED_SUITE(call_scan);

#define N 200           /* long calls in flight: far fewer than the 65,536 slots */
#define WAIT_S 20       /* nothing here takes a second unless it is broken */
/* Expiry: 2 expected (the expired call, then the next deadline, which is not
 * due); a second pass by a poller that raced the first looks at one more. */
#define EXPIRY_MAX 4

static struct shared {
    _Atomic uint32_t release; /* worker1's "block" calls may answer */
    _Atomic uint32_t sent;    /* peer death: worker0's calls are in flight */
} *sh;

static uint32_t wait_word(_Atomic uint32_t *w, uint32_t n) { return shared_word_wait(w, n, WAIT_S); }

static void bump_word(_Atomic uint32_t *w) { shared_word_bump(w); }

/* block(): answer once worker0 releases worker1 (bounded). */
static int fn_block(sr_call *c)
{
    if (wait_word(&sh->release, 1) < 1)
        return sr_call_fail(c, -ETIMEDOUT, "worker1: block was not released within %d s", WAIT_S);
    return sr_call_return(c, sr_none());
}

static void register_fns(void) { sr_register("block", fn_block); }

/* Calls of worker0 that have ended (done callbacks, any thread). */
static _Atomic uint32_t ended;

static void on_end(sr_future *f, void *arg)
{
    (void)f, (void)arg;
    bump_word(&ended);
}

static uint64_t examined(void)
{
    /* relaxed: a statistic (agent.h) */
    return atomic_load_explicit(&sr__agent->calls_examined, memory_order_relaxed);
}

/* Start a call to worker1's "block" whose end is counted in `ended`. */
static int start_block(double timeout_s, sr_future **f)
{
    int rc = sr_rpc_async(1, "block", SR_NOARGS, timeout_s, f);
    if (!rc)
        rc = sr_future_add_done_callback(*f, on_end, NULL);
    return rc;
}

/* Start N long calls; 0 or the first error (the started ones are in fs). */
static int start_long(sr_future **fs)
{
    for (int i = 0; i < N; i++) {
        int rc = start_block(30, &fs[i]);
        if (rc)
            return rc;
    }
    return 0;
}

/* Every long call ended with `want`; 0 or the index of the first that did not, plus one. */
static int check_long(sr_future **fs, int want)
{
    for (int i = 0; i < N; i++) {
        int rc = sr_future_value(fs[i], NULL);
        sr_future_unref(fs[i]);
        fs[i] = NULL;
        if (rc != want)
            return i + 1;
    }
    return 0;
}

/* ---- expiry ----------------------------------------------------------------- */

static int expiry(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0; /* into sr_shutdown: serves the calls once released */
    static sr_future *fs[N];
    WCHECK(start_long(fs) == 0, "starting the long calls: %s", sr_last_error());
    uint64_t before = examined();
    sr_future *s = NULL;
    WCHECK(start_block(0.05, &s) == 0, "starting the 50 ms call: %s", sr_last_error());
    WCHECK(wait_word(&ended, 1) >= 1, "no call had ended %d s after one with a 50 ms timeout started", WAIT_S);
    int rc = sr_future_value(s, NULL);
    WEXPECT_ERR(rc, -ETIMEDOUT, "RPC ran for more than set timeout (50 ms)");
    sr_future_unref(s);
    bump_word(&sh->release);
    WCHECK(wait_word(&ended, N + 1) >= N + 1, "only %u of the %d released calls had ended after %d s",
           atomic_load(&ended) - 1, N, WAIT_S);
    int bad = check_long(fs, 0);
    WCHECK(!bad, "released call %d failed: %s", bad - 1, sr_last_error());
    /* Read once every call has ended, so a scan that completed the short
     * call on its way through the table has finished too: worker0's only
     * poller (the progress thread; this thread waits on a futex) reads the
     * responses after it. The answers themselves are not expiry. */
    uint64_t grew = examined() - before;
    WCHECK(grew >= 1 && grew <= EXPIRY_MAX,
           "expiring 1 of %d calls in flight looked at %llu call slots (want 1 to %d: the expired call and "
           "the next deadline)", N + 1, (unsigned long long)grew, EXPIRY_MAX);
    return 0;
}

Test(call_scan, expiry_looks_at_the_expired_calls_only, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    RUN_JOB("callscan_exp", 2, .scenario = expiry, .register_fns = register_fns);
}

/* ---- peer death ------------------------------------------------------------- */

/* The agent handles a peer's death (exits.c, peer_gone) by failing the calls
 * to it, then telling the modules: a module's peer_died hook is the event
 * that says the failing, however far it looked, is over. */
static _Atomic uint32_t died; /* peer_died(1) has run */

static void on_peer_died(int rank, const char *why)
{
    (void)why;
    if (rank == 1)
        bump_word(&died);
}

static const struct sr_module_life_ops watcher_life = {.peer_died = on_peer_died};
static const sr_module watcher = {.name = "call_scan_watcher", .life = &watcher_life};

/* worker1 leaves (status 0, still attached) with worker0's calls in flight;
 * worker0, which cannot shut down gracefully with a peer gone, shuts down
 * non-gracefully (as tests/rpc/test_peer_exit.c does). */
static int peer_death(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    register_fns();
    int id = sr__module_register(&watcher, NULL);
    WCHECK(id >= 0, "registering the watcher module: %s", strerror(-id));
    WCHECK(sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 1) {
        WCHECK(wait_word(&sh->sent, 1) >= 1, "worker0 never started its calls");
        _exit(0); /* its executors still block in "block" */
    }
    static sr_future *fs[N];
    uint64_t before = examined();
    WCHECK(start_long(fs) == 0, "starting the calls: %s", sr_last_error());
    bump_word(&sh->sent);
    WCHECK(wait_word(&ended, N) >= N, "only %u of %d calls to worker1 had ended %d s after it was told to exit",
           atomic_load(&ended), N, WAIT_S);
    WCHECK(wait_word(&died, 1) >= 1, "the modules were not told of worker1's death within %d s", WAIT_S);
    uint64_t grew = examined() - before;
    int bad = check_long(fs, -EPIPE);
    WCHECK(!bad, "call %d to worker1 did not fail with -EPIPE: %s", bad - 1, sr_last_error());
    WCHECK(grew == N, "failing the %d calls to worker1, which exited, looked at %llu call slots", N,
           (unsigned long long)grew);
    sr_shutdown(false, 0);
    return 0;
}

Test(call_scan, peer_death_looks_at_that_peers_calls_only, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    sr_spawn_opts o = {.name_prefix = test_ns("callscan_peer"), .shm_size = 2ull * (64u << 20)};
    int rc = sr_spawn(2, peer_death, NULL, &o);
    cr_assert_eq(rc, 0, "job 'callscan_peer' failed: %s", sr_last_error());
}
