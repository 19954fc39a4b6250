/* Bounded multi-producer / single-consumer ring of cache-line slots.
 *
 * One ring is a worker's inbox. Any thread of any process may enqueue; only
 * the owning worker's progress thread dequeues. The ring lives in the segment,
 * so it holds indices only, never pointers.
 *
 * Algorithm: per-slot sequence numbers (D. Vyukov's bounded queue).
 *   - slot[i].seq starts at i.
 *   - A producer claims position p when slot[p & mask].seq == p by a CAS on
 *     tail, copies its message in, then publishes seq = p + 1.
 *   - The consumer reads position p when seq == p + 1, copies the message out,
 *     then frees the slot for the next lap with seq = p + size.
 *   A producer preempted between its CAS and its publish delays only the
 *   consumer at that slot; other producers keep claiming later slots.
 *
 * Reading and freeing are separate steps (sr_ring_read_burst, then
 * sr_ring_release), so that the transport can free a burst's slots at its
 * next call instead of at once. Why: a message moves one cache line, its
 * slot, to the consumer, whose read leaves the line shared. Freeing writes it
 * again, which needs the producer's copy invalidated first, and the
 * consumer's next locked instruction (typically the CAS of the reply it is
 * about to send) waits for that: a second cache-line round trip on the
 * critical path of every reply. Freed later, the write overlaps the wait for
 * the next message. (Not freeing at all by writing the slot, i.e. producers
 * reading head instead, removes the write but leaves the line shared in both
 * caches, and a producer's write to a shared line costs about twice a write to
 * a line the consumer holds modified: burst throughput fell by 40%.)
 *
 * Indices are free-running 32-bit counters, masked on access. Comparisons use
 * the signed difference (int32_t)(a - b), which is exact while the ring holds
 * fewer than 2^31 slots, so wrap-around at 2^32 is harmless.
 *
 * Ordering contract (barrier pairs):
 *   P1  producer: release store of seq = p + 1 (publish)
 *       pairs with consumer: acquire load of seq (C1) -> the message bytes are visible.
 *   C2  consumer: release store of seq = p + size (free)
 *       pairs with producer: acquire load of seq before claiming (P0) -> the
 *       consumer's copy-out is complete before the producer overwrites.
 *   tail is only a claim counter: the CAS is relaxed because seq, not tail,
 *   carries the data. head and held are the consumer's alone (relaxed).
 *
 * Full ring: enqueue returns -EAGAIN. Nothing is dropped; the caller retries
 * (see sr_xport_send_wait) or queues locally. Slots the consumer holds (read,
 * not yet released) count as full: a consumer must release before it waits
 * for more messages, or a producer waiting for space could wait forever.
 *
 * Process death: a producer that dies between claim and publish leaves its
 * slot unpublished, and the consumer stops at it. The launcher's policy is to
 * take the whole job down when any worker dies, so this state is never
 * observed by a surviving job.
 */
#ifndef SR_SHM_RING_H
#define SR_SHM_RING_H

#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "atomics.h"

#define SR_MSG_DATA 56

/* One message: what the upper layers exchange. 60 bytes, so that with the
 * sequence word a slot is exactly one cache line. */
typedef struct sr_msg {
    uint16_t src;               /* sender rank, filled by sr_xport_send */
    uint16_t type;              /* meaning belongs to the layer above */
    uint8_t data[SR_MSG_DATA];  /* inline payload */
} sr_msg;

struct sr_slot {
    _Atomic uint32_t seq; /* see the ordering contract above */
    sr_msg msg;           /* written by the claiming producer, read by the consumer */
};
static_assert(sizeof(struct sr_slot) == SR_CACHELINE, "a slot is one cache line");

struct sr_ring {
    /* Line 0: written once by the segment creator; read-only after. */
    uint32_t size;
    uint32_t mask;

    /* Line 1: producers (CAS). */
    _Atomic uint32_t tail SR_ALIGNED_LINE;

    /* Line 2: the consumer alone. head: the next position to read. held: the
     * positions [head - held, head) are read but their slots not yet freed. */
    _Atomic uint32_t head SR_ALIGNED_LINE;
    _Atomic uint32_t held;

    /* Line 3: back-pressure. Producers that found the ring full set it; the
     * consumer clears it and wakes them after freeing slots. */
    _Atomic uint32_t space_wait SR_ALIGNED_LINE;

    struct sr_slot slots[] SR_ALIGNED_LINE;
};
static_assert(offsetof(struct sr_ring, tail) == 1 * SR_CACHELINE, "ring layout");
static_assert(offsetof(struct sr_ring, head) == 2 * SR_CACHELINE, "ring layout");
static_assert(offsetof(struct sr_ring, slots) == 4 * SR_CACHELINE, "ring layout");

static inline size_t sr_ring_bytes(uint32_t slots)
{
    return sizeof(struct sr_ring) + (size_t)slots * sizeof(struct sr_slot);
}

/* Initialise a ring in caller-owned (shared) memory. slots: power of two >= 2. */
void sr_ring_init(struct sr_ring *r, uint32_t slots);

/* Multi-producer enqueue of one message. 0, or -EAGAIN when full. */
static inline int sr_ring_enqueue(struct sr_ring *r, const sr_msg *m)
{
    /* relaxed: a stale tail only makes the CAS below fail and retry */
    uint32_t pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
    for (;;) {
        struct sr_slot *s = &r->slots[pos & r->mask];
        /* P0 acquire: pairs with the consumer's C2 release that freed this slot */
        uint32_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
        int32_t dif = (int32_t)(seq - pos);
        if (dif == 0) {
            /* relaxed: the claim needs atomicity only; seq publishes the data */
            if (atomic_compare_exchange_weak_explicit(&r->tail, &pos, pos + 1,
                                                      memory_order_relaxed,
                                                      memory_order_relaxed)) {
                s->msg = *m;
                /* P1 release: pairs with the consumer's C1 acquire */
                atomic_store_explicit(&s->seq, pos + 1, memory_order_release);
                return 0;
            }
        } else if (dif < 0) {
            return -EAGAIN; /* the slot still holds last lap's message: full */
        } else {
            /* relaxed: another producer claimed pos; re-read and retry */
            pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
        }
    }
}

/* Single-consumer: copy out up to n ready messages, in order, and keep their
 * slots held until sr_ring_release. Returns the count. */
static inline unsigned sr_ring_read_burst(struct sr_ring *r, sr_msg *out, unsigned n)
{
    /* relaxed: only the consumer writes head and held */
    uint32_t pos = atomic_load_explicit(&r->head, memory_order_relaxed);
    unsigned i;
    for (i = 0; i < n; i++) {
        struct sr_slot *s = &r->slots[(pos + i) & r->mask];
        /* C1 acquire: pairs with the producer's P1 release */
        if (atomic_load_explicit(&s->seq, memory_order_acquire) != pos + i + 1)
            break;
        out[i] = s->msg;
    }
    if (i) {
        /* relaxed: only the consumer reads or writes head and held */
        atomic_store_explicit(&r->head, pos + i, memory_order_relaxed);
        uint32_t held = atomic_load_explicit(&r->held, memory_order_relaxed); /* relaxed: as above */
        atomic_store_explicit(&r->held, held + i, memory_order_relaxed);      /* relaxed: as above */
    }
    return i;
}

/* Single-consumer: free every held slot for the producers' next lap.
 * Returns how many were freed. */
static inline unsigned sr_ring_release(struct sr_ring *r)
{
    /* relaxed: only the consumer reads or writes head and held */
    uint32_t held = atomic_load_explicit(&r->held, memory_order_relaxed);
    if (!held)
        return 0;
    uint32_t end = atomic_load_explicit(&r->head, memory_order_relaxed); /* relaxed: as above */
    for (uint32_t p = end - held; p != end; p++)
        /* C2 release: pairs with a producer's P0 acquire on the next lap */
        atomic_store_explicit(&r->slots[p & r->mask].seq, p + r->size, memory_order_release);
    atomic_store_explicit(&r->held, 0, memory_order_relaxed); /* relaxed: as above */
    return held;
}

/* Single-consumer: copy out up to n ready messages, in order, and free their
 * slots (and any still held). Returns the count. */
static inline unsigned sr_ring_dequeue_burst(struct sr_ring *r, sr_msg *out, unsigned n)
{
    unsigned got = sr_ring_read_burst(r, out, n);
    sr_ring_release(r);
    return got;
}

/* Consumer: is a message ready at the head? */
static inline int sr_ring_ready(struct sr_ring *r)
{
    /* relaxed: only the consumer writes head */
    uint32_t pos = atomic_load_explicit(&r->head, memory_order_relaxed);
    /* C1 acquire: pairs with the producer's P1 release */
    return atomic_load_explicit(&r->slots[pos & r->mask].seq, memory_order_acquire) == pos + 1;
}

#endif
