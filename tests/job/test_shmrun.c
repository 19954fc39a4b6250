/* SPDX-License-Identifier: MIT */
/* shmrun's features, end to end: --version (-V), --tag-output,
 * --output-dir, the folding of identical stderr lines, torchrun's variables,
 * stdin to rank 0 only, the forwarded signals, the grace period after
 * SIGTERM, and CPU binding.
 *
 * Each test runs the real shmrun (SHMRUN) on tests/helpers/worker_prog.c
 * (WORKER_PROG) through helpers/shmrun_run.h: readiness and exits are
 * events, every wait is bounded, nothing sleeps. The binding tests describe
 * a topology in a fake sysfs tree (SHMRUN_SYSFS) built from the CPUs this
 * test may run on, so that they check exact masks on any machine with two
 * CPUs or more (they skip on one).
 */
#include <criterion/criterion.h>
#include <ftw.h>
#include <sched.h>
#include <sys/stat.h>

#include "common.h"
#include "helpers/shmrun_run.h"

LEAK_CHECKED_SUITE(shmrun);

/* The lines of buf, in order; returns how many (at most max). */
static int lines_of(char *buf, char **line, int max)
{
    int n = 0;
    for (char *save = NULL, *l = strtok_r(buf, "\n", &save); l && n < max; l = strtok_r(NULL, "\n", &save))
        line[n++] = l;
    return n;
}

/* `want` is one of the lines of text, exactly once. */
static void assert_line_once(const char *text, const char *want, const char *where)
{
    size_t wl = strlen(want);
    int seen = 0;
    for (const char *p = text; (p = strstr(p, want)); p += wl)
        seen += (p == text || p[-1] == '\n') && p[wl] == '\n';
    cr_assert_eq(seen, 1, "expected the line '%s' once on %s, seen %d times in:\n%s", want, where, seen, text);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static void run_to_exit_0(struct run *r)
{
    int st = await_exit(r);
    cr_assert_eq(exit_code(st), 0, "shmrun exit status %d; stderr:\n%s", exit_code(st), r->err);
}

/* -V as mpirun spells it, and --version. */
Test(shmrun, version_prints_the_version)
{
    char want[64];
    snprintf(want, sizeof(want), "shmrun (shmrpc) %s\n", env_path("SHMRPC_VERSION"));
    for (int i = 0; i < 2; i++) {
        char *opt = i ? "-V" : "--version";
        struct run r;
        start(&r, test_ns("version"), (char *[]){opt, NULL});
        run_to_exit_0(&r);
        cr_assert_str_eq(r.out, want, "%s printed '%s'", opt, r.out);
        cr_assert_eq(r.err_len, 0, "%s printed on stderr:\n%s", opt, r.err);
        finish(&r);
    }
}

/* worker_prog "say" writes half of its stdout line before the start barrier
 * and the rest after it: on a shared stdout the halves of different ranks
 * would interleave. */
Test(shmrun, tag_output_prefixes_whole_lines_with_the_rank)
{
    struct run r;
    start_job_opts(&r, "tag", 3, (char *[]){"--tag-output", "--fold-window", "0", NULL}, "say", NULL, NULL);
    run_to_exit_0(&r);
    char want[64];
    for (int rank = 0; rank < 3; rank++) {
        snprintf(want, sizeof(want), "[%d] part of rank %d", rank, rank);
        assert_line_once(r.out, want, "stdout");
        snprintf(want, sizeof(want), "[%d] error: same on every rank", rank);
        assert_line_once(r.err, want, "stderr (folding is off)");
        snprintf(want, sizeof(want), "[%d] note from rank %d", rank, rank);
        assert_line_once(r.err, want, "stderr");
    }
    cr_assert_eq(count_lines(r.out), 3, "stdout has other lines:\n%s", r.out);
    cr_assert_eq(count_lines(r.err), 6, "stderr has other lines:\n%s", r.err);
    finish(&r);
}

Test(shmrun, tag_output_name_uses_the_worker_name)
{
    struct run r;
    start_job_opts(&r, "tagname", 2, (char *[]){"--tag-output=name", "--fold-window", "0", NULL}, "say", NULL, NULL);
    run_to_exit_0(&r);
    char want[64];
    for (int rank = 0; rank < 2; rank++) {
        snprintf(want, sizeof(want), "[trainer%d] part of rank %d", rank, rank);
        assert_line_once(r.out, want, "stdout");
    }
    finish(&r);
}

/* Identical stderr lines from every rank come out once, naming the ranks;
 * the others keep their rank. The window (20 s) is longer than the test
 * could wait: the folded line goes out because every rank sent it, the rest
 * when the job ends, never because a timer fired. */
Test(shmrun, identical_stderr_lines_fold_into_one_naming_the_ranks)
{
    struct run r;
    start_job_opts(&r, "fold", 3, (char *[]){"--tag-output", "--fold-window", "20", NULL}, "say", NULL, NULL);
    run_to_exit_0(&r);
    cr_assert(!strncmp(r.err, "[0-2] error: same on every rank\n", 32),
              "the folded line is not first on stderr (each rank printed it before its note):\n%s", r.err);
    char want[64];
    for (int rank = 0; rank < 3; rank++) {
        snprintf(want, sizeof(want), "[%d] note from rank %d", rank, rank);
        assert_line_once(r.err, want, "stderr");
    }
    cr_assert_eq(count_lines(r.err), 4, "stderr has other lines:\n%s", r.err);
    finish(&r);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void rm_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static void assert_file(const char *dir, int rank, const char *name, const char *want)
{
    char path[512], got[256] = "";
    snprintf(path, sizeof(path), "%s/%d/%s", dir, rank, name);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s is missing: %s", path, strerror(errno));
    size_t n = fread(got, 1, sizeof(got) - 1, f);
    got[n] = 0;
    fclose(f);
    cr_assert_str_eq(got, want, "%s holds '%s', expected '%s'", path, got, want);
}

Test(shmrun, output_dir_writes_one_log_pair_per_rank)
{
    char dir[] = "/tmp/shmrun-logs-XXXXXX";
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    char sub[600];
    snprintf(sub, sizeof(sub), "%s/job", dir); /* shmrun creates it */
    struct run r;
    start_job_opts(&r, "logdir", 2, (char *[]){"--output-dir", sub, NULL}, "say", NULL, NULL);
    run_to_exit_0(&r);
    cr_assert_eq(r.out_len + r.err_len, 0, "output reached the terminal:\n%s%s", r.out, r.err);
    char want[64];
    for (int rank = 0; rank < 2; rank++) {
        snprintf(want, sizeof(want), "part of rank %d\n", rank);
        assert_file(sub, rank, "stdout.log", want);
        snprintf(want, sizeof(want), "error: same on every rank\nnote from rank %d\n", rank);
        assert_file(sub, rank, "stderr.log", want);
    }
    rm_tree(dir);
    finish(&r);
}

/* shmrun started with its standard fds closed (a daemon's habit): the
 * descriptors it opens must not land on 0-2, where each worker's output is
 * set up, nor must the workers' output go over them. The segment used to
 * sit on fd 1 or 2 and be overwritten by the worker's log file or pipe
 * ("sr__segment_attach: fd 2: 0 bytes is too small", exit 3). */
static void closed_stdio_job(unsigned closed, const char *tag)
{
    char dir[] = "/tmp/shmrun-closed-XXXXXX";
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    char sub[600], name[32];
    snprintf(sub, sizeof(sub), "%s/job", dir);
    snprintf(name, sizeof(name), "closed%x%s", closed, tag ? "t" : "");
    struct run r;
    closed_stdio = closed;
    char *opts[] = {"--output-dir", sub, (char *)tag, NULL};
    start_job_opts(&r, name, 2, opts, "say", NULL, NULL);
    closed_stdio = 0;
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), 0, "shmrun %s with fds 0x%x closed exited with status %d", tag ? tag : "", closed,
                 exit_code(st));
    char want[64];
    for (int rank = 0; rank < 2; rank++) {
        snprintf(want, sizeof(want), "part of rank %d\n", rank);
        assert_file(sub, rank, "stdout.log", want);
        snprintf(want, sizeof(want), "error: same on every rank\nnote from rank %d\n", rank);
        assert_file(sub, rank, "stderr.log", want);
    }
    rm_tree(dir);
    finish(&r);
}

Test(shmrun, output_dir_works_with_stdout_and_stderr_closed)
{
    closed_stdio_job(0x6, NULL);
    closed_stdio_job(0x7, NULL);
}

Test(shmrun, tag_output_works_with_stdout_and_stderr_closed)
{
    closed_stdio_job(0x6, "--tag-output");
    closed_stdio_job(0x7, "--tag-output");
}

/* Rank 0 reads the test's pipe; the others read /dev/null. */
Test(shmrun, stdin_goes_to_rank_0_only)
{
    struct run r;
    start_job(&r, "stdin", 3, "stdin", NULL, NULL);
    cr_assert_eq(write(r.in_fd, "hello\n", 6), 6, "write to shmrun's stdin: %s", strerror(errno));
    close(r.in_fd);
    r.in_fd = -1;
    run_to_exit_0(&r);
    char *line[8];
    int n = lines_of(r.out, line, 8);
    cr_assert_eq(n, 3, "expected 3 lines on stdout, got %d", n);
    for (int i = 0; i < n; i++) {
        int rank = -1;
        char file[64] = "", text[64] = "";
        cr_assert_eq(sscanf(line[i], "stdin %d %63s %63s", &rank, file, text), 3, "bad line '%s'", line[i]);
        if (rank == 0)
            cr_assert(!strncmp(file, "pipe:", 5) && !strcmp(text, "'hello'"), "rank 0 read %s from %s", text, file);
        else
            cr_assert(!strcmp(file, "/dev/null") && !strcmp(text, "''"), "rank %d read %s from %s", rank, text, file);
    }
    finish(&r);
}

/* The workers' OPENBLAS_NUM_THREADS with SHMRPC_BLAS_THREADS and
 * OPENBLAS_NUM_THREADS as given (NULL: unset), checked on both ranks. */
static void expect_blas_env(const char *test, const char *shmrpc, const char *openblas, const char *want)
{
    unsetenv("GOTO_NUM_THREADS");
    shmrpc ? setenv("SHMRPC_BLAS_THREADS", shmrpc, 1) : unsetenv("SHMRPC_BLAS_THREADS");
    openblas ? setenv("OPENBLAS_NUM_THREADS", openblas, 1) : unsetenv("OPENBLAS_NUM_THREADS");
    struct run r;
    start_job(&r, test, 2, "blasenv", NULL, NULL);
    run_to_exit_0(&r);
    for (int rank = 0; rank < 2; rank++) {
        char line[64];
        snprintf(line, sizeof(line), "blasenv %d %s", rank, want);
        assert_line_once(r.out, line, "stdout");
    }
    finish(&r);
}

/* shmrun gives its workers OPENBLAS_NUM_THREADS=1 (the library's default
 * count, set before OpenBLAS loads, so that it starts no idle thread pool)
 * unless the user chose: OPENBLAS_NUM_THREADS or SHMRPC_BLAS_THREADS. */
Test(shmrun, workers_get_one_blas_thread_unless_the_user_chose)
{
    expect_blas_env("blas-default", NULL, NULL, "1");
    expect_blas_env("blas-openblas", NULL, "3", "3");
    expect_blas_env("blas-shmrpc", "2", NULL, "(unset)");
}

/* Each worker exits 0 once it has received all four: a signal that was not
 * forwarded, or one that killed shmrun, shows as a failed or hung job. */
Test(shmrun, hup_quit_usr1_usr2_are_forwarded)
{
    struct run r;
    start_job(&r, "sigs", 2, "signals", NULL, NULL);
    await_ready(&r, 2);
    static const int sigs[] = {SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(kill(r.pid, sigs[i]), 0, "kill(shmrun, %d): %s", sigs[i], strerror(errno));
    run_to_exit_0(&r);
    assert_line_once(r.out, "signals 0", "stdout");
    assert_line_once(r.out, "signals 1", "stdout");
    cr_assert_eq(r.err_len, 0, "stderr:\n%s", r.err);
    finish(&r);
}

/* Ranks 0 and 2 ignore SIGTERM, rank 1 exits 0 on it: after the grace
 * period the two survivors are killed and named. */
Test(shmrun, survivors_of_sigterm_are_killed_after_the_grace_period_and_named)
{
    struct run r;
    start_job_opts(&r, "grace", 3, (char *[]){"--grace", "0.2", NULL}, "term", "1", NULL);
    await_ready(&r, 3);
    cr_assert_eq(kill(r.pid, SIGTERM), 0, "kill(shmrun): %s", strerror(errno));
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), 128 + SIGKILL, "shmrun exit status %d; stderr:\n%s", exit_code(st), r.err);
    cr_assert_str_eq(r.err, "shmrun: ranks 0,2 still running 0.2 s after SIGTERM: killed with SIGKILL\n",
                     "unexpected report");
    assert_workers_gone(&r.ready, 3);
    assert_segment_gone(r.ns);
    finish(&r);
}

/* As above with a grace period longer than the test: a second SIGTERM,
 * sent once the first was forwarded (rank 1 exited on it), kills the
 * survivors at once, as a second Ctrl-C does under mpirun. */
Test(shmrun, a_second_sigterm_ends_the_grace_period_at_once)
{
    struct run r;
    start_job_opts(&r, "hurry", 3, (char *[]){"--grace", "600", NULL}, "term", "1", NULL);
    await_ready(&r, 3);
    cr_assert_eq(kill(r.pid, SIGTERM), 0, "kill(shmrun): %s", strerror(errno));
    cr_assert(r.ready.pidfd[1] >= 0 && pidfd_exited(r.ready.pidfd[1], WATCH_WAIT_MS),
              "rank 1 did not exit on the forwarded SIGTERM");
    cr_assert_eq(kill(r.pid, SIGTERM), 0, "kill(shmrun): %s", strerror(errno));
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), 128 + SIGKILL, "shmrun exit status %d; stderr:\n%s", exit_code(st), r.err);
    cr_assert_str_eq(r.err, "shmrun: ranks 0,2 still running at a second stop signal (SIGTERM): killed with SIGKILL\n",
                     "unexpected report");
    assert_workers_gone(&r.ready, 3);
    assert_segment_gone(r.ns);
    finish(&r);
}

/* --- restarts ----------------------------------------------------------- */

/* One failing attempt of worker_prog's "restart" mode: its n workers
 * report ready, the chosen rank is let go (it SIGKILLs itself), and every
 * worker of the attempt is gone; their readiness is then forgotten, so the
 * next attempt's lines count afresh. Returns the pid the rank had. */
static pid_t failed_attempt(struct run *r, int n, int chosen)
{
    await_ready(r, n);
    go(r);
    pid_t pid = r->ready.pid[chosen];
    for (int rank = 0; rank < n; rank++) {
        int fd = r->ready.pidfd[rank];
        cr_assert(fd < 0 || pidfd_exited(fd, WATCH_WAIT_MS), "rank %d (pid %d) still runs %d ms after rank %d died",
                  rank, r->ready.pid[rank], WATCH_WAIT_MS, chosen);
        if (fd >= 0)
            close(fd);
        r->ready.pidfd[rank] = -1;
        r->ready.pid[rank] = 0;
    }
    r->ready.n = 0;
    return pid;
}

static void assert_attempt_lines(const char *out, int n, int attempts)
{
    char want[64];
    for (int k = 0; k < attempts; k++)
        for (int rank = 0; rank < n; rank++) {
            snprintf(want, sizeof(want), "attempt %d %d %d", rank, k, k);
            assert_line_once(out, want, "stdout");
        }
    cr_assert_eq(count_lines(out), n * attempts, "stdout:\n%s", out);
}

Test(shmrun, a_worker_killed_by_a_signal_restarts_the_job)
{
    struct run r;
    start_job_opts(&r, "restart", 3, (char *[]){"--max-restarts", "1", NULL}, "restart", "1", "1");
    pid_t dead = failed_attempt(&r, 3, 1);
    await_ready(&r, 3);
    run_to_exit_0(&r);
    char want[160];
    snprintf(want, sizeof(want),
             "shmrun: rank 1 (pid %d) was killed by signal SIGKILL; restarting the job (restart 1 of 1)\n", (int)dead);
    cr_assert_str_eq(r.err, want, "unexpected report");
    assert_attempt_lines(r.out, 3, 2); /* SHMRPC_ and TORCHELASTIC_RESTART_COUNT: 0, then 1 */
    assert_workers_gone(&r.ready, 3);
    assert_segment_gone(r.ns);
    finish(&r);
}

Test(shmrun, max_restarts_0_stops_the_job_as_without_it)
{
    struct run r;
    start_job_opts(&r, "norestart", 3, (char *[]){"--max-restarts", "0", NULL}, "restart", "1", "1");
    await_ready(&r, 3);
    pid_t dead = r.ready.pid[1];
    go(&r);
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), 128 + SIGKILL, "shmrun exit status %d; stderr:\n%s", exit_code(st), r.err);
    char want[160];
    snprintf(want, sizeof(want), "shmrun: rank 1 (pid %d) was killed by signal SIGKILL; stopped the other 2 workers\n",
             (int)dead);
    cr_assert_str_eq(r.err, want, "unexpected report");
    assert_attempt_lines(r.out, 3, 1);
    assert_workers_gone(&r.ready, 3);
    assert_segment_gone(r.ns);
    finish(&r);
}

/* A worker that exits non-zero chose to fail: not restarted. (A second
 * attempt would report ready again: ready_line fails on "ready twice".) */
Test(shmrun, a_clean_non_zero_exit_is_not_restarted)
{
    struct run r;
    start_job_opts(&r, "exit3", 3, (char *[]){"--max-restarts", "2", NULL}, "exit", "2", "3");
    await_ready(&r, 3);
    pid_t pid = r.ready.pid[2];
    go(&r);
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), 3, "shmrun exit status %d; stderr:\n%s", exit_code(st), r.err);
    char want[160];
    snprintf(want, sizeof(want), "shmrun: rank 2 (pid %d) exited with status 3; stopped the other 2 workers\n", (int)pid);
    cr_assert_str_eq(r.err, want, "unexpected report");
    cr_assert_eq(r.ready.n, 3);
    assert_workers_gone(&r.ready, 3);
    assert_segment_gone(r.ns);
    finish(&r);
}

Test(shmrun, the_last_attempts_failure_ends_the_job_with_its_status)
{
    struct run r;
    start_job_opts(&r, "exhaust", 2, (char *[]){"--max-restarts", "2", NULL}, "restart", "0", "5");
    pid_t dead[3];
    dead[0] = failed_attempt(&r, 2, 0);
    dead[1] = failed_attempt(&r, 2, 0);
    await_ready(&r, 2);
    dead[2] = r.ready.pid[0];
    go(&r);
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), 128 + SIGKILL, "shmrun exit status %d; stderr:\n%s", exit_code(st), r.err);
    char want[512];
    snprintf(want, sizeof(want),
             "shmrun: rank 0 (pid %d) was killed by signal SIGKILL; restarting the job (restart 1 of 2)\n"
             "shmrun: rank 0 (pid %d) was killed by signal SIGKILL; restarting the job (restart 2 of 2)\n"
             "shmrun: rank 0 (pid %d) was killed by signal SIGKILL; stopped the other 1 worker\n",
             (int)dead[0], (int)dead[1], (int)dead[2]);
    cr_assert_str_eq(r.err, want, "unexpected report");
    assert_attempt_lines(r.out, 2, 3);
    assert_workers_gone(&r.ready, 2);
    assert_segment_gone(r.ns);
    finish(&r);
}

/* The failed attempt's lines say why it failed: a restart appends. */
Test(shmrun, a_restarted_attempt_appends_to_the_output_dir_logs)
{
    char dir[] = "/tmp/shmrun-logs-XXXXXX";
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    struct run r;
    start_job_opts(&r, "restartlogs", 2, (char *[]){"--max-restarts", "1", "--output-dir", dir, NULL}, "restart", "1",
                   "1");
    failed_attempt(&r, 2, 1);
    await_ready(&r, 2);
    run_to_exit_0(&r);
    char want[64];
    for (int rank = 0; rank < 2; rank++) {
        snprintf(want, sizeof(want), "attempt %d 0 0\nattempt %d 1 1\n", rank, rank);
        assert_file(dir, rank, "stdout.log", want);
    }
    rm_tree(dir);
    finish(&r);
}

/* A stop the user asked for is not a failure to recover from: the workers
 * the forwarded SIGTERM kills are not restarted. */
Test(shmrun, sigterm_during_a_run_is_not_restarted)
{
    struct run r;
    start_job_opts(&r, "termrestart", 2, (char *[]){"--max-restarts", "2", NULL}, "restart", "1", "5");
    await_ready(&r, 2);
    cr_assert_eq(kill(r.pid, SIGTERM), 0, "kill(shmrun): %s", strerror(errno));
    int st = await_exit(&r);
    cr_assert_eq(exit_code(st), 128 + SIGTERM, "shmrun exit status %d; stderr:\n%s", exit_code(st), r.err);
    cr_assert_null(strstr(r.err, "restarting"), "stderr:\n%s", r.err);
    cr_assert_eq(r.ready.n, 2);
    assert_attempt_lines(r.out, 2, 1);
    assert_workers_gone(&r.ready, 2);
    assert_segment_gone(r.ns);
    finish(&r);
}

/* --- binding ------------------------------------------------------------ */

static int allowed_cpus(int *cpu, int max)
{
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof(set), &set), 0, "sched_getaffinity: %s", strerror(errno));
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < max; c++)
        if (CPU_ISSET(c, &set))
            cpu[n++] = c;
    return n;
}

static void write_file(const char *root, const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
        *p = 0;
        cr_assert(mkdir(path, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", path, strerror(errno));
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    cr_assert(f, "fopen %s: %s", path, strerror(errno));
    fprintf(f, "%s\n", text);
    fclose(f);
}

struct fake {
    char root[64];
    int cpu[2]; /* two CPUs this test may run on */
};

/* A fake sysfs; skips the test on a machine with a single allowed CPU. */
static void fake_init(struct fake *f)
{
    int cpu[CPU_SETSIZE];
    if (allowed_cpus(cpu, CPU_SETSIZE) < 2)
        cr_skip_test("binding tests need two allowed CPUs");
    f->cpu[0] = cpu[0], f->cpu[1] = cpu[1];
    snprintf(f->root, sizeof(f->root), "/tmp/shmrun-sysfs-XXXXXX");
    cr_assert(mkdtemp(f->root), "mkdtemp: %s", strerror(errno));
    cr_assert_eq(setenv("SHMRUN_SYSFS", f->root, 1), 0, "setenv");
}

/* node: the node's cpulist; core: cpu's core_cpus_list. */
static void fake_node(struct fake *f, int node, const char *cpulist)
{
    char rel[128];
    snprintf(rel, sizeof(rel), "devices/system/node/node%d/cpulist", node);
    write_file(f->root, rel, cpulist);
}

static void fake_core(struct fake *f, int cpu, const char *cpulist)
{
    char rel[128];
    snprintf(rel, sizeof(rel), "devices/system/cpu/cpu%d/topology/core_cpus_list", cpu);
    write_file(f->root, rel, cpulist);
}

static void fake_fini(struct fake *f)
{
    unsetenv("SHMRUN_SYSFS");
    rm_tree(f->root);
}

/* Run n ranks in mode "affinity" with opts; want[r] is rank r's CPU list. */
static void assert_affinity(struct run *r, const char *test, int n, char **opts, const char *const *want)
{
    start_job_opts(r, test, n, opts, "affinity", NULL, NULL);
    await_ready(r, n);
    run_to_exit_0(r);
    char line[128];
    for (int rank = 0; rank < n; rank++) {
        snprintf(line, sizeof(line), "affinity %d %s", rank, want[rank]);
        assert_line_once(r->out, line, "stdout (the workers' sched_getaffinity)");
    }
}

static char *fmt(char *buf, size_t len, const char *f, int a, int b)
{
    snprintf(buf, len, f, a, b);
    return buf;
}

/* Two nodes of one core each; CPU 1000 (not allowed) in node 1 and in its
 * core is left out. Three ranks on two cores: rank 2 wraps to core 0. */
Test(shmrun, bind_to_core_pins_each_rank_to_one_core_round_robin)
{
    struct fake f;
    fake_init(&f);
    char a0[16], a1[16], n1[32];
    fmt(a0, sizeof(a0), "%d", f.cpu[0], 0), fmt(a1, sizeof(a1), "%d", f.cpu[1], 0);
    fake_node(&f, 0, a0);
    fake_node(&f, 1, fmt(n1, sizeof(n1), "%d,%d", f.cpu[1], 1000));
    fake_core(&f, f.cpu[0], a0);
    fake_core(&f, f.cpu[1], n1);
    struct run r;
    assert_affinity(&r, "bindcore", 3, (char *[]){"--bind-to", "core", "--report-bindings", NULL},
                    (const char *[]){a0, a1, a0});
    assert_line_once(r.err, "shmrun: warning: --bind-to core: 3 ranks on 2 cores: binding wraps round robin (up to 2 ranks per core)",
                     "stderr");
    char want[160];
    for (int rank = 0; rank < 3; rank++) {
        snprintf(want, sizeof(want), "shmrun: rank %d (pid %d) bound to core %d of 2: cpus %s (NUMA node %d)", rank,
                 (int)r.ready.pid[rank], rank % 2, rank % 2 ? a1 : a0, rank % 2);
        assert_line_once(r.err, want, "stderr (--report-bindings)");
    }
    cr_assert_eq(count_lines(r.err), 4, "stderr has other lines:\n%s", r.err);
    finish(&r);
    fake_fini(&f);
}

/* Two hardware threads of one core: a rank gets both. */
Test(shmrun, bind_to_core_keeps_a_cores_threads_together)
{
    struct fake f;
    fake_init(&f);
    char both[32];
    fmt(both, sizeof(both), "%d,%d", f.cpu[0], f.cpu[1]);
    fake_node(&f, 0, both);
    fake_core(&f, f.cpu[0], both);
    fake_core(&f, f.cpu[1], both);
    struct run r;
    assert_affinity(&r, "bindht", 2, (char *[]){"--bind-to", "core", NULL}, (const char *[]){both, both});
    cr_assert_str_eq(r.err, "shmrun: warning: --bind-to core: 2 ranks on 1 core: binding wraps round robin (up to 2 ranks per core)\n",
                     "unexpected stderr");
    finish(&r);
    fake_fini(&f);
}

/* Node 1 has no allowed CPU and is skipped; node numbers may have holes. */
Test(shmrun, bind_to_numa_pins_each_rank_to_one_node)
{
    struct fake f;
    fake_init(&f);
    char a0[16], a1[16];
    fmt(a0, sizeof(a0), "%d", f.cpu[0], 0), fmt(a1, sizeof(a1), "%d", f.cpu[1], 0);
    fake_node(&f, 0, a0);
    fake_node(&f, 1, "1002-1003");
    fake_node(&f, 3, a1);
    struct run r;
    assert_affinity(&r, "bindnuma", 2, (char *[]){"--bind-to", "numa", "--report-bindings", NULL},
                    (const char *[]){a0, a1});
    char want[160];
    for (int rank = 0; rank < 2; rank++) {
        snprintf(want, sizeof(want), "shmrun: rank %d (pid %d) bound to NUMA node %d of 2: cpus %s", rank,
                 (int)r.ready.pid[rank], rank ? 3 : 0, rank ? a1 : a0);
        assert_line_once(r.err, want, "stderr (--report-bindings)");
    }
    cr_assert_eq(count_lines(r.err), 2, "stderr has other lines:\n%s", r.err);
    finish(&r);
    fake_fini(&f);
}

/* shmrun started on one CPU (as taskset or a cpuset would) binds within it,
 * with the real sysfs. */
Test(shmrun, binding_stays_inside_the_launchers_own_cpus)
{
    int cpu[CPU_SETSIZE];
    if (allowed_cpus(cpu, CPU_SETSIZE) < 2)
        cr_skip_test("needs two allowed CPUs");
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu[1], &one);
    shmrun_cpus = &one;
    char a1[16];
    fmt(a1, sizeof(a1), "%d", cpu[1], 0);
    struct run r;
    assert_affinity(&r, "bindmask", 2, (char *[]){"--bind-to", "core", NULL}, (const char *[]){a1, a1});
    shmrun_cpus = NULL;
    assert_line_once(r.err, "shmrun: warning: --bind-to core: 2 ranks on 1 core: binding wraps round robin (up to 2 ranks per core)",
                     "stderr");
    finish(&r);
}
