/* SPDX-License-Identifier: MIT */
/* The extent side of the shared heap: one jemalloc arena per process whose
 * extents are carved from that worker's heap area of the segment.
 *
 * heap.c (the block side) owns the arena index; this file owns the extent
 * hooks and the carve allocator behind them. Everything here is private to
 * the process: jemalloc's bookkeeping never lives in a place a peer reads,
 * only the pages it hands out do. See docs/HEAP.md.
 *
 * Threads: the hooks run on whichever thread of the process makes jemalloc
 * need an extent; the carve allocator has its own lock. create/destroy must
 * not run concurrently with any allocation in the arena.
 */
#ifndef SR_SHM_HEAP_EXTENT_H
#define SR_SHM_HEAP_EXTENT_H

#if !defined(SR__IN_SHM)
#error "heap_extent.h is private to the substrate (shm) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Counters of the carve allocator (process-private; read under its lock). */
struct sr_heap_extent_stats {
    uint64_t area;       /* bytes of the heap area */
    uint64_t used;       /* handed out (to jemalloc's extents, huge blocks, the huge cache) */
    uint64_t free_bytes; /* on the free-range table */
    uint64_t largest_free; /* the largest free range: the largest huge block that fits now */
    uint64_t cached;     /* freed huge ranges kept with their pages for reuse (part of used) */
    uint64_t punched;    /* bytes given back to the kernel (MADV_REMOVE), cumulative */
    uint64_t dropped;    /* address space lost because the free-range table was full */
    uint64_t huge_live;  /* bytes of huge blocks live (page-rounded) */
    unsigned nfree;      /* free ranges */
};

/* How long jemalloc keeps freed extents of the arena dirty (pages kept for
 * reuse) before it punches them (arena.<i>.dirty_decay_ms). */
#define SR_HEAP_DIRTY_DECAY_MS 10000

/* Create the process's arena over [area, area + len): the area is emptied
 * first (every page given back, so all of it reads as zero), then
 * arenas.create installs the hooks, and the purge policy is set (dirty decay
 * SR_HEAP_DIRTY_DECAY_MS, no muzzy state, no eager purge of coalesced
 * oversize extents). area must be page-aligned; only one arena may exist per
 * process.
 * Errors: -EBUSY one exists; -EINVAL/-errno madvise failed; -errno from mallctl. */
int sr__heap_arena_create(void *area, uint64_t len, unsigned *arena);

/* Destroy the arena (arena.<i>.destroy). Every page is left as it is, so a
 * peer still holding one of its blocks reads valid data until the area is
 * emptied (heap.c: a detach with no block live, or a reclaim); the area is
 * then forgotten here. */
void sr__heap_arena_destroy(unsigned arena);

/* In a child forked by an attached process: forget the parent's area (the
 * child's copy of the parent's arena is never used again), so that the child
 * may create an arena of its own. Async-signal-safe (an atfork handler). */
void sr__heap_arena_forget_in_child(void);

/* Give every unused dirty page of the arena back to the kernel now
 * (arena.<i>.purge). 0 or -errno. */
int sr__heap_arena_purge(unsigned arena);

/* small.allocated + large.allocated of the arena after an epoch refresh. */
size_t sr__heap_arena_allocated(unsigned arena);

void sr__heap_extent_stats(struct sr_heap_extent_stats *out);

/* Pressure: true once the bytes handed out of the area (extents, huge
 * blocks, the huge cache) passed three quarters of it, or, after a purge,
 * grew by another sixteenth of it. The allocator then purges
 * (sr__heap_purge) and calls sr__heap_extent_relieved. Any thread. */
bool sr__heap_extent_pressed(void);
void sr__heap_extent_relieved(void);

/* Pages for a huge block's data, cut straight from the area, bypassing
 * jemalloc (len rounded up to pages; page-aligned; reads as zero). NULL if
 * no free range is large enough. Any thread. */
void *sr__heap_huge_alloc(size_t len);
/* Give them back: punched out of the memfd, then free for reuse at once. */
void sr__heap_huge_free(void *p, size_t len);
/* Give back the pages of every cached huge range; returns how many. */
unsigned sr__heap_huge_flush(void);

#endif
