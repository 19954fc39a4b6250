/* SPDX-License-Identifier: MIT */
/* Bounded multi-producer / single-consumer ring of cache-line slots.
 *
 * One ring is a worker's inbox. Any thread of any process may enqueue; only
 * the owning worker's progress thread dequeues. The ring lives in the segment,
 * so it holds indices only, never pointers.
 *
 * Algorithm: per-slot sequence numbers (after D. Vyukov's bounded queue).
 *   - slot[i].seq starts at i.
 *   - A producer claims position p when slot[p & mask].seq == p by a CAS of
 *     that word to its mark, sr__ring_mark(size, p, id) (id: its rank), then
 *     moves tail from p to p + 1 by a second CAS, copies its message in, then
 *     publishes seq = p + 1.
 *   - The consumer reads position p when seq == p + 1, copies the message out,
 *     then frees the slot for the next lap with seq = p + size.
 *   A producer preempted between its claim and its publish delays only the
 *   consumer at that slot; other producers keep claiming later slots (one
 *   that finds a mark at tail moves tail on for its claimer).
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
 * fewer than 2^31 slots, so wrap-around at 2^32 is harmless. A mark lies
 * 2^31 (plus less than 2 SR_RING_MARK_IDS) past its position, so marks and
 * sequence values of the laps a reader can see are told apart exactly while
 * the ring has at most 2^30 slots (the segment's limit).
 *
 * Ordering contract (barrier pairs):
 *   P1  producer: release store of seq = p + 1 (publish)
 *       pairs with consumer: acquire load of seq (C1) -> the message bytes are visible.
 *   C2  consumer: release store of seq = p + size (free)
 *       pairs with producer: acquire load of seq before claiming (P0, and the
 *       claiming CAS P0') -> the consumer's copy-out is complete before the
 *       producer overwrites.
 *   T1  the CAS of tail from p to p + 1, by the claimer after P0', or by
 *       whoever saw p's mark first (a producer, the reaper): acq_rel, so
 *       that the claims of all positions below a tail value happen before
 *       an acquire load of tail that reads it (T2: the reaper and a
 *       recovering consumer rely on it; free on x86). seq, not tail,
 *       carries the data.
 *   V1  reaper: release CAS of a dead claimer's mark to the void mark, after
 *       its T1; pairs with C1 and P0 -> who sees the void sees tail past it.
 *   R1  consumer: relaxed store of its head to the shared head word after
 *       each read; read only by a successor's recovery, after the consumer
 *       died and was reaped (its stores have landed). Otherwise head and
 *       held are the consumer's alone, in its private struct sr_ring_cons
 *       while it is attached (written back in full at detach).
 *
 * Watching the head (doorbell.h). A consumer about to stop polling CASes
 * the sequence word of the free slot at its head to the mark of id
 * SR_RING_FREE_W (W1, seq_cst). A claim of a watched free slot replaces it
 * as it replaces a free one, and tells its claimer to ring (the claim
 * returns 1). A head that is claimed but not yet published cannot be
 * watched that way (its claimer's publish is a plain store): the consumer
 * sets the ring's claim_watch flag instead, then looks at the slot again
 * (D2', seq_cst fence), and every producer whose claim found no watch
 * looks at the flag after its publish (D3', seq_cst fence): either the
 * consumer sees the publish, or the producer sees the flag and rings. The
 * flag is rarely set, so that load hits. A published slot cannot be
 * watched: the consumer reads it instead. So one value is legal besides
 * the ones below: a watched free slot at the consumer's head (free to
 * every reader; a free slot a lap behind stays illegal, watched or not).
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
 * and seq, read from it, are checked before they are trusted. The slot of
 * position q only ever holds q (free), a mark of q (claimed by id <
 * SR_RING_VOID, or void), q + 1 (published), then the same for q + size. At
 * tail pos a producer accepts: free (claim it), a mark of pos (move tail on
 * for its claimer), last lap's message or mark (full: -EAGAIN), or a later
 * state with tail moved past pos (re-read tail). Everything else, including
 * marks with an id past SR_RING_VOID, a void or publish of pos with tail not
 * past it, and free a lap behind (the old protocol's claimed slot, which the
 * mark replaced), is a corrupt ring: -EPROTO instead of spinning or
 * reporting a full ring for ever. A value that looks illegal is re-read
 * after a fence first (seq before tail, so that a publish seen implies its
 * T1 seen: a stale read must not be taken for corruption); this is off the
 * fast path. The consumer at head accepts free, a mark of head, or published
 * (and skips a void); anything else is latched (sr__ring_cons_error). Marks
 * are decoded relative to the position expected, never used to index.
 *
 * Claims and process death. The claim is atomic with the claimer's identity
 * (the mark names its rank), so a claim whose producer died is recognisable
 * and a slow live one never mistaken for it:
 *   - A producer dies between claim and publish: its slot holds its mark for
 *     ever (and tail may not have moved past it: producers do T1 for it).
 *     Once its process is reaped, sr__ring_reap_producer(r, size, rank)
 *     turns its marks into void marks (V1), and the consumer skips them
 *     (freeing them with its next release) instead of stopping there. Marks
 *     of other ranks are left alone: a slow producer publishes when it
 *     resumes, and the consumer waits for it as before.
 *   - The consumer dies without detaching: its head and held were private.
 *     A successor calls sr__ring_cons_recover, which finds the first slot
 *     not freed from the slots themselves (positions [tail - size, tail):
 *     freed ones, then not freed ones), and the dead consumer's head from R1;
 *     what it had read becomes held (freed by the successor's first
 *     release), what it had not is delivered or discarded (voided).
 *   A producer that dies in a burst of enqueues has at most one claim per
 *   sending thread outstanding; a dead consumer's held slots are bounded by
 *   size. Both repairs are O(size) scans, off every fast path.
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
#include <string.h> /* memcpy: sr__msg_copy */

#include "atomics.h"

#define SR_MSG_DATA 56
#define SR_RING_MAX_PRODUCERS 4096 /* producer ids (worker ranks) that can claim and wait for space */

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

/* Copy a message that its reader is about to load (the consumer's copy
 * out of the slot, the poller's copy of a burst's message): the head and
 * the data apart, so that the stores fall on the data's own 16-byte words.
 * A reader loads the data in those words (an RPC header is copied out of
 * it whole, and the next copy loads what this one stored), and a load that
 * spans two stores still in flight is not forwarded from them: it waits for
 * both to commit. A plain struct copy stores at the message's offsets 0,
 * 16, 32 and 44, and every word the reader then loaded spanned two. */
static inline void sr__msg_copy(sr_msg *dst, const sr_msg *src)
{
    memcpy(dst, src, offsetof(sr_msg, data));
    memcpy(dst->data, src->data, SR_MSG_DATA);
}

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
     * attach (its live copy is private: struct sr_ring_cons); head is also
     * stored after each read (R1), for a successor's recovery if the
     * consumer dies. head: the next position to read. held: the positions
     * [head - held, head) are read but their slots not yet freed. */
    _Atomic uint32_t head SR_ALIGNED_LINE;
    _Atomic uint32_t held;

    /* Line 3: back-pressure summary (SR_SPACE_*). Set by producers that found
     * the ring full (W1); exchanged to 0 by the consumer after freeing slots
     * (W2). A thread of sr__xport_send_wait sleeps on it as a futex word. */
    _Atomic uint32_t space_wait SR_ALIGNED_LINE;
    /* Set by a consumer about to sleep on a claimed, unpublished head (or
     * by a lazy producer handing the watch on to a claimed slot: "Watching
     * the head" above), cleared by the consumer once it polls again; read
     * after every publish that found no watch at its claim (D3'). Rarely
     * written, so the producers' loads hit. Any value but 0 rings. */
    _Atomic uint32_t claim_watch;

    /* Lines 4-11: the producers waiting for space, one bit per worker rank.
     * Set by the producers (W1); exchanged to 0 by the consumer (W2). */
    _Atomic uint64_t space_ranks[SR_RING_MAX_PRODUCERS / 64] SR_ALIGNED_LINE;

    struct sr_slot slots[] SR_ALIGNED_LINE;
};
static_assert(offsetof(struct sr_ring, tail) == 1 * SR_CACHELINE, "ring layout");
static_assert(offsetof(struct sr_ring, head) == 2 * SR_CACHELINE, "ring layout");
static_assert(offsetof(struct sr_ring, space_ranks) == 4 * SR_CACHELINE, "ring layout");
static_assert(offsetof(struct sr_ring, slots) == 12 * SR_CACHELINE, "ring layout");

/* Messages in r that its consumer has not read yet (tail - head: the
 * producers' claims count), for reports and gauges: two relaxed loads, not
 * a snapshot, clamped to [0, size]. Any process, any thread. */
static inline uint32_t sr__ring_depth(struct sr_ring *r, uint32_t size)
{
    /* relaxed: a statistic; head is the consumer's R1 store, tail the producers' claims */
    uint32_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint32_t d = atomic_load_explicit(&r->tail, memory_order_relaxed) - head;
    return d > size ? (d > UINT32_MAX / 2 ? 0 : size) : d;
}

static inline size_t sr__ring_bytes(uint32_t slots)
{
    return sizeof(struct sr_ring) + (size_t)slots * sizeof(struct sr_slot);
}

/* Initialise a ring in caller-owned (shared) memory. slots: power of two >= 2. */
void sr__ring_init(struct sr_ring *r, uint32_t slots);

/* Out of line, off the fast path: tail and seq (read at pos) looked illegal,
 * or seq is a mark. Re-reads them after a fence: 1 the state moved on, or
 * pos was claimed and tail is now moved past it for its claimer (retry;
 * *pos updated), -EAGAIN a legal full slot after all, -EPROTO a corrupt
 * ring. */
int sr__ring_recheck(struct sr_ring *r, uint32_t size, uint32_t *pos);

/* Slot markers (see "Claims and process death" above). A claimed slot of
 * position q holds sr__ring_mark(size, q, id): q + SR_RING_MARK + 2 id +
 * lap(q), where lap(q) is bit log2(size) of q (the parity of q's lap, so
 * that a mark of q and one of q - size never look alike). id < SR_RING_VOID
 * names the claiming producer; id SR_RING_VOID marks a slot whose claimer
 * died and was reaped: the consumer skips it. */
#define SR_RING_MARK 0x80000000u
#define SR_RING_VOID SR_RING_MAX_PRODUCERS
/* The mark id of a free slot its consumer watches (see "Watching the head"
 * above). Every mark id is below SR_RING_MARK_IDS. */
#define SR_RING_FREE_W (SR_RING_VOID + 1)
#define SR_RING_MARK_IDS (SR_RING_FREE_W + 1)

static inline uint32_t sr__ring_lap(uint32_t size, uint32_t pos) { return (pos & size) ? 1u : 0u; }

static inline uint32_t sr__ring_mark(uint32_t size, uint32_t pos, uint32_t id)
{
    return pos + SR_RING_MARK + 2 * id + sr__ring_lap(size, pos);
}

/* The id of the mark that seq is for position pos, or UINT32_MAX when seq
 * is no mark of pos. */
static inline uint32_t sr__ring_mark_id(uint32_t size, uint32_t seq, uint32_t pos)
{
    uint32_t u = seq - pos - SR_RING_MARK;
    if (u > 2 * SR_RING_MARK_IDS - 1 || (u & 1) != sr__ring_lap(size, pos))
        return UINT32_MAX;
    return u >> 1;
}

/* Watch the free slot of position q (sr__ring_watch, sr__ring_watch_next):
 * true when it is watched now (or was); false when it is anything but
 * free (claimed, published, void, held or corrupt). W1: a seq_cst CAS. */
static inline bool sr__ring_watch_free(_Atomic uint32_t *s, uint32_t size, uint32_t q)
{
    uint32_t want = sr__ring_mark(size, q, SR_RING_FREE_W);
    uint32_t seq = q;
    return atomic_compare_exchange_strong_explicit(s, &seq, want, memory_order_seq_cst, memory_order_relaxed) ||
           seq == want;
}

/* The claim watch (struct sr_ring): set it, then (D2', seq_cst) look at the
 * slot of q again. True when q is still claimed and unpublished: its
 * publisher's D3' load sees the flag and rings. */
static inline bool sr__ring_watch_claim(struct sr_ring *r, _Atomic uint32_t *s, uint32_t size, uint32_t q)
{
    atomic_store_explicit(&r->claim_watch, 1, memory_order_relaxed); /* relaxed: D2' orders it */
    atomic_thread_fence(memory_order_seq_cst);                         /* D2': pairs with D3' */
    /* relaxed: ordered by D2'; a publish seen here is read by the consumer's next poll */
    return sr__ring_mark_id(size, atomic_load_explicit(s, memory_order_relaxed), q) < SR_RING_VOID;
}

/* Watch position q: its free slot (W1), or, claimed and unpublished, the
 * claim watch (D2'). False when it is published, void, held or corrupt. */
static inline bool sr__ring_watch_at(struct sr_ring *r, uint32_t size, uint32_t q)
{
    _Atomic uint32_t *s = &r->slots[q & (size - 1)].seq;
    return sr__ring_watch_free(s, size, q) || sr__ring_watch_claim(r, s, size, q);
}

/* The consumer polls again: the claim watch is over. relaxed: a hint to
 * producers (their D3' load); a clear lost to a later set costs one ring
 * for nothing at most. The load keeps the store off reads that find it 0. */
static inline void sr__ring_claim_unwatch(struct sr_ring *r)
{
    if (sr_unlikely(atomic_load_explicit(&r->claim_watch, memory_order_relaxed)))
        atomic_store_explicit(&r->claim_watch, 0, memory_order_relaxed);
}

/* Is seq the free slot of pos, watched or not? */
static inline bool sr__ring_free_at(uint32_t size, uint32_t seq, uint32_t pos)
{
    return seq == pos || seq == sr__ring_mark(size, pos, SR_RING_FREE_W);
}

/* Producer `id` (< SR_RING_VOID: the sender's rank) claims a position: 0 and
 * *at set (1: the consumer watches it, so the claimer rings once it has
 * published), -EAGAIN when full, -EPROTO when the ring's shared words hold
 * values no legal history can produce. size: the ring's slot count as the
 * segment's layout says (the caller's private copy: the ring's own size and
 * mask words are never trusted, a scribbled mask would index outside the
 * ring). The claim is the CAS of the slot's sequence word from free to the
 * claimer's mark (P0'), then tail moves on (T1); the caller copies its
 * message in and publishes it (sr__ring_publish). */
static inline int sr__ring_claim(struct sr_ring *r, uint32_t size, uint32_t id, uint32_t *at)
{
    uint32_t mask = size - 1;
    /* relaxed: a stale tail only makes the claim below fail and retry */
    uint32_t pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
    for (;;) {
        struct sr_slot *s = &r->slots[pos & mask];
        /* P0 acquire: pairs with the consumer's C2 release that freed this slot */
        uint32_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
        if (sr__ring_free_at(size, seq, pos)) {
            bool watched = seq != pos;
            /* P0' acquire on success: as P0 (the value replaced is the C2
             * store, or the consumer's watch of it); relaxed on failure:
             * seq is classified below */
            if (sr_likely(atomic_compare_exchange_strong_explicit(&s->seq, &seq, sr__ring_mark(size, pos, id),
                                                                  memory_order_acquire, memory_order_relaxed))) {
                uint32_t expect = pos;
                /* T1 acq_rel: pairs with the acquire loads of tail (T2) and
                 * with the previous T1, so that every claim below a tail
                 * value happens before a T2 that reads it (free on x86: a
                 * locked instruction either way). It fails when a producer
                 * that saw our mark moved tail on for us; relaxed then. */
                atomic_compare_exchange_strong_explicit(&r->tail, &expect, pos + 1, memory_order_acq_rel,
                                                        memory_order_relaxed);
                *at = pos;
                return watched;
            }
            continue; /* seq changed under us (another claim, or the consumer's watch): classify it again */
        }
        int32_t dif = (int32_t)(seq - pos);
        if (dif == 1 - (int32_t)size)
            return -EAGAIN; /* the slot still holds last lap's message: full */
        if (sr__ring_mark_id(size, seq, pos) < SR_RING_VOID) {
            /* Another producer claimed pos (typically: it won the CAS above)
             * and has not moved tail yet: T1 on its behalf (acq_rel: as
             * T1), then the next position. */
            uint32_t t = pos;
            if (atomic_compare_exchange_strong_explicit(&r->tail, &t, pos + 1, memory_order_acq_rel,
                                                        memory_order_relaxed))
                t = pos + 1;
            pos = t;
            continue;
        }
        if (dif > 0) {
            /* Another producer claimed pos and published it (or it was freed
             * since). Its T1 happens-before our P0 acquire saw that, so tail
             * has moved past pos: if not, seq is last lap's mark (full) or
             * was never legally written. */
            uint32_t t = atomic_load_explicit(&r->tail, memory_order_relaxed); /* relaxed: as above */
            if (sr_likely(t != pos)) {
                pos = t;
                continue;
            }
        }
        /* last lap's mark (full), or corrupt: off the fast path */
        int rc = sr__ring_recheck(r, size, &pos);
        if (rc <= 0)
            return rc;
    }
}

/* The claimer of pos copies its message in and publishes it. */
static inline void sr__ring_publish(struct sr_ring *r, uint32_t size, uint32_t pos, const sr_msg *m)
{
    struct sr_slot *s = &r->slots[pos & (size - 1)];
    s->msg = *m;
    /* P1 release: pairs with the consumer's C1 acquire */
    atomic_store_explicit(&s->seq, pos + 1, memory_order_release);
}

/* After publishing without a watch at the claim: does a consumer sleep on a
 * claimed head (the claim watch)? D3' seq_cst fence: pairs with D2' (its
 * flag, then its look at the slot): either it sees our publish, or we see
 * its flag. The publishes of this thread before the fence are all covered
 * (one check after a quiet burst, doorbell.h R1). */
static inline bool sr__ring_claim_watched(struct sr_ring *r)
{
    atomic_thread_fence(memory_order_seq_cst); /* D3' */
    /* relaxed: ordered by D3' */
    return atomic_load_explicit(&r->claim_watch, memory_order_relaxed) != 0;
}

/* A producer that published pos into a watched slot and will not ring (a
 * lazy send, doorbell.h R2) hands the watch on to pos + 1, so that the next
 * message, which someone may wait on, rings: the free slot of pos + 1
 * becomes watched, or, claimed, the claim watch is set. False when it
 * cannot (pos + 1 is published, or still held by the consumer, or
 * corrupt): the producer rings itself. */
static inline bool sr__ring_watch_next(struct sr_ring *r, uint32_t size, uint32_t pos)
{
    return sr__ring_watch_at(r, size, pos + 1);
}

/* Multi-producer enqueue of one message by producer `id` (the sender's
 * rank, < SR_RING_VOID): sr__ring_claim, then sr__ring_publish. 0; 1 the
 * consumer watched the free slot (the sender must ring: doorbell.h); -EAGAIN
 * when full; -EPROTO when the ring is corrupt. _at: and the position. */
static inline int sr__ring_enqueue_at(struct sr_ring *r, uint32_t size, uint32_t id, const sr_msg *m, uint32_t *at)
{
    uint32_t pos = 0; /* set by a claim that succeeds; gcc cannot tell */
    int rc = sr__ring_claim(r, size, id, &pos);
    if (sr_likely(rc >= 0))
        sr__ring_publish(r, size, pos, m);
    *at = pos;
    return rc;
}

static inline int sr__ring_enqueue(struct sr_ring *r, uint32_t size, uint32_t id, const sr_msg *m)
{
    uint32_t pos;
    return sr__ring_enqueue_at(r, size, id, m, &pos);
}

/* Producer side, claiming nothing: 0 a slot is free at tail, -EAGAIN full
 * (or contended), -EPROTO corrupt. For diagnostics, off the fast path. */
int sr__ring_probe(struct sr_ring *r, uint32_t size);

/* After producer `id`'s process died: void every slot it claimed and never
 * published (positions [tail - size, tail], marked with its id), so that the
 * consumer skips them instead of waiting for ever; a dead claimer that had
 * not moved tail on yet has it moved (T1 on its behalf). Returns how many
 * slots were voided (then wake the consumer: its doorbell), -EINVAL for an
 * id >= SR_RING_VOID, or -EPROTO when a slot changed under the reaper
 * (another writer of a dead producer's claim: a corrupt ring).
 *
 * Call it only once the dead process is reaped (waitpid returned: none of its
 * stores is in flight, and it will never publish), from one thread at a time
 * per ring, for every ring the process could have sent to, before the exit
 * is published (which wakes the consumers) and before a replacement process
 * with the same rank may send: the id is the rank, so reaping it then would
 * void the replacement's live claims. Producers and the consumer may run
 * meanwhile. Marks of live producers (other ids) are left alone, however
 * long they take: a slow producer is never skipped. */
int sr__ring_reap_producer(struct sr_ring *r, uint32_t size, uint32_t id);

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
 * head and held are written back at detach (a worker may attach again), head
 * also after each read (R1, for sr__ring_cons_recover), and are otherwise not
 * read. The slots' seq words must still be read from the segment: the slot
 * at the consumer's position p can only hold p (free), a mark of p (claimed,
 * or void: skipped) or p + 1 (published), the consumer's own store or a
 * producer's or the reaper's after it, so any other value is corruption,
 * latched in `bad` (the consumer stops there; sr__ring_cons_error reports
 * it). head is atomic (relaxed) because threads
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

/* Write the position back to the shared words (for the next attach). */
void sr__ring_cons_detach(struct sr_ring_cons *c);

/* What sr__ring_cons_recover does with the messages its dead predecessor had
 * not read yet (published, positions [its head, tail)). */
enum sr_ring_recover {
    SR_RING_RECOVER_DELIVER, /* read them, in order, as if nothing happened */
    SR_RING_RECOVER_DISCARD, /* void the published ones (skipped, freed) */
};

/* Take the consumer's view of r after its previous consumer died without
 * detaching (its head and held lived in its private memory): the first
 * position not freed is found from the slots themselves, relative to tail,
 * and the dead consumer's head from the shared head word (R1, stored by each
 * read). The slots it had read but not freed become held: the new
 * consumer's first sr__ring_release frees them (and, as after any release,
 * it then wakes producers waiting for space: sr__ring_space_take). The
 * unread ones are delivered or discarded as `mode` says; DISCARD voids the
 * messages already published when recover looks at them, and a message
 * whose producer is still copying it in then (claimed before the recovery,
 * published after) is delivered: a caller that must drop every message
 * addressed to the dead consumer tells them apart by a stamp of its own.
 * Producers may enqueue meanwhile; nothing they send is lost or duplicated.
 *
 * Call it only once the previous consumer's process is reaped (its stores
 * all landed), and never while another consumer is attached. 0, or -EPROTO
 * when the ring's words are not what a legal history leaves (*why says what;
 * the caller names the worker). */
int sr__ring_cons_recover(struct sr_ring_cons *c, struct sr_ring *r, uint32_t slots, enum sr_ring_recover mode,
                          char *why, size_t len);

/* Out of line: the slot at pos held seq, neither pos nor pos + 1. */
void sr__ring_cons_corrupt(struct sr_ring_cons *c, uint32_t pos, uint32_t seq);

/* Out of line, the consumer reading pos found seq, neither pos nor pos + 1:
 * true when the slot is void (skip it); false when it is claimed (wait for
 * its publish) or corrupt (latched, sr__ring_cons_error). */
bool sr__ring_cons_skip(struct sr_ring_cons *c, uint32_t pos, uint32_t seq);

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
    if (sr_unlikely(seq != pos && seq != pos + 1 && sr__ring_mark_id(c->size, seq, pos) == UINT32_MAX))
        sr__ring_cons_corrupt(c, pos, seq);
}

/* Consumer, before it stops polling (every sleep, every hand-over to a
 * sleeping thread): watch the slot at head, so that whoever publishes there
 * rings its doorbell (doorbell.h, "Watching the head"). A free slot becomes
 * watched (W1, a seq_cst CAS, paired with the producers' claim CAS of the
 * same word: no lost ring); a claimed one gets the claim watch (D2'). False
 * when a message is ready there, the slot is void, held (every slot held:
 * release first) or corrupt: poll rather than sleep. */
static inline bool sr__ring_watch(struct sr_ring_cons *c)
{
    if (c->held == c->size)
        return false;
    /* relaxed: only the consumer writes head */
    return sr__ring_watch_at(c->ring, c->size, atomic_load_explicit(&c->head, memory_order_relaxed));
}

/* Consumer, polling: the free slot of position q is not watched (any more).
 * relaxed: a claim that wins instead rings once, harmlessly. */
static inline void sr__ring_unwatch_free(struct sr_ring_cons *c, uint32_t q)
{
    uint32_t w = sr__ring_mark(c->size, q, SR_RING_FREE_W);
    atomic_compare_exchange_strong_explicit(&c->slots[q & c->mask].seq, &w, q, memory_order_relaxed,
                                            memory_order_relaxed);
}

/* Consumer, polling again: stop watching (a producer that claims a watched
 * slot would ring for nothing): the free slot at head, and the claim
 * watch. */
static inline void sr__ring_unwatch(struct sr_ring_cons *c)
{
    if (c->held != c->size)
        sr__ring_unwatch_free(c, atomic_load_explicit(&c->head, memory_order_relaxed)); /* relaxed: ours */
    sr__ring_claim_unwatch(c->ring);
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
    /* C1 acquire: pairs with the producer's P1 release (or the reaper's V1) */
    uint32_t seq = atomic_load_explicit(&c->slots[pos & c->mask].seq, memory_order_acquire);
    if (sr_likely(seq == pos + 1 || seq == pos))
        return seq == pos + 1;
    /* With every slot held, the one at head is a held one: not pending. */
    if (c->held == c->size)
        return false;
    uint32_t id = sr__ring_mark_id(c->size, seq, pos);
    if (id != UINT32_MAX)
        return id == SR_RING_VOID; /* void: skip it; claimed: wait for the publish */
    /* relaxed: the consumer's own latch */
    return !atomic_load_explicit(&c->bad, memory_order_relaxed);
}

/* Single-consumer: copy out up to n ready messages, in order, and keep their
 * slots held until sr__ring_release. Returns the count. Skips void slots
 * (their claimer died: sr__ring_reap_producer), which are held like read
 * ones. Stops at a corrupt slot (see sr__ring_cons_error). */
static inline unsigned sr__ring_read_burst(struct sr_ring_cons *c, sr_msg *out, unsigned n)
{
    /* relaxed: only the consumer writes head */
    uint32_t pos = atomic_load_explicit(&c->head, memory_order_relaxed);
    uint32_t room = c->size - c->held; /* past that, the slots are the held ones */
    uint32_t p = pos;
    unsigned got = 0;
    while (got < n && p - pos < room) {
        struct sr_slot *s = &c->slots[p & c->mask];
        /* C1 acquire: pairs with the producer's P1 release (or the reaper's V1) */
        uint32_t seq = atomic_load_explicit(&s->seq, memory_order_acquire);
        if (seq != p + 1) {
            /* A watch that lazy sends handed on ahead of the head while we
             * slept (sr__ring_watch_next): stale, since we poll; left, the
             * claim of it would ring the parked thread for nothing. */
            if (seq == sr__ring_mark(c->size, p, SR_RING_FREE_W)) {
                sr__ring_unwatch_free(c, p);
                break;
            }
            if (seq == p || !sr__ring_cons_skip(c, p, seq))
                break;
            p++;
            continue;
        }
        sr__msg_copy(&out[got++], &s->msg); /* its reader copies it the same way (poll.c) */
        p++;
    }
    if (p != pos) {
        /* relaxed: only the consumer writes head; readers of sr__ring_ready want a recent value */
        atomic_store_explicit(&c->head, p, memory_order_relaxed);
        /* relaxed (R1): read by a successor's sr__ring_cons_recover only
         * after this process was reaped */
        atomic_store_explicit(&c->ring->head, p, memory_order_relaxed);
        c->held += p - pos;
        sr__ring_claim_unwatch(c->ring); /* polling again */
    }
    return got;
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

/* Is a message ready at the head (or a void slot to skip)? Any thread may ask
 * (a hint to the one that consumes). A corrupt slot is never ready. */
static inline int sr__ring_ready(struct sr_ring_cons *c)
{
    /* relaxed: only the consumer writes head */
    uint32_t pos = atomic_load_explicit(&c->head, memory_order_relaxed);
    /* C1 acquire: pairs with the producer's P1 release (or the reaper's V1) */
    uint32_t seq = atomic_load_explicit(&c->slots[pos & c->mask].seq, memory_order_acquire);
    return seq == pos + 1 || (seq != pos && seq == sr__ring_mark(c->size, pos, SR_RING_VOID));
}

#endif
