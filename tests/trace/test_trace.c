/* SPDX-License-Identifier: MIT */
/* SHMRPC_TRACE end to end: a representative job (tests/helpers/trace_prog.c:
 * RPC, RRefs passed between users, a distributed autograd pass) runs under
 * the real shmrun (SHMRUN) with SHMRPC_TRACE set, and the one file it leaves
 * is checked against the Trace Event Format:
 *   - valid JSON, an object with a "traceEvents" array, nothing else left in
 *     the directory (no part or temporary file);
 *   - every event has ph, ts, pid (a rank) and tid, a name, and a cat (all
 *     but metadata); X durations are >= 0, B/E nest per thread, b/e pair;
 *   - every flow start has exactly one end and every end one start, the end
 *     binds to its enclosing slice (bp "e"), never before its start, and both
 *     points lie inside a slice of their own thread;
 *   - caller-to-callee flows are there: requests from rank 0 to ranks 1 and
 *     2, and responses back; RRef control messages and the autograd pass
 *     appear; each process is named after its worker.
 * And the merger alone: it drops a flow whose other end is missing; and
 * sr_spawn merges a job inside the program the same way.
 * Jobs that end badly (docs/PROFILING.md): a worker SIGKILLed mid-run, and
 * a SIGINT to shmrun, each leave a valid trace holding the dead worker's
 * last call, and every worker's statistics on stderr; an unwritable trace
 * path is refused before any worker starts (shmrun, sr_spawn); a second
 * attempt's trace moves the first one's aside; a rank replaced in place
 * leaves each generation's events under a process of its own, named with
 * its generation. The heap's gauge, dear to read, is read at most every
 * 100 ms however often events take the gauges' sample. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "helpers/replace_events.h"
#include "helpers/watch.h"
#include "json_check.h"
#include "shmrpc/rpc.h"
#include "shmrpc/spawn.h"
#include "shmrpc/tensor.h"
#include "trace.h"
#include "clock.h"
#include "worker_check.h"

LEAK_CHECKED_SUITE(trace);

#define WORLD 3

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "the trace '%s' was not written: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n + 65536 > cap)
            buf = realloc(buf, cap = 2 * cap + 65536);
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    fclose(f);
    *len = n;
    return buf;
}

/* A trace file read and parsed; `evs` is its "traceEvents" array. */
struct loaded {
    char *text;
    jv doc;
    const jv *evs;
};

static void load_trace(const char *path, struct loaded *t)
{
    size_t len, at;
    t->text = slurp(path, &len);
    const char *why = j_parse(t->text, len, &t->doc, &at);
    cr_assert_null(why, "the trace '%s' is not valid JSON: %s at byte %zu:\n%.2000s", path, why, at, t->text);
    t->evs = j_get(&t->doc, "traceEvents");
    cr_assert(t->doc.t == J_OBJ && t->evs && t->evs->t == J_ARR, "'%s' has no traceEvents array", path);
}

static void unload_trace(struct loaded *t)
{
    j_free(&t->doc);
    free(t->text);
}

/* Run shmrun -n WORLD trace_prog with SHMRPC_TRACE=path; bounded wait. */
static void run_job(const char *path)
{
    const char *shmrun = getenv("SHMRUN"), *prog = getenv("TRACE_PROG");
    cr_assert(shmrun && prog, "SHMRUN and TRACE_PROG are not set: run this test through meson");
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        setenv("SHMRPC_TRACE", path, 1);
        execl(shmrun, shmrun, "-n", "3", "--name-prefix", test_ns("trace"), prog, (char *)NULL);
        _exit(127);
    }
    int pfd = watch_pidfd_open(pid);
    cr_assert(pfd >= 0, "pidfd_open: %s", strerror(errno));
    struct pollfd p = {.fd = pfd, .events = POLLIN};
    if (poll(&p, 1, 90000) != 1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        cr_assert_fail("shmrun with the traced job did not finish within 90 s");
    }
    close(pfd);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the traced job failed (status %#x): see its stderr", st);
}

/* The directory holds exactly the one file. */
static void only_file(const char *dir, const char *name)
{
    DIR *d = opendir(dir);
    cr_assert(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        cr_expect_str_eq(e->d_name, name, "a file other than the trace was left behind: %s", e->d_name);
        n++;
    }
    closedir(d);
    cr_assert_eq(n, 1, "%d files in %s, expected the trace alone", n, dir);
}

static double num(const jv *ev, const char *key, size_t i)
{
    const jv *v = j_get(ev, key);
    cr_assert(v && v->t == J_NUM, "event %zu has no numeric '%s'", i, key);
    return v->num;
}

static bool encloses(const jv *x, double pid, double tid, double ts)
{
    const jv *p = j_get(x, "pid"), *t = j_get(x, "tid"), *s = j_get(x, "ts"), *d = j_get(x, "dur");
    return p->num == pid && t->num == tid && s->num <= ts && ts <= s->num + d->num;
}

/* Some X slice on the flow point's thread encloses it. */
static bool in_slice(const jv *evs, const jv *pt)
{
    double pid = j_get(pt, "pid")->num, tid = j_get(pt, "tid")->num, ts = j_get(pt, "ts")->num;
    for (size_t i = 0; i < evs->n; i++) {
        const char *ph = j_str(&evs->items[i], "ph");
        if (ph && !strcmp(ph, "X") && encloses(&evs->items[i], pid, tid, ts))
            return true;
    }
    return false;
}

/* Every event's common fields; returns ph. */
static const char *check_common(const jv *ev, size_t i)
{
    cr_assert_eq(ev->t, J_OBJ, "event %zu is not an object", i);
    const char *ph = j_str(ev, "ph");
    cr_assert(ph && strlen(ph) == 1 && strchr("XBEbesfiMC", ph[0]), "event %zu has a bad ph '%s'", i, ph ? ph : "(none)");
    double pid = num(ev, "pid", i);
    cr_assert(pid >= 0 && pid < WORLD && pid == (int)pid, "event %zu: pid %g is not a rank", i, pid);
    cr_assert(num(ev, "tid", i) >= 0, "event %zu: bad tid", i);
    cr_assert(num(ev, "ts", i) >= 0, "event %zu: negative ts", i);
    cr_assert(j_str(ev, "name"), "event %zu has no name", i);
    cr_assert(ph[0] == 'M' || j_str(ev, "cat"), "event %zu (%s) has no cat", i, ph);
    if (ph[0] == 'X')
        cr_assert(num(ev, "dur", i) >= 0, "event %zu: negative dur", i);
    if (ph[0] == 'i')
        cr_assert(j_str(ev, "s"), "instant event %zu has no scope", i);
    return ph;
}

/* Flow points: id -> start and end. */
struct flow {
    double id;
    const jv *s, *f;
};

static struct flow *flow_of(struct flow *fl, size_t *n, double id)
{
    for (size_t k = 0; k < *n; k++)
        if (fl[k].id == id)
            return &fl[k];
    fl[*n] = (struct flow){.id = id};
    return &fl[(*n)++];
}

/* b/e: every begin has its end (same pid, cat, id, name), not before it. */
static void check_async(const jv *evs)
{
    for (size_t i = 0; i < evs->n; i++) {
        const jv *b = &evs->items[i];
        if (strcmp(j_str(b, "ph"), "b"))
            continue;
        int ends = 0;
        for (size_t k = 0; k < evs->n; k++) {
            const jv *e = &evs->items[k];
            if (!strcmp(j_str(e, "ph"), "e") && j_get(e, "id")->num == j_get(b, "id")->num &&
                j_get(e, "pid")->num == j_get(b, "pid")->num && !strcmp(j_str(e, "cat"), j_str(b, "cat")) &&
                !strcmp(j_str(e, "name"), j_str(b, "name"))) {
                ends++;
                cr_assert_geq(j_get(e, "ts")->num, j_get(b, "ts")->num, "async span '%s' ends before it begins",
                              j_str(b, "name"));
            }
        }
        cr_assert_eq(ends, 1, "async span '%s' has %d ends", j_str(b, "name"), ends);
    }
}

/* B/E nest per (pid, tid). */
static void check_nesting(const jv *evs)
{
    for (size_t i = 0; i < evs->n; i++) {
        const jv *b = &evs->items[i];
        if (strcmp(j_str(b, "ph"), "B"))
            continue;
        int depth = 0;
        bool closed = false;
        for (size_t k = i; k < evs->n && !closed; k++) {
            const jv *e = &evs->items[k];
            if (j_get(e, "pid")->num != j_get(b, "pid")->num || j_get(e, "tid")->num != j_get(b, "tid")->num)
                continue;
            depth += !strcmp(j_str(e, "ph"), "B") - !strcmp(j_str(e, "ph"), "E");
            closed = depth == 0;
        }
        cr_assert(closed, "B event '%s' is never closed", j_str(b, "name"));
    }
}

/* Flows: paired, bound, ordered, inside slices; returns (caller, callee) counts. */
static void check_flows(const jv *evs, int req[WORLD][WORLD], int resp[WORLD][WORLD])
{
    struct flow *fl = calloc(evs->n, sizeof(*fl));
    size_t nf = 0;
    for (size_t i = 0; i < evs->n; i++) {
        const jv *ev = &evs->items[i];
        const char *ph = j_str(ev, "ph");
        if (strcmp(ph, "s") && strcmp(ph, "f"))
            continue;
        struct flow *f = flow_of(fl, &nf, num(ev, "id", i));
        const jv **end = ph[0] == 's' ? &f->s : &f->f;
        cr_assert_null(*end, "flow %.0f has two '%s' events", f->id, ph);
        *end = ev;
        if (ph[0] == 'f')
            cr_assert(j_str(ev, "bp") && !strcmp(j_str(ev, "bp"), "e"), "flow end %.0f does not bind to its enclosing slice", f->id);
        cr_assert(in_slice(evs, ev), "flow %s %.0f (%s) lies in no slice of its thread", ph, f->id, j_str(ev, "name"));
    }
    for (size_t k = 0; k < nf; k++) {
        cr_assert(fl[k].s && fl[k].f, "flow %.0f has a %s but no %s", fl[k].id, fl[k].s ? "start" : "end",
                  fl[k].s ? "end" : "start");
        cr_assert_str_eq(j_str(fl[k].s, "name"), j_str(fl[k].f, "name"));
        cr_assert_geq(j_get(fl[k].f, "ts")->num, j_get(fl[k].s, "ts")->num, "flow %.0f ends before it starts", fl[k].id);
        int from = (int)j_get(fl[k].s, "pid")->num, to = (int)j_get(fl[k].f, "pid")->num;
        (strcmp(j_str(fl[k].s, "name"), "request") ? resp : req)[from][to]++;
    }
    free(fl);
}

static bool has_name(const jv *evs, const char *prefix)
{
    for (size_t i = 0; i < evs->n; i++)
        if (!strncmp(j_str(&evs->items[i], "name"), prefix, strlen(prefix)))
            return true;
    return false;
}

static void check_names(const jv *evs)
{
    bool named[WORLD] = {false};
    for (size_t i = 0; i < evs->n; i++) {
        const jv *ev = &evs->items[i];
        if (strcmp(j_str(ev, "ph"), "M") || strcmp(j_str(ev, "name"), "process_name"))
            continue;
        int pid = (int)j_get(ev, "pid")->num;
        char want[32];
        snprintf(want, sizeof(want), "worker%d", pid);
        const char *got = j_str(j_get(ev, "args"), "name");
        cr_assert(got && !strcmp(got, want), "process %d is named '%s', expected '%s'", pid, got ? got : "", want);
        named[pid] = true;
    }
    for (int r = 0; r < WORLD; r++)
        cr_assert(named[r], "process %d has no process_name", r);
    static const char *const want[] = {"send twice", "run twice", "reply fails", "answer add", "queue twice",
                                       "recv rref:child_accept", "send rref:user_delete", "run rref:to_here",
                                       "run dist_autograd:backward", "dist_autograd:backward_pass"};
    for (size_t k = 0; k < sizeof(want) / sizeof(want[0]); k++)
        cr_assert(has_name(evs, want[k]), "no event named '%s...'", want[k]);
}

Test(trace, job_trace_is_valid_trace_event_format, .timeout = 180)
{
    char dir[] = "/tmp/sr_trace_XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/job.json", dir);
    run_job(path);
    only_file(dir, "job.json");
    struct loaded t;
    load_trace(path, &t);
    const jv *evs = t.evs;
    cr_assert(evs->n > 0, "the traceEvents array is empty");
    for (size_t i = 0; i < evs->n; i++)
        check_common(&evs->items[i], i);
    check_nesting(evs);
    check_async(evs);
    int req[WORLD][WORLD] = {{0}}, resp[WORLD][WORLD] = {{0}};
    check_flows(evs, req, resp);
    for (int to = 1; to < WORLD; to++) {
        cr_assert(req[0][to] > 0, "no request flow from worker0 to worker%d", to);
        cr_assert(resp[to][0] > 0, "no response flow from worker%d to worker0", to);
    }
    cr_assert(req[2][1] > 0, "no request flow from worker2 to the RRef's owner (to_here)");
    check_names(evs);
    unload_trace(&t);
    unlink(path);
    rmdir(dir);
}

static void write_part(const char *path, int r, const char *body)
{
    char name[128];
    sr__trace_part_name(path, r, name, sizeof(name));
    FILE *f = fopen(name, "w");
    cr_assert(f);
    fputs(body, f);
    fclose(f);
}

Test(trace, merge_drops_half_flows_and_removes_parts)
{
    char dir[] = "/tmp/sr_trace_XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/m.json", dir);
    write_part(path, 0,
               "{\"ph\":\"X\",\"cat\":\"rpc\",\"name\":\"send f\",\"pid\":0,\"tid\":1,\"ts\":1.000,\"dur\":1.000}\n"
               "{\"ph\":\"s\",\"id\":7,\"cat\":\"rpc\",\"name\":\"request\",\"pid\":0,\"tid\":1,\"ts\":1.000}\n"
               "{\"ph\":\"s\",\"id\":9,\"cat\":\"rpc\",\"name\":\"request\",\"pid\":0,\"tid\":1,\"ts\":1.500}\n");
    write_part(path, 1,
               "{\"ph\":\"X\",\"cat\":\"rpc\",\"name\":\"recv f\",\"pid\":1,\"tid\":2,\"ts\":3.000,\"dur\":1.000}\n"
               "{\"ph\":\"f\",\"id\":7,\"cat\":\"rpc\",\"name\":\"request\",\"pid\":1,\"tid\":2,\"ts\":3.000,\"bp\":\"e\"}\n");
    cr_assert_eq(sr__trace_merge(path, 3, 3), 0, "%s", sr_last_error()); /* rank 2 wrote nothing: its calls died with it */
    only_file(dir, "m.json");
    struct loaded t;
    load_trace(path, &t);
    cr_assert_eq(t.evs->n, 4, "expected 2 slices and the one paired flow, got %zu events:\n%s", t.evs->n, t.text);
    cr_assert_null(strstr(t.text, "\"id\":9"), "the half flow 9 was kept:\n%s", t.text);
    unload_trace(&t);
    unlink(path);
    rmdir(dir);
    cr_assert_eq(sr__trace_merge(path, 2, 2), -ENOENT, "merging no parts must fail");
}

/* sr_spawn merges too: a job inside this program leaves one valid file. */
static int spawn_worker(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    if (sr_init(NULL))
        return 1;
    int rc = rank == 0 ? sr_rpc_sync(1, "noop", SR_NOARGS, 0, NULL) : 0;
    return sr_shutdown(true, 60) || rc;
}

Test(trace, sr_spawn_merges_the_job_trace, .timeout = 120)
{
    char dir[] = "/tmp/sr_trace_XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/spawn.json", dir);
    setenv("SHMRPC_TRACE", path, 1);
    sr_spawn_opts o = {.name_prefix = test_ns("trace-spawn"), .shm_size = 128u << 20};
    int rc = sr_spawn(2, spawn_worker, NULL, &o);
    unsetenv("SHMRPC_TRACE");
    cr_assert_eq(rc, 0, "sr_spawn: %s", sr_last_error());
    only_file(dir, "spawn.json");
    struct loaded t;
    load_trace(path, &t);
    const jv *evs = t.evs;
    int req[WORLD][WORLD] = {{0}}, resp[WORLD][WORLD] = {{0}};
    check_flows(evs, req, resp);
    cr_assert(req[0][1] == 1 && resp[1][0] == 1, "expected one request and one response flow, got %d and %d",
              req[0][1], resp[1][0]);
    unload_trace(&t);
    unlink(path);
    rmdir(dir);
}

/* A failed job keeps its own report: the merge (nothing to merge here, the
 * worker failed before writing) must not replace sr_spawn's last error. */
static int failing_worker(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    return rank == 1 ? 3 : 0;
}

Test(trace, failed_job_keeps_its_error_report, .timeout = 60)
{
    char dir[] = "/tmp/sr_trace_XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/none.json", dir);
    setenv("SHMRPC_TRACE", path, 1);
    sr_spawn_opts o = {.name_prefix = test_ns("trace-fail"), .shm_size = 64u << 20};
    int rc = sr_spawn(2, failing_worker, NULL, &o);
    unsetenv("SHMRPC_TRACE");
    cr_assert_eq(rc, -SR_EWORKER);
    cr_assert(strstr(sr_last_error(), "rank 1"), "the job's report was replaced: '%s'", sr_last_error());
    cr_assert_eq(rmdir(dir), 0, "something was left in %s", dir);
}

/* ---- jobs that end badly: the trace and the statistics survive them ---- */

/* shmrun -n WORLD trace_prog <mode> with SHMRPC_TRACE=path and
 * SHMRPC_STATS=1; its stdout is a pipe (*out), its stderr the file err. */
static pid_t start_bad_job(const char *path, const char *mode, const char *err, int *out)
{
    const char *shmrun = getenv("SHMRUN"), *prog = getenv("TRACE_PROG");
    cr_assert(shmrun && prog, "SHMRUN and TRACE_PROG are not set: run this test through meson");
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 2) < 0 || dup2(p[1], 1) < 0)
            _exit(126);
        close(p[0]);
        setenv("SHMRPC_TRACE", path, 1);
        setenv("SHMRPC_STATS", "1", 1);
        execl(shmrun, shmrun, "-n", "3", "--name-prefix", test_ns("trace-bad"), prog, mode, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    *out = p[0];
    return pid;
}

/* The status shmrun exited with; bounded wait. */
static int wait_job(pid_t pid, int ms)
{
    int pfd = watch_pidfd_open(pid);
    cr_assert(pfd >= 0, "pidfd_open: %s", strerror(errno));
    struct pollfd p = {.fd = pfd, .events = POLLIN};
    if (poll(&p, 1, ms) != 1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        cr_assert_fail("shmrun did not end within %d ms", ms);
    }
    close(pfd);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return st;
}

/* Some event of pid is named name. */
static bool has_event(const jv *evs, int pid, const char *name)
{
    for (size_t i = 0; i < evs->n; i++) {
        const jv *ev = &evs->items[i], *p = j_get(ev, "pid");
        const char *n = j_str(ev, "name");
        if (p && p->num == pid && n && !strcmp(n, name))
            return true;
    }
    return false;
}

/* The trace of a job that ended badly: valid, consistent, with worker1's
 * last call on both sides; the statistics of every worker on stderr. */
static void check_bad_job(const char *dir, const char *path, const char *err)
{
    only_file(dir, "job.json");
    struct loaded t;
    load_trace(path, &t);
    for (size_t i = 0; i < t.evs->n; i++)
        check_common(&t.evs->items[i], i);
    check_nesting(t.evs);
    check_async(t.evs);
    int req[WORLD][WORLD] = {{0}}, resp[WORLD][WORLD] = {{0}};
    check_flows(t.evs, req, resp);
    cr_assert(has_event(t.evs, 1, "send last_words") && has_event(t.evs, 1, "answer last_words"),
              "worker1's last call is not in the trace");
    cr_assert(has_event(t.evs, 2, "run last_words"), "worker2's side of worker1's last call is not in the trace");
    cr_assert(req[1][2] == 1 && resp[2][1] == 1, "expected the request and response flows of last_words");
    cr_assert(has_event(t.evs, 0, "run twice"), "worker0's side of worker1's first call is not in the trace");
    unload_trace(&t);
    size_t len;
    char *text = slurp(err, &len);
    text = realloc(text, len + 1);
    text[len] = '\0';
    for (int r = 0; r < WORLD; r++) {
        char want[64];
        snprintf(want, sizeof(want), "shmrpc stats for worker%d (rank %d", r, r);
        cr_assert(strstr(text, want), "no statistics table for worker%d on stderr:\n%s", r, text);
    }
    cr_assert(strstr(text, "last_words"), "the statistics do not count last_words:\n%s", text);
    free(text);
}

static void bad_job_paths(char *dir, char *path, size_t plen, char *err, size_t elen)
{
    cr_assert(mkdtemp(dir));
    snprintf(path, plen, "%s/job.json", dir);
    snprintf(err, elen, "%s.stderr", dir);
}

Test(trace, worker_killed_mid_run_leaves_its_trace_and_stats, .timeout = 120)
{
    char dir[] = "/tmp/sr_trace_XXXXXX", path[64], err[64];
    bad_job_paths(dir, path, sizeof(path), err, sizeof(err));
    int out;
    pid_t pid = start_bad_job(path, "kill", err, &out);
    int st = wait_job(pid, 90000);
    close(out);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGKILL, "shmrun exited with status %#x, expected 137", st);
    check_bad_job(dir, path, err);
    unlink(path);
    unlink(err);
    rmdir(dir);
}

Test(trace, ctrl_c_leaves_the_trace_and_stats, .timeout = 120)
{
    char dir[] = "/tmp/sr_trace_XXXXXX", path[64], err[64];
    bad_job_paths(dir, path, sizeof(path), err, sizeof(err));
    int out;
    pid_t pid = start_bad_job(path, "hang", err, &out);
    char buf[256];
    size_t n = 0;
    struct pollfd p = {.fd = out, .events = POLLIN};
    while (!memmem(buf, n, "ready\n", 6)) {
        cr_assert(n < sizeof(buf) && poll(&p, 1, 60000) == 1, "worker1 never said ready");
        ssize_t got = read(out, buf + n, sizeof(buf) - n);
        cr_assert(got > 0, "shmrun's stdout closed before worker1 said ready");
        n += (size_t)got;
    }
    kill(pid, SIGINT);
    int st = wait_job(pid, 90000);
    close(out);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGINT, "shmrun exited with status %#x, expected 130", st);
    check_bad_job(dir, path, err);
    unlink(path);
    unlink(err);
    rmdir(dir);
}

/* A trace that could not be written is refused before any worker starts:
 * the job's program would leave a file in the directory. */
Test(trace, unwritable_trace_path_is_refused_at_start, .timeout = 60)
{
    char dir[] = "/tmp/sr_trace_XXXXXX", marker[64], err[64], cmd[160];
    cr_assert(mkdtemp(dir));
    snprintf(marker, sizeof(marker), "%s/started", dir);
    snprintf(err, sizeof(err), "%s/stderr", dir);
    snprintf(cmd, sizeof(cmd), "touch %s", marker);
    const char *shmrun = getenv("SHMRUN");
    cr_assert(shmrun);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 2) < 0)
            _exit(126);
        setenv("SHMRPC_TRACE", "/nonexistent/dir/x.json", 1);
        execl(shmrun, shmrun, "-n", "2", "--name-prefix", test_ns("trace-badpath"), "/bin/sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st = wait_job(pid, 30000);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "shmrun exited with status %#x, expected 1", st);
    cr_assert_neq(access(marker, F_OK), 0, "the workers ran although the trace path is unwritable");
    size_t len;
    char *text = slurp(err, &len);
    text = realloc(text, len + 1);
    text[len] = '\0';
    cr_assert(strstr(text, "/nonexistent/dir/x.json"), "the error does not name the trace path:\n%s", text);
    free(text);
    unlink(err);
    cr_assert_eq(rmdir(dir), 0, "something was left in %s", dir);

    /* sr_spawn the same, before it forks */
    setenv("SHMRPC_TRACE", "/nonexistent/dir/x.json", 1);
    sr_spawn_opts o = {.name_prefix = test_ns("trace-badpath-spawn"), .shm_size = 64u << 20};
    int rc = sr_spawn(2, failing_worker, NULL, &o);
    unsetenv("SHMRPC_TRACE");
    cr_assert(rc < 0 && rc != -SR_EWORKER, "sr_spawn returned %d, expected a refusal before the workers", rc);
    cr_assert(strstr(sr_last_error(), "/nonexistent/dir/x.json"), "the error does not name the path: '%s'",
              sr_last_error());
}

/* A restarted job's attempts (trace_seam.h): attempt 1's trace is the path,
 * attempt 0's moves aside to <path>.attempt0; the worker here records one
 * span into its slot and is SIGKILLed, as a crash would end it. */
Test(trace, second_attempt_keeps_the_first_attempts_trace, .timeout = 60)
{
    char dir[] = "/tmp/sr_trace_XXXXXX", path[64], old[80];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/r.json", dir);
    snprintf(old, sizeof(old), "%s.attempt0", path);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("attempt 0\n", f);
    fclose(f);
    setenv("SHMRPC_TRACE", path, 1);
    struct sr_trace_job *tj;
    int rc = sr__trace_job_begin(&tj, 1, 0, 1, "test");
    unsetenv("SHMRPC_TRACE");
    cr_assert(rc == 0 && tj, "sr__trace_job_begin: %s", sr_last_error());
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        sr__trace_job_child(tj, 0, false);
        struct sr_ttable *t = sr__ttable();
        if (t)
            sr__trace_add(t, &(struct sr_rec){.kind = SR_REC_SPAN, .t0 = 1000, .t1 = 2000, .peer = -1, .tid = t->tid,
                                              .name = sr__trace_name_id("the_last_span")});
        raise(SIGKILL);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    sr__trace_job_end(tj);
    struct loaded t;
    load_trace(path, &t);
    cr_assert(has_event(t.evs, 0, "the_last_span"), "the killed worker's span is not in the trace:\n%s", t.text);
    unload_trace(&t);
    size_t len;
    char *text = slurp(old, &len);
    cr_assert(len == 10 && !memcmp(text, "attempt 0\n", 10), "'%s' does not hold the first attempt's trace", old);
    free(text);
    unlink(old);
    unlink(path);
    cr_assert_eq(rmdir(dir), 0, "something else was left in %s", dir);
}

/* A rank replaced in place (sr_spawn's SR_RESTART_RANK): rank 0 calls rank
 * 1, has it killed inside a call, waits for its replacement's hello and
 * calls it again. The dead generation's records and the new one's are in
 * the trace, each under a process of its own named with its generation. */
static int fn_die(sr_call *c)
{
    (void)c;
    raise(SIGKILL);
    return 0;
}

static int replaced_worker(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    sr_register("die", fn_die);
    sr_register("hello", replace_fn_hello);
    if (sr_init(NULL))
        return 1;
    if (rank == 1 && replace_my_gen() == 0) {
        poll(NULL, 0, 3 * REPLACE_WAIT_S * 1000); /* a bound: rank 0 has it killed (no shutdown: not replaceable) */
        return 99;
    }
    int rc = 0;
    if (rank == 1)
        rc = sr_rpc_sync(0, "hello", SR_NOARGS, REPLACE_WAIT_S, NULL);
    if (rank == 0) {
        rc = sr_rpc_sync(1, "noop", SR_NOARGS, REPLACE_WAIT_S, NULL);
        rc = rc ? rc : sr_rpc_sync(1, "die", SR_NOARGS, REPLACE_WAIT_S, NULL) == -EPIPE ? 0 : 1;
        rc = rc ? rc : replace_wait_hello(1);
        rc = rc ? rc : sr_rpc_sync(1, "noop", SR_NOARGS, REPLACE_WAIT_S, NULL);
    }
    return sr_shutdown(true, 60) || rc;
}

/* The pid of the process named `name` in the trace; -1 if none. */
static int pid_named(const jv *evs, const char *name)
{
    for (size_t i = 0; i < evs->n; i++) {
        const jv *ev = &evs->items[i], *args = j_get(ev, "args");
        const char *ph = j_str(ev, "ph"), *what = j_str(ev, "name"), *n = j_str(args, "name");
        if (ph && !strcmp(ph, "M") && what && !strcmp(what, "process_name") && n && !strcmp(n, name))
            return (int)num(ev, "pid", i);
    }
    return -1;
}

/* Events named `name` on process pid. */
static int count_on(const jv *evs, int pid, const char *name)
{
    int n = 0;
    for (size_t i = 0; i < evs->n; i++) {
        const char *what = j_str(&evs->items[i], "name");
        const jv *p = j_get(&evs->items[i], "pid");
        n += what && !strcmp(what, name) && p && p->t == J_NUM && (int)p->num == pid;
    }
    return n;
}

Test(trace, a_replaced_ranks_generations_are_told_apart, .timeout = 120)
{
    char dir[] = "/tmp/sr_trace_XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/replaced.json", dir);
    setenv("SHMRPC_TRACE", path, 1);
    sr_spawn_opts o = {.name_prefix = test_ns("trace-repl"), .shm_size = 128u << 20, .restart = SR_RESTART_RANK,
                       .max_restarts = 1};
    int rc = sr_spawn(2, replaced_worker, NULL, &o);
    unsetenv("SHMRPC_TRACE");
    cr_assert_eq(rc, 0, "sr_spawn: %s", sr_last_error());
    only_file(dir, "replaced.json");
    struct loaded t;
    load_trace(path, &t);
    int g0 = pid_named(t.evs, "worker1 (generation 0)"), g1 = pid_named(t.evs, "worker1 (generation 1)");
    cr_assert(g0 >= 0 && g1 >= 0 && g0 != g1,
              "rank 1's generations are not two processes of the trace: 'worker1 (generation 0)' pid %d, "
              "'worker1 (generation 1)' pid %d", g0, g1);
    cr_assert(pid_named(t.evs, "worker0 (generation 0)") == 0, "rank 0 is not the process 'worker0 (generation 0)'");
    /* each generation ran one noop; the dead one also began to run "die" */
    cr_assert_eq(count_on(t.evs, g0, "run noop"), 1, "generation 0's noop");
    cr_assert_eq(count_on(t.evs, g0, "recv die"), 1, "generation 0's die");
    cr_assert_eq(count_on(t.evs, g1, "run noop"), 1, "generation 1's noop");
    cr_assert_eq(count_on(t.evs, g1, "recv die"), 0, "generation 1 ran no die");
    cr_assert_eq(count_on(t.evs, 0, "send noop"), 2, "rank 0's two calls of noop");
    unload_trace(&t);
    unlink(path);
    rmdir(dir);
}

/* ---- the runtime's threads by name, the gauges as counters, tensor op spans ---- */

/* Rank 1's main thread waits on this pipe (neither polling nor serving), so
 * its progress thread takes rank 0's calls and runs them, an executor
 * standing in (or an executor runs them, when none is free to stand in). */
static int gate_pipe[2];

static int fn_matmul(sr_call *c)
{
    int64_t shape[2] = {4, 4};
    sr_tensor *a = sr_ones(SR_F64, 2, shape, 0), *p = a ? sr_matmul(a, a) : NULL, *s = p ? sr_sum(p) : NULL;
    bool ok = s && sr_tensor_item(s) == 64.0;
    sr_tensor_unref(s);
    sr_tensor_unref(p);
    sr_tensor_unref(a);
    return ok ? sr_call_return(c, sr_int(1)) : sr_call_fail(c, -EINVAL, "matmul failed");
}

static int fn_release(sr_call *c)
{
    return write(gate_pipe[1], "x", 1) == 1 ? sr_call_return(c, sr_int(1)) : sr_call_fail(c, -EIO, "write failed");
}

static int threads_worker(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    sr_register("ops_fn", fn_matmul);
    sr_register("release", fn_release);
    if (sr_init(NULL))
        return 1;
    int rc = 0;
    if (rank == 0) {
        rc = sr_rpc_sync(1, "ops_fn", SR_NOARGS, 30, NULL) || sr_rpc_sync(1, "release", SR_NOARGS, 30, NULL);
        if (rc)
            fprintf(stderr, "worker0: %s\n", sr_last_error());
    } else {
        struct pollfd p = {.fd = gate_pipe[0], .events = POLLIN};
        rc = poll(&p, 1, 60000) != 1; /* rank 0's release, run by the progress thread or an executor */
        if (rc)
            fprintf(stderr, "worker1: rank 0's 'release' did not come within 60 s\n");
    }
    return sr_shutdown(true, 60) || rc;
}

/* A job of threads_worker under sr_spawn, traced into path (ops: SHMRPC_TRACE_OPS=1). */
static void run_threads_job(const char *path, bool ops)
{
    cr_assert_eq(pipe(gate_pipe), 0);
    setenv("SHMRPC_TRACE", path, 1);
    if (ops)
        setenv("SHMRPC_TRACE_OPS", "1", 1);
    sr_spawn_opts o = {.name_prefix = test_ns("trace-threads"), .shm_size = 128u << 20};
    int rc = sr_spawn(2, threads_worker, NULL, &o);
    unsetenv("SHMRPC_TRACE");
    unsetenv("SHMRPC_TRACE_OPS");
    close(gate_pipe[0]);
    close(gate_pipe[1]);
    cr_assert_eq(rc, 0, "sr_spawn: %s", sr_last_error());
}

/* The thread_name process pid gives thread tid, or "". */
static const char *thread_named(const jv *evs, int pid, double tid)
{
    for (size_t i = 0; i < evs->n; i++) {
        const jv *ev = &evs->items[i];
        const char *name = j_str(j_get(ev, "args"), "name");
        if (!strcmp(j_str(ev, "ph"), "M") && !strcmp(j_str(ev, "name"), "thread_name") &&
            j_get(ev, "pid")->num == pid && j_get(ev, "tid")->num == tid && name)
            return name;
    }
    return "";
}

/* The thread of the first event of phase ph named `name` in process pid. */
static double tid_of(const jv *evs, int pid, const char *ph, const char *name)
{
    for (size_t i = 0; i < evs->n; i++) {
        const jv *ev = &evs->items[i];
        if (!strcmp(j_str(ev, "ph"), ph) && j_get(ev, "pid")->num == pid && !strcmp(j_str(ev, "name"), name))
            return j_get(ev, "tid")->num;
    }
    cr_assert_fail("no '%s' event named '%s' in process %d", ph, name, pid);
    return -1;
}

/* Events of phase ph on (pid, tid) whose name starts with prefix (tid < 0: any thread). */
static int count_events(const jv *evs, const char *ph, int pid, double tid, const char *prefix)
{
    int n = 0;
    for (size_t i = 0; i < evs->n; i++) {
        const jv *ev = &evs->items[i];
        n += !strcmp(j_str(ev, "ph"), ph) && j_get(ev, "pid")->num == pid && (tid < 0 || j_get(ev, "tid")->num == tid) &&
             !strncmp(j_str(ev, "name"), prefix, strlen(prefix));
    }
    return n;
}

/* Worker1's main thread waited aside: its progress thread took the call and
 * ran it (or an executor did), each named; both workers recorded their
 * gauges. */
static void check_runtime_threads(const jv *evs)
{
    const char *progress = thread_named(evs, 1, tid_of(evs, 1, "X", "recv ops_fn"));
    const char *ran = thread_named(evs, 1, tid_of(evs, 1, "X", "run ops_fn"));
    cr_assert_str_eq(progress, "shmrpc-progress", "the thread that took the call is named '%s'", progress);
    cr_assert(!strcmp(ran, "shmrpc-progress") || !strncmp(ran, "shmrpc-exec", 11),
              "the thread that ran the call is named '%s'", ran);
    for (int pid = 0; pid < 2; pid++)
        for (size_t k = 0; k < 3; k++) {
            static const char *const counter[] = {"heap in use", "inbox depth", "calls in flight"};
            cr_assert_gt(count_events(evs, "C", pid, -1, counter[k]), 0, "worker%d has no '%s' counter", pid, counter[k]);
        }
}

Test(trace, runtime_threads_are_named_and_gauges_are_counters, .timeout = 120)
{
    char dir[] = "/tmp/sr_trace_XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/threads.json", dir);
    run_threads_job(path, false);
    struct loaded t;
    load_trace(path, &t);
    check_runtime_threads(t.evs);
    for (int pid = 0; pid < 2; pid++)
        cr_assert_eq(count_events(t.evs, "X", pid, -1, "matmul"), 0, "op spans without SHMRPC_TRACE_OPS");
    unload_trace(&t);
    unlink(path);
    rmdir(dir);
}

Test(trace, tensor_ops_are_spans_with_trace_ops, .timeout = 120)
{
    char dir[] = "/tmp/sr_trace_XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/ops.json", dir);
    run_threads_job(path, true);
    struct loaded t;
    load_trace(path, &t);
    check_runtime_threads(t.evs);
    double exec = tid_of(t.evs, 1, "X", "run ops_fn");
    /* on the executor that ran the call: matmul, the mm inside it, the sum */
    static const char *const op[] = {"matmul", "mm", "sum"};
    for (size_t k = 0; k < 3; k++)
        cr_assert_gt(count_events(t.evs, "X", 1, exec, op[k]), 0, "no '%s' op span on worker1's executor", op[k]);
    unload_trace(&t);
    unlink(path);
    rmdir(dir);
}

/* ---- the heap's gauge is read rarely ---- */

/* The heap's figure (jemalloc's stats epoch: 30-120 us here) is re-read at
 * most once per 100 ms, not at every millisecond's sample: the event that
 * takes a sample waits for it. One worker calls itself for 300 ms with the
 * trace on: a sample is due at about every millisecond of it. */
extern _Atomic uint64_t sr__trace_heap_reads;

static int heap_reads_worker(int rank, int world, void *arg)
{
    (void)rank;
    (void)world;
    (void)arg;
    WCHECK(sr_init(NULL) == 0, "sr_init: %s", sr_last_error());
    uint64_t before = atomic_load(&sr__trace_heap_reads);
    int64_t t0 = sr__now_ns(), ms = 0;
    long calls = 0;
    int rc = 0;
    while (!rc && (ms = (sr__now_ns() - t0) / 1000000) < 300) {
        rc = sr_rpc_sync(0, "noop", SR_NOARGS, 0, NULL);
        calls++;
    }
    uint64_t reads = atomic_load(&sr__trace_heap_reads) - before;
    WCHECK(rc == 0, "call %ld to self failed: %s", calls, sr_last_error());
    WCHECK(sr_shutdown(true, 0) == 0, "sr_shutdown: %s", sr_last_error());
    WCHECK(reads <= (uint64_t)ms / 100 + 2, "the trace read the heap's figure %llu times in %lld ms (%ld calls): once "
           "per 100 ms at most is %lld", (unsigned long long)reads, (long long)ms, calls, (long long)ms / 100 + 2);
    return 0;
}

Test(trace, the_heap_gauge_is_read_at_most_every_100_ms, .timeout = 120)
{
    char dir[] = "/tmp/sr_trace_XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/heap.json", dir);
    setenv("SHMRPC_TRACE", path, 1);
    setenv("SHMRPC_TRACE_MAX_EVENTS", "1000", 1); /* a small file: a dropped record still takes its sample */
    sr_spawn_opts o = {.name_prefix = test_ns("trace-heap"), .shm_size = 64u << 20};
    int rc = sr_spawn(1, heap_reads_worker, NULL, &o);
    unsetenv("SHMRPC_TRACE");
    unsetenv("SHMRPC_TRACE_MAX_EVENTS");
    cr_assert_eq(rc, 0, "sr_spawn: %s", sr_last_error());
    unlink(path);
    rmdir(dir);
}
