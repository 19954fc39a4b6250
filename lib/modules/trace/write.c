/* SPDX-License-Identifier: MIT */
/* A worker's trace part: its records as Trace Event Format lines. See
 * trace.h and docs/PROFILING.md for the events of a call.
 *
 * One event per line, no separators: merge.c joins the parts of a job into
 * one JSON object. Flow lines begin with {"ph":"s","id": or {"ph":"f","id":
 * exactly, so the merger can pair them without a JSON parser. Timestamps are
 * µs with ns digits. The writer reads a record area: the launcher's copy of
 * a worker's slot after the worker's end (job.c), or, for a worker that has
 * no launcher's area, its own at sr_shutdown, when no thread of the runtime
 * is left; the chunks are read with acquire loads (a user thread may still
 * be recording its last events), every offset bounds-checked (a worker that
 * crashed may have left anything). */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "trace.h"

/* ns as µs with three decimals */
#define US "%" PRId64 ".%03d"
#define USV(ns) (ns) / 1000, (int)((ns) % 1000)

struct out {
    FILE *f;
    int pid;
    const struct sr_area *a;
};

/* The first max bytes of s (up to its NUL) as a JSON string body (control bytes escaped) */
static void put_text(FILE *f, const char *s, size_t max)
{
    for (size_t i = 0; i < max && s[i]; i++) {
        if (s[i] == '"' || s[i] == '\\')
            fprintf(f, "\\%c", s[i]);
        else if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] >= 0x80) /* a thread's name may be cut mid-character */
            fprintf(f, "\\u%04x", (unsigned char)s[i]);
        else
            fputc(s[i], f);
    }
}

/* name as a JSON string body (names are short) */
static void put_name(const struct out *o, const char *prefix, uint32_t id)
{
    fputs(prefix, o->f);
    put_text(o->f, sr__area_name(o->a, id), SIZE_MAX);
}

static void slice(const struct out *o, const struct sr_rec *r, const char *cat, const char *verb)
{
    fprintf(o->f, "{\"ph\":\"X\",\"cat\":\"%s\",\"name\":\"", cat);
    put_name(o, verb, r->name);
    fprintf(o->f, "\",\"pid\":%d,\"tid\":%d,\"ts\":" US ",\"dur\":" US ",\"args\":{\"peer\":%d,\"err\":%d}}\n", o->pid,
            r->tid, USV(r->t0), USV(r->t1 - r->t0), r->peer, r->err);
}

/* A flow end point: ph 's' or 'f' (bound to the enclosing slice). */
static void flow(const struct out *o, const struct sr_rec *r, char ph, uint64_t id, const char *name)
{
    fprintf(o->f, "{\"ph\":\"%c\",\"id\":%" PRIu64 ",\"cat\":\"rpc\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":" US "%s}\n",
            ph, id, name, o->pid, r->tid, USV(r->t0), ph == 'f' ? ",\"bp\":\"e\"" : "");
}

/* An async span from t0 to t1 on thread tid. */
static void span(const struct out *o, const struct sr_rec *r, const char *cat, const char *verb, int tid, int64_t t0,
                 int64_t t1)
{
    for (int k = 0; k < 2; k++) {
        fprintf(o->f, "{\"ph\":\"%c\",\"cat\":\"%s\",\"id\":%" PRIu64 ",\"name\":\"", k ? 'e' : 'b', cat, r->flow);
        put_name(o, verb, r->name);
        fprintf(o->f, "\",\"pid\":%d,\"tid\":%d,\"ts\":" US ",\"args\":{\"peer\":%d,\"err\":%d}}\n", o->pid, tid,
                USV(k ? t1 : t0), r->peer, r->err);
    }
}

static void instant(const struct out *o, const struct sr_rec *r, const char *verb)
{
    fprintf(o->f, "{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"msg\",\"name\":\"");
    put_name(o, verb, r->name);
    fprintf(o->f, "\",\"pid\":%d,\"tid\":%d,\"ts\":" US ",\"args\":{\"peer\":%d}}\n", o->pid, r->tid, USV(r->t0), r->peer);
}

/* A thread's name: the main thread's is "main" (metadata), any other's the
 * one it had when it first recorded (shmrpc-progress, shmrpc-exec0, ...). */
static void thread_name(const struct out *o, const struct sr_rec *r)
{
    if (r->tid == o->a->pid)
        return;
    fprintf(o->f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"ts\":0,\"args\":{\"name\":\"",
            o->pid, r->tid);
    put_text(o->f, r->text, sizeof(r->text));
    fputs("\"}}\n", o->f);
}

/* The worker's gauges (SR_REC_COUNTER): one counter track each. */
static void counters(const struct out *o, const struct sr_rec *r)
{
    static const char *const name[] = {"heap in use", "inbox depth", "calls in flight"};
    static const char *const unit[] = {"bytes", "messages", "calls"};
    const uint64_t v[] = {(uint64_t)r->t1, (uint64_t)r->t2, r->flow};
    for (int k = 0; k < 3; k++)
        fprintf(o->f, "{\"ph\":\"C\",\"cat\":\"counter\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":" US
                ",\"args\":{\"%s\":%" PRIu64 "}}\n", name[k], o->pid, r->tid, USV(r->t0), unit[k], v[k]);
}

static void event(const struct out *o, const struct sr_rec *r)
{
    switch (r->kind) {
    case SR_REC_SEND:
        slice(o, r, "rpc", "send ");
        flow(o, r, 's', r->flow, "request");
        break;
    case SR_REC_ANSWER:
        slice(o, r, "rpc", "answer ");
        flow(o, r, 'f', r->flow | 1, "response");
        span(o, r, "rpc", "call ", r->tid2, r->t2, r->t0);
        break;
    case SR_REC_LOST:
        span(o, r, "rpc", "call ", r->tid2, r->t2, r->t0);
        break;
    case SR_REC_RECV:
        slice(o, r, "rpc", "recv ");
        flow(o, r, 'f', r->flow, "request");
        break;
    case SR_REC_RUN:
        span(o, r, "queue", "queue ", r->tid, r->t2, r->t0);
        slice(o, r, "rpc", "run ");
        break;
    case SR_REC_REPLY:
        slice(o, r, "rpc", "reply ");
        flow(o, r, 's', r->flow | 1, "response");
        break;
    case SR_REC_MSG_OUT:
    case SR_REC_MSG_IN:
        instant(o, r, r->kind == SR_REC_MSG_OUT ? "send " : "recv ");
        break;
    case SR_REC_SPAN:
        slice(o, r, r->peer == SR_SPAN_OP ? "op" : "span", "");
        break;
    case SR_REC_THREAD:
        thread_name(o, r);
        break;
    case SR_REC_COUNTER:
        counters(o, r);
        break;
    }
}

/* Every record of table t. */
static uint64_t write_table(const struct out *o, const struct sr_ttable *t)
{
    uint64_t n = 0;
    /* acquire: pairs with sr__trace_add's release */
    uint64_t off = atomic_load_explicit(&((struct sr_ttable *)t)->head, memory_order_acquire);
    for (const struct sr_chunk *c; off && (c = sr__area_get(o->a, off, sizeof(*c)));) {
        uint32_t end = atomic_load_explicit(&((struct sr_chunk *)c)->n, memory_order_acquire); /* pairs with sr__trace_add */
        for (uint32_t at = 0; at < end && at < SR_TRACE_CHUNK; at++, n++)
            event(o, &c->r[at]);
        uint64_t next = atomic_load_explicit(&((struct sr_chunk *)c)->next, memory_order_acquire); /* pairs with grow */
        off = next > off ? next : 0; /* chunks are made in order: a bad offset cannot loop */
    }
    return n;
}

/* The process of a part: named after its worker; in a job that replaces
 * ranks in place, with its generation too ("worker1 (generation 1)": each
 * generation of a rank is a process of its own, sorted after the one before). */
static void metadata(const struct out *o)
{
    char worker[SR_AREA_WORKER];
    snprintf(worker, sizeof(worker), "%.*s", SR_AREA_WORKER - 1, o->a->worker);
    for (char *s = worker; *s; s++) /* worker names are [A-Za-z0-9_:-]: a crashed worker's bytes may not be */
        if (!strchr("_:-", *s) && !(*s >= 'a' && *s <= 'z') && !(*s >= 'A' && *s <= 'Z') && !(*s >= '0' && *s <= '9'))
            *s = '_';
    int rank = o->a->rank >= 0 ? o->a->rank : o->pid;
    if (!*worker)
        snprintf(worker, sizeof(worker), "worker%d", rank);
    /* relaxed: set before the fork by the launcher */
    bool gens = atomic_load_explicit(&((struct sr_area *)o->a)->flags, memory_order_relaxed) & SR_AREA_JOB_REPLACES;
    uint32_t gen = gens ? o->a->generation % 1000000 : 0; /* a crashed worker's header may hold anything */
    fprintf(o->f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"ts\":0,\"args\":{\"name\":\"", o->pid);
    fputs(worker, o->f);
    if (gens)
        fprintf(o->f, " (generation %u)", gen);
    fprintf(o->f, "\"}}\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,\"ts\":0,\"args\":{\"sort_index\":%lld}}\n",
            o->pid, (long long)rank * 1000000 + gen);
    fprintf(o->f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"ts\":0,\"args\":{\"name\":\"main\"}}\n",
            o->pid, (int)o->a->pid);
}

int sr__trace_write_part(const struct sr_area *a, const char *path, int part, const char *who)
{
    char name[4096];
    sr__trace_part_name(path, part, name, sizeof(name));
    struct out o = {.f = fopen(name, "w"), .pid = part, .a = a};
    int rank = a->rank >= 0 ? a->rank : part;
    if (!o.f)
        return sr__fail(-errno, who, "worker%d: cannot write the trace part '%s': %s", rank, name, strerror(errno));
    metadata(&o);
    uint64_t dropped = 0;
    for (const struct sr_ttable *t = sr__area_tables(a); t; t = sr__area_next(a, t)) {
        write_table(&o, t);
        dropped += atomic_load_explicit(&((struct sr_ttable *)t)->dropped, memory_order_relaxed); /* relaxed: a statistic */
    }
    if (dropped)
        fprintf(o.f, "{\"ph\":\"M\",\"name\":\"shmrpc_dropped_events\",\"pid\":%d,\"tid\":0,\"ts\":0,\"args\":{\"count\":%" PRIu64 "}}\n",
                part, dropped);
    int bad = ferror(o.f);
    if (fclose(o.f) || bad)
        return sr__fail(-EIO, who, "worker%d: cannot write the trace part '%s'", rank, name);
    return 0;
}
