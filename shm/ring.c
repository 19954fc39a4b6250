#include "ring.h"

#include <stdbool.h>

void sr_ring_init(struct sr_ring *r, uint32_t slots)
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
static bool congruent(const struct sr_ring *r, uint32_t seq, uint32_t pos)
{
    uint32_t d = (seq - pos) & r->mask;
    return d == 0 || d == 1;
}

int sr__ring_recheck(struct sr_ring *r, uint32_t *pos)
{
    uint32_t p = *pos;
    /* relaxed: written once by the segment creator */
    if (r->size < 2 || (r->size & r->mask) || r->mask != r->size - 1)
        return -EPROTO;
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
    /* P0 acquire: as in sr_ring_enqueue */
    uint32_t seq = atomic_load_explicit(&r->slots[p & r->mask].seq, memory_order_acquire);
    int32_t dif = (int32_t)(seq - p);
    if (!congruent(r, seq, p))
        return -EPROTO;
    if (dif == 0)
        return 1;
    if (dif == 1 - (int32_t)r->size || dif == -(int32_t)r->size)
        return -EAGAIN;
    return -EPROTO; /* ahead of a tail that has not moved, or more than a lap behind it */
}

int sr_ring_probe(struct sr_ring *r)
{
    /* relaxed: sr__ring_recheck re-reads it after a fence */
    uint32_t pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
    for (int i = 0; i < 16; i++) {
        uint32_t p = pos;
        int rc = sr__ring_recheck(r, &p);
        if (rc <= 0)
            return rc;
        if (p == pos)
            return 0; /* the slot at tail is free */
        pos = p;
    }
    return -EAGAIN; /* tail keeps moving: other producers are sending, not a corrupt ring */
}
