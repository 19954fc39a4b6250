/* Helpers shared by the benchmarks: time, percentiles, medians over rounds,
 * memory shared with forked children, a sleeping cross-process barrier and
 * the self-describing result line.
 *
 * Nothing here depends on shmrpc, so the floor measured with it is not
 * affected by the code under test.
 *
 * Method used by every bench (STYLE.md §9): warm up, then time a fixed count;
 * interleave the floor and our measurement in several rounds of one run, and
 * report the median over rounds of each round's p50 and p99, plus the median
 * of the per-round ratios (a round's two figures share its noise).
 */
#ifndef SR_BENCH_UTIL_H
#define SR_BENCH_UTIL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_LINE 64

int64_t bench_now_ns(void);

/* p50 and p99 of one timed run. */
typedef struct bench_lat {
    int64_t p50, p99;
} bench_lat;

/* Sorts samples[0..n) in place and returns its p50 and p99. n > 0. */
bench_lat bench_lat_of(int64_t *samples, size_t n);

/* Median of v[0..n) (sorts v in place). n > 0. */
double bench_median(double *v, size_t n);

/* Zeroed memory shared with processes forked after the call (MAP_SHARED |
 * MAP_ANONYMOUS); NULL on failure, with errno set. Free with bench_shared_free. */
void *bench_shared_alloc(size_t bytes);
void bench_shared_free(void *p, size_t bytes);

/* A barrier for n processes in shared memory, zero-initialised. Waiters sleep
 * (futex), so it is safe when there are more processes than cores. */
typedef struct bench_barrier {
    _Atomic uint32_t count; /* arrivals in the current generation; every party writes */
    _Atomic uint32_t gen;   /* bumped by the last arrival; futex word */
} __attribute__((aligned(BENCH_LINE))) bench_barrier;

/* 0, or -ETIMEDOUT when the others did not all arrive within timeout_ns. */
int bench_barrier_wait(bench_barrier *b, uint32_t n, int64_t timeout_ns);

/* Per-round figures of one configuration, filled by the measuring process. */
#define BENCH_MAX_ROUNDS 15
typedef struct bench_rounds {
    int n;
    bench_lat ours[BENCH_MAX_ROUNDS], floor[BENCH_MAX_ROUNDS];
} bench_rounds;

/* Record one round: our figures next to the floor measured just before. */
void bench_rounds_add(bench_rounds *r, bench_lat ours, bench_lat floor);

/* Medians over the rounds. ratio50/ratio99: medians of per-round ratios. */
typedef struct bench_summary {
    double ours50, ours99, floor50, floor99, ratio50, ratio99;
} bench_summary;
bench_summary bench_summarize(const bench_rounds *r);

/* Print one self-describing line:
 *   <name> | <config> | p50 .. p99 .. | floor <floor_name> p50 .. p99 .. |
 *   ratio p50 .. p99 .. | target p50 <= T x (met|NOT met) | <extra>
 * target <= 0 prints no verdict; extra may be NULL. Returns 1 if the p50
 * ratio meets the target (or there is none), 0 otherwise. */
int bench_print(const char *name, const char *config, const char *floor_name, const bench_summary *s,
                double target, const char *extra);

#endif
