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
    for (uint32_t w = 0; w < SR_RING_MAX_PRODUCERS / 64; w++)
        atomic_store_explicit(&r->space_ranks[w], 0, memory_order_relaxed); /* relaxed: as above */
}

/* A value congruent to neither pos nor pos + 1 modulo size was never stored
 * in the slot of pos by any legal history (ring.h, Validation). */
static bool congruent(uint32_t size, uint32_t seq, uint32_t pos)
{
    uint32_t d = (seq - pos) & (size - 1);
    return d == 0 || d == 1;
}

int sr__ring_recheck(struct sr_ring *r, uint32_t size, uint32_t *pos)
{
    uint32_t p = *pos;
    /* seq_cst: the re-reads below see stores at least as recent as those
     * the caller's reads missed; a stale value must not look corrupt */
    atomic_thread_fence(memory_order_seq_cst);
    /* relaxed: ordered by the fence above */
    uint32_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
    if (t != p) {
        if ((int32_t)(t - p) < 0)
            return -EPROTO; /* tail moved backwards: only a foreign write does that */
        *pos = t;
        return 1;
    }
    /* P0 acquire: as in sr__ring_enqueue */
    uint32_t seq = atomic_load_explicit(&r->slots[p & (size - 1)].seq, memory_order_acquire);
    int32_t dif = (int32_t)(seq - p);
    if (!congruent(size, seq, p))
        return -EPROTO;
    if (dif == 0)
        return 1;
    if (dif == 1 - (int32_t)size || dif == -(int32_t)size)
        return -EAGAIN;
    return -EPROTO; /* ahead of a tail that has not moved, or more than a lap behind it */
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

int sr__ring_cons_recover(struct sr_ring_cons *c, struct sr_ring *r, uint32_t slots, char *why, size_t len)
{
    /* relaxed: a snapshot; positions claimed after it are read later */
    uint32_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    uint32_t head = tail;
    for (uint32_t p = tail - slots; p != tail; p++) {
        /* acquire: C1, as in sr__ring_read_burst */
        uint32_t seq = atomic_load_explicit(&r->slots[p & (slots - 1)].seq, memory_order_acquire);
        if (seq != p + slots) { /* not freed for the next lap: the first position left to read */
            head = p;
            break;
        }
    }
    /* relaxed: the words of a consumer that is gone; ours until we detach */
    atomic_store_explicit(&r->head, head, memory_order_relaxed);
    atomic_store_explicit(&r->held, 0, memory_order_relaxed); /* relaxed: as above */
    return sr__ring_cons_attach(c, r, slots, why, len);
}

int sr__ring_cons_attach(struct sr_ring_cons *c, struct sr_ring *r, uint32_t slots, char *why, size_t len)
{
    /* relaxed: the consumer's own words, last written by its previous detach
     * (same process) or by the creator */
    uint32_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    uint32_t held = atomic_load_explicit(&r->held, memory_order_relaxed); /* relaxed: as above */
    *c = (struct sr_ring_cons){.ring = r, .slots = r->slots, .size = slots, .mask = slots - 1};
    if (r->size != slots || r->mask != slots - 1) {
        snprintf(why, len, "its size/mask words are %u/%#x, the segment's layout says %u slots", r->size, r->mask,
                 slots);
        return -EPROTO;
    }
    if (held > slots) {
        snprintf(why, len, "it claims %u held slots of %u", held, slots);
        return -EPROTO;
    }
    /* the held slots were published and read; the one at head is free or published */
    for (uint32_t p = head - held; p != head; p++) {
        /* acquire: C1, as in sr__ring_read_burst */
        uint32_t seq = atomic_load_explicit(&r->slots[p & c->mask].seq, memory_order_acquire);
        if (seq != p + 1) {
            snprintf(why, len, "held position %u holds sequence %u (head %u, %u held)", p, seq, head, held);
            return -EPROTO;
        }
    }
    /* acquire: C1, as in sr__ring_read_burst */
    uint32_t seq = atomic_load_explicit(&r->slots[head & c->mask].seq, memory_order_acquire);
    if (held < slots && seq != head && seq != head + 1) {
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
