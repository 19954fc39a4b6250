/* SPDX-License-Identifier: MIT */
/* The transport frees a burst's slots at the consumer's next receive or wait
 * (not as they are read). The rule that keeps this safe: the consumer
 * releases before it waits, so a producer blocked on a full inbox can never
 * wait on the consumer's wait.
 *
 * Rank 1 fills rank 0's inbox; rank 0 reads it in one burst (every slot now
 * held) and waits at once. Rank 1 then sends one more message with
 * sr__xport_send_wait into that full inbox. If the wait did not release first, rank 1 would wait
 * for space and rank 0 for a message: both bounded waits expire and name the
 * failure. */
#include <criterion/criterion.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "error.h"
#include "shmrpc/spawn.h"
#include "worker_check.h"
#include "shm/xport.h"

LEAK_CHECKED_SUITE(release);

#define SLOTS 8
#define WAIT_NS (5ll * 1000000000)

static sr_msg msg_of(uint32_t v)
{
    sr_msg m = {.type = 1};
    memcpy(m.data, &v, sizeof(v));
    return m;
}

/* Wait (bounded) until the other rank moves the shared stage to `want`. */
static int await_stage(_Atomic uint32_t *stage, uint32_t want)
{
    int64_t until = sr__now_ns() + WAIT_NS;
    /* acquire: pairs with the other rank's release store of the stage, after
     * its sends (or its reads) */
    while (atomic_load_explicit(stage, memory_order_acquire) != want && sr__now_ns() < until)
        sched_yield();
    return atomic_load_explicit(stage, memory_order_acquire) == want; /* acquire: as above */
}

static int producer(sr_xport *x, _Atomic uint32_t *stage)
{
    for (uint32_t i = 0; i < SLOTS; i++) {
        sr_msg m = msg_of(i);
        WCHECK(sr_xport_send(x, 0, &m) == 0, "send %u into an empty inbox: %s", i, sr_last_error());
    }
    /* release: pairs with await_stage; the inbox is full */
    atomic_store_explicit(stage, 1, memory_order_release);
    WCHECK(await_stage(stage, 2), "rank 0 never read the burst");
    sr_msg m = msg_of(SLOTS);
    int rc = sr__xport_send_wait(x, 0, &m, sr__now_ns() + WAIT_NS);
    WCHECK(rc == 0, "the last send found the inbox full for 5 s: %s", sr_last_error());
    return 0;
}

static int consumer(sr_xport *x, _Atomic uint32_t *stage)
{
    sr_msg out[SLOTS];
    WCHECK(await_stage(stage, 1), "rank 1 never filled the inbox");
    unsigned got = sr__xport_recv_burst(x, out, SLOTS);
    WCHECK(got == SLOTS, "one burst read %u of %d messages", got, SLOTS);
    /* release: pairs with await_stage; every slot is read and held by us now */
    atomic_store_explicit(stage, 2, memory_order_release);
    /* Wait straight away, with no receive in between to free the burst. */
    int64_t deadline = sr__now_ns() + WAIT_NS;
    do {
        int ev = sr__xport_wait(x, deadline);
        WCHECK(ev >= 0, "wait: %s", sr_last_error());
        WCHECK(!(ev & SR_WAKE_TIMEOUT) || sr__ring_ready(x->inbox),
               "the last message never came: the wait kept the inbox full");
    } while (!sr__xport_recv_burst(x, out, 1));
    uint32_t v;
    memcpy(&v, out[0].data, sizeof(v));
    WCHECK(v == SLOTS, "got message %u, expected %d", v, SLOTS);
    return 0;
}

static int worker(int rank, int world, void *arg)
{
    (void)world;
    sr_xport_opts o = {.fixed_spin = true, .spin_ns = 0};
    sr_xport *x;
    WCHECK(sr__xport_attach(&o, &x) == 0, "attach: %s", sr_last_error());
    int rc = rank == 0 ? consumer(x, arg) : producer(x, arg);
    sr__xport_detach(x);
    return rc;
}

Test(release, a_consumer_releases_held_slots_before_it_waits)
{
    static _Atomic uint32_t *stage;
    stage = mmap(NULL, sizeof(*stage), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(stage, MAP_FAILED);
    sr_spawn_opts o = {.name_prefix = test_ns("release"), .shm_size = 64 << 20, .ring_slots = SLOTS};
    int rc = sr_spawn(2, worker, stage, &o);
    munmap(stage, sizeof(*stage));
    cr_assert_eq(rc, 0, "job failed: %s", sr_last_error());
}
