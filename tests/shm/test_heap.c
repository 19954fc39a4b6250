/* SPDX-License-Identifier: MIT */
/* The shared heap.
 *
 * Suite heap (unit, one process): private blocks before attach; sizes from
 * 1 B to 256 MiB with their alignment, placement and refcounts; size-class
 * waste; offsets that must be rejected; pages given back to the memfd; room
 * left by freed huge blocks; attach/detach rules; metadata kept private;
 * forked children; exhaustion; a seeded mixed churn that must not fragment;
 * headers a peer scribbled on (stride, owner, data offset) giving errors, not
 * crashes; the per-thread cache of small blocks.
 *
 * The heap across processes, with blocks passed by offset through the
 * shared-memory transport (suite heap_mp), is tests/transport/test_heap_mp.c.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "error.h"
#include "heap.h"
#include "heap_extent.h"
#include "segment.h"
#include "shmrpc/spawn.h"
#include "shmrpc/tensor.h"
#include "desc.h" /* the tensor layer's seam: a tensor's descriptor and block */
#include "worker_check.h"

LEAK_CHECKED_SUITE(heap);

#include "heap_stamp.h"

/* ---- single process ---- */

static sr_segment seg; /* Criterion runs each test in its own process */

static void attach_single(int world, uint64_t heap_each)
{
    sr_segment_opts o = {.world_size = world, .size = seg_size_for(world, heap_each), .name = test_ns("heap")};
    cr_assert_eq(sr__segment_create(&o, &seg), 0, "%s", sr_last_error());
    cr_assert_eq(sr__heap_attach(&seg, 0), 0, "%s", sr_last_error());
    cr_assert(sr__heap_attached());
}

static void detach_single(void)
{
    sr__heap_detach();
    cr_assert(!sr__heap_attached());
    sr__segment_detach(&seg, true);
}

/* Header and data both lie in rank's heap area. */
static bool inside_area(const sr_block *b, int rank)
{
    const char *lo = sr__seg_heap(&seg, rank), *hi = lo + seg.hdr->heap_stride;
    const char *d = sr__block_data(b);
    return (const char *)b >= lo && (const char *)b + 64 <= hi && d >= lo && d + sr__block_size(b) <= hi;
}

Test(heap, private_blocks_before_attach)
{
    cr_assert(!sr__heap_attached());
    sr_block *b = sr__block_alloc(100);
    cr_assert_not_null(b, "%s", sr_last_error());
    cr_assert_eq(sr__block_owner(b), -1);
    cr_assert_eq(sr__block_size(b), 100);
    cr_assert_eq((uintptr_t)sr__block_data(b) % 64, 0);
    cr_assert_eq(sr__block_to_off(b), UINT64_MAX, "a private block has no offset");
    cr_assert_null(sr__block_from_off(4096));
    cr_assert(strstr(sr_last_error(), "no shared heap attached"), "%s", sr_last_error());
    cr_assert_eq(sr__block_refcount(sr__block_ref(b)), 2);
    sr__block_unref(b);
    cr_assert_eq(sr__block_refcount(b), 1);
    sr__block_unref(b); /* frees it: ASan reports a leak otherwise */
    cr_assert_eq(sr__heap_allocated(), 0);
    cr_assert_eq(sr__heap_drain(), 0);
}

static const size_t sizes[] = {1,        7,         63,          64,       65,       100,     4095,
                               4096,     4097,      65536,       1 << 20,  3 << 20,  64 << 20, 256 << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

struct span {
    uintptr_t lo, hi;
};

static int by_address(const void *a, const void *b)
{
    uintptr_t x = ((const struct span *)a)->lo, y = ((const struct span *)b)->lo;
    return x < y ? -1 : x > y;
}

/* No header or data range overlaps another (a header may sit apart from its
 * data, so both are checked). */
static void assert_disjoint(sr_block **blocks, size_t n)
{
    struct span sp[2 * NSIZES];
    for (size_t i = 0; i < n; i++) {
        uintptr_t d = (uintptr_t)sr__block_data(blocks[i]);
        sp[2 * i] = (struct span){(uintptr_t)blocks[i], (uintptr_t)blocks[i] + 64};
        sp[2 * i + 1] = (struct span){d, d + sr__block_size(blocks[i])};
    }
    qsort(sp, 2 * n, sizeof(sp[0]), by_address);
    for (size_t i = 0; i + 1 < 2 * n; i++)
        cr_assert_leq(sp[i].hi, sp[i + 1].lo, "blocks overlap: [%#lx, %#lx) and [%#lx, %#lx)", (unsigned long)sp[i].lo,
                      (unsigned long)sp[i].hi, (unsigned long)sp[i + 1].lo, (unsigned long)sp[i + 1].hi);
}

Test(heap, sizes_alignment_placement_and_round_trip_offsets, .timeout = 60)
{
    attach_single(1, 768 * MiB);
    size_t base = sr__heap_allocated(), total = 0;
    sr_block *blocks[NSIZES];
    for (size_t i = 0; i < NSIZES; i++) {
        sr_block *b = blocks[i] = sr__block_alloc(sizes[i]);
        cr_assert_not_null(b, "size %zu: %s", sizes[i], sr_last_error());
        cr_assert_eq(sr__block_size(b), sizes[i]);
        cr_assert_eq(sr__block_owner(b), 0);
        cr_assert_eq(sr__block_refcount(b), 1);
        cr_assert_eq((uintptr_t)sr__block_data(b) % 64, 0, "size %zu: data %p is not 64-byte aligned", sizes[i],
                     sr__block_data(b));
        cr_assert(inside_area(b, 0), "size %zu: block %p is not inside the heap area", sizes[i], (void *)b);
        uint64_t off = sr__block_to_off(b);
        cr_assert_eq(sr__seg_ptr(&seg, off), (void *)b);
        cr_assert_eq(sr__block_from_off(off), b, "size %zu: %s", sizes[i], sr_last_error());
        fill(b, i);
        total += sizes[i];
    }
    assert_disjoint(blocks, NSIZES);
    cr_assert_geq(sr__heap_allocated(), base + total, "jemalloc counts %zu bytes for %zu asked",
                  sr__heap_allocated() - base, total);
    for (size_t i = 0; i < NSIZES; i++) {
        cr_assert_eq(first_bad(blocks[i], i), -1, "size %zu: data was overwritten", sizes[i]);
        sr__block_unref(blocks[i]);
    }
    cr_assert_eq(sr__heap_allocated(), base, "the arena did not return to its baseline");
    sr_heap_counters c;
    sr__heap_counters_get(&c);
    cr_assert_eq(c.allocs, NSIZES);
    cr_assert_eq(c.local_frees, NSIZES);
    detach_single();
}

/* A power-of-two tensor plus its 64-byte header would round up to the next
 * jemalloc size class (+25%) if they shared one allocation. */
Test(heap, power_of_two_blocks_waste_little, .timeout = 60)
{
    attach_single(1, 512 * MiB);
    static const size_t pow2[] = {4096, 64 << 10, 1 << 20, 256 << 20};
    for (size_t i = 0; i < sizeof(pow2) / sizeof(pow2[0]); i++) {
        size_t before = sr__heap_allocated();
        sr_block *b = sr__block_alloc(pow2[i]);
        cr_assert_not_null(b, "%s", sr_last_error());
        size_t cost = sr__heap_allocated() - before;
        cr_assert_lt(cost, pow2[i] + pow2[i] / 8, "a %zu-byte block costs %zu bytes of the arena", pow2[i], cost);
        cr_assert(inside_area(b, 0));
        cr_assert_eq(sr__block_from_off(sr__block_to_off(b)), b, "%s", sr_last_error());
        sr__block_unref(b);
        cr_assert_eq(sr__heap_allocated(), before);
    }
    detach_single();
}

Test(heap, refcounts_free_on_last_unref)
{
    attach_single(1, 16 * MiB);
    size_t base = sr__heap_allocated();
    sr_block *b = sr__block_alloc(1000);
    cr_assert_not_null(b, "%s", sr_last_error());
    uint64_t off = sr__block_to_off(b);
    cr_assert_eq(sr__block_ref(b), b);
    cr_assert_eq(sr__block_ref(b), b);
    cr_assert_eq(sr__block_refcount(b), 3);
    sr__block_unref(b);
    sr__block_unref(b);
    cr_assert_eq(sr__block_refcount(b), 1);
    cr_assert_gt(sr__heap_allocated(), base, "still held");
    sr__block_unref(b);
    cr_assert_eq(sr__heap_allocated(), base, "the last unref frees");
    cr_assert_null(sr__block_from_off(off), "a freed block's offset is rejected");
    cr_assert(strstr(sr_last_error(), "freed"), "%s", sr_last_error());
    sr__block_unref(NULL);
    detach_single();
}

static void assert_rejected(uint64_t off, const char *why)
{
    cr_assert_null(sr__block_from_off(off), "offset %llu was accepted", (unsigned long long)off);
    cr_assert(strstr(sr_last_error(), "sr__block_from_off"), "%s", sr_last_error());
    cr_assert(strstr(sr_last_error(), why), "offset %llu: expected '%s' in: %s", (unsigned long long)off, why,
              sr_last_error());
}

Test(heap, bad_offsets_are_rejected)
{
    attach_single(2, 16 * MiB);
    const struct sr_seg_header *h = seg.hdr;
    sr_block *a = sr__block_alloc(100), *freed = sr__block_alloc(64); /* small: data follows the header */
    cr_assert(a && freed, "%s", sr_last_error());
    uint64_t a_off = sr__block_to_off(a), freed_off = sr__block_to_off(freed);
    sr__block_unref(freed);
    uint64_t end = h->heap_off + h->heap_areas * h->heap_stride; /* the spares included */

    assert_rejected(0, "outside every heap area");              /* the segment header */
    assert_rejected(h->inbox_off, "outside every heap area");   /* an inbox */
    assert_rejected(h->heap_off - 64, "outside every heap area");
    assert_rejected(end, "outside every heap area");
    assert_rejected(UINT64_MAX, "outside every heap area");
    assert_rejected(a_off + 1, "aligned");
    assert_rejected(a_off + 8, "aligned");
    assert_rejected(end - 32, "aligned");                       /* a header would straddle the end */
    assert_rejected(a_off + 64, "bad magic");                   /* a's zeroed data */
    assert_rejected(h->heap_off + h->heap_stride, "bad magic"); /* rank 1's untouched area */
    assert_rejected(freed_off, "freed");

    /* Forged headers, copied from a real one so the test needs no layout. */
    char *rank1 = sr__seg_heap(&seg, 1);
    memcpy(rank1, a, 64);
    assert_rejected(sr__seg_off(&seg, rank1), "owner");
    char *last = (char *)sr__seg_heap(&seg, 0) + h->heap_stride - 64; /* never carved in a 16 MiB heap */
    memcpy(last, a, 64);
    assert_rejected(sr__seg_off(&seg, last), "runs past the end");
    /* the message says what the header held: enough to tell a scribble from a validator's mistake */
    assert_rejected(sr__seg_off(&seg, last), "(header: size 100, owner 0, area 0, layout inline (0), data at +64");
    memset(rank1, 0, 64);
    memset(last, 0, 64);

    cr_assert_eq(sr__block_from_off(a_off), a, "the real block is still accepted: %s", sr_last_error());
    sr__block_unref(a);
    detach_single();
}

/* Write a block of size bytes in full, free it (and purge if asked), and
 * check that its pages left the memfd and that the range is reused zeroed. */
static void check_pages_given_back(size_t size, bool purge)
{
    uint64_t before = memfd_bytes(seg.fd);
    sr_block *b = sr__block_alloc(size);
    cr_assert_not_null(b, "%s", sr_last_error());
    memset(sr__block_data(b), 0xa5, sr__block_size(b));
    uint64_t full = memfd_bytes(seg.fd);
    cr_assert_geq(full, before + size, "writing %zu bytes grew the memfd by only %llu", size,
                  (unsigned long long)(full - before));
    struct sr_heap_extent_stats s0, s1;
    sr__heap_extent_stats(&s0);
    sr__block_unref(b);
    if (purge)
        cr_assert_eq(sr__heap_purge(), 0, "%s", sr_last_error());
    sr__heap_extent_stats(&s1);
    uint64_t after = memfd_bytes(seg.fd);
    cr_assert_geq(s1.punched - s0.punched, size, "%zu bytes: free%s punched only %llu bytes", size,
                  purge ? " + purge" : "", (unsigned long long)(s1.punched - s0.punched));
    cr_assert_leq(after, before + 64 * 1024, "%zu bytes: the memfd holds %llu bytes after the free, %llu before",
                  size, (unsigned long long)after, (unsigned long long)before);
    b = sr__block_alloc(size);
    cr_assert_not_null(b, "%s", sr_last_error());
    const uint8_t *d = sr__block_data(b);
    cr_assert(d[0] == 0 && d[size / 2] == 0 && d[size - 1] == 0, "%zu bytes: a punched page came back dirty", size);
    sr__block_unref(b);
}

Test(heap, freed_pages_go_back_to_the_memfd, .timeout = 60)
{
    attach_single(1, 128 * MiB);
    sr_block *warm = sr__block_alloc(64); /* the arena's metadata pages are touched by now */
    check_pages_given_back(32 * MiB, true); /* huge: kept for reuse, punched when purged */
    check_pages_given_back(4 * MiB, true);  /* jemalloc's: punched when purged */
    sr__block_unref(warm);
    detach_single();
}

/* A freed huge block keeps its pages for the next block of the same size:
 * the memfd does not grow and nothing is punched; another size carves anew. */
Test(heap, freed_huge_block_is_reused_for_the_same_size, .timeout = 60)
{
    attach_single(1, 256 * MiB);
    sr_block *b = sr__block_alloc(32 * MiB);
    cr_assert_not_null(b, "%s", sr_last_error());
    memset(sr__block_data(b), 0x5a, 32 * MiB);
    void *first = sr__block_data(b);
    sr__block_unref(b);
    uint64_t held = memfd_bytes(seg.fd);
    struct sr_heap_extent_stats s0, s1;
    sr__heap_extent_stats(&s0);
    b = sr__block_alloc(32 * MiB);
    cr_assert_not_null(b, "%s", sr_last_error());
    cr_assert_eq(sr__block_data(b), first, "the same range comes back");
    memset(sr__block_data(b), 0x11, 32 * MiB);
    sr__heap_extent_stats(&s1);
    cr_assert_eq(s1.punched, s0.punched, "reuse punched %llu bytes", (unsigned long long)(s1.punched - s0.punched));
    cr_assert_leq(memfd_bytes(seg.fd), held + 64 * 1024, "reuse faulted new pages in");
    sr_block *other = sr__block_alloc(16 * MiB);
    cr_assert_not_null(other, "%s", sr_last_error());
    cr_assert_neq(sr__block_data(other), first, "a different size is carved anew");
    sr__block_unref(other);
    sr__block_unref(b);
    cr_assert_eq(sr__heap_allocated(), 0, "cached ranges are not counted as allocated");
    detach_single();
}

/* Regression: a freed 256 MiB block used to stay in jemalloc's retained set,
 * so a 1 GiB block no longer fitted a heap that had room for it. */
Test(heap, freed_huge_blocks_leave_room_for_a_bigger_one, .timeout = 60)
{
    attach_single(1, GiB + 32 * MiB);
    static const size_t seq[] = {MiB, 64 * MiB, 256 * MiB, 16 * MiB, GiB, 300 * MiB, GiB};
    for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
        sr_block *b = sr__block_alloc(seq[i]);
        cr_assert_not_null(b, "block %zu (%zu bytes): %s", i, seq[i], sr_last_error());
        ((uint8_t *)sr__block_data(b))[seq[i] - 1] = 1;
        sr__block_unref(b);
    }
    cr_assert_eq(sr__heap_allocated(), 0);
    detach_single();
}

Test(heap, attach_is_idempotent_and_exclusive)
{
    attach_single(2, 8 * MiB);
    cr_assert_eq(sr__heap_attach(&seg, 0), 0, "same segment and rank: a no-op");
    cr_assert_eq(sr__heap_attach(&seg, 1), -EBUSY);
    cr_assert(strstr(sr_last_error(), "already attached"), "%s", sr_last_error());
    sr_block *b = sr__block_alloc(100);
    cr_assert_not_null(b, "%s", sr_last_error());
    sr__block_unref(b);
    sr__heap_detach();
    cr_assert_eq(sr__heap_attach(&seg, 2), -EINVAL, "rank out of range");
    cr_assert_eq(sr__heap_attach(&seg, -1), -EINVAL);
    /* Re-attach as the other rank: a fresh arena in a fresh area. */
    cr_assert_eq(sr__heap_attach(&seg, 1), 0, "%s", sr_last_error());
    b = sr__block_alloc(100);
    cr_assert_not_null(b, "%s", sr_last_error());
    cr_assert_eq(sr__block_owner(b), 1);
    cr_assert(inside_area(b, 1));
    sr__block_unref(b);
    detach_single();
}

/* jemalloc's own bookkeeping (arena, bins, mutexes) stays in private memory:
 * nothing is carved from the area until the first block. */
Test(heap, arena_metadata_stays_out_of_the_area)
{
    attach_single(1, 64 * MiB);
    struct sr_heap_extent_stats st;
    sr__heap_extent_stats(&st);
    cr_assert_eq(st.area, seg.hdr->heap_stride - SR_HEAP_HELD_BYTES, "the area less the table of held references");
    cr_assert_eq(st.used, 0, "attach carved %llu bytes of the area", (unsigned long long)st.used);
    sr_block *b = sr__block_alloc(64);
    cr_assert_not_null(b, "%s", sr_last_error());
    sr__heap_extent_stats(&st);
    cr_assert_gt(st.used, 0);
    sr__block_unref(b);
    detach_single();
}

/* A child forked by an attached worker must not allocate from the parent's
 * area with its copy of the arena: it forgets the heap. */
Test(heap, forked_child_forgets_the_heap)
{
    attach_single(1, 16 * MiB);
    sr_block *b = sr__block_alloc(100);
    cr_assert_not_null(b, "%s", sr_last_error());
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        sr_block *c = sr__block_alloc(100);
        int ok = !sr__heap_attached() && c && sr__block_owner(c) == -1;
        sr__block_unref(c);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child still allocated from the shared heap");
    cr_assert(sr__heap_attached());
    sr__block_unref(b);
    cr_assert_eq(sr__heap_allocated(), 0);
    detach_single();
}

/* Allocate chunk-sized blocks until the heap says no; returns how many. */
static size_t exhaust(sr_block **held, size_t max, size_t chunk)
{
    size_t n = 0;
    while (n < max && (held[n] = sr__block_alloc(chunk)))
        n++;
    return n;
}

static bool error_names(const char *fmt, unsigned long long v)
{
    char s[32];
    snprintf(s, sizeof(s), fmt, v);
    return strstr(sr_last_error(), s) != NULL;
}

Test(heap, exhaustion_is_enomem_not_a_crash)
{
    attach_single(1, 8 * MiB);
    size_t base = sr__heap_allocated(), chunk = 256 << 10;
    sr_block *held[64];
    errno = 0;
    size_t n = exhaust(held, 64, chunk);
    cr_assert(n > 0 && n < 64, "%zu blocks of %zu bytes from an 8 MiB heap", n, chunk);
    cr_assert_eq(errno, ENOMEM);
    cr_assert(strstr(sr_last_error(), "sr__block_alloc") && error_names("worker %llu", 0) &&
                  error_names("%llu bytes", chunk) && error_names("%llu bytes", seg.hdr->heap_stride),
              "the error must name the worker, the size and the heap: %s", sr_last_error());
    cr_assert_null(sr__block_alloc((size_t)seg.hdr->heap_stride), "larger than the heap");
    cr_assert_null(sr__block_alloc(SIZE_MAX - 8), "no overflow");
    for (size_t i = 0; i < n; i++)
        sr__block_unref(held[i]);
    cr_assert_eq(sr__heap_allocated(), base);
    size_t again = exhaust(held, 64, chunk);
    cr_assert_eq(again, n, "after freeing everything the heap holds %zu blocks again, not %zu", again, n);
    for (size_t i = 0; i < again; i++)
        sr__block_unref(held[i]);
    detach_single();
}

/* ---- fragmentation ---- */

/* xorshift64*: the churn below is the same on every run. */
static uint64_t churn_rand(uint64_t *s)
{
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

/* A size between 64 B and 16 MiB: log-uniform, as a mixed RPC workload's
 * tensors are (the soak's distribution). */
static size_t churn_size(uint64_t *s)
{
    unsigned lg = 6 + (unsigned)(churn_rand(s) % 18); /* 2^6 .. 2^23 */
    uint64_t lo = UINT64_C(1) << lg;
    return (size_t)(lo + churn_rand(s) % (lo + 1) + 63) & ~(size_t)63;
}

#define CHURN_SLOTS 64
#define CHURN_STEPS 40000
#define CHURN_LIVE_MAX (128 * MiB)

/* Regression: in a soak, a 16 MiB allocation failed with 48 MiB live in a
 * 1 GiB heap: about 700 MiB were free, in 65 fragments. jemalloc's retained
 * set (its grow steps' tails, and every extent it purged) kept a piece of
 * almost every 16 MiB of the area, for good. A seeded churn
 * of up to 64 blocks of 64 B .. 16 MiB, never more than 128 MiB live (about
 * 60 on average), in a 512 MiB heap: every allocation must succeed. Data is
 * not touched (the memfd stays sparse), so the test is fast. */
Test(heap, mixed_churn_does_not_fragment, .timeout = 120)
{
    attach_single(1, 512 * MiB);
    uint64_t s = 0x5eed0f11ull;
    sr_block *slot[CHURN_SLOTS] = {0};
    size_t live = 0, live_at_fail = 0;
    unsigned failures = 0;
    size_t first_failed = 0;
    int first_step = -1;
    for (int step = 0; step < CHURN_STEPS; step++) {
        unsigned i = (unsigned)(churn_rand(&s) % CHURN_SLOTS);
        live -= slot[i] ? sr__block_size(slot[i]) : 0;
        sr__block_unref(slot[i]);
        size_t n = churn_size(&s);
        slot[i] = live + n <= CHURN_LIVE_MAX ? sr__block_alloc(n) : NULL;
        if (slot[i])
            live += n;
        else if (live + n <= CHURN_LIVE_MAX && failures++ == 0)
            first_failed = n, first_step = step, live_at_fail = live;
    }
    struct sr_heap_extent_stats st;
    sr__heap_extent_stats(&st);
    for (unsigned i = 0; i < CHURN_SLOTS; i++)
        sr__block_unref(slot[i]);
    cr_assert_eq(failures, 0,
                 "%u allocations failed, the first of %zu bytes at step %d with %zu bytes live; at the end "
                 "%llu bytes free in %u ranges, %llu dropped",
                 failures, first_failed, first_step, live_at_fail, (unsigned long long)st.free_bytes, st.nfree,
                 (unsigned long long)st.dropped);
    cr_assert_eq(sr__heap_allocated(), 0);
    detach_single();
}

/* Regression: the library no longer sets jemalloc's retain:false for the
 * whole process (malloc_conf); with jemalloc's default, retain, its arena
 * would grow in geometric steps (2 MiB, 2.5, 3, ... 32 MiB) and keep their
 * unused tails in its retained set for good, where no huge block can go.
 * The extent hooks refuse those steps. After a churn of jemalloc-sized
 * blocks (64 B .. 7 MiB) and a purge, every byte of the area must be back
 * on the carve allocator's table, in one range. */
Test(heap, every_freed_extent_comes_back_to_the_area, .timeout = 60)
{
    attach_single(1, 256 * MiB);
    uint64_t s = 0x7e7a1115ull;
    sr_block *b[96];
    for (int round = 0; round < 4; round++) {
        for (unsigned i = 0; i < 96; i++) {
            size_t n = (size_t)64 << (churn_rand(&s) % 17); /* 64 B .. 4 MiB */
            n += (size_t)(churn_rand(&s) % 3) * (n / 2);     /* .. 6 MiB: no huge block */
            b[i] = sr__block_alloc(n);
            cr_assert_not_null(b[i], "round %d block %u (%zu bytes): %s", round, i, n, sr_last_error());
        }
        for (unsigned i = 0; i < 96; i++)
            sr__block_unref(b[i]);
    }
    cr_assert_eq(sr__heap_purge(), 0, "%s", sr_last_error());
    struct sr_heap_extent_stats st;
    sr__heap_extent_stats(&st);
    cr_assert(st.used == 0 && st.nfree == 1 && st.largest_free == st.area,
              "after the purge %llu bytes of the %llu-byte area are still out (%u free ranges, the largest %llu "
              "bytes): jemalloc kept them (grow steps in its retained set?)", (unsigned long long)st.used,
              (unsigned long long)st.area, st.nfree, (unsigned long long)st.largest_free);
    cr_assert_eq(sr__heap_allocated(), 0);
    detach_single();
}

/* The purge policy: freed extents stay dirty (no punch at free), and the
 * allocation that takes the area past three quarters in use purges them,
 * so a big block still finds room. 40 MiB of 1 MiB blocks freed in a
 * 64 MiB heap stay out (dirty); a 16 MiB huge block then crosses the mark
 * and its allocation gives the 40 MiB back. */
Test(heap, dirty_extents_stay_until_the_heap_is_pressed, .timeout = 60)
{
    attach_single(1, 64 * MiB + SR_HEAP_HELD_BYTES);
    sr_block *b[40];
    for (unsigned i = 0; i < 40; i++) {
        b[i] = sr__block_alloc(MiB);
        cr_assert_not_null(b[i], "block %u: %s", i, sr_last_error());
        memset(sr__block_data(b[i]), 0x3c, MiB);
    }
    struct sr_heap_extent_stats s0, s1, s2;
    sr__heap_extent_stats(&s0);
    for (unsigned i = 0; i < 40; i++)
        sr__block_unref(b[i]);
    sr__heap_extent_stats(&s1);
    cr_assert_lt(s1.punched - s0.punched, 4 * MiB, "freeing 40 MiB punched %llu bytes at once",
                 (unsigned long long)(s1.punched - s0.punched));
    cr_assert_geq(s1.used, 40 * MiB, "the freed extents stay dirty: %llu bytes out", (unsigned long long)s1.used);
    sr_block *big = sr__block_alloc(16 * MiB); /* 56 MiB out: past the 48 MiB mark */
    cr_assert_not_null(big, "%s", sr_last_error());
    sr__heap_extent_stats(&s2);
    cr_assert_geq(s2.punched - s1.punched, 36 * MiB, "the pressed allocation punched only %llu bytes",
                  (unsigned long long)(s2.punched - s1.punched));
    cr_assert_leq(s2.used, 17 * MiB, "%llu bytes still out after the purge", (unsigned long long)s2.used);
    sr__block_unref(big);
    cr_assert_eq(sr__heap_allocated(), 0);
    detach_single();
}

/* ---- a header a peer scribbled on ---- */

/* Byte offsets of the block header's fields (struct sr_block in shm/heap.c). */
#define HDR_OWNER 8
#define HDR_DATA_DELTA 32
#define HDR_LAYOUT 20
#define HDR_CHECK 40
#define HDR_REFCOUNT 16
#define HDR_NEXT_FREE 24

static void poke32(sr_block *b, size_t at, int32_t v) { memcpy((char *)b + at, &v, sizeof(v)); }
static void poke64(sr_block *b, size_t at, int64_t v) { memcpy((char *)b + at, &v, sizeof(v)); }
static int64_t peek64(const sr_block *b, size_t at)
{
    int64_t v;
    memcpy(&v, (const char *)b + at, sizeof(v));
    return v;
}

/* Regression: a heap stride of 0 in the segment header divided by zero in
 * every offset check. The geometry is now copied at attach. */
Test(heap, zero_heap_stride_in_the_header_is_not_a_division_by_zero)
{
    attach_single(2, 16 * MiB);
    sr_block *b = sr__block_alloc(64);
    cr_assert_not_null(b, "%s", sr_last_error());
    uint64_t off = sr__block_to_off(b), stride = seg.hdr->heap_stride;
    seg.hdr->heap_stride = 0; /* what a peer's stray write did */
    cr_assert_eq(sr__block_from_off(off), b, "%s", sr_last_error());
    cr_assert_null(sr__block_from_off(off + 64 * MiB));
    cr_assert(strstr(sr_last_error(), "outside every heap area"), "%s", sr_last_error());
    sr__block_unref(b);
    seg.hdr->heap_stride = stride;
    cr_assert_eq(sr__heap_allocated(), 0);
    detach_single();
}

/* Regression: a corrupted owner field made the last unref push the block onto
 * the list of whatever rank it named: a write at an unchecked index of the
 * worker table (a crash for 1 << 30), or onto a live peer's list (worker 1
 * here), whose drain would then free our block into its own arena. Now the
 * block is leaked with an error naming the worker. */
Test(heap, corrupt_owner_is_an_error_not_a_wild_write)
{
    attach_single(2, 16 * MiB);
    sr__error_set_rank(0); /* as sr__xport_attach does: errors name the worker */
    _Atomic uint64_t *peer_list = &sr__seg_area(&seg, 1)->remote_free;
    sr_block *b = sr__block_alloc(64);
    cr_assert_not_null(b, "%s", sr_last_error());
    poke32(b, HDR_OWNER, 1);
    sr__block_unref(b);
    cr_assert_eq(atomic_load(peer_list), 0, "our block was pushed onto worker 1's remote-free list");
    cr_assert(strstr(sr_last_error(), "worker0: sr__block_unref") && strstr(sr_last_error(), "leaked"), "%s",
              sr_last_error());
    sr_block *c = sr__block_alloc(64);
    cr_assert_not_null(c, "%s", sr_last_error());
    uint64_t off = sr__block_to_off(c);
    poke32(c, HDR_OWNER, 1 << 30);
    cr_assert_null(sr__block_from_off(off), "a corrupt header passed as a block");
    sr__block_unref(c); /* used to write 1 << 30 worker-table entries past the table */
    cr_assert(strstr(sr_last_error(), "worker0: sr__block_unref"), "%s", sr_last_error());
    detach_single();
}

/* Regression: a corrupted data offset in a block header was read as tensor
 * data (or segfaulted) by every op on a tensor over the block, and a
 * descriptor naming the block made a tensor of whatever bytes the offset
 * pointed at. Now a storage keeps the data pointer it checked when it was
 * made, and a descriptor naming a corrupt block is refused. */
Test(heap, corrupt_data_offset_is_an_error_not_tensor_data)
{
    attach_single(1, 64 * MiB);
    sr__error_set_rank(0);
    int64_t shape[1] = {8192};
    sr_tensor *t = sr_full(SR_F32, 1, shape, 1.0, 0);
    cr_assert_not_null(t, "%s", sr_last_error());
    struct sr_tensor_desc d;
    cr_assert_eq(sr__tensor_to_desc(t, &d), 0, "%s", sr_last_error());
    sr_block *b = sr__tensor_block(t);
    poke64(b, HDR_DATA_DELTA, peek64(b, HDR_DATA_DELTA) + (int64_t)(8 * MiB)); /* still inside the area */
    sr_tensor *sum = sr_sum(t);
    cr_assert_not_null(sum, "%s", sr_last_error());
    cr_assert_float_eq(sr_tensor_item(sum), 8192.0, 1e-6, "the tensor read the bytes the corrupt offset names");
    sr_tensor_unref(sum);
    sr_tensor *u = NULL;
    int rc = sr__tensor_from_desc(&d, &u);
    cr_assert_lt(rc, 0, "a descriptor naming a corrupt block gave a tensor");
    cr_assert(strstr(sr_last_error(), "worker0") && strstr(sr_last_error(), "corrupt"), "%s", sr_last_error());
    sr_tensor_unref(u);
    sr__tensor_desc_release(&d);
    sr_tensor_unref(t); /* the block is leaked, with an error */
    detach_single();
}

/* ---- the per-thread cache of small blocks ---- */

/* A cached block is dead: its offset is refused, and the next allocation of
 * its class on the thread gets it back. */
Test(heap, cached_small_block_is_dead_until_reused)
{
    attach_single(1, 16 * MiB);
    sr_block *b = sr__block_alloc(100);
    cr_assert_not_null(b, "%s", sr_last_error());
    uint64_t off = sr__block_to_off(b);
    sr__block_unref(b);
    cr_assert_null(sr__block_from_off(off), "a cached block's offset was accepted");
    cr_assert(strstr(sr_last_error(), "freed block"), "%s", sr_last_error());
    cr_assert_eq(sr__heap_allocated(), 0, "cached blocks count as allocated");
    sr_block *c = sr__block_alloc(90); /* the same 192-byte class */
    cr_assert_eq(c, b, "the cached block was not reused");
    cr_assert_eq(sr__block_size(c), 90);
    cr_assert_eq(sr__block_from_off(off), c, "%s", sr_last_error());
    sr__block_unref(c);
    detach_single();
}

/* The thread's bins remember the check word of the last size they saw
 * (an inline block's word depends on its size alone), and the free of an
 * inline block compares its header with that memo instead of hashing it.
 * A block reused for other sizes of its class carries a check word that
 * fits each, every time, and the memo follows. */
Test(heap, cached_block_reused_for_other_sizes_of_its_class_checks)
{
    attach_single(1, 16 * MiB);
    static const size_t sizes[] = {100, 90, 90, 100, 65, 128, 100};
    sr_block *first = NULL;
    for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        sr_block *b = sr__block_alloc(sizes[i]);
        cr_assert_not_null(b, "%s", sr_last_error());
        if (!first)
            first = b;
        cr_assert_eq(b, first, "%zu bytes: the cached block of the 192-byte class was not reused", sizes[i]);
        void *data;
        size_t n;
        cr_assert_eq(sr__block_check(b, &data, &n), 0, "%zu bytes after %zu: %s", sizes[i], i ? sizes[i - 1] : 0,
                     sr_last_error());
        cr_assert_eq(n, sizes[i]);
        cr_assert_eq(sr__block_from_off(sr__block_to_off(b)), b, "%s", sr_last_error());
        sr__block_unref(b);
        cr_assert_null(sr__block_from_off(sr__block_to_off(b)), "%zu bytes: the block was not cached", sizes[i]);
    }
    cr_assert_eq(sr__heap_allocated(), 0);
    detach_single();
}

/* A header scribbled on while the block was live is caught by the free
 * whatever the bin's memo says: a size, a data offset or a check word that
 * differ from the memo's go to the full check, which leaks the block and
 * says why; the memo itself stays right for the next good block. */
Test(heap, scribbled_header_is_caught_although_the_bin_remembers_its_size)
{
    attach_single(1, 16 * MiB);
    sr__error_set_rank(0);
    struct {
        size_t at;
        int64_t v;
        bool wide;
    } const bad[] = {
        {0, 60, true},             /* size: another size of the same bin */
        {HDR_DATA_DELTA, 128, true}, /* the data offset: still inside the area */
        {HDR_CHECK, 12345, true},  /* the check word alone */
        {HDR_LAYOUT, 1, false},    /* split */
    };
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        sr_block *b = sr__block_alloc(64); /* the memo now holds 64 bytes' word */
        cr_assert_not_null(b, "%s", sr_last_error());
        sr__block_unref(b);
        b = sr__block_alloc(64);
        cr_assert_not_null(b, "%s", sr_last_error());
        bad[i].wide ? poke64(b, bad[i].at, bad[i].v) : poke32(b, bad[i].at, (int32_t)bad[i].v);
        sr__error_set_text("none yet");
        sr__block_unref(b);
        cr_assert(strstr(sr_last_error(), "worker0: sr__block_unref") && strstr(sr_last_error(), "leaked"),
                  "header field at %zu set to %lld: the free took it (%s)", bad[i].at, (long long)bad[i].v,
                  sr_last_error());
        sr_block *c = sr__block_alloc(64);
        cr_assert_not_null(c, "%s", sr_last_error());
        cr_assert_neq(c, b, "the leaked block was handed out again");
        void *data;
        size_t n;
        cr_assert_eq(sr__block_check(c, &data, &n), 0, "%s", sr_last_error());
        sr__block_unref(c);
    }
    detach_single();
}

struct cache_thread {
    pthread_barrier_t go, done;
    sr_block *got;
};

/* Caches a few blocks, then (after the main thread re-attached) allocates. */
static void *cache_thread_main(void *arg)
{
    struct cache_thread *ct = arg;
    sr_block *b[8];
    for (int i = 0; i < 8; i++)
        b[i] = sr__block_alloc(64);
    for (int i = 0; i < 8; i++)
        sr__block_unref(b[i]);
    pthread_barrier_wait(&ct->go);   /* main detaches and attaches again */
    pthread_barrier_wait(&ct->done);
    ct->got = sr__block_alloc(64);
    return NULL;
}

/* The thread cache holds split blocks (header and data kept together) and
 * large ones too: 4 KiB, 16 KiB and 1 MiB come back from it, dead while
 * cached (their offsets refused, not counted as allocated), and a size of
 * another class does not take them. */
Test(heap, cached_split_and_large_blocks_are_reused)
{
    attach_single(1, 256 * MiB);
    static const size_t sizes[] = {4096, 16384, MiB};
    for (unsigned i = 0; i < 3; i++) {
        size_t n = sizes[i];
        sr_block *b = sr__block_alloc(n);
        cr_assert_not_null(b, "%s", sr_last_error());
        void *data = sr__block_data(b);
        memset(data, 0x77, n);
        uint64_t off = sr__block_to_off(b);
        sr__block_unref(b);
        cr_assert_null(sr__block_from_off(off), "%zu bytes: a cached block's offset was accepted", n);
        cr_assert_eq(sr__heap_allocated(), 0, "%zu bytes: cached blocks count as allocated", n);
        sr_block *other = sr__block_alloc(2 * n + 4096); /* another class */
        cr_assert_neq(other, b, "%zu bytes: a block of another class took the cached one", n);
        sr_block *c = sr__block_alloc(n - 1);
        cr_assert_eq(c, b, "%zu bytes: the cached block was not reused", n);
        cr_assert_eq(sr__block_data(c), data, "%zu bytes: its data moved", n);
        cr_assert_eq(sr__block_size(c), n - 1);
        cr_assert_eq(sr__block_from_off(off), c, "%s", sr_last_error());
        sr__block_unref(other);
        sr__block_unref(c);
    }
    cr_assert_eq(sr__heap_purge(), 0, "%s", sr_last_error());
    struct sr_heap_extent_stats st;
    sr__heap_extent_stats(&st);
    cr_assert_eq(st.used, 0, "the purge left %llu bytes out: the cache was not flushed", (unsigned long long)st.used);
    detach_single();
}

/* Detach destroys the arena under every thread's cache: a thread that cached
 * blocks before must not hand them out after the next attach, where the new
 * arena gives the same addresses to others. */
Test(heap, thread_cache_of_an_earlier_attach_is_dropped, .timeout = 30)
{
    attach_single(1, 16 * MiB);
    struct cache_thread ct = {0};
    pthread_barrier_init(&ct.go, NULL, 2);
    pthread_barrier_init(&ct.done, NULL, 2);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, cache_thread_main, &ct), 0);
    pthread_barrier_wait(&ct.go);
    sr__heap_detach();
    cr_assert_eq(sr__heap_attach(&seg, 0), 0, "%s", sr_last_error());
    sr_block *mine[8];
    for (int i = 0; i < 8; i++)
        mine[i] = sr__block_alloc(64);
    pthread_barrier_wait(&ct.done);
    pthread_join(th, NULL);
    cr_assert_not_null(ct.got, "%s", sr_last_error());
    for (int i = 0; i < 8; i++)
        cr_assert_neq(ct.got, mine[i], "the thread handed out a block of the destroyed arena");
    sr__block_unref(ct.got);
    for (int i = 0; i < 8; i++)
        sr__block_unref(mine[i]);
    cr_assert_eq(sr__heap_allocated(), 0);
    pthread_barrier_destroy(&ct.go);
    pthread_barrier_destroy(&ct.done);
    detach_single();
}

/* ---- a split block whose data happens to follow its header ---- */

#define SPLIT_N 4096u  /* a split block: 4096 + its header would cost the 5120 class */
#define FILLER_N 4000u /* an inline block of the 4096 class: its header does not take a 64-byte region */
#define PAGE 4096u

/* Regression: the header of a split block lies in a slab of jemalloc's
 * 64-byte class and its data in an allocation of its own. When the header is
 * the last region of its slab page and the data is the first byte of the
 * next page (a slab of the 4096 class, or a large extent whose random
 * cache-line offset is 0), the data follows the header at exactly 64 bytes,
 * and the header check took that data offset for the inline layout's:
 * "has data that runs past the end of its heap area". A receiver refused the
 * block (heap_mp/many_pushers_one_draining_owner failed so once under heavy
 * load, where many split headers were live at once and filled their slab
 * page), and the owner's free leaked it as corrupt. Built here on purpose:
 * the page after the header slab taken by a 4096-class filler, the slab's
 * regions 1..62 by split headers (whose data lies elsewhere), the filler
 * freed, so the next split block gets region 63 for its header and that
 * page for its data. Checked by a receiver's look, the owner's free and the
 * drain of the remote-free list (which cut the list there). */
Test(heap, split_block_whose_data_follows_its_header_is_valid, .timeout = 30)
{
    attach_single(1, 64 * MiB);
    sr__error_set_rank(0);
    size_t base = sr__heap_allocated();
    sr_block *held[63], *filler[64];
    held[0] = sr__block_alloc(SPLIT_N);
    cr_assert_not_null(held[0], "%s", sr_last_error());
    uintptr_t slab = (uintptr_t)held[0] & ~(uintptr_t)(PAGE - 1);
    cr_assert_eq((uintptr_t)held[0], slab, "setup: the first split header is not the first region of a page");
    unsigned nf = 0; /* fillers of the 4096 class until one takes the page after the header slab */
    do {
        filler[nf] = sr__block_alloc(FILLER_N);
        cr_assert_not_null(filler[nf], "%s", sr_last_error());
    } while ((uintptr_t)filler[nf++] != slab + PAGE && nf < 64);
    cr_assert_eq((uintptr_t)filler[nf - 1], slab + PAGE, "setup: no filler took the page after the header slab");
    for (unsigned i = 1; i < 63; i++) {
        held[i] = sr__block_alloc(64u << 10); /* split too; its data is a large extent */
        cr_assert_not_null(held[i], "%s", sr_last_error());
        cr_assert_eq((uintptr_t)held[i], slab + 64 * i, "setup: split header %u is not region %u of the slab", i, i);
    }
    sr__block_unref(filler[--nf]);
    cr_assert_eq(sr__heap_purge(), 0, "%s", sr_last_error()); /* the filler leaves the thread cache */
    sr_block *b = sr__block_alloc(SPLIT_N);
    cr_assert_not_null(b, "%s", sr_last_error());
    cr_assert(b == (sr_block *)(slab + PAGE - 64) && sr__block_data(b) == (char *)b + 64,
              "setup: header %p and data %p are not adjacent (header slab page %#lx)", (void *)b, sr__block_data(b),
              (unsigned long)slab);
    uint64_t off = sr__block_to_off(b);
    cr_assert_eq(sr__block_from_off(off), b, "a valid block was refused: %s", sr_last_error());
    void *data;
    size_t n;
    cr_assert_eq(sr__block_check(b, &data, &n), 0, "%s", sr_last_error());
    cr_assert(data == (char *)b + 64 && n == SPLIT_N);
    sr__error_set_text("none yet");
    sr__block_unref(b);
    cr_assert(!strstr(sr_last_error(), "leaked"), "the owner's free leaked a valid block: %s", sr_last_error());
    /* Again, freed by a peer: the same block comes back from the thread's
     * bin, and is put on our remote-free list as a peer's last unref does
     * (its reference count 0, linked, the head set); the drain takes it. */
    cr_assert_eq(sr__block_alloc(SPLIT_N), b, "the cached block was not reused");
    poke32(b, HDR_REFCOUNT, 0);
    poke64(b, HDR_NEXT_FREE, 0);
    atomic_store(&sr__seg_area(&seg, 0)->remote_free, off);
    cr_assert_eq(sr__heap_drain(), 1, "the drain refused a valid block on the remote-free list");
    while (nf)
        sr__block_unref(filler[--nf]);
    for (unsigned i = 0; i < 63; i++)
        sr__block_unref(held[i]);
    cr_assert_eq(sr__heap_allocated(), base, "%zu bytes still allocated", sr__heap_allocated() - base);
    detach_single();
}
