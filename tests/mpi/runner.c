/* SPDX-License-Identifier: MIT */
/* The MPI suite runner: main() of each tests/mpi program, which is one of
 * the RPC, RRef or distributed-autograd Criterion suites compiled again
 * against tests/shim (see tests/shim/criterion/criterion.h and srt.h).
 *
 * Launched by `mpirun -n 4` (tests/mpi/run_suite.sh), every rank runs every
 * test, in registration (source) order, one at a time in this process:
 *   barrier; the test's body (its jobs run on the first `world` ranks,
 *   srt_run); its fini (the suite's leak check); then the ranks agree on
 *   the outcome (the worst one wins, with the reason of the lowest rank that
 *   had it) and rank 0 prints one line:
 *     PASS suite/name (1.23 s)
 *     FAIL suite/name: reason
 *     SKIP suite/name: reason
 * and at the end "N passed, M failed, K skipped" and a Criterion synthesis
 * line, which tests/summarize.py adds to ./dev test's totals.
 *
 * Bounds: a watchdog thread gives each test its .timeout (else the suite's,
 * else DEFAULT_TIMEOUT_S) from the barrier before it to the agreement after
 * it; past it, it prints a FAIL line naming the test and the rank and ends
 * the MPI job (MPI_Abort), so a hung rank cannot hang CI. A rank that
 * crashes or _exit()s inside a job ends the job the same way (srt_exit,
 * crash_handler): across hosts, mpirun's job abort is the failure policy.
 *
 * Options: --filter=GLOB runs the tests whose "suite/name" matches; --list
 * prints the names; --run-excluded runs the tests of the exclusion table
 * too (to check the reasons). */
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <mpi.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "criterion/criterion.h"
#include "registry.h"
#include "error.h"
#include "mpi/mpi_job.h"
#include "shmrpc/rpc.h"

#define DEFAULT_TIMEOUT_S 120.0

/* ---- the exclusion table ---- */

/* Tests that rely on what only sr_spawn's forked workers give: a worker
 * that dies or crashes on purpose, whose death the peers must see as an
 * error naming it (under mpirun a rank's death is the job's abort, the
 * failure policy across hosts, docs/MULTIHOST.md), or a peer's pid in the
 * segment.
 * Each is skipped with its reason; --run-excluded runs them anyway. */
static const struct {
    const char *test, *reason;
} excluded[] = {
    {"rpc_errors/peer_dies_mid_call", "a worker _exit()s on purpose: peer death is mpirun's job abort"},
    {"rpc_errors/crashing_function_takes_the_job_down", "a worker abort()s on purpose: sr_spawn's crash report"},
    {"rpc_errors/crash_report_names_the_function_and_its_caller",
     "a worker dies of SIGSEGV on purpose: sr_spawn's crash report"},
    {"rpc_tensor/unsent_request_gives_its_tensor_references_back",
     "a worker _exit()s on purpose: peer death is mpirun's job abort"},
    {"rref_errors/rref_whose_owner_died_reports_it", "the owner _exit()s on purpose: peer death is mpirun's job abort"},
    {"rref_errors/rref_child_whose_worker_died_releases_its_parent",
     "SIGSTOPs rank 1 by its pid in the segment (none for a remote rank) and rank 2 _exit()s on purpose"},
    {"rref_errors/owner_dying_between_the_answer_and_the_fork_request_fails_the_confirmation",
     "the owner _exit()s on purpose: peer death is mpirun's job abort"},
    {"rref_errors/user_forked_onwards_while_unannounced_is_announced_first",
     "a relay worker _exit()s on purpose: peer death is mpirun's job abort"},
    {"dist_autograd_errors/callee_dies_during_backward",
     "the callee _exit()s in a hook on purpose: peer death is mpirun's job abort"},
    {"dist_autograd_errors/worker_two_hops_away_dies_during_backward",
     "a worker _exit()s in a hook on purpose: peer death is mpirun's job abort"},
};

static const char *exclusion(const char *id)
{
    for (size_t i = 0; i < sizeof(excluded) / sizeof(excluded[0]); i++)
        if (!strcmp(excluded[i].test, id))
            return excluded[i].reason;
    return NULL;
}

/* ---- the test in progress ---- */

enum outcome { PASS, SKIP, FAIL }; /* agreement keeps the worst (MPI_MAX) */

static MPI_Comm comm; /* the runner's own duplicate of MPI_COMM_WORLD */
static int me, nranks;
static pthread_t main_thread;

static struct {
    char id[256]; /* "suite/name" */
    enum outcome outcome;
    char reason[SRT_REASON_MAX]; /* this rank's first failure or skip reason */
    sigjmp_buf jmp;          /* where a fatal check or a skip returns to */
    _Atomic bool in_job;     /* this rank runs a worker of srt_run */
} cur;

static void set_outcome(enum outcome o, const char *reason)
{
    if (o <= cur.outcome)
        return;
    cur.outcome = o;
    snprintf(cur.reason, sizeof(cur.reason), "%s", reason);
}

/* A failure that cannot return to the runner (inside a job, or on another
 * thread): the job goes down, named. */
static _Noreturn void abort_job(const char *why, int code)
{
    printf("FAIL %s: rank %d: %s; ending the MPI job\n", cur.id, me, why);
    fflush(NULL);
    MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
    _exit(code ? code : 1); /* not reached */
}

void srt_check(bool fatal, bool ok, const char *file, int line, const char *expr, const char *fmt, ...)
{
    if (ok)
        return;
    char why[SRT_REASON_MAX];
    va_list ap;
    va_start(ap, fmt);
    srt_check_text(why, file, line, expr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "rank %d: %s: check failed: %s\n", me, cur.id, why);
    set_outcome(FAIL, why);
    if (!fatal)
        return;
    if (atomic_load(&cur.in_job) || !pthread_equal(pthread_self(), main_thread))
        abort_job(why, 1);
    siglongjmp(cur.jmp, 1);
}

void srt_skip(const char *fmt, ...)
{
    char msg[SRT_REASON_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt + 1, ap);
    va_end(ap);
    if (atomic_load(&cur.in_job) || !pthread_equal(pthread_self(), main_thread))
        abort_job("cr_skip_test inside a job", 1);
    set_outcome(SKIP, msg);
    siglongjmp(cur.jmp, 1);
}

void srt_log(const char *level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rank %d: %s: [%s] ", me, cur.id, level);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void srt_exit(int status)
{
    if (!atomic_load(&cur.in_job))
        _exit(status);
    char why[64];
    snprintf(why, sizeof(why), "left its job with _exit(%d) (its report is above)", status);
    abort_job(why, status);
}

/* ---- the watchdog: every test bounded ---- */

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct timespec deadline; /* CLOCK_MONOTONIC */
    double seconds;
    bool armed;
} wd = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {0, 0}, 0, false};

static void *watchdog(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&wd.lock);
    for (;;) {
        int rc = wd.armed ? pthread_cond_timedwait(&wd.cond, &wd.lock, &wd.deadline)
                          : pthread_cond_wait(&wd.cond, &wd.lock);
        if (rc == ETIMEDOUT && wd.armed) {
            char why[96];
            snprintf(why, sizeof(why), "timed out after %.0f s (the test's bound)", wd.seconds);
            abort_job(why, 124);
        }
    }
    return NULL;
}

static void watchdog_arm(double seconds)
{
    pthread_mutex_lock(&wd.lock);
    clock_gettime(CLOCK_MONOTONIC, &wd.deadline);
    wd.deadline.tv_sec += (time_t)seconds;
    wd.seconds = seconds;
    wd.armed = true;
    pthread_cond_signal(&wd.cond);
    pthread_mutex_unlock(&wd.lock);
}

static void watchdog_disarm(void)
{
    pthread_mutex_lock(&wd.lock);
    wd.armed = false;
    pthread_cond_signal(&wd.cond);
    pthread_mutex_unlock(&wd.lock);
}

static int watchdog_start(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&wd.cond, &a);
    pthread_condattr_destroy(&a);
    pthread_t t;
    if (pthread_create(&t, NULL, watchdog, NULL))
        return -1;
    pthread_detach(t);
    return 0;
}

/* ---- crashes: name the test before the process goes ---- */

static char crash_line[SRT_REASON_MAX];

static void crash_handler(int sig)
{
    /* async-signal-safe: the line was prepared when the test began */
    ssize_t n = write(STDOUT_FILENO, crash_line, strlen(crash_line));
    const char *s = sigabbrev_np(sig);
    n += write(STDOUT_FILENO, s ? s : "?", s ? strlen(s) : 1);
    n += write(STDOUT_FILENO, "\n", 1);
    (void)n;
    raise(sig); /* SA_RESETHAND: the default action now */
}

static void crash_handlers(void)
{
    struct sigaction sa = {.sa_handler = crash_handler, .sa_flags = SA_RESETHAND};
    sigaction(SIGABRT, &sa, NULL);
#if !defined(__SANITIZE_ADDRESS__) /* ASan reports these itself */
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    sigaction(SIGFPE, &sa, NULL);
    sigaction(SIGILL, &sa, NULL);
#endif
}

/* ---- collective helpers for the harness ---- */

int srt_run(const char *name, int world, int (*fn)(int, int, void *), void *arg, uint64_t shm_size,
            uint32_t ring_slots)
{
    (void)shm_size; /* the job's default (1 GiB of heap per worker, sparse) covers every suite's */
    if (atomic_load(&cur.in_job))
        abort_job("a job started inside a job", 1);
    if (world < 1)
        return sr__fail(-EINVAL, "sr_spawn", "world_size %d is not positive", world);
    if (world > nranks)
        cr_skip_test("job '%s' needs %d ranks and mpirun gave %d", name, world, nranks);
    if (ring_slots && me == 0)
        fprintf(stderr, "%s: job '%s' asks for %u ring slots: under mpirun the job's default applies\n", cur.id,
                name, ring_slots);
    /* What the test body set up before its job (shared pages, semaphores,
     * pipes) is in place on every rank before any worker starts. */
    MPI_Barrier(comm);
    MPI_Comm sub;
    MPI_Comm_split(comm, me < world ? 0 : MPI_UNDEFINED, me, &sub);
    int rc = 0;
    if (sub != MPI_COMM_NULL) {
        sr__mpi_use_comm(&sub);
        atomic_store(&cur.in_job, true);
        rc = fn(me, world, arg);
        atomic_store(&cur.in_job, false);
        if (sr_rank() >= 0) { /* a worker that failed before its shutdown: a forked one would be gone */
            fprintf(stderr, "rank %d: %s: job '%s': the worker returned %d without sr_shutdown; shutting down\n", me,
                    cur.id, name, rc);
            sr_shutdown(false, 0);
        }
        sr__mpi_use_comm(NULL);
        fflush(NULL);
        MPI_Comm_free(&sub);
    }
    int *rcs = calloc((size_t)nranks, sizeof(int));
    if (!rcs)
        abort_job("out of memory", 1);
    MPI_Allgather(&rc, 1, MPI_INT, rcs, 1, MPI_INT, comm);
    int bad = -1;
    for (int r = 0; r < world && bad < 0; r++)
        if (rcs[r])
            bad = r;
    int brc = bad >= 0 ? rcs[bad] : 0;
    free(rcs);
    if (bad >= 0)
        return sr__fail(-SR_EWORKER, "sr_spawn", "job '%s': worker %d of %d returned %d (its report is above)", name,
                        bad, world, brc);
    return 0;
}

void *srt_shared_page(size_t n)
{
    if (atomic_load(&cur.in_job))
        return mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    static unsigned seq;
    struct {
        char name[64];
        int err;
    } m = {.err = 0};
    snprintf(m.name, sizeof(m.name), "/srt-page-%d-%u", (int)getpid(), seq++);
    int fd = -1;
    if (me == 0) {
        fd = shm_open(m.name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)n))
            m.err = errno;
    }
    MPI_Bcast(&m, sizeof(m), MPI_BYTE, 0, comm);
    if (me != 0 && !m.err)
        fd = shm_open(m.name, O_RDWR | O_CLOEXEC, 0600);
    int err = fd < 0 ? (m.err ? m.err : errno) : 0, any;
    MPI_Allreduce(&err, &any, 1, MPI_INT, MPI_MAX, comm); /* also: everyone has opened it */
    if (me == 0 && fd >= 0)
        shm_unlink(m.name);
    void *p = any ? MAP_FAILED : mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0)
        close(fd);
    if (any) {
        fprintf(stderr, "rank %d: %s: shared page %s: %s\n", me, cur.id, m.name, strerror(any));
        errno = any;
    }
    return p;
}

int srt_shared_pipe(int fds[2])
{
    if (atomic_load(&cur.in_job))
        return pipe(fds);
    static unsigned seq;
    struct {
        char path[128];
        int err;
    } m = {.err = 0};
    const char *dir = getenv("TMPDIR");
    snprintf(m.path, sizeof(m.path), "%s/srt-pipe-%d-%u", dir && *dir ? dir : "/tmp", (int)getpid(), seq++);
    if (me == 0 && mkfifo(m.path, 0600))
        m.err = errno;
    MPI_Bcast(&m, sizeof(m), MPI_BYTE, 0, comm);
    /* Read-write: the open does not wait for a peer, and every rank holds
     * both ends, as forked workers hold both ends of an inherited pipe. */
    int fd = m.err ? -1 : open(m.path, O_RDWR | O_CLOEXEC);
    int err = fd < 0 ? (m.err ? m.err : errno) : 0, any;
    MPI_Allreduce(&err, &any, 1, MPI_INT, MPI_MAX, comm);
    if (me == 0 && !m.err)
        unlink(m.path);
    if (!any && (fds[1] = dup(fd)) < 0)
        any = errno; /* local: the test's assertion fails on this rank */
    if (any) {
        if (fd >= 0)
            close(fd);
        fprintf(stderr, "rank %d: %s: shared pipe %s: %s\n", me, cur.id, m.path, strerror(any));
        errno = any;
        return -1;
    }
    fds[0] = fd;
    return 0;
}

/* ---- running the tests ---- */

/* The outcome every rank agrees on: the worst, with the reason of the
 * lowest rank that had it. */
static enum outcome agree(char reason[SRT_REASON_MAX])
{
    int mine = (int)cur.outcome, all, who, first;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MAX, comm);
    if (all == PASS)
        return PASS;
    who = mine == all ? me : nranks;
    MPI_Allreduce(&who, &first, 1, MPI_INT, MPI_MIN, comm);
    memcpy(reason, cur.reason, SRT_REASON_MAX);
    MPI_Bcast(reason, SRT_REASON_MAX, MPI_CHAR, first, comm);
    if (all == FAIL && nranks > 1) {
        size_t n = strlen(reason);
        snprintf(reason + n, SRT_REASON_MAX - n, " (rank %d)", first);
    }
    return (enum outcome)all;
}

static enum outcome run_test(const struct srt_test *t, char reason[SRT_REASON_MAX])
{
    double timeout = srt_timeout_of(t, DEFAULT_TIMEOUT_S);
    snprintf(cur.id, sizeof(cur.id), "%s/%s", t->suite, t->name);
    snprintf(crash_line, sizeof(crash_line), "FAIL %s: rank %d crashed: ", cur.id, me);
    cur.outcome = PASS;
    cur.reason[0] = '\0';
    watchdog_arm(timeout);
    MPI_Barrier(comm);
    srt_run_body(t, &cur.jmp);
    fflush(NULL);
    enum outcome o = agree(reason);
    watchdog_disarm();
    return o;
}

static bool parse_args(int argc, char **argv, const char **filter, bool *list, bool *run_excluded)
{
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--filter=", 9))
            *filter = argv[i] + 9;
        else if (!strcmp(argv[i], "--list"))
            *list = true;
        else if (!strcmp(argv[i], "--run-excluded"))
            *run_excluded = true;
        else {
            if (me == 0)
                fprintf(stderr, "usage: mpirun -n N %s [--filter=SUITE/NAME-GLOB] [--list] [--run-excluded]\n",
                        argv[0]);
            return false;
        }
    }
    return true;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &nranks);
    main_thread = pthread_self();
    if (provided < MPI_THREAD_MULTIPLE) {
        if (me == 0)
            fprintf(stderr, "srt: MPI gives thread level %d, shmrpc needs MPI_THREAD_MULTIPLE\n", provided);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const char *filter = NULL;
    bool list = false, run_excluded = false;
    if (!parse_args(argc, argv, &filter, &list, &run_excluded) || watchdog_start()) {
        MPI_Finalize();
        return 2;
    }
    crash_handlers();
    int passed = 0, failed = 0, skipped = 0, nexcluded = 0;
    double t_all = srt_now_s();
    for (size_t i = 0; i < srt_ntests; i++) {
        const struct srt_test *t = srt_tests[i];
        char id[256], reason[SRT_REASON_MAX] = "";
        snprintf(id, sizeof(id), "%s/%s", t->suite, t->name);
        if (filter && fnmatch(filter, id, 0))
            continue;
        if (list) {
            if (me == 0)
                printf("%s\n", id);
            continue;
        }
        const char *why = run_excluded ? NULL : exclusion(id);
        if (why || t->opts.disabled) {
            nexcluded += why != NULL;
            skipped++;
            if (me == 0)
                printf("SKIP %s: %s\n", id, why ? why : "disabled");
            continue;
        }
        double t0 = srt_now_s();
        enum outcome o = run_test(t, reason);
        passed += o == PASS;
        failed += o == FAIL;
        skipped += o == SKIP;
        if (me == 0) {
            if (o == PASS)
                printf("PASS %s (%.2f s)\n", id, srt_now_s() - t0);
            else
                printf("%s %s: %s\n", o == FAIL ? "FAIL" : "SKIP", id, reason);
            fflush(stdout);
        }
    }
    if (me == 0 && !list) {
        printf("%d passed, %d failed, %d skipped (%d excluded under MPI) on %d ranks in %.1f s\n", passed, failed,
               skipped, nexcluded, nranks, srt_now_s() - t_all);
        /* the line tests/summarize.py counts, as it does Criterion's */
        printf("[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Crashing: 0\n", passed + failed, passed,
               failed);
        fflush(stdout);
    }
    MPI_Comm_free(&comm);
#if defined(__SANITIZE_ADDRESS__)
    /* The last leak check, while MPI is initialised (its own state is
     * reachable); it also skips the one at exit, which would see what Open
     * MPI leaves in MPI_Finalize and in the components it unloads there,
     * where no suppression can name them (as tests/mpi/boot_check.c). */
    __lsan_do_leak_check();
#endif
    MPI_Finalize();
    return failed ? 1 : 0;
}
