/* The shared heap: refcounted blocks that any worker of the job can read.
 *
 * After sr_heap_attach(), each worker owns a jemalloc arena whose extents are
 * carved from its own heap area of the segment. A block is a header in shared
 * memory followed by its data (64-byte aligned):
 *   - size and owner are written once by the allocating worker;
 *   - refcount is an atomic shared by every worker holding the block.
 * A block passes between workers as its offset in the segment, never as a
 * pointer (sr_block_to_off / sr_block_from_off).
 *
 * Freeing: whoever drops the last reference frees the block. If that is not
 * the owner, the block is pushed onto the owner's lock-free remote-free list,
 * and the owner returns it to its arena in sr_heap_drain() (called from its
 * progress loop). Only the owner's jemalloc ever frees a block.
 *
 * Without sr_heap_attach() (a single process, unit tests), blocks come from
 * the process-private malloc heap with the same header and the same API;
 * sr_block_to_off() then fails.
 *
 * Lifetime: a block lives while its refcount is above zero. sr_block_data()
 * is valid for as long as the caller holds a reference.
 */
#ifndef SR_SHM_HEAP_H
#define SR_SHM_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "segment.h"

typedef struct sr_block sr_block;

/* Create this worker's arena over its heap area. Errors: -EINVAL bad rank,
 * -ENOMEM / -errno from jemalloc's mallctl. Idempotent per process. */
int sr_heap_attach(const sr_segment *seg, int rank);
/* Drain and forget the arena (its memory goes with the segment). */
void sr_heap_detach(void);
bool sr_heap_attached(void);

/* A new block of nbytes with refcount 1, or NULL with sr_last_error() set
 * (-ENOMEM names the worker, the size asked and the heap's size). */
sr_block *sr_block_alloc(size_t nbytes);
void *sr_block_data(const sr_block *b);
size_t sr_block_size(const sr_block *b);
int sr_block_owner(const sr_block *b);      /* rank, or -1 for a private block */
uint32_t sr_block_refcount(const sr_block *b);
sr_block *sr_block_ref(sr_block *b);
void sr_block_unref(sr_block *b);

/* Offset of a shared block in the segment; (uint64_t)-1 for a private one. */
uint64_t sr_block_to_off(const sr_block *b);
/* The block at off, validated (bounds, header magic), or NULL with -EINVAL
 * in sr_last_error(). Takes no reference. */
sr_block *sr_block_from_off(uint64_t off);

/* Owner: free blocks that other workers released. Returns how many. */
unsigned sr_heap_drain(void);

/* Bytes this worker's arena has allocated (jemalloc stats), for leak checks. */
size_t sr_heap_allocated(void);

#endif
