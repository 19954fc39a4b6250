/* SPDX-License-Identifier: MIT */
/* A log-linear latency histogram with a single writer (internal).
 *
 * Values are ns. 0..15 have a bucket each; above, every power of two is cut
 * into 8 equal buckets (relative error < 12.5 %), up to 2^43 ns (about 2.4
 * hours; longer values land in the last bucket). Fixed size, no allocation.
 *
 * Ordering: one thread writes (sr__hist_add, with plain load + store of each
 * relaxed atomic: no read-modify-write), any thread reads (sr__hist_read).
 * Relaxed is enough: nothing else is published with a count, and a reader
 * racing the writer sees a sample or not, never a torn word. sr__hist_zero is
 * the writer's too (a reset is applied by the writer, tables.c).
 */
#ifndef SR_TRACE_HIST_H
#define SR_TRACE_HIST_H

#if !defined(SR__IN_TRACE)
#error "hist.h is private to the trace module layer (docs/ARCHITECTURE.md)"
#endif
#include <stdatomic.h>
#include <stdint.h>

#include "shmrpc/stats.h"

#define SR_HIST_N (16 + 39 * 8)

struct sr_hist {
    _Atomic uint64_t n, sum, max;
    _Atomic uint64_t b[SR_HIST_N];
};

static inline unsigned sr__hist_index(uint64_t v)
{
    if (v < 16)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v); /* >= 4 */
    unsigned i = 16 + (e - 4) * 8 + (unsigned)((v >> (e - 3)) & 7);
    return i < SR_HIST_N ? i : SR_HIST_N - 1;
}

/* relaxed (all): single writer, see above */
static inline void sr__bump(_Atomic uint64_t *c, uint64_t by)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + by, memory_order_relaxed);
}

static inline void sr__hist_add(struct sr_hist *h, int64_t ns)
{
    uint64_t v = ns > 0 ? (uint64_t)ns : 0;
    sr__bump(&h->b[sr__hist_index(v)], 1);
    sr__bump(&h->n, 1);
    sr__bump(&h->sum, v);
    /* relaxed: single writer, read only by snapshots (see above) */
    if (v > atomic_load_explicit(&h->max, memory_order_relaxed))
        atomic_store_explicit(&h->max, v, memory_order_relaxed);
}

/* The largest value of bucket i. */
uint64_t sr__hist_upper(unsigned i);
/* Add h's samples into the plain sum (counts[SR_HIST_N], n, sum, max). */
struct sr_hist_sum {
    uint64_t b[SR_HIST_N];
    uint64_t n, sum, max;
};
void sr__hist_read(const struct sr_hist *h, struct sr_hist_sum *s);
void sr__hist_zero(struct sr_hist *h);
/* p50, p99, max of a sum. */
void sr__hist_latency(const struct sr_hist_sum *s, sr_latency *out);

#endif
