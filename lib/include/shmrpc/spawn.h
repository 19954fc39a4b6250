/* SPDX-License-Identifier: MIT */
/* shmrpc: starting a job from inside a program (the C counterpart of
 * torch.multiprocessing.spawn).
 *
 * sr_spawn() creates the job's shared-memory segment, forks world_size
 * workers (no exec) and runs fn(rank, world_size, arg) in each; a worker's
 * exit status is fn's return value (0 success, 1..255 failure, other values
 * map to 1). It blocks until the job ends, supervising exactly as shmrun does:
 * when a worker exits non-zero or is killed by a signal, the others are
 * killed at once, one line naming the rank, pid and status is printed to
 * stderr, and sr_spawn returns -SR_EWORKER with the same line in
 * sr_last_error(). With opts->max_restarts, a worker killed by a signal
 * (not one that returns non-zero) instead stops the others and starts all
 * world_size workers again, fn from the start in fresh processes on a fresh
 * segment, with SHMRPC_RESTART_COUNT (and TORCHELASTIC_RESTART_COUNT) set to
 * the restart's number in their environment (0 on the first attempt); one
 * line per restart names the rank and signal (docs/API.md).
 * Workers die with the calling thread (PR_SET_PDEATHSIG), so
 * call it from a thread that outlives the job; it blocks until then anyway.
 */
#ifndef SHMRPC_SPAWN_H
#define SHMRPC_SPAWN_H

#if defined(SR__BUILDING) && !defined(SR__SEES_JOB)
#error "shmrpc/spawn.h belongs to the job layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stdint.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What happens when a worker dies (docs/LAUNCHER.md, "Surviving a worker's death"). */
typedef enum sr_restart_policy {
    SR_RESTART_JOB = 0,  /* the job ends (and, with max_restarts, starts again) */
    SR_RESTART_RANK = 1, /* a new process replaces the failed rank; the others keep running */
} sr_restart_policy;

typedef struct sr_spawn_opts {
    uint64_t shm_size;       /* total segment bytes; 0: 1 GiB of heap per worker (sparse) */
    uint32_t ring_slots;     /* inbox slots per worker, a power of two; 0: 1024 */
    const char *name_prefix; /* segment name prefix, for reports and leak checks; NULL: "shmrpc" */
    int max_restarts;        /* restarts allowed: a worker killed by a signal starts the whole job again
                              * (SR_RESTART_JOB, shmrun --max-restarts) or its rank again
                              * (SR_RESTART_RANK, shmrun --restart rank; the whole job when the rank cannot be
                              * replaced in place, e.g. inside sr_shutdown), at most this many times in all; 0: never */
    sr_restart_policy restart;
    int max_workers;         /* > world_size: an elastic job (shmrun --max-workers; docs/LAUNCHER.md): ranks
                              * world_size..max_workers-1 start free, workers leave with sr_shutdown and
                              * others join (shmrun --join); fn gets max_workers as its world size.
                              * 0: world_size (not elastic) */
} sr_spawn_opts;

/* 0 when every worker returned 0. Errors: -EINVAL bad world size or options,
 * or SIGCHLD ignored in the calling process (SIG_IGN or SA_NOCLDWAIT: the
 * kernel would reap the workers before their status could be read);
 * -SR_EWORKER a worker failed (see above); other -errno from fork/memfd. */
SR_API int sr_spawn(int world_size, int (*fn)(int rank, int world_size, void *arg), void *arg,
                    const sr_spawn_opts *opts);

/* In a worker of an elastic job: the job's id, for `shmrun --join ID prog`
 * (SHMRPC_JOB; docs/LAUNCHER.md, "Elastic jobs"); NULL in any other. */
SR_API const char *sr_job_id(void);

#ifdef __cplusplus
}
#endif
#endif
