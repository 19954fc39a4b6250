/* shmrun: launch a shmrpc job.
 *
 *   shmrun -n N [--shm-size SIZE] [--name-prefix P] [--] prog [args...]
 *
 * Creates the job's shared-memory segment, fork+execs N copies of prog with
 * SHMRPC_FD, SHMRPC_RANK and SHMRPC_WORLD_SIZE set, forwards SIGINT and
 * SIGTERM to them and supervises them (failure policy: lib/job/job.h).
 * Exit status: 0 when every worker exited 0; the failed worker's status (or
 * 128 + signal) otherwise; 2 for a bad command line; 1 for a launcher error.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "log.h"
#include "job/job.h"
#include "trace/trace.h"

struct args {
    int n;
    uint64_t shm_size;
    uint32_t ring_slots;
    const char *prefix;
    char **argv; /* the program and its arguments */
};

static const char usage[] =
    "usage: shmrun -n N [--shm-size SIZE] [--name-prefix P] [--ring-slots S] [--] prog [args...]\n"
    "  -n, --nproc N        number of workers (1..4096)\n"
    "  --shm-size SIZE      segment size in bytes, or with a K, M, G suffix (default: 1G of heap per worker, sparse)\n"
    "  --name-prefix P      segment name, shown in reports and /proc (default: shmrpc)\n"
    "  --ring-slots S       inbox slots per worker, a power of two (default: 1024)\n";

static int bad_usage(const char *fmt, const char *val)
{
    fprintf(stderr, "shmrun: ");
    fprintf(stderr, fmt, val);
    fprintf(stderr, "\nTry 'shmrun --help' for usage.\n");
    return 2;
}

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *s == '-')
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    }
    if (*end || (shift && v > (UINT64_MAX >> shift)))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
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

/* 0 to run, 1 after --help, 2 (printed) for a bad command line. */
static int parse_args(int argc, char **argv, struct args *a)
{
    static const struct option opts[] = {
        {"nproc", required_argument, NULL, 'n'}, {"shm-size", required_argument, NULL, 's'},
        {"name-prefix", required_argument, NULL, 'p'}, {"ring-slots", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'}, {0, 0, 0, 0}};
    long v;
    int c;
    char optbuf[3];
    *a = (struct args){.prefix = "shmrpc"};
    opterr = 0; /* getopt's own messages would make the error two lines */
    while ((c = getopt_long(argc, argv, "+:n:h", opts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (parse_int(optarg, 1, SR_MAX_WORKERS, &v))
                return bad_usage("-n takes a number of workers in [1, 4096], not '%s'", optarg);
            a->n = (int)v;
            break;
        case 's':
            if (parse_size(optarg, &a->shm_size) || !a->shm_size)
                return bad_usage("--shm-size takes a size like 512M or 4G, not '%s'", optarg);
            break;
        case 'p':
            if (!*optarg || strlen(optarg) > 40 || strchr(optarg, '/'))
                return bad_usage("--name-prefix takes 1 to 40 characters without '/', not '%s'", optarg);
            a->prefix = optarg;
            break;
        case 'r':
            if (parse_int(optarg, 2, 1 << 24, &v) || (v & (v - 1)))
                return bad_usage("--ring-slots takes a power of two in [2, 2^24], not '%s'", optarg);
            a->ring_slots = (uint32_t)v;
            break;
        case 'h':
            fputs(usage, stdout);
            return 1;
        case ':':
            return bad_usage("option '%s' requires an argument", bad_option(argv, optbuf));
        default:
            return bad_usage("unknown option '%s'", bad_option(argv, optbuf));
        }
    }
    if (!a->n)
        return bad_usage("%s", "-n N is required");
    if (optind >= argc)
        return bad_usage("%s", "no program to run");
    a->argv = argv + optind;
    if (!program_exists(a->argv[0]))
        return bad_usage("program '%s' not found or not executable", a->argv[0]);
    return 0;
}

static void exec_worker(sr_job *job, int rank, void *p)
{
    char **argv = p;
    char buf[16];
    /* The child inherits the segment and every doorbell eventfd across exec. */
    fcntl(job->seg.fd, F_SETFD, 0);
    for (int r = 0; r < job->n; r++)
        fcntl(job->eventfds[r], F_SETFD, 0);
    snprintf(buf, sizeof(buf), "%d", job->seg.fd);
    setenv("SHMRPC_FD", buf, 1);
    snprintf(buf, sizeof(buf), "%d", rank);
    setenv("SHMRPC_RANK", buf, 1);
    snprintf(buf, sizeof(buf), "%d", job->n);
    setenv("SHMRPC_WORLD_SIZE", buf, 1);
    execvp(argv[0], argv);
    fprintf(stderr, "shmrun: rank %d: exec %s: %s\n", rank, argv[0], strerror(errno));
    _exit(127);
}

static int make_sigfd(sigset_t *old)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, old);
    return signalfd(-1, &set, SFD_CLOEXEC);
}

/* One line on stderr, prefixed "shmrun: " once: the job's own messages
 * already carry it, the segment's name their function instead. */
static int launcher_error(int exit_code, bool usage_hint)
{
    const char *e = sr_last_error();
    fprintf(stderr, "%s%s\n%s", strncmp(e, "shmrun: ", 8) ? "shmrun: " : "", e,
            usage_hint ? "Try 'shmrun --help' for usage.\n" : "");
    return exit_code;
}

int main(int argc, char **argv)
{
    sr__log_set_role("shmrun"); /* the runtime's lines from this process say "shmrun: " */
    struct args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc == 1 ? 0 : rc;
    /* A SIGCHLD ignored by whoever started us would let the kernel reap the
     * workers before we read their status; shmrun owns its process, so take
     * the default back (workers then inherit it, as from a shell). */
    signal(SIGCHLD, SIG_DFL);
    sigset_t old;
    int sigfd = make_sigfd(&old);
    if (sigfd < 0) /* without it SIGINT/SIGTERM would stay blocked, unseen */
        return launcher_error(sr__fail(1, "shmrun", "signalfd: %s", strerror(errno)), false);
    sr_segment_opts so = {.world_size = a.n, .size = a.shm_size, .ring_slots = a.ring_slots, .name = a.prefix};
    sr_job job;
    if ((rc = sr__job_create(&job, &so, "shmrun")))
        return rc == -EINVAL ? launcher_error(2, true) : launcher_error(1, false);
    job.child_mask = old; /* workers start with the caller's mask, not ours */
    for (int r = 0; r < a.n && !rc; r++)
        rc = sr__job_fork(&job, r, exec_worker, a.argv);
    if (rc) {
        sr__job_stop(&job);
        sr__job_destroy(&job);
        return launcher_error(1, false);
    }
    int status = sr__job_supervise(&job, sigfd);
    sr__job_destroy(&job);
    sr__trace_job_end(a.n); /* SHMRPC_TRACE: one file for the job (docs/PROFILING.md) */
    return status < 0 ? launcher_error(1, false) : status;
}
