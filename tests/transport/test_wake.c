/* SPDX-License-Identifier: MIT */
/* Sleep/wake: no lost wake-up. Two workers hand a counter back and forth
 * SHMRPC_WAKE_N times (default 100k) with no spinning at all, so every
 * handoff goes through the doorbell handshake, and with random delays before
 * each send, so the send lands while the peer is awake, announcing sleep,
 * re-checking, or asleep. A lost wake-up shows as a bounded wait that
 * expires with the handoff number in the message. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "common.h"
#include "error.h"
#include "helpers/fifo.h"
#include "helpers/proc_state.h"
#include "shmrpc/spawn.h"
#include "worker_check.h"
#include "shm/xport.h"
#include "transport.h"

LEAK_CHECKED_SUITE(wake);

#define WAIT_NS (10ll * 1000000000)

static long handoffs(void)
{
    const char *s = getenv("SHMRPC_WAKE_N");
    return s ? atol(s) : 100000;
}

static void random_delay(unsigned *seed)
{
    unsigned r = (unsigned)rand_r(seed) % 16;
    if (r < 8)
        return; /* send at once: the peer is likely still awake */
    if (r < 12)
        sched_yield();
    else
        for (volatile unsigned i = 0, n = (unsigned)rand_r(seed) % 20000; i < n; i++)
            ; /* up to ~20 us: the peer is announcing sleep or asleep */
}

static int receive(sr_xport *x, uint64_t want)
{
    int64_t deadline = sr__now_ns() + WAIT_NS;
    sr_msg m;
    while (!sr__xport_recv_burst(x, &m, 1)) {
        int ev = sr__xport_wait(x, deadline);
        WCHECK(ev >= 0, "wait failed: %s", sr_last_error());
        /* No handoff legitimately takes 10 s, so any timeout is a lost
         * wake-up, even if the message turns out to be in the ring by now. */
        WCHECK(!(ev & SR_WAKE_TIMEOUT), "rank %d: lost wake-up: slept 10 s waiting for handoff %llu (%s)",
               x->rank, (unsigned long long)want, sr__ring_ready(x->inbox) ? "it was in the ring" : "never arrived");
    }
    uint64_t got;
    memcpy(&got, m.data, sizeof(got));
    WCHECK(got == want, "rank %d: handoff %llu arrived, expected %llu", x->rank, (unsigned long long)got,
           (unsigned long long)want);
    return 0;
}

static int wake_worker(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    sr_xport_opts o = {.fixed_spin = true, .spin_ns = 0};
    sr_xport *x;
    WCHECK(sr__xport_attach(&o, &x) == 0, "attach: %s", sr_last_error());
    unsigned seed = 99u + (unsigned)rank;
    long n = handoffs();
    int rc = 0;
    for (uint64_t i = (uint64_t)rank; !rc && i < (uint64_t)n; i += 2) {
        if (rank == 1 || i > 0)
            rc = receive(x, i);
        if (rc)
            break;
        random_delay(&seed);
        sr_msg m = {.type = 1};
        uint64_t next = i + 1;
        if (next >= (uint64_t)n)
            break; /* the peer stops after the last handoff and may be gone */
        memcpy(m.data, &next, sizeof(next));
        rc = sr_xport_send(x, 1 - rank, &m);
        WCHECK(rc == 0, "send of handoff %llu failed: %s", (unsigned long long)next, sr_last_error());
    }
    if (!rc && rank == 0)
        fprintf(stderr, "wake: %ld handoffs, %llu sleeps, %llu wakes issued by rank 0\n", n,
                (unsigned long long)x->st.sleeps, (unsigned long long)x->st.wakes);
    sr__xport_detach(x);
    return rc;
}

Test(wake, no_lost_wakeup_over_many_handoffs, .timeout = 300)
{
    sr_spawn_opts o = {.name_prefix = test_ns("wake"), .shm_size = 64 << 20};
    int rc = sr_spawn(2, wake_worker, NULL, &o);
    cr_assert_eq(rc, 0, "wake job failed: %s", sr_last_error());
}

/* ---- a holder's sleep feeds the adaptive spin budget ---- */

static bool never_busy(void *arg)
{
    (void)arg;
    return false;
}

/* A token holder's doorbell sleep (the wake group's hold_sleep) is a sleep
 * for a message like any other, so it adapts the budget
 * (sr__spin_adapt_next): a 20 ms sleep, far longer than the cap, halves it.
 * Before, only the sleeping thread's sleeps adapted it, so once they had
 * halved it to 0 a holder (a thread in rpc_sync, sr_future_wait or
 * sr_shutdown) never spun again and slept on every wait. */
static int holder_worker(int rank, int world, void *arg)
{
    (void)rank;
    (void)world;
    (void)arg;
    sr_xport_opts o = {.fixed_spin = false};
    sr_xport *x;
    WCHECK(sr__xport_attach(&o, &x) == 0, "attach: %s", sr_last_error());
    sr_tport *t = sr__xport_transport(x);
    const int64_t before = 40000;
    atomic_store(&x->spin_ns, before);
    int rc = t->ops->wake->hold_sleep(t, NULL, 0, sr__now_ns() + 20 * 1000000ll, never_busy, NULL);
    int64_t after = atomic_load(&x->spin_ns);
    sr__xport_detach(x);
    if (rc == -EOPNOTSUPP) {
        fprintf(stderr, "wake: skipped: no futex doorbell, so no holder sleeps\n");
        return 0;
    }
    WCHECK(rc == 0, "hold_sleep: %d", rc);
    WCHECK(after == before / 2, "a 20 ms holder's sleep left the spin budget at %lld ns, want %lld (halved)",
           (long long)after, (long long)before / 2);
    return 0;
}

Test(wake, a_holders_sleep_adapts_the_spin_budget, .timeout = 60)
{
    unsetenv("SHMRPC_SPIN_NS"); /* a fixed budget never adapts */
    sr_spawn_opts o = {.name_prefix = test_ns("wake-hold"), .shm_size = 64 << 20};
    int rc = sr_spawn(1, holder_worker, NULL, &o);
    cr_assert_eq(rc, 0, "job failed: %s", sr_last_error());
}

/* ---- a spinning waiter gives way to a thread queued on its core ---- */

/* The waiter spins (a fixed 500 ms budget) with a thread queued behind it
 * on its core: the thread that sends the message it waits for. Both are
 * SCHED_FIFO at one priority on one CPU, so the queued thread can run only
 * when the spinner gives way (spin.h): nothing preempts it. With the yield
 * the message arrives within the spin (a spin hit); without it the spinner
 * spends its whole budget, sleeps, and only then lets the sender run. */
struct sender {
    sr_xport *x;
};

static void *send_to_self(void *arg)
{
    struct sender *s = arg;
    sr_msg m = {.type = 1};
    return (void *)(intptr_t)sr_xport_send(s->x, s->x->rank, &m);
}

static int give_way_worker(int rank, int world, void *arg)
{
    (void)rank;
    (void)world;
    (void)arg;
    sr_xport_opts o = {.fixed_spin = true, .spin_ns = 500 * 1000000ll};
    sr_xport *x;
    WCHECK(sr__xport_attach(&o, &x) == 0, "attach: %s", sr_last_error());
    pthread_attr_t attr;
    int rc = fifo_on_cpu(sched_getcpu(), &attr);
    if (rc == -EPERM) {
        fprintf(stderr, "wake: skipped: no permission for SCHED_FIFO (needs CAP_SYS_NICE)\n");
        sr__xport_detach(x);
        return 0;
    }
    WCHECK(rc == 0, "SCHED_FIFO on one CPU: %s", strerror(-rc));
    uint64_t hits = atomic_load(&x->st.spin_hits);
    struct sender s = {x};
    pthread_t t;
    WCHECK(pthread_create(&t, &attr, send_to_self, &s) == 0, "cannot start the sender");
    int64_t t0 = sr__now_ns();
    int ev = sr__xport_wait(x, t0 + WAIT_NS); /* the sender is queued behind this spin */
    int64_t waited = sr__now_ns() - t0;
    void *sent;
    pthread_join(t, &sent);
    pthread_attr_destroy(&attr);
    struct sched_param other = {0};
    sched_setscheduler(0, SCHED_OTHER, &other);
    uint64_t hit = atomic_load(&x->st.spin_hits) - hits;
    sr__xport_detach(x);
    WCHECK((intptr_t)sent == 0, "the sender's send failed: %d", (int)(intptr_t)sent);
    WCHECK(ev >= 0 && !(ev & SR_WAKE_TIMEOUT), "the wait ended with %d", ev);
    WCHECK(hit == 1, "the message arrived after the spin, not during it (%.1f ms into the wait): the spinner did "
           "not give way to the sender queued on its core", waited / 1e6);
    return 0;
}

Test(wake, a_spinning_waiter_gives_way_to_a_thread_queued_on_its_core, .timeout = 60)
{
    sr_spawn_opts o = {.name_prefix = test_ns("wake-give"), .shm_size = 64 << 20};
    int rc = sr_spawn(1, give_way_worker, NULL, &o);
    cr_assert_eq(rc, 0, "job failed: %s", sr_last_error());
}

/* ---- rings owed and handed on (doorbell.h, R1 and R2) ---- */

/* rank 1 sleeps on its inbox (it watches the slot at its head, doorbell.h)
 * and must be woken for two messages that rank 0 sends in each of three
 * ways: a quiet send (into the watched slot: it owes the ring) then a loud
 * one into the next, unwatched slot, which must pay it; a quiet send then
 * ring_peer; a lazy send (it hands the watch on) then a loud one. A lost
 * wake-up is a 10 s sleep, reported with the round. Regression: a loud send
 * rang only for its own slot, so the first way left rank 1 asleep (the RRef
 * chain test's barrier timed out). */
static bool head_watched(sr_xport *x, int rank)
{
    struct sr_ring *r = x->peers[rank].inbox;
    uint32_t size = x->seg.ring_slots;
    /* relaxed: a look at the peer's words (its head is its R1 store) */
    uint32_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint32_t id = sr__ring_mark_id(size, atomic_load_explicit(&r->slots[head & (size - 1)].seq, memory_order_relaxed),
                                   head);
    return id == SR_RING_FREE_W || atomic_load_explicit(&r->claim_watch, memory_order_relaxed);
}

/* The process's (one) thread is blocked in the kernel. */
static bool blocked(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    return proc_stat_sleeps(path);
}

/* rank 1 watches its inbox and sleeps in the kernel: only a ring wakes it. */
static bool asleep_watching(sr_xport *x)
{
    pid_t pid = sr__seg_worker(&x->seg, 1)->pid; /* published at attach, before the start barrier */
    return head_watched(x, 1) && blocked(pid);
}

static int owed_sender(sr_xport *x)
{
    for (uint64_t round = 0; round < 3; round++) {
        int64_t until = sr__now_ns() + WAIT_NS;
        while (!asleep_watching(x) && sr__now_ns() < until)
            sched_yield();
        WCHECK(asleep_watching(x), "round %llu: rank 1 never slept watching its inbox", (unsigned long long)round);
        sr_msg m = {.type = 1};
        uint64_t v = 2 * round;
        memcpy(m.data, &v, sizeof(v));
        int rc = round == 2 ? sr__xport_send_lazy(x, 1, &m) : sr__xport_send_quiet(x, 1, &m);
        WCHECK(rc == 0, "round %llu: first send: %s", (unsigned long long)round, sr_last_error());
        v++;
        memcpy(m.data, &v, sizeof(v));
        if (round == 1)
            rc = sr__xport_send_quiet(x, 1, &m) || sr__xport_ring_peer(x, 1);
        else
            rc = sr_xport_send(x, 1, &m);
        WCHECK(rc == 0, "round %llu: second send: %s", (unsigned long long)round, sr_last_error());
    }
    return 0;
}

static int owed_worker(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    sr_xport_opts o = {.fixed_spin = true, .spin_ns = 0};
    sr_xport *x;
    WCHECK(sr__xport_attach(&o, &x) == 0, "attach: %s", sr_last_error());
    int rc = 0;
    if (rank == 0)
        rc = owed_sender(x);
    for (uint64_t i = 0; rank == 1 && !rc && i < 6; i++)
        rc = receive(x, i);
    sr__xport_detach(x);
    return rc;
}

Test(wake, a_ring_owed_by_quiet_or_lazy_sends_is_paid, .timeout = 120)
{
    sr_spawn_opts o = {.name_prefix = test_ns("wake-owed"), .shm_size = 64 << 20};
    int rc = sr_spawn(2, owed_worker, NULL, &o);
    cr_assert_eq(rc, 0, "owed-ring job failed: %s", sr_last_error());
}
