/* SPDX-License-Identifier: MIT */
/* Shared-heap benchmarks (sr_spawn; no shmrun needed).
 *
 *   bench_heap [--json] [--rounds N]   (N >= 100; default below)
 *
 * 1. alloc + free of one block in the worker's shared arena against plain
 *    malloc + free of the same size, in the same process: 64 B, 4 KiB, 1 MiB,
 *    each with its ratio to malloc and the target (at most 3x).
 *    Batches of BATCH pairs are timed, the two kinds alternating batch by
 *    batch so that noise from other processes hits both; p50/p99 per pair.
 * 2. Passing a block between two workers and back: rank 0 takes a reference
 *    for rank 1 and sends the offset; rank 1 resolves it, reads one cache
 *    line, sends it back and drops its reference. 4 B .. 1 GiB, all blocks
 *    live at once and visited round-robin within each round, so a change in
 *    machine load moves every size alike and the ratio to the 4 B trip stays
 *    honest. Printed next to a memcpy of the same size (what a copying
 *    transport pays at least once per direction), measured in the same run.
 * 3. The life of a remote free, in the same rounds: rank 0 allocates 64 B and
 *    gives it away; rank 1 answers, then drops the last reference (a push
 *    onto rank 0's list); the trip ends when rank 0 has drained it back.
 * (2) and (3) run twice: with both workers spinning (the cache-line floor)
 * and with spinning off (every trip a futex sleep/wake, the floor of a
 * sleeping callee). On a machine with fewer free cores than 2 the spinning
 * numbers mean little; the spin-hit count says how often spinning worked.
 *
 * Every timing is checked afterwards (the stamp read back, refcounts back to
 * one, the arena back at its baseline); one line per configuration.
 */
#include "bench_util.h"
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "heap.h"
#include "shmrpc/spawn.h"
#include "shm/xport.h"

#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)
#define BATCH 16
#define WAIT_NS (30ll * 1000000000)
#define SPIN_NS 200000 /* the "spin" mode's budget: longer than any trip */
#define ALLOC_TARGET 3.0 /* alloc+free of a shared block: at most this many times malloc's */

enum { MSG_PASS = 1, MSG_GIVE = 2, MSG_BACK = 3, MSG_STOP = 4, MSG_MODE = 5 };

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
    int64_t t0 = sr__now_ns();
    for (int i = 0; i < BATCH; i++) {
        sr_block *b = sr__block_alloc(size);
        if (!b)
            return -1;
        ((volatile uint8_t *)sr__block_data(b))[0] = (uint8_t)i;
        sr__block_unref(b);
    }
    return sr__now_ns() - t0;
}

static int64_t malloc_batch(size_t size)
{
    int64_t t0 = sr__now_ns();
    for (int i = 0; i < BATCH; i++) {
        volatile uint8_t *p = malloc(size);
        if (!p)
            return -1;
        p[0] = (uint8_t)i;
        free((void *)p);
    }
    return sr__now_ns() - t0;
}

static int alloc_free_line(size_t size, int64_t *vs, int64_t *vm)
{
    for (long i = -(rounds / 10 + 10); i < rounds; i++) {
        int64_t s = shared_batch(size), m = malloc_batch(size);
        if (s < 0 || m < 0)
            return -1;
        if (i >= 0)
            vs[i] = s, vm[i] = m;
    }
    double s50, s99, m50, m99;
    char h[32];
    percentiles(vs, rounds, &s50, &s99);
    percentiles(vm, rounds, &m50, &m99);
    printf("heap alloc+free %-7s shared arena p50 %7.1f ns p99 %7.1f ns | malloc p50 %6.1f ns p99 %6.1f ns | "
           "%.1fx malloc (target <= %.0fx: %s)\n",
           human(size, h, sizeof(h)), s50 / BATCH, s99 / BATCH, m50 / BATCH, m99 / BATCH, s50 / m50, ALLOC_TARGET,
           bench_verdict(s50 / m50 <= ALLOC_TARGET));
    bench_rec rec;
    bench_rec_begin(&rec, "heap alloc+free");
    bench_rec_num(&rec, "bytes", (double)size);
    bench_rec_num(&rec, "p50_ns", s50 / BATCH);
    bench_rec_num(&rec, "p99_ns", s99 / BATCH);
    bench_rec_str(&rec, "floor", "malloc+free");
    bench_rec_num(&rec, "floor_p50_ns", m50 / BATCH);
    bench_rec_num(&rec, "floor_p99_ns", m99 / BATCH);
    bench_rec_num(&rec, "ratio_p50", s50 / m50);
    bench_rec_num(&rec, "target_ratio", ALLOC_TARGET);
    bench_rec_emit(&rec);
    return 0;
}

static int alloc_worker(int rank, int world, void *arg)
{
    (void)rank, (void)world, (void)arg;
    sr_xport *x;
    if (sr__xport_attach(NULL, &x)) {
        fprintf(stderr, "bench_heap: %s\n", sr_last_error());
        return 1;
    }
    static const size_t sizes[] = {64, 4096, MiB};
    int64_t *vs = malloc((size_t)rounds * sizeof(*vs)), *vm = malloc((size_t)rounds * sizeof(*vm));
    size_t base = sr__heap_allocated();
    int rc = vs && vm ? 0 : -1;
    for (size_t i = 0; !rc && i < sizeof(sizes) / sizeof(sizes[0]); i++)
        rc = alloc_free_line(sizes[i], vs, vm);
    if (rc)
        fprintf(stderr, "bench_heap: alloc+free failed: %s\n", sr_last_error());
    else if (sr__heap_allocated() != base) {
        fprintf(stderr, "bench_heap: the arena holds %zu bytes after the run, %zu before\n", sr__heap_allocated(), base);
        rc = -1;
    }
    free(vs), free(vm);
    sr__xport_detach(x);
    return rc ? 1 : 0;
}

/* ---- 2 and 3. passing blocks between two workers ---- */

static int next_msg(sr_xport *x, sr_msg *m)
{
    int64_t deadline = sr__now_ns() + WAIT_NS;
    while (!sr__xport_recv_burst(x, m, 1)) {
        int ev = sr__xport_wait(x, deadline);
        if (ev < 0)
            return ev;
        if ((ev & SR_WAKE_PEER) && !sr__ring_ready(x->inbox) && (ev = sr__xport_check_peers(x)))
            return ev;
        if ((ev & SR_WAKE_TIMEOUT) && !sr__ring_ready(x->inbox))
            return sr__fail(-ETIMEDOUT, "bench_heap", "rank %d: no message for 30 s", x->rank);
    }
    return 0;
}

static int send_u64(sr_xport *x, int to, uint16_t type, uint64_t v)
{
    sr_msg m = {.type = type};
    memcpy(m.data, &v, sizeof(v));
    return sr__xport_send_wait(x, to, &m, sr__now_ns() + WAIT_NS);
}

static void set_spin(sr_xport *x, int64_t spin_ns)
{
    x->fixed_spin = true; /* the bench owns the policy of both ranks */
    x->spin_ns = spin_ns;
}

/* Rank 1: resolve, read one line, answer, let go. */
static int echo(sr_xport *x)
{
    for (;;) {
        sr_msg m;
        uint64_t v;
        int rc = next_msg(x, &m);
        if (rc || m.type == MSG_STOP)
            return rc;
        memcpy(&v, m.data, sizeof(v));
        if (m.type == MSG_MODE) {
            set_spin(x, (int64_t)v);
            if ((rc = send_u64(x, 0, MSG_BACK, v)))
                return rc;
            continue;
        }
        sr_block *b = sr__block_recv_off(v); /* the reference that came with the offset */
        if (!b)
            return -EINVAL;
        sink = *(volatile uint8_t *)sr__block_data(b);
        if ((rc = send_u64(x, 0, MSG_BACK, v)))
            return rc;
        sr__block_unref(b); /* for MSG_GIVE the last reference: a remote free */
    }
}

static const size_t pass_sizes[] = {4, 4096, MiB, 64 * MiB, 256 * MiB, GiB};
#define NPASS (sizeof(pass_sizes) / sizeof(pass_sizes[0]))
static size_t npass = NPASS; /* the sizes passed: all, or --smoke's first 3 (up to 1 MiB) */
#define GIVE npass /* the column of (3) */

struct pass_run {
    sr_block *blocks[NPASS];
    int64_t *v[NPASS + 1]; /* [rounds] per column */
    double copy_p50[NPASS];
};

static uint64_t drained(void)
{
    sr_heap_counters c;
    sr__heap_counters_get(&c);
    return c.drained;
}

/* Rank 1 pushes a given block right after answering: take it back here, so
 * that its dallocx is timed in (3) and not in the next trip of (2). Counted,
 * not seen: the wait for the answer (sr__xport_wait) drains too, and takes
 * the block itself when the push comes before its drain. */
static int drain_one(uint64_t off, uint64_t before)
{
    for (int64_t until = sr__now_ns() + WAIT_NS; sr__now_ns() < until;) {
        if (sr__heap_drain() || drained() > before) /* the count only when this drain found nothing */
            return 0;
        sched_yield();
    }
    return sr__fail(-ETIMEDOUT, "bench_heap", "the 64 B block given away (offset %llu) did not come back to "
                    "its owner's remote-free list within 30 s", (unsigned long long)off);
}

/* An answer other than MSG_BACK: the protocol broke. */
static int not_back(const sr_msg *m, const char *after)
{
    uint64_t v;
    memcpy(&v, m->data, sizeof(v));
    return sr__fail(-EPROTO, "bench_heap", "rank 0 got message type %u (word %llu) from rank %u after %s, "
                    "expected its answer", m->type, (unsigned long long)v, m->src, after);
}

/* One round trip; for GIVE (b == NULL) a fresh 64 B block given away and
 * drained back. */
static int64_t trip(sr_xport *x, sr_block *b)
{
    uint16_t type = b ? MSG_PASS : MSG_GIVE;
    uint64_t before = type == MSG_GIVE ? drained() : 0; /* untimed: it sums the thread caches */
    int64_t t0 = sr__now_ns();
    if (!b && !(b = sr__block_alloc(64)))
        return sr__fail(-ENOMEM, "bench_heap", "no 64 B block to give");
    if (type == MSG_PASS)
        sr__block_ref(b); /* rank 1's reference travels with the offset */
    sr_msg m;
    uint64_t off = sr__block_send_off(b);
    int rc = send_u64(x, 1, type, off);
    if (rc || (rc = next_msg(x, &m)))
        return rc;
    if (m.type != MSG_BACK)
        return not_back(&m, type == MSG_PASS ? "passing a block" : "giving a block");
    if (type == MSG_GIVE && (rc = drain_one(off, before)))
        return rc;
    return sr__now_ns() - t0;
}

static int run_rounds(sr_xport *x, struct pass_run *r)
{
    for (long i = -(rounds / 10 + 10); i < rounds; i++)
        for (size_t k = 0; k <= npass; k++) {
            int64_t t = trip(x, k < npass ? r->blocks[k] : NULL);
            if (t < 0)
                return (int)t;
            if (i >= 0)
                r->v[k][i] = t;
        }
    return 0;
}

static void report_mode(const char *mode, struct pass_run *r)
{
    double p50[NPASS + 1], p99[NPASS + 1];
    char h[32];
    for (size_t k = 0; k <= npass; k++)
        percentiles(r->v[k], rounds, &p50[k], &p99[k]);
    for (size_t k = 0; k < npass; k++)
        printf("heap pass [%s] %-7s round trip p50 %7.2f us p99 %7.2f us = %.2fx the 4 B trip | memcpy p50 "
               "%10.1f us (%5.2f GiB/s) = %.0fx the trip\n",
               mode, human(pass_sizes[k], h, sizeof(h)), p50[k] / 1e3, p99[k] / 1e3, p50[k] / p50[0],
               r->copy_p50[k] / 1e3, (double)pass_sizes[k] / (double)GiB / (r->copy_p50[k] / 1e9),
               r->copy_p50[k] / p50[k]);
    for (size_t k = 0; k < npass; k++) {
        bench_rec rec;
        bench_rec_begin(&rec, "heap pass");
        bench_rec_str(&rec, "mode", mode);
        bench_rec_num(&rec, "bytes", (double)pass_sizes[k]);
        bench_rec_num(&rec, "p50_ns", p50[k]);
        bench_rec_num(&rec, "p99_ns", p99[k]);
        bench_rec_num(&rec, "ratio_p50_4B", p50[k] / p50[0]);
        bench_rec_num(&rec, "memcpy_p50_ns", r->copy_p50[k]);
        bench_rec_emit(&rec);
    }
    bench_rec rec;
    bench_rec_begin(&rec, "heap give 64 B");
    bench_rec_str(&rec, "mode", mode);
    bench_rec_num(&rec, "p50_ns", p50[GIVE]);
    bench_rec_num(&rec, "p99_ns", p99[GIVE]);
    bench_rec_num(&rec, "ratio_p50_4B", p50[GIVE] / p50[0]);
    bench_rec_emit(&rec);
    printf("heap give [%s] 64 B alloc, send, remote free, drain p50 %7.2f us p99 %7.2f us = %.2fx the 4 B trip\n", mode,
           p50[GIVE] / 1e3, p99[GIVE] / 1e3, p50[GIVE] / p50[0]);
}

/* memcpy of size bytes, both buffers already faulted in. */
static int copy_time(size_t size, double *p50)
{
    long n = size <= MiB ? 50 : size <= 64 * MiB ? 10 : 3;
    uint8_t *src = malloc(size), *dst = malloc(size);
    int64_t v[50];
    if (!src || !dst) {
        free(src), free(dst);
        return -1;
    }
    memset(src, 0x33, size);
    memset(dst, 0, size);
    for (long i = 0; i < n; i++) {
        int64_t t0 = sr__now_ns();
        memcpy(dst, src, size);
        v[i] = sr__now_ns() - t0;
        sink = dst[(size_t)i * 4099 % size];
    }
    int ok = dst[size - 1] == 0x33;
    double p99;
    percentiles(v, n, p50, &p99);
    free(src), free(dst);
    return ok ? 0 : -1;
}

static int set_mode(sr_xport *x, int64_t spin_ns)
{
    sr_msg m;
    set_spin(x, spin_ns);
    int rc = send_u64(x, 1, MSG_MODE, (uint64_t)spin_ns);
    if (rc || (rc = next_msg(x, &m)))
        return rc;
    return m.type == MSG_BACK ? 0 : not_back(&m, "a mode change");
}

/* Every block back to one reference (rank 1 lets go after answering), the
 * stamps intact, all freed, every given block drained: the arena at base. */
static int settle(struct pass_run *r, size_t base)
{
    int ok = 1;
    for (size_t k = 0; k < npass; k++) {
        for (int64_t until = sr__now_ns() + WAIT_NS; sr__block_refcount(r->blocks[k]) != 1 && sr__now_ns() < until;)
            sched_yield();
        ok &= sr__block_refcount(r->blocks[k]) == 1 && *(uint8_t *)sr__block_data(r->blocks[k]) == 0x5a;
        sr__block_unref(r->blocks[k]);
    }
    for (int64_t until = sr__now_ns() + WAIT_NS; sr__heap_allocated() != base && sr__now_ns() < until;)
        if (!sr__heap_drain())
            sched_yield();
    return ok && sr__heap_allocated() == base ? 0 : sr__fail(-EPROTO, "bench_heap", "blocks did not settle");
}

static int drive(sr_xport *x)
{
    struct pass_run r = {0};
    size_t base = sr__heap_allocated();
    int rc = 0;
    for (size_t k = 0; !rc && k <= npass; k++)
        rc = (r.v[k] = malloc((size_t)rounds * sizeof(int64_t))) ? 0 : -ENOMEM;
    for (size_t k = 0; !rc && k < npass; k++)
        if (!(r.blocks[k] = sr__block_alloc(pass_sizes[k])) || copy_time(pass_sizes[k], &r.copy_p50[k]))
            rc = -1;
        else
            *(uint8_t *)sr__block_data(r.blocks[k]) = 0x5a;
    if (!rc && !(rc = set_mode(x, SPIN_NS)) && !(rc = run_rounds(x, &r)))
        report_mode("spin", &r);
    uint64_t hits = x->st.spin_hits;
    if (!rc && !(rc = set_mode(x, 0)) && !(rc = run_rounds(x, &r)))
        report_mode("sleep", &r);
    if (!rc)
        printf("heap pass: 2 workers, %d CPUs; rank 0 spin hits %llu in spin mode, %llu sleeps in all\n", x->ncpu,
               (unsigned long long)hits, (unsigned long long)x->st.sleeps);
    if (!rc)
        rc = settle(&r, base);
    for (size_t k = 0; k <= npass; k++)
        free(r.v[k]);
    int stop = send_u64(x, 1, MSG_STOP, 0);
    return rc ? rc : stop;
}

static int pass_worker(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    sr_xport *x;
    if (sr__xport_attach(NULL, &x)) {
        fprintf(stderr, "bench_heap: %s\n", sr_last_error());
        return 1;
    }
    int rc = rank == 0 ? drive(x) : echo(x);
    if (rc)
        fprintf(stderr, "bench_heap: rank %d failed (%d): %s\n", rank, rc, sr_last_error());
    sr__xport_detach(x);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    bench_cli cli = {.prog = "bench_heap", .opts = {"--rounds"}, .usage = "  --rounds N  timed rounds per configuration (>= 100)",
                     .smoke_what = "20 rounds, blocks passed up to 1 MiB"};
    bench_cli_parse(&cli, argc, argv);
    if (cli.smoke)
        rounds = 20, npass = 3;
    if (cli.opt[0])
        rounds = (long)bench_cli_int(&cli, "--rounds", cli.opt[0], 100, 100000000);
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("bench_heap: %ld timed rounds per configuration\n", rounds);
    sr_spawn_opts small = {.name_prefix = "bench_heap"};
    int rc = sr_spawn(1, alloc_worker, NULL, &small);
    /* every block of (2) at once: 1.3 GiB of data per worker, sparse */
    sr_spawn_opts big = {.name_prefix = "bench_heap", .shm_size = cli.smoke ? 0 : 2 * (GiB + 512 * MiB) + 64 * MiB};
    if (!rc)
        rc = sr_spawn(2, pass_worker, NULL, &big);
    if (rc)
        fprintf(stderr, "bench_heap: %s\n", sr_last_error());
    return rc ? 1 : 0;
}
