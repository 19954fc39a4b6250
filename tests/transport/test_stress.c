/* SPDX-License-Identifier: MIT */
/* Many producers, one consumer, across processes, oversubscribed on purpose:
 * 8 producer processes feed rank 0 through a small inbox (back-pressure on
 * every lap). Every message carries (producer, sequence, stamp). The
 * consumer checks that nothing is lost, duplicated, torn or reordered per
 * producer. Length: SHMRPC_STRESS_N messages per producer (default short). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "error.h"
#include "shmrpc/spawn.h"
#include "worker_check.h"
#include "shm/xport.h"

LEAK_CHECKED_SUITE(stress);

#define PRODUCERS 8
#define WAIT_NS (20ll * 1000000000)

struct item {
    uint32_t producer, seq;
    uint64_t stamp;
};

static uint64_t stamp_of(uint32_t producer, uint32_t seq)
{
    uint64_t x = ((uint64_t)producer << 32 | seq) * 0x9e3779b97f4a7c15ull;
    return x ^ (x >> 29);
}

static long per_producer(void)
{
    const char *s = getenv("SHMRPC_STRESS_N");
    return s ? atol(s) : 20000;
}

static int produce(sr_xport *x, long n)
{
    unsigned seed = (unsigned)x->rank * 7919u;
    for (uint32_t seq = 0; seq < n; seq++) {
        sr_msg m = {.type = 1};
        struct item it = {(uint32_t)x->rank, seq, stamp_of((uint32_t)x->rank, seq)};
        memcpy(m.data, &it, sizeof(it));
        memset(m.data + sizeof(it), x->rank, SR_MSG_DATA - sizeof(it));
        int rc = sr__xport_send_wait(x, 0, &m, sr__now_ns() + WAIT_NS);
        WCHECK(rc == 0, "producer %d: send %u failed: %s", x->rank, seq, sr_last_error());
        if (rand_r(&seed) % 64 == 0) /* vary the interleaving */
            sched_yield();
    }
    return 0;
}

static int check_item(const sr_msg *m, uint32_t *next)
{
    struct item it;
    memcpy(&it, m->data, sizeof(it));
    WCHECK(it.producer >= 1 && it.producer <= PRODUCERS && m->src == it.producer,
           "message from rank %u claims producer %u", m->src, it.producer);
    WCHECK(it.stamp == stamp_of(it.producer, it.seq), "torn message: producer %u seq %u", it.producer, it.seq);
    for (size_t i = sizeof(it); i < SR_MSG_DATA; i++)
        WCHECK(m->data[i] == it.producer, "torn payload: producer %u seq %u byte %zu", it.producer, it.seq, i);
    WCHECK(it.seq == next[it.producer], "producer %u: got seq %u, expected %u (lost, duplicated or reordered)",
           it.producer, it.seq, next[it.producer]);
    next[it.producer]++;
    return 0;
}

static int consume(sr_xport *x, long n)
{
    uint32_t next[PRODUCERS + 1] = {0};
    long total = 0, want = n * PRODUCERS;
    unsigned seed = 12345;
    sr_msg burst[32];
    while (total < want) {
        unsigned got = sr__xport_recv_burst(x, burst, 1 + (unsigned)rand_r(&seed) % 32);
        for (unsigned i = 0; i < got; i++)
            if (check_item(&burst[i], next))
                return 1;
        total += got;
        if (!got) {
            int ev = sr__xport_wait(x, sr__now_ns() + WAIT_NS);
            WCHECK(ev >= 0 && !(ev & SR_WAKE_TIMEOUT), "consumer slept 20 s at %ld of %ld messages (%s)", total,
                   want, sr__ring_ready(x->inbox) ? "lost wake-up" : "nothing arrived");
        }
    }
    sr_msg extra;
    WCHECK(sr__xport_recv_burst(x, &extra, 1) == 0, "a message beyond the expected %ld arrived", want);
    return 0;
}

static int stress_worker(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    sr_xport *x;
    WCHECK(sr__xport_attach(NULL, &x) == 0, "attach: %s", sr_last_error());
    int rc = rank == 0 ? consume(x, per_producer()) : produce(x, per_producer());
    sr__xport_detach(x);
    return rc;
}

Test(stress, eight_producers_lose_nothing, .timeout = 240)
{
    sr_spawn_opts o = {.ring_slots = 64, .name_prefix = test_ns("stress"), .shm_size = 128 << 20};
    int rc = sr_spawn(PRODUCERS + 1, stress_worker, NULL, &o);
    cr_assert_eq(rc, 0, "stress job failed: %s", sr_last_error());
}
