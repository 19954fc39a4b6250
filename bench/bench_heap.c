/* Shared-heap benchmarks (sr_spawn; no shmrun needed).
 *
 *   bench_heap [rounds]
 *
 * 1. alloc + free of one block in the worker's shared arena against plain
 *    malloc + free of the same size, in the same process and run: 64 B,
 *    4 KiB, 1 MiB. Batches of BATCH pairs are timed; p50/p99 per pair.
 * 2. Passing a block between two workers and back: rank 0 takes a reference
 *    for rank 1 and sends the offset; rank 1 resolves it, reads one cache
 *    line, sends it back and drops its reference. The round trip for 4 B ..
 *    1 GiB is printed next to a memcpy of the same size (what a copying
 *    transport pays at least once per direction), measured in the same run.
 * 3. The full life of a remote free: rank 0 allocates 64 B and gives it away;
 *    rank 1 drops the last reference (a push onto rank 0's list), answers, and
 *    rank 0's next wait or allocation drains it. Printed next to (2) at 64 B.
 *
 * Every timing is checked after the fact (the byte read back, the arena back
 * at its baseline), and one line per configuration says what it measured.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "heap.h"
#include "shmrpc/spawn.h"
#include "xport.h"

#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)
#define BATCH 16
#define WAIT_NS (30ll * 1000000000)

enum { MSG_PASS = 1, MSG_GIVE = 2, MSG_BACK = 3, MSG_STOP = 4 };

static long rounds = 2000;
static volatile uint8_t sink; /* defeats dead-code elimination */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static void percentiles(int64_t *v, long n, double *p50, double *p99)
{
    qsort(v, (size_t)n, sizeof(v[0]), cmp_i64);
    *p50 = (double)v[n / 2];
    *p99 = (double)v[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1];
}

static const char *human(uint64_t n, char *buf, size_t len)
{
    if (n >= GiB && n % GiB == 0)
        snprintf(buf, len, "%llu GiB", (unsigned long long)(n / GiB));
    else if (n >= MiB && n % MiB == 0)
        snprintf(buf, len, "%llu MiB", (unsigned long long)(n / MiB));
    else if (n >= 1024 && n % 1024 == 0)
        snprintf(buf, len, "%llu KiB", (unsigned long long)(n / 1024));
    else
        snprintf(buf, len, "%llu B", (unsigned long long)n);
    return buf;
}

/* ---- 1. alloc + free ---- */

static int64_t shared_batch(size_t size)
{
    int64_t t0 = sr_now_ns();
    for (int i = 0; i < BATCH; i++) {
        sr_block *b = sr_block_alloc(size);
        if (!b)
            return -1;
        ((volatile uint8_t *)sr_block_data(b))[0] = (uint8_t)i;
        sr_block_unref(b);
    }
    return sr_now_ns() - t0;
}

static int64_t malloc_batch(size_t size)
{
    int64_t t0 = sr_now_ns();
    for (int i = 0; i < BATCH; i++) {
        volatile uint8_t *p = malloc(size);
        if (!p)
            return -1;
        p[0] = (uint8_t)i;
        free((void *)p);
    }
    return sr_now_ns() - t0;
}

static int time_batches(int64_t (*batch)(size_t), size_t size, int64_t *v, long n, double *p50, double *p99)
{
    for (long i = 0; i < n / 10 + 10; i++) /* warm up */
        if (batch(size) < 0)
            return -1;
    for (long i = 0; i < n; i++)
        if ((v[i] = batch(size)) < 0)
            return -1;
    percentiles(v, n, p50, p99);
    *p50 /= BATCH;
    *p99 /= BATCH;
    return 0;
}

static int alloc_worker(int rank, int world, void *arg)
{
    (void)rank, (void)world, (void)arg;
    sr_xport *x;
    if (sr_xport_attach(NULL, &x)) {
        fprintf(stderr, "bench_heap: %s\n", sr_last_error());
        return 1;
    }
    static const size_t sizes[] = {64, 4096, MiB};
    int64_t *v = malloc((size_t)rounds * sizeof(*v));
    size_t base = sr_heap_allocated();
    int rc = v ? 0 : 1;
    for (size_t i = 0; !rc && i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        double s50, s99, m50, m99;
        char h[32];
        rc = time_batches(shared_batch, sizes[i], v, rounds, &s50, &s99) ||
             time_batches(malloc_batch, sizes[i], v, rounds, &m50, &m99);
        if (!rc)
            printf("heap alloc+free %-8s shared arena p50 %7.1f ns p99 %7.1f ns | malloc p50 %7.1f ns p99 %7.1f ns | "
                   "ratio %.2f\n",
                   human(sizes[i], h, sizeof(h)), s50, s99, m50, m99, s50 / m50);
    }
    if (!rc && sr_heap_allocated() != base) {
        fprintf(stderr, "bench_heap: the arena holds %zu bytes after the run, %zu before\n", sr_heap_allocated(), base);
        rc = 1;
    }
    if (rc && errno == ENOMEM)
        fprintf(stderr, "bench_heap: %s\n", sr_last_error());
    free(v);
    sr_xport_detach(x);
    return rc;
}

/* ---- 2 and 3. passing blocks between two workers ---- */

static int next_msg(sr_xport *x, sr_msg *m)
{
    int64_t deadline = sr_now_ns() + WAIT_NS;
    while (!sr_xport_recv_burst(x, m, 1)) {
        int ev = sr_xport_wait(x, deadline);
        if (ev < 0)
            return ev;
        if ((ev & SR_WAKE_PEER) && !sr_ring_ready(x->inbox) && (ev = sr_xport_check_peers(x)))
            return ev;
        if ((ev & SR_WAKE_TIMEOUT) && !sr_ring_ready(x->inbox))
            return sr__fail(-ETIMEDOUT, "bench_heap", "rank %d: no message for 30 s", x->rank);
    }
    return 0;
}

static int send_off(sr_xport *x, int to, uint16_t type, uint64_t off)
{
    sr_msg m = {.type = type};
    memcpy(m.data, &off, sizeof(off));
    return sr_xport_send_wait(x, to, &m, sr_now_ns() + WAIT_NS);
}

/* Rank 1: resolve, read one line, answer, let go. */
static int echo(sr_xport *x)
{
    for (;;) {
        sr_msg m;
        uint64_t off;
        int rc = next_msg(x, &m);
        if (rc || m.type == MSG_STOP)
            return rc;
        memcpy(&off, m.data, sizeof(off));
        sr_block *b = sr_block_from_off(off);
        if (!b)
            return -EINVAL;
        sink = *(volatile uint8_t *)sr_block_data(b);
        if ((rc = send_off(x, 0, MSG_BACK, off)))
            return rc;
        sr_block_unref(b); /* the last reference for MSG_GIVE: a remote free */
    }
}

/* One round trip of block b; its reference for rank 1 travels with it. */
static int64_t pass_once(sr_xport *x, sr_block *b)
{
    int64_t t0 = sr_now_ns();
    sr_msg m;
    if (send_off(x, 1, MSG_PASS, sr_block_to_off(sr_block_ref(b))) || next_msg(x, &m) || m.type != MSG_BACK)
        return -1;
    return sr_now_ns() - t0;
}

static int pass_rtt(sr_xport *x, size_t size, int64_t *v, long n, double *p50, double *p99)
{
    sr_block *b = sr_block_alloc(size);
    if (!b)
        return -1;
    ((uint8_t *)sr_block_data(b))[0] = 0x5a;
    for (long i = 0; i < n / 10 + 10; i++)
        if (pass_once(x, b) < 0)
            return -1;
    for (long i = 0; i < n; i++)
        if ((v[i] = pass_once(x, b)) < 0)
            return -1;
    percentiles(v, n, p50, p99);
    /* rank 1 drops its reference after answering: wait until it has */
    for (int64_t until = sr_now_ns() + WAIT_NS; sr_block_refcount(b) != 1 && sr_now_ns() < until;)
        sched_yield();
    int ok = sr_block_refcount(b) == 1 && ((uint8_t *)sr_block_data(b))[0] == 0x5a;
    sr_block_unref(b);
    return ok ? 0 : -1;
}

/* memcpy of size bytes, both buffers already faulted in. */
static int copy_time(size_t size, long n, double *p50)
{
    uint8_t *src = malloc(size), *dst = malloc(size);
    int64_t v[64];
    if (!src || !dst || n > 64) {
        free(src), free(dst);
        return -1;
    }
    memset(src, 0x33, size);
    memset(dst, 0, size);
    for (long i = 0; i < n; i++) {
        int64_t t0 = sr_now_ns();
        memcpy(dst, src, size);
        v[i] = sr_now_ns() - t0;
        sink = dst[(size_t)i * 4099 % size];
    }
    int ok = dst[size - 1] == 0x33;
    percentiles(v, n, p50, &(double){0});
    free(src), free(dst);
    return ok ? 0 : -1;
}

static int report_pass(sr_xport *x, size_t size, int64_t *v, double *floor_p50)
{
    double p50, p99, c50;
    long copies = size <= MiB ? 50 : size <= 64 * MiB ? 10 : 3;
    char h[32];
    if (pass_rtt(x, size, v, rounds, &p50, &p99) || copy_time(size, copies, &c50))
        return -1;
    if (*floor_p50 == 0)
        *floor_p50 = p50;
    printf("heap pass %-8s round trip p50 %8.2f us p99 %8.2f us (%.2fx the 4 B trip) | memcpy p50 %10.2f us "
           "(%.2f GiB/s) | one copy / round trip %.1f\n",
           human(size, h, sizeof(h)), p50 / 1e3, p99 / 1e3, p50 / *floor_p50, c50 / 1e3,
           (double)size / (double)GiB / (c50 / 1e9), c50 / p50);
    return 0;
}

/* (3): allocate 64 B, give it away, and have it come back by drain. */
static int give_rtt(sr_xport *x, int64_t *v, long n, double *p50, double *p99)
{
    size_t base = sr_heap_allocated();
    for (long i = -(n / 10 + 10); i < n; i++) {
        int64_t t0 = sr_now_ns();
        sr_block *b = sr_block_alloc(64); /* drains the blocks given away before */
        sr_msg m;
        if (!b || send_off(x, 1, MSG_GIVE, sr_block_to_off(b)) || next_msg(x, &m) || m.type != MSG_BACK)
            return -1;
        if (i >= 0)
            v[i] = sr_now_ns() - t0;
    }
    percentiles(v, n, p50, p99);
    sr_heap_counters c;
    for (int64_t until = sr_now_ns() + WAIT_NS; sr_now_ns() < until;) {
        sr_heap_drain();
        sr_heap_counters_get(&c);
        if (c.drained == c.allocs - c.local_frees)
            break;
        sched_yield();
    }
    return sr_heap_allocated() == base ? 0 : -1;
}

static int drive(sr_xport *x)
{
    static const size_t sizes[] = {4, 4096, MiB, 64 * MiB, 256 * MiB, GiB};
    int64_t *v = malloc((size_t)rounds * sizeof(*v));
    double floor_p50 = 0, g50, g99;
    int rc = v ? 0 : -ENOMEM;
    for (size_t i = 0; !rc && i < sizeof(sizes) / sizeof(sizes[0]); i++)
        rc = report_pass(x, sizes[i], v, &floor_p50);
    if (!rc && !(rc = give_rtt(x, v, rounds, &g50, &g99)))
        printf("heap alloc+give+remote free 64 B  round trip p50 %8.2f us p99 %8.2f us (%.2fx the 4 B pass; "
               "includes the owner's drain)\n",
               g50 / 1e3, g99 / 1e3, g50 / floor_p50);
    free(v);
    int stop = send_off(x, 1, MSG_STOP, 0);
    return rc ? rc : stop;
}

static int pass_worker(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    sr_xport *x;
    if (sr_xport_attach(NULL, &x)) {
        fprintf(stderr, "bench_heap: %s\n", sr_last_error());
        return 1;
    }
    int rc = rank == 0 ? drive(x) : echo(x);
    if (rc)
        fprintf(stderr, "bench_heap: rank %d failed (%d): %s\n", rank, rc, sr_last_error());
    else if (rank == 0)
        printf("heap pass: 2 workers, %d CPUs, %llu spin hits, %llu sleeps on rank 0\n", x->ncpu,
               (unsigned long long)x->st.spin_hits, (unsigned long long)x->st.sleeps);
    sr_xport_detach(x);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        rounds = atol(argv[1]);
    if (rounds < 100)
        rounds = 100;
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("bench_heap: %ld timed rounds per configuration\n", rounds);
    sr_spawn_opts small = {.name_prefix = "bench_heap"};
    int rc = sr_spawn(1, alloc_worker, NULL, &small);
    /* 1 GiB of data, its header and jemalloc's metadata, per worker (sparse) */
    sr_spawn_opts big = {.name_prefix = "bench_heap", .shm_size = 2 * (GiB + 64 * MiB) + 64 * MiB};
    if (!rc)
        rc = sr_spawn(2, pass_worker, NULL, &big);
    if (rc)
        fprintf(stderr, "bench_heap: %s\n", sr_last_error());
    return rc ? 1 : 0;
}
