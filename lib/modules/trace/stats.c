/* SPDX-License-Identifier: MIT */
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

/* The rows of a table: each function's call side, then its served sides
 * (queue and run); row k of s is function k / 3, side k % 3. */
struct row {
    const char *name, *side;
    uint64_t n, err;
    const sr_latency *lat;
};

static bool row_at(const sr_stats *s, size_t k, struct row *r)
{
    const sr_fn_stats *e = &s->e[k / 3];
    int side = (int)(k % 3);
    if (side == 0 ? !e->calls : !e->served)
        return false;
    *r = (struct row){.name = e->name, .side = side == 0 ? "call" : side == 1 ? "queue" : "run",
                      .n = side == 0 ? e->calls : e->served, .err = side == 0 ? e->errors : e->serve_errors,
                      .lat = side == 0 ? &e->round_trip : side == 1 ? &e->queue : &e->run};
    return true;
}

static void widen(struct sr_stats_cols *c, int col, uint64_t v)
{
    c->min_ns[col] = v < c->min_ns[col] ? v : c->min_ns[col];
    c->max_ns[col] = v > c->max_ns[col] ? v : c->max_ns[col];
}

void sr__stats_widen(const sr_stats *s, struct sr_stats_cols *c)
{
    struct row r;
    for (size_t k = 0; k < 3 * s->n; k++)
        if (row_at(s, k, &r)) {
            widen(c, 0, r.lat->p50_ns);
            widen(c, 1, r.lat->p99_ns);
            widen(c, 2, r.lat->max_ns);
        }
}

/* A column's unit, so that it reads in one unit and its values compare at a
 * glance, none rounded to nothing: ns when all are below 10 us, ms when all
 * are 10 ms or more, else us (from 0.01us, with as many digits as the
 * largest needs). */
static int unit_of(const struct sr_stats_cols *c, int col)
{
    return c->max_ns[col] < 10000 ? 0 : c->min_ns[col] >= 10000000 ? 2 : 1;
}

static const char *in_unit(uint64_t ns, int unit, char *buf, size_t len)
{
    if (unit == 0)
        snprintf(buf, len, "%lluns", (unsigned long long)ns);
    else if (unit == 1)
        snprintf(buf, len, "%.2fus", (double)ns / 1e3);
    else
        snprintf(buf, len, "%.3fms", (double)ns / 1e6);
    return buf;
}

int sr__stats_print_cols(const sr_stats *s, const char *who, const struct sr_stats_cols *c, FILE *f)
{
    if (!s || !f)
        return sr__fail(-EINVAL, "sr_stats_print", "%s is NULL", s ? "the stream" : "the snapshot");
    int u[3] = {unit_of(c, 0), unit_of(c, 1), unit_of(c, 2)};
    fprintf(f, "shmrpc stats for %s: %zu functions\n  %-32s %-6s %10s %7s %11s %11s %11s\n", who ? who : "this worker",
            s->n, "function", "side", "calls", "errors", "p50", "p99", "max");
    struct row r;
    for (size_t k = 0; k < 3 * s->n; k++) {
        char a[32], b[32], d[32];
        if (row_at(s, k, &r))
            fprintf(f, "  %-32.32s %-6s %10llu %7llu %11s %11s %11s\n", r.name, r.side, (unsigned long long)r.n,
                    (unsigned long long)r.err, in_unit(r.lat->p50_ns, u[0], a, sizeof(a)),
                    in_unit(r.lat->p99_ns, u[1], b, sizeof(b)), in_unit(r.lat->max_ns, u[2], d, sizeof(d)));
    }
    return 0;
}

SR_API int sr_stats_print(const sr_stats *s, const char *who, FILE *f)
{
    struct sr_stats_cols c = SR_STATS_COLS_EMPTY;
    if (s)
        sr__stats_widen(s, &c);
    return sr__stats_print_cols(s, who, &c, f);
}
