/* SPDX-License-Identifier: MIT */
/* A poll burst rings each destination's doorbell once (lib/rpc/poll.c).
 *
 * worker0 serves, worker1 calls. worker0's main thread calls itself
 * ("gate", an async function, so it runs inline on worker0's poller, the
 * progress thread): while it blocks, nobody reads worker0's inbox, and
 * worker1's N no-op calls wait there together. The gate lets go once
 * worker1 has sent them all and watches the slot at its inbox's head
 * (doorbell.h: it is about to sleep, or sleeps: the progress thread parked,
 * or the calling thread asleep on the inbox), reading worker0's transport
 * statistics first. The next burst then holds all N calls, and their N
 * answers go to a sleeping caller:
 *
 *   - one_ring_per_burst: worker0's doorbell checks (sr_tport_stats.rings,
 *     a D3 fence and a load of the caller's line each) grow by 1 or 2 from
 *     the gate's snapshot to tally's (a call worker1 makes once every
 *     answer is in, read on worker0's poller after the burst has ended):
 *     one for the N answers (the first of them lands in the watched slot:
 *     the burst owes one ring), and one for the gate's own answer if
 *     worker0's inbox was watched then. Before batching, N + 1.
 *   - sleep_mid_burst: the burst is k no-ops, "pause" (async: it blocks
 *     worker0's poller again, in the middle of the burst, until worker1 has
 *     read what it could and announced a sleep again), and the rest. The
 *     answers sent before the pause rang nobody (worker1 sleeps through
 *     them); the ring at the burst's end must wake worker1 for all of them
 *     (doorbell.h R1). Every call
 *     carries a WAIT_S timeout, so a lost wake fails as -ETIMEDOUT naming
 *     the call, not as a hang; and the rings are counted as above.
 *   - send_while_waiting_rings: worker0 runs in the reordering delivery
 *     mode (it holds each message it sends and releases it later, from
 *     whichever thread polls), worker1 does not. The burst is "ask", then
 *     a no-op; "ask" (async, on worker0's poller, inside the burst) calls
 *     worker1 with rpc_sync and waits. Its request is released while it
 *     waits, outside any burst of the waiting thread's own: sent quietly,
 *     as the outer burst's sends are, it would be rung only when that
 *     burst ends, after the wait, and worker1, asleep, would never answer
 *     (-ETIMEDOUT after WAIT_S). A wait ends its thread's batch.
 *
 * Every wait is bounded (WAIT_S) and says what did not happen. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "doorbell.h"
#include "ring.h"
#include "helpers/proc_state.h"
#include "helpers/shared_word.h"
#include "rpc_harness.h"

LEAK_CHECKED_SUITE(burst_ring);

#define N 16      /* answers in one burst: fewer than the poller's burst of 32 */
#define K 5       /* sleep_mid_burst: no-ops answered before the pause */
#define WAIT_S 20 /* nothing here takes a second unless it is broken */

static struct shared {
    _Atomic uint32_t gate_in; /* worker0's gate runs: worker1 may send */
    _Atomic uint32_t sent;    /* worker1 has sent its calls */
    _Atomic uint32_t done;    /* worker1's calls have all ended */
    _Atomic uint32_t paused;  /* sleep_mid_burst: the pause saw worker1 asleep */
    _Atomic uint64_t rings0;  /* worker0's doorbell checks when the gate let go */
    _Atomic uint64_t rings1;  /* and when tally ran, after the burst */
    _Atomic uint32_t mid;     /* this run pauses mid-burst */
    _Atomic uint32_t ask;     /* this run's first call waits for worker1 (worker0 reorders) */
} *sh;

static uint32_t wait_word(_Atomic uint32_t *w, uint32_t n) { return shared_word_wait(w, n, WAIT_S); }

static void bump_word(_Atomic uint32_t *w) { shared_word_bump(w); }

static uint64_t rings(void)
{
    struct sr_tport_stats st;
    sr__agent->self->ops->stats(sr__agent->self, &st);
    return st.rings;
}

/* worker1 watches the slot at its inbox's head (doorbell.h, "Watching the
 * head": it is about to sleep, or sleeps; bounded: it sleeps once it has
 * read everything it was rung for, and nothing else is on its way). A
 * poll, not an event: worker1 cannot say that it sleeps, and its ring is
 * not ours to wait on. The head is the consumer's shared copy (ring.h,
 * R1), stored after each read. */
static bool watched(struct sr_ring *r, uint32_t size, bool or_unread)
{
    /* relaxed: a look at worker1's words; nothing is read after it */
    uint32_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint32_t seq = atomic_load_explicit(&r->slots[head & (size - 1)].seq, memory_order_relaxed);
    uint32_t id = sr__ring_mark_id(size, seq, head);
    return id == SR_RING_FREE_W || atomic_load_explicit(&r->claim_watch, memory_order_relaxed) ||
           (or_unread && seq == head + 1);
}

/* Every thread of process pid is blocked in the kernel. */
static bool all_threads_sleep(pid_t pid)
{
    char dir[64], path[160];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    bool all = d != NULL;
    for (struct dirent *e; all && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%.32s/stat", dir, e->d_name);
        all = proc_stat_sleeps(path);
    }
    if (d)
        closedir(d);
    return all;
}

/* worker1 watches its inbox and every thread of it sleeps: a watch seen
 * alone may be one worker1 is about to withdraw (its re-check found work,
 * or a sleep of its ended and it polls again), and then the answers rightly
 * ring nobody. or_unread: mid-burst, worker1 sleeps through the answers
 * that rang nobody yet, so its head may hold one, unread, instead of its
 * watch. */
static bool caller_asleep(bool or_unread)
{
    const sr_segment *seg = sr__transport_segment(sr__agent->tports);
    struct sr_ring *r = sr__seg_inbox(seg, 1);
    pid_t pid = sr__seg_worker(seg, 1)->pid; /* published at its attach, before the start barrier */
    int64_t until = shared_word_now_ns() + (int64_t)WAIT_S * 1000000000;
    bool asleep;
    while (!(asleep = watched(r, seg->ring_slots, or_unread) && all_threads_sleep(pid)) &&
           shared_word_now_ns() < until)
        usleep(100);
    return asleep;
}

static int done_now(sr_call *c, sr_future **out)
{
    *out = sr_future_new();
    return *out ? sr_future_set_result(*out, sr_none()) : sr_call_fail(c, -ENOMEM, "no future");
}

/* gate() on worker0's poller: hold the inbox until worker1's calls wait in
 * it and worker1 sleeps; then take the count the rest is measured from. */
static int fn_gate(sr_call *c, sr_future **out)
{
    bump_word(&sh->gate_in);
    if (wait_word(&sh->sent, 1) < 1)
        return sr_call_fail(c, -ETIMEDOUT, "worker1 did not send its calls within %d s", WAIT_S);
    if (!caller_asleep(false))
        return sr_call_fail(c, -ETIMEDOUT, "worker1 did not sleep within %d s of sending", WAIT_S);
    atomic_store(&sh->rings0, rings());
    return done_now(c, out);
}

/* pause() in the middle of the burst: K answers went out unrung; worker1
 * read what a ring let it and sleeps again. */
static int fn_pause(sr_call *c, sr_future **out)
{
    if (!caller_asleep(true))
        return sr_call_fail(c, -ETIMEDOUT, "worker1 did not sleep within %d s of the burst's start", WAIT_S);
    bump_word(&sh->paused);
    return done_now(c, out);
}

/* tally() on worker0's poller, called once the burst's answers are all in:
 * a later burst of the same poller, or of one that took the inbox from it
 * (the token's acquire), so the burst's rings are counted by now. */
static int fn_tally(sr_call *c, sr_future **out)
{
    atomic_store(&sh->rings1, rings());
    return done_now(c, out);
}

/* ask() on worker0's poller, inside the burst: a call to the sleeping
 * worker1, waited for right here (a nested wait). */
static int fn_ask(sr_call *c, sr_future **out)
{
    if (sr_rpc_sync(1, "noop", SR_NOARGS, WAIT_S, NULL))
        return sr_call_fail(c, -ETIMEDOUT, "worker0: ask: worker1 did not answer (never rung?): %s",
                            sr_last_error());
    return done_now(c, out);
}

static void register_fns(void)
{
    sr_register_async("gate", fn_gate);
    sr_register_async("tally", fn_tally);
    sr_register_async("pause", fn_pause);
    sr_register_async("ask", fn_ask);
}

static int callee(void)
{
    if (atomic_load(&sh->ask)) { /* worker1 calls the gate: no answer to ourselves rings anyone for us */
        WCHECK(wait_word(&sh->done, 1) >= 1, "worker1's calls had not all ended %d s after the gate", WAIT_S);
        return 0;
    }
    sr_future *g = NULL;
    WCHECK(sr_rpc_async(0, "gate", SR_NOARGS, 2 * WAIT_S, &g) == 0, "worker0: starting gate: %s", sr_last_error());
    WCHECK(wait_word(&sh->done, 1) >= 1, "worker1's calls and its tally had not all ended %d s after the gate",
           WAIT_S);
    uint64_t grew = atomic_load(&sh->rings1) - atomic_load(&sh->rings0);
    WCHECK(sr_future_wait(g, NULL) == 0, "worker0: gate failed: %s", sr_last_error());
    sr_future_unref(g);
    WCHECK(grew >= 1 && grew <= 2,
           "worker0 checked a doorbell %llu times for the gate's answer and one burst of %d answers to a "
           "sleeping worker1 (want 1 or 2: one for the burst%s, and one for the gate's answer if worker0's own "
           "inbox was watched then)",
           (unsigned long long)grew, N, atomic_load(&sh->mid) ? ", however it slept in between" : "");
    return 0;
}

static int caller(void)
{
    static sr_future *fs[N];
    sr_future *g = NULL;
    if (atomic_load(&sh->ask))
        WCHECK(sr_rpc_async(0, "gate", SR_NOARGS, 2 * WAIT_S, &g) == 0, "worker1: starting gate: %s",
               sr_last_error());
    WCHECK(wait_word(&sh->gate_in, 1) >= 1, "worker0's gate did not run within %d s", WAIT_S);
    for (int i = 0; i < N; i++) {
        const char *fn = atomic_load(&sh->mid) && i == K ? "pause" : atomic_load(&sh->ask) && !i ? "ask" : "noop";
        WCHECK(sr_rpc_async(0, fn, SR_NOARGS, WAIT_S, &fs[i]) == 0, "worker1: call %d (%s): %s", i, fn,
               sr_last_error());
    }
    bump_word(&sh->sent);
    for (int i = 0; i < N; i++) {
        int rc = sr_future_wait(fs[i], NULL);
        WCHECK(rc == 0, "worker1: call %d of the burst failed (%d; a lost wake ends in -ETIMEDOUT): %s", i, rc,
               sr_last_error());
        sr_future_unref(fs[i]);
    }
    if (atomic_load(&sh->mid))
        WCHECK(atomic_load(&sh->paused) == 1, "worker1: the pause did not run");
    if (g) {
        WCHECK(sr_future_wait(g, NULL) == 0, "worker1: gate failed: %s", sr_last_error());
        sr_future_unref(g);
    }
    WCHECK(sr_rpc_sync(0, "tally", SR_NOARGS, WAIT_S, NULL) == 0, "worker1: tally: %s", sr_last_error());
    bump_word(&sh->done);
    return 0;
}

static int scenario(int rank, int world)
{
    (void)world;
    return rank == 0 ? callee() : caller();
}

Test(burst_ring, one_ring_per_burst, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    RUN_JOB("burst1", 2, .scenario = scenario, .register_fns = register_fns);
}

Test(burst_ring, sleep_mid_burst, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    atomic_store(&sh->mid, 1);
    RUN_JOB("burstmid", 2, .scenario = scenario, .register_fns = register_fns);
}

/* worker0 holds and releases what it sends (the reordering mode, with
 * delays of at most a microsecond); worker1 sends as usual. */
static int reorder_worker(int rank, int world, void *arg)
{
    if (rank == 0 && (setenv("SHMRPC_REORDER_SEED", "1", 1) || setenv("SHMRPC_REORDER_MAX_US", "1", 1)))
        return 1;
    return harness_worker(rank, world, arg);
}

Test(burst_ring, send_while_waiting_rings, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    atomic_store(&sh->ask, 1);
    struct harness h = {.scenario = scenario, .register_fns = register_fns};
    sr_spawn_opts o = {.name_prefix = test_ns("burstask"), .shm_size = 2u * (64u << 20)};
    int rc = sr_spawn(2, reorder_worker, &h, &o);
    cr_assert_eq(rc, 0, "job 'burstask' failed: %s", sr_last_error());
}
