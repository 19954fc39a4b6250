/* SPDX-License-Identifier: MIT */
/* shmrun's command line. */
#ifndef SR_LAUNCHER_ARGS_H
#define SR_LAUNCHER_ARGS_H

#include <stdbool.h>
#include <stdint.h>

enum tag_kind { TAG_NONE, TAG_RANK, TAG_NAME };
enum bind_kind { BIND_NONE, BIND_CORE, BIND_NUMA };

struct args {
    int n;
    uint64_t shm_size;
    uint32_t ring_slots;
    const char *prefix;
    enum tag_kind tag;      /* --tag-output[=rank|name] */
    const char *output_dir; /* --output-dir DIR, or NULL */
    int64_t fold_ns;        /* --fold-window: how long a stderr line waits for copies */
    int64_t grace_ns;       /* --grace: after a forwarded SIGTERM/SIGINT */
    enum bind_kind bind;    /* --bind-to */
    bool report_bindings;
    int max_restarts;       /* --max-restarts: restarts after a worker is killed by a signal */
    bool restart_rank;      /* --restart rank: a new process for the failed rank only (lib/job/job.h) */
    int max_workers;        /* --max-workers: an elastic job's rank space (0: n) */
    const char *join;       /* --join JOB: join that job instead of starting one (join.c) */
    int join_rank;          /* --rank with --join; -1: the lowest free */
    int64_t monitor_ns;     /* --monitor[=SECONDS]: the live view's interval (monitor.h); 0: off */
    char **argv;            /* the program and its arguments */
};

#define GRACE_DEFAULT_NS (INT64_C(10) * 1000000000)
#define FOLD_DEFAULT_NS (INT64_C(250) * 1000000)
#define MONITOR_DEFAULT_NS (INT64_C(1000) * 1000000)

/* 0 to run, 1 after --help or --version (printed), 2 for a bad command line
 * (one error line and the usage hint printed on stderr). */
int parse_args(int argc, char **argv, struct args *a);

#endif
