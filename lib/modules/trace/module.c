/* SPDX-License-Identifier: MIT */
/* The profiler as a module of the agent (rpc/module.h): it reads
 * SHMRPC_STATS and SHMRPC_TRACE at sr_init (and attaches the record area its
 * launcher made, trace.h), and at sr_shutdown prints the statistics and,
 * without a launcher that writes the trace from the area (job.c), writes
 * this worker's trace part. It adds no per-call hook: the calls reach it
 * through its probe group (module.h, "Probes"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "parse.h"
#include "log.h"
#include "module.h"
#include "shmrpc/rpc.h"
#include "shmrpc/stats.h"
#include "trace.h"

int sr__probes_prepare(int rank);
void sr__probes_ops(bool on);
extern const struct sr_probe_ops sr__trace_probe_ops;

/* Set by init, read by fini (the thread of sr_init, then of sr_shutdown,
 * which life_lock orders). */
static uint32_t env_mask;
static bool ops_on; /* SHMRPC_TRACE_OPS: the tensor layer's op hooks are ours */
static char trace_path[4096];
static char worker[128];

static bool env_on(const char *var)
{
    const char *v = getenv(var);
    return v && *v && strcmp(v, "0") != 0;
}

static int profiler_init(const sr_init_opts *o)
{
    (void)o;
    int rank = sr__rpc_rank();
    const char *name = sr_worker_name(rank);
    snprintf(worker, sizeof(worker), "%s", name ? name : "worker");
    const char *path = getenv("SHMRPC_TRACE");
    int64_t cap = (int64_t)sr__trace_cap;
    if (sr__env_int("sr_init", "SHMRPC_TRACE_MAX_EVENTS", 0, INT64_MAX, &cap))
        return -EINVAL;
    sr__trace_cap = (uint64_t)cap;
    env_mask = (env_on("SHMRPC_STATS") ? SR_PROBE_STATS : 0) | (path && *path ? SR_PROBE_TRACE : 0);
    snprintf(trace_path, sizeof(trace_path), "%s", path && *path ? path : "");
    /* The launcher's area, attached now (its fd is closed); else made at the first record.
     * NULL (no address space for it): nothing is recorded. */
    struct sr_area *a = env_mask || getenv("SHMRPC_TRACE_AREA") ? sr__area() : NULL;
    if (a) /* written before anything else reads it: the launcher, after this process ended */
        snprintf(a->worker, sizeof(a->worker), "%s", worker);
    else if (env_mask)
        sr_logf(SR_LOG_WARN, "no memory for the profiler's records: %s is off",
                env_mask & SR_PROBE_TRACE ? "SHMRPC_TRACE" : "SHMRPC_STATS");
    if (sr__probes_prepare(rank))
        return sr__fail(-ENOMEM, "sr_init", "worker%d: out of memory for the profiler", rank);
    /* relaxed: see module.h, "Probes" */
    if (env_mask)
        sr__probe_set(atomic_load_explicit(&sr__probe_mask, memory_order_relaxed) | env_mask);
    /* tensor ops as spans: asked for, and only with the trace on */
    ops_on = (env_mask & SR_PROBE_TRACE) && env_on("SHMRPC_TRACE_OPS");
    if (ops_on)
        sr__probes_ops(true);
    return 0;
}

/* Under a launcher that prints the job's statistics (in rank order, at its
 * end), say that ours are complete; else print them now. */
static void print_stats(struct sr_area *a)
{
    /* relaxed (both): set before the fork by the launcher; read by it after this process is reaped */
    if (atomic_load_explicit(&a->flags, memory_order_relaxed) & SR_AREA_JOB_STATS) {
        atomic_fetch_or_explicit(&a->flags, SR_AREA_STATS_FINAL, memory_order_relaxed);
        return;
    }
    sr_stats *s;
    if (sr_stats_snapshot(&s))
        return;
    char who[160];
    snprintf(who, sizeof(who), "%s (rank %d)", worker, sr__rpc_rank());
    sr_stats_print(s, who, stderr);
    fflush(stderr);
    sr_stats_free(s);
}

static void profiler_fini(void)
{
    uint32_t m = env_mask;
    env_mask = 0;
    if (ops_on)
        sr__probes_ops(false);
    ops_on = false;
    if (!m)
        return;
    /* relaxed: see module.h, "Probes"; the trace stops here, statistics enabled by the API stay */
    sr__probe_set(atomic_load_explicit(&sr__probe_mask, memory_order_relaxed) & ~m);
    struct sr_area *a = sr__area(); /* made at init */
    if (!a)
        return;
    /* relaxed: set before the fork by the launcher */
    bool launcher_writes = atomic_load_explicit(&a->flags, memory_order_relaxed) & SR_AREA_JOB_TRACE;
    if (m & SR_PROBE_TRACE && !launcher_writes && sr__trace_write_part(a, trace_path, sr__rpc_rank(), "sr_shutdown"))
        sr__log_text(SR_LOG_ERROR, sr_last_error());
    if (m & SR_PROBE_STATS)
        print_stats(a);
}

static const struct sr_module_life_ops profiler_life = {
    .init = profiler_init,
    .fini = profiler_fini,
};

static const sr_module profiler_module = {
    .name = "profiler",
    .life = &profiler_life,
    .probe = &sr__trace_probe_ops,
};

__attribute__((constructor)) static void profiler_register(void)
{
    sr__module_register(&profiler_module, NULL);
}
