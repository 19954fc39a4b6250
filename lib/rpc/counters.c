/* SPDX-License-Identifier: MIT */
/* The worker's counters (agent.h, ctr; segment.h, struct sr_worker_counters):
 * where they live, the heap's sampling for the launcher's live view
 * (shmrun --monitor, docs/LAUNCHER.md), and the gauges the profiler's
 * counter tracks read (module.h, sr__rpc_gauges). */
#include <errno.h>
#include <stdlib.h>

#include "agent.h"
#include "error.h"
#include "heap.h"
#include "parse.h"

#define MONITOR_MAX_S 3600.0

int sr__counters_init(sr_agent *a)
{
    sr_segment *seg = sr__transport_segment(a->tports);
    a->ctr = seg && a->rank < (int)seg->world ? &sr__seg_worker(seg, a->rank)->counters : &a->own_ctr;
    /* relaxed: statistics; a new generation of the rank, or a second sr_init, counts from zero */
    atomic_store_explicit(&a->ctr->calls_made, 0, memory_order_relaxed);
    atomic_store_explicit(&a->ctr->calls_ended, 0, memory_order_relaxed);
    atomic_store_explicit(&a->ctr->served_in, 0, memory_order_relaxed);
    atomic_store_explicit(&a->ctr->served_out, 0, memory_order_relaxed);
    atomic_store_explicit(&a->ctr->heap_bytes, sr__heap_allocated(), memory_order_relaxed);
    const char *v = getenv("SHMRPC_MONITOR_INTERVAL"); /* shmrun --monitor sets it */
    double s = 0;
    if (v && *v && (sr__parse_seconds(v, MONITOR_MAX_S, &s) || !(s > 0)))
        return sr__fail(-EINVAL, "sr_init", "worker%d: SHMRPC_MONITOR_INTERVAL takes seconds in (0, %g], not '%s'",
                        a->rank, MONITOR_MAX_S, v);
    a->mon_ns = (int64_t)(s * 1e9);
    atomic_init(&a->mon_due, 0);
    return 0;
}

void sr__counters_sample_slow(sr_agent *a)
{
    int64_t now = sr__now_coarse_ns();
    /* relaxed: the due time only elects one sampler; the sample is a statistic */
    int64_t due = atomic_load_explicit(&a->mon_due, memory_order_relaxed);
    if (now < due || !atomic_compare_exchange_strong_explicit(&a->mon_due, &due, now + a->mon_ns,
                                                              memory_order_relaxed, memory_order_relaxed))
        return;
    atomic_store_explicit(&a->ctr->heap_bytes, sr__heap_allocated(), memory_order_relaxed); /* relaxed: see segment.h */
}

/* ended is loaded first: made only grows, so made - ended is rarely short, never huge */
static uint64_t diff(_Atomic uint64_t *more, _Atomic uint64_t *less)
{
    uint64_t l = atomic_load_explicit(less, memory_order_relaxed); /* relaxed: statistics */
    uint64_t m = atomic_load_explicit(more, memory_order_relaxed);
    return m > l ? m - l : 0;
}

uint64_t sr__counters_in_flight(const struct sr_worker_counters *c)
{
    struct sr_worker_counters *w = (struct sr_worker_counters *)c;
    return diff(&w->calls_made, &w->calls_ended);
}

uint64_t sr__counters_serving(const struct sr_worker_counters *c)
{
    struct sr_worker_counters *w = (struct sr_worker_counters *)c;
    return diff(&w->served_in, &w->served_out);
}

void sr__rpc_gauges(struct sr_rpc_gauges *g)
{
    *g = (struct sr_rpc_gauges){0};
    sr_agent *a = sr__agent_get(NULL);
    if (!a)
        return;
    sr_segment *seg = sr__transport_segment(a->tports);
    g->in_flight = sr__counters_in_flight(a->ctr);
    g->inbox = seg && a->rank < (int)seg->world ? sr__ring_depth(sr__seg_inbox(seg, a->rank), seg->ring_slots) : 0;
    sr__agent_put(a);
}
