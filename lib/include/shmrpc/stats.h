/* SPDX-License-Identifier: MIT */
/* shmrpc: per-function RPC statistics (the profiler's numbers).
 *
 * Every worker keeps, per function name, what it saw on both sides of a call:
 *   caller  calls made, calls that failed (an error answer, a timeout, a dead
 *           peer), and the round trip: from the request leaving until its
 *           answer arrived;
 *   callee  calls served, calls that failed, the queueing time (decoded until
 *           the function started: waiting for an executor, or for an RRef
 *           argument to be confirmed) and the run time (the function started
 *           until its answer was ready: for an async function, until its
 *           future completed).
 * Both sides count a call before the caller's future completes, so once a
 * call returned, both workers' snapshots include it.
 * Module requests are named "<module>:<request>" ("rref:to_here",
 * "dist_autograd:backward").
 *
 * Recording is off by default; SHMRPC_STATS=1 in the environment turns it on
 * at sr_init, and the job's tables go to stderr: printed by shmrun or
 * sr_spawn when the job ends, in rank order, or by a worker started
 * without them at its sr_shutdown; sr_stats_enable()
 * turns it on or off at any time. Off, each probe point in the RPC layer costs
 * one load and one predicted branch (docs/PERFORMANCE.md, "Profiling off").
 * On, recording takes no lock and allocates only the first time a thread
 * records a function: each thread writes its own counters and log-linear
 * histograms (relative error under 12.5 %), and a snapshot sums them.
 *
 * Function names: at most 255 are told apart; later ones are counted under
 * "(other)". Latencies are in nanoseconds. A percentile is the upper bound of the
 * histogram bucket that holds it, capped at the exact maximum, so
 * p50 <= p99 <= max always holds. A snapshot taken while calls run may be
 * a few calls behind; one taken after they finished is exact.
 *
 * The statistics live for the process: they survive sr_shutdown (read them
 * after it) and sr_stats_reset() zeroes them. docs/PROFILING.md shows the
 * table and the trace (SHMRPC_TRACE).
 */
#ifndef SHMRPC_STATS_H
#define SHMRPC_STATS_H

#if defined(SR__BUILDING) && !defined(SR__SEES_TRACE)
#error "shmrpc/stats.h belongs to the trace module layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sr_latency {
    uint64_t count;                 /* samples */
    uint64_t p50_ns, p99_ns, max_ns; /* 0 when count is 0 */
    uint64_t sum_ns;                /* for the mean */
} sr_latency;

typedef struct sr_fn_stats {
    const char *name;      /* valid until the snapshot is freed */
    uint64_t calls, errors; /* caller side */
    sr_latency round_trip;
    uint64_t served, serve_errors; /* callee side */
    sr_latency queue, run;
} sr_fn_stats;

typedef struct sr_stats sr_stats;

/* Turn recording on (true) or off; returns the previous setting. Works before
 * sr_init too (it then starts with the next sr_init's first call). */
SR_API bool sr_stats_enable(bool on);
/* Recording is on. */
SR_API bool sr_stats_enabled(void);
/* Zero every counter and histogram of this worker. */
SR_API void sr_stats_reset(void);
/* A snapshot of this worker's statistics, one entry per function seen, in
 * the order first seen. 0, or -EINVAL (out is NULL), -ENOMEM. */
SR_API int sr_stats_snapshot(sr_stats **out);
SR_API size_t sr_stats_len(const sr_stats *s);
/* Entry i (NULL past the end), borrowed from s. */
SR_API const sr_fn_stats *sr_stats_at(const sr_stats *s, size_t i);
/* The entry of function name, or NULL (never called). */
SR_API const sr_fn_stats *sr_stats_find(const sr_stats *s, const char *name);
SR_API void sr_stats_free(sr_stats *s);
/* Print s as a table to f, headed by `who` (e.g. the worker's name); each
 * latency column in one unit, chosen for its values (docs/PROFILING.md).
 * 0, or -EINVAL. */
SR_API int sr_stats_print(const sr_stats *s, const char *who, FILE *f);

#ifdef __cplusplus
}
#endif

#endif
