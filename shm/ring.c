#include "ring.h"

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
}
