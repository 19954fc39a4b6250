/* SPDX-License-Identifier: MIT */
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
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_LINE 64

int64_t bench_now_ns(void);
/* This process's CPU time, every thread's (CLOCK_PROCESS_CPUTIME_ID), ns. */
int64_t bench_process_cpu_ns(void);

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

/* ---- the command line every bench shares ----
 *
 *   PROG [--json] [--help] [options of PROG] [NAME...]
 *
 * NAMEs select workloads (default: all); --json writes the figures as JSON
 * Lines (schema in docs/PERFORMANCE.md, "Machine-readable output") on
 * stdout, one object per figure, while the human-readable lines go to stderr.
 * An unknown option or name is refused: "PROG: unknown argument 'x' (names:
 * ...; options: ...)" on stderr, exit status 2. */
#define BENCH_MAX_NAMES 16
#define BENCH_MAX_OPTS 6
typedef struct bench_cli {
    const char *prog;                       /* in: the program's name */
    const char *names[BENCH_MAX_NAMES + 1]; /* in: accepted workload names, NULL-terminated */
    const char *flags[BENCH_MAX_OPTS + 1];  /* in: extra flags (e.g. "--no-torch"), NULL-terminated */
    const char *opts[BENCH_MAX_OPTS + 1];   /* in: extra options taking a value (e.g. "--seed") */
    const char *usage;                      /* in: what follows the usage line (NAMEs, options), or NULL */
    const char *smoke_what;                 /* in: what --smoke shrinks, or NULL: the bench takes no --smoke */
    bool smoke;                             /* out: --smoke given (bench_smoke_on) */
    bool json;                              /* out: --json given */
    bool any_name;                          /* out: at least one NAME given */
    bool named[BENCH_MAX_NAMES];            /* out: names[i] given */
    bool flag[BENCH_MAX_OPTS];              /* out: flags[i] given */
    const char *opt[BENCH_MAX_OPTS];        /* out: opts[i]'s value, or NULL */
} bench_cli;

/* Parses argv into c (exits 2 on an unknown argument, 0 after --help) and,
 * with --json, moves the human-readable output to stderr. With --smoke
 * (benches that set smoke_what), prints a line saying that the figures to
 * come are not measurements. */
void bench_cli_parse(bench_cli *c, int argc, char **argv);

/* --smoke: the quick run of the smoke tests (meson test --suite bench,
 * bench/smoke.py). Every workload runs with tiny counts and its checks,
 * PyTorch is not run (bench_torch_run says "--smoke") and no target is
 * judged (bench_print prints no verdict): the figures are not measurements. */
bool bench_smoke_on(void);
/* A target's verdict for a bench's own line: "met", "NOT met", or under
 * --smoke "not judged (--smoke)". */
const char *bench_verdict(bool met);

/* Whether workload `name` runs: named on the command line, or no name given. */
bool bench_cli_wants(const bench_cli *c, const char *name);

/* A whole-number option value in [lo, hi], or exit 2 naming it. */
long long bench_cli_int(const bench_cli *c, const char *opt, const char *value, long long lo, long long hi);

/* ---- JSON Lines (--json) ----
 * One object per figure: bench_rec_begin, fields, bench_rec_emit. Fields are
 * added in order; a NaN number is written as null. Without --json,
 * bench_rec_emit writes nothing. Safe in forked children (one write(2) per
 * object). */
bool bench_json_on(void);
typedef struct bench_rec {
    char buf[4096];
    size_t len;
} bench_rec;
void bench_rec_begin(bench_rec *r, const char *name); /* {"bench": PROG, "name": name */
void bench_rec_num(bench_rec *r, const char *key, double v);
void bench_rec_str(bench_rec *r, const char *key, const char *s); /* s NULL: null */
void bench_rec_bool(bench_rec *r, const char *key, bool b);
void bench_rec_emit(bench_rec *r);

/* ---- PyTorch, measured in the same run (bench/compare/) ----
 * bench_torch_run runs `PYTHON SCRIPT ARGS` (BENCH_PYTHON, default
 * /usr/bin/python3, Debian's, with python3-torch) and keeps its figure lines
 *   torch-fig KEY FIELD VALUE [FIELD VALUE ...]   (FIELD: p50_ns p99_ns per_s)
 * and its "# PyTorch VERSION ..." line; other lines are echoed. When torch
 * cannot be run, measured is false and why says so ("torch not installed",
 * "--no-torch", "... exited with status N"): a bench then prints that, never
 * a remembered figure. */
#define BENCH_TORCH_FIGS 48
typedef struct bench_torch_fig {
    char key[40];
    double p50_ns, p99_ns, per_s; /* NaN when the script did not give it */
} bench_torch_fig;
typedef struct bench_torch {
    bool measured;
    char why[256];
    char version[64];
    int n;
    bench_torch_fig fig[BENCH_TORCH_FIGS];
} bench_torch;

/* skip_why non-NULL: do not run, say this instead. args may be "". */
void bench_torch_run(bench_torch *t, const char *script, const char *args, const char *skip_why);
/* The figure KEY, or NULL. */
const bench_torch_fig *bench_torch_get(const bench_torch *t, const char *key);
/* "PyTorch p50 262 us: 40x faster" for our p50 ours_ns, or "PyTorch: <why>"
 * (also when the figure is missing); returns buf. */
const char *bench_torch_vs(const bench_torch *t, const char *key, double ours_ns, char *buf, size_t len);
/* Adds torch_p50_ns, torch_p99_ns (or torch_per_s) of KEY to r, or "torch": why. */
void bench_rec_torch(bench_rec *r, const bench_torch *t, const char *key);

/* bench_print, plus PyTorch's figure KEY of t in the JSON object
 * (bench_rec_torch); the text of the line is bench_print's. */
int bench_print_torch(const char *name, const char *config, const char *floor_name, const bench_summary *s,
                      double target, const char *extra, const bench_torch *t, const char *key);

#endif
