/* SPDX-License-Identifier: MIT */
/* shmrun --monitor, end to end on the real shmrun (SHMRUN) and
 * tests/helpers/monitor_prog.c (MONITOR_PROG): with stderr not a terminal,
 * each view is appended (a header, then one line per worker, no escape
 * sequence), a view shows rank 0's calls once it has made them (the test
 * then lets the job end through rank 0's stdin: an event, not a sleep), and
 * the job's end adds the totals; on a terminal (a pty) each view is drawn
 * over the last one and the final one below it; bad intervals are refused.
 * Every wait is bounded. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "helpers/watch.h"

LEAK_CHECKED_SUITE(monitor);

#define CALLS 100
#define OUT_MAX (1 << 20)

/* One worker's line of a view. */
struct mrow {
    int rank;
    char worker[40], heap[24], cpu[16];
    double served_s, made_s;
    unsigned long long served, made, inbox, in_flight;
};

/* A view: its rows (by order) and whether it is the final one. */
struct mview {
    bool end;
    int n;
    struct mrow row[4];
};

static bool parse_row(const char *l, struct mrow *r)
{
    return sscanf(l, "%d %39s %lf %lf %llu %llu %llu %llu %23s %15s", &r->rank, r->worker, &r->served_s, &r->made_s,
                  &r->served, &r->made, &r->inbox, &r->in_flight, r->heap, r->cpu) == 10;
}

/* The views in text (complete lines only); returns how many (at most max). */
static int parse_views(const char *text, struct mview *v, int max)
{
    int n = -1;
    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n');
        if (!e)
            break;
        char line[512];
        snprintf(line, sizeof(line), "%.*s", (int)(e - l), l);
        l = e + 1;
        if (!strncmp(line, "shmrun: monitor: ", 17)) {
            if (n + 1 >= max)
                break;
            v[++n] = (struct mview){.end = strstr(line, "the job ended") != NULL};
            continue;
        }
        struct mrow r;
        if (n >= 0 && parse_row(line, &r)) {
            cr_assert_lt(v[n].n, 4, "a view with more rows than workers:\n%s", text);
            v[n].row[v[n].n++] = r;
        }
    }
    return n + 1;
}

/* A view (not the final one) in which rank 0 shows all its calls made. */
static bool calls_shown(const char *text)
{
    static struct mview v[4096];
    int n = parse_views(text, v, 4096);
    for (int i = 0; i < n; i++)
        if (!v[i].end && v[i].n == 2 && v[i].row[0].rank == 0 && v[i].row[0].made == CALLS)
            return true;
    return false;
}

/* shmrun ARGS... with stdin a pipe (*in) and stderr a pipe (*err, nonblocking). */
static pid_t start_shmrun(char *const *args, int *in, int *err)
{
    const char *shmrun = getenv("SHMRUN");
    cr_assert(shmrun && getenv("MONITOR_PROG"), "SHMRUN and MONITOR_PROG are not set: run this test through meson");
    int pi[2], pe[2];
    cr_assert(pipe(pi) == 0 && pipe(pe) == 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        dup2(pi[0], 0);
        dup2(pe[1], 2);
        close(pi[0]), close(pi[1]), close(pe[0]), close(pe[1]);
        char *argv[16] = {(char *)shmrun};
        for (int i = 0; args[i] && i < 14; i++)
            argv[i + 1] = args[i];
        execv(shmrun, argv);
        _exit(127);
    }
    close(pi[0]);
    close(pe[1]);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    *in = pi[1];
    *err = pe[0];
    return pid;
}

/* Read stderr until its end, writing one byte to in once the calls are shown; the exit status. */
static int drive(pid_t pid, int in, int err, char *out, size_t cap)
{
    size_t len = 0;
    bool eof = false, released = false;
    int64_t deadline = watch_now_ms() + 90000;
    while (!eof && watch_now_ms() < deadline) {
        struct pollfd p = {.fd = err, .events = POLLIN};
        poll(&p, 1, (int)(deadline - watch_now_ms()));
        watch_drain(err, out, cap, &len, &eof);
        if (!released && calls_shown(out)) {
            cr_assert_eq(write(in, "x", 1), 1);
            released = true;
        }
    }
    close(in);
    close(err);
    if (!eof) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        cr_assert_fail("shmrun --monitor did not end within 90 s (calls %s); stderr:\n%s",
                       released ? "shown" : "never shown", out);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(released, "no view showed rank 0's %d calls; stderr:\n%s", CALLS, out);
    return st;
}

/* A row of rank's worker; its name is "-" only until it attached (then it had made and served nothing). */
static void check_row(const struct mrow *r, int rank, const char *text)
{
    char want[24];
    snprintf(want, sizeof(want), "worker%d", rank);
    cr_assert_eq(r->rank, rank, "rows out of rank order:\n%s", text);
    cr_assert(!strcmp(r->worker, want) || (!strcmp(r->worker, "-") && !r->made && !r->served),
              "rank %d's worker is '%s':\n%s", rank, r->worker, text);
    cr_assert(r->made_s >= 0 && r->served_s >= 0 && r->in_flight <= CALLS && r->inbox <= 1024, "implausible row:\n%s", text);
    double cpu = strcmp(r->cpu, "-") ? atof(r->cpu) : 0;
    cr_assert(cpu >= 0 && cpu <= 100.0 * (double)sysconf(_SC_NPROCESSORS_ONLN) + 50, "cpu%% %s:\n%s", r->cpu, text);
    size_t hl = strlen(r->heap);
    cr_assert(hl > 1 && r->heap[hl - 1] == 'B', "heap '%s' is not a size:\n%s", r->heap, text);
}

Test(monitor, views_are_appended_when_not_a_terminal, .timeout = 120)
{
    char n[] = "2", calls[16];
    snprintf(calls, sizeof(calls), "%d", CALLS);
    char *args[] = {"--monitor=0.02", "-n", n, "--name-prefix", (char *)test_ns("monitor"), getenv("MONITOR_PROG"),
                    calls, NULL};
    int in, err;
    pid_t pid = start_shmrun(args, &in, &err);
    char *out = calloc(1, OUT_MAX);
    int st = drive(pid, in, err, out, OUT_MAX);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "shmrun failed (status %#x); stderr:\n%s", st, out);
    cr_assert_null(strchr(out, '\033'), "an escape sequence without a terminal:\n%s", out);
    static struct mview v[4096];
    int nv = parse_views(out, v, 4096);
    cr_assert_geq(nv, 2, "expected a live view and the final one:\n%s", out);
    for (int i = 0; i < nv; i++) {
        cr_assert_eq(v[i].n, 2, "view %d has %d rows, expected one per worker:\n%s", i, v[i].n, out);
        cr_assert_eq(v[i].end, i == nv - 1, "view %d: the final view must be the last, and only it:\n%s", i, out);
        for (int r = 0; r < 2; r++)
            check_row(&v[i].row[r], r, out);
    }
    /* the job's totals: rank 0 made the calls, rank 1 served them (the
     * shutdown's own messages are no calls), none is left in flight */
    const struct mview *end = &v[nv - 1];
    cr_assert(!strcmp(end->row[0].worker, "worker0") && !strcmp(end->row[1].worker, "worker1"), "final names:\n%s", out);
    cr_assert_eq(end->row[0].made, CALLS, "rank 0 made %llu calls in all, expected %d:\n%s", end->row[0].made, CALLS, out);
    cr_assert_eq(end->row[1].served, CALLS, "rank 1 served %llu calls, expected %d:\n%s", end->row[1].served, CALLS, out);
    cr_assert(end->row[0].in_flight == 0 && end->row[0].made_s > 0, "final row of rank 0:\n%s", out);
    free(out);
}

Test(monitor, bad_intervals_are_refused, .timeout = 60)
{
    static const char *const bad[] = {"--monitor=0", "--monitor=abc", "--monitor=-1", "--monitor=5000"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *args[] = {(char *)bad[i], "-n", "1", getenv("MONITOR_PROG"), NULL};
        int in, err;
        pid_t pid = start_shmrun(args, &in, &err);
        close(in);
        char out[4096] = "";
        size_t len = 0;
        bool eof = false;
        int64_t deadline = watch_now_ms() + 30000;
        while (!eof && watch_now_ms() < deadline) {
            struct pollfd p = {.fd = err, .events = POLLIN};
            poll(&p, 1, (int)(deadline - watch_now_ms()));
            watch_drain(err, out, sizeof(out), &len, &eof);
        }
        close(err);
        int st;
        cr_assert_eq(waitpid(pid, &st, 0), pid);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "%s: status %#x, expected 2; stderr:\n%s", bad[i], st, out);
        cr_assert(strstr(out, "--monitor takes seconds"), "%s: no error naming --monitor:\n%s", bad[i], out);
    }
}

/* text without its escape sequences (ESC [ ... letter) and carriage returns, in out */
static void strip_escapes(const char *text, char *out)
{
    for (const char *p = text; *p; p++) {
        if (*p == '\033' && p[1] == '[') {
            for (p += 2; *p && !((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z')); p++)
                ;
            if (!*p)
                break;
        } else if (*p != '\r') {
            *out++ = *p;
        }
    }
    *out = 0;
}

Test(monitor, views_are_redrawn_on_a_terminal, .timeout = 120)
{
    const char *shmrun = getenv("SHMRUN"), *prog = getenv("MONITOR_PROG");
    cr_assert(shmrun && prog, "SHMRUN and MONITOR_PROG are not set: run this test through meson");
    char calls[16];
    snprintf(calls, sizeof(calls), "%d", CALLS);
    int master;
    pid_t pid = forkpty(&master, NULL, NULL, NULL);
    cr_assert(pid >= 0, "forkpty: %s", strerror(errno));
    if (pid == 0) {
        execl(shmrun, shmrun, "--monitor=0.02", "-n", "2", "--name-prefix", test_ns("monitor-tty"), prog, calls,
              (char *)NULL);
        _exit(127);
    }
    fcntl(master, F_SETFL, O_NONBLOCK);
    char *out = calloc(1, OUT_MAX), *plain = calloc(1, OUT_MAX);
    size_t len = 0;
    bool eof = false, released = false;
    int64_t deadline = watch_now_ms() + 90000;
    while (!eof && watch_now_ms() < deadline) {
        struct pollfd p = {.fd = master, .events = POLLIN};
        poll(&p, 1, (int)(deadline - watch_now_ms()));
        ssize_t got = read(master, out + len, OUT_MAX - 1 - len);
        if (got > 0)
            len += (size_t)got;
        else if (got == 0 || (got < 0 && errno == EIO)) /* every holder of the terminal closed it */
            eof = true;
        out[len] = 0;
        strip_escapes(out, plain);
        if (!released && calls_shown(plain) && strstr(out, "\033[4A")) { /* a redraw happened */
            cr_assert_eq(write(master, "x\n", 2), 2); /* rank 0's stdin is the terminal */
            released = true;
        }
    }
    close(master);
    if (!eof) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    cr_assert(eof && released, "shmrun --monitor on a terminal did not %s; output:\n%s",
              released ? "end within 90 s" : "redraw a view showing the calls", plain);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "shmrun failed (status %#x); output:\n%s", st, plain);
    /* every view but the first starts by going back up over the last one's 4 lines; the final one does not */
    const char *final = strstr(out, "the job ended");
    cr_assert(final, "no final view:\n%s", plain);
    const char *last_up = NULL;
    for (const char *p = strstr(out, "\033[4A"); p; p = strstr(p + 1, "\033[4A"))
        last_up = p;
    cr_assert(last_up && last_up < final, "the final view was drawn over the live one (or none was redrawn)");
    static struct mview v[4096];
    int nv = parse_views(plain, v, 4096);
    cr_assert(nv >= 2 && v[nv - 1].end && v[nv - 1].n == 2 && v[nv - 1].row[0].made == CALLS,
              "the final view does not say rank 0 made %d calls:\n%s", CALLS, plain);
    free(out);
    free(plain);
}
