/* The shared heap. See heap.h.
 * STATUS: process-private blocks only; the jemalloc arena over the segment is
 * being written (issue 3). The API and the block header are final. */
#include "heap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

#define BLOCK_MAGIC 0x6b6c4273u /* "sBlk" */

struct sr_block {
    uint64_t size;            /* data bytes; written once by the allocator */
    int32_t owner;            /* rank, -1 private; written once by the allocator */
    uint32_t magic;
    _Atomic uint32_t refcount; /* every holder */
    uint32_t pad;
    _Atomic uint64_t next_free; /* remote-free list link (offset), written by the releasing worker */
    char reserved[32];
};
_Static_assert(sizeof(struct sr_block) == 64, "block header is one cache line");

int sr_heap_attach(const sr_segment *seg, int rank)
{
    (void)seg;
    (void)rank;
    return sr__fail(-ENOSYS, "sr_heap_attach", "the shared heap is not implemented yet");
}

void sr_heap_detach(void) {}
bool sr_heap_attached(void) { return false; }

sr_block *sr_block_alloc(size_t nbytes)
{
    sr_block *b = aligned_alloc(64, sizeof(sr_block) + ((nbytes + 63) & ~(size_t)63));
    if (!b) {
        sr__fail(-ENOMEM, "sr_block_alloc", "out of memory allocating %zu bytes", nbytes);
        return NULL;
    }
    b->size = nbytes;
    b->owner = -1;
    b->magic = BLOCK_MAGIC;
    atomic_init(&b->refcount, 1);
    atomic_init(&b->next_free, 0);
    return b;
}

void *sr_block_data(const sr_block *b) { return (char *)b + sizeof(*b); }
size_t sr_block_size(const sr_block *b) { return b->size; }
int sr_block_owner(const sr_block *b) { return b->owner; }

uint32_t sr_block_refcount(const sr_block *b)
{
    /* acquire: pairs with the release decrement in sr_block_unref, so a
     * caller that sees 1 also sees every other holder's writes finished */
    return atomic_load_explicit(&((sr_block *)b)->refcount, memory_order_acquire);
}

sr_block *sr_block_ref(sr_block *b)
{
    /* relaxed: the caller already holds a reference, so the block cannot go */
    atomic_fetch_add_explicit(&b->refcount, 1, memory_order_relaxed);
    return b;
}

void sr_block_unref(sr_block *b)
{
    if (!b)
        return;
    /* acq_rel: release our writes to the block; the last holder acquires all */
    if (atomic_fetch_sub_explicit(&b->refcount, 1, memory_order_acq_rel) == 1)
        free(b);
}

uint64_t sr_block_to_off(const sr_block *b)
{
    (void)b;
    return (uint64_t)-1;
}

sr_block *sr_block_from_off(uint64_t off)
{
    sr__fail(-EINVAL, "sr_block_from_off", "offset %llu: no shared heap attached", (unsigned long long)off);
    return NULL;
}

unsigned sr_heap_drain(void) { return 0; }
size_t sr_heap_allocated(void) { return 0; }
