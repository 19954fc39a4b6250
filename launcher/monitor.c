/* SPDX-License-Identifier: MIT */
/* shmrun --monitor: see monitor.h. */
#include "monitor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ring.h"
#include "segment.h"

/* What the last view saw of a rank, for its rates. */
struct seen {
    uint64_t made, served;
    uint64_t cpu;     /* the process's utime + stime at `at`, clock ticks */
    int64_t at;       /* when (0: never) */
    int64_t cpu_at;   /* when cpu was read (cpu_ok) */
    bool cpu_ok;
    pid_t pid;        /* whose cpu it is */
};

struct monitor {
    sr_job *job;
    int64_t interval, start, next;
    bool tty;
    int drawn;        /* lines of the last view on the terminal (tty) */
    long hz;
    struct seen *seen; /* [job->n] */
    sr_job_hooks inner; /* the hooks mon_hooks chained */
};

/* One row of a view. */
struct row {
    uint64_t made, served, in_flight, inbox, heap;
    double made_s, served_s, cpu; /* cpu < 0: unknown */
};

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int mon_create(struct monitor **m, const struct args *a, sr_job *job)
{
    *m = NULL;
    if (!a->monitor_ns)
        return 0;
    struct monitor *o = calloc(1, sizeof(*o));
    if (!o || !(o->seen = calloc((size_t)job->n, sizeof(*o->seen)))) {
        free(o);
        return -ENOMEM;
    }
    o->job = job;
    o->interval = a->monitor_ns;
    o->start = now_ns();
    o->next = o->start + o->interval;
    o->tty = isatty(STDERR_FILENO);
    o->hz = sysconf(_SC_CLK_TCK) > 0 ? sysconf(_SC_CLK_TCK) : 100;
    *m = o;
    return 0;
}

void mon_child(const struct monitor *m)
{
    char buf[32];
    if (!m)
        return;
    snprintf(buf, sizeof(buf), "%.9f", (double)m->interval / 1e9);
    setenv("SHMRPC_MONITOR_INTERVAL", buf, 1);
}

/* utime + stime of pid in clock ticks (/proc/PID/stat fields 14 and 15), or false. */
static bool cpu_ticks(pid_t pid, uint64_t *out)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    unsigned long long ut, st;
    /* after ")": state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime(14) stime(15) */
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return false;
    *out = ut + st;
    return true;
}

/* Counted since the last view: a counter that went back started again (a new generation of the rank). */
static uint64_t since(uint64_t now, uint64_t before) { return now >= before ? now - before : now; }

/* relaxed throughout: statistics (segment.h, struct sr_worker_counters) */
static void read_row(struct monitor *m, int r, int64_t now, bool end, struct row *o)
{
    const sr_segment *seg = &m->job->seg;
    struct sr_worker_counters *c = &sr__seg_worker(seg, r)->counters;
    struct seen *s = &m->seen[r];
    uint64_t ended = atomic_load_explicit(&c->calls_ended, memory_order_relaxed);
    o->made = atomic_load_explicit(&c->calls_made, memory_order_relaxed);
    o->served = atomic_load_explicit(&c->served_out, memory_order_relaxed);
    o->in_flight = o->made > ended ? o->made - ended : 0;
    o->inbox = sr__ring_depth(sr__seg_inbox(seg, r), seg->ring_slots);
    o->heap = atomic_load_explicit(&c->heap_bytes, memory_order_relaxed);
    /* at the end: averages over the job; else rates since the last view */
    int64_t from = end || !s->at ? m->start : s->at;
    double dt = (double)(now - from) / 1e9;
    o->made_s = dt > 0 ? (double)(end ? o->made : since(o->made, s->made)) / dt : 0;
    o->served_s = dt > 0 ? (double)(end ? o->served : since(o->served, s->served)) / dt : 0;
    pid_t pid = m->job->pids[r];
    uint64_t cpu = 0;
    bool cpu_ok = pid > 0 && cpu_ticks(pid, &cpu);
    o->cpu = -1;
    if (end && s->cpu_ok && s->cpu_at > m->start) /* the process is gone: its use up to its last reading */
        o->cpu = 100.0 * (double)s->cpu / (double)m->hz / ((double)(s->cpu_at - m->start) / 1e9);
    else if (!end && cpu_ok && s->cpu_ok && s->pid == pid && now > s->cpu_at)
        o->cpu = 100.0 * (double)since(cpu, s->cpu) / (double)m->hz / ((double)(now - s->cpu_at) / 1e9);
    else if (!end && cpu_ok && dt > 0) /* first view of this process: since the job's start */
        o->cpu = 100.0 * (double)cpu / (double)m->hz / ((double)(now - m->start) / 1e9);
    if (end)
        return;
    s->made = o->made;
    s->served = o->served;
    s->at = now;
    if (cpu_ok) /* a process gone keeps its last reading, for the final view's average */
        *s = (struct seen){.made = o->made, .served = o->served, .cpu = cpu, .cpu_ok = true, .at = now, .pid = pid,
                           .cpu_at = now};
}

/* A rank with a process, or one that had one (an elastic job's free ranks have neither). */
static bool shown(const struct monitor *m, int r)
{
    /* relaxed: a report's view of the worker's state */
    return m->job->pids[r] || atomic_load_explicit(&sr__seg_worker(&m->job->seg, r)->state, memory_order_relaxed);
}

/* n bytes as "812B", "4.0KiB", "1.5GiB": one token */
static const char *bytes_text(uint64_t n, char *buf, size_t len)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4)
        v /= 1024, u++;
    if (u)
        snprintf(buf, len, "%.1f%s", v, unit[u]);
    else
        snprintf(buf, len, "%lluB", (unsigned long long)n);
    return buf;
}

/* The worker's name from its line, [A-Za-z0-9_:-] only (a worker may have scribbled on it). */
static void name_of(const struct monitor *m, int r, char *buf, size_t len)
{
    const char *src = sr__seg_worker(&m->job->seg, r)->name;
    size_t i = 0;
    for (; i + 1 < len && i < SR_NAME_MAX && src[i]; i++)
        buf[i] = strchr("_:-", src[i]) || (src[i] >= 'a' && src[i] <= 'z') || (src[i] >= 'A' && src[i] <= 'Z') ||
                 (src[i] >= '0' && src[i] <= '9') ? src[i] : '?';
    buf[i] = '\0';
    if (!i)
        snprintf(buf, len, "-");
}

static void put_line(struct monitor *m, const char *text)
{
    fprintf(stderr, m->tty ? "\r\033[K%s\n" : "%s\n", text);
}

static void view(struct monitor *m, int64_t now, bool end)
{
    char line[256], name[40], heap[24], cpu[16];
    if (m->tty && m->drawn && !end)
        fprintf(stderr, "\033[%dA", m->drawn); /* back to the first line of the last view */
    int lines = 0;
    double t = (double)(now - m->start) / 1e9;
    if (end)
        snprintf(line, sizeof(line), "shmrun: monitor: the job ended after %.2f s (rates: averages over the job)", t);
    else
        snprintf(line, sizeof(line), "shmrun: monitor: %.2f s", t);
    put_line(m, line);
    snprintf(line, sizeof(line), "%6s %-16s %10s %10s %10s %10s %6s %9s %9s %6s", "rank", "worker", "served/s",
             "made/s", "served", "made", "inbox", "in-flight", "heap", "cpu%");
    put_line(m, line);
    lines += 2;
    for (int r = 0; r < m->job->n; r++) {
        if (!shown(m, r))
            continue;
        struct row o;
        read_row(m, r, now, end, &o);
        name_of(m, r, name, sizeof(name));
        if (o.cpu >= 0)
            snprintf(cpu, sizeof(cpu), "%.1f", o.cpu);
        else
            snprintf(cpu, sizeof(cpu), "-");
        snprintf(line, sizeof(line), "%6d %-16.16s %10.1f %10.1f %10llu %10llu %6llu %9llu %9s %6s", r, name, o.served_s,
                 o.made_s, (unsigned long long)o.served, (unsigned long long)o.made, (unsigned long long)o.inbox,
                 (unsigned long long)o.in_flight, bytes_text(o.heap, heap, sizeof(heap)), cpu);
        put_line(m, line);
        lines++;
    }
    if (m->tty && m->drawn > lines && !end) /* fewer rows than last time: clear what is left below */
        fprintf(stderr, "\033[J");
    m->drawn = lines;
    fflush(stderr);
}

/* ---- the hooks: ours, and the chained ones' ---- */

static int64_t next_due(void *ctx)
{
    struct monitor *m = ctx;
    int64_t inner = m->inner.next_due ? m->inner.next_due(m->inner.ctx) : INT64_MAX;
    return inner < m->next ? inner : m->next;
}

static void on_due(void *ctx, int64_t now)
{
    struct monitor *m = ctx;
    if (now >= m->next) {
        view(m, now, false);
        m->next += m->interval;
        if (m->next <= now) /* the supervisor was held up: no burst of views to catch up */
            m->next = now + m->interval;
    }
    if (m->inner.on_due && m->inner.next_due(m->inner.ctx) <= now)
        m->inner.on_due(m->inner.ctx, now);
}

static bool on_input(void *ctx, int i)
{
    struct monitor *m = ctx;
    return m->inner.on_input(m->inner.ctx, i);
}

static void on_end(void *ctx)
{
    struct monitor *m = ctx;
    if (m->inner.on_end) /* the workers' last output first */
        m->inner.on_end(m->inner.ctx);
    m->drawn = 0; /* the final lines go below the live view, which stays */
    view(m, now_ns(), true);
}

void mon_hooks(struct monitor *m, sr_job_hooks *h)
{
    if (!m)
        return;
    m->inner = *h;
    h->ctx = m;
    h->on_input = m->inner.on_input ? on_input : NULL;
    h->next_due = next_due;
    h->on_due = on_due;
    h->on_end = on_end;
}

void mon_destroy(struct monitor *m)
{
    if (!m)
        return;
    free(m->seen);
    free(m);
}
