/* SPDX-License-Identifier: MIT */
/* Ring semantics on a single thread: FIFO, capacity and back-pressure,
 * bursts, wrap-around of the 32-bit indices, a claimed-but-unpublished
 * slot holding back the consumer (a preempted producer), and slots held by
 * a read until they are released. Then process death, with forked children
 * on a ring in MAP_SHARED memory: a producer killed between its claim and
 * its publish (reaped: its slot skipped; a slow live one's never), a
 * consumer killed holding slots (recovered by a successor), and both under
 * load with every message counted. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"
#include "common.h"
#define EVENT_WAIT_S 20
#include "shared_event.h"

LEAK_CHECKED_SUITE(ring);

#define PRODUCER 3u /* the producer id (a rank) of this process's enqueues */

/* The consumer's private view of the ring under test, taken at its first
 * use (after ring_set_position, which writes the shared position). */
static struct sr_ring_cons view;

static struct sr_ring_cons *cons(struct sr_ring *r)
{
    char why[160];
    if (view.ring != r)
        cr_assert_eq(sr__ring_cons_attach(&view, r, r->size, why, sizeof(why)), 0, "attach: %s", why);
    return &view;
}

static struct sr_ring *ring_new(uint32_t slots)
{
    struct sr_ring *r = aligned_alloc(SR_CACHELINE, sr__ring_bytes(slots));
    cr_assert_not_null(r);
    sr__ring_init(r, slots);
    view.ring = NULL;
    return r;
}

static sr_msg msg_of(uint32_t v)
{
    sr_msg m = {.type = (uint16_t)(v & 0xffff)};
    memcpy(m.data, &v, sizeof(v));
    memset(m.data + 4, (int)(v & 0xff), SR_MSG_DATA - 4);
    return m;
}

static uint32_t value_of(const sr_msg *m)
{
    uint32_t v;
    memcpy(&v, m->data, sizeof(v));
    for (int i = 4; i < SR_MSG_DATA; i++)
        cr_assert_eq(m->data[i], v & 0xff, "message %u is torn at byte %d", v, i);
    return v;
}

Test(ring, empty_ring_yields_nothing)
{
    struct sr_ring *r = ring_new(8);
    sr_msg out[4];
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 4), 0);
    cr_assert_not(sr__ring_ready(cons(r)));
    free(r);
}

Test(ring, fifo_order_and_whole_message)
{
    struct sr_ring *r = ring_new(16);
    for (uint32_t i = 0; i < 10; i++) {
        sr_msg m = msg_of(i);
        cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0);
    }
    cr_assert(sr__ring_ready(cons(r)));
    sr_msg out[16];
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 16), 10, "a burst returns every ready message and no more");
    for (uint32_t i = 0; i < 10; i++)
        cr_assert_eq(value_of(&out[i]), i);
    free(r);
}

Test(ring, full_ring_reports_backpressure_and_drops_nothing)
{
    struct sr_ring *r = ring_new(8);
    for (uint32_t i = 0; i < 8; i++) {
        sr_msg m = msg_of(i);
        cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0, "slot %u of 8 must be free", i);
    }
    sr_msg extra = msg_of(99);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &extra), -EAGAIN, "a full ring must say -EAGAIN");
    sr_msg out[8];
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 3), 3);
    for (uint32_t i = 0; i < 3; i++) {
        sr_msg m = msg_of(8 + i);
        cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0, "freed slot %u must be reusable", i);
    }
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &extra), -EAGAIN);
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 8);
    for (uint32_t i = 0; i < 8; i++)
        cr_assert_eq(value_of(&out[i]), 3 + i, "order after refill");
    free(r);
}

Test(ring, many_laps_with_varying_bursts)
{
    struct sr_ring *r = ring_new(32);
    uint32_t next_in = 0, next_out = 0;
    srand(7);
    while (next_out < 32 * 1000) {
        int n = rand() % 40;
        for (int i = 0; i < n; i++) {
            sr_msg m = msg_of(next_in);
            if (sr__ring_enqueue(r, r->size, PRODUCER, &m) != 0)
                break;
            next_in++;
        }
        sr_msg out[40];
        unsigned got = sr__ring_dequeue_burst(cons(r), out, (unsigned)(rand() % 40));
        for (unsigned i = 0; i < got; i++)
            cr_assert_eq(value_of(&out[i]), next_out++, "lost or reordered message");
        cr_assert_leq(next_in - next_out, 32u, "the ring never holds more than its size");
    }
    free(r);
}

/* Start the free-running indices just below 2^32 and cross over. */
static void ring_set_position(struct sr_ring *r, uint32_t pos)
{
    for (uint32_t i = 0; i < r->size; i++) {
        uint32_t p = pos + ((i - pos) & r->mask); /* first position >= pos that maps to slot i */
        atomic_store(&r->slots[i].seq, p);
    }
    atomic_store(&r->tail, pos);
    atomic_store(&r->head, pos);
    view.ring = NULL;
}

Test(ring, indices_wrap_around_2_pow_32)
{
    struct sr_ring *r = ring_new(8);
    ring_set_position(r, UINT32_MAX - 20);
    uint32_t next_out = 0;
    for (uint32_t i = 0; i < 200; i++) {
        sr_msg m = msg_of(i);
        cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0, "enqueue %u near the wrap", i);
        if (i % 3 == 2 || i % 8 == 7) {
            sr_msg out[8];
            unsigned got = sr__ring_dequeue_burst(cons(r), out, 8);
            for (unsigned k = 0; k < got; k++)
                cr_assert_eq(value_of(&out[k]), next_out++);
        }
    }
    cr_assert_lt(atomic_load(&r->tail), 1000u, "tail wrapped past 2^32");
    free(r);
}

Test(ring, unpublished_slot_holds_back_the_consumer)
{
    struct sr_ring *r = ring_new(8);
    /* A producer claims position 0 and is "preempted" before publishing. */
    uint32_t pos = 0; /* set by the enqueue or claim; gcc -O2 cannot always tell */
    cr_assert_eq(sr__ring_claim(r, r->size, 7, &pos), 0);
    cr_assert_eq(pos, 0u);
    sr_msg m = msg_of(1);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0, "other producers keep claiming slots");
    sr_msg out[8];
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 0, "FIFO: the consumer waits for position 0");
    sr_msg m0 = msg_of(0);
    sr__ring_publish(r, r->size, pos, &m0);
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 2);
    cr_assert_eq(value_of(&out[0]), 0u);
    cr_assert_eq(value_of(&out[1]), 1u);
    free(r);
}

/* Watching the head (doorbell.h): a consumer about to sleep watches the
 * free slot at its head; the producer that claims it is told to ring
 * (enqueue returns 1), and only it: the claims after it, and every send
 * once the consumer polls again (unwatch), are not. A watch of a published
 * head fails (poll instead). A claimed, unpublished head gets the claim
 * watch, which every producer sees after its publish (and a read or an
 * unwatch clears). */
Test(ring, the_claim_of_a_watched_head_rings_and_no_other)
{
    struct sr_ring *r = ring_new(8);
    sr_msg m = msg_of(0), out[8];
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0, "nobody watches: no ring");
    cr_assert(!sr__ring_claim_watched(r), "no claim watch");
    cr_assert(!sr__ring_watch(cons(r)), "a message is ready at head: poll, not sleep");
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 1);
    cr_assert(sr__ring_watch(cons(r)), "a free head is watched");
    cr_assert(sr__ring_watch(cons(r)), "watching twice is watching");
    cr_assert(!sr__ring_cons_pending(cons(r)), "a watched free slot is nothing to read");
    m = msg_of(1);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 1, "the claim of the watched head rings");
    m = msg_of(2);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0, "the one behind it does not");
    cr_assert(!sr__ring_claim_watched(r), "a free head was watched: no claim watch");
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 2);
    cr_assert_eq(value_of(&out[0]), 1u);
    cr_assert(sr__ring_watch(cons(r)), "watched at position 3");
    sr__ring_unwatch(cons(r));
    m = msg_of(3);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0, "unwatched again: no ring");
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 1);
    /* A claimed head, watched before its publish: the claim watch. */
    uint32_t pos = 0; /* set by the enqueue or claim; gcc -O2 cannot always tell */
    cr_assert_eq(sr__ring_claim(r, r->size, 7, &pos), 0);
    cr_assert(sr__ring_watch(cons(r)), "a claimed head is watched (the claim watch)");
    cr_assert(!sr__ring_cons_pending(cons(r)), "a claim is nothing to read yet");
    m = msg_of(4);
    sr__ring_publish(r, r->size, pos, &m);
    cr_assert(sr__ring_claim_watched(r), "its publisher sees the claim watch: it rings");
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 1);
    cr_assert_eq(value_of(&out[0]), 4u);
    cr_assert(!sr__ring_claim_watched(r), "the read cleared the claim watch");
    free(r);
}

/* A lazy send (doorbell.h R2) into a watched head does not ring for
 * itself: it hands the watch on to the next position, whose producer
 * rings, whether that one claims after the hand-on (the watched free slot)
 * or had claimed before it (the claim watch). It cannot hand it on to a
 * published slot: it rings then. */
/* A ring of 8 whose consumer watched its head, and a lazy send (message 0)
 * that took the watched slot and handed the watch on to position 1. */
static struct sr_ring *watch_handed_on(void)
{
    struct sr_ring *r = ring_new(8);
    sr_msg m = msg_of(0);
    uint32_t pos = 0; /* set by the enqueue; gcc -O2 cannot always tell */
    cr_assert(sr__ring_watch(cons(r)));
    cr_assert_eq(sr__ring_enqueue_at(r, r->size, PRODUCER, &m, &pos), 1);
    cr_assert(sr__ring_watch_next(r, r->size, pos), "the free slot of position 1 is watched now");
    return r;
}

Test(ring, a_lazy_send_hands_the_watch_on)
{
    struct sr_ring *r = watch_handed_on();
    sr_msg m = msg_of(1), out[8];
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 1, "the next send rings");
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 2);
    /* The next position claimed before the hand-on: the claim watch. */
    cr_assert(sr__ring_watch(cons(r)));
    uint32_t lazy = 0, next = 0; /* set by the claims; gcc -O2 cannot tell */
    cr_assert_eq(sr__ring_claim(r, r->size, 7, &lazy), 1, "the claim of a watched head says so");
    cr_assert_eq(sr__ring_claim(r, r->size, 7, &next), 0);
    m = msg_of(2);
    sr__ring_publish(r, r->size, lazy, &m);
    cr_assert(sr__ring_watch_next(r, r->size, lazy), "the claim of position 3 is watched now");
    m = msg_of(3);
    sr__ring_publish(r, r->size, next, &m);
    cr_assert(sr__ring_claim_watched(r), "its publisher sees the claim watch: it rings");
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 2);
    /* The next position published before the hand-on: ring. */
    cr_assert(sr__ring_watch(cons(r)));
    cr_assert_eq(sr__ring_claim(r, r->size, 7, &lazy), 1);
    m = msg_of(5);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0);
    m = msg_of(4);
    sr__ring_publish(r, r->size, lazy, &m);
    cr_assert(!sr__ring_watch_next(r, r->size, lazy), "position 5 is published: the lazy sender rings");
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 2);
    free(r);
}

/* A watch handed on by a lazy send while the consumer slept is stale once
 * the consumer polls: its read leaves no watched slot ahead, so the next
 * send does not ring the parked thread (it did: remote+to_here's owner
 * woke the driver's progress thread on a third of its calls, p99 2 -> 30
 * us). The watch the consumer sets before it sleeps again still rings. */
Test(ring, a_read_clears_the_watch_handed_on_ahead)
{
    struct sr_ring *r = watch_handed_on();
    sr_msg m = msg_of(1), out[8];
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 1, "the consumer woke and polls");
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0, "a send to a polling consumer rings nobody");
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 1);
    cr_assert(sr__ring_watch(cons(r)), "the consumer stops polling");
    m = msg_of(2);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 1, "its own watch still rings");
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 1);
    free(r);
}

/* sr__ring_read_burst hands messages out but keeps their slots until
 * sr__ring_release: a held slot is as full as an unread one. */
Test(ring, read_slots_stay_held_until_released)
{
    struct sr_ring *r = ring_new(4);
    for (uint32_t i = 0; i < 4; i++) {
        sr_msg m = msg_of(i);
        cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0);
    }
    sr_msg out[4], extra = msg_of(99);
    cr_assert_eq(sr__ring_read_burst(cons(r), out, 2), 2);
    cr_assert_eq(value_of(&out[1]), 1u);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &extra), -EAGAIN, "two slots are read but still held");
    cr_assert_eq(sr__ring_read_burst(cons(r), out, 4), 2, "reads continue after the held ones");
    cr_assert_eq(value_of(&out[0]), 2u);
    cr_assert_not(sr__ring_ready(cons(r)));
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &extra), -EAGAIN, "all four held");
    cr_assert_eq(sr__ring_release(cons(r)), 4u, "one release frees every held slot");
    cr_assert_eq(sr__ring_release(cons(r)), 0u);
    for (uint32_t i = 0; i < 4; i++) {
        sr_msg m = msg_of(4 + i);
        cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0, "released slot %u must be reusable", i);
    }
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 4), 4);
    cr_assert_eq(value_of(&out[3]), 7u);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &extra), 0, "dequeue_burst releases at once");
    free(r);
}

/* A claimed but unpublished slot of the previous lap (its claimer's mark) is
 * a full ring, legal: not mistaken for corruption. */
Test(ring, unpublished_slot_of_last_lap_is_full_not_corrupt)
{
    struct sr_ring *r = ring_new(4);
    sr_msg m = msg_of(0), out[4];
    for (uint32_t i = 0; i < 4; i++)
        cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0);
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 4), 4);
    /* A producer claims position 4 (slot 0) and stalls; positions 5..7 fill. */
    uint32_t pos = 0; /* set by the enqueue or claim; gcc -O2 cannot always tell */
    cr_assert_eq(sr__ring_claim(r, r->size, 9, &pos), 0);
    cr_assert_eq(pos, 4u);
    for (uint32_t i = 0; i < 3; i++)
        cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0);
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 4), 0, "the consumer waits for position 4");
    /* Position 8 maps to slot 0, which still says 4: one lap behind, full. */
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), -EAGAIN);
    free(r);
}

/* Scrambled sequence words (a peer writing over the segment): every value no
 * legal history produces is -EPROTO, at once. Before, a sequence ahead of a
 * tail that never moves made sr__ring_enqueue re-read the tail for ever (the
 * .timeout catches that), and one more than a lap behind made it report a
 * full ring for ever. */
static void expect_corrupt_at_tail(uint32_t size, uint32_t tail_pos, int64_t delta, const char *what)
{
    struct sr_ring *r = ring_new(size);
    ring_set_position(r, tail_pos);
    sr_msg m = msg_of(1), out[1];
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0);
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 1), 1);
    uint32_t tail = atomic_load(&r->tail);
    atomic_store(&r->slots[tail & r->mask].seq, tail + (uint32_t)delta);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), -EPROTO, "%s (size %u, tail %u): want -EPROTO", what, size, tail);
    cr_assert_eq(atomic_load(&r->tail), tail, "%s: nothing was claimed", what);
    free(r);
}

Test(ring, scrambled_sequence_is_eproto_not_a_spin, .timeout = 20)
{
    uint32_t sizes[] = {4, 8, 1024};
    uint32_t starts[] = {0, UINT32_MAX - 2};
    for (unsigned s = 0; s < 3; s++)
        for (unsigned p = 0; p < 2; p++) {
            uint32_t n = sizes[s];
            expect_corrupt_at_tail(n, starts[p], 1, "published ahead of an unmoved tail");
            expect_corrupt_at_tail(n, starts[p], (int64_t)n, "freed a lap ahead of an unmoved tail");
            expect_corrupt_at_tail(n, starts[p], 3 + (int64_t)n, "not congruent, ahead");
            expect_corrupt_at_tail(n, starts[p], -2 * (int64_t)n, "two laps behind");
            expect_corrupt_at_tail(n, starts[p], 1 - 3 * (int64_t)n, "published three laps behind");
            expect_corrupt_at_tail(n, starts[p], -(int64_t)n / 2, "not congruent, behind");
        }
}

/* A tail moved backwards (a foreign write) finds a published slot of its
 * past: -EPROTO, not a spin. */
Test(ring, tail_moved_backwards_is_eproto_not_a_spin, .timeout = 20)
{
    struct sr_ring *r = ring_new(8);
    sr_msg m = msg_of(1);
    for (uint32_t i = 0; i < 5; i++)
        cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0);
    atomic_store(&r->tail, 2);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), -EPROTO);
    free(r);
}

/* Space waiters (W1/W2): each producer's bit is taken once, with the summary. */
Test(ring, space_waiters_are_taken_once)
{
    struct sr_ring *r = ring_new(4);
    cr_assert_eq(sr__ring_space_take(r), 0u, "nobody waits");
    sr__ring_space_arm(r, 5, false);
    sr__ring_space_arm(r, 70, false);
    sr__ring_space_arm(r, SR_RING_MAX_PRODUCERS - 1, false);
    cr_assert_eq(sr__ring_space_take(r), SR_SPACE_RANKS);
    cr_assert_eq(sr__ring_space_take(r), 0u, "the summary is taken once");
    cr_assert_eq(sr__ring_space_ranks(r, 0), UINT64_C(1) << 5);
    cr_assert_eq(sr__ring_space_ranks(r, 1), UINT64_C(1) << 6);
    cr_assert_eq(sr__ring_space_ranks(r, SR_RING_MAX_PRODUCERS / 64 - 1), UINT64_C(1) << 63);
    cr_assert_eq(sr__ring_space_ranks(r, 0), 0u, "bits are taken once");
    sr__ring_space_arm(r, 0, true);
    cr_assert_eq(sr__ring_space_take(r), SR_SPACE_FUTEX);
    free(r);
}

/* ---- process death: a producer, or the consumer ------------------------- */

/* A ring in a MAP_SHARED mapping, so that forked children share it. */
static struct sr_ring *shared_ring(uint32_t slots, size_t extra, void **extra_at)
{
    size_t ring = sr__ring_bytes(slots);
    void *p = mmap(NULL, ring + extra, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(p, MAP_FAILED, "mmap: %s", strerror(errno));
    struct sr_ring *r = p;
    sr__ring_init(r, slots);
    view.ring = NULL;
    if (extra_at)
        *extra_at = (char *)p + ring;
    return r;
}

static void shared_ring_free(struct sr_ring *r, size_t extra)
{
    munmap(r, sr__ring_bytes(r->size) + extra);
}

/* Reap a child that must have been killed by SIGKILL. */
static void reap_killed(pid_t pid, const char *who)
{
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid, "waitpid %s: %s", who, strerror(errno));
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "%s: want death by SIGKILL, status %#x", who, st);
}

/* A child, producer `id`, that claims a slot and is killed before it
 * publishes: exactly what a producer killed between claim and publish leaves. */
static pid_t producer_killed_after_claim(struct sr_ring *r, uint32_t id)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        uint32_t pos = 0; /* set by the enqueue or claim; gcc -O2 cannot always tell */
        if (sr__ring_claim(r, r->size, id, &pos) == 0)
            raise(SIGKILL);
        _exit(3); /* no slot: the parent sees exit status 3, not SIGKILL */
    }
    return pid;
}

/* Read everything ready now (released at once); at most `max` messages. */
static unsigned drain(struct sr_ring *r, uint32_t *vals, unsigned max)
{
    unsigned got = 0;
    sr_msg out[8];
    for (;;) {
        unsigned n = sr__ring_dequeue_burst(cons(r), out, max - got < 8 ? max - got : 8);
        for (unsigned i = 0; i < n; i++)
            vals[got++] = value_of(&out[i]);
        if (!n || got == max)
            return got;
    }
}

#define DEAD 11u /* the dead producer's id (rank) */
#define LIVE 12u /* a live, slow producer's id */

/* Before sr__ring_reap_producer, the consumer stopped for ever at the slot of
 * a producer killed between its claim and its publish. */
Test(ring, producer_killed_between_claim_and_publish_is_reaped, .timeout = 30)
{
    struct sr_ring *r = shared_ring(8, 0, NULL);
    sr_msg m = msg_of(0);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0);
    reap_killed(producer_killed_after_claim(r, DEAD), "the producer killed after its claim");
    for (uint32_t i = 1; i <= 5; i++) {
        m = msg_of(i);
        cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0, "message %u: later producers keep going", i);
    }
    uint32_t vals[64];
    cr_assert_eq(drain(r, vals, 64), 1u, "the consumer reads up to the dead producer's slot");
    int live = sr__ring_reap_producer(r, r->size, PRODUCER);
    int dead = sr__ring_reap_producer(r, r->size, DEAD);
    bool ready = sr__ring_ready(cons(r));
    unsigned got = drain(r, vals, 64);
    cr_assert_eq(got, 5u, "the consumer stalled at the dead producer's slot (position 1): %u of the 5 later "
                          "messages delivered",
                 got);
    cr_assert_eq(live, 0, "a live producer's published slots are not reaped");
    cr_assert_eq(dead, 1, "the dead producer's claimed slot is voided");
    cr_assert(ready, "a void slot at the head is work for the consumer");
    for (uint32_t i = 0; i < 5; i++)
        cr_assert_eq(vals[i], i + 1, "later messages in order");
    cr_assert_eq(sr__ring_reap_producer(r, r->size, DEAD), 0, "reaping twice voids nothing more");
    /* the voided slot is reusable: several laps more */
    for (uint32_t i = 0; i < 40; i++) {
        m = msg_of(100 + i);
        cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0, "lap %u after the reap", i / 8);
        cr_assert_eq(drain(r, vals, 64), 1u);
        cr_assert_eq(vals[0], 100 + i);
    }
    shared_ring_free(r, 0);
}

/* A producer that died after its mark but before it moved tail on (T1): the
 * next producers move tail on for it instead of stopping, and the reaper
 * voids the slot. The state is written by hand: no hook sits between the
 * two CASes of sr__ring_claim. */
Test(ring, producer_dead_before_moving_tail_is_helped_and_reaped, .timeout = 30)
{
    uint32_t starts[] = {0, 5, UINT32_MAX - 2};
    for (unsigned k = 0; k < 3; k++) {
        struct sr_ring *r = ring_new(4);
        ring_set_position(r, starts[k]);
        uint32_t t = atomic_load(&r->tail);
        atomic_store(&r->slots[t & r->mask].seq, sr__ring_mark(r->size, t, DEAD));
        sr_msg m = msg_of(1);
        cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0, "start %u: a stale mark at tail is passed", t);
        cr_assert_eq(atomic_load(&r->tail), t + 2, "start %u: tail moved past the dead claim and ours", t);
        uint32_t vals[8];
        cr_assert_eq(drain(r, vals, 8), 0u, "start %u: the consumer waits at the claimed slot", t);
        int voided = sr__ring_reap_producer(r, r->size, DEAD);
        cr_assert_eq(drain(r, vals, 8), 1u, "start %u: the consumer stalled at the dead producer's slot", t);
        cr_assert_eq(voided, 1);
        cr_assert_eq(vals[0], 1u);
        free(r);
    }
    /* and when no producer came by: the reaper moves tail itself */
    struct sr_ring *r = ring_new(4);
    atomic_store(&r->slots[0].seq, sr__ring_mark(r->size, 0, DEAD));
    cr_assert_eq(sr__ring_reap_producer(r, r->size, DEAD), 1, "the dead producer's claim, before its T1");
    cr_assert_eq(atomic_load(&r->tail), 1u, "the reaper moved tail past the dead claim");
    sr_msg m = msg_of(7);
    uint32_t vals[8];
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0);
    cr_assert_eq(drain(r, vals, 8), 1u);
    cr_assert_eq(vals[0], 7u);
    free(r);
}

/* The slot of a live producer, however slow, is never skipped: reaping a
 * dead one leaves it alone, and the consumer delivers it once published. */
Test(ring, slow_live_producer_is_not_skipped, .timeout = 30)
{
    struct sr_ring *r = shared_ring(8, 0, NULL);
    int claimed[2], go[2];
    cr_assert_eq(pipe(claimed), 0);
    cr_assert_eq(pipe(go), 0);
    sr_msg m = msg_of(0);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0);
    pid_t live = fork();
    cr_assert_geq(live, 0);
    if (live == 0) {
        uint32_t pos = 0; /* set by the enqueue or claim; gcc -O2 cannot always tell */
        char c = 0;
        if (sr__ring_claim(r, r->size, LIVE, &pos) != 0 || write(claimed[1], &pos, sizeof(pos)) != sizeof(pos) ||
            read(go[0], &c, 1) != 1)
            _exit(2);
        sr_msg lm = msg_of(pos);
        sr__ring_publish(r, r->size, pos, &lm);
        _exit(0);
    }
    uint32_t live_pos;
    cr_assert_eq(read(claimed[0], &live_pos, sizeof(live_pos)), (ssize_t)sizeof(live_pos), "the live producer's claim");
    cr_assert_eq(live_pos, 1u);
    reap_killed(producer_killed_after_claim(r, DEAD), "the producer killed after its claim");
    m = msg_of(3);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0);
    int voided = sr__ring_reap_producer(r, r->size, DEAD);
    uint32_t vals[8];
    cr_assert_eq(drain(r, vals, 8), 1u, "the consumer waits at the live producer's slot");
    cr_assert_not(sr__ring_ready(cons(r)), "a claimed slot is not ready");
    cr_assert_eq(write(go[1], "g", 1), 1);
    int st;
    cr_assert_eq(waitpid(live, &st, 0), live);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the live producer: status %#x", st);
    cr_assert_eq(drain(r, vals, 8), 2u, "the consumer stalled at the dead producer's slot after the live one's");
    cr_assert_eq(vals[0], 1u, "the slow producer's message is delivered, not skipped");
    cr_assert_eq(vals[1], 3u);
    cr_assert_eq(voided, 1, "only the dead producer's slot is voided");
    for (int i = 0; i < 2; i++) {
        close(claimed[i]);
        close(go[i]);
    }
    shared_ring_free(r, 0);
}

/* A child consumer that attaches, dequeues `freed` messages (read and
 * released), reads `held` more without releasing them, and is killed:
 * no detach, so its head and held live only in its dead memory. */
static void consumer_killed_holding(struct sr_ring *r, unsigned freed, unsigned held)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        struct sr_ring_cons c;
        char why[160];
        sr_msg out[64];
        if (sr__ring_cons_attach(&c, r, r->size, why, sizeof(why)) || sr__ring_dequeue_burst(&c, out, freed) != freed ||
            sr__ring_read_burst(&c, out, held) != held)
            _exit(2);
        raise(SIGKILL);
        _exit(3);
    }
    reap_killed(pid, "the consumer");
}

static struct sr_ring_cons *recover(struct sr_ring *r, enum sr_ring_recover mode)
{
    char why[160];
    cr_assert_eq(sr__ring_cons_recover(&view, r, r->size, mode, why, sizeof(why)), 0, "recover: %s", why);
    return &view;
}

static void enqueue_range(struct sr_ring *r, uint32_t from, uint32_t to)
{
    for (uint32_t i = from; i < to; i++) {
        sr_msg m = msg_of(i);
        cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), 0, "message %u", i);
    }
}

/* Before sr__ring_cons_recover, a new consumer took the shared head and held
 * of the last graceful detach (here: the creator's 0/0), and so read again
 * what its predecessor had read, and never freed what it held. */
Test(ring, consumer_killed_is_recovered_delivering_the_unread, .timeout = 30)
{
    struct sr_ring *r = shared_ring(8, 0, NULL);
    enqueue_range(r, 0, 7);
    consumer_killed_holding(r, 2, 3); /* 0,1 freed; 2,3,4 held; 5,6 unread */
    enqueue_range(r, 7, 10);          /* 7, and the slots of 0 and 1, freed by the dead consumer */
    sr_msg m = msg_of(99);
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), -EAGAIN, "three slots still held by the dead consumer");
    struct sr_ring_cons *c = recover(r, SR_RING_RECOVER_DELIVER);
    sr_msg out[16];
    unsigned got = sr__ring_read_burst(c, out, 16);
    cr_assert_eq(got, 5u, "the unread messages 5..9, and not the read ones again: got %u", got);
    cr_assert_eq(c->held, 8u, "the dead consumer's 3 held slots are the new one's to free, with its own 5");
    for (uint32_t i = 0; i < got; i++)
        cr_assert_eq(value_of(&out[i]), 5 + i, "in order, from the first unread");
    cr_assert_eq(sr__ring_release(c), 8u, "the dead consumer's held slots are freed with ours");
    enqueue_range(r, 9, 17); /* all 8 slots free again */
    cr_assert_eq(sr__ring_enqueue(r, r->size, PRODUCER, &m), -EAGAIN);
    cr_assert_eq(sr__ring_dequeue_burst(c, out, 16), 8u);
    cr_assert_eq(value_of(&out[7]), 16u);
    shared_ring_free(r, 0);
}

Test(ring, consumer_killed_is_recovered_discarding_the_unread, .timeout = 30)
{
    struct sr_ring *r = shared_ring(8, 0, NULL);
    enqueue_range(r, 0, 6);
    consumer_killed_holding(r, 1, 2); /* 0 freed; 1,2 held; 3,4,5 unread */
    /* a producer still copying its message in when recovery looks: delivered */
    uint32_t pos = 0; /* set by the claim; gcc cannot tell through cr_assert */
    cr_assert_eq(sr__ring_claim(r, r->size, LIVE, &pos), 0);
    struct sr_ring_cons *c = recover(r, SR_RING_RECOVER_DISCARD);
    sr_msg m = msg_of(pos);
    sr__ring_publish(r, r->size, pos, &m);
    enqueue_range(r, 100, 102);
    sr_msg out[16];
    unsigned got = sr__ring_dequeue_burst(c, out, 16);
    cr_assert_eq(got, 3u, "only what was sent after the recovery (and the claim in flight): got %u", got);
    cr_assert_eq(value_of(&out[0]), pos);
    cr_assert_eq(value_of(&out[1]), 100u);
    cr_assert_eq(value_of(&out[2]), 101u);
    enqueue_range(r, 200, 208); /* every slot free again */
    cr_assert_eq(sr__ring_dequeue_burst(c, out, 16), 8u);
    shared_ring_free(r, 0);
}

/* A recovery that finds the slots in a state no history leaves: -EPROTO. */
Test(ring, recover_rejects_illegal_slots, .timeout = 30)
{
    char why[160];
    struct sr_ring_cons c;
    struct sr_ring *r = ring_new(8);
    enqueue_range(r, 0, 3);
    atomic_store(&r->slots[1].seq, 1); /* free at 1, below tail 3 */
    cr_assert_eq(sr__ring_cons_recover(&c, r, 8, SR_RING_RECOVER_DELIVER, why, sizeof(why)), -EPROTO);
    cr_assert(strstr(why, "position 1 holds sequence 1"), "why: %s", why);
    free(r);
    r = ring_new(8);
    enqueue_range(r, 0, 3);
    atomic_store(&r->head, 5); /* a head past tail */
    cr_assert_eq(sr__ring_cons_recover(&c, r, 8, SR_RING_RECOVER_DELIVER, why, sizeof(why)), -EPROTO);
    cr_assert(strstr(why, "head word 5"), "why: %s", why);
    free(r);
    r = ring_new(8);
    enqueue_range(r, 0, 3);
    atomic_store(&r->head, 2);
    atomic_store(&r->slots[1].seq, sr__ring_mark(8, 1, LIVE)); /* "read" while claimed */
    cr_assert_eq(sr__ring_cons_recover(&c, r, 8, SR_RING_RECOVER_DELIVER, why, sizeof(why)), -EPROTO);
    cr_assert(strstr(why, "read position 1"), "why: %s", why);
    free(r);
}

/* Marks and voids that no history leaves are -EPROTO to producers and
 * latched by the consumer, never a spin or an index out of the ring. */
Test(ring, illegal_marks_are_eproto, .timeout = 20)
{
    uint32_t sizes[] = {2, 4, 1024};
    for (unsigned k = 0; k < 3; k++) {
        uint32_t n = sizes[k];
        struct sr_ring *r = ring_new(n);
        cons(r); /* attached while the ring is sane */
        sr_msg m = msg_of(1), out[1];
        /* the void of tail itself, tail not moved past it (the reaper moves tail first) */
        atomic_store(&r->slots[0].seq, sr__ring_mark(n, 0, SR_RING_VOID));
        cr_assert_eq(sr__ring_enqueue(r, n, PRODUCER, &m), -EPROTO, "size %u: void at an unmoved tail", n);
        /* a mark of the wrong lap parity, at the consumer's head */
        atomic_store(&r->slots[0].seq, sr__ring_mark(n, 0, LIVE) ^ 1u);
        cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 1), 0u);
        uint32_t pos, seq;
        cr_assert_eq(sr__ring_cons_error(cons(r), &pos, &seq), -EPROTO, "size %u: the consumer latches it", n);
        /* to a producer at tail 0 the same word is a legal claim of position
         * -n (by another id): a full ring, not a spin */
        cr_assert_eq(sr__ring_enqueue(r, n, PRODUCER, &m), -EAGAIN, "size %u: a mark of the last lap", n);
        /* an id past every mark id (the void, the watched free slot, the watched claims) */
        view.ring = NULL;
        atomic_store(&r->slots[0].seq, 0);
        cons(r);
        atomic_store(&r->slots[0].seq, sr__ring_mark(n, 0, SR_RING_MARK_IDS));
        cr_assert_eq(sr__ring_enqueue(r, n, PRODUCER, &m), -EPROTO, "size %u: id past the mark ids", n);
        cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 1), 0u);
        cr_assert_eq(sr__ring_cons_error(cons(r), &pos, &seq), -EPROTO);
        cr_assert_eq(sr__ring_reap_producer(r, n, SR_RING_VOID), -EINVAL);
        free(r);
    }
}

/* ---- death under load: every message exactly once ----------------------- */

#define STRESS_SLOTS 16
#define STRESS_MSGS 20000u /* per producer */
#define STRESS_PRODUCERS 2u

static uint32_t stress_val(uint32_t producer, uint32_t seq) { return producer << 24 | seq; }

/* Send STRESS_MSGS messages as producer `id`, retrying a full ring until the
 * deadline: 0, or -ETIMEDOUT / the ring's error. */
static int stress_send(struct sr_ring *r, uint32_t id, int64_t deadline)
{
    for (uint32_t seq = 0; seq < STRESS_MSGS; seq++) {
        sr_msg m = msg_of(stress_val(id, seq));
        int rc;
        while ((rc = sr__ring_enqueue(r, STRESS_SLOTS, id, &m)) == -EAGAIN) {
            if (now_ns() > deadline)
                return -ETIMEDOUT;
            sched_yield(); /* 2 cores: let the consumer run */
        }
        if (rc)
            return rc;
    }
    return 0;
}

struct stress_seen {
    _Atomic uint32_t count[STRESS_PRODUCERS + 1][STRESS_MSGS]; /* deliveries of each message */
    _Atomic uint32_t next[STRESS_PRODUCERS + 1];               /* the next seq expected of each producer */
    _Atomic uint32_t total;
};

/* Account one delivered message; false (and *bad says why) when it breaks
 * per-producer FIFO order. */
static bool stress_account(struct stress_seen *s, uint32_t v, char *bad, size_t len)
{
    uint32_t p = v >> 24, seq = v & 0xffffff;
    if (p > STRESS_PRODUCERS || seq >= STRESS_MSGS) {
        snprintf(bad, len, "message %#x names no producer's message", v);
        return false;
    }
    atomic_fetch_add(&s->count[p][seq], 1);
    atomic_fetch_add(&s->total, 1);
    uint32_t want = atomic_load(&s->next[p]);
    atomic_store(&s->next[p], seq + 1);
    if (seq != want) {
        snprintf(bad, len, "producer %u: got %u, expected %u (lost, duplicated or reordered)", p, seq, want);
        return false;
    }
    return true;
}

struct stress_thread {
    pthread_t t;
    struct sr_ring *r;
    uint32_t id;
    int64_t deadline;
    int rc;
};

static void *stress_producer(void *arg)
{
    struct stress_thread *t = arg;
    t->rc = stress_send(t->r, t->id, t->deadline);
    return NULL;
}

/* Consume until `until` messages were accounted in total, or the deadline. */
static void stress_consume(struct sr_ring_cons *c, struct stress_seen *s, uint32_t until, int64_t deadline,
                           const char *who)
{
    char bad[160];
    sr_msg out[4];
    while (atomic_load(&s->total) < until) {
        unsigned n = sr__ring_dequeue_burst(c, out, 4);
        for (unsigned i = 0; i < n; i++)
            cr_assert(stress_account(s, value_of(&out[i]), bad, sizeof(bad)), "%s: %s", who, bad);
        uint32_t pos, seq;
        cr_assert_eq(sr__ring_cons_error(c, &pos, &seq), 0, "%s: corrupt slot at %u: sequence %u", who, pos, seq);
        cr_assert_lt(now_ns(), deadline, "%s: stalled with %u of %u messages (head %u)", who, atomic_load(&s->total),
                     until, atomic_load(&c->head));
        if (!n)
            sched_yield();
    }
}

/* The consumer is killed (holding a burst it read) while two producers
 * send; the new one recovers as they keep sending, and every message is
 * delivered exactly once, in each producer's order, across the two. */
Test(ring, consumer_killed_under_load_loses_nothing, .timeout = 60)
{
    void *extra;
    struct sr_ring *r = shared_ring(STRESS_SLOTS, sizeof(struct stress_seen), &extra);
    struct stress_seen *s = extra;
    int64_t deadline = now_ns() + (int64_t)EVENT_WAIT_S * 1000000000;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct sr_ring_cons c;
        char why[160], bad[160];
        if (sr__ring_cons_attach(&c, r, STRESS_SLOTS, why, sizeof(why)))
            _exit(2);
        sr_msg out[4];
        for (;;) {
            sr__ring_release(&c);
            unsigned n = sr__ring_read_burst(&c, out, 4);
            for (unsigned i = 0; i < n; i++)
                if (!stress_account(s, value_of(&out[i]), bad, sizeof(bad)))
                    _exit(3);
            if (n && atomic_load(&s->total) >= STRESS_MSGS / 2)
                raise(SIGKILL); /* holding this burst's slots */
            if (now_ns() > deadline)
                _exit(4);
        }
    }
    struct stress_thread th[STRESS_PRODUCERS];
    for (uint32_t i = 0; i < STRESS_PRODUCERS; i++) {
        th[i] = (struct stress_thread){.r = r, .id = i + 1, .deadline = deadline};
        cr_assert_eq(pthread_create(&th[i].t, NULL, stress_producer, &th[i]), 0);
    }
    reap_killed(pid, "the first consumer");
    struct sr_ring_cons *c = recover(r, SR_RING_RECOVER_DELIVER);
    stress_consume(c, s, STRESS_PRODUCERS * STRESS_MSGS, deadline, "the recovered consumer");
    for (uint32_t i = 0; i < STRESS_PRODUCERS; i++) {
        cr_assert_eq(pthread_join(th[i].t, NULL), 0);
        cr_assert_eq(th[i].rc, 0, "producer %u: %s", th[i].id, strerror(-th[i].rc));
    }
    for (uint32_t p = 1; p <= STRESS_PRODUCERS; p++)
        for (uint32_t q = 0; q < STRESS_MSGS; q++)
            cr_assert_eq(atomic_load(&s->count[p][q]), 1u, "producer %u message %u delivered %u times", p, q,
                         atomic_load(&s->count[p][q]));
    shared_ring_free(r, sizeof(*s));
}

/* A producer process is killed while another sends (the parent's SIGKILL
 * lands wherever it lands: sometimes between a claim and its publish, the
 * case the tests above pin down); after the reap, the consumer gets every
 * message of the live one exactly once, and of the dead one an unbroken
 * prefix, and has read or skipped every claimed position. */
Test(ring, producer_killed_under_load_stalls_nothing, .timeout = 60)
{
    void *extra;
    struct sr_ring *r = shared_ring(STRESS_SLOTS, sizeof(struct stress_seen), &extra);
    struct stress_seen *s = extra;
    int64_t deadline = now_ns() + (int64_t)EVENT_WAIT_S * 1000000000;
    pid_t pids[STRESS_PRODUCERS];
    for (uint32_t i = 0; i < STRESS_PRODUCERS; i++) {
        pids[i] = fork();
        cr_assert_geq(pids[i], 0);
        if (pids[i] == 0)
            _exit(stress_send(r, i + 1, deadline) ? 2 : 0);
    }
    struct sr_ring_cons *c = cons(r);
    /* the victim is producer 2: kill it once some of its messages arrived */
    stress_consume(c, s, 1, deadline, "the consumer");
    while (atomic_load(&s->next[2]) < STRESS_MSGS / 4) {
        stress_consume(c, s, atomic_load(&s->total) + 1, deadline, "the consumer");
    }
    cr_assert_eq(kill(pids[1], SIGKILL), 0);
    int st;
    cr_assert_eq(waitpid(pids[1], &st, 0), pids[1]);
    cr_assert(WIFSIGNALED(st), "the victim finished before it was killed: make STRESS_MSGS larger");
    int voided = sr__ring_reap_producer(r, STRESS_SLOTS, 2);
    cr_assert(voided == 0 || voided == 1, "the victim held %d claims (one thread: at most one)", voided);
    /* everything the live producer sends, then whatever of the victim's is left */
    while (atomic_load(&s->next[1]) < STRESS_MSGS)
        stress_consume(c, s, atomic_load(&s->total) + 1, deadline, "the consumer after the reap");
    cr_assert_eq(waitpid(pids[0], &st, 0), pids[0]);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the live producer: status %#x", st);
    sr_msg out[4];
    char bad[160];
    unsigned n;
    while ((n = sr__ring_dequeue_burst(c, out, 4)) > 0)
        for (unsigned i = 0; i < n; i++)
            cr_assert(stress_account(s, value_of(&out[i]), bad, sizeof(bad)), "%s", bad);
    cr_assert_eq(atomic_load(&r->tail), atomic_load(&c->head), "every claimed position was read or skipped");
    uint32_t k = atomic_load(&s->next[2]);
    for (uint32_t q = 0; q < STRESS_MSGS; q++) {
        cr_assert_eq(atomic_load(&s->count[1][q]), 1u, "live producer message %u delivered %u times", q,
                     atomic_load(&s->count[1][q]));
        cr_assert_eq(atomic_load(&s->count[2][q]), q < k ? 1u : 0u, "victim message %u delivered %u times (prefix %u)",
                     q, atomic_load(&s->count[2][q]), k);
    }
    shared_ring_free(r, sizeof(*s));
}
