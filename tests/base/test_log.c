/* SPDX-License-Identifier: MIT */
/* The log (shmrpc/log.h): level filtering, SHMRPC_LOG_LEVEL parsing, the
 * "who" prefix of every line, one write per line, and a worker's identity
 * between sr_init and sr_shutdown. stderr is captured in a memfd. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "log.h"
#include "shmrpc/rpc.h"
#include "shmrpc/spawn.h"
#include "worker_check.h"

LEAK_CHECKED_SUITE(log);

static int saved_fd = -1, cap_fd = -1;

static void capture_start(void)
{
    cap_fd = memfd_create("log-capture", 0);
    cr_assert(cap_fd >= 0);
    saved_fd = dup(2);
    cr_assert(saved_fd >= 0 && dup2(cap_fd, 2) == 2);
}

/* The captured bytes (static buffer), stderr restored. */
static const char *capture_end(void)
{
    static char buf[1 << 16];
    dup2(saved_fd, 2);
    close(saved_fd);
    ssize_t n = pread(cap_fd, buf, sizeof(buf) - 1, 0);
    close(cap_fd);
    buf[n > 0 ? n : 0] = 0;
    return buf;
}

static void set_level(const char *v)
{
    if (v)
        setenv("SHMRPC_LOG_LEVEL", v, 1);
    else
        unsetenv("SHMRPC_LOG_LEVEL");
    sr__log_reload();
}

static void log_all_levels(void)
{
    sr_logf(SR_LOG_ERROR, "e%d", 1);
    sr_logf(SR_LOG_WARN, "w%d", 2);
    sr_logf(SR_LOG_INFO, "i%d", 3);
    sr_logf(SR_LOG_DEBUG, "d%d", 4);
}

Test(log, level_filtering)
{
    sr__log_set_role("r");
    const char *want[] = {"r: e1\n", "r: e1\nr: warning: w2\n", "r: e1\nr: warning: w2\nr: info: i3\n",
                          "r: e1\nr: warning: w2\nr: info: i3\nr: debug: d4\n"};
    const char *names[] = {"error", "warn", "info", "debug"};
    for (int l = 0; l < 4; l++) {
        set_level(names[l]);
        for (int k = 0; k < 4; k++)
            cr_assert_eq(sr_log_enabled((sr_log_level)k), k <= l, "level %s, enabled(%d)", names[l], k);
        capture_start();
        log_all_levels();
        const char *got = capture_end();
        cr_assert_str_eq(got, want[l], "SHMRPC_LOG_LEVEL=%s", names[l]);
    }
    /* A level outside the enum is an error: always written. */
    set_level("error");
    capture_start();
    sr_logf((sr_log_level)42, "odd");
    cr_assert_str_eq(capture_end(), "r: odd\n");
}

Test(log, env_parsing)
{
    struct { const char *v; sr_log_level l; } ok[] = {
        {NULL, SR_LOG_WARN}, {"", SR_LOG_WARN}, {"DEBUG", SR_LOG_DEBUG}, {"Info", SR_LOG_INFO},
        {"warning", SR_LOG_WARN}, {"WARN", SR_LOG_WARN}, {"error", SR_LOG_ERROR},
    };
    sr__log_set_role("r");
    capture_start();
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        setenv("SHMRPC_LOG_LEVEL", ok[i].v ? ok[i].v : "", 1);
        if (!ok[i].v)
            unsetenv("SHMRPC_LOG_LEVEL");
        cr_assert_eq(sr__log_reload(), ok[i].l, "SHMRPC_LOG_LEVEL='%s'", ok[i].v ? ok[i].v : "(unset)");
    }
    cr_assert_str_eq(capture_end(), "", "valid values are silent");
    /* An invalid value: the default, and one warning per process. */
    capture_start();
    setenv("SHMRPC_LOG_LEVEL", "verbose", 1);
    cr_assert_eq(sr__log_reload(), SR_LOG_WARN);
    setenv("SHMRPC_LOG_LEVEL", "2", 1);
    cr_assert_eq(sr__log_reload(), SR_LOG_WARN);
    cr_assert_str_eq(capture_end(),
                     "r: warning: SHMRPC_LOG_LEVEL='verbose' is not one of error, warn, info, debug; using warn\n");
}

Test(log, prefix_names_the_process_then_the_worker)
{
    char want[512];
    set_level("info");
    sr__log_set_role(NULL);
    capture_start();
    sr_logf(SR_LOG_INFO, "before");
    sr__log_set_worker("trainer", 3);
    sr_logf(SR_LOG_WARN, "named");
    sr__log_set_worker(NULL, 2);
    sr_logf(SR_LOG_ERROR, "default name");
    sr__log_text(SR_LOG_ERROR, "worker2: sr_rpc_sync: bad rank 9"); /* its own prefix is not repeated */
    sr__log_set_worker(NULL, -1);
    sr__log_set_role("shmrun");
    sr__log_text(SR_LOG_ERROR, "shmrun: rank 1 (pid 7) was killed by signal SIGKILL");
    sr__log_text(SR_LOG_WARN, "workerless: text kept whole");
    snprintf(want, sizeof(want), "pid %d: info: before\n", (int)getpid());
    cr_assert_str_eq(capture_end(), strcat(want, "trainer (rank 3): warning: named\n"
                                                 "worker2 (rank 2): default name\n"
                                                 "worker2 (rank 2): sr_rpc_sync: bad rank 9\n"
                                                 "shmrun: rank 1 (pid 7) was killed by signal SIGKILL\n"
                                                 "shmrun: warning: workerless: text kept whole\n"));
}

Test(log, long_line_is_cut_and_ends_the_line)
{
    static char big[4000];
    memset(big, 'x', sizeof(big) - 1);
    set_level("warn");
    sr__log_set_role("r");
    capture_start();
    sr_logf(SR_LOG_ERROR, "%s", big);
    const char *got = capture_end();
    size_t n = strlen(got);
    cr_assert_eq(n, 1023, "a cut line is 1023 bytes with its newline, got %zu", n);
    cr_assert(!strcmp(got + n - 4, "...\n") && !strncmp(got, "r: xxx", 6), "cut line: '%.20s...%s'", got, got + n - 8);
}

/* Lines of concurrent threads never interleave: each is one write(2). */
#define THREADS 4
#define LINES 400
static void *spam(void *p)
{
    int id = (int)(intptr_t)p;
    for (int i = 0; i < LINES; i++)
        sr_logf(SR_LOG_ERROR, "thread %d line %d %s", id, i, "................................................");
    return NULL;
}

Test(log, concurrent_lines_stay_whole)
{
    set_level("error");
    sr__log_set_role("r");
    int fds[2];
    cr_assert(pipe(fds) == 0);
    saved_fd = dup(2);
    dup2(fds[1], 2);
    close(fds[1]);
    pthread_t t[THREADS];
    static char buf[THREADS * LINES * 80];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, spam, (void *)(intptr_t)i);
    size_t got = 0;
    int lines = 0;
    while (lines < THREADS * LINES) {
        ssize_t n = read(fds[0], buf + got, sizeof(buf) - got);
        cr_assert(n > 0, "pipe read: %zd after %d lines", n, lines);
        for (ssize_t k = 0; k < n; k++)
            lines += buf[got + (size_t)k] == '\n';
        got += (size_t)n;
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    dup2(saved_fd, 2);
    close(saved_fd);
    close(fds[0]);
    buf[got] = 0;
    for (char *line = buf, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
        int id, i, end = 0;
        *nl = 0;
        cr_assert(sscanf(line, "r: thread %d line %d ................................................%n", &id, &i,
                         &end) == 2 && end == (int)strlen(line),
                  "a mangled line: '%s'", line);
    }
}

/* Between sr_init and sr_shutdown a worker's lines carry its name and rank;
 * after sr_shutdown, its pid. */
static int named_worker(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    set_level("info");
    capture_start();
    char name[32];
    snprintf(name, sizeof(name), "trainer%d", rank);
    sr_init_opts o = {.name = name};
    int rc = sr_init(&o);
    sr_logf(SR_LOG_INFO, "hello");
    int sd = sr_shutdown(true, 60);
    sr_logf(SR_LOG_INFO, "bye");
    const char *got = capture_end();
    WCHECK(rc == 0 && sd == 0, "sr_init %d, sr_shutdown %d: %s", rc, sd, sr_last_error());
    char first[96], mid[64], last[64];
    snprintf(first, sizeof(first), "trainer%d (rank %d): info: attached to segment '", rank, rank);
    snprintf(mid, sizeof(mid), "\ntrainer%d (rank %d): info: hello\n", rank, rank);
    snprintf(last, sizeof(last), "\npid %d: info: bye\n", (int)getpid());
    size_t gl = strlen(got), ll = strlen(last);
    WCHECK(!strncmp(got, first, strlen(first)) && strstr(got, mid) && gl > ll && !strcmp(got + gl - ll, last),
           "rank %d logged '%s', expected '%s...%s...%s'", rank, got, first, mid, last);
    return 0;
}

Test(log, worker_lines_name_the_worker, .timeout = 120)
{
    sr__log_set_role(NULL);
    sr_spawn_opts o = {.name_prefix = test_ns("log"), .shm_size = 2 * (64u << 20)};
    int rc = sr_spawn(2, named_worker, NULL, &o);
    cr_assert_eq(rc, 0, "%s", sr_last_error());
}

/* One warning per job: a worker without a launcher's role reports a bad
 * value only as rank 0 (sr_spawn's children, mpirun's ranks); a launcher
 * reports it and passes the level in force on to its workers. */
Test(log, bad_value_is_reported_by_rank_0_only)
{
    sr__log_set_role(NULL);
    setenv("SHMRPC_LOG_LEVEL", "loud", 1);
    capture_start();
    cr_assert_eq(sr__log_reload(), SR_LOG_WARN);
    sr__log_set_worker(NULL, 1);
    sr__log_set_worker(NULL, -1);
    cr_assert_str_eq(capture_end(), "", "rank 1 reported the bad value");
    capture_start();
    sr__log_set_worker(NULL, 0);
    sr__log_set_worker(NULL, 0);
    sr__log_set_worker(NULL, -1);
    cr_assert_str_eq(capture_end(),
                     "worker0 (rank 0): warning: SHMRPC_LOG_LEVEL='loud' is not one of error, warn, info, debug; using warn\n");
}

Test(log, launcher_reports_and_passes_the_level_in_force_on)
{
    setenv("SHMRPC_LOG_LEVEL", "loud", 1);
    capture_start();
    sr__log_reload();
    sr__log_set_role("launcher");
    sr__log_pass_on();
    cr_assert_str_eq(capture_end(),
                     "launcher: warning: SHMRPC_LOG_LEVEL='loud' is not one of error, warn, info, debug; using warn\n");
    cr_assert_str_eq(getenv("SHMRPC_LOG_LEVEL"), "warn", "the workers' SHMRPC_LOG_LEVEL");
    setenv("SHMRPC_LOG_LEVEL", "Info", 1);
    sr__log_reload();
    sr__log_pass_on();
    cr_assert_str_eq(getenv("SHMRPC_LOG_LEVEL"), "Info", "a good value is passed on as it is");
}
