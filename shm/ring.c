/* SPDX-License-Identifier: MIT */
#include "ring.h"

#include <stdbool.h>
#include <stdio.h>

void sr__ring_init(struct sr_ring *r, uint32_t slots)
{
    r->size = slots;
    r->mask = slots - 1;
    for (uint32_t i = 0; i < slots; i++)
        /* relaxed: the ring is published to workers by the segment's creation
         * (fork/exec or the attach barrier), not by these stores */
        atomic_store_explicit(&r->slots[i].seq, i, memory_order_relaxed);
    atomic_store_explicit(&r->tail, 0, memory_order_relaxed); /* relaxed: as above */
    atomic_store_explicit(&r->head, 0, memory_order_relaxed); /* relaxed: as above */
    atomic_store_explicit(&r->held, 0, memory_order_relaxed); /* relaxed: as above */
    atomic_store_explicit(&r->space_wait, 0, memory_order_relaxed); /* relaxed: as above */
    atomic_store_explicit(&r->claim_watch, 0, memory_order_relaxed); /* relaxed: as above */
    for (uint32_t w = 0; w < SR_RING_MAX_PRODUCERS / 64; w++)
        atomic_store_explicit(&r->space_ranks[w], 0, memory_order_relaxed); /* relaxed: as above */
}

int sr__ring_recheck(struct sr_ring *r, uint32_t size, uint32_t *pos)
{
    uint32_t p = *pos;
    /* seq_cst: the re-reads below see stores at least as recent as those
     * the caller's reads missed; a stale value must not look corrupt */
    atomic_thread_fence(memory_order_seq_cst);
    /* P0 acquire: as in sr__ring_claim. Read before tail: a publish or a void
     * seen here happens after the T1 that moved tail past p, so the load of
     * tail below sees it moved */
    uint32_t seq = atomic_load_explicit(&r->slots[p & (size - 1)].seq, memory_order_acquire);
    /* relaxed: ordered after the acquire above */
    uint32_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
    if (t != p) {
        if ((int32_t)(t - p) < 0)
            return -EPROTO; /* tail moved backwards: only a foreign write does that */
        *pos = t;
        return 1;
    }
    if (sr__ring_free_at(size, seq, p))
        return 1; /* free (watched or not): claim it */
    if (seq == p + 1 - size)
        return -EAGAIN; /* last lap's message, unread: full */
    if (sr__ring_mark_id(size, seq, p) < SR_RING_VOID) {
        /* claimed, and its claimer has not moved tail on yet (preempted, or
         * dead and not reaped yet): T1 on its behalf, so that producers are
         * never held up by one. acq_rel: as T1. */
        if (atomic_compare_exchange_strong_explicit(&r->tail, &t, p + 1, memory_order_acq_rel,
                                                    memory_order_relaxed))
            t = p + 1;
        *pos = t;
        return 1;
    }
    uint32_t last = sr__ring_mark_id(size, seq, p - size);
    if (last != UINT32_MAX && last != SR_RING_FREE_W)
        return -EAGAIN; /* last lap's claim (or void), not yet read: full */
    /* a publish or void of p with tail not past p, a later lap, or a value no
     * state of slot p can hold */
    return -EPROTO;
}

int sr__ring_probe(struct sr_ring *r, uint32_t size)
{
    /* relaxed: sr__ring_recheck re-reads it after a fence */
    uint32_t pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
    for (int i = 0; i < 16; i++) {
        uint32_t p = pos;
        int rc = sr__ring_recheck(r, size, &p);
        if (rc <= 0)
            return rc;
        if (p == pos)
            return 0; /* the slot at tail is free */
        pos = p;
    }
    return -EAGAIN; /* tail keeps moving: other producers are sending, not a corrupt ring */
}

/* The ring's own geometry words against the segment's layout. */
static int check_geometry(const struct sr_ring *r, uint32_t slots, char *why, size_t len)
{
    if (r->size == slots && r->mask == slots - 1)
        return 0;
    snprintf(why, len, "its size/mask words are %u/%#x, the segment's layout says %u slots", r->size, r->mask, slots);
    return -EPROTO;
}

int sr__ring_cons_attach(struct sr_ring_cons *c, struct sr_ring *r, uint32_t slots, char *why, size_t len)
{
    /* relaxed: the consumer's own words, last written by its previous detach
     * (same process) or by the creator */
    uint32_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint32_t held = atomic_load_explicit(&r->held, memory_order_relaxed); /* relaxed: as above */
    *c = (struct sr_ring_cons){.ring = r, .slots = r->slots, .size = slots, .mask = slots - 1};
    if (check_geometry(r, slots, why, len))
        return -EPROTO;
    if (held > slots) {
        snprintf(why, len, "it claims %u held slots of %u", held, slots);
        return -EPROTO;
    }
    /* the held slots were published (or voided) and read; the one at head is
     * free, claimed, published or void */
    for (uint32_t p = head - held; p != head; p++) {
        /* acquire: C1, as in sr__ring_read_burst */
        uint32_t seq = atomic_load_explicit(&r->slots[p & c->mask].seq, memory_order_acquire);
        if (seq != p + 1 && seq != sr__ring_mark(slots, p, SR_RING_VOID)) {
            snprintf(why, len, "held position %u holds sequence %u (head %u, %u held)", p, seq, head, held);
            return -EPROTO;
        }
    }
    /* acquire: C1, as in sr__ring_read_burst */
    uint32_t seq = atomic_load_explicit(&r->slots[head & c->mask].seq, memory_order_acquire);
    if (held < slots && seq != head && seq != head + 1 && sr__ring_mark_id(slots, seq, head) == UINT32_MAX) {
        snprintf(why, len, "its head position %u holds sequence %u", head, seq);
        return -EPROTO;
    }
    atomic_store_explicit(&c->head, head, memory_order_relaxed); /* relaxed: not yet shared */
    c->held = held;
    return 0;
}

void sr__ring_cons_detach(struct sr_ring_cons *c)
{
    if (!c->ring)
        return;
    /* relaxed: read back by this worker's next attach, after the segment's barrier */
    atomic_store_explicit(&c->ring->head, atomic_load_explicit(&c->head, memory_order_relaxed), memory_order_relaxed);
    atomic_store_explicit(&c->ring->held, c->held, memory_order_relaxed); /* relaxed: as above */
    c->ring = NULL;
}

void sr__ring_cons_corrupt(struct sr_ring_cons *c, uint32_t pos, uint32_t seq)
{
    /* relaxed: read by the consumer itself; other threads only peek */
    if (atomic_load_explicit(&c->bad, memory_order_relaxed))
        return;
    c->bad_pos = pos;
    c->bad_seq = seq;
    atomic_store_explicit(&c->bad, 1, memory_order_relaxed); /* relaxed: as above */
}

bool sr__ring_cons_skip(struct sr_ring_cons *c, uint32_t pos, uint32_t seq)
{
    uint32_t id = sr__ring_mark_id(c->size, seq, pos);
    if (id == SR_RING_VOID)
        return true;
    if (id == UINT32_MAX)
        sr__ring_cons_corrupt(c, pos, seq);
    return false; /* claimed: its producer publishes it later */
}

int sr__ring_reap_producer(struct sr_ring *r, uint32_t size, uint32_t id)
{
    if (id >= SR_RING_VOID)
        return -EINVAL;
    /* T2 acquire: pairs with T1. Every claim the dead producer made is at a
     * position not yet freed, so within a lap behind this tail (the claim of
     * tail - 1 found the slot free: the consumer had freed tail - 1 - size),
     * or at tail itself when it died before its T1. */
    uint32_t t = atomic_load_explicit(&r->tail, memory_order_acquire);
    int voided = 0;
    for (uint32_t q = t - size; q != t + 1; q++) {
        _Atomic uint32_t *seq = &r->slots[q & (size - 1)].seq;
        uint32_t mark = sr__ring_mark(size, q, id);
        /* relaxed: the dead producer's mark landed before it was reaped, and
         * nobody else writes a claimed slot */
        if (atomic_load_explicit(seq, memory_order_relaxed) != mark)
            continue;
        uint32_t e = q;
        /* T1 on the dead claimer's behalf (acq_rel: as T1), before V1: who
         * sees the void sees tail past q. Fails when a producer did it. */
        atomic_compare_exchange_strong_explicit(&r->tail, &e, q + 1, memory_order_acq_rel, memory_order_relaxed);
        /* V1 release: pairs with the consumer's C1 and the producers' P0 acquire */
        if (!atomic_compare_exchange_strong_explicit(seq, &mark, sr__ring_mark(size, q, SR_RING_VOID),
                                                     memory_order_release, memory_order_relaxed))
            return -EPROTO;
        voided++;
    }
    return voided;
}

/* The state of the slot of position p < tail, seen by a consumer that
 * recovers: 1 not freed (claimed, published or void at p), 0 freed (the slot
 * has moved on to p + size: free, claimed, published or void there), -1 no
 * legal state (free at p: tail moved past p, so p was claimed). */
static int recover_state(uint32_t size, uint32_t seq, uint32_t p)
{
    uint32_t id = sr__ring_mark_id(size, seq, p);
    if (seq == p + 1 || (id != UINT32_MAX && id != SR_RING_FREE_W))
        return 1;
    if (seq == p + size || seq == p + size + 1 || sr__ring_mark_id(size, seq, p + size) != UINT32_MAX)
        return 0;
    return -1;
}

/* The first position not freed by the dead consumer, in [t - size, t]: the
 * positions before it are freed, those from it to t are not (the consumer
 * freed in order). -EPROTO when the slots say otherwise. */
static int first_unfreed(struct sr_ring *r, uint32_t size, uint32_t t, uint32_t *first, char *why, size_t len)
{
    uint32_t f = t;
    for (uint32_t p = t - size; p != t; p++) {
        /* C1 acquire: pairs with P1 and V1 */
        uint32_t seq = atomic_load_explicit(&r->slots[p & (size - 1)].seq, memory_order_acquire);
        int st = recover_state(size, seq, p);
        if (st < 0 || (st == 0 && f != t)) {
            snprintf(why, len, "position %u holds sequence %u (tail %u%s)", p, seq, t,
                     st < 0 ? "" : ", after a position not freed");
            return -EPROTO;
        }
        if (st == 1 && f == t)
            f = p;
    }
    *first = f;
    return 0;
}

int sr__ring_cons_recover(struct sr_ring_cons *c, struct sr_ring *r, uint32_t slots, enum sr_ring_recover mode,
                          char *why, size_t len)
{
    *c = (struct sr_ring_cons){.ring = r, .slots = r->slots, .size = slots, .mask = slots - 1};
    if (check_geometry(r, slots, why, len))
        return -EPROTO;
    /* relaxed (R1): the dead consumer's last store landed before it was reaped */
    uint32_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
    /* T2 acquire: pairs with T1; every position below t was claimed */
    uint32_t t = atomic_load_explicit(&r->tail, memory_order_acquire);
    uint32_t f;
    if (first_unfreed(r, slots, t, &f, why, len))
        return -EPROTO;
    if ((int32_t)(h - f) < 0 || (int32_t)(t - h) < 0) {
        snprintf(why, len, "its head word %u is outside [%u, %u], the positions not freed", h, f, t);
        return -EPROTO;
    }
    for (uint32_t p = f; p != h; p++) {
        /* C1 acquire: as above */
        uint32_t seq = atomic_load_explicit(&r->slots[p & c->mask].seq, memory_order_acquire);
        if (seq != p + 1 && seq != sr__ring_mark(slots, p, SR_RING_VOID)) {
            snprintf(why, len, "read position %u holds sequence %u (head %u, tail %u)", p, seq, h, t);
            return -EPROTO;
        }
    }
    for (uint32_t p = h; mode == SR_RING_RECOVER_DISCARD && p != t; p++) {
        _Atomic uint32_t *seq = &c->slots[p & c->mask].seq;
        /* C1 acquire: as above. Only the consumer writes a published slot, and
         * it reads the void back itself: relaxed store */
        if (atomic_load_explicit(seq, memory_order_acquire) == p + 1)
            atomic_store_explicit(seq, sr__ring_mark(slots, p, SR_RING_VOID), memory_order_relaxed);
    }
    atomic_store_explicit(&c->head, h, memory_order_relaxed); /* relaxed: not yet shared */
    c->held = h - f;
    return 0;
}
