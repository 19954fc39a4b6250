/* SPDX-License-Identifier: MIT */
/* sr_spawn: a job inside the calling program. See shmrpc/spawn.h. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "job.h"
#include "shmrpc/spawn.h"
#include "trace_seam.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
/* Workers end with _exit(), which skips LeakSanitizer's exit hook: run it here. */
static void leak_check(void) { __lsan_do_leak_check(); }
/* In a child forked from a non-main thread, LeakSanitizer cannot scan the
 * parent's other threads and would call the job's tables (reachable from the
 * spawning thread's stack) leaked: make the job itself a root. */
static void leak_roots(sr_job *job) { __lsan_register_root_region(job, sizeof(*job)); }
#else
static void leak_check(void) {}
static void leak_roots(sr_job *job) { (void)job; }
#endif

static bool forked_from_main; /* set in the parent before fork; read in the child */

struct spawn_call {
    int (*fn)(int, int, void *);
    void *arg;
    struct sr_trace_job *trace; /* this attempt's */
    int replace;                /* replacements allowed (SR_RESTART_RANK) */
};

static void run_worker(sr_job *job, int rank, void *p)
{
    leak_roots(job);
    struct spawn_call *c = p;
    sr__launch_env_set(&(struct sr_launch_env){.fd = job->seg.fd, .rank = rank, .world_size = job->n});
    sr__trace_job_child(c->trace, rank, false);
    int rc = c->fn(rank, job->n, c->arg);
    fflush(NULL);
    /* A failing worker is going down anyway: its leaks are noise. And in a
     * child forked from a non-main thread LeakSanitizer cannot suspend the
     * parent's other threads, so its verdict there would be unreliable. */
    if (rc == 0 && forked_from_main)
        leak_check();
    _exit(rc == 0 ? 0 : (rc > 0 && rc < 256) ? rc : 1);
}

/* One attempt (sr__job_run): fork every rank, supervise them. */
static int attempt(sr_job *job, void *p)
{
    struct spawn_call *c = p;
    job->replace_left = c->replace ? c->replace - job->spent : 0; /* one budget with the restarts (job.h) */
    /* SHMRPC_TRACE, SHMRPC_STATS: checked and set up before any worker starts (docs/PROFILING.md) */
    int rc = sr__trace_job_begin(&c->trace, job->n, job->replace_left, job->restart, "sr_spawn");
    if (rc)
        return rc;
    for (int r = 0; r < (int)job->seg.launched && !rc; r++) /* an elastic job's other ranks start free */
        rc = sr__job_fork(job, r, run_worker, p);
    if (rc)
        sr__job_stop(job);
    int status = rc ? rc : sr__job_supervise(job, NULL);
    sr__trace_job_end(c->trace); /* however the attempt ended: the trace and the statistics it left */
    c->trace = NULL;
    return status;
}

SR_API int sr_spawn(int world_size, int (*fn)(int, int, void *), void *arg, const sr_spawn_opts *opts)
{
    static const sr_spawn_opts defaults;
    if (!opts)
        opts = &defaults;
    if (!fn)
        return sr__fail(-EINVAL, "sr_spawn", "fn is NULL");
    char name[40];
    snprintf(name, sizeof(name), "%s", opts->name_prefix ? opts->name_prefix : "shmrpc");
    if (opts->max_restarts < 0 || (opts->restart != SR_RESTART_JOB && opts->restart != SR_RESTART_RANK))
        return sr__fail(-EINVAL, "sr_spawn", "max_restarts %d / restart policy %d: want >= 0 and SR_RESTART_JOB or "
                        "SR_RESTART_RANK", opts->max_restarts, (int)opts->restart);
    if (opts->max_workers && opts->max_workers < world_size)
        return sr__fail(-EINVAL, "sr_spawn", "max_workers %d is below the world size %d", opts->max_workers,
                        world_size);
    bool replace = opts->restart == SR_RESTART_RANK && opts->max_restarts > 0;
    bool elastic = opts->max_workers > world_size;
    sr_segment_opts so = {.world_size = elastic ? opts->max_workers : world_size, .launched = world_size,
                          .size = opts->shm_size, .ring_slots = opts->ring_slots,
                          .name = name, .flags = (replace ? SR_SEG_F_REPLACE : 0) | (elastic ? SR_SEG_F_ELASTIC : 0),
                          .heap_spares = replace ? sr__seg_replace_spares(opts->max_restarts) : 0};
    struct spawn_call call = {fn, arg, NULL, replace ? opts->max_restarts : 0};
    forked_from_main = gettid() == getpid();
    int status = sr__job_run(&so, "sr_spawn", opts->max_restarts, attempt, &call);
    return status == 0 ? 0 : status < 0 ? status : -SR_EWORKER;
}
