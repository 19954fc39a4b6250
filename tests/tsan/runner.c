/* SPDX-License-Identifier: MIT */
/* The ThreadSanitizer suite runner: main() of each tests/tsan program, which
 * is one of the concurrency suites (RPC, RRef, distributed autograd, tensors
 * and autograd, the distributed optimizer, ...) compiled again against
 * tests/shim, with the whole project built with -fsanitize=thread (meson
 * option tsan, ./dev test's build-tsan). Criterion's own binaries cannot
 * start under TSan ("Could not initialize inheritable arena").
 *
 * Every test runs in a child process of its own (as under Criterion), in
 * its own process group, while this process stays single-threaded (so the
 * fork is one TSan supports):
 *   the suite's init, the test's init, its body, its fini, the suite's fini;
 * a fatal check or a skip jumps back here and the finis still run. The
 * child's outcome and reason come back through a shared page, and this
 * process prints one line per test:
 *     PASS suite/name (1.23 s)
 *     FAIL suite/name: reason
 *     SKIP suite/name: reason
 * and at the end "N passed, M failed, K skipped" and a Criterion synthesis
 * line, which tests/summarize.py adds to ./dev test's totals.
 *
 * TSan reports: run.sh sets TSAN_OPTIONS=log_path=DIR/tsan and
 * SRT_TSAN_DIR=DIR, so every process of the test (the child, the sr_spawn
 * workers it forks) writes its reports to DIR/tsan.PID. After each test the
 * runner looks in DIR: a report there fails that test; it is printed on
 * stderr and removed, so the next test starts with none.
 *
 * Bounds: each test gets its .timeout (else the suite's, else
 * DEFAULT_TIMEOUT_S) times TIMEOUT_SCALE (TSan makes code 5 to 15 times
 * slower); past it the test's process group is killed and the test fails,
 * named. Nothing here sleeps: the wait is a poll on the child's pidfd.
 *
 * Options: --filter=GLOB runs the tests whose "suite/name" matches; --list
 * prints the names. */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "criterion/criterion.h"
#include "registry.h"

#define DEFAULT_TIMEOUT_S 120.0
#define TIMEOUT_SCALE 4.0
#define EXIT_SKIP 77

/* ---- the test in progress (in its child process) ---- */

enum outcome { PASS, SKIP, FAIL };

/* MAP_SHARED, written by the test's process (first failure wins), read by
 * the runner after waitpid(): the exit is the hand-off. */
static struct result {
    enum outcome outcome;
    char reason[SRT_REASON_MAX];
} *res;

static struct {
    char id[256]; /* "suite/name" */
    pid_t pid;    /* the test's process: its main thread jumps, others exit */
    pthread_t main_thread;
    sigjmp_buf jmp; /* where a fatal check or a skip returns to */
} cur;

static void set_outcome(enum outcome o, const char *reason)
{
    if (o <= res->outcome)
        return;
    res->outcome = o;
    snprintf(res->reason, sizeof(res->reason), "%s", reason);
}

/* A fatal check or a skip off the test's main thread (a worker of its
 * sr_spawn job, a thread of the test): that process ends here. A worker's
 * exit fails its job, which fails the test in its main thread. */
static _Noreturn void leave(int code)
{
    fflush(NULL);
    exit(code);
}

static bool on_main_thread(void)
{
    return getpid() == cur.pid && pthread_equal(pthread_self(), cur.main_thread);
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
    fprintf(stderr, "%s: pid %d: check failed: %s\n", cur.id, (int)getpid(), why);
    set_outcome(FAIL, why);
    if (!fatal)
        return;
    if (!on_main_thread())
        leave(1);
    siglongjmp(cur.jmp, 1);
}

void srt_skip(const char *fmt, ...)
{
    char msg[SRT_REASON_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt + 1, ap);
    va_end(ap);
    set_outcome(SKIP, msg);
    if (!on_main_thread())
        leave(EXIT_SKIP);
    siglongjmp(cur.jmp, 1);
}

void srt_log(const char *level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: [%s] ", cur.id, level);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Setup, body and fini; a fatal check or a skip jumps back here, and the
 * finis still run, as under Criterion. */
static _Noreturn void run_child(const struct srt_test *t)
{
    setpgid(0, 0); /* the runner ends the whole group on a timeout */
    cur.pid = getpid();
    cur.main_thread = pthread_self();
    srt_run_body(t, &cur.jmp);
    leave(0); /* exit(), not _exit(): TSan's end-of-process checks run */
}

/* A worker leaving on purpose (rpc_harness.h maps the suites' _exit here):
 * the process ends at once, as a killed one would. TSan intercepts _exit to
 * run its end-of-process checks, which would report the runtime's threads
 * a dying worker never joins. */
void srt_exit(int status)
{
    fflush(NULL);
    syscall(SYS_exit_group, status);
    __builtin_unreachable();
}

/* ---- the runner's side ---- */

/* Wait for the test's process for at most `timeout` seconds; its wait
 * status, or -1 when it ran past the bound (its group is then killed). */
static int wait_child(pid_t pid, double timeout)
{
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd < 0) {
        fprintf(stderr, "srt: pidfd_open(%d): %s\n", (int)pid, strerror(errno));
        kill(-pid, SIGKILL);
    } else {
        double end = srt_now_s() + timeout;
        int n;
        do {
            double left = end - srt_now_s();
            n = left > 0 ? poll(&(struct pollfd){.fd = pfd, .events = POLLIN}, 1, (int)(left * 1000) + 1) : 0;
        } while (n < 0 && errno == EINTR);
        close(pfd);
        if (n == 0) {
            kill(-pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return -1;
        }
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    kill(-pid, SIGKILL); /* anything the test left in its group */
    return status;
}

/* Print and remove the TSan reports written since the last call; how many. */
static int take_reports(const char *id)
{
    const char *dir = getenv("SRT_TSAN_DIR");
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d)
        return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, "tsan.", 5))
            continue;
        char path[4096], line[1024];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        fprintf(stderr, "==== %s: ThreadSanitizer report of pid %s ====\n", id, e->d_name + 5);
        while (fgets(line, sizeof(line), f))
            fputs(line, stderr);
        fclose(f);
        unlink(path);
        n++;
    }
    closedir(d);
    return n;
}

static enum outcome run_test(const struct srt_test *t, char reason[SRT_REASON_MAX])
{
    double timeout = TIMEOUT_SCALE * srt_timeout_of(t, DEFAULT_TIMEOUT_S);
    *res = (struct result){PASS, ""};
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        run_child(t);
    if (pid < 0) {
        snprintf(reason, SRT_REASON_MAX, "fork: %s", strerror(errno));
        return FAIL;
    }
    int status = wait_child(pid, timeout);
    enum outcome o = res->outcome;
    snprintf(reason, SRT_REASON_MAX, "%s", res->reason);
    if (status == -1) {
        snprintf(reason, SRT_REASON_MAX, "timed out after %.0f s (the test's bound times %.0f under TSan)", timeout,
                 TIMEOUT_SCALE);
        o = FAIL;
    } else if (WIFSIGNALED(status)) {
        snprintf(reason, SRT_REASON_MAX, "killed by %s", sigabbrev_np(WTERMSIG(status)) ?: "a signal");
        o = FAIL;
    } else if (o == PASS && WEXITSTATUS(status) != 0) {
        snprintf(reason, SRT_REASON_MAX, "its process exited with status %d", WEXITSTATUS(status));
        o = FAIL;
    }
    int nrep = take_reports(cur.id);
    if (nrep) {
        size_t n = strlen(reason);
        snprintf(reason + n, SRT_REASON_MAX - n, "%sThreadSanitizer reported in %d process(es) (reports above)",
                 n ? "; " : "", nrep);
        o = FAIL;
    }
    return o;
}

static bool parse_args(int argc, char **argv, const char **filter, bool *list)
{
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--filter=", 9))
            *filter = argv[i] + 9;
        else if (!strcmp(argv[i], "--list"))
            *list = true;
        else {
            fprintf(stderr, "usage: %s [--filter=SUITE/NAME-GLOB] [--list]\n", argv[0]);
            return false;
        }
    }
    return true;
}

int main(int argc, char **argv)
{
    const char *filter = NULL;
    bool list = false;
    if (!parse_args(argc, argv, &filter, &list))
        return 2;
    res = mmap(NULL, sizeof(*res), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED) {
        perror("srt: mmap");
        return 2;
    }
    int passed = 0, failed = 0, skipped = 0;
    double t_all = srt_now_s();
    for (size_t i = 0; i < srt_ntests; i++) {
        const struct srt_test *t = srt_tests[i];
        char reason[SRT_REASON_MAX] = "";
        snprintf(cur.id, sizeof(cur.id), "%s/%s", t->suite, t->name);
        if (filter && fnmatch(filter, cur.id, 0))
            continue;
        if (list) {
            printf("%s\n", cur.id);
            continue;
        }
        if (t->opts.disabled) {
            skipped++;
            printf("SKIP %s: disabled\n", cur.id);
            continue;
        }
        double t0 = srt_now_s();
        enum outcome o = run_test(t, reason);
        passed += o == PASS;
        failed += o == FAIL;
        skipped += o == SKIP;
        if (o == PASS)
            printf("PASS %s (%.2f s)\n", cur.id, srt_now_s() - t0);
        else
            printf("%s %s: %s\n", o == FAIL ? "FAIL" : "SKIP", cur.id, reason);
        fflush(stdout);
    }
    if (!list) {
        printf("%d passed, %d failed, %d skipped under ThreadSanitizer in %.1f s\n", passed, failed, skipped,
               srt_now_s() - t_all);
        /* the line tests/summarize.py counts, as it does Criterion's */
        printf("[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Crashing: 0\n", passed + failed, passed,
               failed);
    }
    return failed ? 1 : 0;
}
