/* SPDX-License-Identifier: MIT */
/* Shared memory is not trusted after attach: a worker
 * that scribbles on the segment must not make another crash, write out of
 * bounds or wait for ever. Each test corrupts words of its own job's segment
 * and expects a clean error naming the worker, or correct operation where
 * the corrupted word is one the reader keeps a private copy of. */
#include <criterion/criterion.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "error.h"
#include "segment.h"
#include "shmrpc/rpc.h"
#include "shmrpc/spawn.h"
#include "worker_check.h"
#include "shm/xport.h"

LEAK_CHECKED_SUITE(shm_trust);

#define SLOTS 8
#define MSGS 40 /* five laps of the inbox */
#define WAIT_NS (5ll * 1000000000)

static sr_msg msg_of(uint32_t v)
{
    sr_msg m = {.type = 1};
    memcpy(m.data, &v, sizeof(v));
    return m;
}

static void watchdog(int sig)
{
    (void)sig;
    static const char msg[] = "a worker hung on a corrupt inbox (spin or endless wait)\n";
    ssize_t n = write(2, msg, sizeof(msg) - 1);
    (void)n;
    _exit(3);
}

/* Wait (bounded) until the other rank moves the shared stage to `want`. */
static bool await_stage(_Atomic uint32_t *stage, uint32_t want)
{
    int64_t until = sr__now_ns() + WAIT_NS;
    /* acquire: pairs with the other rank's release store of the stage */
    while (atomic_load_explicit(stage, memory_order_acquire) != want && sr__now_ns() < until)
        sched_yield();
    return atomic_load_explicit(stage, memory_order_acquire) == want; /* acquire: as above */
}

/* ---- the ring's geometry and the consumer's words ------------------------ */

/* Rank 0 scribbles on its own inbox's size, mask, head and held after
 * attach; these are used by nobody any more (the consumer and producers
 * keep private copies), so MSGS messages still arrive, in order. Before, the
 * producer wrote slot (tail & mask) and the consumer read slot (head &
 * mask), both far outside the ring, and a release walked 2^31 slots. */
static bool scribble_geometry; /* size and mask too, or only the consumer's head and held */

static int geometry_consumer(sr_xport *x, _Atomic uint32_t *stage)
{
    struct sr_ring *r = sr__seg_inbox(&x->seg, x->rank);
    if (scribble_geometry) {
        r->size = 0x40000000u;
        r->mask = 0xffffffffu;
    }
    atomic_store(&r->head, 0x10000000u);
    atomic_store(&r->held, 0x7fffffffu);
    /* release: pairs with await_stage; the scribbles come first */
    atomic_store_explicit(stage, 1, memory_order_release);
    uint32_t next = 0;
    int64_t deadline = sr__now_ns() + WAIT_NS;
    while (next < MSGS) {
        sr_msg m;
        if (sr__xport_recv_burst(x, &m, 1)) {
            uint32_t v;
            memcpy(&v, m.data, sizeof(v));
            WCHECK(v == next, "got message %u, expected %u", v, next);
            next++;
            continue;
        }
        int ev = sr__xport_wait(x, deadline);
        WCHECK(ev >= 0, "wait after %u messages: %s", next, sr_last_error());
        WCHECK(!(ev & SR_WAKE_TIMEOUT) || sr__ring_ready(x->inbox), "only %u of %d messages arrived in 5 s", next,
               MSGS);
    }
    return 0;
}

static int geometry_producer(sr_xport *x, _Atomic uint32_t *stage)
{
    WCHECK(await_stage(stage, 1), "rank 0 never scribbled on its inbox");
    for (uint32_t i = 0; i < MSGS; i++) {
        sr_msg m = msg_of(i);
        int rc = sr__xport_send_wait(x, 0, &m, sr__now_ns() + WAIT_NS);
        WCHECK(rc == 0, "send %u: %s", i, sr_last_error());
    }
    return 0;
}

static int geometry_worker(int rank, int world, void *arg)
{
    (void)world;
    signal(SIGALRM, watchdog);
    alarm(20);
    sr_xport_opts o = {.fixed_spin = true, .spin_ns = 0};
    sr_xport *x;
    WCHECK(sr__xport_attach(&o, &x) == 0, "attach: %s", sr_last_error());
    int rc = rank == 0 ? geometry_consumer(x, arg) : geometry_producer(x, arg);
    sr__xport_detach(x);
    return rc;
}

static void run2(const char *name, int (*fn)(int, int, void *))
{
    _Atomic uint32_t *stage = mmap(NULL, sizeof(*stage), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(stage, MAP_FAILED);
    sr_spawn_opts o = {.name_prefix = test_ns(name), .shm_size = 64 << 20, .ring_slots = SLOTS};
    int rc = sr_spawn(2, fn, stage, &o);
    munmap(stage, sizeof(*stage));
    cr_assert_eq(rc, 0, "job failed: %s", sr_last_error());
}

Test(shm_trust, scribbled_ring_geometry_and_consumer_words_are_not_used)
{
    scribble_geometry = true;
    run2("trust_geom", geometry_worker);
}

/* Only the consumer's words: before, the consumer waited at a position no
 * producer writes, and its release rewrote 2^31 sequence words. */
Test(shm_trust, scribbled_consumer_head_and_held_are_not_used)
{
    scribble_geometry = false;
    run2("trust_cons", geometry_worker);
}

/* ---- a corrupt sequence word in one's own inbox -------------------------- */

/* Rank 0's idle inbox: the slot at its head holds a sequence that is neither
 * free (head) nor published (head + 1). Its consumer reports that, naming
 * itself, instead of sleeping on the slot until the deadline (before: the
 * wait timed out after 5 s and nothing was said). */
static int corrupt_seq_worker(int rank, int world, void *arg)
{
    (void)world;
    _Atomic uint32_t *stage = arg;
    sr_xport_opts o = {.fixed_spin = true, .spin_ns = 0};
    sr_xport *x;
    WCHECK(sr__xport_attach(&o, &x) == 0, "attach: %s", sr_last_error());
    int rc = 0;
    if (rank == 0) {
        struct sr_ring *r = sr__seg_inbox(&x->seg, 0);
        atomic_store(&r->slots[0].seq, 5); /* fresh ring: head 0 */
        sr_msg m;
        WCHECK(sr__xport_recv_burst(x, &m, 1) == 0, "a message was read from a corrupt slot");
        int64_t t0 = sr__now_ns();
        int ev = sr__xport_wait(x, t0 + WAIT_NS);
        WCHECK(ev == -EPROTO, "wait on a corrupt inbox returned %d after %.1f s, want -EPROTO (%s)", ev,
               (double)(sr__now_ns() - t0) / 1e9, ev < 0 ? sr_last_error() : "no error");
        WCHECK(strstr(sr_last_error(), "inbox ring of worker0 (rank 0) is corrupt") &&
                   strstr(sr_last_error(), "sequence 5"),
               "the error does not name the worker and the value: %s", sr_last_error());
        /* release: pairs with rank 1's await_stage */
        atomic_store_explicit(stage, 1, memory_order_release);
        /* stay attached until rank 1 has tried its send */
        WCHECK(await_stage(stage, 2), "rank 1 never tried to send");
    } else {
        WCHECK(await_stage(stage, 1), "rank 0 never reported its corrupt inbox");
        sr_msg m = msg_of(1);
        rc = sr_xport_send(x, 0, &m);
        /* release: pairs with rank 0's await_stage */
        atomic_store_explicit(stage, 2, memory_order_release);
        WCHECK(rc == -EPROTO, "a send into rank 0's corrupt inbox: %s", sr_last_error());
        rc = 0;
    }
    sr__xport_detach(x);
    return rc;
}

Test(shm_trust, corrupt_sequence_in_own_inbox_is_reported_not_slept_on)
{
    run2("trust_seq", corrupt_seq_worker);
}

/* ---- a corrupt own inbox fails every wait on it --------------------------- */

/* Worker1 calls worker0 with no timeout. Worker0's function scribbles on
 * every sequence word of worker1's inbox (the caller's, idle while it waits)
 * and answers; that answer cannot be delivered, and nothing else will ever
 * arrive. Worker1's call must fail at once with -EPROTO naming worker1's
 * corrupt inbox, later calls and its graceful shutdown too. Before, the
 * answer's send failed at worker0 and nobody told worker1: its call waited
 * for ever (here: until the watchdog). */
#define SCRIBBLE 0x40000003u /* congruent to no legal sequence of an 8-slot ring */
#define CALL_BOUND_S 3       /* worker1's watchdog: before worker0 stops waiting for it (WAIT_NS) */

static int fn_scribble_caller(sr_call *c)
{
    /* A mapping of the job's segment of its own, as any faulty worker has
     * (the launch fd stays open while the job runs): the same memory the
     * agents' transports use. */
    struct sr_launch_env env;
    sr_segment seg;
    if (sr__launch_env_get(&env) || sr__segment_attach(env.fd, &seg))
        return sr_call_fail(c, -EIO, "worker0 could not map the segment: %s", sr_last_error());
    struct sr_ring *r = sr__seg_inbox(&seg, sr_call_caller(c));
    for (uint32_t i = 0; i < seg.ring_slots; i++)
        atomic_fetch_add(&r->slots[i].seq, SCRIBBLE);
    sr__segment_detach(&seg, false);
    return sr_call_return(c, sr_int(1));
}

static void watchdog_call(int sig)
{
    (void)sig;
    static const char msg[] = "worker1's call with no timeout never failed after its own inbox was corrupted\n";
    ssize_t n = write(2, msg, sizeof(msg) - 1);
    (void)n;
    _exit(3);
}

static int lost_inbox_caller(void)
{
    signal(SIGALRM, watchdog_call);
    alarm(CALL_BOUND_S);
    int64_t t0 = sr__now_ns();
    int rc = sr_rpc_sync(0, "scribble_caller", SR_NOARGS, SR_TIMEOUT_NONE, NULL);
    alarm(0);
    WCHECK(rc == -EPROTO && strstr(sr_last_error(), "inbox ring of worker1 (rank 1) is corrupt") &&
               strstr(sr_last_error(), "RPC to worker0 failed"),
           "the call returned %d after %.3f s: %s", rc, (double)(sr__now_ns() - t0) / 1e9, sr_last_error());
    rc = sr_rpc_sync(0, "scribble_caller", SR_NOARGS, SR_TIMEOUT_NONE, NULL);
    WCHECK(rc == -EPROTO && strstr(sr_last_error(), "inbox ring of worker1 (rank 1) is corrupt"),
           "a later call returned %d: %s", rc, sr_last_error());
    alarm(CALL_BOUND_S);
    rc = sr_shutdown(true, 0);
    alarm(0);
    WCHECK(rc == -EPROTO && strstr(sr_last_error(), "worker1 can no longer receive messages"),
           "a graceful shutdown returned %d: %s", rc, sr_last_error());
    return 0;
}

static int lost_inbox_worker(int rank, int world, void *arg)
{
    (void)world;
    _Atomic uint32_t *stage = arg;
    sr_register("scribble_caller", fn_scribble_caller);
    WCHECK(sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    int rc = 0;
    if (rank == 1) {
        rc = lost_inbox_caller();
        /* release: pairs with rank 0's await_stage */
        atomic_store_explicit(stage, 1, memory_order_release);
    } else { /* serve until worker1 is done, so no failure is taken for its exit */
        WCHECK(await_stage(stage, 1), "worker1 never finished its checks");
    }
    sr_shutdown(false, 0);
    return rc;
}

Test(shm_trust, corrupt_own_inbox_fails_the_calls_waiting_on_it)
{
    run2("trust_lost", lost_inbox_worker);
}

/* ---- the worker table ---------------------------------------------------- */

/* An eventfd field that is not an eventfd (here: stdout) is refused at
 * attach. Before, it was trusted: the doorbell's wake wrote 8 bytes to it,
 * and the eventfd doorbell read from it. */
static int bad_eventfd_worker(int rank, int world, void *arg)
{
    (void)rank, (void)world, (void)arg;
    struct sr_launch_env env;
    sr_segment seg;
    WCHECK(sr__launch_env_get(&env) == 0, "launch env: %s", sr_last_error());
    WCHECK(sr__segment_attach(env.fd, &seg) == 0, "segment: %s", sr_last_error());
    sr__seg_worker(&seg, 0)->eventfd = 1;
    sr__segment_detach(&seg, false);
    sr_xport_opts o = {.start_timeout_ns = WAIT_NS};
    sr_xport *x = NULL;
    int rc = sr__xport_attach(&o, &x);
    if (!rc)
        sr__xport_detach(x);
    WCHECK(rc == -EPROTO, "attach with eventfd 1 in the worker table returned %d, want -EPROTO", rc);
    WCHECK(strstr(sr_last_error(), "rank 0") && strstr(sr_last_error(), "eventfd 1"),
           "the error does not name the rank and the value: %s", sr_last_error());
    return 0;
}

Test(shm_trust, worker_table_eventfd_that_is_not_one_is_refused)
{
    sr_spawn_opts o = {.name_prefix = test_ns("trust_efd"), .shm_size = 64 << 20};
    int rc = sr_spawn(1, bad_eventfd_worker, NULL, &o);
    cr_assert_eq(rc, 0, "job failed: %s", sr_last_error());
}
