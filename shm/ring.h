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
 * Reading and freeing are separate steps (sr__ring_read_burst, then
 * sr__ring_release), so that the transport can free a burst's slots at its
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
 *   carries the data. head and held are the consumer's alone (relaxed), and
 *   live in its private struct sr_ring_cons while it is attached.
 *
 * Full ring: enqueue returns -EAGAIN. Nothing is dropped; the caller retries
 * (see sr__xport_send_wait) or queues locally. Slots the consumer holds (read,
 * not yet released) count as full: a consumer must release before it waits
 * for more messages, or a producer waiting for space could wait forever.
 *
 * Waiting for space is an event, never a timed retry. A producer that found
 * the ring full registers (sr__ring_space_arm): it sets its bit in
 * space_ranks (a worker's progress loop, woken through its doorbell) or
 * SR_SPACE_FUTEX in space_wait (a thread asleep on that word), then the
 * summary bits in space_wait, then retries. The consumer, after freeing
 * slots, reads space_wait and wakes whoever registered (sr__ring_space_take):
 *   W1  producer: fetch_or of its bit, release fetch_or of space_wait, then a
 *       seq_cst fence, then the retry's P0 load of seq
 *   W2  consumer: C2 stores (free), then a seq_cst fence, then the load of
 *       space_wait, acquire exchange to 0, then exchanges of space_ranks
 *   The two fences make a Dekker pair: either the retry sees a freed slot, or
 *   the consumer sees space_wait. The release/acquire pair on space_wait
 *   makes the bits set before it visible to the consumer's exchanges. A bit
 *   that the consumer's scan missed keeps its summary bit set, so the next
 *   release finds it. Spurious wake-ups (a stale bit) are harmless.
 *
 * Validation. The segment is shared with peers that may be buggy, so tail
 * and seq, read from it, are checked before they are trusted: slot i only
 * ever holds sequence values congruent to i or i + 1 modulo size, a full
 * slot is exactly one lap behind (seq - pos is -size: claimed, unpublished;
 * or 1 - size: published, unread), and a sequence ahead of pos means another
 * producer claimed pos, so tail has moved. Anything else is a corrupt ring:
 * enqueue returns -EPROTO instead of spinning or reporting a full ring for
 * ever. A value that looks illegal is re-read after a fence first (a stale
 * read must not be taken for corruption); this is off the fast path.
 *
 * Process death: a producer that dies between claim and publish leaves its
 * slot unpublished, and the consumer stops at it. The launcher's policy is to
 * take the whole job down when any worker dies, so this state is never
 * observed by a surviving job.
 */
#ifndef SR_SHM_RING_H
#define SR_SHM_RING_H

#if !defined(SR__SEES_SHM)
#error "ring.h is the seam of the substrate (shm) layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <assert.h>
#include <stdbool.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "atomics.h"

#define SR_MSG_DATA 56
#define SR_RING_MAX_PRODUCERS 4096 /* producer ids (worker ranks) that can wait for space */

/* space_wait bits */
#define SR_SPACE_FUTEX 0x1u /* a thread sleeps on space_wait (futex) */
#define SR_SPACE_RANKS 0x2u /* some bit of space_ranks is set */

/* One message: what the upper layers exchange. 60 bytes, so that with the
 * sequence word a slot is exactly one cache line. */
typedef struct sr_msg {
    uint16_t src;               /* sender rank, filled by sr_xport_send */
    uint8_t type;               /* meaning belongs to the layer above */
    /* Generations modulo 16 (segment.h, "Replacement in place"), filled by
     * sr_xport_send: the sender's in the low nibble, the destination's as
     * the sender knows it in the high one. 0 where ranks are never replaced. */
    uint8_t gens;
    uint8_t data[SR_MSG_DATA];  /* inline payload */
} sr_msg;

struct sr_slot {
    _Atomic uint32_t seq; /* see the ordering contract above */
    sr_msg msg;           /* written by the claiming producer, read by the consumer */
};
static_assert(sizeof(struct sr_slot) == SR_CACHELINE, "a slot is one cache line");

struct sr_ring {
    /* Line 0: written once by the segment creator; read-only after. Never
     * used to index: producers and the consumer take the size from their
     * private copy of the segment's layout (sr_segment.ring_slots). */
    uint32_t size;
    uint32_t mask;

    /* Line 1: producers (CAS). */
    _Atomic uint32_t tail SR_ALIGNED_LINE;

    /* Line 2: the consumer alone, written at its detach and read at its
     * attach (its live copy is private: struct sr_ring_cons). head: the next
     * position to read. held: the positions [head - held, head) are read but
     * their slots not yet freed. */
    _Atomic uint32_t head SR_ALIGNED_LINE;
    _Atomic uint32_t held;

    /* Line 3: back-pressure summary (SR_SPACE_*). Set by producers that found
     * the ring full (W1); exchanged to 0 by the consumer after freeing slots
     * (W2). A thread of sr__xport_send_wait sleeps on it as a futex word. */
    _Atomic uint32_t space_wait SR_ALIGNED_LINE;

    /* Lines 4-11: the producers waiting for space, one bit per worker rank.
     * Set by the producers (W1); exchanged to 0 by the consumer (W2). */
    _Atomic uint64_t space_ranks[SR_RING_MAX_PRODUCERS / 64] SR_ALIGNED_LINE;

    struct sr_slot slots[] SR_ALIGNED_LINE;
};
static_assert(offsetof(struct sr_ring, tail) == 1 * SR_CACHELINE, "ring layout");
static_assert(offsetof(struct sr_ring, head) == 2 * SR_CACHELINE, "ring layout");
static_assert(offsetof(struct sr_ring, space_ranks) == 4 * SR_CACHELINE, "ring layout");
static_assert(offsetof(struct sr_ring, slots) == 12 * SR_CACHELINE, "ring layout");

static inline size_t sr__ring_bytes(uint32_t slots)
{
    return sizeof(struct sr_ring) + (size_t)slots * sizeof(struct sr_slot);
}

/* Initialise a ring in caller-owned (shared) memory. slots: power of two >= 2. */
void sr__ring_init(struct sr_ring *r, uint32_t slots);

/* Out of line, off the fast path: tail and seq (read at pos) looked illegal.
 * Re-reads them after a fence: 1 the state moved on (retry; *pos updated),
 * -EAGAIN a legal full slot after all, -EPROTO a corrupt ring. */
int sr__ring_recheck(struct sr_ring *r, uint32_t size, uint32_t *pos);

/* Multi-producer enqueue of one message. size: the ring's slot count as the
 * segment's layout says (the caller's private copy: the ring's own size and
 * mask words are never trusted, a scribbled mask would index outside the
 * ring). 0; -EAGAIN when full; -EPROTO when the ring's shared words hold
 * values no legal history can produce. */
static inline int sr__ring_enqueue(struct sr_ring *r, uint32_t size, const sr_msg *m)
{
    uint32_t mask = size - 1;
    /* relaxed: a stale tail only makes the CAS below fail and retry */
    uint32_t pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
    for (;;) {
        struct sr_slot *s = &r->slots[pos & mask];
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
            /* the slot still holds last lap's message: full */
            if (sr_likely(dif == 1 - (int32_t)size || dif == -(int32_t)size))
                return -EAGAIN;
            int rc = sr__ring_recheck(r, size, &pos);
            if (rc <= 0)
                return rc;
        } else {
            /* Another producer claimed pos. Its claim happens-before our P0
             * acquire saw its publish (or the free after it), so tail has
             * moved past pos: if not, seq was never legally written. */
            uint32_t t = atomic_load_explicit(&r->tail, memory_order_relaxed); /* relaxed: as above */
            if (sr_unlikely(t == pos)) {
                int rc = sr__ring_recheck(r, size, &pos);
                if (rc <= 0)
                    return rc;
            } else {
                pos = t;
            }
        }
    }
}

/* Producer side, claiming nothing: 0 a slot is free at tail, -EAGAIN full
 * (or contended), -EPROTO corrupt. For diagnostics, off the fast path. */
int sr__ring_probe(struct sr_ring *r, uint32_t size);

/* Producer `id` (< SR_RING_MAX_PRODUCERS) registers for a wake-up when the
 * consumer next frees slots (W1 in the contract above); it must retry its
 * enqueue afterwards. futex: wait on space_wait instead of being named. */
static inline void sr__ring_space_arm(struct sr_ring *r, uint32_t id, bool futex)
{
    if (futex) {
        /* release: W1, pairs with the consumer's acquire exchange of space_wait */
        atomic_fetch_or_explicit(&r->space_wait, SR_SPACE_FUTEX, memory_order_release);
    } else {
        /* relaxed: published by the release fetch_or of space_wait below */
        atomic_fetch_or_explicit(&r->space_ranks[id / 64], UINT64_C(1) << (id % 64), memory_order_relaxed);
        /* release: W1, pairs with the consumer's acquire exchange of space_wait */
        atomic_fetch_or_explicit(&r->space_wait, SR_SPACE_RANKS, memory_order_release);
    }
    /* W1 fence: pairs with the consumer's W2 fence (a Dekker pair with the retry) */
    atomic_thread_fence(memory_order_seq_cst);
}

/* Consumer, after freeing slots (W2): the SR_SPACE_* bits of those waiting,
 * cleared; 0 (one load after the fence) when nobody waits. */
static inline uint32_t sr__ring_space_take(struct sr_ring *r)
{
    /* W2 fence: pairs with a producer's W1 fence */
    atomic_thread_fence(memory_order_seq_cst);
    /* relaxed: ordered by the fence; the exchange below synchronises */
    if (!atomic_load_explicit(&r->space_wait, memory_order_relaxed))
        return 0;
    /* acquire: pairs with the producers' release fetch_or in sr__ring_space_arm */
    return atomic_exchange_explicit(&r->space_wait, 0, memory_order_acquire);
}

/* Consumer, after sr__ring_space_take returned SR_SPACE_RANKS: take the
 * waiting producers' bits of word w (ids 64w .. 64w+63), cleared. */
static inline uint64_t sr__ring_space_ranks(struct sr_ring *r, uint32_t w)
{
    /* relaxed: the load is a filter; ordered after the acquire exchange of space_wait */
    if (!atomic_load_explicit(&r->space_ranks[w], memory_order_relaxed))
        return 0;
    /* relaxed: as above; a bit set after it is found through space_wait next time */
    return atomic_exchange_explicit(&r->space_ranks[w], 0, memory_order_relaxed);
}

/* The consumer's private view of a ring (lives in the consumer's own memory,
 * never in the segment). Only the consumer writes the ring's shared words
 * head and held, but a peer can scribble on them, and on size and mask: a
 * corrupt mask would index outside the slots, a corrupt held would make a
 * release walk billions of slots. So the consumer reads the geometry and its
 * position once, at attach, checks them against the segment layout
 * (sr__ring_cons_attach), and from then on trusts only this copy; the shared
 * head and held are written back at detach (a worker may attach again) and
 * are otherwise not read. The slots' seq words must still be read from the
 * segment: the slot at the consumer's position p can only hold p (free) or
 * p + 1 (published), the consumer's own store or a producer's after it, so
 * any other value is corruption, latched in `bad` (the consumer stops there;
 * sr__ring_cons_error reports it). head is atomic (relaxed) because threads
 * that do not hold the inbox may ask sr__ring_ready; everything else belongs
 * to the thread that consumes (hand-overs order them, see agent.c). */
struct sr_ring_cons {
    struct sr_ring *ring;
    struct sr_slot *slots;
    uint32_t size, mask;
    _Atomic uint32_t head; /* the next position to read */
    uint32_t held;         /* [head - held, head) read, not yet freed; <= size */
    _Atomic uint32_t bad;  /* 0, or 1: an illegal seq was seen at bad_pos */
    uint32_t bad_pos, bad_seq;
};

/* Take the consumer's view of r, a ring of `slots` slots (the segment
 * header's ring_slots, checked by the segment's attach): 0, or -EPROTO when
 * the ring's shared geometry or position words are not what the layout and a
 * legal history allow (*why says what; the caller names the worker). */
int sr__ring_cons_attach(struct sr_ring_cons *c, struct sr_ring *r, uint32_t slots, char *why, size_t len);

/* As sr__ring_cons_attach, for a consumer whose predecessor ended without
 * detaching (segment.h, "Replacement in place"): the position is found from
 * the slots, as the first one from tail - slots on that was not freed; what
 * it read but had not released is read again (the layer above refuses what
 * was meant for the old consumer). Producers may enqueue meanwhile. */
int sr__ring_cons_recover(struct sr_ring_cons *c, struct sr_ring *r, uint32_t slots, char *why, size_t len);

/* Write the position back to the shared words (for the next attach). */
void sr__ring_cons_detach(struct sr_ring_cons *c);

/* Out of line: the slot at pos held seq, neither pos nor pos + 1. */
void sr__ring_cons_corrupt(struct sr_ring_cons *c, uint32_t pos, uint32_t seq);

/* 0, or -EPROTO once the consumer saw an illegal sequence word (then
 * pos and seq say where and what). */
static inline int sr__ring_cons_error(const struct sr_ring_cons *c, uint32_t *pos, uint32_t *seq)
{
    /* relaxed: set and read by the consumer; other threads only peek */
    if (!atomic_load_explicit(&c->bad, memory_order_relaxed))
        return 0;
    *pos = c->bad_pos;
    *seq = c->bad_seq;
    return -EPROTO;
}

/* Consumer: look at the slot at head without reading it; latch a corrupt
 * one (sr__ring_cons_error). For a consumer about to sleep: a corrupt slot is
 * never ready, and must not be slept on. */
static inline void sr__ring_cons_check(struct sr_ring_cons *c)
{
    /* relaxed: only the consumer writes head */
    uint32_t pos = atomic_load_explicit(&c->head, memory_order_relaxed);
    if (c->held == c->size)
        return; /* the slot at head is a held one */
    /* C1 acquire: pairs with the producer's P1 release */
    uint32_t seq = atomic_load_explicit(&c->slots[pos & c->mask].seq, memory_order_acquire);
    if (sr_unlikely(seq != pos && seq != pos + 1))
        sr__ring_cons_corrupt(c, pos, seq);
}

/* Consumer only: should it poll rather than sleep? True when a message is
 * ready at the head, or when the slot there holds a sequence no legal
 * history produces and the consumer has not latched it yet (its next read
 * latches it, sr__ring_cons_error). So a producer that finds the inbox corrupt
 * and rings its doorbell (xport.c) wakes the consumer once to find it
 * itself; once latched, the slot no longer keeps it awake. */
static inline bool sr__ring_cons_pending(struct sr_ring_cons *c)
{
    /* relaxed: only the consumer writes head */
    uint32_t pos = atomic_load_explicit(&c->head, memory_order_relaxed);
    /* C1 acquire: pairs with the producer's P1 release */
    uint32_t seq = atomic_load_explicit(&c->slots[pos & c->mask].seq, memory_order_acquire);
    if (sr_likely(seq == pos + 1 || seq == pos))
        return seq == pos + 1;
    /* relaxed: the consumer's own latch. With every slot held, the one at
     * head is a held one: not pending. */
    return c->held < c->size && !atomic_load_explicit(&c->bad, memory_order_relaxed);
}

/* Single-consumer: copy out up to n ready messages, in order, and keep their
 * slots held until sr__ring_release. Returns the count. Stops at a corrupt
 * slot (see sr__ring_cons_error). */
static inline unsigned sr__ring_read_burst(struct sr_ring_cons *c, sr_msg *out, unsigned n)
{
    /* relaxed: only the consumer writes head */
    uint32_t pos = atomic_load_explicit(&c->head, memory_order_relaxed);
    if (n > c->size - c->held) /* past that, the slots are the held ones */
        n = c->size - c->held;
    unsigned i;
    for (i = 0; i < n; i++) {
        struct sr_slot *s = &c->slots[(pos + i) & c->mask];
        /* C1 acquire: pairs with the producer's P1 release */
        uint32_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
        if (seq != pos + i + 1) {
            if (sr_unlikely(seq != pos + i))
                sr__ring_cons_corrupt(c, pos + i, seq);
            break;
        }
        out[i] = s->msg;
    }
    if (i) {
        /* relaxed: only the consumer writes head; readers of sr__ring_ready want a recent value */
        atomic_store_explicit(&c->head, pos + i, memory_order_relaxed);
        c->held += i;
    }
    return i;
}

/* Single-consumer: free every held slot for the producers' next lap.
 * Returns how many were freed. */
static inline unsigned sr__ring_release(struct sr_ring_cons *c)
{
    uint32_t held = c->held;
    if (!held)
        return 0;
    /* relaxed: only the consumer writes head */
    uint32_t end = atomic_load_explicit(&c->head, memory_order_relaxed);
    for (uint32_t p = end - held; p != end; p++)
        /* C2 release: pairs with a producer's P0 acquire on the next lap */
        atomic_store_explicit(&c->slots[p & c->mask].seq, p + c->size, memory_order_release);
    c->held = 0;
    return held;
}

/* Single-consumer: copy out up to n ready messages, in order, and free their
 * slots (and any still held). Returns the count. */
static inline unsigned sr__ring_dequeue_burst(struct sr_ring_cons *c, sr_msg *out, unsigned n)
{
    unsigned got = sr__ring_read_burst(c, out, n);
    sr__ring_release(c);
    return got;
}

/* Is a message ready at the head? Any thread may ask (a hint to the one that
 * consumes). A corrupt slot is never ready. */
static inline int sr__ring_ready(struct sr_ring_cons *c)
{
    /* relaxed: only the consumer writes head */
    uint32_t pos = atomic_load_explicit(&c->head, memory_order_relaxed);
    /* C1 acquire: pairs with the producer's P1 release */
    return atomic_load_explicit(&c->slots[pos & c->mask].seq, memory_order_acquire) == pos + 1;
}

#endif
