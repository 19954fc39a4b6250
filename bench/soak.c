/* SPDX-License-Identifier: MIT */
/* Soak: a mixed RPC / RRef / tensor workload on every worker for a while,
 * watching for growth. Run it with ./dev soak [minutes] (under
 * shmrun -n 4). Each worker drives its peers (chosen by a seeded generator):
 *   - rpc_sync of "bump" with a tensor of 64 B .. 16 MiB (log-uniform): the
 *     callee allocates the result, the caller frees both;
 *   - rpc_async fans of 8 such calls, gathered with wait_all;
 *   - remote("make") + to_here, and a user->user fork: the RRef is passed to
 *     a third worker, which to_here()s it;
 *   - allocation churn: a ring of 16 blocks of 64 B .. 16 MiB replaced at
 *     random.
 * Every 10 s rank 0 asks each worker for its numbers and prints a row:
 * elapsed, private RSS summed over the workers (smaps_rollup Private_*,
 * minus the pages of the shared segment, which are the heap's), live heap
 * bytes (summed), the smallest of the workers' largest free heap ranges, and
 * allocation failures (summed). At the end every worker stops, waits for its
 * RRef messages to be applied, meets the others, and checks: no allocation
 * failure, every RRef counter back to zero, its heap back to its baseline.
 * Rank 0 also checks that RSS and live heap stayed flat (the median of the
 * second half of the rows against the first half's). Exit status non-zero
 * if anything failed.
 */
#include <errno.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "heap.h"
#include "heap_extent.h"
#include "shmrpc/shmrpc.h"

#define MiB (1ull << 20)
#define PERIOD_S 10.0
#define TIMEOUT_S 120.0
#define CHURN 16

static _Atomic uint64_t alloc_failures; /* relaxed: a counter, read for reports */
static _Atomic uint64_t call_errors;    /* relaxed: as above */
static _Atomic int arrived;             /* relaxed: polled by every worker until all arrived */
static uint64_t rng;
static size_t heap_base;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static uint64_t rnd(void)
{
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dull;
}

/* 64 B .. 16 MiB, log-uniform. */
static size_t rnd_size(void)
{
    unsigned lg = 6 + (unsigned)(rnd() % 19);
    size_t lo = (size_t)1 << lg;
    size_t n = lo + rnd() % lo;
    return n > 16 * MiB ? 16 * MiB : n;
}

/* Counts a failed call; the first few are printed. */
static void note_error(int rc, const char *what)
{
    /* relaxed: counters (see their declarations) */
    uint64_t n = atomic_fetch_add_explicit(&call_errors, 1, memory_order_relaxed);
    if (strstr(sr_last_error(), "exhausted") || rc == -ENOMEM)
        atomic_fetch_add_explicit(&alloc_failures, 1, memory_order_relaxed);
    if (n < 3)
        fprintf(stderr, "soak: worker%d: %s: %d %s\n", sr_rank(), what, rc, sr_last_error());
}

/* Private RSS in bytes: smaps_rollup's Private_* less the segment's (the
 * memfd's pages a worker alone touched count as private there). */
static uint64_t private_rss(void)
{
    char line[512];
    uint64_t total = 0, seg = 0, kb;
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (f) {
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "Private_Clean: %" SCNu64, &kb) == 1 || sscanf(line, "Private_Dirty: %" SCNu64, &kb) == 1)
                total += kb * 1024;
        fclose(f);
    }
    f = fopen("/proc/self/smaps", "r");
    bool in_seg = false;
    if (f) {
        while (fgets(line, sizeof(line), f)) {
            if (strchr(line, '-') && strchr(line, ':') && line[0] != ' ' && !strstr(line, "kB"))
                in_seg = strstr(line, "/memfd:") != NULL;
            else if (in_seg && (sscanf(line, "Private_Clean: %" SCNu64, &kb) == 1 ||
                                sscanf(line, "Private_Dirty: %" SCNu64, &kb) == 1))
                seg += kb * 1024;
        }
        fclose(f);
    }
    return total > seg ? total - seg : 0;
}

/* ---- the functions peers call ---- */

static sr_tensor *tensor_of(size_t bytes)
{
    int64_t n = (int64_t)(bytes / 4 ? bytes / 4 : 1);
    return sr_full(SR_F32, 1, &n, 1.0, 0);
}

static int fn_bump(sr_call *c)
{
    sr_tensor *t = sr_call_nargs(c) == 1 ? sr_value_tensor(sr_call_arg(c, 0)) : NULL;
    if (!t)
        return sr_call_fail(c, -EINVAL, "bump takes one tensor");
    sr_tensor *r = sr_add_scalar(t, 1.0);
    if (!r)
        return sr_call_fail(c, -ENOMEM, "%s", sr_last_error());
    sr_value *v = sr_value_from_tensor(r);
    sr_tensor_unref(r);
    return sr_call_return(c, v);
}

static int fn_make(sr_call *c)
{
    sr_tensor *t = tensor_of((size_t)sr_value_int(sr_call_arg(c, 0)));
    if (!t)
        return sr_call_fail(c, -ENOMEM, "%s", sr_last_error());
    sr_value *v = sr_value_from_tensor(t);
    sr_tensor_unref(t);
    return sr_call_return(c, v);
}

/* A user->user fork arrives here: fetch the value from its owner. */
static int fn_fetch(sr_call *c)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    sr_value *v = NULL;
    int rc = r ? sr_rref_to_here(r, TIMEOUT_S, &v) : -EINVAL;
    if (rc)
        return sr_call_fail(c, rc, "to_here: %s", sr_last_error());
    int64_t n = (int64_t)sr_tensor_numel(sr_value_tensor(v));
    sr_value_unref(v);
    return sr_call_return(c, sr_int(n));
}

static int fn_stats(sr_call *c)
{
    struct sr_heap_extent_stats st;
    sr__heap_extent_stats(&st);
    sr_value *v[4] = {sr_int((int64_t)private_rss()), sr_int((int64_t)sr__heap_allocated()),
                      sr_int((int64_t)st.largest_free),
                      sr_int((int64_t)atomic_load_explicit(&alloc_failures, memory_order_relaxed))};
    sr_value *l = sr_list(4, v);
    for (int i = 0; i < 4; i++)
        sr_value_unref(v[i]);
    return sr_call_return(c, l);
}

static int fn_arrive(sr_call *c)
{
    atomic_fetch_add_explicit(&arrived, 1, memory_order_relaxed);
    return sr_call_return(c, sr_none());
}

static int fn_arrived(sr_call *c) { return sr_call_return(c, sr_int(atomic_load_explicit(&arrived, memory_order_relaxed))); }

/* ---- the driver ---- */

static int peer(int not)
{
    int w = sr_world_size(), p;
    do
        p = (int)(rnd() % (uint64_t)w);
    while ((p == sr_rank() && w > 1) || (p == not && w > 2));
    return p;
}

static void op_sync(void)
{
    sr_tensor *t = tensor_of(rnd_size());
    sr_value *a = t ? sr_value_from_tensor(t) : NULL, *out = NULL;
    sr_tensor_unref(t);
    int rc = a ? sr_rpc_sync(peer(-1), "bump", SR_ARGS(a), TIMEOUT_S, &out) : -ENOMEM;
    if (rc)
        note_error(rc, "rpc_sync(bump)");
    sr_value_unref(out), sr_value_unref(a);
}

static void op_async(void)
{
    enum { FAN = 8 };
    sr_future *f[FAN] = {0};
    sr_value *a[FAN] = {0}, *all = NULL;
    int n = 0, rc = 0;
    for (; n < FAN && !rc; n++) {
        sr_tensor *t = tensor_of(rnd_size() / 4);
        a[n] = t ? sr_value_from_tensor(t) : NULL;
        sr_tensor_unref(t);
        rc = a[n] ? sr_rpc_async(peer(-1), "bump", SR_ARGS(a[n]), TIMEOUT_S, &f[n]) : -ENOMEM;
    }
    if (rc) {
        note_error(rc, "rpc_async(bump)");
        n--;
    } else if ((rc = sr_future_wait_all(f, (size_t)n, &all)))
        note_error(rc, "wait_all");
    sr_value_unref(all);
    for (int i = 0; i < FAN; i++)
        sr_future_unref(f[i]), sr_value_unref(a[i]);
}

static void op_rref(void)
{
    int owner = peer(-1), third = peer(owner);
    sr_value *n = sr_int((int64_t)rnd_size()), *v = NULL, *got = NULL, *rv = NULL;
    sr_rref *r = NULL;
    int rc = sr_remote(owner, "make", SR_ARGS(n), TIMEOUT_S, &r);
    if (!rc && (rc = sr_rref_to_here(r, TIMEOUT_S, &v)) == 0 && third != owner) {
        rv = sr_value_from_rref(r);
        rc = rv ? sr_rpc_sync(third, "fetch", SR_ARGS(rv), TIMEOUT_S, &got) : -ENOMEM;
    }
    if (rc)
        note_error(rc, "remote/to_here/fork");
    sr_value_unref(got), sr_value_unref(rv), sr_value_unref(v), sr_value_unref(n);
    sr_rref_unref(r);
}

static void op_churn(sr_block **ring)
{
    unsigned i = (unsigned)(rnd() % CHURN);
    sr__block_unref(ring[i]);
    size_t n = rnd_size();
    /* relaxed: a counter (see its declaration) */
    if (!(ring[i] = sr__block_alloc(n)) && atomic_fetch_add_explicit(&alloc_failures, 1, memory_order_relaxed) < 3)
        fprintf(stderr, "soak: worker%d: %s\n", sr_rank(), sr_last_error());
}

struct row {
    double t;
    uint64_t rss, heap, largest, failures;
};

/* Rank 0: one row of the table from every worker's numbers. */
static int sample(double t, struct row *r)
{
    *r = (struct row){.t = t, .largest = UINT64_MAX};
    for (int w = 0; w < sr_world_size(); w++) {
        sr_value *l = NULL;
        int rc = sr_rpc_sync(w, "stats", SR_NOARGS, TIMEOUT_S, &l);
        if (rc) {
            note_error(rc, "stats");
            return rc;
        }
        uint64_t largest = (uint64_t)sr_value_int(sr_value_list_at(l, 2));
        r->rss += (uint64_t)sr_value_int(sr_value_list_at(l, 0));
        r->heap += (uint64_t)sr_value_int(sr_value_list_at(l, 1));
        r->largest = largest < r->largest ? largest : r->largest;
        r->failures += (uint64_t)sr_value_int(sr_value_list_at(l, 3));
        sr_value_unref(l);
    }
    printf("%8.0f s | %10.1f MiB | %10.1f MiB | %10.1f MiB | %8" PRIu64 "\n", r->t, r->rss / (double)MiB,
           r->heap / (double)MiB, r->largest / (double)MiB, r->failures);
    fflush(stdout);
    return 0;
}

/* Every worker waits here until all have called arrive on rank 0. */
static int meet(void)
{
    int rc = sr_rpc_sync(0, "arrive", SR_NOARGS, TIMEOUT_S, NULL);
    double until = now_s() + TIMEOUT_S;
    for (int64_t n = 0; !rc && n < sr_world_size();) {
        sr_value *v = NULL;
        if ((rc = sr_rpc_sync(0, "arrived", SR_NOARGS, TIMEOUT_S, &v)) == 0)
            n = sr_value_int(v);
        sr_value_unref(v);
        if (n < sr_world_size() && now_s() > until)
            rc = -ETIMEDOUT;
        if (!rc && n < sr_world_size())
            usleep(10000);
    }
    return rc;
}

/* After the run: RRef counters at zero, heap at its baseline. */
static int final_check(void)
{
    sr_rref_debug_info d;
    int bad = 0, rc = sr_rref_debug_info_get(&d);
    if (rc)
        return rc;
    uint64_t live = d.num_owner_rrefs + d.num_pending_owners + d.num_forks + d.num_pending_users +
                    d.num_confirmed_users + d.num_pending_children + d.num_pending_futures +
                    d.num_tombstones + d.num_deferred_calls;
    if (live) {
        fprintf(stderr, "soak: worker%d: RRef counters not back to zero: owners %" PRIu64 " pending owners %" PRIu64
                        " forks %" PRIu64 " pending users %" PRIu64 " users %" PRIu64 " children %" PRIu64
                        " futures %" PRIu64 " tombstones %" PRIu64 " deferred %" PRIu64 "\n",
                sr_rank(), d.num_owner_rrefs, d.num_pending_owners, d.num_forks, d.num_pending_users,
                d.num_confirmed_users, d.num_pending_children, d.num_pending_futures, d.num_tombstones,
                d.num_deferred_calls);
        bad = 1;
    }
    sr__heap_drain();
    size_t now = sr__heap_allocated();
    if (now > heap_base + MiB) {
        fprintf(stderr, "soak: worker%d: heap holds %zu bytes after the run, %zu at the start\n", sr_rank(), now,
                heap_base);
        bad = 1;
    }
    uint64_t f = atomic_load_explicit(&alloc_failures, memory_order_relaxed);
    uint64_t e = atomic_load_explicit(&call_errors, memory_order_relaxed);
    if (f || e) {
        fprintf(stderr, "soak: worker%d: %" PRIu64 " allocation failures, %" PRIu64 " failed calls\n", sr_rank(), f, e);
        bad = 1;
    }
    return bad;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Median of field `at` (a byte offset into struct row) over rows[lo, hi). */
static uint64_t median(const struct row *rows, int lo, int hi, size_t at)
{
    uint64_t v[1024];
    int n = 0;
    for (int i = lo; i < hi && n < 1024; i++)
        memcpy(&v[n++], (const char *)&rows[i] + at, sizeof(uint64_t));
    qsort(v, (size_t)n, sizeof(v[0]), cmp_u64);
    return n ? v[n / 2] : 0;
}

/* Nothing grows: the median of the second half of the rows stays within a
 * quarter (plus some slack for what is in flight at a sample) of the first
 * half's. Medians, because one row may catch eight 16 MiB tensors in flight. */
static bool flat(const struct row *rows, int n)
{
    if (n < 2) {
        fprintf(stderr, "soak: only %d rows: too short to judge growth\n", n);
        return true;
    }
    uint64_t r0 = median(rows, 0, n / 2, offsetof(struct row, rss));
    uint64_t r1 = median(rows, n / 2, n, offsetof(struct row, rss));
    uint64_t h0 = median(rows, 0, n / 2, offsetof(struct row, heap));
    uint64_t h1 = median(rows, n / 2, n, offsetof(struct row, heap));
    bool ok = r1 <= r0 + r0 / 4 + 16 * MiB && h1 <= h0 + h0 / 4 + 64 * MiB;
    printf("soak: median private RSS %.1f -> %.1f MiB, median live heap %.1f -> %.1f MiB (first half -> second): "
           "%s\n", r0 / (double)MiB, r1 / (double)MiB, h0 / (double)MiB, h1 / (double)MiB, ok ? "flat" : "GROWING");
    return ok;
}

int main(int argc, char **argv)
{
    double minutes = 10.0;
    if (argc > 1) {
        char *end;
        minutes = strtod(argv[1], &end);
        if (argc > 2 || end == argv[1] || *end || !(minutes > 0)) {
            fprintf(stderr, "soak: usage: soak [MINUTES], MINUTES a positive number (got '%s')\n", argv[argc - 1]);
            return 2;
        }
    }
    sr_register("bump", fn_bump);
    sr_register("make", fn_make);
    sr_register("fetch", fn_fetch);
    sr_register("stats", fn_stats);
    sr_register("arrive", fn_arrive);
    sr_register("arrived", fn_arrived);
    if (sr_init(NULL)) {
        fprintf(stderr, "soak: sr_init: %s\n", sr_last_error());
        return 1;
    }
    rng = 0x50a4ull * 2654435761u + (uint64_t)sr_rank() * 0x9e3779b97f4a7c15ull + 1;
    heap_base = sr__heap_allocated();
    enum { ROWS_MAX = 1024 };
    static struct row rows[ROWS_MAX];
    int nrows = 0, bad = 0;
    if (sr_rank() == 0)
        printf("soak: %d workers, %.1f min\n %8s | %14s | %14s | %14s | %8s\n", sr_world_size(), minutes,
               "elapsed", "private RSS", "live heap", "largest free", "failures");
    sr_block *ring[CHURN] = {0};
    double t0 = now_s(), end = t0 + minutes * 60, next = t0 + PERIOD_S;
    while (now_s() < end) {
        switch (rnd() % 8) {
        case 0: case 1: case 2: op_sync(); break;
        case 3: case 4: op_async(); break;
        case 5: case 6: op_rref(); break;
        default: op_churn(ring);
        }
        if (sr_rank() == 0 && now_s() >= next && nrows < ROWS_MAX) {
            bad |= sample(now_s() - t0, &rows[nrows]) != 0;
            nrows++;
            next += PERIOD_S;
        }
    }
    for (int i = 0; i < CHURN; i++)
        sr__block_unref(ring[i]);
    int rc = sr_rref_wait_idle(TIMEOUT_S);
    if (rc || (rc = meet()))
        fprintf(stderr, "soak: worker%d: quiescence: %s\n", sr_rank(), sr_last_error());
    bad |= rc != 0;
    bad |= final_check();
    if (sr_rank() == 0)
        bad |= !flat(rows, nrows);
    int me = sr_rank(); /* -1 after shutdown */
    if (sr_shutdown(true, TIMEOUT_S)) {
        fprintf(stderr, "soak: worker%d: sr_shutdown: %s\n", me, sr_last_error());
        bad = 1;
    }
    if (me == 0 || bad)
        fprintf(stderr, "soak: worker%d: %s\n", me,
                bad ? "FAILED" : "ok: no allocation failure or failed call, every worker's RRef counters at zero "
                                 "and heap back to its baseline, RSS and heap flat");
    return bad;
}
