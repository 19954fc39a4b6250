/* SPDX-License-Identifier: MIT */
/* Log-linear histograms. See hist.h. */
#include "hist.h"

#include <string.h>

uint64_t sr__hist_upper(unsigned i)
{
    if (i < 16)
        return i;
    unsigned e = 4 + (i - 16) / 8, sub = (i - 16) % 8;
    return ((uint64_t)(8 + sub + 1) << (e - 3)) - 1;
}

void sr__hist_read(const struct sr_hist *h, struct sr_hist_sum *s)
{
    /* relaxed (all): statistics, see hist.h */
    for (unsigned i = 0; i < SR_HIST_N; i++)
        s->b[i] += atomic_load_explicit(&h->b[i], memory_order_relaxed);
    s->n += atomic_load_explicit(&h->n, memory_order_relaxed);
    s->sum += atomic_load_explicit(&h->sum, memory_order_relaxed);
    uint64_t m = atomic_load_explicit(&h->max, memory_order_relaxed);
    s->max = m > s->max ? m : s->max;
}

void sr__hist_zero(struct sr_hist *h)
{
    /* relaxed (all): the writer's own words */
    for (unsigned i = 0; i < SR_HIST_N; i++)
        atomic_store_explicit(&h->b[i], 0, memory_order_relaxed);
    atomic_store_explicit(&h->n, 0, memory_order_relaxed);
    atomic_store_explicit(&h->sum, 0, memory_order_relaxed);
    atomic_store_explicit(&h->max, 0, memory_order_relaxed);
}

/* The value at rank (1-based) of the sorted samples: its bucket's upper bound. */
static uint64_t at_rank(const struct sr_hist_sum *s, uint64_t rank)
{
    uint64_t seen = 0;
    for (unsigned i = 0; i < SR_HIST_N; i++) {
        seen += s->b[i];
        if (seen >= rank)
            return sr__hist_upper(i) < s->max ? sr__hist_upper(i) : s->max;
    }
    return s->max;
}

void sr__hist_latency(const struct sr_hist_sum *s, sr_latency *out)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < SR_HIST_N; i++)
        n += s->b[i];
    *out = (sr_latency){.count = n, .sum_ns = s->sum, .max_ns = n ? s->max : 0};
    if (!n)
        return;
    out->p50_ns = at_rank(s, (n + 1) / 2);
    out->p99_ns = at_rank(s, n - n / 100); /* ceil(0.99 n) */
}
