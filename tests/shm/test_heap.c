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
 * Suite heap_mp (integration, sr_spawn): blocks passed by offset between
 * processes and freed by whoever drops the last reference, the owner seeing
 * them come back through its remote-free list and its arena returning to its
 * baseline; many producers pushing onto one list while its owner drains;
 * exhaustion that recovers once a peer lets go; a 1 GiB block, sparse,
 * passed by offset; detach and attach again.
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
#include "shm/xport.h"

LEAK_CHECKED_SUITE(heap);
LEAK_CHECKED_SUITE(heap_mp);

#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)
#define WAIT_NS (20ll * 1000000000)
#define EDGE 256 /* bytes stamped at each end of a block */

/* ---- helpers shared by both suites ---- */

static uint8_t pattern(uint64_t stamp, uint64_t i) { return (uint8_t)((stamp * 0x9e3779b97f4a7c15ull + i * 31) >> 7); }

/* Stamp both ends of the block (the whole block when it is small). */
static void fill(sr_block *b, uint64_t stamp)
{
    uint8_t *d = sr_block_data(b);
    uint64_t n = sr_block_size(b), edge = n < EDGE ? n : EDGE;
    for (uint64_t i = 0; i < edge; i++) {
        d[i] = pattern(stamp, i);
        d[n - 1 - i] = pattern(stamp, n - 1 - i);
    }
}

/* The first index whose byte is not the stamp's, or -1. */
static int64_t first_bad(const sr_block *b, uint64_t stamp)
{
    const uint8_t *d = sr_block_data(b);
    uint64_t n = sr_block_size(b), edge = n < EDGE ? n : EDGE;
    for (uint64_t i = 0; i < edge; i++) {
        if (d[i] != pattern(stamp, i))
            return (int64_t)i;
        if (d[n - 1 - i] != pattern(stamp, n - 1 - i))
            return (int64_t)(n - 1 - i);
    }
    return -1;
}

/* Bytes of memory the memfd holds (pages written and not punched). */
static uint64_t memfd_bytes(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 ? (uint64_t)st.st_blocks * 512 : UINT64_MAX;
}

static uint64_t seg_size_for(int world, uint64_t heap_each)
{
    return sr_segment_fixed_size(world, SR_RING_SLOTS_DEFAULT) + (uint64_t)world * heap_each;
}

/* ---- single process ---- */

static sr_segment seg; /* Criterion runs each test in its own process */

static void attach_single(int world, uint64_t heap_each)
{
    sr_segment_opts o = {.world_size = world, .size = seg_size_for(world, heap_each), .name = test_ns("heap")};
    cr_assert_eq(sr_segment_create(&o, &seg), 0, "%s", sr_last_error());
    cr_assert_eq(sr_heap_attach(&seg, 0), 0, "%s", sr_last_error());
    cr_assert(sr_heap_attached());
}

static void detach_single(void)
{
    sr_heap_detach();
    cr_assert(!sr_heap_attached());
    sr_segment_detach(&seg, true);
}

/* Header and data both lie in rank's heap area. */
static bool inside_area(const sr_block *b, int rank)
{
    const char *lo = sr_seg_heap(&seg, rank), *hi = lo + seg.hdr->heap_stride;
    const char *d = sr_block_data(b);
    return (const char *)b >= lo && (const char *)b + 64 <= hi && d >= lo && d + sr_block_size(b) <= hi;
}

Test(heap, private_blocks_before_attach)
{
    cr_assert(!sr_heap_attached());
    sr_block *b = sr_block_alloc(100);
    cr_assert_not_null(b, "%s", sr_last_error());
    cr_assert_eq(sr_block_owner(b), -1);
    cr_assert_eq(sr_block_size(b), 100);
    cr_assert_eq((uintptr_t)sr_block_data(b) % 64, 0);
    cr_assert_eq(sr_block_to_off(b), UINT64_MAX, "a private block has no offset");
    cr_assert_null(sr_block_from_off(4096));
    cr_assert(strstr(sr_last_error(), "no shared heap attached"), "%s", sr_last_error());
    cr_assert_eq(sr_block_refcount(sr_block_ref(b)), 2);
    sr_block_unref(b);
    cr_assert_eq(sr_block_refcount(b), 1);
    sr_block_unref(b); /* frees it: ASan reports a leak otherwise */
    cr_assert_eq(sr_heap_allocated(), 0);
    cr_assert_eq(sr_heap_drain(), 0);
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
        uintptr_t d = (uintptr_t)sr_block_data(blocks[i]);
        sp[2 * i] = (struct span){(uintptr_t)blocks[i], (uintptr_t)blocks[i] + 64};
        sp[2 * i + 1] = (struct span){d, d + sr_block_size(blocks[i])};
    }
    qsort(sp, 2 * n, sizeof(sp[0]), by_address);
    for (size_t i = 0; i + 1 < 2 * n; i++)
        cr_assert_leq(sp[i].hi, sp[i + 1].lo, "blocks overlap: [%#lx, %#lx) and [%#lx, %#lx)", (unsigned long)sp[i].lo,
                      (unsigned long)sp[i].hi, (unsigned long)sp[i + 1].lo, (unsigned long)sp[i + 1].hi);
}

Test(heap, sizes_alignment_placement_and_round_trip_offsets, .timeout = 60)
{
    attach_single(1, 768 * MiB);
    size_t base = sr_heap_allocated(), total = 0;
    sr_block *blocks[NSIZES];
    for (size_t i = 0; i < NSIZES; i++) {
        sr_block *b = blocks[i] = sr_block_alloc(sizes[i]);
        cr_assert_not_null(b, "size %zu: %s", sizes[i], sr_last_error());
        cr_assert_eq(sr_block_size(b), sizes[i]);
        cr_assert_eq(sr_block_owner(b), 0);
        cr_assert_eq(sr_block_refcount(b), 1);
        cr_assert_eq((uintptr_t)sr_block_data(b) % 64, 0, "size %zu: data %p is not 64-byte aligned", sizes[i],
                     sr_block_data(b));
        cr_assert(inside_area(b, 0), "size %zu: block %p is not inside the heap area", sizes[i], (void *)b);
        uint64_t off = sr_block_to_off(b);
        cr_assert_eq(sr_seg_ptr(&seg, off), (void *)b);
        cr_assert_eq(sr_block_from_off(off), b, "size %zu: %s", sizes[i], sr_last_error());
        fill(b, i);
        total += sizes[i];
    }
    assert_disjoint(blocks, NSIZES);
    cr_assert_geq(sr_heap_allocated(), base + total, "jemalloc counts %zu bytes for %zu asked",
                  sr_heap_allocated() - base, total);
    for (size_t i = 0; i < NSIZES; i++) {
        cr_assert_eq(first_bad(blocks[i], i), -1, "size %zu: data was overwritten", sizes[i]);
        sr_block_unref(blocks[i]);
    }
    cr_assert_eq(sr_heap_allocated(), base, "the arena did not return to its baseline");
    sr_heap_counters c;
    sr_heap_counters_get(&c);
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
        size_t before = sr_heap_allocated();
        sr_block *b = sr_block_alloc(pow2[i]);
        cr_assert_not_null(b, "%s", sr_last_error());
        size_t cost = sr_heap_allocated() - before;
        cr_assert_lt(cost, pow2[i] + pow2[i] / 8, "a %zu-byte block costs %zu bytes of the arena", pow2[i], cost);
        cr_assert(inside_area(b, 0));
        cr_assert_eq(sr_block_from_off(sr_block_to_off(b)), b, "%s", sr_last_error());
        sr_block_unref(b);
        cr_assert_eq(sr_heap_allocated(), before);
    }
    detach_single();
}

Test(heap, refcounts_free_on_last_unref)
{
    attach_single(1, 16 * MiB);
    size_t base = sr_heap_allocated();
    sr_block *b = sr_block_alloc(1000);
    cr_assert_not_null(b, "%s", sr_last_error());
    uint64_t off = sr_block_to_off(b);
    cr_assert_eq(sr_block_ref(b), b);
    cr_assert_eq(sr_block_ref(b), b);
    cr_assert_eq(sr_block_refcount(b), 3);
    sr_block_unref(b);
    sr_block_unref(b);
    cr_assert_eq(sr_block_refcount(b), 1);
    cr_assert_gt(sr_heap_allocated(), base, "still held");
    sr_block_unref(b);
    cr_assert_eq(sr_heap_allocated(), base, "the last unref frees");
    cr_assert_null(sr_block_from_off(off), "a freed block's offset is rejected");
    cr_assert(strstr(sr_last_error(), "freed"), "%s", sr_last_error());
    sr_block_unref(NULL);
    detach_single();
}

static void assert_rejected(uint64_t off, const char *why)
{
    cr_assert_null(sr_block_from_off(off), "offset %llu was accepted", (unsigned long long)off);
    cr_assert(strstr(sr_last_error(), "sr_block_from_off"), "%s", sr_last_error());
    cr_assert(strstr(sr_last_error(), why), "offset %llu: expected '%s' in: %s", (unsigned long long)off, why,
              sr_last_error());
}

Test(heap, bad_offsets_are_rejected)
{
    attach_single(2, 16 * MiB);
    const struct sr_seg_header *h = seg.hdr;
    sr_block *a = sr_block_alloc(100), *freed = sr_block_alloc(64); /* small: data follows the header */
    cr_assert(a && freed, "%s", sr_last_error());
    uint64_t a_off = sr_block_to_off(a), freed_off = sr_block_to_off(freed);
    sr_block_unref(freed);
    uint64_t end = h->heap_off + h->world_size * h->heap_stride;

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
    char *rank1 = sr_seg_heap(&seg, 1);
    memcpy(rank1, a, 64);
    assert_rejected(sr_seg_off(&seg, rank1), "owner");
    char *last = (char *)sr_seg_heap(&seg, 0) + h->heap_stride - 64; /* never carved in a 16 MiB heap */
    memcpy(last, a, 64);
    assert_rejected(sr_seg_off(&seg, last), "runs past the end");
    memset(rank1, 0, 64);
    memset(last, 0, 64);

    cr_assert_eq(sr_block_from_off(a_off), a, "the real block is still accepted: %s", sr_last_error());
    sr_block_unref(a);
    detach_single();
}

/* Write a block of size bytes in full, free it (and purge if asked), and
 * check that its pages left the memfd and that the range is reused zeroed. */
static void check_pages_given_back(size_t size, bool purge)
{
    uint64_t before = memfd_bytes(seg.fd);
    sr_block *b = sr_block_alloc(size);
    cr_assert_not_null(b, "%s", sr_last_error());
    memset(sr_block_data(b), 0xa5, sr_block_size(b));
    uint64_t full = memfd_bytes(seg.fd);
    cr_assert_geq(full, before + size, "writing %zu bytes grew the memfd by only %llu", size,
                  (unsigned long long)(full - before));
    struct sr_heap_extent_stats s0, s1;
    sr__heap_extent_stats(&s0);
    sr_block_unref(b);
    if (purge)
        cr_assert_eq(sr_heap_purge(), 0, "%s", sr_last_error());
    sr__heap_extent_stats(&s1);
    uint64_t after = memfd_bytes(seg.fd);
    cr_assert_geq(s1.punched - s0.punched, size, "%zu bytes: free%s punched only %llu bytes", size,
                  purge ? " + purge" : "", (unsigned long long)(s1.punched - s0.punched));
    cr_assert_leq(after, before + 64 * 1024, "%zu bytes: the memfd holds %llu bytes after the free, %llu before",
                  size, (unsigned long long)after, (unsigned long long)before);
    b = sr_block_alloc(size);
    cr_assert_not_null(b, "%s", sr_last_error());
    const uint8_t *d = sr_block_data(b);
    cr_assert(d[0] == 0 && d[size / 2] == 0 && d[size - 1] == 0, "%zu bytes: a punched page came back dirty", size);
    sr_block_unref(b);
}

Test(heap, freed_pages_go_back_to_the_memfd, .timeout = 60)
{
    attach_single(1, 128 * MiB);
    sr_block *warm = sr_block_alloc(64); /* the arena's metadata pages are touched by now */
    check_pages_given_back(32 * MiB, true); /* huge: kept for reuse, punched when purged */
    check_pages_given_back(4 * MiB, true);  /* jemalloc's: punched when purged */
    sr_block_unref(warm);
    detach_single();
}

/* A freed huge block keeps its pages for the next block of the same size:
 * the memfd does not grow and nothing is punched; another size carves anew. */
Test(heap, freed_huge_block_is_reused_for_the_same_size, .timeout = 60)
{
    attach_single(1, 256 * MiB);
    sr_block *b = sr_block_alloc(32 * MiB);
    cr_assert_not_null(b, "%s", sr_last_error());
    memset(sr_block_data(b), 0x5a, 32 * MiB);
    void *first = sr_block_data(b);
    sr_block_unref(b);
    uint64_t held = memfd_bytes(seg.fd);
    struct sr_heap_extent_stats s0, s1;
    sr__heap_extent_stats(&s0);
    b = sr_block_alloc(32 * MiB);
    cr_assert_not_null(b, "%s", sr_last_error());
    cr_assert_eq(sr_block_data(b), first, "the same range comes back");
    memset(sr_block_data(b), 0x11, 32 * MiB);
    sr__heap_extent_stats(&s1);
    cr_assert_eq(s1.punched, s0.punched, "reuse punched %llu bytes", (unsigned long long)(s1.punched - s0.punched));
    cr_assert_leq(memfd_bytes(seg.fd), held + 64 * 1024, "reuse faulted new pages in");
    sr_block *other = sr_block_alloc(16 * MiB);
    cr_assert_not_null(other, "%s", sr_last_error());
    cr_assert_neq(sr_block_data(other), first, "a different size is carved anew");
    sr_block_unref(other);
    sr_block_unref(b);
    cr_assert_eq(sr_heap_allocated(), 0, "cached ranges are not counted as allocated");
    detach_single();
}

/* Regression: a freed 256 MiB block used to stay in jemalloc's retained set,
 * so a 1 GiB block no longer fitted a heap that had room for it. */
Test(heap, freed_huge_blocks_leave_room_for_a_bigger_one, .timeout = 60)
{
    attach_single(1, GiB + 32 * MiB);
    static const size_t seq[] = {MiB, 64 * MiB, 256 * MiB, 16 * MiB, GiB, 300 * MiB, GiB};
    for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]); i++) {
        sr_block *b = sr_block_alloc(seq[i]);
        cr_assert_not_null(b, "block %zu (%zu bytes): %s", i, seq[i], sr_last_error());
        ((uint8_t *)sr_block_data(b))[seq[i] - 1] = 1;
        sr_block_unref(b);
    }
    cr_assert_eq(sr_heap_allocated(), 0);
    detach_single();
}

Test(heap, attach_is_idempotent_and_exclusive)
{
    attach_single(2, 8 * MiB);
    cr_assert_eq(sr_heap_attach(&seg, 0), 0, "same segment and rank: a no-op");
    cr_assert_eq(sr_heap_attach(&seg, 1), -EBUSY);
    cr_assert(strstr(sr_last_error(), "already attached"), "%s", sr_last_error());
    sr_block *b = sr_block_alloc(100);
    cr_assert_not_null(b, "%s", sr_last_error());
    sr_block_unref(b);
    sr_heap_detach();
    cr_assert_eq(sr_heap_attach(&seg, 2), -EINVAL, "rank out of range");
    cr_assert_eq(sr_heap_attach(&seg, -1), -EINVAL);
    /* Re-attach as the other rank: a fresh arena in a fresh area. */
    cr_assert_eq(sr_heap_attach(&seg, 1), 0, "%s", sr_last_error());
    b = sr_block_alloc(100);
    cr_assert_not_null(b, "%s", sr_last_error());
    cr_assert_eq(sr_block_owner(b), 1);
    cr_assert(inside_area(b, 1));
    sr_block_unref(b);
    detach_single();
}

/* jemalloc's own bookkeeping (arena, bins, mutexes) stays in private memory:
 * nothing is carved from the area until the first block. */
Test(heap, arena_metadata_stays_out_of_the_area)
{
    attach_single(1, 64 * MiB);
    struct sr_heap_extent_stats st;
    sr__heap_extent_stats(&st);
    cr_assert_eq(st.area, seg.hdr->heap_stride);
    cr_assert_eq(st.used, 0, "attach carved %llu bytes of the area", (unsigned long long)st.used);
    sr_block *b = sr_block_alloc(64);
    cr_assert_not_null(b, "%s", sr_last_error());
    sr__heap_extent_stats(&st);
    cr_assert_gt(st.used, 0);
    sr_block_unref(b);
    detach_single();
}

/* A child forked by an attached worker must not allocate from the parent's
 * area with its copy of the arena: it forgets the heap. */
Test(heap, forked_child_forgets_the_heap)
{
    attach_single(1, 16 * MiB);
    sr_block *b = sr_block_alloc(100);
    cr_assert_not_null(b, "%s", sr_last_error());
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        sr_block *c = sr_block_alloc(100);
        int ok = !sr_heap_attached() && c && sr_block_owner(c) == -1;
        sr_block_unref(c);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child still allocated from the shared heap");
    cr_assert(sr_heap_attached());
    sr_block_unref(b);
    cr_assert_eq(sr_heap_allocated(), 0);
    detach_single();
}

/* Allocate chunk-sized blocks until the heap says no; returns how many. */
static size_t exhaust(sr_block **held, size_t max, size_t chunk)
{
    size_t n = 0;
    while (n < max && (held[n] = sr_block_alloc(chunk)))
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
    size_t base = sr_heap_allocated(), chunk = 256 << 10;
    sr_block *held[64];
    errno = 0;
    size_t n = exhaust(held, 64, chunk);
    cr_assert(n > 0 && n < 64, "%zu blocks of %zu bytes from an 8 MiB heap", n, chunk);
    cr_assert_eq(errno, ENOMEM);
    cr_assert(strstr(sr_last_error(), "sr_block_alloc") && error_names("worker %llu", 0) &&
                  error_names("%llu bytes", chunk) && error_names("%llu bytes", seg.hdr->heap_stride),
              "the error must name the worker, the size and the heap: %s", sr_last_error());
    cr_assert_null(sr_block_alloc((size_t)seg.hdr->heap_stride), "larger than the heap");
    cr_assert_null(sr_block_alloc(SIZE_MAX - 8), "no overflow");
    for (size_t i = 0; i < n; i++)
        sr_block_unref(held[i]);
    cr_assert_eq(sr_heap_allocated(), base);
    size_t again = exhaust(held, 64, chunk);
    cr_assert_eq(again, n, "after freeing everything the heap holds %zu blocks again, not %zu", again, n);
    for (size_t i = 0; i < again; i++)
        sr_block_unref(held[i]);
    detach_single();
}

/* ---- multi-process ---- */

enum { MSG_BLOCK = 1, MSG_DONE = 2, MSG_ACK = 3 };
enum { MODE_TRANSFER, MODE_SHARED, MODE_RACE }; /* who drops the last reference */

struct block_msg {
    uint64_t off, stamp, size;
    uint32_t mode;
};

static int next_msg(sr_xport *x, sr_msg *m, const char *waiting_for)
{
    int64_t deadline = sr_now_ns() + WAIT_NS;
    while (!sr_xport_recv_burst(x, m, 1)) {
        int ev = sr_xport_wait(x, deadline);
        WCHECK(ev >= 0, "rank %d: wait: %s", x->rank, sr_last_error());
        WCHECK(!(ev & SR_WAKE_PEER) || sr_ring_ready(x->inbox) || sr_xport_check_peers(x) == 0, "rank %d: %s",
               x->rank, sr_last_error());
        WCHECK(!(ev & SR_WAKE_TIMEOUT) || sr_ring_ready(x->inbox), "rank %d: nothing for 20 s while waiting for %s",
               x->rank, waiting_for);
    }
    return 0;
}

static int send_msg(sr_xport *x, int to, uint16_t type, const void *data, size_t len)
{
    sr_msg m = {.type = type};
    memcpy(m.data, data, len);
    int rc = sr_xport_send_wait(x, to, &m, sr_now_ns() + WAIT_NS);
    WCHECK(rc == 0, "rank %d: send to %d: %s", x->rank, to, sr_last_error());
    return 0;
}

static int attach(sr_xport **x)
{
    WCHECK(sr_xport_attach(NULL, x) == 0, "attach: %s", sr_last_error());
    WCHECK(sr_heap_attached(), "sr_xport_attach did not attach the heap");
    WCHECK(sr_heap_attach(&(*x)->seg, (*x)->rank) == 0, "a second attach is a no-op: %s", sr_last_error());
    return 0;
}

/* Take the block a peer sent, check it, drop our reference. */
static int consume(sr_xport *x, const sr_msg *m, uint64_t *transfers)
{
    struct block_msg bm;
    memcpy(&bm, m->data, sizeof(bm));
    sr_block *b = sr_block_from_off(bm.off);
    WCHECK(b, "rank %d: block from rank %d: %s", x->rank, m->src, sr_last_error());
    WCHECK(sr_block_owner(b) == m->src && sr_block_size(b) == bm.size, "rank %d: owner %d size %zu, sent %d %llu",
           x->rank, sr_block_owner(b), sr_block_size(b), m->src, (unsigned long long)bm.size);
    int64_t bad = first_bad(b, bm.stamp);
    WCHECK(bad < 0, "rank %d: block %llu of rank %d differs at byte %lld", x->rank, (unsigned long long)bm.stamp,
           m->src, (long long)bad);
    *transfers += bm.mode == MODE_TRANSFER;
    sr_block_unref(b);
    return 0;
}

static const size_t mp_sizes[] = {1, 24, 64, 200, 1000, 4096, 10000, 65536, 300000, (1 << 20) + 3};

/* Allocate, stamp and send one block; keep our reference if mode says so. */
static int send_block(sr_xport *x, int to, uint64_t stamp, uint32_t mode, unsigned *seed, sr_block **kept)
{
    size_t size = mp_sizes[(unsigned)rand_r(seed) % (sizeof(mp_sizes) / sizeof(mp_sizes[0]))];
    sr_block *b = sr_block_alloc(size);
    WCHECK(b, "rank %d: %s", x->rank, sr_last_error());
    fill(b, stamp);
    if (mode != MODE_TRANSFER)
        sr_block_ref(b); /* one reference travels, one stays */
    struct block_msg bm = {sr_block_to_off(b), stamp, size, mode};
    if (send_msg(x, to, MSG_BLOCK, &bm, sizeof(bm)))
        return 1;
    if (mode == MODE_RACE)
        sr_block_unref(b); /* races with the receiver's unref */
    *kept = mode == MODE_SHARED ? b : NULL;
    return 0;
}

#define RING_K 300

/* Every worker sends RING_K blocks to the next and consumes the previous
 * one's. A third are transferred (the receiver frees them: a remote free),
 * a third shared (the owner frees them after DONE), a third raced. */
static int ring_worker(int rank, int world, void *arg)
{
    (void)arg;
    sr_xport *x;
    if (attach(&x))
        return 1;
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    size_t base = sr_heap_allocated();
    sr_block *kept[RING_K];
    unsigned seed = 17u * (unsigned)rank + 1, nkept = 0;
    for (unsigned i = 0; i < RING_K; i++) {
        if (send_block(x, next, (uint64_t)rank << 32 | i, i % 3, &seed, &kept[nkept]))
            return 1;
        nkept += kept[nkept] != NULL;
    }
    uint64_t received = 0, transfers_in = 0;
    bool done = false;
    while (received < RING_K || !done) {
        sr_msg m;
        if (next_msg(x, &m, received < RING_K ? "blocks" : "DONE"))
            return 1;
        if (m.type == MSG_DONE) {
            WCHECK(m.src == next, "rank %d: DONE from %d", rank, m.src);
            done = true;
        } else if (consume(x, &m, &transfers_in) || (++received == RING_K && send_msg(x, prev, MSG_DONE, "", 0))) {
            return 1;
        }
    }
    /* next sent DONE after its last unref: every push it made is on our list */
    for (unsigned i = 0; i < nkept; i++) {
        WCHECK(sr_block_refcount(kept[i]) == 1, "rank %d: a shared block still has %u references", rank,
               sr_block_refcount(kept[i]));
        sr_block_unref(kept[i]);
    }
    sr_heap_drain();
    sr_heap_counters c;
    sr_heap_counters_get(&c);
    uint64_t transfers_out = (RING_K + 2) / 3;
    WCHECK(c.allocs == RING_K && c.local_frees + c.drained == RING_K, "rank %d: %llu allocs, %llu local + %llu drained",
           rank, (unsigned long long)c.allocs, (unsigned long long)c.local_frees, (unsigned long long)c.drained);
    WCHECK(c.drained >= transfers_out && c.local_frees >= nkept, "rank %d: only %llu blocks came back by drain",
           rank, (unsigned long long)c.drained);
    WCHECK(c.remote_pushes >= transfers_in, "rank %d: %llu pushes for %llu transferred blocks", rank,
           (unsigned long long)c.remote_pushes, (unsigned long long)transfers_in);
    WCHECK(sr_heap_allocated() == base, "rank %d: arena holds %zu bytes, baseline %zu", rank, sr_heap_allocated(),
           base);
    sr_xport_detach(x);
    return 0;
}

Test(heap_mp, pass_and_free_by_non_owner_returns_to_baseline, .timeout = 120)
{
    sr_spawn_opts o = {.name_prefix = test_ns("heapring")};
    int rc = sr_spawn(3, ring_worker, NULL, &o);
    cr_assert_eq(rc, 0, "%s", sr_last_error());
}

#define FAN_K 1500

/* Rank 0 hands FAN_K blocks to each peer; they all free them at once, so
 * their pushes race on rank 0's list while rank 0 drains it. */
static int fan_worker(int rank, int world, void *arg)
{
    (void)arg;
    sr_xport *x;
    if (attach(&x))
        return 1;
    size_t base = sr_heap_allocated();
    unsigned seed = 5;
    if (rank == 0) {
        for (unsigned i = 0; i < FAN_K * (unsigned)(world - 1); i++) {
            sr_block *none;
            if (send_block(x, 1 + (int)(i % (unsigned)(world - 1)), i, MODE_TRANSFER, &seed, &none))
                return 1;
        }
        for (int done = 0; done < world - 1; done++) {
            sr_msg m;
            if (next_msg(x, &m, "DONE from every peer"))
                return 1;
            WCHECK(m.type == MSG_DONE, "rank 0: message type %u", m.type);
        }
        sr_heap_drain();
        sr_heap_counters c;
        sr_heap_counters_get(&c);
        WCHECK(c.drained == c.allocs && c.allocs == FAN_K * (uint64_t)(world - 1),
               "rank 0: %llu allocated, %llu came back", (unsigned long long)c.allocs, (unsigned long long)c.drained);
        WCHECK(sr_heap_allocated() == base, "rank 0: arena holds %zu bytes, baseline %zu", sr_heap_allocated(), base);
    } else {
        uint64_t transfers = 0;
        for (unsigned i = 0; i < FAN_K; i++) {
            sr_msg m;
            if (next_msg(x, &m, "blocks from rank 0") || consume(x, &m, &transfers))
                return 1;
        }
        sr_heap_counters c;
        sr_heap_counters_get(&c);
        WCHECK(c.remote_pushes == FAN_K, "rank %d: %llu pushes", rank, (unsigned long long)c.remote_pushes);
        if (send_msg(x, 0, MSG_DONE, "", 0))
            return 1;
    }
    sr_xport_detach(x);
    return 0;
}

Test(heap_mp, many_pushers_one_draining_owner, .timeout = 120)
{
    sr_spawn_opts o = {.name_prefix = test_ns("heapfan")};
    int rc = sr_spawn(4, fan_worker, NULL, &o);
    cr_assert_eq(rc, 0, "%s", sr_last_error());
}

#define CHUNK (256u << 10)
#define SMALL_HEAP (8 * MiB)

/* Rank 1: free every block rank 0 sends, then say how many. */
static int free_all_received(sr_xport *x)
{
    uint64_t consumed = 0, transfers = 0;
    for (;;) {
        sr_msg m;
        if (next_msg(x, &m, "blocks from rank 0"))
            return 1;
        if (m.type == MSG_DONE)
            break;
        if (consume(x, &m, &transfers))
            return 1;
        consumed++;
    }
    return send_msg(x, 0, MSG_DONE, &consumed, sizeof(consumed));
}

/* Rank 0 fills its heap, hands every block to rank 1, and once rank 1 has
 * let go can fill it again: the frees came back through the remote-free list. */
static int exhaust_worker(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    sr_xport *x;
    if (attach(&x))
        return 1;
    if (rank == 1) {
        int rc = free_all_received(x);
        sr_xport_detach(x);
        return rc;
    }
    size_t base = sr_heap_allocated();
    sr_block *held[128];
    errno = 0;
    size_t n = exhaust(held, 128, CHUNK);
    WCHECK(n > 0 && n < 128 && errno == ENOMEM, "rank 0: %zu blocks, errno %d", n, errno);
    WCHECK(strstr(sr_last_error(), "worker 0") && error_names("%llu bytes", CHUNK) &&
               error_names("%llu bytes", x->seg.hdr->heap_stride),
           "the error must name the worker, the size and the heap: %s", sr_last_error());
    for (size_t i = 0; i < n; i++) {
        struct block_msg bm = {sr_block_to_off(held[i]), i, CHUNK, MODE_TRANSFER};
        fill(held[i], i);
        if (send_msg(x, 1, MSG_BLOCK, &bm, sizeof(bm)))
            return 1;
    }
    sr_msg m;
    uint64_t freed = 0;
    if (send_msg(x, 1, MSG_DONE, "", 0) || next_msg(x, &m, "DONE from rank 1"))
        return 1;
    memcpy(&freed, m.data, sizeof(freed));
    WCHECK(freed == n, "rank 1 freed %llu of %zu blocks", (unsigned long long)freed, n);
    size_t again = exhaust(held, 128, CHUNK); /* sr_block_alloc drains first */
    WCHECK(again == n, "rank 0: %zu blocks fit after the remote frees, %zu before", again, n);
    for (size_t i = 0; i < again; i++)
        sr_block_unref(held[i]);
    WCHECK(sr_heap_allocated() == base, "rank 0: %zu bytes still allocated", sr_heap_allocated());
    sr_xport_detach(x);
    return 0;
}

Test(heap_mp, exhaustion_recovers_when_a_peer_lets_go, .timeout = 60)
{
    sr_spawn_opts o = {.name_prefix = test_ns("heapoom"), .shm_size = seg_size_for(2, SMALL_HEAP)};
    int rc = sr_spawn(2, exhaust_worker, NULL, &o);
    cr_assert_eq(rc, 0, "%s", sr_last_error());
}

/* Rank 0 allocates a 1 GiB block and passes its offset; rank 1 reads both
 * ends and writes one byte in the middle, which rank 0 then sees: the same
 * pages, no copy. Only a few pages are ever touched. */
static int gig_worker(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    sr_xport *x;
    if (attach(&x))
        return 1;
    sr_msg m;
    if (rank == 1) {
        if (next_msg(x, &m, "the 1 GiB block"))
            return 1;
        struct block_msg bm;
        memcpy(&bm, m.data, sizeof(bm));
        sr_block *b = sr_block_from_off(bm.off);
        WCHECK(b && sr_block_size(b) == GiB, "rank 1: %s", b ? "wrong size" : sr_last_error());
        sr_block_ref(b);
        WCHECK(first_bad(b, bm.stamp) < 0, "rank 1: the stamps at the ends differ");
        ((uint8_t *)sr_block_data(b))[GiB / 2] = 0x5a;
        sr_block_unref(b);
        if (send_msg(x, 0, MSG_ACK, "", 0))
            return 1;
    } else {
        uint64_t before = memfd_bytes(x->seg.fd);
        sr_block *b = sr_block_alloc(GiB);
        WCHECK(b, "rank 0: %s", sr_last_error());
        fill(b, 42);
        struct block_msg bm = {sr_block_to_off(b), 42, GiB, MODE_SHARED};
        if (send_msg(x, 1, MSG_BLOCK, &bm, sizeof(bm)) || next_msg(x, &m, "the ACK"))
            return 1;
        WCHECK(((uint8_t *)sr_block_data(b))[GiB / 2] == 0x5a, "rank 0: rank 1's write is not visible");
        uint64_t grown = memfd_bytes(x->seg.fd) - before;
        WCHECK(grown < 4 * MiB, "a 1 GiB block that is touched in 3 places cost %llu bytes of memory",
               (unsigned long long)grown);
        WCHECK(sr_block_refcount(b) == 1, "rank 0: rank 1 kept a reference");
        sr_block_unref(b);
        WCHECK(sr_heap_allocated() == 0, "rank 0: %zu bytes still allocated", sr_heap_allocated());
    }
    sr_xport_detach(x);
    return 0;
}

Test(heap_mp, gigabyte_block_passed_by_offset, .timeout = 60)
{
    /* 1 GiB of data, its header, jemalloc's metadata and a little slack */
    sr_spawn_opts o = {.name_prefix = test_ns("heapgig"), .shm_size = seg_size_for(2, GiB + 32 * MiB)};
    int rc = sr_spawn(2, gig_worker, NULL, &o);
    cr_assert_eq(rc, 0, "%s", sr_last_error());
}

/* A worker may detach and attach again (sr_shutdown, then sr_init): each
 * round gets a fresh arena over an emptied area, and blocks pass as before. */
static int reattach_worker(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    for (int round = 0; round < 3; round++) {
        sr_xport *x;
        if (attach(&x))
            return 1;
        size_t base = sr_heap_allocated();
        if (rank == 1) {
            if (free_all_received(x))
                return 1;
        } else {
            sr_block *b = sr_block_alloc(3 * MiB);
            WCHECK(b, "round %d: %s", round, sr_last_error());
            fill(b, (uint64_t)round);
            struct block_msg bm = {sr_block_to_off(b), (uint64_t)round, 3 * MiB, MODE_TRANSFER};
            sr_msg m;
            if (send_msg(x, 1, MSG_BLOCK, &bm, sizeof(bm)) || send_msg(x, 1, MSG_DONE, "", 0) ||
                next_msg(x, &m, "DONE from rank 1"))
                return 1;
            sr_heap_drain();
            WCHECK(sr_heap_allocated() == base, "round %d: %zu bytes still allocated", round, sr_heap_allocated());
        }
        sr_xport_detach(x);
        WCHECK(!sr_heap_attached(), "round %d: detach left the heap attached", round);
    }
    return 0;
}

Test(heap_mp, attach_again_after_detach, .timeout = 60)
{
    sr_spawn_opts o = {.name_prefix = test_ns("heapagain"), .shm_size = seg_size_for(2, 64 * MiB)};
    int rc = sr_spawn(2, reattach_worker, NULL, &o);
    cr_assert_eq(rc, 0, "%s", sr_last_error());
}

/* ---- fragmentation (issue 11, item 6) ---- */

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
        live -= slot[i] ? sr_block_size(slot[i]) : 0;
        sr_block_unref(slot[i]);
        size_t n = churn_size(&s);
        slot[i] = live + n <= CHURN_LIVE_MAX ? sr_block_alloc(n) : NULL;
        if (slot[i])
            live += n;
        else if (live + n <= CHURN_LIVE_MAX && failures++ == 0)
            first_failed = n, first_step = step, live_at_fail = live;
    }
    struct sr_heap_extent_stats st;
    sr__heap_extent_stats(&st);
    for (unsigned i = 0; i < CHURN_SLOTS; i++)
        sr_block_unref(slot[i]);
    cr_assert_eq(failures, 0,
                 "%u allocations failed, the first of %zu bytes at step %d with %zu bytes live; at the end "
                 "%llu bytes free in %u ranges, %llu dropped",
                 failures, first_failed, first_step, live_at_fail, (unsigned long long)st.free_bytes, st.nfree,
                 (unsigned long long)st.dropped);
    cr_assert_eq(sr_heap_allocated(), 0);
    detach_single();
}

/* ---- a header a peer scribbled on (issue 11, item 7) ---- */

/* Byte offsets of the block header's fields (struct sr_block in shm/heap.c). */
#define HDR_OWNER 8
#define HDR_DATA_DELTA 32

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
    sr_block *b = sr_block_alloc(64);
    cr_assert_not_null(b, "%s", sr_last_error());
    uint64_t off = sr_block_to_off(b), stride = seg.hdr->heap_stride;
    seg.hdr->heap_stride = 0; /* what a peer's stray write did */
    cr_assert_eq(sr_block_from_off(off), b, "%s", sr_last_error());
    cr_assert_null(sr_block_from_off(off + 64 * MiB));
    cr_assert(strstr(sr_last_error(), "outside every heap area"), "%s", sr_last_error());
    sr_block_unref(b);
    seg.hdr->heap_stride = stride;
    cr_assert_eq(sr_heap_allocated(), 0);
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
    sr__error_set_rank(0); /* as sr_xport_attach does: errors name the worker */
    _Atomic uint64_t *peer_list = &sr_seg_worker(&seg, 1)->remote_free;
    sr_block *b = sr_block_alloc(64);
    cr_assert_not_null(b, "%s", sr_last_error());
    poke32(b, HDR_OWNER, 1);
    sr_block_unref(b);
    cr_assert_eq(atomic_load(peer_list), 0, "our block was pushed onto worker 1's remote-free list");
    cr_assert(strstr(sr_last_error(), "worker0: sr_block_unref") && strstr(sr_last_error(), "leaked"), "%s",
              sr_last_error());
    sr_block *c = sr_block_alloc(64);
    cr_assert_not_null(c, "%s", sr_last_error());
    uint64_t off = sr_block_to_off(c);
    poke32(c, HDR_OWNER, 1 << 30);
    cr_assert_null(sr_block_from_off(off), "a corrupt header passed as a block");
    sr_block_unref(c); /* used to write 1 << 30 worker-table entries past the table */
    cr_assert(strstr(sr_last_error(), "worker0: sr_block_unref"), "%s", sr_last_error());
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
    sr_block *b = sr_block_alloc(100);
    cr_assert_not_null(b, "%s", sr_last_error());
    uint64_t off = sr_block_to_off(b);
    sr_block_unref(b);
    cr_assert_null(sr_block_from_off(off), "a cached block's offset was accepted");
    cr_assert(strstr(sr_last_error(), "freed block"), "%s", sr_last_error());
    cr_assert_eq(sr_heap_allocated(), 0, "cached blocks count as allocated");
    sr_block *c = sr_block_alloc(90); /* the same 192-byte class */
    cr_assert_eq(c, b, "the cached block was not reused");
    cr_assert_eq(sr_block_size(c), 90);
    cr_assert_eq(sr_block_from_off(off), c, "%s", sr_last_error());
    sr_block_unref(c);
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
        b[i] = sr_block_alloc(64);
    for (int i = 0; i < 8; i++)
        sr_block_unref(b[i]);
    pthread_barrier_wait(&ct->go);   /* main detaches and attaches again */
    pthread_barrier_wait(&ct->done);
    ct->got = sr_block_alloc(64);
    return NULL;
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
    sr_heap_detach();
    cr_assert_eq(sr_heap_attach(&seg, 0), 0, "%s", sr_last_error());
    sr_block *mine[8];
    for (int i = 0; i < 8; i++)
        mine[i] = sr_block_alloc(64);
    pthread_barrier_wait(&ct.done);
    pthread_join(th, NULL);
    cr_assert_not_null(ct.got, "%s", sr_last_error());
    for (int i = 0; i < 8; i++)
        cr_assert_neq(ct.got, mine[i], "the thread handed out a block of the destroyed arena");
    sr_block_unref(ct.got);
    for (int i = 0; i < 8; i++)
        sr_block_unref(mine[i]);
    cr_assert_eq(sr_heap_allocated(), 0);
    pthread_barrier_destroy(&ct.go);
    pthread_barrier_destroy(&ct.done);
    detach_single();
}
