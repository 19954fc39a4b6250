/* SPDX-License-Identifier: MIT */
/* The shared heap across processes: suite heap_mp (integration, sr_spawn),
 * the workers joined and their block offsets passed by the shared-memory
 * transport (xport.h, private to the transport layer; the heap's
 * single-process suite is tests/shm/test_heap.c).
 *
 * Blocks passed by offset between processes and freed by whoever drops the
 * last reference, the owner seeing them come back through its remote-free
 * list and its arena returning to its baseline; many producers pushing onto
 * one list while its owner drains; exhaustion that recovers once a peer lets
 * go; a 1 GiB block, sparse, passed by offset; detach and attach again.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "error.h"
#include "heap.h"
#include "segment.h"
#include "shmrpc/spawn.h"
#include "worker_check.h"
#include "shm/xport.h"

LEAK_CHECKED_SUITE(heap_mp);

#include "heap_stamp.h"

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

/* ---- multi-process ---- */

enum { MSG_BLOCK = 1, MSG_DONE = 2, MSG_ACK = 3 };
enum { MODE_TRANSFER, MODE_SHARED, MODE_RACE }; /* who drops the last reference */

struct block_msg {
    uint64_t off, stamp, size;
    uint32_t mode;
};

static int next_msg(sr_xport *x, sr_msg *m, const char *waiting_for)
{
    int64_t deadline = sr__now_ns() + WAIT_NS;
    while (!sr__xport_recv_burst(x, m, 1)) {
        int ev = sr__xport_wait(x, deadline);
        WCHECK(ev >= 0, "rank %d: wait: %s", x->rank, sr_last_error());
        WCHECK(!(ev & SR_WAKE_PEER) || sr__ring_ready(x->inbox) || sr__xport_check_peers(x) == 0, "rank %d: %s",
               x->rank, sr_last_error());
        WCHECK(!(ev & SR_WAKE_TIMEOUT) || sr__ring_ready(x->inbox), "rank %d: nothing for 20 s while waiting for %s",
               x->rank, waiting_for);
    }
    return 0;
}

static int send_msg(sr_xport *x, int to, uint16_t type, const void *data, size_t len)
{
    sr_msg m = {.type = type};
    memcpy(m.data, data, len);
    int rc = sr__xport_send_wait(x, to, &m, sr__now_ns() + WAIT_NS);
    WCHECK(rc == 0, "rank %d: send to %d: %s", x->rank, to, sr_last_error());
    return 0;
}

static int attach(sr_xport **x)
{
    WCHECK(sr__xport_attach(NULL, x) == 0, "attach: %s", sr_last_error());
    WCHECK(sr__heap_attached(), "sr__xport_attach did not attach the heap");
    WCHECK(sr__heap_attach(&(*x)->seg, (*x)->rank) == 0, "a second attach is a no-op: %s", sr_last_error());
    return 0;
}

/* Take the block a peer sent, check it, drop our reference. */
static int consume(sr_xport *x, const sr_msg *m, uint64_t *transfers)
{
    struct block_msg bm;
    memcpy(&bm, m->data, sizeof(bm));
    sr_block *b = sr__block_recv_off(bm.off); /* the reference that came with it */
    WCHECK(b, "rank %d: block from rank %d: %s", x->rank, m->src, sr_last_error());
    WCHECK(sr__block_owner(b) == m->src && sr__block_size(b) == bm.size, "rank %d: owner %d size %zu, sent %d %llu",
           x->rank, sr__block_owner(b), sr__block_size(b), m->src, (unsigned long long)bm.size);
    int64_t bad = first_bad(b, bm.stamp);
    WCHECK(bad < 0, "rank %d: block %llu of rank %d differs at byte %lld", x->rank, (unsigned long long)bm.stamp,
           m->src, (long long)bad);
    *transfers += bm.mode == MODE_TRANSFER;
    sr__block_unref(b);
    return 0;
}

static const size_t mp_sizes[] = {1, 24, 64, 200, 1000, 4096, 10000, 65536, 300000, (1 << 20) + 3};

/* Allocate, stamp and send one block; keep our reference if mode says so. */
static int send_block(sr_xport *x, int to, uint64_t stamp, uint32_t mode, unsigned *seed, sr_block **kept)
{
    size_t size = mp_sizes[(unsigned)rand_r(seed) % (sizeof(mp_sizes) / sizeof(mp_sizes[0]))];
    sr_block *b = sr__block_alloc(size);
    WCHECK(b, "rank %d: %s", x->rank, sr_last_error());
    fill(b, stamp);
    if (mode != MODE_TRANSFER)
        sr__block_ref(b); /* one reference travels, one stays */
    struct block_msg bm = {sr__block_send_off(b), stamp, size, mode};
    if (send_msg(x, to, MSG_BLOCK, &bm, sizeof(bm)))
        return 1;
    if (mode == MODE_RACE)
        sr__block_unref(b); /* races with the receiver's unref */
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
    size_t base = sr__heap_allocated();
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
        WCHECK(sr__block_refcount(kept[i]) == 1, "rank %d: a shared block still has %u references", rank,
               sr__block_refcount(kept[i]));
        sr__block_unref(kept[i]);
    }
    sr__heap_drain();
    sr_heap_counters c;
    sr__heap_counters_get(&c);
    uint64_t transfers_out = (RING_K + 2) / 3;
    WCHECK(c.allocs == RING_K && c.local_frees + c.drained == RING_K, "rank %d: %llu allocs, %llu local + %llu drained",
           rank, (unsigned long long)c.allocs, (unsigned long long)c.local_frees, (unsigned long long)c.drained);
    WCHECK(c.drained >= transfers_out && c.local_frees >= nkept, "rank %d: only %llu blocks came back by drain",
           rank, (unsigned long long)c.drained);
    WCHECK(c.remote_pushes >= transfers_in, "rank %d: %llu pushes for %llu transferred blocks", rank,
           (unsigned long long)c.remote_pushes, (unsigned long long)transfers_in);
    WCHECK(sr__heap_allocated() == base, "rank %d: arena holds %zu bytes, baseline %zu", rank, sr__heap_allocated(),
           base);
    sr__xport_detach(x);
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
    size_t base = sr__heap_allocated();
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
        sr__heap_drain();
        sr_heap_counters c;
        sr__heap_counters_get(&c);
        WCHECK(c.drained == c.allocs && c.allocs == FAN_K * (uint64_t)(world - 1),
               "rank 0: %llu allocated, %llu came back", (unsigned long long)c.allocs, (unsigned long long)c.drained);
        WCHECK(sr__heap_allocated() == base, "rank 0: arena holds %zu bytes, baseline %zu", sr__heap_allocated(), base);
    } else {
        uint64_t transfers = 0;
        for (unsigned i = 0; i < FAN_K; i++) {
            sr_msg m;
            if (next_msg(x, &m, "blocks from rank 0") || consume(x, &m, &transfers))
                return 1;
        }
        sr_heap_counters c;
        sr__heap_counters_get(&c);
        WCHECK(c.remote_pushes == FAN_K, "rank %d: %llu pushes", rank, (unsigned long long)c.remote_pushes);
        if (send_msg(x, 0, MSG_DONE, "", 0))
            return 1;
    }
    sr__xport_detach(x);
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
        sr__xport_detach(x);
        return rc;
    }
    size_t base = sr__heap_allocated();
    sr_block *held[128];
    errno = 0;
    size_t n = exhaust(held, 128, CHUNK);
    WCHECK(n > 0 && n < 128 && errno == ENOMEM, "rank 0: %zu blocks, errno %d", n, errno);
    WCHECK(strstr(sr_last_error(), "worker 0") && error_names("%llu bytes", CHUNK) &&
               error_names("%llu bytes", x->seg.hdr->heap_stride),
           "the error must name the worker, the size and the heap: %s", sr_last_error());
    for (size_t i = 0; i < n; i++) {
        struct block_msg bm = {sr__block_send_off(held[i]), i, CHUNK, MODE_TRANSFER};
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
    size_t again = exhaust(held, 128, CHUNK); /* sr__block_alloc drains first */
    WCHECK(again == n, "rank 0: %zu blocks fit after the remote frees, %zu before", again, n);
    for (size_t i = 0; i < again; i++)
        sr__block_unref(held[i]);
    WCHECK(sr__heap_allocated() == base, "rank 0: %zu bytes still allocated", sr__heap_allocated());
    sr__xport_detach(x);
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
        sr_block *b = sr__block_from_off(bm.off);
        WCHECK(b && sr__block_size(b) == GiB, "rank 1: %s", b ? "wrong size" : sr_last_error());
        sr__block_ref(b);
        WCHECK(first_bad(b, bm.stamp) < 0, "rank 1: the stamps at the ends differ");
        ((uint8_t *)sr__block_data(b))[GiB / 2] = 0x5a;
        sr__block_unref(b);
        if (send_msg(x, 0, MSG_ACK, "", 0))
            return 1;
    } else {
        uint64_t before = memfd_bytes(x->seg.fd);
        sr_block *b = sr__block_alloc(GiB);
        WCHECK(b, "rank 0: %s", sr_last_error());
        fill(b, 42);
        struct block_msg bm = {sr__block_to_off(b), 42, GiB, MODE_SHARED};
        if (send_msg(x, 1, MSG_BLOCK, &bm, sizeof(bm)) || next_msg(x, &m, "the ACK"))
            return 1;
        WCHECK(((uint8_t *)sr__block_data(b))[GiB / 2] == 0x5a, "rank 0: rank 1's write is not visible");
        uint64_t grown = memfd_bytes(x->seg.fd) - before;
        WCHECK(grown < 4 * MiB, "a 1 GiB block that is touched in 3 places cost %llu bytes of memory",
               (unsigned long long)grown);
        WCHECK(sr__block_refcount(b) == 1, "rank 0: rank 1 kept a reference");
        sr__block_unref(b);
        WCHECK(sr__heap_allocated() == 0, "rank 0: %zu bytes still allocated", sr__heap_allocated());
    }
    sr__xport_detach(x);
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
        size_t base = sr__heap_allocated();
        if (rank == 1) {
            if (free_all_received(x))
                return 1;
        } else {
            sr_block *b = sr__block_alloc(3 * MiB);
            WCHECK(b, "round %d: %s", round, sr_last_error());
            fill(b, (uint64_t)round);
            struct block_msg bm = {sr__block_send_off(b), (uint64_t)round, 3 * MiB, MODE_TRANSFER};
            sr_msg m;
            if (send_msg(x, 1, MSG_BLOCK, &bm, sizeof(bm)) || send_msg(x, 1, MSG_DONE, "", 0) ||
                next_msg(x, &m, "DONE from rank 1"))
                return 1;
            sr__heap_drain();
            WCHECK(sr__heap_allocated() == base, "round %d: %zu bytes still allocated", round, sr__heap_allocated());
        }
        sr__xport_detach(x);
        WCHECK(!sr__heap_attached(), "round %d: detach left the heap attached", round);
    }
    return 0;
}

Test(heap_mp, attach_again_after_detach, .timeout = 60)
{
    sr_spawn_opts o = {.name_prefix = test_ns("heapagain"), .shm_size = seg_size_for(2, 64 * MiB)};
    int rc = sr_spawn(2, reattach_worker, NULL, &o);
    cr_assert_eq(rc, 0, "%s", sr_last_error());
}
