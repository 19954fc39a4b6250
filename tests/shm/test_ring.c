/* Ring semantics on a single thread: FIFO, capacity and back-pressure,
 * bursts, wrap-around of the 32-bit indices, a claimed-but-unpublished
 * slot holding back the consumer (a preempted producer), and slots held by
 * a read until they are released. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "ring.h"
#include "common.h"

LEAK_CHECKED_SUITE(ring);

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
        cr_assert_eq(sr__ring_enqueue(r, r->size, &m), 0);
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
        cr_assert_eq(sr__ring_enqueue(r, r->size, &m), 0, "slot %u of 8 must be free", i);
    }
    sr_msg extra = msg_of(99);
    cr_assert_eq(sr__ring_enqueue(r, r->size, &extra), -EAGAIN, "a full ring must say -EAGAIN");
    sr_msg out[8];
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 3), 3);
    for (uint32_t i = 0; i < 3; i++) {
        sr_msg m = msg_of(8 + i);
        cr_assert_eq(sr__ring_enqueue(r, r->size, &m), 0, "freed slot %u must be reusable", i);
    }
    cr_assert_eq(sr__ring_enqueue(r, r->size, &extra), -EAGAIN);
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
            if (sr__ring_enqueue(r, r->size, &m) != 0)
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
        cr_assert_eq(sr__ring_enqueue(r, r->size, &m), 0, "enqueue %u near the wrap", i);
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
    uint32_t pos = atomic_fetch_add(&r->tail, 1);
    cr_assert_eq(pos, 0u);
    sr_msg m = msg_of(1);
    cr_assert_eq(sr__ring_enqueue(r, r->size, &m), 0, "other producers keep claiming slots");
    sr_msg out[8];
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 0, "FIFO: the consumer waits for position 0");
    r->slots[0].msg = msg_of(0);
    atomic_store_explicit(&r->slots[0].seq, 1, memory_order_release);
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 8), 2);
    cr_assert_eq(value_of(&out[0]), 0u);
    cr_assert_eq(value_of(&out[1]), 1u);
    free(r);
}

/* sr__ring_read_burst hands messages out but keeps their slots until
 * sr__ring_release: a held slot is as full as an unread one. */
Test(ring, read_slots_stay_held_until_released)
{
    struct sr_ring *r = ring_new(4);
    for (uint32_t i = 0; i < 4; i++) {
        sr_msg m = msg_of(i);
        cr_assert_eq(sr__ring_enqueue(r, r->size, &m), 0);
    }
    sr_msg out[4], extra = msg_of(99);
    cr_assert_eq(sr__ring_read_burst(cons(r), out, 2), 2);
    cr_assert_eq(value_of(&out[1]), 1u);
    cr_assert_eq(sr__ring_enqueue(r, r->size, &extra), -EAGAIN, "two slots are read but still held");
    cr_assert_eq(sr__ring_read_burst(cons(r), out, 4), 2, "reads continue after the held ones");
    cr_assert_eq(value_of(&out[0]), 2u);
    cr_assert_not(sr__ring_ready(cons(r)));
    cr_assert_eq(sr__ring_enqueue(r, r->size, &extra), -EAGAIN, "all four held");
    cr_assert_eq(sr__ring_release(cons(r)), 4u, "one release frees every held slot");
    cr_assert_eq(sr__ring_release(cons(r)), 0u);
    for (uint32_t i = 0; i < 4; i++) {
        sr_msg m = msg_of(4 + i);
        cr_assert_eq(sr__ring_enqueue(r, r->size, &m), 0, "released slot %u must be reusable", i);
    }
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 4), 4);
    cr_assert_eq(value_of(&out[3]), 7u);
    cr_assert_eq(sr__ring_enqueue(r, r->size, &extra), 0, "dequeue_burst releases at once");
    free(r);
}

/* A claimed but unpublished slot of the previous lap (seq == pos - size) is
 * a full ring, legal: not mistaken for corruption. */
Test(ring, unpublished_slot_of_last_lap_is_full_not_corrupt)
{
    struct sr_ring *r = ring_new(4);
    sr_msg m = msg_of(0), out[4];
    for (uint32_t i = 0; i < 4; i++)
        cr_assert_eq(sr__ring_enqueue(r, r->size, &m), 0);
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 4), 4);
    /* A producer claims position 4 (slot 0) and stalls; positions 5..7 fill. */
    cr_assert_eq(atomic_fetch_add(&r->tail, 1), 4u);
    for (uint32_t i = 0; i < 3; i++)
        cr_assert_eq(sr__ring_enqueue(r, r->size, &m), 0);
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 4), 0, "the consumer waits for position 4");
    /* Position 8 maps to slot 0, which still says 4: one lap behind, full. */
    cr_assert_eq(sr__ring_enqueue(r, r->size, &m), -EAGAIN);
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
    cr_assert_eq(sr__ring_enqueue(r, r->size, &m), 0);
    cr_assert_eq(sr__ring_dequeue_burst(cons(r), out, 1), 1);
    uint32_t tail = atomic_load(&r->tail);
    atomic_store(&r->slots[tail & r->mask].seq, tail + (uint32_t)delta);
    cr_assert_eq(sr__ring_enqueue(r, r->size, &m), -EPROTO, "%s (size %u, tail %u): want -EPROTO", what, size, tail);
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
        cr_assert_eq(sr__ring_enqueue(r, r->size, &m), 0);
    atomic_store(&r->tail, 2);
    cr_assert_eq(sr__ring_enqueue(r, r->size, &m), -EPROTO);
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
