/* SPDX-License-Identifier: MIT */
/* The shared heap: refcounted blocks that any worker of the job can read.
 *
 * After sr__heap_attach(), each worker owns a jemalloc arena whose extents are
 * carved from a heap area of the segment it owns (see "Areas" below). A block
 * is a header in shared memory followed by its data (64-byte aligned):
 *   - size, owner (rank) and area are written once by the allocating worker;
 *   - refcount is an atomic shared by every worker holding the block.
 * A block passes between workers as its offset in the segment, never as a
 * pointer (sr__block_to_off / sr__block_from_off).
 *
 * Freeing: whoever drops the last reference frees the block. If that is not
 * the owner, the block is pushed onto its area's lock-free remote-free list,
 * and the owner returns it to its arena in sr__heap_drain() (called from its
 * progress loop). Only the owner's jemalloc ever frees a block; the blocks
 * of a dead owner's (quarantined) area are never freed one by one.
 *
 * Without sr__heap_attach() (a single process, unit tests), blocks come from
 * the process-private malloc heap with the same header and the same API;
 * sr__block_to_off() then fails. Blocks allocated before attach stay private.
 *
 * Lifetime: a block lives while its refcount is above zero. sr__block_data()
 * is valid for as long as the caller holds a reference. A block of a worker
 * that has detached or died stays readable (its pages are kept) until its
 * area is reclaimed (see "Areas"), but is never freed one by one.
 *
 * Threads: every call may come from any thread of the worker, except
 * sr__heap_attach and sr__heap_detach, which must not overlap any other heap
 * call of the process (sr__xport_attach/detach call them).
 *
 * Blocks below 8 MiB freed by their owner process are kept in a per-thread
 * cache (bins up to 16 KiB, a few large slots) for the next allocation of
 * the thread (docs/HEAP.md, section 9).
 *
 * Nothing read from the segment is trusted: the geometry is copied at
 * attach, and a block header carries a check word over its write-once fields,
 * verified before any of them is used to free, index or read (a corrupt block
 * is an -EPROTO error naming the worker, and is leaked). See sr__block_check.
 *
 * Limits (docs/HEAP.md): blocks below 8 MiB come from jemalloc and are
 * rounded up to its size classes (at most 25%, usually much less: the header
 * moves out of the way when it would cost a class); blocks of 8 MiB and more
 * take their size rounded up to a page. Only pages written cost memory. A
 * huge block's pages go back to the kernel when it leaves the huge cache;
 * jemalloc's when its decay purges them (about 10 s), when the area passes
 * three quarters in use, or at once with sr__heap_purge() (docs/HEAP.md, 5).
 */
#ifndef SR_SHM_HEAP_H
#define SR_SHM_HEAP_H

#if !defined(SR__SEES_SHM)
#error "heap.h is the seam of the substrate (shm) layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "segment.h"
#include "tsan.h"

typedef struct sr_block sr_block;

/* Areas. The segment holds world_size + spares heap areas (segment.h), and
 * its area table says, for each, FREE, OWNED by (rank, generation),
 * QUARANTINED or RECLAIMING. A block's header names its area, and the last
 * unref of a block by a process that does not own its area pushes it onto
 * the area's remote-free list, which the area's owner process drains.
 *
 * Attach takes a FREE area by compare-and-swap (rank r's first choice is
 * area r, so a job without replacements is laid out as before; then the
 * spares), and empties it: a FREE area holds no live block. Detach makes the
 * area FREE again when none of its blocks is live (exact: the process counts
 * what it allocated and what came back), else QUARANTINED. A process that
 * dies leaves its area OWNED: whoever handles the death quarantines it
 * (sr__heap_area_quarantine, after the process was reaped), which also
 * drops the references the dead process held to other areas' blocks. A
 * quarantined area's blocks stay valid and readable; their last unrefs go
 * onto its list, which nobody drains (no dead jemalloc is ever touched). It
 * becomes FREE again by itself once no living process holds, and no message
 * carries, a reference to any of its blocks: each area counts those
 * (foreign), each process lists what it holds of other areas (its table),
 * and references cross messages through sr__block_send_off and
 * sr__block_recv_off (docs/HEAP.md §11, "Who holds what").
 *
 * Ordering of the state word (segment.h, struct sr_heap_area_info):
 *   A1  every change is an acq_rel CAS: attach (FREE -> OWNED), detach
 *       (OWNED -> QUARANTINED or RECLAIMING), quarantine (OWNED ->
 *       QUARANTINING; the walker's seq_cst store of QUARANTINED is the one
 *       plain store, H2 in heap.c), reclaim (QUARANTINED -> RECLAIMING); one
 *       total order per area.
 *   A2  the way back to FREE: punch the pages, reset the list, release
 *       store of FREE; pairs with the acq_rel CAS of the next attach, so the
 *       new owner sees an empty area and an empty list. */

/* Create this worker's arena over a FREE heap area (area rank first, then
 * the spares), emptied first; the area becomes OWNED by (rank, gen).
 * sr__heap_attach is generation 1 (a worker's first process);
 * a replacement of a dead process passes its rank's next generation (the
 * layer above counts them). Errors: -EINVAL bad rank or generation 0,
 * -EBUSY already attached to another segment, rank or generation, -ENOSPC no
 * FREE area (the message names the rank and how many areas are
 * quarantined), -ENOMEM / -errno from jemalloc's mallctl or madvise.
 * Idempotent per process (same segment, rank and generation: 0). */
int sr__heap_attach(const sr_segment *seg, int rank);
int sr__heap_attach_gen(const sr_segment *seg, int rank, uint32_t gen);
/* Drain and forget the arena: the arena is destroyed without touching its
 * pages, so peers' references stay valid. The area becomes FREE (its pages
 * punched) when none of our blocks is live any more, else QUARANTINED. */
void sr__heap_detach(void);

/* A snapshot of area a's line of the area table. */
typedef struct sr_heap_area {
    uint32_t state;        /* enum sr_heap_area_state */
    int rank;              /* owner (OWNED, QUARANTINED) */
    uint32_t gen;          /* its generation */
    uint64_t remote_free;  /* head of its remote-free list (0: empty) */
    uint64_t foreign;      /* references to its blocks held outside its owner, or in messages */
} sr_heap_area;
/* 0, or -EINVAL for an area out of [0, seg->heap_areas). */
int sr__heap_area_get(const sr_segment *seg, int a, sr_heap_area *out);
/* The references area a's owner lists in its table (to other areas'
 * blocks: *held) and those it could not list (*lost). Reads the table
 * (64 KiB: its untouched pages get allocated). 0 or -EINVAL. */
int sr__heap_area_held(const sr_segment *seg, int a, uint64_t *held, uint64_t *lost);
/* The area rank's generation gen owns, or -ENOENT. */
int sr__heap_area_find(const sr_segment *seg, int rank, uint32_t gen);
/* For whoever handles a death, once the dead process is reaped (nothing
 * allocates in the area, nor changes its table, any more): OWNED ->
 * QUARANTINING; every reference the dead process held to other areas'
 * blocks (its table) is dropped, which frees survivors' blocks and may
 * reclaim other dead areas; then QUARANTINED, and FREE at once (reclaimed)
 * if no other process nor message holds a block of the area (its foreign
 * count is 0). Else the last such reference to go reclaims it, in whichever
 * process drops it. 0 also when the area is FREE (its owner detached with
 * no block live), QUARANTINED, QUARANTINING or RECLAIMING already; -EINVAL
 * bad area. Any process, attached or not (the supervisor). */
int sr__heap_area_quarantine(const sr_segment *seg, int a);
/* QUARANTINED -> FREE: punch every page of the area, empty its list. The
 * caller guarantees that no living process holds a reference to a block of
 * the area, and that none is in flight to one. Rarely needed now: the heap
 * reclaims a dead owner's area itself once its foreign count is 0; this is
 * for an area whose count a crash left too high (a leak the caller knows is
 * one). -EBUSY if the area is not QUARANTINED (or is ours), -EINVAL bad area,
 * -errno from madvise (the area is FREE anyway: its pages read as before,
 * and the next attach empties it again). Any process. */
int sr__heap_area_reclaim(const sr_segment *seg, int a);

/* The last SR_HEAP_HELD_BYTES of each heap area are not for blocks: they
 * hold its owner's table of the references it holds to other areas' blocks
 * (SR_HEAP_HELD_SLOTS entries; more distinct blocks at once are counted,
 * not listed, and leak if the owner dies). */
#define SR_HEAP_HELD_SLOTS 8192u
#define SR_HEAP_HELD_BYTES (4096u + 8u * SR_HEAP_HELD_SLOTS)
bool sr__heap_attached(void);

/* A new block of nbytes with refcount 1, data 64-byte aligned and, when
 * attached, inside this worker's heap area. NULL on failure, with errno =
 * ENOMEM and sr_last_error() naming the worker, the size asked and the heap's
 * size. Drains the remote-free list first (one load when it is empty). */
sr_block *sr__block_alloc(size_t nbytes);
void *sr__block_data(const sr_block *b);
/* The data and size of b, once its header is checked: the check word written
 * at allocation matches, its area is the heap area the header lies in, and
 * the data lies in that area. -EPROTO and sr_last_error() (naming the worker
 * and what is wrong) if a peer corrupted it. Take them once and keep them:
 * what is kept in private memory cannot be changed under you by a peer
 * (sr__block_data and sr__block_size re-read the shared header). */
int sr__block_check(const sr_block *b, void **data, size_t *size);
size_t sr__block_size(const sr_block *b);
int sr__block_owner(const sr_block *b);      /* rank that allocated it, or -1 for a private block */
uint32_t sr__block_refcount(const sr_block *b);
sr_block *sr__block_ref(sr_block *b);
/* Drop a reference. The last one frees the block: at once if this process
 * owns its area (or it is private), else by pushing it onto the area's
 * remote-free list. Releasing more references than were taken aborts. A header that
 * fails sr__block_check is not freed: the block is leaked, with -EPROTO in
 * sr_last_error() and a line on stderr. */
void sr__block_unref(sr_block *b);

/* ThreadSanitizer (tsan.h): the calling thread is done with b, which is
 * about to leave this process (sent in a message, or its reference given up;
 * sr__block_unref does this itself). Whoever gets b's memory back in this
 * process later (sr__block_from_off, the drain) takes the hand-off over.
 * Nothing outside a TSan build. */
#ifdef SR_TSAN
void sr__block_handoff(const sr_block *b);
#else
static inline void sr__block_handoff(const sr_block *b) { (void)b; }
#endif

/* Offset of a shared block in the segment; (uint64_t)-1 for a private one.
 * Only a name: to put a reference into a message, use sr__block_send_off. */
uint64_t sr__block_to_off(const sr_block *b);
/* The block at off, validated (inside some heap area, 64-byte
 * aligned, header magic, its area field that area, size within it, a
 * reference left), or NULL with -EINVAL in sr_last_error(). Takes no
 * reference and moves none: a look at a block whose reference someone
 * holds (a message's, until sr__block_recv_off takes it). */
sr_block *sr__block_from_off(uint64_t off);

/* Moving a reference through a message (docs/HEAP.md, "Who holds what").
 * A reference inside a message belongs to no process, so the heap must see
 * it go in and come out, or a death could not tell who holds what:
 *   sr__block_send_off: the caller's reference to b goes into a message
 *     (the caller forgets it); returns b's offset, (uint64_t)-1 for a
 *     private block or when not attached (nothing moves then). Call it
 *     before the offset is published.
 *   sr__block_recv_off: take the reference a message carried at off: the
 *     block (validated as sr__block_from_off) now held by the caller, who
 *     drops it with sr__block_unref as any other; NULL with -EINVAL if off
 *     is not a live block (the reference is then lost: it leaks).
 * Every reference put in with send_off must come out exactly once with
 * recv_off, by the receiver or by whoever drops the message (a sender that
 * could not send it, a refusal). A missed recv_off only leaks; a missed
 * send_off could free a block still held, so every path that puts a
 * reference into a message goes through it. */
uint64_t sr__block_send_off(sr_block *b);
sr_block *sr__block_recv_off(uint64_t off);

/* Owner: free blocks of our area that other processes released. Returns how many. Cheap
 * when there are none (one relaxed load); sr__xport_wait calls it. */
unsigned sr__heap_drain(void);

/* Give every free dirty page of this worker's arena back to the kernel now,
 * instead of after jemalloc's decay time. 0 (also when not attached) or
 * -errno from mallctl. */
int sr__heap_purge(void);

/* Bytes this worker's blocks hold: the arena's allocated bytes (jemalloc
 * stats, refreshed by an epoch bump) plus the pages of live huge blocks. For
 * leak checks: it returns to its value once every block is freed. */
size_t sr__heap_allocated(void);

/* What happened to this worker's shared blocks since sr__heap_attach
 * (process-local counts; private blocks are not counted). */
typedef struct sr_heap_counters {
    uint64_t allocs;        /* blocks allocated in our arena */
    uint64_t local_frees;   /* our blocks freed by our own last unref */
    uint64_t drained;       /* our blocks freed by sr__heap_drain (a peer held the last reference) */
    uint64_t remote_pushes; /* peers' blocks we pushed onto their owner's list */
} sr_heap_counters;
void sr__heap_counters_get(sr_heap_counters *out);

#endif
