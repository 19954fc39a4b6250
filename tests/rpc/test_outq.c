/* SPDX-License-Identifier: MIT */
/* Outgoing queues (lib/rpc/outq.c): a full inbox delays only the messages for
 * it, a sender blocked on it wakes from the consumer's space event and never
 * from a timer, a call whose request never left says so when it times out,
 * and a corrupt inbox ring is an error naming its worker, not a spin.
 *
 * How a worker stops reading, deterministically: worker1 runs `block`, an
 * async function (run inline by whichever thread polls its inbox), which
 * waits on a shared futex until worker0 releases it. Nothing else can read
 * worker1's inbox meanwhile (the poller holds the inbox), so 1 + FLOOD calls
 * overflow its ring of SR_RING_SLOTS_DEFAULT slots. Every wait is bounded
 * (EVENT_WAIT_S) and for an event; nothing is timed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "rpc_harness.h"
#include "segment.h"

LEAK_CHECKED_SUITE(outq);

#define FLOOD 1100          /* calls queued to the stopped worker (as first reported) */
#define HEALTHY_CALLS 20    /* round trips to the healthy worker meanwhile */
#define EVENT_WAIT_S 30     /* bound on every wait for an event (none legitimately takes more than ms) */
#define SHORT_TIMEOUT_S 0.2 /* a call that must expire while its request is still queued */

static_assert(FLOOD + 1 > SR_RING_SLOTS_DEFAULT, "the flood overflows the inbox");

/* Shared by the job's processes (mapped before sr_spawn). */
struct page {
    _Atomic uint32_t blocked; /* futex: worker1's poller is inside `block` */
    _Atomic uint32_t release; /* futex: worker0 lets it go */
};
static struct page *pg;

#include "shared_event.h"

/* Worker1: hold the inbox until released. */
static int fn_block(sr_call *c, sr_future **out)
{
    set_and_wake(&pg->blocked, 1);
    if (!wait_for(&pg->release, 1))
        return sr_call_fail(c, -ETIMEDOUT, "worker1: not released within %d s", EVENT_WAIT_S);
    sr_future *f = sr_future_new();
    if (!f)
        return sr_call_fail(c, -ENOMEM, "out of memory");
    sr_future_set_result(f, NULL);
    *out = f;
    return 0;
}

static int fn_seven(sr_call *c) { return sr_call_return(c, sr_int(7)); }

static void register_fns(void)
{
    sr_register_async("block", fn_block);
    sr_register("seven", fn_seven);
}

static sr_future *flood[FLOOD];
static sr_future *blocker;

/* Worker0: stop worker1's inbox and queue FLOOD calls behind it. */
static int stop_and_flood(void)
{
    int rc = sr_rpc_async(1, "block", SR_NOARGS, EVENT_WAIT_S, &blocker);
    WCHECK(rc == 0, "block: %s", sr_last_error());
    WCHECK(wait_for(&pg->blocked, 1), "worker1 did not enter block within %d s", EVENT_WAIT_S);
    for (int i = 0; i < FLOOD; i++) {
        rc = sr_rpc_async(1, "seven", SR_NOARGS, EVENT_WAIT_S, &flood[i]);
        WCHECK(rc == 0, "flood call %d: %s", i, sr_last_error());
    }
    return 0;
}

/* Worker0: release worker1; every flood call must then complete. */
static int release_and_drain(void)
{
    set_and_wake(&pg->release, 1);
    int bad = 0;
    for (int i = 0; i < FLOOD; i++) {
        if (!flood[i])
            continue;
        sr_value *v = NULL;
        int rc = sr_future_wait(flood[i], &v);
        if (rc && !bad++)
            fprintf(stderr, "flood call %d: %d %s\n", i, rc, sr_last_error());
        sr_value_unref(v);
        sr_future_unref(flood[i]);
        flood[i] = NULL;
    }
    int rc = blocker ? sr_future_wait(blocker, NULL) : 0;
    sr_future_unref(blocker);
    blocker = NULL;
    WCHECK(bad == 0, "%d of %d calls queued to worker1 failed after its release", bad, FLOOD);
    WCHECK(rc == 0, "block: %s", sr_last_error());
    return 0;
}

static int healthy_calls(int n)
{
    for (int k = 0; k < n; k++) {
        sr_value *v = NULL;
        int rc = sr_rpc_sync(2, "seven", SR_NOARGS, EVENT_WAIT_S, &v);
        WCHECK(rc == 0,
               "call %d to worker2 (healthy) did not complete while %d calls wait for worker1's full inbox "
               "(head-of-line blocking): %s", k, FLOOD, sr_last_error());
        WCHECK(sr_value_int(v) == 7, "call %d to worker2 returned a wrong value", k);
        sr_value_unref(v);
    }
    return 0;
}

/* ---- a full destination never delays another -------------------------- */

static int hol_body(void)
{
    int rc = stop_and_flood();
    if (!rc)
        rc = healthy_calls(1);
    return rc;
}

static int scenario_hol(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    int rc = hol_body();
    int rc2 = release_and_drain();
    return rc ? rc : rc2;
}

Test(outq, full_destination_never_delays_another)
{
    pg = shared_page(sizeof(*pg));
    RUN_JOB("outq_hol", 3, .scenario = scenario_hol, .register_fns = register_fns);
}

/* ---- the blocked sender waits for the space event, not a timer -------- */

/* The inbox ring of `rank` in the job's segment as this worker's transport
 * maps it (the ring its sends write). */
static struct sr_ring *inbox_of(int rank)
{
    return sr__seg_inbox(sr__transport_segment(sr__agent->tports), rank);
}

/* Sends into a full inbox: every one counts (xport.c, st.full), read
 * through the shared-memory transport's stats (transport.h). */
static uint64_t full_sends(void)
{
    sr_tport *home = sr__transport_home(sr__agent->tports);
    struct sr_tport_stats st;
    home->ops->stats(home, &st);
    return st.full;
}

static int event_body(void)
{
    sr_agent *a = sr__agent;
    int rc = stop_and_flood();
    if (rc)
        return rc;
    WCHECK(sr__outq_busy(&a->outq, 1), "the flood did not overflow worker1's inbox");
    /* worker1 frees no slot now: no space event can come, so nothing may
     * retry its inbox (the old design retried every 200 us, and from every
     * poll of a waiting caller). The calls to worker2 keep this worker's
     * threads polling and sleeping meanwhile. */
    uint64_t before = full_sends(), wakes = atomic_load(&a->outq.space_wakes);
    if ((rc = healthy_calls(HEALTHY_CALLS)))
        return rc;
    uint64_t after = full_sends();
    WCHECK(after == before, "worker1's full inbox was retried %llu times with no space event (a polling retry)",
           (unsigned long long)(after - before));
    WCHECK(atomic_load(&a->outq.space_wakes) == wakes, "a space event came from an inbox that freed nothing");
    if ((rc = release_and_drain()))
        return rc;
    /* The queued calls completed, so they were sent: only a space event from
     * worker1's consumer can have started that. */
    WCHECK(atomic_load(&a->outq.space_wakes) > wakes, "the queued calls were sent without a space event");
    return 0;
}

static int scenario_event(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    int rc = event_body();
    set_and_wake(&pg->release, 1); /* after a failed check too: worker1 must reach its shutdown */
    if (rc)
        release_and_drain();
    return rc;
}

Test(outq, blocked_sender_wakes_on_ring_space_event)
{
    pg = shared_page(sizeof(*pg));
    RUN_JOB("outq_event", 3, .scenario = scenario_event, .register_fns = register_fns);
}

/* ---- a call whose request never left says why when it times out ------- */

static int queued_timeout_body(void)
{
    int rc = stop_and_flood();
    if (rc)
        return rc;
    sr_value *v = NULL;
    rc = sr_rpc_sync(1, "seven", SR_NOARGS, SHORT_TIMEOUT_S, &v);
    sr_value_unref(v);
    WEXPECT_ERR(rc, -ETIMEDOUT, "the inbox of worker1 has been full for");
    /* The ring is full and worker1 reads nothing: the slot at tail is its
     * head's, untouched meanwhile. Scrambled, the timeout says so. */
    struct sr_ring *r = inbox_of(1);
    _Atomic uint32_t *seq = &r->slots[atomic_load(&r->tail) & r->mask].seq;
    uint32_t good = atomic_load(seq);
    atomic_store(seq, good + 5);
    rc = sr_rpc_sync(1, "seven", SR_NOARGS, SHORT_TIMEOUT_S, &v);
    atomic_store(seq, good);
    sr_value_unref(v);
    WEXPECT_ERR(rc, -ETIMEDOUT, "the inbox ring of worker1 (rank 1) is corrupt");
    return 0;
}

static int scenario_queued_timeout(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    int rc = queued_timeout_body();
    int rc2 = release_and_drain();
    return rc ? rc : rc2;
}

Test(outq, queued_call_timeout_names_the_full_or_corrupt_inbox)
{
    pg = shared_page(sizeof(*pg));
    RUN_JOB("outq_qto", 2, .scenario = scenario_queued_timeout, .register_fns = register_fns);
}

/* ---- a corrupt inbox ring is an error naming its worker, not a spin --- */

static void watchdog(int sig)
{
    (void)sig;
    static const char msg[] = "worker0: a send into worker1's corrupt inbox did not return (a spin)\n";
    ssize_t n = write(2, msg, sizeof(msg) - 1);
    (void)n;
    _exit(3);
}

/* Overwrite the sequence word of the slot worker0 sends into next with bad,
 * expect the call to fail at once with -EPROTO naming worker1, then restore
 * it. Worker1's poller is inside `block` and every earlier call returned, so
 * its consumer waits at that slot (head == tail) and neither writes nor reads
 * it meanwhile: a consumer that read its own inbox corrupt would fail every
 * wait on it for good (shm_trust), and the failed send rings its doorbell so
 * that it looks. */
static int expect_corrupt(struct sr_ring *r, uint32_t bad, const char *what)
{
    uint32_t tail = atomic_load(&r->tail);
    _Atomic uint32_t *seq = &r->slots[tail & r->mask].seq;
    uint32_t good = atomic_load(seq);
    WCHECK(good == tail, "%s: worker1's inbox is not idle (tail %u, seq %u)", what, tail, good);
    atomic_store(seq, bad);
    sr_value *v = NULL;
    int rc = sr_rpc_sync(1, "seven", SR_NOARGS, EVENT_WAIT_S, &v);
    sr_value_unref(v);
    atomic_store(seq, good);
    WEXPECT_ERR(rc, -EPROTO, "inbox ring of worker1 (rank 1) is corrupt");
    WCHECK(atomic_load(&r->tail) == tail, "%s: a message was written into the corrupt slot", what);
    return 0;
}

static int scenario_corrupt(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    signal(SIGALRM, watchdog);
    alarm(EVENT_WAIT_S + 10); /* before worker1's shutdown gives up (60 s) */
    struct sr_ring *r = inbox_of(1);
    sr_value *v = NULL;
    int rc = sr_rpc_sync(1, "seven", SR_NOARGS, EVENT_WAIT_S, &v);
    sr_value_unref(v);
    WCHECK(rc == 0, "a first call to worker1: %s", sr_last_error());
    rc = sr_rpc_async(1, "block", SR_NOARGS, EVENT_WAIT_S, &blocker);
    WCHECK(rc == 0, "block: %s", sr_last_error());
    WCHECK(wait_for(&pg->blocked, 1), "worker1 did not enter block within %d s", EVENT_WAIT_S);
    uint32_t size = r->size;
    /* Ahead of a tail that never moved: the old enqueue re-read the tail for ever. */
    if ((rc = expect_corrupt(r, atomic_load(&r->tail) + 5, "a sequence 5 ahead")) ||
        (rc = expect_corrupt(r, atomic_load(&r->tail) + size, "a sequence one lap ahead")) ||
        /* Laps behind: the old enqueue took it for a full ring and queued for ever. */
        (rc = expect_corrupt(r, atomic_load(&r->tail) - 3 * size, "a sequence three laps behind")))
        ;
    else
        rc = expect_corrupt(r, atomic_load(&r->tail) - size / 2, "a sequence half a lap behind");
    int rc2 = release_and_drain();
    if (rc || rc2)
        return rc ? rc : rc2;
    /* Restored, the ring works again. */
    rc = sr_rpc_sync(1, "seven", SR_NOARGS, EVENT_WAIT_S, &v);
    WCHECK(rc == 0 && sr_value_int(v) == 7, "a call after the ring was restored: %s", sr_last_error());
    sr_value_unref(v);
    alarm(0);
    return 0;
}

Test(outq, corrupt_inbox_ring_is_an_error_naming_its_worker)
{
    pg = shared_page(sizeof(*pg));
    RUN_JOB("outq_corrupt", 2, .scenario = scenario_corrupt, .register_fns = register_fns);
}

/* ---- tiny inboxes under load: no space event is ever lost ------------- */

#define STORM_WORLD 4
#define STORM_CALLS 400 /* per worker, to every other worker in turn */

static int scenario_storm(int rank, int world)
{
    static sr_future *fs[STORM_CALLS];
    for (int i = 0; i < STORM_CALLS; i++) {
        int to = (rank + 1 + i % (world - 1)) % world;
        int rc = sr_rpc_async(to, "seven", SR_NOARGS, EVENT_WAIT_S, &fs[i]);
        WCHECK(rc == 0, "call %d to worker%d: %s", i, to, sr_last_error());
    }
    int bad = 0, rc = 0;
    for (int i = 0; i < STORM_CALLS; i++) {
        sr_value *v = NULL;
        int r = sr_future_wait(fs[i], &v);
        if (r && !bad++) {
            rc = r;
            fprintf(stderr, "worker%d: call %d: %s\n", rank, i, sr_last_error());
        }
        sr_value_unref(v);
        sr_future_unref(fs[i]);
    }
    WCHECK(bad == 0, "worker%d: %d of %d calls into 4-slot inboxes failed (a lost space event?): %d", rank, bad,
           STORM_CALLS, rc);
    WCHECK(full_sends() > 0, "worker%d never found an inbox full: the storm tested nothing", rank);
    return 0;
}

Test(outq, tiny_inboxes_under_load_lose_no_space_event)
{
    RUN_JOB("outq_storm", STORM_WORLD, .scenario = scenario_storm, .register_fns = register_fns, .ring_slots = 4);
}
