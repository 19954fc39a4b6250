/* SPDX-License-Identifier: MIT */
/* Benches that drive whole jobs under the real shmrun (bench_restart,
 * bench_replace): the program's own path and shmrun's beside it in the
 * build, a job started with a report pipe its workers write lines to, the
 * lines handed to the bench as they come, every wait with a bound, the
 * job's end with its stderr shown when it failed; and the line of a figure
 * measured once per trial (or kill) next to its floor, with their ratio.
 */
#ifndef SR_BENCH_SHMRUN_JOB_H
#define SR_BENCH_SHMRUN_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct bench_job {
    const char *who;                            /* the bench, in messages */
    const char *shmrun;                         /* shmrun's path */
    int (*take)(void *ctx, const char *line);   /* a report line: 0, or -1 (a bad line, said) */
    void *ctx;
    pid_t pid;                                  /* shmrun; 0 before the start */
    int fd;                                     /* the report pipe's read end */
    int log;                                    /* a file with shmrun's and the workers' stderr */
    char buf[4096];
    size_t len;
} bench_job;

/* This program's path (its workers exec it) and, unless *shmrun is set,
 * shmrun's: bench/../launcher/shmrun beside it in the build. */
void bench_job_paths(char *self, size_t self_len, char *shmrun, size_t shmrun_len);

/* A report pipe and a log file for the next job of j: the pipe's write end
 * (to name on the workers' command line), or -1. */
int bench_job_pipe(bench_job *j);

/* Fork and exec argv (argv[0]: j->shmrun) with its stderr in the log; the
 * parent's copy of the pipe's write end w is closed. 0 or -1. */
int bench_job_start(bench_job *j, char *const argv[], int w);

/* Hand the report lines to j->take until done(ctx), waiting at most wait_ms
 * in all; -1 when the time is up (saying `what`), the workers closed the
 * pipe, or a line was bad. */
int bench_job_await(bench_job *j, bool (*done)(void *ctx), int wait_ms, const char *what);

/* shmrun's exit, waited for at most wait_ms (killed at once when rc != 0);
 * 0 if rc was 0 and it exited 0, else -1 with the job's stderr printed. */
int bench_job_end(bench_job *j, int rc, int wait_ms);

/* One line (bench_print's format, and a JSON object with --json): a figure
 * measured n times (ours[i], in ns) next to its floor (floor_[i], the same
 * trial's or kill's), their p50, p99 and the p50 and p99 of the per-trial
 * ratios. */
void bench_job_print(const char *name, const char *config, const char *floor_name, const double *ours,
                     const double *floor_, int n);

#endif
