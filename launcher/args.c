/* SPDX-License-Identifier: MIT */
/* shmrun's command line: getopt_long, every value checked, one error line. */
#include "args.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "segment.h"
#include "parse.h"

#ifndef SHMRUN_VERSION
#define SHMRUN_VERSION "unknown"
#endif

static const char usage[] =
    "usage: shmrun -n N [options] [--] prog [args...]\n"
    "       shmrun --join JOB [--rank R] [--] prog [args...]\n"
    "  -n, --nproc N          number of workers (1..4096)\n"
    "  --max-workers M        an elastic job with room for M ranks (M > N): ranks N..M-1 start free,\n"
    "                         a worker's sr_shutdown is a leave, others join with --join; its job id\n"
    "                         is in each worker's SHMRPC_JOB (default: N, not elastic)\n"
    "  --join JOB             run prog as a new worker of the running elastic job JOB, on its lowest\n"
    "                         free rank, with this terminal's stdin, stdout and stderr; exit as it does\n"
    "  --rank R               with --join: take rank R, which must be free\n"
    "  --shm-size SIZE        segment size in bytes, or with a K, M, G suffix (default: 1G of heap per worker, sparse)\n"
    "  --name-prefix P        segment name, shown in reports and /proc (default: shmrpc)\n"
    "  --ring-slots S         inbox slots per worker, a power of two (default: 1024)\n"
    "  --tag-output[=rank|name]\n"
    "                         prefix each output line with [rank] (default) or [worker name]\n"
    "  --output-dir DIR       write each rank's output to DIR/RANK/stdout.log and DIR/RANK/stderr.log\n"
    "  --fold-window SECONDS  with --tag-output: a stderr line waits this long for the same line from\n"
    "                         other ranks, printed once as [0-3,5] (default: 0.25; 0: no folding)\n"
    "  --grace SECONDS        after forwarding SIGTERM or SIGINT, SIGKILL the workers still running\n"
    "                         this long after (default: 10); the same for the processes the workers\n"
    "                         leave running when the job ends\n"
    "  --bind-to none|core|numa\n"
    "                         pin each worker to one core or NUMA node, round robin (default: none)\n"
    "  --report-bindings      print each rank's CPU binding on stderr\n"
    "  --max-restarts N       when a worker is killed by a signal, start the whole job again, at most\n"
    "                         N times (default: 0); a worker that exits non-zero is not restarted\n"
    "  --restart job|rank     with --max-restarts: restart the whole job (default), or start a new\n"
    "                         process for the failed rank only while the others keep running (the\n"
    "                         whole job when it cannot be, e.g. inside sr_shutdown; N counts both)\n"
    "  --monitor[=SECONDS]    a live view on stderr, every SECONDS (default: 1): per worker, calls served\n"
    "                         and made per second and in all, inbox depth, calls in flight, heap in use\n"
    "                         and CPU %; redrawn in place on a terminal, appended otherwise; totals at the end\n"
    "  -V, --version          print the version and exit\n"
    "  -h, --help             print this help and exit\n"
    "Workers get SHMRPC_FD, SHMRPC_RANK, SHMRPC_WORLD_SIZE, SHMRPC_RESTART_COUNT, SHMRPC_JOB (elastic\n"
    "jobs), and RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, TORCHELASTIC_RESTART_COUNT as torchrun\n"
    "sets them.\n"
    "stdin goes to rank 0; the others read /dev/null.\n"
    "SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1 and SIGUSR2 are forwarded to every worker.\n";

static int bad_usage(const char *fmt, const char *val)
{
    fprintf(stderr, "shmrun: ");
    fprintf(stderr, fmt, val);
    fprintf(stderr, "\nTry 'shmrun --help' for usage.\n");
    return 2;
}

/* Bytes, with an optional K, M or G suffix ("64M"). */
static int parse_size(const char *s, uint64_t *out)
{
    size_t len = strlen(s);
    unsigned shift = 0;
    switch (len ? s[len - 1] : 0) {
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    }
    uint64_t v;
    if (sr__parse_digits(s, len - (shift != 0), UINT64_MAX >> shift, &v))
        return -1;
    *out = v << shift;
    return 0;
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    int64_t v;
    if (sr__parse_int(s, lo, hi, &v))
        return -1;
    *out = (long)v;
    return 0;
}

/* Seconds in [0, max], fractions allowed: "10", "0.5". */
static int parse_seconds(const char *s, double max, int64_t *ns)
{
    double v;
    if (sr__parse_seconds(s, max, &v))
        return -1;
    *ns = (int64_t)llround(v * 1e9);
    return 0;
}

/* A directory passes access(X_OK) but fails in execvp, in every worker. */
static bool is_executable_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

static bool program_exists(const char *prog)
{
    if (strchr(prog, '/'))
        return is_executable_file(prog);
    const char *path = getenv("PATH");
    char buf[PATH_MAX];
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        size_t len = strcspn(p, ":");
        snprintf(buf, sizeof(buf), "%.*s/%s", (int)len, p, prog);
        if (is_executable_file(buf))
            return true;
        p += len + (p[len] == ':');
    }
    return false;
}

/* The option getopt_long just rejected: a long one is named by its argument;
 * a short one by optopt, since inside a group ("-xq") optind has not moved. */
static const char *bad_option(char **argv, char buf[3])
{
    const char *arg = argv[optind - 1];
    if (optopt == 0 || !strncmp(arg, "--", 2))
        return arg;
    snprintf(buf, 3, "-%c", optopt);
    return buf;
}

enum { OPT_SHM = 256, OPT_PREFIX, OPT_RING, OPT_TAG, OPT_DIR, OPT_FOLD, OPT_GRACE, OPT_BIND, OPT_REPORT, OPT_RESTARTS, OPT_POLICY,
       OPT_VERSION, OPT_MAXW, OPT_JOIN, OPT_RANK, OPT_MONITOR };

static const struct option opts[] = {
    {"nproc", required_argument, NULL, 'n'},        {"shm-size", required_argument, NULL, OPT_SHM},
    {"name-prefix", required_argument, NULL, OPT_PREFIX}, {"ring-slots", required_argument, NULL, OPT_RING},
    {"tag-output", optional_argument, NULL, OPT_TAG}, {"output-dir", required_argument, NULL, OPT_DIR},
    {"fold-window", required_argument, NULL, OPT_FOLD}, {"grace", required_argument, NULL, OPT_GRACE},
    {"bind-to", required_argument, NULL, OPT_BIND},  {"report-bindings", no_argument, NULL, OPT_REPORT},
    {"max-restarts", required_argument, NULL, OPT_RESTARTS}, {"restart", required_argument, NULL, OPT_POLICY},
    {"version", no_argument, NULL, 'V'},     {"help", no_argument, NULL, 'h'},
    {"max-workers", required_argument, NULL, OPT_MAXW}, {"join", required_argument, NULL, OPT_JOIN},
    {"rank", required_argument, NULL, OPT_RANK},     {"monitor", optional_argument, NULL, OPT_MONITOR},
    {0, 0, 0, 0}};

/* The options of the job itself. 0, or 2 (printed). */
static int job_option(int c, const char *v, struct args *a)
{
    long l;
    switch (c) {
    case 'n':
        if (parse_int(v, 1, SR_MAX_WORKERS, &l))
            return bad_usage("-n takes a number of workers in [1, 4096], not '%s'", v);
        a->n = (int)l;
        return 0;
    case OPT_SHM:
        if (parse_size(v, &a->shm_size) || !a->shm_size)
            return bad_usage("--shm-size takes a size like 512M or 4G, not '%s'", v);
        return 0;
    case OPT_PREFIX:
        if (!*v || strlen(v) > 40 || strchr(v, '/'))
            return bad_usage("--name-prefix takes 1 to 40 characters without '/', not '%s'", v);
        a->prefix = v;
        return 0;
    default: /* OPT_RING */
        if (parse_int(v, 2, 1 << 24, &l) || (l & (l - 1)))
            return bad_usage("--ring-slots takes a power of two in [2, 2^24], not '%s'", v);
        a->ring_slots = (uint32_t)l;
        return 0;
    }
}

/* Elastic jobs, and joining one. 0, or 2 (printed). */
static int elastic_option(int c, const char *v, struct args *a)
{
    long l;
    switch (c) {
    case OPT_MAXW:
        if (parse_int(v, 1, SR_MAX_WORKERS, &l))
            return bad_usage("--max-workers takes a number of ranks in [1, 4096], not '%s'", v);
        a->max_workers = (int)l;
        return 0;
    case OPT_JOIN:
        if (!*v || strlen(v) > 24 || strspn(v, "0123456789.") != strlen(v))
            return bad_usage("--join takes a job id like 4710 (a worker's SHMRPC_JOB), not '%s'", v);
        a->join = v;
        return 0;
    case OPT_RANK:
        if (parse_int(v, 0, SR_MAX_WORKERS - 1, &l))
            return bad_usage("--rank takes a rank in [0, 4095], not '%s'", v);
        a->join_rank = (int)l;
        return 0;
    case OPT_MONITOR:
        a->monitor_ns = MONITOR_DEFAULT_NS;
        if (v && (parse_seconds(v, 3600, &a->monitor_ns) || a->monitor_ns < 1000000))
            return bad_usage("--monitor takes seconds in [0.001, 3600], not '%s'", v);
        return 0;
    default: /* OPT_REPORT */
        a->report_bindings = true;
        return 0;
    }
}

/* The options of shmrun's own behaviour. 0, or 2 (printed). */
static int launcher_option(int c, const char *v, struct args *a)
{
    long l;
    switch (c) {
    case OPT_TAG:
        if (!v || !strcmp(v, "rank"))
            a->tag = TAG_RANK;
        else if (!strcmp(v, "name"))
            a->tag = TAG_NAME;
        else
            return bad_usage("--tag-output takes 'rank' or 'name', not '%s'", v);
        return 0;
    case OPT_DIR:
        if (!*v)
            return bad_usage("--output-dir takes a directory, not '%s'", v);
        a->output_dir = v;
        return 0;
    case OPT_FOLD:
        if (parse_seconds(v, 3600, &a->fold_ns))
            return bad_usage("--fold-window takes seconds in [0, 3600], not '%s'", v);
        return 0;
    case OPT_GRACE:
        if (parse_seconds(v, 86400, &a->grace_ns))
            return bad_usage("--grace takes seconds in [0, 86400], not '%s'", v);
        return 0;
    case OPT_BIND:
        if (!strcmp(v, "none") || !strcmp(v, "core") || !strcmp(v, "numa"))
            a->bind = v[0] == 'n' ? (v[1] == 'o' ? BIND_NONE : BIND_NUMA) : BIND_CORE;
        else
            return bad_usage("--bind-to takes none, core or numa, not '%s'", v);
        return 0;
    case OPT_RESTARTS:
        if (parse_int(v, 0, 1000000, &l))
            return bad_usage("--max-restarts takes a number of restarts in [0, 1000000], not '%s'", v);
        a->max_restarts = (int)l;
        return 0;
    case OPT_POLICY:
        if (strcmp(v, "job") && strcmp(v, "rank"))
            return bad_usage("--restart takes job or rank, not '%s'", v);
        a->restart_rank = v[0] == 'r';
        return 0;
    default:
        return elastic_option(c, v, a);
    }
}

static int finish_args(int argc, char **argv, struct args *a)
{
    if (a->join && a->n)
        return bad_usage("%s", "--join runs one worker in a job that exists: -n is not for it");
    if (!a->join && a->join_rank >= 0)
        return bad_usage("%s", "--rank goes with --join");
    if (!a->n && !a->join)
        return bad_usage("%s", "-n N is required");
    if (a->max_workers && a->max_workers < a->n) {
        char v[16];
        snprintf(v, sizeof(v), "%d", a->max_workers);
        return bad_usage("--max-workers must be at least -n, not %s", v);
    }
    if (optind >= argc)
        return bad_usage("%s", "no program to run");
    a->argv = argv + optind;
    if (!program_exists(a->argv[0]))
        return bad_usage("program '%s' not found or not executable", a->argv[0]);
    return 0;
}

int parse_args(int argc, char **argv, struct args *a)
{
    int c, rc = 0;
    char optbuf[3];
    *a = (struct args){.prefix = "shmrpc", .fold_ns = FOLD_DEFAULT_NS, .grace_ns = GRACE_DEFAULT_NS, .join_rank = -1};
    opterr = 0; /* getopt's own messages would make the error two lines */
    while (!rc && (c = getopt_long(argc, argv, "+:n:hV", opts, NULL)) != -1) {
        if (c == 'h' || c == 'V') {
            fputs(c == 'h' ? usage : "shmrun (shmrpc) " SHMRUN_VERSION "\n", stdout);
            return 1;
        }
        if (c == ':')
            return bad_usage("option '%s' requires an argument", bad_option(argv, optbuf));
        if (c == '?')
            return bad_usage("unknown option '%s'", bad_option(argv, optbuf));
        rc = c < OPT_TAG ? job_option(c, optarg, a) : launcher_option(c, optarg, a);
    }
    return rc ? rc : finish_args(argc, argv, a);
}
