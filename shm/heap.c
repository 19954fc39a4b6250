/* SPDX-License-Identifier: MIT */
/* The shared heap, block side. See heap.h; the arena and its extent hooks
 * are in heap_extent.c; docs/HEAP.md has the whole picture.
 *
 * Ordering contract (barrier pairs):
 *   R1  a holder's release in the acq_rel decrement of refcount
 *       pairs with the last holder's acquire in the same decrement -> every
 *       holder's reads and writes of the block happen before it is freed.
 *   F1  a pusher's release CAS of the area's remote-free head (after a
 *       relaxed store of the block's next_free)
 *       pairs with the owner's acquire exchange in sr__heap_drain -> the links
 *       and everything the pusher did before are visible to the owner. A later
 *       push's CAS is a read-modify-write of the same head, so it continues
 *       the release sequence of every earlier push: one acquire of the final
 *       value covers the whole list.
 *   A1, A2  the area table's state word (heap.h, "Areas"): CAS changes in
 *       one order; the release store of FREE after a punch pairs with the
 *       acq_rel CAS of the next attach.
 *   H1-H3  who holds what: the tables of held references, and the foreign
 *       count whose last decrement races the quarantine (section "who holds
 *       what" below).
 *   Offsets travel between workers through the inbox rings, whose P1/C1 pair
 *   (ring.h) publishes the block header written at allocation.
 *
 * The remote-free list is a Treiber stack that is only ever pushed to, and
 * emptied whole with one exchange. A push reads the head, links to it and
 * CASes; if the head changed in between (even to the same offset, after a
 * drain and a new push: ABA) the CAS still installs a correct list, because
 * the pushed block links to whatever the head was at the instant of the
 * successful CAS. The ABA hazard of a Treiber stack is in pop, which reads
 * head->next; nobody pops here. So any number of producers, and even several
 * drainers, are safe.
 *
 * Process-private state (struct heap) is written only by attach and detach,
 * which the caller must not run concurrently with any other heap call of the
 * process (sr__xport_attach/detach run them before/after the progress thread).
 */
#include "heap.h"

#include <errno.h>
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "error.h"
#include "log.h"
#include "heap_extent.h"
#include "tsan.h"

#define BLOCK_MAGIC 0x6b6c4273u /* "sBlk" */
#define BLOCK_FREED 0x65657246u /* "Free": cleared before the arena gets it back */
#define BLOCK_ALIGN 64
#define SPLIT_MIN 4096       /* smallest block whose header may live apart from its data */
#define HUGE_MIN (8u << 20)  /* from here on the data bypasses jemalloc (its oversize threshold) */
#define TC_SMALL_MAX 16384u  /* thread-cached in bins: blocks of up to 16 KiB of data */
#define TC_K (TC_SMALL_MAX / BLOCK_ALIGN + 1) /* requests of 64 * k data bytes, k = 0 .. 256 */
#define TC_BINS 48           /* bins: one per (layout, size class) of those; 1-based, 0 = none */
#define TC_DEPTH 64          /* blocks kept per bin at most */
#define TC_BIN_BYTES 65536u  /* ... and at most this many bytes, but at least TC_DEPTH_MIN blocks */
#define TC_DEPTH_MIN 4
#define TC_LARGE_SLOTS 4     /* larger blocks (below HUGE_MIN) kept per thread */
#define TC_LARGE_BYTES (UINT64_C(4) << 20) /* ... holding at most this much (or area / 64) */

/* Where a block's data lives. */
enum block_layout {
    LAYOUT_INLINE = 0, /* right after the header, in the same allocation */
    LAYOUT_SPLIT = 1,  /* its own jemalloc allocation: the header would cost a size class */
    LAYOUT_HUGE = 2,   /* pages carved straight from the heap area (heap_extent.c) */
};

struct sr_block {
    uint64_t size;            /* data bytes; written once by the allocator */
    int32_t owner;            /* rank of the allocating process, -1 private; written once by the allocator */
    uint32_t magic;           /* written by the allocator, and by the owner when freeing */
    _Atomic uint32_t refcount; /* every holder */
    uint32_t layout;          /* enum block_layout; written once by the allocator */
    _Atomic uint64_t next_free; /* remote-free list link (offset), written by the releasing worker */
    int64_t data_delta;       /* data address minus header address; written once by the allocator */
    uint64_t check;           /* header_check() of the fields above and area; written once by the allocator */
    int32_t area;             /* heap area it lies in (segment.h), -1 private; written once by the allocator */
    char reserved[12];
};
_Static_assert(sizeof(struct sr_block) == 64, "block header is one cache line");

/* The segment's geometry is copied here at attach and never read from the
 * shared header again: a peer that scribbles on the header (a heap stride of
 * 0, a table offset out of the segment) cannot make us divide by zero or
 * index outside the mapping. */
static struct heap {
    sr_segment seg;              /* a copy of the caller's mapping; not owned */
    int rank;
    uint32_t rank_gen;           /* our rank's generation (sr__heap_attach_gen) */
    int area_idx;                /* the heap area we own */
    unsigned arena;
    char *area;                  /* our heap area; NULL: not attached */
    uint64_t area_len;           /* the part of the area blocks may use: heap_stride - SR_HEAP_HELD_BYTES */
    _Atomic uint64_t *free_head; /* our area's remote-free list head (area table) */
    struct held_table *held;     /* our table of references to other areas' blocks (end of our area) */
    uint64_t heap_off, heap_stride, area_off, area_stride; /* copied at attach, validated */
    uint32_t world, nareas;
    uint64_t gen;                /* which attach this is (never 0 while attached): thread caches check it */
    uint8_t tc_bin[TC_K];         /* thread-cache bin of a request of 64 * k data bytes (k rounded up) */
    uint8_t tc_layout[TC_BINS + 1];  /* enum block_layout of the bin's blocks */
    uint32_t tc_bytes[TC_BINS + 1];  /* what jemalloc counts allocated for one of them */
    uint32_t tc_depth[TC_BINS + 1];  /* blocks the bin keeps at most */
    uint64_t tc_large_max;        /* bytes a thread's large slots hold at most */
    uint64_t hdr_cls;             /* what jemalloc counts for a split block's header */
} heap = {.rank = -1, .area_idx = -1};

/* ---- the thread cache ----
 *
 * Blocks freed by their owner process (any of its threads) go into the
 * freeing thread's cache, a private array, and that thread's next
 * allocation of the same shape pops one: no lock, no read-modify-write.
 *   - Bins: blocks of up to 16 KiB of data, one bin per (layout, jemalloc
 *     size class), inline and split alike (a split block is kept whole,
 *     header and data). A request of n bytes maps to its bin through a table
 *     of 64-byte steps made at attach (heap.tc_bin). A bin keeps at most
 *     TC_DEPTH blocks and TC_BIN_BYTES bytes, but TC_DEPTH_MIN at least.
 *   - Large slots: TC_LARGE_SLOTS blocks above 16 KiB and below the huge
 *     threshold, at most TC_LARGE_BYTES (or a 64th of the area) in all,
 *     matched on the same (layout, size class); the oldest goes back to
 *     jemalloc to make room.
 * jemalloc's own tcache cannot serve here: the automatic one hands out
 * whatever the thread cached from any arena (private memory), so every call
 * passes MALLOCX_TCACHE_NONE and takes the arena's bin lock or its extent
 * locks (130 ns to 1 us a pair); an explicit one (tcache.create) costs a
 * slow mallocx path and must be destroyed, on every thread, before the
 * arena.
 *
 * The short path (tc_pop_small, tc_push_own) serves the bins before
 * anything else is looked at. The free checks the header as the long way
 * does (block_fault_at), but an inline block's check word depends on its
 * size alone (owner, area, layout and data offset are the same for all of
 * ours), so each bin keeps the last size's word per thread: a header whose
 * fields equal it passes without hashing, and the pop writes it.
 *
 * A cached block is dead: magic BLOCK_FREED, so its offset fails
 * sr__block_from_off. Its header and data pointers are kept here, not read
 * back from the (shared) header, so a peer scribbling on a cached block
 * cannot steer the next allocation. The thread's cache goes back to jemalloc
 * when the thread exits (a key destructor), when an allocation finds no
 * room or the heap is pressed, and on sr__heap_purge() (the calling
 * thread's). Detach destroys the arena under every cache; a thread whose
 * tc_gen is not heap.gen has no cache (its old one was freed, unread).
 *
 * Counters are per thread (in struct tcache): written by their thread with
 * plain load + store (relaxed atomics, so that readers' loads are not a data
 * race), summed by readers. cached_bytes is what jemalloc counts allocated
 * for the cached blocks, which sr__heap_allocated takes off: a cached block
 * is free for leak checks, and live_blocks counts it freed. */
struct tc_pair {
    sr_block *b;
    void *data; /* split blocks: their data; NULL inline */
};

struct tc_slot { /* a large slot */
    sr_block *b;
    void *data;
    size_t cls;      /* the size class of the data (inline: with the header) */
    uint32_t bytes;  /* what jemalloc counts for the block */
    uint32_t layout;
};

struct tcache {
    _Atomic uint64_t allocs, local_frees, cached_bytes; /* written by the owning thread only */
    struct tcache *next;                                /* tc_all list; under tc_lock */
    unsigned n[TC_BINS + 1];
    /* Per inline bin, the last size whose header this thread checked or
     * made, and its check word: an inline block of ours has the same
     * owner, area, layout and data offset as every other, so the word
     * depends on its size alone. UINT64_MAX: none yet. */
    uint64_t memo_size[TC_BINS + 1], memo_check[TC_BINS + 1];
    /* The shape of the last size above the bins this thread met (large_shape);
     * n = UINT64_MAX: none yet. */
    struct tc_shape {
        uint64_t n, cls, bytes;
        uint32_t layout;
    } shape;
    struct tc_pair slot[TC_BINS + 1][TC_DEPTH];
    struct tc_slot large[TC_LARGE_SLOTS]; /* oldest first */
    unsigned nlarge;
    uint64_t large_bytes;
};
static _Thread_local uint64_t tc_gen;     /* heap.gen when this thread's cache was made; 0: none */
static _Thread_local struct tcache *tc;   /* valid only while tc_gen == heap.gen */

static pthread_mutex_t tc_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic bool counts_lost; /* an allocation or free went uncounted: detach cannot prove none is live */
static struct tcache *tc_all;      /* every thread's cache this attach; under tc_lock */
static uint64_t tc_gen_next = 1;   /* written by attach only */
static pthread_key_t tc_key;
static pthread_once_t tc_key_once = PTHREAD_ONCE_INIT;

/* ThreadSanitizer (tsan.h): jemalloc is not instrumented, so a block one
 * thread frees into the arena and another gets back from it is a hand-off
 * TSan cannot see. Every free releases this, every allocation from the arena
 * acquires it, as a lock around the arena would. */
static char arena_handoff;

#define ARENA_FLAGS (MALLOCX_ARENA(heap.arena) | MALLOCX_TCACHE_NONE | MALLOCX_ALIGN(BLOCK_ALIGN))

/* The write-once fields of a header, each read exactly once (volatile), so
 * that what is checked is what is used even if a peer writes the header in
 * between. */
struct hdr {
    uint64_t size;
    int32_t owner, area;
    uint32_t layout;
    int64_t delta;
    uint64_t check;
};

static const char *block_fault(const sr_block *b, const struct hdr *h);
struct tsan_span;
static inline void free_last(sr_block *b, const struct hdr *h, const sr_segment *s, const struct tsan_span *span);
static void tc_sum(uint64_t *allocs, uint64_t *local_frees, uint64_t *cached);
static int area_of(const void *p);
static bool data_fits(const struct hdr *h, uint64_t off, uint64_t lo, uint64_t hi);

/* relaxed atomics throughout: statistics, read only for reports and tests */
static struct {
    _Atomic uint64_t drained, remote_pushes; /* allocs and local frees: per thread, struct tc_stats */
} counters;

/* relaxed: statistics; nothing is ordered by them */
static void count(_Atomic uint64_t *c, uint64_t n) { atomic_fetch_add_explicit(c, n, memory_order_relaxed); }

void sr__heap_counters_get(sr_heap_counters *out)
{
    uint64_t allocs, local_frees;
    tc_sum(&allocs, &local_frees, NULL);
    *out = (sr_heap_counters){
        .allocs = allocs,
        .local_frees = local_frees,
        .drained = atomic_load_explicit(&counters.drained, memory_order_relaxed),
        .remote_pushes = atomic_load_explicit(&counters.remote_pushes, memory_order_relaxed),
    };
}

/* A hash of the fields written once at allocation: a header a peer scribbled
 * on (a stray write, a bad offset) fails it with near certainty, so no field
 * of it is used to index, free or read. Not a defence against a malicious
 * peer, which can recompute it: peers are one job (docs/HEAP.md, §2). */
static uint64_t header_check(const struct hdr *f)
{
    uint64_t h = f->size * 0x9e3779b97f4a7c15ull;
    /* area shares owner's round: a change of either field alone changes the word */
    h ^= (((uint64_t)(uint32_t)f->owner << 32 | f->layout) ^ (uint64_t)(uint32_t)f->area << 8) +
         0x632be59bd9b4e019ull + (h << 6) + (h >> 2);
    h ^= (uint64_t)f->delta * 0xff51afd7ed558ccdull + (h << 6) + (h >> 2);
    h ^= h >> 33;
    return h * 0xc4ceb9fe1a85ec53ull;
}

static struct hdr hdr_read(const sr_block *b)
{
    const volatile sr_block *v = b;
    return (struct hdr){.size = v->size, .owner = v->owner, .area = v->area, .layout = v->layout,
                        .delta = v->data_delta, .check = v->check};
}

/* What a header says, for an error message: every write-once field as read
 * (h), and the magic and reference count as they are now. */
static const char *hdr_text(const sr_block *b, const struct hdr *h, char *buf, size_t n)
{
    static const char *const layouts[] = {"inline", "split", "huge"};
    uint32_t magic = ((const volatile sr_block *)b)->magic;
    snprintf(buf, n, "size %llu, owner %d, area %d, layout %s (%u), data at %+lld, check %#llx, magic %#x, refcount %u",
             (unsigned long long)h->size, h->owner, h->area, h->layout <= LAYOUT_HUGE ? layouts[h->layout] : "?",
             h->layout, (long long)h->delta, (unsigned long long)h->check, magic,
             /* relaxed: for the message only */
             atomic_load_explicit(&((sr_block *)b)->refcount, memory_order_relaxed));
    return buf;
}

/* Write the header h (its check word made) at b, live with one reference. */
static inline sr_block *header_write(sr_block *b, const struct hdr *h)
{
    b->area = h->area;
    b->data_delta = h->delta;
    b->layout = h->layout;
    b->size = h->size;
    b->owner = h->owner;
    b->check = h->check;
    b->magic = BLOCK_MAGIC;
    /* relaxed (both): published with the header by the ring (P1/C1) or,
     * on the owner's threads, by the arena's hand-off. Atomic stores, not
     * atomic_init: the last holder's decrement of the block that was here
     * before may have been made by a thread whose hand-off came before it
     * (sr__block_unref releases before it decrements). */
    atomic_store_explicit(&b->refcount, 1, memory_order_relaxed);
    atomic_store_explicit(&b->next_free, 0, memory_order_relaxed);
    return b;
}

/* The header of an inline block of ours (LAYOUT_INLINE) of nbytes, all
 * but its check word. */
static inline struct hdr own_inline_hdr(size_t nbytes)
{
    return (struct hdr){.size = nbytes, .owner = heap.rank, .area = heap.area_idx, .layout = LAYOUT_INLINE,
                        .delta = (int64_t)sizeof(sr_block)};
}

/* data == NULL: LAYOUT_INLINE, the data follows the header. owner < 0: a
 * private block (area -1), else ours (heap.rank, heap.area_idx). */
static sr_block *init_header(void *p, void *data, size_t nbytes, int owner, enum block_layout layout)
{
    int area = owner < 0 ? -1 : heap.area_idx;
    struct hdr h = {.size = nbytes, .owner = owner, .area = area, .layout = layout,
                    .delta = data ? (char *)data - (char *)p : (int64_t)sizeof(sr_block)};
    h.check = header_check(&h);
    return header_write(p, &h);
}

/* ---- the thread cache (see struct tcache) ---- */

/* relaxed: only this thread writes its counters; readers sum a snapshot */
static void tc_bump(_Atomic uint64_t *c, int64_t n)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)n, memory_order_relaxed);
}

static void tc_sum(uint64_t *allocs, uint64_t *local_frees, uint64_t *cached)
{
    uint64_t a = 0, f = 0, c = 0;
    pthread_mutex_lock(&tc_lock);
    for (struct tcache *t = tc_all; t; t = t->next) {
        /* relaxed: counters, see tc_bump */
        a += atomic_load_explicit(&t->allocs, memory_order_relaxed);
        f += atomic_load_explicit(&t->local_frees, memory_order_relaxed);
        c += atomic_load_explicit(&t->cached_bytes, memory_order_relaxed);
    }
    pthread_mutex_unlock(&tc_lock);
    *allocs = a, *local_frees = f;
    if (cached)
        *cached = c;
}

/* This thread has a cache for the current attach. */
static inline bool tc_mine(void) { return tc_gen && tc_gen == heap.gen; }

/* A cached block goes back to the arena. */
static void tc_slot_free(sr_block *b, void *data, enum block_layout layout)
{
    sr__tsan_release(&arena_handoff); /* as local_free */
    if (layout == LAYOUT_SPLIT)
        dallocx(data, MALLOCX_TCACHE_NONE);
    dallocx(b, MALLOCX_TCACHE_NONE);
}

/* Give this thread's cached blocks back to the arena (still attached). */
static void tc_flush(void)
{
    if (!tc_mine() || !heap.area)
        return;
    for (unsigned j = 1; j <= TC_BINS; j++)
        while (tc->n[j]) {
            struct tc_pair p = tc->slot[j][--tc->n[j]];
            tc_slot_free(p.b, p.data, (enum block_layout)heap.tc_layout[j]);
        }
    for (unsigned i = 0; i < tc->nlarge; i++)
        tc_slot_free(tc->large[i].b, tc->large[i].data, (enum block_layout)tc->large[i].layout);
    tc->nlarge = 0;
    tc->large_bytes = 0;
    tc_bump(&tc->cached_bytes, -(int64_t)atomic_load_explicit(&tc->cached_bytes, memory_order_relaxed));
}

static void tc_thread_exit(void *unused)
{
    (void)unused;
    tc_flush();
}

static void tc_make_key(void) { (void)pthread_key_create(&tc_key, tc_thread_exit); }

/* This thread's cache for the current attach, made on first use; false if
 * it cannot be allocated (the caller then goes to jemalloc). */
static bool tc_ready(void)
{
    if (tc_mine())
        return true;
    struct tcache *t = calloc(1, sizeof(*t));
    if (!t) {
        /* relaxed: read by detach, after every thread of ours is quiet */
        atomic_store_explicit(&counts_lost, true, memory_order_relaxed);
        return false;
    }
    pthread_once(&tc_key_once, tc_make_key);
    (void)pthread_setspecific(tc_key, t); /* non-NULL: the destructor runs at exit */
    pthread_mutex_lock(&tc_lock);
    t->next = tc_all;
    tc_all = t;
    pthread_mutex_unlock(&tc_lock);
    for (unsigned j = 0; j <= TC_BINS; j++)
        t->memo_size[j] = UINT64_MAX;
    t->shape.n = UINT64_MAX;
    tc = t;
    tc_gen = heap.gen;
    return true;
}

/* After detach: every cache's blocks went with the arena. Other threads'
 * tc pointers dangle, but their tc_gen no longer matches. */
static void tc_forget_all(void)
{
    pthread_mutex_lock(&tc_lock);
    while (tc_all) {
        struct tcache *t = tc_all;
        tc_all = t->next;
        free(t);
    }
    pthread_mutex_unlock(&tc_lock);
    tc = NULL;
    tc_gen = 0;
}

/* In a child forked by an attached process: the parent's caches and
 * counters are not ours (our counts of live blocks start again at attach).
 * fork() copied tc_lock as some parent thread may have held it. */
static void tc_forget_all_in_child(void)
{
    pthread_mutex_init(&tc_lock, NULL);
    tc_forget_all();
}

static enum block_layout layout_for(size_t nbytes, size_t *cls);

/* The bins (at attach): every request of up to TC_SMALL_MAX bytes, in
 * 64-byte steps, gets the layout layout_for gives its step's upper end, and
 * the bin of that (layout, size class). */
static void tc_setup(void)
{
    unsigned nb = 0;
    size_t hdr_cls = nallocx(sizeof(sr_block), ARENA_FLAGS);
    heap.hdr_cls = hdr_cls;
    for (unsigned k = 0; k < TC_K; k++) {
        size_t cls;
        enum block_layout l = layout_for((size_t)k * BLOCK_ALIGN, &cls);
        uint32_t bytes = (uint32_t)(l == LAYOUT_SPLIT ? cls + hdr_cls : cls);
        unsigned j = 1;
        while (j <= nb && !(heap.tc_layout[j] == l && heap.tc_bytes[j] == bytes))
            j++;
        if (j > nb && nb == TC_BINS) {
            heap.tc_bin[k] = 0; /* not cached: never with jemalloc's 5.3 classes */
            continue;
        }
        if (j > nb) {
            nb = j;
            uint32_t depth = TC_BIN_BYTES / bytes;
            heap.tc_layout[j] = (uint8_t)l;
            heap.tc_bytes[j] = bytes;
            heap.tc_depth[j] = depth > TC_DEPTH ? TC_DEPTH : depth < TC_DEPTH_MIN ? TC_DEPTH_MIN : depth;
        }
        heap.tc_bin[k] = (uint8_t)j;
    }
    heap.tc_large_max = heap.area_len / 64 < TC_LARGE_BYTES ? heap.area_len / 64 : TC_LARGE_BYTES;
}

/* The small bin of a request of nbytes (0: none, or not small). */
static inline unsigned tc_bin_of(size_t nbytes)
{
    return nbytes <= TC_SMALL_MAX ? heap.tc_bin[(nbytes + BLOCK_ALIGN - 1) / BLOCK_ALIGN] : 0;
}

static struct tc_slot *tc_large_find(enum block_layout layout, size_t cls)
{
    for (unsigned i = tc->nlarge; i-- > 0;) /* newest first */
        if (tc->large[i].cls == cls && tc->large[i].layout == (uint32_t)layout)
            return &tc->large[i];
    return NULL;
}

static void tc_large_remove(struct tc_slot *s)
{
    tc->large_bytes -= s->bytes;
    tc_bump(&tc->cached_bytes, -(int64_t)s->bytes);
    unsigned i = (unsigned)(s - tc->large);
    memmove(&tc->large[i], &tc->large[i + 1], (tc->nlarge - i - 1) * sizeof(tc->large[0]));
    tc->nlarge--;
}

/* The check word of an inline block of ours of nbytes in bin j of cache t:
 * the bin's memo, made anew when the size changed. */
static inline uint64_t tc_inline_check(struct tcache *t, unsigned j, size_t nbytes)
{
    if (t->memo_size[j] != nbytes) {
        struct hdr h = own_inline_hdr(nbytes);
        t->memo_check[j] = header_check(&h);
        t->memo_size[j] = nbytes;
    }
    return t->memo_check[j];
}

/* Pop a block of bin j (this thread's cache, not empty) for nbytes, its
 * header made anew. */
static inline sr_block *tc_pop_bin(size_t nbytes, unsigned j)
{
    struct tcache *t = tc;
    struct tc_pair p = t->slot[j][--t->n[j]];
    tc_bump(&t->cached_bytes, -(int64_t)heap.tc_bytes[j]);
    tc_bump(&t->allocs, 1);
    if (heap.tc_layout[j] != LAYOUT_INLINE)
        return init_header(p.b, p.data, nbytes, heap.rank, (enum block_layout)heap.tc_layout[j]);
    struct hdr h = own_inline_hdr(nbytes);
    h.check = tc_inline_check(t, j, nbytes);
    return header_write(p.b, &h);
}

/* The fast path of sr__block_alloc (attached, nbytes <= TC_SMALL_MAX): a
 * block of this thread's bin, or NULL (shared_alloc then drains first,
 * and goes to jemalloc). */
static inline sr_block *tc_pop_small(size_t nbytes)
{
    /* relaxed: a hint, as in shared_alloc */
    if (atomic_load_explicit(heap.free_head, memory_order_relaxed) || !tc_mine())
        return NULL;
    unsigned j = heap.tc_bin[(nbytes + BLOCK_ALIGN - 1) / BLOCK_ALIGN];
    return j && tc->n[j] ? tc_pop_bin(nbytes, j) : NULL;
}

/* A cached block of the shape of nbytes (its bin j, or for larger blocks
 * its layout and size class), its header made anew; NULL if the thread has
 * none. */
static sr_block *tc_pop(size_t nbytes, unsigned j, enum block_layout layout, size_t cls)
{
    if (!tc_mine() || layout == LAYOUT_HUGE)
        return NULL;
    if (j)
        return tc->n[j] ? tc_pop_bin(nbytes, j) : NULL;
    struct tc_slot *f = tc_large_find(layout, cls);
    if (!f)
        return NULL;
    struct tc_pair p = {f->b, f->data};
    tc_large_remove(f);
    tc_bump(&tc->allocs, 1);
    return init_header(p.b, p.data, nbytes, heap.rank, layout);
}

/* The layout of a block of nbytes (above TC_SMALL_MAX), the size class of
 * its data (inline: with the header) in *cls and what jemalloc counts for
 * it in *bytes: layout_for, kept for the last size this thread met (two
 * nallocx calls cost a few hundred instructions). */
static enum block_layout large_shape(size_t nbytes, size_t *cls, uint64_t *bytes)
{
    bool mine = tc_mine();
    if (mine && tc->shape.n == nbytes) {
        *cls = tc->shape.cls, *bytes = tc->shape.bytes;
        return (enum block_layout)tc->shape.layout;
    }
    enum block_layout l = layout_for(nbytes, cls);
    *bytes = l == LAYOUT_SPLIT ? *cls + heap.hdr_cls : *cls;
    if (mine)
        tc->shape = (struct tc_shape){.n = nbytes, .cls = *cls, .bytes = *bytes, .layout = l};
    return l;
}

/* Keep a large block (above TC_SMALL_MAX) in this thread's slots, the
 * oldest going back to the arena to make room; false if it is too big. */
static bool tc_push_large(sr_block *b, const struct hdr *h, void *data)
{
    size_t cls;
    uint64_t bytes;
    if (!tc_ready() || large_shape(h->size, &cls, &bytes) != (enum block_layout)h->layout ||
        bytes > heap.tc_large_max)
        return false;
    while (tc->nlarge == TC_LARGE_SLOTS || tc->large_bytes + bytes > heap.tc_large_max) {
        struct tc_slot old = tc->large[0];
        tc_large_remove(&tc->large[0]);
        tc_slot_free(old.b, old.data, (enum block_layout)old.layout);
    }
    tc->large[tc->nlarge++] = (struct tc_slot){.b = b, .data = data, .cls = cls, .bytes = (uint32_t)bytes,
                                               .layout = h->layout};
    tc->large_bytes += bytes;
    tc_bump(&tc->cached_bytes, (int64_t)bytes);
    return true;
}

/* Keep our (checked, dead) block b in this thread's cache; false if it
 * does not belong there. */
__attribute__((always_inline)) static inline bool tc_push(sr_block *b, const struct hdr *h)
{
    if (h->layout == LAYOUT_HUGE)
        return false;
    void *data = h->layout == LAYOUT_SPLIT ? (char *)b + h->delta : NULL;
    unsigned j = tc_bin_of(h->size);
    if (j) {
        if (heap.tc_layout[j] != h->layout || !tc_ready() || tc->n[j] >= heap.tc_depth[j])
            return false;
        tc->slot[j][tc->n[j]++] = (struct tc_pair){b, data};
        tc_bump(&tc->cached_bytes, (int64_t)heap.tc_bytes[j]);
    } else if (h->size <= TC_SMALL_MAX || !tc_push_large(b, h, data)) {
        return false;
    }
    b->magic = BLOCK_FREED; /* a stale offset now fails sr__block_from_off */
    tc_bump(&tc->local_frees, 1);
    return true;
}

/* An inline block inside our area's block part has room for TC_SMALL_MAX
 * bytes of data before the area ends (the held table comes after it). */
_Static_assert(SR_HEAP_HELD_BYTES >= sizeof(struct sr_block) + TC_SMALL_MAX, "inline bin blocks fit by position");

/* The header of our block b (bin j; owner and area ours, the other fields
 * as read) without the memo: its check word and data_fits; an inline
 * one's word becomes the bin's memo. Fields in registers, not a struct:
 * one built on the stack was read back wider than it was written, which
 * stalled the store-to-load forwarding (4 KiB alloc+free 20% slower). */
static __attribute__((noinline)) bool tc_own_header_ok(const sr_block *b, unsigned j, uint64_t size, uint32_t layout,
                                                       int64_t delta, uint64_t check)
{
    struct hdr h = {.size = size, .owner = heap.rank, .area = heap.area_idx, .layout = layout, .delta = delta,
                    .check = check};
    uint64_t lo = sr__seg_off(&heap.seg, heap.area);
    if (h.check != header_check(&h) || !data_fits(&h, sr__seg_off(&heap.seg, b), lo, lo + heap.heap_stride))
        return false;
    if (h.layout == LAYOUT_INLINE)
        tc->memo_size[j] = h.size, tc->memo_check[j] = h.check;
    return true;
}

/* Our block b (in our area: ours(b)), its last reference gone, into this
 * thread's bin: the fast path of sr__block_unref. Its header is checked as
 * block_fault_at does: for an inline block whose size is the bin's memo,
 * by comparing its fields with the memo's (the word was made from the same
 * values); else by its check word and data_fits. False: not done (no bin,
 * a full one, no cache yet, or a header to look at closer); the caller
 * takes the long way, which says what is wrong. */
static inline bool tc_push_own(sr_block *b)
{
    struct hdr h = hdr_read(b);
    if (h.size > TC_SMALL_MAX || !tc_mine())
        return false;
    struct tcache *t = tc;
    unsigned j = heap.tc_bin[(h.size + BLOCK_ALIGN - 1) / BLOCK_ALIGN], n = t->n[j];
    if (!j || heap.tc_layout[j] != h.layout || n >= heap.tc_depth[j] || h.owner != heap.rank ||
        h.area != heap.area_idx)
        return false;
    bool inl = h.layout == LAYOUT_INLINE;
    if (!(inl && h.size == t->memo_size[j] && h.check == t->memo_check[j] && h.delta == (int64_t)sizeof(sr_block)) &&
        !tc_own_header_ok(b, j, h.size, h.layout, h.delta, h.check))
        return false;
    t->slot[j][n] = (struct tc_pair){b, inl ? NULL : (char *)b + h.delta};
    t->n[j] = n + 1;
    tc_bump(&t->cached_bytes, (int64_t)heap.tc_bytes[j]);
    b->magic = BLOCK_FREED; /* a stale offset now fails sr__block_from_off */
    tc_bump(&t->local_frees, 1);
    return true;
}

/* ---- who holds what (docs/HEAP.md, §11) ----
 *
 * Per heap area, `foreign` (area table) counts the references to its blocks
 * held by processes other than its owner, and those inside messages. It
 * changes only where a reference crosses the owner's boundary:
 *   a non-owner's ref +1, its unref -1;
 *   the owner's sr__block_send_off +1, its sr__block_recv_off -1;
 *   a non-owner's send and receive move a reference it counts already: 0.
 * So once the owner is dead, foreign == 0 means that no living process and
 * no message holds a block of the area (the dead's own references do not
 * matter), and the area is reclaimed.
 *
 * Each process also lists, in a table at the end of its own area that only
 * it writes, the references it holds to other areas' blocks (non-owner
 * refs and receives +1, unrefs and sends -1). Whoever quarantines a dead
 * area walks the dead's table and drops what it lists: survivors' blocks the
 * dead held are freed to their owners, and earlier dead areas may reach
 * foreign == 0.
 *
 * Order of the steps, so that a process killed between two of them only
 * leaks (a count too high), never frees a block still held (too low):
 *   ref:    foreign +1, refcount +1, table +1
 *   unref:  table -1, refcount -1 (free or push if last), foreign -1
 *   send:   owner: foreign +1 | non-owner: table -1; then the offset is published
 *   recv:   owner: foreign -1 | non-owner: table +1; after the message was taken
 * A death after a table -1 and before the reference left loses that
 * reference (its block leaks, and its area's foreign count stays above 0);
 * a table +1 that did not happen yet leaves the reference out of the walk
 * (the same leak). Never the other way round.
 *
 * Ordering:
 *   H1  the table's words are changed by its owner's threads only (CAS,
 *       relaxed: one word per entry, so a reader sees each entry whole), and
 *       read by the quarantiner after the owner is dead and reaped (the
 *       reaper's waitid orders the dead's writes before it).
 *   H2  the decrement of foreign that reaches 0 and the quarantiner's store
 *       of QUARANTINED are seq_cst, and so are the loads each makes next (the
 *       state, resp. foreign): in the single total order one of the two sees
 *       the other, so the area is reclaimed by at least one of them, and the
 *       CAS QUARANTINED -> RECLAIMING (A1) lets exactly one do it. An
 *       increment of foreign is relaxed: it is made by a process that holds
 *       a counted reference already (foreign > 0) or by the living owner
 *       (the area is OWNED), so it cannot race a reclaim.
 *   H3  everything a dropper did to the area (a push onto its list) comes
 *       before its decrement of foreign (seq_cst is a release), and the
 *       reclaimer's CAS of the state after seeing 0 follows every decrement
 *       (they are read-modify-writes of one word): the reclaim's list reset
 *       and punch come after every push. */

#define HELD_COUNT_BITS 24
#define HELD_COUNT_MAX ((UINT64_C(1) << HELD_COUNT_BITS) - 1)
#define HELD_KEY_MAX (UINT64_C(1) << (64 - HELD_COUNT_BITS)) /* offsets >> 6 below this: 64 TiB */
#define HELD_MASK (SR_HEAP_HELD_SLOTS - 1)
_Static_assert((SR_HEAP_HELD_SLOTS & HELD_MASK) == 0, "the table's size is a power of two");

/* An open-addressing table of one-word entries: (offset >> 6) << 24 | count.
 * 0 is an empty slot (no block lies at offset 0); an entry whose count fell
 * to 0 stays as a tombstone that any key may take again, so a probe chain
 * never breaks. One key may have several entries: the sum counts. */
struct held_table {
    _Atomic uint64_t lost SR_ALIGNED_LINE; /* references not listed: the table was full */
    char pad[4096 - SR_CACHELINE];
    _Atomic uint64_t slot[SR_HEAP_HELD_SLOTS];
};
_Static_assert(sizeof(struct held_table) == SR_HEAP_HELD_BYTES, "the table fills the area's tail");

static uint64_t held_key(uint64_t w) { return w >> HELD_COUNT_BITS; }
static uint64_t held_count(uint64_t w) { return w & HELD_COUNT_MAX; }

static uint32_t held_hash(uint64_t key)
{
    return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 40) & HELD_MASK;
}

static struct held_table *held_of(const sr_segment *s, int a)
{
    return (struct held_table *)((char *)sr__seg_heap(s, a) + s->heap_stride - SR_HEAP_HELD_BYTES);
}

/* relaxed (lost, here and below): H1, read only once the owner is dead */
static void held_lose(struct held_table *t, uint64_t n) { atomic_fetch_add_explicit(&t->lost, n, memory_order_relaxed); }

/* +1 for the block at off: the first entry of its key with room, or the
 * first empty slot or tombstone on its probe chain. */
static void held_add(struct held_table *t, uint64_t off)
{
    uint64_t key = off >> 6;
    if (key >= HELD_KEY_MAX)
        return held_lose(t, 1);
    uint32_t i = held_hash(key);
    for (uint32_t probe = 0; probe < SR_HEAP_HELD_SLOTS; probe++, i = (i + 1) & HELD_MASK) {
        /* relaxed: H1 */
        uint64_t w = atomic_load_explicit(&t->slot[i], memory_order_relaxed);
        for (;;) {
            bool mine = w && held_key(w) == key && held_count(w) < HELD_COUNT_MAX;
            if (!mine && w && held_count(w))
                break; /* another key's live entry, or ours full: probe on */
            uint64_t nw = mine ? w + 1 : key << HELD_COUNT_BITS | 1;
            /* relaxed: H1; a failure reloads w and looks at this slot again */
            if (atomic_compare_exchange_weak_explicit(&t->slot[i], &w, nw, memory_order_relaxed, memory_order_relaxed))
                return;
        }
    }
    held_lose(t, 1);
}

/* One pass for -1 on the block at off: true if an entry of its key had
 * one. The chain from its hash to the first empty slot holds every entry
 * of the key (slots never become empty again). */
static bool held_del_pass(struct held_table *t, uint64_t key)
{
    uint32_t i = held_hash(key);
    for (uint32_t probe = 0; probe < SR_HEAP_HELD_SLOTS; probe++, i = (i + 1) & HELD_MASK) {
        uint64_t w = atomic_load_explicit(&t->slot[i], memory_order_relaxed); /* relaxed: H1 */
        if (!w)
            return false;
        while (held_key(w) == key && held_count(w))
            /* relaxed: H1 */
            if (atomic_compare_exchange_weak_explicit(&t->slot[i], &w, w - 1, memory_order_relaxed,
                                                      memory_order_relaxed))
                return true;
    }
    return false;
}

/* -1 for the block at off. A second pass covers an entry another thread of
 * ours made behind us meanwhile; a reference never listed (the table was
 * full) comes off the lost count. Not found at all: the reference was never
 * listed, and nothing would have dropped it at our death (a leak, not more). */
static void held_del(struct held_table *t, uint64_t off)
{
    uint64_t key = off >> 6;
    if (key < HELD_KEY_MAX && (held_del_pass(t, key) || held_del_pass(t, key)))
        return;
    uint64_t n = atomic_load_explicit(&t->lost, memory_order_relaxed); /* relaxed: H1 */
    while (n && !atomic_compare_exchange_weak_explicit(&t->lost, &n, n - 1, memory_order_relaxed, memory_order_relaxed))
        ;
}

static uint64_t held_sum(const struct held_table *t)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < SR_HEAP_HELD_SLOTS; i++)
        /* relaxed: a snapshot for reports and tests */
        n += held_count(atomic_load_explicit(&((struct held_table *)t)->slot[i], memory_order_relaxed));
    return n;
}

static _Atomic uint64_t *foreign_of(const sr_segment *s, int a) { return &sr__seg_area(s, a)->foreign; }

/* relaxed: H2, the caller holds a counted reference or owns the area */
static void foreign_get(const sr_segment *s, int a, uint64_t n)
{
    atomic_fetch_add_explicit(foreign_of(s, a), n, memory_order_relaxed);
}

static int area_empty(const sr_segment *seg, int a, const char *fn);

/* QUARANTINED -> RECLAIMING -> FREE, by whoever wins the CAS (A1). */
static void try_reclaim(const sr_segment *s, int a)
{
    _Atomic uint64_t *state = &sr__seg_area(s, a)->state;
    /* seq_cst: H2, after the decrement (or the store of QUARANTINED) */
    uint64_t w = atomic_load_explicit(state, memory_order_seq_cst);
    if (sr__area_word_state(w) != SR_AREA_QUARANTINED)
        return; /* its owner lives, or its dead's table is being walked (that walker checks), or done */
    /* acq_rel: A1; exactly one process reclaims */
    if (atomic_compare_exchange_strong_explicit(state, &w, sr__area_word(SR_AREA_RECLAIMING, 0, 0),
                                                memory_order_acq_rel, memory_order_relaxed))
        (void)area_empty(s, a, "sr__heap_area_quarantine");
}

static _Atomic bool foreign_wrong; /* said once per process */

/* n counted references to area a's blocks are gone. seq_cst: H2, H3. */
static void foreign_put(const sr_segment *s, int a, uint64_t n)
{
    uint64_t old = atomic_fetch_sub_explicit(foreign_of(s, a), n, memory_order_seq_cst);
    if (old == n)
        try_reclaim(s, a);
    else if (old < n && !atomic_exchange_explicit(&foreign_wrong, true, memory_order_relaxed)) /* relaxed: once */
        sr_logf(SR_LOG_ERROR, "heap area %d: %llu references to its blocks released, %llu counted (a reference "
                "put into a message without sr__block_send_off?); the area will not be reclaimed", a,
                (unsigned long long)n, (unsigned long long)old);
}

/* Areas this process owned before (detached with blocks live, then
 * attached again): its references to their blocks are an owner's, never
 * counted, as long as the area is still the one it left (the state word). */
#define FORMER_MAX 8
static struct {
    int area;
    uint64_t word;
} former[FORMER_MAX];
static unsigned nformer;

static bool was_ours(int a)
{
    for (unsigned i = 0; i < nformer; i++)
        /* acquire: A1, as sr__heap_area_get */
        if (former[i].area == a && atomic_load_explicit(&sr__seg_area(&heap.seg, a)->state, memory_order_acquire) ==
                                       former[i].word)
            return true;
    return false;
}

/* Is a reference of ours to a block of area a counted (we do not own a)? */
static bool counted(int a) { return a >= 0 && a != heap.area_idx && !was_ours(a); }

static void drop_what_it_held(const sr_segment *s, int a);

/* ---- attach / detach ---- */

/* A child forked by an attached worker shares the segment but has its own
 * copy of the arena: allocating from it would hand out the parent's pages
 * twice. The child forgets the heap (sr__block_alloc gives private blocks). */
static void forget_in_child(void)
{
    heap = (struct heap){.rank = -1, .area_idx = -1};
    nformer = 0; /* the parent's */
    sr__heap_arena_forget_in_child();
    tc_forget_all_in_child();
}
static void register_atfork(void) { (void)pthread_atfork(NULL, NULL, forget_in_child); }
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* The segment's geometry (its private copy, validated when the segment
 * was created or attached; the header is never read again) lies in the
 * mapping: the worker table, the heap areas and the area table. */
static bool geometry_fits(const sr_segment *seg)
{
    uint64_t n = seg->world, a = seg->heap_areas, size = seg->size;
    return seg->table_stride >= sizeof(struct sr_worker_info) && seg->table_off <= size &&
           n <= (size - seg->table_off) / seg->table_stride && seg->heap_off <= size && a >= n &&
           a <= (size - seg->heap_off) / seg->heap_stride && seg->area_stride >= sizeof(struct sr_heap_area_info) &&
           seg->area_stride % SR_CACHELINE == 0 && seg->area_off <= size && a <= (size - seg->area_off) / seg->area_stride;
}

static int check_segment(const sr_segment *seg, int rank, uint32_t gen, const char *fn)
{
    if (!seg || !seg->base || rank < 0 || (uint32_t)rank >= seg->world)
        return sr__fail(-EINVAL, fn, "rank %d is out of range [0, %u)", rank, seg && seg->base ? seg->world : 0);
    if (gen == 0)
        return sr__fail(-EINVAL, fn, "rank %d: generation 0 (generations start at 1)", rank);
    if (seg->heap_stride < SR_HEAP_MIN)
        return sr__fail(-EINVAL, fn, "heap areas of %llu bytes are below the %u-byte minimum",
                        (unsigned long long)seg->heap_stride, SR_HEAP_MIN);
    if (!geometry_fits(seg))
        return sr__fail(-EPROTO, fn, "segment '%s': the header's worker table or heap areas run past its %zu bytes",
                        seg->name, seg->size);
    return 0;
}

/* Take FREE area a for (rank, gen): acq_rel CAS, pairs with the release
 * store of FREE by a reclaimer or a detaching owner (A2), so that their
 * punch and list reset come before our first use; and with any later CAS
 * of the word (quarantine). */
static bool area_take(const sr_segment *seg, uint32_t a, int rank, uint32_t gen)
{
    uint64_t want = sr__area_word(SR_AREA_FREE, 0, 0);
    return atomic_compare_exchange_strong_explicit(&sr__seg_area(seg, (int)a)->state, &want,
                                                   sr__area_word(SR_AREA_OWNED, (uint32_t)rank, gen),
                                                   memory_order_acq_rel, memory_order_relaxed);
}

/* The area rank's generation gen takes: area rank if FREE (a normal job's
 * first attach), else the first FREE spare. -ENOSPC naming what holds them. */
static int area_pick(const sr_segment *seg, int rank, uint32_t gen)
{
    uint32_t n = seg->heap_areas, world = seg->world;
    if (area_take(seg, (uint32_t)rank, rank, gen))
        return rank;
    for (uint32_t a = world; a < n; a++)
        if (area_take(seg, a, rank, gen))
            return (int)a;
    uint32_t quarantined = 0, reclaiming = 0;
    for (uint32_t a = 0; a < n; a++) {
        /* relaxed: for the message only */
        uint32_t st = sr__area_word_state(atomic_load_explicit(&sr__seg_area(seg, (int)a)->state, memory_order_relaxed));
        quarantined += st == SR_AREA_QUARANTINED;
        reclaiming += st == SR_AREA_RECLAIMING;
    }
    return sr__fail(-ENOSPC, "sr__heap_attach", "rank %d generation %u: no free heap area in segment '%s' "
                    "(%u areas: %u for the ranks, %u spares; %u quarantined, %u being reclaimed): the survivors "
                    "still hold blocks of that many dead processes' areas. An area comes back by itself once "
                    "nobody holds its blocks: drop the dead generations' tensors and RRefs when their death is "
                    "handled; or make the segment with more spares (sr_segment_opts.heap_spares; sr_spawn and "
                    "shmrun give a replace job min(max_restarts, %u))",
                    rank, gen, seg->name, n, world, n - world, quarantined, reclaiming, SR_HEAP_SPARES_DEFAULT_MAX);
}

/* Give a taken area back (attach failed after the CAS): it was FREE. */
static void area_untake(const sr_segment *seg, int a)
{
    /* release: A2, nothing was written to the area */
    atomic_store_explicit(&sr__seg_area(seg, a)->state, sr__area_word(SR_AREA_FREE, 0, 0), memory_order_release);
}

int sr__heap_attach_gen(const sr_segment *seg, int rank, uint32_t gen)
{
    if (heap.area && seg && seg->base == heap.seg.base && rank == heap.rank && gen == heap.rank_gen)
        return 0;
    if (heap.area)
        return sr__fail(-EBUSY, "sr__heap_attach", "already attached as rank %d (generation %u) of segment '%s'; "
                        "detach first", heap.rank, heap.rank_gen, heap.seg.name);
    int rc = check_segment(seg, rank, gen, "sr__heap_attach");
    if (rc)
        return rc;
    pthread_once(&atfork_once, register_atfork);
    int a = area_pick(seg, rank, gen);
    if (a < 0)
        return a;
    _Atomic uint64_t *head = &sr__seg_area(seg, a)->remote_free;
    /* relaxed: the area was FREE, so no block of it is live and nobody pushes;
     * a list left by an earlier owner names blocks of a destroyed arena */
    atomic_store_explicit(head, 0, memory_order_relaxed);
    /* relaxed: nobody holds a block of a FREE area (a count a crash left is
     * not ours); published with the area by our first message */
    atomic_store_explicit(foreign_of(seg, a), 0, memory_order_relaxed);
    unsigned arena;
    char *area = sr__seg_heap(seg, a);
    uint64_t len = seg->heap_stride - SR_HEAP_HELD_BYTES; /* the table of what we hold takes the tail */
    if (madvise(area + len, SR_HEAP_HELD_BYTES, MADV_REMOVE) != 0) {
        rc = sr__fail(-errno, "sr__heap_attach", "madvise(MADV_REMOVE) of heap area %d's table: %s", a, strerror(errno));
        area_untake(seg, a);
        return rc;
    }
    rc = sr__heap_arena_create(area, len, &arena); /* empties it: it is FREE, nobody reads it */
    if (rc) {
        area_untake(seg, a);
        return rc;
    }
    heap = (struct heap){.seg = *seg, .rank = rank, .rank_gen = gen, .area_idx = a, .arena = arena, .area = area,
                         .area_len = len, .held = (struct held_table *)(area + len), .free_head = head,
                         .heap_off = seg->heap_off,
                         .heap_stride = seg->heap_stride, .area_off = seg->area_off, .area_stride = seg->area_stride,
                         .world = seg->world, .nareas = seg->heap_areas, .gen = tc_gen_next++};
    tc_setup();
    /* relaxed: statistics; no other heap call runs during attach */
    atomic_store_explicit(&counters.drained, 0, memory_order_relaxed);
    atomic_store_explicit(&counters.remote_pushes, 0, memory_order_relaxed);
    atomic_store_explicit(&counts_lost, false, memory_order_relaxed);
    return 0;
}

int sr__heap_attach(const sr_segment *seg, int rank) { return sr__heap_attach_gen(seg, rank, 1); }

/* Our blocks still live: allocated and neither freed by us nor drained
 * (blocks in thread caches count as freed). Exact once the drain that
 * precedes it has run and no thread of ours allocates. */
static uint64_t live_blocks(void)
{
    uint64_t allocs, local_frees;
    tc_sum(&allocs, &local_frees, NULL);
    /* relaxed (both): written by this process's threads, all quiet now */
    if (atomic_load_explicit(&counts_lost, memory_order_relaxed))
        return UINT64_MAX;
    return allocs - local_frees - atomic_load_explicit(&counters.drained, memory_order_relaxed);
}

/* Empty area a (every page punched: it reads as zero again) and make it
 * FREE (A2: the release store pairs with the acq_rel CAS of area_take). */
static int area_empty(const sr_segment *seg, int a, const char *fn)
{
    int rc = 0;
    if (madvise(sr__seg_heap(seg, a), seg->heap_stride, MADV_REMOVE) != 0)
        rc = sr__fail(-errno, fn, "heap area %d: madvise(MADV_REMOVE) of %llu bytes: %s", a,
                      (unsigned long long)seg->heap_stride, strerror(errno));
    /* relaxed: published by the release store below */
    atomic_store_explicit(&sr__seg_area(seg, a)->remote_free, 0, memory_order_relaxed);
    /* release: A2, pairs with the acq_rel CAS of the next attach (area_take) */
    atomic_store_explicit(&sr__seg_area(seg, a)->state, sr__area_word(SR_AREA_FREE, 0, 0), memory_order_release);
    return rc;
}

void sr__heap_detach(void)
{
    if (!heap.area)
        return;
    sr__heap_drain();
    uint64_t live = live_blocks();
    sr__heap_arena_destroy(heap.arena); /* with every block the thread caches hold */
    sr_segment seg = heap.seg;
    int a = heap.area_idx;
    uint64_t owned = sr__area_word(SR_AREA_OWNED, (uint32_t)heap.rank, heap.rank_gen);
    heap = (struct heap){.rank = -1, .area_idx = -1};
    tc_forget_all();
    if (live == 0) {
        /* Nobody holds a block of ours, nor can get one: the area is free. A
         * quarantine that came first (a supervisor that saw us as dead) wins. */
        uint64_t w = owned;
        /* acq_rel: as area_take; RECLAIMING keeps attachers off while we punch */
        if (atomic_compare_exchange_strong_explicit(&sr__seg_area(&seg, a)->state, &w,
                                                    sr__area_word(SR_AREA_RECLAIMING, 0, 0),
                                                    memory_order_acq_rel, memory_order_relaxed))
            (void)area_empty(&seg, a, "sr__heap_detach");
        return;
    }
    /* Blocks of ours are still held: they stay valid, the area quarantined.
     * Our own references to them stay an owner's, uncounted (was_ours). */
    uint64_t w = owned, q = sr__area_word(SR_AREA_QUARANTINED, (uint32_t)sr__area_word_rank(owned),
                                          sr__area_word_gen(owned));
    /* acq_rel: as area_take */
    if (atomic_compare_exchange_strong_explicit(&sr__seg_area(&seg, a)->state, &w, q, memory_order_acq_rel,
                                                memory_order_relaxed) && nformer < FORMER_MAX)
        former[nformer++] = (__typeof__(former[0])){a, q};
}

/* ---- the area table (whoever handles a death) ---- */

static int check_area(const sr_segment *seg, int a, const char *fn)
{
    if (!seg || !seg->base || a < 0 || (uint32_t)a >= seg->heap_areas)
        return sr__fail(-EINVAL, fn, "heap area %d is out of range [0, %u)", a, seg && seg->base ? seg->heap_areas : 0);
    return 0;
}

int sr__heap_area_get(const sr_segment *seg, int a, sr_heap_area *out)
{
    int rc = check_area(seg, a, "sr__heap_area_get");
    if (rc)
        return rc;
    /* acquire: pairs with the CAS and stores of the word (A1, A2) */
    uint64_t w = atomic_load_explicit(&sr__seg_area(seg, a)->state, memory_order_acquire);
    *out = (sr_heap_area){.state = sr__area_word_state(w), .rank = (int)sr__area_word_rank(w),
                          .gen = sr__area_word_gen(w),
                          /* relaxed (both): a snapshot for reports and tests */
                          .remote_free = atomic_load_explicit(&sr__seg_area(seg, a)->remote_free, memory_order_relaxed),
                          .foreign = atomic_load_explicit(foreign_of(seg, a), memory_order_relaxed)};
    return 0;
}

int sr__heap_area_held(const sr_segment *seg, int a, uint64_t *held, uint64_t *lost)
{
    int rc = check_area(seg, a, "sr__heap_area_held");
    if (rc)
        return rc;
    struct held_table *t = held_of(seg, a);
    *held = held_sum(t);
    *lost = atomic_load_explicit(&t->lost, memory_order_relaxed); /* relaxed: a snapshot */
    return 0;
}

int sr__heap_area_find(const sr_segment *seg, int rank, uint32_t gen)
{
    for (uint32_t a = 0; seg && seg->base && a < seg->heap_areas; a++) {
        /* relaxed: the caller (who handles rank's death) orders it by reaping the process */
        uint64_t w = atomic_load_explicit(&sr__seg_area(seg, (int)a)->state, memory_order_relaxed);
        if (sr__area_word_state(w) == SR_AREA_OWNED && sr__area_word_rank(w) == (uint32_t)rank &&
            sr__area_word_gen(w) == gen)
            return (int)a;
    }
    return sr__fail(-ENOENT, "sr__heap_area_find", "rank %d generation %u owns no heap area", rank, gen);
}

int sr__heap_area_quarantine(const sr_segment *seg, int a)
{
    int rc = check_area(seg, a, "sr__heap_area_quarantine");
    if (rc)
        return rc;
    if (heap.area && seg->base == heap.seg.base && a == heap.area_idx)
        return sr__fail(-EBUSY, "sr__heap_area_quarantine", "heap area %d is this process's own", a);
    _Atomic uint64_t *state = &sr__seg_area(seg, a)->state;
    /* relaxed: the CAS below checks it */
    uint64_t w = atomic_load_explicit(state, memory_order_relaxed);
    while (sr__area_word_state(w) == SR_AREA_OWNED) {
        uint32_t rank = sr__area_word_rank(w), gen = sr__area_word_gen(w);
        /* acq_rel: A1, one order with the owner's detach and the attachers;
         * QUARANTINING: exactly one process walks the dead's table, and no
         * reclaim (which would punch the table) starts before it is done */
        if (atomic_compare_exchange_weak_explicit(state, &w, sr__area_word(SR_AREA_QUARANTINING, rank, gen),
                                                  memory_order_acq_rel, memory_order_relaxed)) {
            drop_what_it_held(seg, a);
            /* seq_cst (the store and the load): H2, against the last decrement of foreign */
            atomic_store_explicit(state, sr__area_word(SR_AREA_QUARANTINED, rank, gen), memory_order_seq_cst);
            if (atomic_load_explicit(foreign_of(seg, a), memory_order_seq_cst) == 0)
                try_reclaim(seg, a);
            return 0;
        }
    }
    return 0; /* FREE (its owner left cleanly), QUARANTINED, QUARANTINING or RECLAIMING already */
}

int sr__heap_area_reclaim(const sr_segment *seg, int a)
{
    int rc = check_area(seg, a, "sr__heap_area_reclaim");
    if (rc)
        return rc;
    if (heap.area && seg->base == heap.seg.base && a == heap.area_idx)
        return sr__fail(-EBUSY, "sr__heap_area_reclaim", "heap area %d is this process's own", a);
    _Atomic uint64_t *state = &sr__seg_area(seg, a)->state;
    /* relaxed: the CAS below checks it */
    uint64_t w = atomic_load_explicit(state, memory_order_relaxed);
    do {
        if (sr__area_word_state(w) != SR_AREA_QUARANTINED)
            return sr__fail(-EBUSY, "sr__heap_area_reclaim", "heap area %d is not quarantined (state %u, rank %u "
                            "generation %u)", a, sr__area_word_state(w), sr__area_word_rank(w), sr__area_word_gen(w));
        /* acq_rel: A1; RECLAIMING keeps attachers and other reclaimers off */
    } while (!atomic_compare_exchange_weak_explicit(state, &w, sr__area_word(SR_AREA_RECLAIMING, 0, 0),
                                                    memory_order_acq_rel, memory_order_relaxed));
    return area_empty(seg, a, "sr__heap_area_reclaim");
}

bool sr__heap_attached(void) { return heap.area != NULL; }

/* ---- blocks ---- */

static sr_block *private_alloc(size_t nbytes)
{
    if (nbytes > SIZE_MAX - 2 * BLOCK_ALIGN) {
        sr__fail(-ENOMEM, "sr__block_alloc", "out of memory allocating %zu bytes", nbytes);
        errno = ENOMEM;
        return NULL;
    }
    void *p = aligned_alloc(BLOCK_ALIGN, sizeof(sr_block) + ((nbytes + 63) & ~(size_t)63));
    if (!p) {
        sr__fail(-ENOMEM, "sr__block_alloc", "out of memory allocating %zu bytes", nbytes);
        errno = ENOMEM;
        return NULL;
    }
    return init_header(p, NULL, nbytes, -1, LAYOUT_INLINE);
}

static sr_block *shared_oom(size_t nbytes)
{
    size_t used = sr__heap_allocated();
    sr__fail(-ENOMEM, "sr__block_alloc",
             "heap of worker %d is exhausted (ENOMEM): asked %zu bytes, the heap is %llu bytes "
             "(%zu allocated); raise --shm-size / sr_spawn_opts.shm_size",
             heap.rank, nbytes, (unsigned long long)heap.heap_stride, used);
    errno = ENOMEM;
    return NULL;
}


/* Huge blocks bypass jemalloc: their pages come from the carve allocator and
 * go back to it (punched) the moment they are freed, so a freed 256 MiB block
 * is contiguous room for the next 1 GiB one; through jemalloc it would sit in
 * the arena's retained set, rounded up to a size class. Below that, the
 * header gets its own allocation when sharing one would push the data into
 * the next size class: a power-of-two tensor would otherwise waste up to a
 * quarter (jemalloc spaces its classes four per doubling). Small blocks stay
 * in one allocation: one mallocx is cheaper than saving a few bytes. */
static enum block_layout layout_for(size_t nbytes, size_t *cls)
{
    if (nbytes >= HUGE_MIN)
        return *cls = 0, LAYOUT_HUGE;
    size_t with = nallocx(sizeof(sr_block) + nbytes, ARENA_FLAGS), alone = nallocx(nbytes, ARENA_FLAGS);
    if (nbytes >= SPLIT_MIN && with > alone)
        return *cls = alone, LAYOUT_SPLIT;
    return *cls = with, LAYOUT_INLINE;
}


static void free_data(enum block_layout layout, void *data, size_t nbytes)
{
    if (layout == LAYOUT_HUGE)
        sr__heap_huge_free(data, nbytes);
    else if (layout == LAYOUT_SPLIT)
        dallocx(data, MALLOCX_TCACHE_NONE);
}

static sr_block *try_alloc(size_t nbytes, enum block_layout layout)
{
    if (layout == LAYOUT_INLINE) {
        void *p = mallocx(sizeof(sr_block) + nbytes, ARENA_FLAGS);
        sr__tsan_acquire(&arena_handoff); /* after the allocation: see arena_handoff */
        return p ? init_header(p, NULL, nbytes, heap.rank, layout) : NULL;
    }
    void *data = layout == LAYOUT_HUGE ? sr__heap_huge_alloc(nbytes) : mallocx(nbytes, ARENA_FLAGS);
    if (!data)
        return NULL;
    void *p = mallocx(sizeof(sr_block), ARENA_FLAGS);
    if (!p) {
        free_data(layout, data, nbytes);
        return NULL;
    }
    sr__tsan_acquire(&arena_handoff);
    return init_header(p, data, nbytes, heap.rank, layout);
}

static __attribute__((noinline)) sr_block *shared_alloc(size_t nbytes)
{
    if (nbytes > heap.area_len - sizeof(sr_block))
        return shared_oom(nbytes);
    /* relaxed: a hint, as in sr__heap_drain (which a push we miss waits for) */
    if (atomic_load_explicit(heap.free_head, memory_order_relaxed))
        sr__heap_drain(); /* peers gave blocks back */
    size_t cls = 0;
    uint64_t bytes;
    unsigned j = tc_bin_of(nbytes); /* small: the bin says the layout */
    enum block_layout layout = j                         ? (enum block_layout)heap.tc_layout[j]
                               : nbytes <= TC_SMALL_MAX ? layout_for(nbytes, &cls)
                                                        : large_shape(nbytes, &cls, &bytes);
    sr_block *b = tc_pop(nbytes, j, layout, cls);
    if (b)
        return b;
    b = try_alloc(nbytes, layout);
    /* Out of room: extents jemalloc still holds dirty go back to the carve
     * allocator when purged, where a huge block (or a new extent) can use them. */
    if (!b && (tc_flush(), sr__heap_huge_flush(), sr__heap_arena_purge(heap.arena) == 0))
        b = try_alloc(nbytes, layout);
    if (!b)
        return shared_oom(nbytes);
    if (tc_ready())
        tc_bump(&tc->allocs, 1);
    if (sr__heap_extent_pressed()) /* the area passed its mark: give the dirty pages back now */
        (void)sr__heap_purge();
    return b;
}

sr_block *sr__block_alloc(size_t nbytes)
{
    if (!heap.area)
        return private_alloc(nbytes);
    sr_block *b = nbytes <= TC_SMALL_MAX ? tc_pop_small(nbytes) : NULL;
    return b ? b : shared_alloc(nbytes);
}

void *sr__block_data(const sr_block *b) { return (char *)b + b->data_delta; }

int sr__block_check(const sr_block *b, void **data, size_t *size)
{
    struct hdr h = hdr_read(b);
    const char *why = block_fault(b, &h);
    if (why) {
        int area = area_of(b);
        return sr__fail(-EPROTO, "sr__block_check", "block header at offset %lld (heap area %d) %s",
                        area < 0 ? -1ll : (long long)sr__seg_off(&heap.seg, b), area, why);
    }
    *data = (char *)b + h.delta;
    *size = h.size;
    return 0;
}
size_t sr__block_size(const sr_block *b) { return b->size; }
int sr__block_owner(const sr_block *b) { return b->owner; }

uint32_t sr__block_refcount(const sr_block *b)
{
    /* acquire: pairs with the release decrement in sr__block_unref (R1), so a
     * caller that sees 1 also sees every other holder's writes finished */
    return atomic_load_explicit(&((sr_block *)b)->refcount, memory_order_acquire);
}

/* Is b in our own area? The one check an owner's ref and unref pay for the
 * counting (heap.c, "Who holds what"). */
static inline bool ours(const sr_block *b)
{
    return (const char *)b >= heap.area && (const char *)b < heap.area + heap.area_len;
}

sr_block *sr__block_ref(sr_block *b)
{
    int a = ours(b) ? heap.area_idx : area_of(b);
    bool other = a != heap.area_idx && counted(a);
    if (other) /* foreign first, the table last: a death in between leaks (heap.c, "Who holds what") */
        foreign_get(&heap.seg, a, 1);
    /* relaxed: the caller already holds a reference, so the block cannot go */
    atomic_fetch_add_explicit(&b->refcount, 1, memory_order_relaxed);
    if (other)
        held_add(heap.held, sr__seg_off(&heap.seg, b));
    return b;
}

/* The owner returns a block to its arena; h is its checked header. */
static void local_free(sr_block *b, const struct hdr *h)
{
    sr__tsan_release(&arena_handoff);
    b->magic = BLOCK_FREED; /* a stale offset now fails sr__block_from_off */
    free_data((enum block_layout)h->layout, (char *)b + h->delta, h->size);
    dallocx(b, MALLOCX_TCACHE_NONE);
}

static void tsan_give(const struct tsan_span *s);

/* F1: push b onto its area's remote-free list (drained by the area's owner
 * process; a quarantined area's list waits for its reclaim). span: b's
 * ThreadSanitizer hand-off, given again right before each CAS, the first
 * point at which the owner may take b (after our last accesses to it, the
 * link included). */
static void remote_free(const sr_segment *s, sr_block *b, int area, const struct tsan_span *span)
{
    /* s: our copy of the geometry (a was checked against the area b lies in) */
    _Atomic uint64_t *head = &sr__seg_area(s, area)->remote_free;
    uint64_t off = sr__seg_off(s, b);
    /* relaxed: only a guess; the CAS checks it */
    uint64_t old = atomic_load_explicit(head, memory_order_relaxed);
    do {
        /* relaxed: published by the release CAS below */
        atomic_store_explicit(&b->next_free, old, memory_order_relaxed);
        tsan_give(span);
        /* release: pairs with the acquire exchange in sr__heap_drain (F1) */
    } while (!atomic_compare_exchange_weak_explicit(head, &old, off, memory_order_release,
                                                    memory_order_relaxed));
    count(&counters.remote_pushes, 1);
}

/* The heap area a shared header at p lies in, from the geometry copied at
 * attach; -1 if none (or not attached). */
static int area_of(const void *p)
{
    if ((const char *)p >= heap.area && (const char *)p < heap.area + heap.area_len)
        return heap.area_idx; /* ours: no division on the owner's free path */
    uint64_t off = (uint64_t)((const char *)p - (const char *)heap.seg.base);
    if (!heap.area || (const char *)p < (const char *)heap.seg.base || off < heap.heap_off)
        return -1;
    uint64_t r = (off - heap.heap_off) / heap.heap_stride;
    return r < heap.nareas ? (int)r : -1;
}

/* NULL if b's header is intact: its check word matches, its area is the one
 * it lies in (area: area_of(b); -1 for a private block, outside every area),
 * and its data lies in that area without overlapping it. Else what is wrong. */
static const char *block_fault_at(const sr_block *b, const struct hdr *h, int area)
{
    if (h->check != header_check(h))
        return "is corrupt (its check word does not match size, owner, area, layout and data offset)";
    if (h->area != area) /* the owner rank is the allocator's own, covered by the check word */
        return "has an area that is not the heap area it lies in";
    if (area < 0)
        return h->delta == (int64_t)sizeof(*b) ? NULL : "is a private block whose data is not inline";
    uint64_t off = sr__seg_off(&heap.seg, b), lo = heap.heap_off + (uint64_t)area * heap.heap_stride;
    return data_fits(h, off, lo, lo + heap.heap_stride) ? NULL : "has data that runs past its heap area";
}

static const char *block_fault(const sr_block *b, const struct hdr *h) { return block_fault_at(b, h, area_of(b)); }

/* ---- ThreadSanitizer hand-offs (tsan.h) ---- */

/* What a hand-off of b pairs on. Our own block: its header's address; its
 * memory comes back to us only through our arena (arena_handoff covers
 * reuse there). Another worker's block: every page it covers, header and
 * data; once its owner has freed and reused that memory, it may come back
 * to us as a different block with other bounds, and our threads' accesses
 * to the old one must come before our accesses to the new one. Read while
 * the caller holds a reference. */
#ifdef SR_TSAN
#define TSAN_PAGE 4096u

struct tsan_span {
    const sr_block *b;
    const char *data; /* NULL: our own block, or a header that fails its checks */
    uint64_t len;
    bool remote;
};

static struct tsan_span tsan_span_of(const sr_block *b)
{
    int area = area_of(b);
    struct tsan_span s = {b, NULL, 0, area >= 0 && area != heap.area_idx};
    struct hdr h = hdr_read(b);
    if (s.remote && !block_fault(b, &h))
        s.data = (const char *)b + h.delta, s.len = h.size;
    return s;
}

static void tsan_pages(const char *p, uint64_t len, bool give)
{
    uintptr_t at = (uintptr_t)p & ~(uintptr_t)(TSAN_PAGE - 1), end = (uintptr_t)p + len;
    for (; at < end; at += TSAN_PAGE)
        give ? __tsan_release((void *)at) : __tsan_acquire((void *)at);
}

static void tsan_span_pass(const struct tsan_span *s, bool give)
{
    if (!s->remote) {
        give ? __tsan_release((void *)s->b) : __tsan_acquire((void *)s->b);
        return;
    }
    tsan_pages((const char *)s->b, sizeof(*s->b), give);
    if (s->data)
        tsan_pages(s->data, s->len, give);
}

static void tsan_give(const struct tsan_span *s) { tsan_span_pass(s, true); }

void sr__block_handoff(const sr_block *b)
{
    struct tsan_span s = tsan_span_of(b);
    tsan_give(&s);
}

/* b arrived: acquire its header's pairing first (the header is read next),
 * then, for another worker's block, its data's. */
static void tsan_take(const sr_block *b)
{
    int area = area_of(b);
    struct tsan_span head = {b, NULL, 0, area >= 0 && area != heap.area_idx};
    tsan_span_pass(&head, false);
    if (head.remote) {
        struct tsan_span s = tsan_span_of(b);
        tsan_span_pass(&s, false);
    }
}
#else
struct tsan_span {
    char unused;
};
static struct tsan_span tsan_span_of(const sr_block *b) { (void)b; return (struct tsan_span){0}; }
static void tsan_give(const struct tsan_span *s) { (void)s; }
static void tsan_take(const sr_block *b) { (void)b; }
#endif

/* The last reference to b (its header h checked) went: free it. Ours (or a
 * private one): at once; another area's: onto its list (its owner drains
 * it; a dead owner's waits for the reclaim). s: the segment's geometry. */
__attribute__((always_inline)) static inline void free_last(sr_block *b, const struct hdr *h, const sr_segment *s,
                                                            const struct tsan_span *span)
{
    if (h->owner < 0)
        free(b);
    else if (heap.area && h->area == heap.area_idx) {
        if (!tc_push(b, h)) {
            local_free(b, h);
            if (tc_ready())
                tc_bump(&tc->local_frees, 1);
        }
    } else
        remote_free(s, b, h->area, span);
}

static __attribute__((noreturn, cold)) void released_too_often(const sr_block *b)
{
    sr_logf(SR_LOG_ERROR, "sr__block_unref: block of %llu bytes (owner %d) released more often than taken",
            (unsigned long long)b->size, b->owner);
    abort();
}

/* Drop one reference to b: the count before. acquire: R1 for a sole
 * holder: pairs with the release decrements of every holder before us.
 * Seeing 1, nobody else holds a reference, and only a holder can take
 * one: the read-modify-write is not needed. */
static inline uint32_t ref_drop(sr_block *b)
{
    uint32_t old = atomic_load_explicit(&b->refcount, memory_order_acquire);
    if (old == 1)
        atomic_store_explicit(&b->refcount, 0, memory_order_relaxed); /* relaxed: nobody else reads it now */
    else /* acq_rel: R1, release our accesses; the last holder acquires everyone's */
        old = atomic_fetch_sub_explicit(&b->refcount, 1, memory_order_acq_rel);
    if (old == 0)
        released_too_often(b);
    return old;
}

/* The last reference to b (in area a; other: a reference we counted) went:
 * check its header, then free it (free_last), or leak it if it is corrupt. */
static __attribute__((noinline)) void unref_last(sr_block *b, int a, bool other, const struct tsan_span *span)
{
    struct hdr h = hdr_read(b);
    int owner = h.owner;
    const char *why = block_fault_at(b, &h, a);
    if (why) {
        /* Freeing it would hand jemalloc (or a peer's list) a wild pointer:
         * leak it instead, and say so. */
        char text[200];
        sr__fail(-EPROTO, "sr__block_unref", "block header at %p (owner field %d) %s (header: %s); the block is "
                 "leaked", (void *)b, owner, why, hdr_text(b, &h, text, sizeof(text)));
        sr__log_text(SR_LOG_ERROR, sr_last_error());
    } else if (owner >= 0 && !heap.area)
        sr_logf(SR_LOG_WARN, "sr__block_unref: last reference to a block of worker %d dropped after "
                           "sr__heap_detach(); it is left to the segment", owner);
    else {
        free_last(b, &h, &heap.seg, span);
        if (other) /* after the push: H3 */
            foreign_put(&heap.seg, a, 1);
    }
}

static void unref_other(sr_block *b, const struct tsan_span *span);

void sr__block_unref(sr_block *b)
{
    if (!b)
        return;
    /* This thread is done with b. When the last reference goes in another
     * process, R1 runs through that process, and b's memory comes back to us
     * by our remote-free list or in a later message (tsan.h). */
    struct tsan_span span = tsan_span_of(b);
    tsan_give(&span);
    if (!ours(b)) {
        unref_other(b, &span);
        return;
    }
    /* the owner's: nothing counted; the last one goes to this thread's bin if it can */
    if (ref_drop(b) > 1)
        tsan_give(&span); /* as in unref_other */
    else if (!tc_push_own(b))
        unref_last(b, heap.area_idx, false, &span);
}

/* sr__block_unref of a block in another area (or a private one). */
static __attribute__((noinline)) void unref_other(sr_block *b, const struct tsan_span *span)
{
    int a = area_of(b);
    bool other = a != heap.area_idx && counted(a);
    if (other) /* the table first, foreign last: a death in between leaks (heap.c, "Who holds what") */
        held_del(heap.held, sr__seg_off(&heap.seg, b));
    if (ref_drop(b) > 1) {
        /* Once more, now that the decrement is made: it too comes before
         * whoever gets another worker's memory back (for our own blocks the
         * drain's acquire load of refcount covers it: check_block). */
        tsan_give(span);
        if (other)
            foreign_put(&heap.seg, a, 1);
        return;
    }
    unref_last(b, a, other, span);
}

/* The dead owner of area a held n references to the block at off: drop
 * them (the walk of its table). The header is checked first (segment
 * geometry only: this process may not be attached); a bad one is leaked. */
static uint64_t drop_held(const sr_segment *s, uint64_t off, uint64_t n, int dead)
{
    const char *why = NULL;
    uint64_t rel = off - s->heap_off, a = rel / s->heap_stride;
    sr_block *b = sr__seg_ptr(s, off);
    struct hdr h = {0};
    if (off < s->heap_off || a >= s->heap_areas || off % BLOCK_ALIGN ||
        rel % s->heap_stride > s->heap_stride - SR_HEAP_HELD_BYTES - sizeof(sr_block))
        why = "is not a block header in a heap area";
    else if (b->magic != BLOCK_MAGIC)
        why = "names no live block (bad magic)";
    else if (h = hdr_read(b), h.check != header_check(&h) || h.area != (int32_t)a)
        why = "has a corrupt header";
    else if ((int)a == dead)
        why = "lies in the dead process's own area";
    uint32_t refs = why ? 0 : atomic_load_explicit(&b->refcount, memory_order_relaxed); /* relaxed: the CAS checks it */
    /* acq_rel: R1, as sr__block_unref (the dead's accesses are long done) */
    while (!why && !atomic_compare_exchange_weak_explicit(&b->refcount, &refs, refs - (refs >= n ? (uint32_t)n : 0),
                                                          memory_order_acq_rel, memory_order_relaxed))
        ;
    if (!why && refs < n)
        why = "has fewer references left than the table lists";
    if (why) {
        sr_logf(SR_LOG_ERROR, "sr__heap_area_quarantine: heap area %d's table lists %llu references to offset %llu, "
                "which %s; they are left alone", dead, (unsigned long long)n, (unsigned long long)off, why);
        return 0;
    }
    if (refs == n) {
        struct tsan_span span = tsan_span_of(b);
        free_last(b, &h, s, &span);
    }
    foreign_put(s, (int)a, n);
    return n;
}

/* Drop every reference dead area a's owner listed; warn about those it
 * could not list. */
static void drop_what_it_held(const sr_segment *s, int a)
{
    struct held_table *t = held_of(s, a);
    uint64_t dropped = 0;
    for (uint32_t i = 0; i < SR_HEAP_HELD_SLOTS; i++) {
        uint64_t w = atomic_load_explicit(&t->slot[i], memory_order_relaxed); /* relaxed: H1 */
        if (held_count(w))
            dropped += drop_held(s, held_key(w) << 6, held_count(w), a);
    }
    uint64_t lost = atomic_load_explicit(&t->lost, memory_order_relaxed); /* relaxed: H1 */
    if (lost)
        sr_logf(SR_LOG_WARN, "sr__heap_area_quarantine: the dead owner of heap area %d held %llu references it could "
                "not list (its table of %u entries was full); the blocks they name leak (dropped %llu listed ones)",
                a, (unsigned long long)lost, SR_HEAP_HELD_SLOTS, (unsigned long long)dropped);
}

/* ---- offsets ---- */

uint64_t sr__block_to_off(const sr_block *b)
{
    if (b->owner < 0 || !heap.area)
        return UINT64_MAX;
    return sr__seg_off(&heap.seg, b);
}

/* The data of the block at off lies in [lo, hi) with the header's area, is
 * aligned, and does not overlap the header. An inline block's data follows
 * its header; a split or huge block's may too, by chance: a header in the
 * last 64 bytes of its slab page and data at the start of the next page are
 * two allocations that touch (test heap/split_block_whose_data_follows_its_
 * header_is_valid). So a data offset of 64 does not say the layout. */
static bool data_fits(const struct hdr *h, uint64_t off, uint64_t lo, uint64_t hi)
{
    int64_t delta = h->delta;
    if (h->layout > LAYOUT_HUGE || (h->layout == LAYOUT_INLINE && delta != (int64_t)sizeof(sr_block)))
        return false;
    if (delta == (int64_t)sizeof(sr_block))
        return h->size <= hi - off - sizeof(sr_block);
    if (delta % BLOCK_ALIGN || (delta < 0 && (uint64_t)-delta > off - lo) || (delta > 0 && (uint64_t)delta >= hi - off))
        return false;
    uint64_t data = off + (uint64_t)delta; /* wraps back for delta < 0 */
    if (h->size > hi - data)
        return false;
    return data + h->size <= off || data >= off + sizeof(sr_block);
}

/* The block at off if its header is plausible: inside one heap area,
 * aligned, right magic, area and owner, a size that fits; live (a reference
 * left) or, for links of the remote-free list, dead. NULL and *why otherwise. */
static sr_block *check_block(uint64_t off, bool live, const char **why, int *area, struct hdr *h, bool *read)
{
    if (off < heap.heap_off || (off - heap.heap_off) / heap.heap_stride >= heap.nareas)
        return *why = "is outside every heap area", NULL;
    *area = (int)((off - heap.heap_off) / heap.heap_stride);
    uint64_t area_end = heap.heap_off + (uint64_t)(*area + 1) * heap.heap_stride;
    if (off % BLOCK_ALIGN || area_end - off < sizeof(sr_block))
        return *why = "is not a 64-byte aligned block header", NULL;
    sr_block *b = sr__seg_ptr(&heap.seg, off);
    /* b arrived (in a message, or on our remote-free list): whoever sent or
     * freed it handed it off first (tsan.h). Inside a heap area, so a valid
     * address for TSan whatever the header says. */
    tsan_take(b);
    if (b->magic != BLOCK_MAGIC)
        return *why = b->magic == BLOCK_FREED ? "names a freed block" : "has no block header (bad magic)", NULL;
    *h = hdr_read(b);
    *read = true;
    if (h->check != header_check(h))
        return *why = "has a corrupt header (check word mismatch)", NULL;
    if (h->area != *area || h->owner < 0 || (uint32_t)h->owner >= heap.world)
        return *why = "has a header whose owner or area is not the heap area it lies in", NULL;
    if (!data_fits(h, off, area_end - heap.heap_stride, area_end))
        return *why = "has data that runs past the end of its heap area", NULL;
    /* acquire: R1, pairs with every holder's release decrement in this
     * process, so the drain frees b after them even where F1's chain runs
     * through the peer that dropped the last reference (ThreadSanitizer
     * sees only this process's half). For a live block, a plausibility
     * check: the caller's reference orders its accesses. */
    if ((atomic_load_explicit(&b->refcount, memory_order_acquire) != 0) != live)
        return *why = live ? "names a block with no reference left" : "is still referenced", NULL;
    return b;
}

sr_block *sr__block_from_off(uint64_t off)
{
    if (!heap.area) {
        sr__fail(-EINVAL, "sr__block_from_off", "offset %llu: no shared heap attached",
                 (unsigned long long)off);
        return NULL;
    }
    const char *why = "";
    int area = -1;
    struct hdr h;
    bool read = false;
    sr_block *b = check_block(off, true, &why, &area, &h, &read);
    if (!b) {
        char text[200] = "";
        sr__fail(-EINVAL, "sr__block_from_off", "offset %llu (heap area %d) %s%s%s%s", (unsigned long long)off,
                 area, why, read ? " (header: " : "", read ? hdr_text(sr__seg_ptr(&heap.seg, off), &h, text,
                                                                      sizeof(text)) : "", read ? ")" : "");
    }
    return b;
}

uint64_t sr__block_send_off(sr_block *b)
{
    uint64_t off = sr__block_to_off(b);
    if (off == UINT64_MAX)
        return off;
    int a = area_of(b);
    if (counted(a)) /* ours to move: it leaves our table before anyone can see it (a death leaks it) */
        held_del(heap.held, off);
    else /* an owner's reference becomes one in a message: counted from now on */
        foreign_get(&heap.seg, a, 1);
    return off;
}

sr_block *sr__block_recv_off(uint64_t off)
{
    sr_block *b = sr__block_from_off(off);
    if (!b)
        return NULL;
    int a = area_of(b);
    if (counted(a))
        held_add(heap.held, off);
    else /* back with its owner: no longer counted */
        foreign_put(&heap.seg, a, 1);
    return b;
}

/* ---- the owner's side of remote frees ---- */

/* A link that does not name one of our dead blocks means shared memory was
 * corrupted: stop walking. The rest of the list leaks, which beats handing
 * jemalloc a wild pointer. */
static sr_block *list_block(uint64_t off, struct hdr *h)
{
    const char *why = "";
    int area = -1;
    bool read = false;
    sr_block *b = check_block(off, false, &why, &area, h, &read);
    if (b && area == heap.area_idx)
        return b;
    char text[200] = "";
    sr_logf(SR_LOG_ERROR, "sr__heap_drain: remote-free link %llu %s%s%s%s; dropping the rest of the list",
            (unsigned long long)off, b ? "is in another heap area" : why, read ? " (header: " : "",
            read ? hdr_text(sr__seg_ptr(&heap.seg, off), h, text, sizeof(text)) : "", read ? ")" : "");
    return NULL;
}

unsigned sr__heap_drain(void)
{
    _Atomic uint64_t *head = heap.free_head;
    /* relaxed: a hint; a push we miss is drained next time */
    if (!head || !atomic_load_explicit(head, memory_order_relaxed))
        return 0;
    /* acquire: pairs with every pusher's release CAS (F1) */
    uint64_t off = atomic_exchange_explicit(head, 0, memory_order_acquire);
    unsigned n = 0;
    while (off) {
        struct hdr h;
        sr_block *b = list_block(off, &h);
        if (!b)
            break;
        /* relaxed: ordered by the acquire exchange above (F1) */
        off = atomic_load_explicit(&b->next_free, memory_order_relaxed);
        local_free(b, &h);
        n++;
    }
    count(&counters.drained, n);
    return n;
}

int sr__heap_purge(void)
{
    if (!heap.area)
        return 0;
    tc_flush();
    sr__heap_huge_flush();
    int rc = sr__heap_arena_purge(heap.arena);
    sr__heap_extent_relieved();
    return rc;
}

size_t sr__heap_allocated(void)
{
    if (!heap.area)
        return 0;
    struct sr_heap_extent_stats st;
    sr__heap_extent_stats(&st);
    uint64_t allocs, frees, cached;
    tc_sum(&allocs, &frees, &cached); /* cached blocks are free, though jemalloc counts them */
    return sr__heap_arena_allocated(heap.arena) - (size_t)cached + (size_t)st.huge_live;
}
