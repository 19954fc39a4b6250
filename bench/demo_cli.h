/* SPDX-License-Identifier: MIT */
/* What the training demos (demo_train, demo_pipeline) share around their
 * training: the clock, the job's size before sr_init, and the command line
 * (a getopt_long loop over the demo's own options, number checks, errors
 * with the usage, the checkpoint options' rules). Header only: each demo
 * is one program built from its file, loss_svg.c and this. */
#ifndef SR_BENCH_DEMO_CLI_H
#define SR_BENCH_DEMO_CLI_H

#include <errno.h>
#include <math.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct demo_cli {
    const char *prog;  /* "demo_train" */
    const char *usage; /* printed after an error, and by --help */
};

static inline double demo_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* The job's size before sr_init: shmrun's, or mpirun's (docs/MULTIHOST.md);
 * 0 outside a job. */
static inline int demo_world_from_env(void)
{
    const char *s = getenv("SHMRPC_WORLD_SIZE");
    if (!s)
        s = getenv("OMPI_COMM_WORLD_SIZE");
    return s ? atoi(s) : 0;
}

/* "PROG: WHAT: 'VAL'" and the usage on stderr; 2, the exit status. */
static inline int demo_bad(const struct demo_cli *cli, const char *what, const char *val)
{
    fprintf(stderr, "%s: %s: '%s'\n%s", cli->prog, what, val ? val : "", cli->usage);
    return 2;
}

/* s is a whole number in [lo, hi], into *out. */
static inline bool demo_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    *out = v;
    return !errno && end != s && !*end && v >= lo && v <= hi;
}

/* Every option through set_opt(c, arg, world) (the offending word as arg
 * for an unknown one, c '?'), which returns 0, 1 (--help: stop, exit 0) or
 * 2 (an error it reported); then no argument may be left. */
static inline int demo_parse(const struct demo_cli *cli, int argc, char **argv, const char *shorts,
                             const struct option *longs, int (*set_opt)(int c, const char *arg, int world), int world)
{
    int c, rc;
    opterr = 0;
    while ((c = getopt_long(argc, argv, shorts, longs, NULL)) != -1)
        if ((rc = set_opt(c, c == '?' ? argv[optind - 1] : optarg, world)))
            return rc;
    return optind < argc ? demo_bad(cli, "unexpected argument", argv[optind]) : 0;
}

/* The checkpoint options: --resume needs --checkpoint-dir, which saves
 * every 100 steps unless --save-every says otherwise. */
static inline int demo_ckpt_opts(const struct demo_cli *cli, bool resume, const char *dir, int64_t *save_every)
{
    if (resume && !dir)
        return demo_bad(cli, "--resume needs --checkpoint-dir", "");
    if (dir && !*save_every)
        *save_every = 100;
    return 0;
}

/* Whether a checkpoint is due after step (of total): every save_every steps
 * with a directory, the last step excepted (the run's end saves it). */
static inline bool demo_ckpt_due(const char *dir, int64_t step, int64_t save_every, int64_t total)
{
    return dir && step % save_every == 0 && step < total;
}

/* The mean of the last (at most) 50 losses before step: loss[0..step). */
static inline double demo_running_loss(const double *loss, int64_t step)
{
    int64_t k = step < 50 ? step : 50;
    double s = 0;
    for (int64_t i = step - k; i < step; i++)
        s += loss[i];
    return k ? s / (double)k : NAN;
}

/* Whether the progress line is due at time t (seconds) after step of
 * total: on a terminal every 0.1 s, else every tenth of the run; always at
 * the last step. */
static inline bool demo_progress_due(bool tty, double t, double t_print, int64_t step, int64_t total)
{
    if (step == total)
        return true;
    return tty ? t - t_print >= 0.1 : step % (total / 10 > 0 ? total / 10 : 1) == 0;
}

#endif
