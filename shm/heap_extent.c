/* SPDX-License-Identifier: MIT */
/* Extent hooks over one worker's heap area. See heap_extent.h and docs/HEAP.md.
 *
 * The carve allocator. jemalloc asks for extents (page multiples, aligned to
 * a power of two >= a page; 2 MiB for metadata blocks when its metadata is
 * not kept private, see create_with_hooks), and heap.c
 * asks for the pages of huge blocks, which bypass jemalloc. Both are cut
 * from the area by best fit over an address-ordered table of free ranges
 * (at attach: one range, the whole area). Huge blocks are placed at the high
 * end of the range they take, jemalloc's extents at the low end, so the two
 * kinds grow from opposite ends of the area. Freed ranges coalesce with their
 * neighbours (the table is sorted by address and never holds two adjacent
 * ranges). If the table is full a fragment is dropped: address space is lost,
 * never memory, since a dropped range holds no page. Why best fit and two
 * ends: docs/HEAP.md, "Fragmentation".
 *
 * Invariant: every byte on the free list reads as
 * zero (the area is emptied at create; a range comes back to the table only
 * once its pages are punched out). So alloc always reports *zero = true.
 *
 * Which hooks do what, and why:
 *   alloc          carve (above); memory is committed lazily by the kernel
 *   dalloc         punch (if committed) and take the range back: returns
 *                  false, we really reuse it. jemalloc calls it when decay
 *                  retires an extent. Had we opted out, jemalloc would keep the
 *                  range in its retained set for good, usable only by its own
 *                  extents: address space a huge block could never get back.
 *                  If the punch fails we opt out (true) and jemalloc keeps it.
 *   decommit,      punch the pages out of the memfd with MADV_REMOVE. On a
 *   purge_forced   shared mapping MADV_DONTNEED only drops this process's page
 *                  table entries: the pages stay in the memfd. MADV_FREE is
 *                  refused on shared mappings, so there is no lazy purge.
 *   commit         nothing to do: a punched page faults back in zero-filled.
 *   destroy        as dalloc, for the retained extents of a destroyed arena.
 *   split, merge   always succeed: an extent is only an address range of one
 *                  contiguous area, nothing per extent lives here.
 * Grow steps are refused (see grow_refused below), so jemalloc asks for each
 * extent it needs and gives back through dalloc every extent it retires,
 * whether or not it runs with retain (a process-wide option we leave alone).
 * While the arena is destroyed at detach, punching is switched off: a peer
 * may still be reading one of our blocks, and its pages must stay.
 */
#include "heap_extent.h"

#include <errno.h>
#include <jemalloc/jemalloc.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>

#include "error.h"
#include "log.h"

#define HUGE_ALIGN 4096u               /* pages of huge blocks */
#define FREE_MAX 4096                 /* free ranges kept; see the header comment */

struct range {
    uint64_t off, len; /* from the area's start */
};

#define HUGE_CACHE_SLOTS 4

struct carver {
    extent_hooks_t hooks; /* first: jemalloc hands &hooks back to every hook */
    pthread_mutex_t lock; /* hooks run on any thread allocating in the arena */
    char *base;           /* NULL: no arena */
    uint64_t len;
    unsigned nfree;
    _Atomic bool keep_pages; /* set while the arena is destroyed at detach */
    bool refuse_grow;     /* jemalloc runs with retain: refuse its grow steps (grow_refused) */
    struct range free[FREE_MAX]; /* sorted by off; disjoint, never adjacent */
    _Atomic uint64_t punched; /* statistics */
    uint64_t dropped;
    uint64_t huge_live;   /* bytes of huge blocks handed out and not yet freed */
    uint64_t used;        /* bytes not on the free table: extents, huge blocks, the huge cache */
    uint64_t purge_at;    /* used above this: the heap is pressed (see note_use) */
    _Atomic bool pressed; /* set by note_use, cleared by sr__heap_extent_relieved */
    /* Huge ranges freed recently and kept with their pages (see huge_cache_put). */
    struct range cached[HUGE_CACHE_SLOTS];
    unsigned ncached;
    uint64_t cached_bytes;
};

static void *hook_alloc(extent_hooks_t *, void *, size_t, size_t, bool *, bool *, unsigned);
static bool hook_dalloc(extent_hooks_t *, void *, size_t, bool, unsigned);
static void hook_destroy(extent_hooks_t *, void *, size_t, bool, unsigned);
static bool hook_commit(extent_hooks_t *, void *, size_t, size_t, size_t, unsigned);
static bool hook_punch(extent_hooks_t *, void *, size_t, size_t, size_t, unsigned);
static bool hook_split(extent_hooks_t *, void *, size_t, size_t, size_t, bool, unsigned);
static bool hook_merge(extent_hooks_t *, void *, size_t, void *, size_t, bool, unsigned);

/* jemalloc's retain (on by default on 64-bit Linux; a process-wide option
 * we leave alone) makes the arena grow in geometric steps: it asks the alloc
 * hook for a step (2 MiB, then more) and keeps whatever the step's first
 * extent does not use in its retained set, for good: address space of our
 * area that only jemalloc's own extents can reuse, scattered through the
 * area. In a mixed workload that set grew to hundreds of MiB in 8-16 MiB
 * pieces, and a 16 MiB block found no room with 48 MiB live (docs/HEAP.md,
 * "Fragmentation"). So the alloc hook refuses grow steps: when a grow step
 * fails, jemalloc (5.x, ecache_alloc_grow) asks the hook again at once, on
 * the same thread, for exactly the extent it needs (extent_alloc_wrapper),
 * and that one is carved. Nothing then enters the retained set, and every
 * extent decay or a purge retires comes back through dalloc, as with
 * retain:false, for our arena only. The two calls look alike (no address,
 * page alignment), so the hook tells them apart by order: with retain on, a
 * thread's first call is refused and the next one served (grow_refused).
 * Should a jemalloc not ask again, the allocation fails, and sr__block_alloc
 * retries it after a purge: the second call is then served. */
static _Thread_local bool grow_refused;

/* Static storage: jemalloc reads the hook table for the whole life of the
 * arena, and the arena lives until sr__heap_arena_destroy(). */
static struct carver carver = {
    .hooks = {
        .alloc = hook_alloc,
        .dalloc = hook_dalloc,
        .destroy = hook_destroy,
        .commit = hook_commit,
        .decommit = hook_punch,
        .purge_lazy = NULL,
        .purge_forced = hook_punch,
        .split = hook_split,
        .merge = hook_merge,
    },
    .lock = PTHREAD_MUTEX_INITIALIZER,
};

static struct carver *of(extent_hooks_t *h) { return (struct carver *)h; }

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

/* ---- the free-range table (caller holds the lock) ---- */

/* The first range that starts at or after off (binary search). */
static unsigned table_find(const struct carver *c, uint64_t off)
{
    unsigned lo = 0, hi = c->nfree;
    while (lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        if (c->free[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void table_remove(struct carver *c, unsigned i)
{
    memmove(&c->free[i], &c->free[i + 1], (c->nfree - i - 1) * sizeof(c->free[0]));
    c->nfree--;
}

static bool table_insert(struct carver *c, unsigned i, struct range r)
{
    if (c->nfree == FREE_MAX) {
        c->dropped += r.len;
        return false;
    }
    memmove(&c->free[i + 1], &c->free[i], (c->nfree - i) * sizeof(c->free[0]));
    c->free[i] = r;
    c->nfree++;
    return true;
}

/* Return [off, off + len) to the allocator, merging with its neighbours. */
static void release(struct carver *c, uint64_t off, uint64_t len)
{
    c->used -= len;
    unsigned i = table_find(c, off);
    bool join_prev = i > 0 && c->free[i - 1].off + c->free[i - 1].len == off;
    bool join_next = i < c->nfree && off + len == c->free[i].off;
    if (join_prev && join_next) {
        c->free[i - 1].len += len + c->free[i].len;
        table_remove(c, i);
    } else if (join_prev) {
        c->free[i - 1].len += len;
    } else if (join_next) {
        c->free[i].off = off;
        c->free[i].len += len;
    } else {
        table_insert(c, i, (struct range){off, len});
    }
}

/* Cut [off, off + len) out of free range i, which contains it. */
static void take(struct carver *c, unsigned i, uint64_t off, uint64_t len)
{
    struct range r = c->free[i];
    uint64_t end = off + len, r_end = r.off + r.len;
    if (off > r.off && end < r_end) {
        c->free[i].len = off - r.off;
        table_insert(c, i + 1, (struct range){end, r_end - end});
    } else if (off > r.off) {
        c->free[i].len = off - r.off;
    } else if (end < r_end) {
        c->free[i] = (struct range){end, r_end - end};
    } else {
        table_remove(c, i);
    }
}

/* ---- carving (caller holds the lock) ---- */

/* Where size bytes aligned to align go in r: at its low end, or (high) at
 * its high end. Absolute addresses are aligned: the mapping is only
 * page-aligned. false if they do not fit. */
static bool place(const struct carver *c, struct range r, uint64_t size, uint64_t align, bool high, uint64_t *at)
{
    uintptr_t base = (uintptr_t)c->base;
    if (size > r.len)
        return false;
    if (high) {
        *at = ((base + r.off + r.len - size) & ~(align - 1)) - base;
        return *at >= r.off && *at - r.off <= r.len - size;
    }
    *at = align_up(base + r.off, align) - base;
    return *at - r.off <= r.len - size;
}

/* size more bytes are in use. Past purge_at the heap is pressed: the next
 * allocation purges (sr__heap_relieve in heap.c; not here: a hook may not
 * call back into jemalloc). The flag is an event, raised by the carve that
 * crosses the mark; nothing polls the area's use. */
static void note_use(struct carver *c, uint64_t size)
{
    c->used += size;
    if (c->used > c->purge_at)
        /* relaxed: a hint for this process's next allocation; the purge
         * takes the locks it needs */
        atomic_store_explicit(&c->pressed, true, memory_order_relaxed);
}

/* The exact range [at, at + size), or false if any of it is in use. */
static bool carve_at(struct carver *c, uint64_t at, uint64_t size)
{
    unsigned i = table_find(c, at + 1); /* the range starting at or before at is i - 1 */
    if (i == 0)
        return false;
    struct range r = c->free[i - 1];
    if (at - r.off > r.len || size > r.len - (at - r.off))
        return false;
    take(c, i - 1, at, size);
    return true;
}

/* Best fit: the smallest free range that holds the request, so a large range
 * stays whole for as long as a smaller one will do. Huge blocks (high) go at
 * the high end of their range, and on a tie into the highest range;
 * jemalloc's extents go low. The two kinds live at opposite ends of the area
 * and of any range they share, so a long-lived small extent does not land in
 * the middle of the room a freed huge block leaves. See docs/HEAP.md. */
static void *carve(struct carver *c, void *new_addr, uint64_t size, uint64_t align, bool high)
{
    if (new_addr) {
        uint64_t at = (uint64_t)((char *)new_addr - c->base);
        bool inside = (char *)new_addr >= c->base && at < c->len;
        if (!inside || !carve_at(c, at, size))
            return NULL;
        note_use(c, size);
        return new_addr;
    }
    unsigned best = UINT_MAX;
    uint64_t best_at = 0, at;
    for (unsigned i = 0; i < c->nfree; i++) {
        if (!place(c, c->free[i], size, align, high, &at))
            continue;
        if (best == UINT_MAX || c->free[i].len < c->free[best].len || (high && c->free[i].len == c->free[best].len))
            best = i, best_at = at;
    }
    if (best == UINT_MAX)
        return NULL;
    take(c, best, best_at, size);
    note_use(c, size);
    return c->base + best_at;
}

/* Give the pages of [addr, addr + len) back to the kernel. false on success,
 * as jemalloc's hooks count. No lock: the range belongs to the caller, and a
 * punch of a large range takes milliseconds. */
static bool punch(struct carver *c, void *addr, size_t len)
{
    /* relaxed: keep_pages only changes while no allocation can run (destroy) */
    if (atomic_load_explicit(&c->keep_pages, memory_order_relaxed))
        return true;
    if (madvise(addr, len, MADV_REMOVE) != 0)
        return true;
    atomic_fetch_add_explicit(&c->punched, len, memory_order_relaxed); /* relaxed: statistics */
    return false;
}

/* ---- the hooks ---- */

static void *hook_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t align, bool *zero,
                        bool *commit, unsigned arena)
{
    (void)arena;
    struct carver *c = of(h);
    if (!new_addr && c->refuse_grow && !grow_refused) {
        grow_refused = true; /* a grow step: the exact extent is asked for next */
        return NULL;
    }
    grow_refused = false;
    pthread_mutex_lock(&c->lock);
    void *p = carve(c, new_addr, size, align, false);
    pthread_mutex_unlock(&c->lock);
    if (p) {
        *zero = true;   /* the invariant in the header comment */
        *commit = true; /* shared memfd pages are committed on first touch */
    }
    return p;
}

/* Punch [addr, addr + size) unless already empty, and take it back. true if
 * it could not be punched: it must then stay out of the table (the zero
 * invariant), and the caller keeps it. */
static bool give_back(struct carver *c, void *addr, size_t size, bool committed)
{
    /* relaxed: as in punch() */
    if (atomic_load_explicit(&c->keep_pages, memory_order_relaxed) || (committed && punch(c, addr, size)))
        return true;
    pthread_mutex_lock(&c->lock);
    release(c, (uint64_t)((char *)addr - c->base), size);
    pthread_mutex_unlock(&c->lock);
    return false;
}

static bool hook_dalloc(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned arena)
{
    (void)arena;
    return give_back(of(h), addr, size, committed);
}

static void hook_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned arena)
{
    (void)arena;
    (void)give_back(of(h), addr, size, committed); /* if kept: address space lost, nothing else */
}

static bool hook_commit(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len, unsigned arena)
{
    (void)h, (void)addr, (void)size, (void)off, (void)len, (void)arena;
    return false; /* decommitted ranges were punched: they fault back in as zeros */
}

static bool hook_punch(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len, unsigned arena)
{
    (void)size, (void)arena;
    return punch(of(h), (char *)addr + off, len);
}

static bool hook_split(extent_hooks_t *h, void *addr, size_t size, size_t size_a, size_t size_b,
                       bool committed, unsigned arena)
{
    (void)h, (void)addr, (void)size, (void)size_a, (void)size_b, (void)committed, (void)arena;
    return false;
}

static bool hook_merge(extent_hooks_t *h, void *addr_a, size_t size_a, void *addr_b, size_t size_b,
                       bool committed, unsigned arena)
{
    (void)size_b, (void)committed, (void)arena;
    struct carver *c = of(h);
    /* jemalloc only merges neighbours of this arena; refuse anything else */
    return (char *)addr_a + size_a != (char *)addr_b || (char *)addr_a < c->base ||
           (char *)addr_b + size_b > c->base + c->len;
}

/* ---- huge blocks ---- */

/* Huge blocks of one size tend to come back every step (activations,
 * gradients): a freed one is kept with its pages, up to HUGE_CACHE_SLOTS
 * ranges and a quarter of the area, and handed out again for the same
 * length. That saves faulting the pages in again (~2 GiB/s) and punching
 * them out on the owner's polling thread (milliseconds per 64 MiB). The
 * cache is flushed (punched) before an allocation gives up, and on purge. */
static void *huge_cache_take(struct carver *c, uint64_t len)
{
    for (unsigned i = 0; i < c->ncached; i++)
        if (c->cached[i].len == len) {
            void *p = c->base + c->cached[i].off;
            c->cached[i] = c->cached[--c->ncached];
            c->cached_bytes -= len;
            return p;
        }
    return NULL;
}

static bool huge_cache_put(struct carver *c, void *p, uint64_t len)
{
    if (c->ncached == HUGE_CACHE_SLOTS || c->cached_bytes + len > c->len / 4)
        return false;
    c->cached[c->ncached++] = (struct range){.off = (uint64_t)((char *)p - c->base), .len = len};
    c->cached_bytes += len;
    return true;
}

/* Punch every cached range; returns how many there were. */
unsigned sr__heap_huge_flush(void)
{
    struct carver *c = &carver;
    struct range taken[HUGE_CACHE_SLOTS];
    pthread_mutex_lock(&c->lock);
    unsigned n = c->ncached;
    char *base = c->base;
    for (unsigned i = 0; i < n; i++)
        taken[i] = c->cached[i];
    c->ncached = 0;
    c->cached_bytes = 0;
    pthread_mutex_unlock(&c->lock);
    for (unsigned i = 0; i < n; i++)
        if (give_back(c, base + taken[i].off, taken[i].len, true))
            sr_logf(SR_LOG_WARN, "sr_heap: could not punch a cached %llu-byte block",
                    (unsigned long long)taken[i].len);
    return n;
}

static void *huge_alloc_once(struct carver *c, uint64_t len)
{
    pthread_mutex_lock(&c->lock);
    void *p = c->base ? huge_cache_take(c, len) : NULL;
    if (!p && c->base)
        p = carve(c, NULL, len, HUGE_ALIGN, true);
    if (p)
        c->huge_live += len;
    pthread_mutex_unlock(&c->lock);
    return p;
}

void *sr__heap_huge_alloc(size_t len)
{
    if (!len)
        return NULL;
    uint64_t aligned = align_up(len, HUGE_ALIGN);
    void *p = huge_alloc_once(&carver, aligned);
    if (!p && sr__heap_huge_flush())
        p = huge_alloc_once(&carver, aligned);
    return p;
}

void sr__heap_huge_free(void *p, size_t len)
{
    struct carver *c = &carver;
    len = align_up(len, HUGE_ALIGN);
    pthread_mutex_lock(&c->lock);
    c->huge_live -= len;
    bool kept = huge_cache_put(c, p, len);
    pthread_mutex_unlock(&c->lock);
    if (!kept && give_back(c, p, len, true))
        sr_logf(SR_LOG_WARN, "sr_heap: could not punch a freed %zu-byte block; its address space is lost", len);
}

/* ---- pressure (docs/HEAP.md, "Giving pages back") ---- */

bool sr__heap_extent_pressed(void)
{
    /* relaxed: a hint, see note_use */
    return atomic_load_explicit(&carver.pressed, memory_order_relaxed);
}

/* After a purge: pressed again only once the use has grown by another
 * sixteenth of the area beyond what the purge left (or passed the mark),
 * so live data above the mark does not make every allocation purge. */
void sr__heap_extent_relieved(void)
{
    struct carver *c = &carver;
    pthread_mutex_lock(&c->lock);
    uint64_t mark = c->len / 4 * 3, again = c->used + c->len / 16;
    c->purge_at = again > mark ? again : mark;
    atomic_store_explicit(&c->pressed, false, memory_order_relaxed); /* relaxed: as note_use */
    pthread_mutex_unlock(&c->lock);
}

/* ---- the arena ---- */

static int arena_ctl(unsigned arena, const char *what, void *in, size_t in_len)
{
    char name[64];
    snprintf(name, sizeof(name), "arena.%u.%s", arena, what);
    int rc = mallctl(name, NULL, NULL, in, in_len);
    return rc ? sr__fail(-rc, "sr__heap_attach", "mallctl(\"%s\"): %s", name, strerror(rc)) : 0;
}

/* jemalloc 5.3's arena_config_t, which its public header does not export:
 * experimental.arenas_create_ext rejects any other size with EINVAL. */
struct je_arena_config {
    extent_hooks_t *extent_hooks;
    bool metadata_use_hooks;
};

/* The arena's own metadata (arena_t, bins and their mutexes, extent records)
 * is kept in private memory when jemalloc allows it: in the segment it would
 * be shared with any child the worker forks, whose jemalloc re-initialises
 * every arena mutex after fork(): our parent's mutexes. It would also take a
 * 2 MiB-aligned block of the area. arenas.create (metadata from the hooks)
 * is the fallback for a jemalloc without the experimental call. */
static int create_with_hooks(struct carver *c, unsigned *arena, bool *private_meta)
{
    extent_hooks_t *hooks = &c->hooks;
    size_t sz = sizeof(*arena);
#if JEMALLOC_VERSION_MAJOR == 5 && JEMALLOC_VERSION_MINOR == 3
    struct je_arena_config cfg = {.extent_hooks = hooks, .metadata_use_hooks = false};
    if (mallctl("experimental.arenas_create_ext", arena, &sz, &cfg, sizeof(cfg)) == 0)
        return *private_meta = true, 0;
#endif
    return mallctl("arenas.create", arena, &sz, &hooks, sizeof(hooks));
}

/* The purge policy of the arena (docs/HEAP.md, "Giving pages back").
 *   dirty_decay_ms  freed extents stay dirty (pages kept, reused at once by
 *                   the next allocation that fits) and are retired (dalloc:
 *                   punched, back to the carver) over SR_HEAP_DIRTY_DECAY_MS.
 *                   jemalloc ticks decay on the arena's own activity: no
 *                   timer, no background thread.
 *   muzzy_decay_ms  -1. We have no lazy purge (MADV_FREE is refused on
 *                   shared mappings), so nothing ever is muzzy; what -1
 *                   changes is that jemalloc no longer purges a freed extent
 *                   at once when it coalesces with its dirty neighbours into
 *                   8 MiB or more (its oversize shortcut, taken only while
 *                   both decays are >= 0). Activations and gradients of a
 *                   micro-batch, freed side by side, did exactly that: every
 *                   step punched them and faulted them in again.
 * Set per arena, so the process's own malloc keeps whatever it has. */
static int set_purge_policy(unsigned arena)
{
    ssize_t dirty = SR_HEAP_DIRTY_DECAY_MS, muzzy = -1;
    int rc = arena_ctl(arena, "dirty_decay_ms", &dirty, sizeof(dirty));
    return rc ? rc : arena_ctl(arena, "muzzy_decay_ms", &muzzy, sizeof(muzzy));
}

static int make_arena(struct carver *c, unsigned *arena)
{
    bool private_meta = false;
    int rc = create_with_hooks(c, arena, &private_meta);
    if (rc)
        return sr__fail(-rc, "sr__heap_attach", "mallctl(\"arenas.create\") with extent hooks: %s", strerror(rc));
    bool retain = true;
    size_t bsz = sizeof(retain);
    if (mallctl("opt.retain", &retain, &bsz, NULL, 0) != 0)
        retain = true; /* the 64-bit Linux default */
    /* Only with private metadata: otherwise jemalloc's own metadata blocks
     * come from the alloc hook too, and refusing one would fail them. */
    c->refuse_grow = retain && private_meta;
    if (retain && !private_meta)
        sr_logf(SR_LOG_WARN, "sr__heap_attach: jemalloc keeps its arena metadata in the heap area and runs with "
                           "retain; its grow steps stay in its retained set and the heap may fragment under churn "
                           "(docs/HEAP.md)");
    rc = set_purge_policy(*arena);
    if (rc)
        sr__heap_arena_destroy(*arena);
    return rc;
}

int sr__heap_arena_create(void *area, uint64_t len, unsigned *arena)
{
    struct carver *c = &carver;
    if (c->base)
        return sr__fail(-EBUSY, "sr__heap_attach", "this process already has a heap arena");
    /* Empty the area: the zero invariant holds even if it was used before. */
    if (madvise(area, len, MADV_REMOVE) != 0)
        return sr__fail(-errno, "sr__heap_attach", "madvise(MADV_REMOVE) of the %llu-byte heap area: %s",
                        (unsigned long long)len, strerror(errno));
    pthread_mutex_lock(&c->lock);
    c->base = area;
    c->len = len;
    c->huge_live = c->dropped = c->used = 0;
    c->purge_at = len / 4 * 3;
    atomic_store_explicit(&c->pressed, false, memory_order_relaxed); /* relaxed: no hook runs yet */
    c->free[0] = (struct range){0, len}; /* all of it, emptied above */
    c->nfree = 1;
    /* relaxed: no hook runs before the arena exists */
    atomic_store_explicit(&c->keep_pages, false, memory_order_relaxed);
    pthread_mutex_unlock(&c->lock);
    int rc = make_arena(c, arena);
    if (rc) {
        pthread_mutex_lock(&c->lock);
        c->base = NULL;
        pthread_mutex_unlock(&c->lock);
    }
    return rc;
}

void sr__heap_arena_destroy(unsigned arena)
{
    struct carver *c = &carver;
    /* relaxed: the caller guarantees no allocation runs during destroy; the
     * hooks that read it run on this thread, inside mallctl below */
    atomic_store_explicit(&c->keep_pages, true, memory_order_relaxed);
    char name[64];
    snprintf(name, sizeof(name), "arena.%u.destroy", arena);
    int rc = mallctl(name, NULL, NULL, NULL, 0);
    if (rc)
        sr_logf(SR_LOG_WARN, "sr__heap_detach: mallctl(\"%s\"): %s", name, strerror(rc));
    pthread_mutex_lock(&c->lock);
    c->base = NULL;
    c->len = c->huge_live = c->used = 0;
    c->nfree = 0;
    c->ncached = 0; /* their pages stay, like every other page at detach */
    c->cached_bytes = 0;
    atomic_store_explicit(&c->keep_pages, false, memory_order_relaxed); /* relaxed: as above */
    pthread_mutex_unlock(&c->lock);
}

void sr__heap_arena_forget_in_child(void)
{
    struct carver *c = &carver;
    /* fork() copied the lock as the forking thread saw it; only this thread
     * runs in the child */
    pthread_mutex_init(&c->lock, NULL);
    c->base = NULL;
    c->len = c->huge_live = c->used = 0;
    c->nfree = 0;
    c->ncached = 0;
    c->cached_bytes = 0;
}

int sr__heap_arena_purge(unsigned arena)
{
    char name[64];
    snprintf(name, sizeof(name), "arena.%u.purge", arena);
    int rc = mallctl(name, NULL, NULL, NULL, 0);
    return rc ? sr__fail(-rc, "sr__heap_purge", "mallctl(\"%s\"): %s", name, strerror(rc)) : 0;
}

static size_t stat_read(unsigned arena, const char *what)
{
    char name[64];
    size_t v = 0, sz = sizeof(v);
    snprintf(name, sizeof(name), "stats.arenas.%u.%s", arena, what);
    return mallctl(name, &v, &sz, NULL, 0) ? 0 : v;
}

size_t sr__heap_arena_allocated(unsigned arena)
{
    uint64_t epoch = 1;
    size_t sz = sizeof(epoch);
    /* the stats are a snapshot taken at the last epoch bump */
    if (mallctl("epoch", &epoch, &sz, &epoch, sz) != 0)
        return 0;
    return stat_read(arena, "small.allocated") + stat_read(arena, "large.allocated");
}

void sr__heap_extent_stats(struct sr_heap_extent_stats *out)
{
    struct carver *c = &carver;
    pthread_mutex_lock(&c->lock);
    *out = (struct sr_heap_extent_stats){.area = c->len, .dropped = c->dropped, .nfree = c->nfree,
                                         .huge_live = c->huge_live, .cached = c->cached_bytes};
    out->punched = atomic_load_explicit(&c->punched, memory_order_relaxed); /* relaxed: statistics */
    for (unsigned i = 0; i < c->nfree; i++) {
        out->free_bytes += c->free[i].len;
        if (c->free[i].len > out->largest_free)
            out->largest_free = c->free[i].len;
    }
    out->used = c->len - out->free_bytes - c->dropped;
    pthread_mutex_unlock(&c->lock);
}
