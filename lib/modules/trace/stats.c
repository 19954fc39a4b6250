/* Per-function statistics: the public API (shmrpc/stats.h). See trace.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "module.h"
#include "shmrpc/stats.h"
#include "trace.h"

int sr__probes_prepare(int rank);

struct sr_stats {
    size_t n;
    sr_fn_stats *e;
};

/* One function summed over every thread: the three histograms' sums. */
struct fn_sum {
    uint64_t calls, errors, served, serve_errors;
    struct sr_hist_sum rtt, queue, run;
    bool seen;
};

SR_API bool sr_stats_enable(bool on)
{
    if (on && sr__probes_prepare(sr__rpc_rank()))
        return sr_stats_enabled();
    /* relaxed: the mask is a hint read at each probe (rpc/module.h, "Probes") */
    uint32_t m = atomic_load_explicit(&sr__probe_mask, memory_order_relaxed);
    uint32_t was = sr__probe_set(on ? m | SR_PROBE_STATS : m & ~SR_PROBE_STATS);
    return was & SR_PROBE_STATS;
}

SR_API bool sr_stats_enabled(void)
{
    return atomic_load_explicit(&sr__probe_mask, memory_order_relaxed) & SR_PROBE_STATS; /* relaxed: a hint */
}

SR_API void sr_stats_reset(void) { sr__stats_bump_epoch(); }

static void add_block(struct fn_sum *s, const struct sr_fn_block *b)
{
    /* relaxed (all): statistics, single writer (hist.h) */
    s->calls += atomic_load_explicit(&b->calls, memory_order_relaxed);
    s->errors += atomic_load_explicit(&b->errors, memory_order_relaxed);
    s->served += atomic_load_explicit(&b->served, memory_order_relaxed);
    s->serve_errors += atomic_load_explicit(&b->serve_errors, memory_order_relaxed);
    sr__hist_read(&b->rtt, &s->rtt);
    sr__hist_read(&b->queue, &s->queue);
    sr__hist_read(&b->run, &s->run);
    s->seen = true;
}

/* Sum every table of a that belongs to its current epoch. */
static void sum_tables(const struct sr_area *a, struct fn_sum *sum)
{
    /* acquire: pairs with the release in sr__stats_bump_epoch */
    uint32_t e = atomic_load_explicit(&((struct sr_area *)a)->epoch, memory_order_acquire);
    for (const struct sr_ttable *t = sr__area_tables(a); t; t = sr__area_next(a, t)) {
        /* acquire: pairs with catch_up's release */
        if (atomic_load_explicit(&((struct sr_ttable *)t)->epoch, memory_order_acquire) != e)
            continue;
        for (unsigned i = 0; i < SR_TRACE_FNS; i++) {
            /* acquire: pairs with sr__fn_block's release: the block is initialised */
            uint64_t off = atomic_load_explicit(&((struct sr_ttable *)t)->fn[i], memory_order_acquire);
            const struct sr_fn_block *b = off ? sr__area_get(a, off, sizeof(*b)) : NULL;
            if (b)
                add_block(&sum[i], b);
        }
    }
}

int sr__stats_of(const struct sr_area *a, sr_stats **out)
{
    struct fn_sum *sum = calloc(SR_TRACE_FNS, sizeof(*sum));
    sr_stats *s = calloc(1, sizeof(*s));
    if (s)
        s->e = calloc(SR_TRACE_FNS, sizeof(*s->e));
    if (!sum || !s || !s->e) {
        free(sum);
        sr_stats_free(s);
        return -ENOMEM;
    }
    if (a)
        sum_tables(a, sum);
    for (unsigned i = 0; i < SR_TRACE_FNS; i++) {
        struct fn_sum *f = &sum[i];
        if (!f->seen || (!f->calls && !f->served))
            continue;
        sr_fn_stats *e = &s->e[s->n++];
        *e = (sr_fn_stats){.name = sr__area_name(a, i), .calls = f->calls, .errors = f->errors, .served = f->served,
                           .serve_errors = f->serve_errors};
        sr__hist_latency(&f->rtt, &e->round_trip);
        sr__hist_latency(&f->queue, &e->queue);
        sr__hist_latency(&f->run, &e->run);
    }
    free(sum);
    *out = s;
    return 0;
}

SR_API int sr_stats_snapshot(sr_stats **out)
{
    if (!out)
        return sr__fail(-EINVAL, "sr_stats_snapshot", "out is NULL");
    if (sr__stats_of(sr__area(), out))
        return sr__fail(-ENOMEM, "sr_stats_snapshot", "out of memory");
    return 0;
}

SR_API size_t sr_stats_len(const sr_stats *s) { return s ? s->n : 0; }

SR_API const sr_fn_stats *sr_stats_at(const sr_stats *s, size_t i) { return s && i < s->n ? &s->e[i] : NULL; }

SR_API const sr_fn_stats *sr_stats_find(const sr_stats *s, const char *name)
{
    for (size_t i = 0; s && name && i < s->n; i++)
        if (!strcmp(s->e[i].name, name))
            return &s->e[i];
    return NULL;
}

SR_API void sr_stats_free(sr_stats *s)
{
    if (s)
        free(s->e);
    free(s);
}

/* ns in a short human unit */
static const char *dur(uint64_t ns, char *buf, size_t len)
{
    if (ns < 10000)
        snprintf(buf, len, "%lluns", (unsigned long long)ns);
    else if (ns < 10000000)
        snprintf(buf, len, "%.1fus", (double)ns / 1e3);
    else
        snprintf(buf, len, "%.1fms", (double)ns / 1e6);
    return buf;
}

static void row(FILE *f, const char *name, const char *side, uint64_t n, uint64_t err, const sr_latency *l)
{
    char a[24], b[24], c[24];
    fprintf(f, "  %-32.32s %-6s %10llu %7llu %10s %10s %10s\n", name, side, (unsigned long long)n,
            (unsigned long long)err, dur(l->p50_ns, a, sizeof(a)), dur(l->p99_ns, b, sizeof(b)),
            dur(l->max_ns, c, sizeof(c)));
}

SR_API int sr_stats_print(const sr_stats *s, const char *who, FILE *f)
{
    if (!s || !f)
        return sr__fail(-EINVAL, "sr_stats_print", "%s is NULL", s ? "the stream" : "the snapshot");
    fprintf(f, "shmrpc stats for %s: %zu functions\n  %-32s %-6s %10s %7s %10s %10s %10s\n", who ? who : "this worker",
            s->n, "function", "side", "calls", "errors", "p50", "p99", "max");
    for (size_t i = 0; i < s->n; i++) {
        const sr_fn_stats *e = &s->e[i];
        if (e->calls)
            row(f, e->name, "call", e->calls, e->errors, &e->round_trip);
        if (e->served) {
            row(f, e->name, "queue", e->served, e->serve_errors, &e->queue);
            row(f, e->name, "run", e->served, e->serve_errors, &e->run);
        }
    }
    return 0;
}
