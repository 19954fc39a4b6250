/* SPDX-License-Identifier: MIT */
/* The profiler's side of the probes (rpc/module.h, "Probes"): statistics and trace
 * records, on the thread of each event. See trace.h.
 *
 * The caller's view of a call is split between two threads: the one that
 * sends it and the one that handles its answer. The sender writes the call's
 * start into `pending` (indexed by the call slot) before the request leaves;
 * the answer's handler reads it after the answer arrived, so the transport's
 * release/acquire pair (the request's publication, then the answer's)
 * orders the two. A slot is reused only after its call ended, but expiry can
 * read a slot that a new call is filling: the id is written last (release)
 * and re-checked after the fields are read (a seqlock without a writer lock:
 * one writer per call). */
#include <stdlib.h>
#include <unistd.h>

#include "heap.h"
#include "module.h"
#include "tensor_seam.h"
#include "trace.h"

#define PENDING (1u << 16) /* the agent's call slots (api.c CALL_SLOTS) */

struct pending {
    _Atomic uint64_t id; /* release last by the sender; 0: none */
    _Atomic int64_t t0;
    _Atomic uint32_t name;
    _Atomic int32_t tid;
};

static _Atomic(struct pending *) pending; /* made once, kept for the process */
static int my_rank;

/* Counters (SR_REC_COUNTER): the worker's gauges, sampled at the trace's
 * own events, at most once per SAMPLE_NS, and recorded only when one of
 * them changed: nothing ticks while nothing happens. next_sample elects the
 * sampling thread (relaxed CAS: it orders nothing); `last` is the values of
 * the last record (relaxed: one sampler at a time, and a stale value costs
 * one record at most). The heap's figure is re-read at most once per
 * HEAP_SAMPLE_NS (next_heap, elected by the same CAS): it costs 30-120 us
 * (jemalloc's stats epoch), which the event that takes the sample waits
 * for, and once a millisecond that put such a wait into one hop in five of
 * a 4-worker chain; the inbox and the calls in flight cost a few loads. */
#define SAMPLE_NS 1000000
#define HEAP_SAMPLE_NS 100000000
static _Atomic int64_t next_sample, next_heap;
static _Atomic uint64_t last[3];

/* Test hook (tests/trace/test_trace.c): the heap's figure read for a sample. */
_Atomic uint64_t sr__trace_heap_reads;

int sr__probes_prepare(int rank)
{
    my_rank = rank;
    atomic_store_explicit(&next_sample, 0, memory_order_relaxed); /* relaxed: see next_sample */
    atomic_store_explicit(&next_heap, 0, memory_order_relaxed);   /* relaxed: see next_sample */
    for (int k = 0; k < 3; k++)
        atomic_store_explicit(&last[k], UINT64_MAX, memory_order_relaxed); /* the first sample is recorded */
    /* acquire: pairs with the release CAS below */
    if (atomic_load_explicit(&pending, memory_order_acquire))
        return 0;
    struct pending *p = calloc(PENDING, sizeof(*p)), *none = NULL;
    if (!p)
        return -1;
    /* release: the zeroed table is published; acquire on failure: pairs with the winner's release */
    if (!atomic_compare_exchange_strong_explicit(&pending, &none, p, memory_order_acq_rel, memory_order_acquire))
        free(p);
    return 0;
}

/* The flow id of a call: unique in the job (caller rank, slot, generation),
 * below 2^53 so that JSON readers keep it exact; bit 0: the response. */
static uint64_t flow_id(int rank, uint64_t call)
{
    uint64_t gen = (call >> 33) & 0xffffff, slot = call & 0xffff;
    return (uint64_t)(rank & 0x7ff) << 41 | gen << 17 | slot << 1;
}

static uint32_t mask(void)
{
    return atomic_load_explicit(&sr__probe_mask, memory_order_relaxed); /* relaxed: see module.h, "Probes" */
}

/* The gauges now, on t's thread, if a sample is due and one changed. */
static void sample(struct sr_ttable *t, int64_t now)
{
    int64_t due = atomic_load_explicit(&next_sample, memory_order_relaxed); /* relaxed: see next_sample */
    if (now < due || !atomic_compare_exchange_strong_explicit(&next_sample, &due, now + SAMPLE_NS,
                                                              memory_order_relaxed, memory_order_relaxed))
        return;
    struct sr_rpc_gauges g;
    sr__rpc_gauges(&g);
    /* relaxed (both): this thread is the one sampler (the CAS above) */
    uint64_t heap = atomic_load_explicit(&last[0], memory_order_relaxed);
    if (now >= atomic_load_explicit(&next_heap, memory_order_relaxed)) {
        atomic_store_explicit(&next_heap, now + HEAP_SAMPLE_NS, memory_order_relaxed);
        heap = sr__heap_allocated();
        atomic_fetch_add_explicit(&sr__trace_heap_reads, 1, memory_order_relaxed); /* relaxed: a statistic */
    }
    const uint64_t v[3] = {heap, g.inbox, g.in_flight};
    bool changed = false;
    for (int k = 0; k < 3; k++) /* relaxed: see last */
        changed |= atomic_exchange_explicit(&last[k], v[k], memory_order_relaxed) != v[k];
    if (changed)
        sr__trace_add(t, &(struct sr_rec){.kind = SR_REC_COUNTER, .t0 = now, .t1 = (int64_t)v[0], .t2 = (int64_t)v[1],
                                          .flow = v[2], .peer = -1, .tid = t->tid});
}

/* A trace record of this thread, then the gauges if due (as of the record's end). */
static void record(struct sr_ttable *t, const struct sr_rec *r)
{
    sr__trace_add(t, r);
    sample(t, r->t1);
}

static struct pending *slot_of(uint64_t id)
{
    struct pending *p = atomic_load_explicit(&pending, memory_order_acquire); /* pairs with sr__probes_prepare */
    return p ? &p[id & (PENDING - 1)] : NULL;
}

static void call_out(uint64_t id, int to, const char *name, int64_t t0)
{
    (void)to;
    struct pending *p = slot_of(id);
    struct sr_ttable *t = sr__ttable();
    if (!p || !t)
        return;
    /* relaxed (fields): published by the release store of the id */
    atomic_store_explicit(&p->t0, t0, memory_order_relaxed);
    atomic_store_explicit(&p->name, sr__trace_name_id(name), memory_order_relaxed);
    atomic_store_explicit(&p->tid, t->tid, memory_order_relaxed);
    atomic_store_explicit(&p->id, id, memory_order_release); /* pairs with read_pending's acquire */
}

/* What call_out recorded of a call: when it started, its name, its thread. */
struct call_start {
    int64_t t0;
    uint32_t name;
    int32_t tid;
};

/* The start of call id, if it is the one in its slot. */
static bool read_pending(uint64_t id, struct call_start *st)
{
    struct pending *p = slot_of(id);
    if (!p || atomic_load_explicit(&p->id, memory_order_acquire) != id) /* pairs with call_out */
        return false;
    st->t0 = atomic_load_explicit(&p->t0, memory_order_relaxed); /* relaxed: ordered by the id's acquire */
    st->name = atomic_load_explicit(&p->name, memory_order_relaxed);
    st->tid = atomic_load_explicit(&p->tid, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire); /* the fields are read before the re-check below */
    return atomic_load_explicit(&p->id, memory_order_relaxed) == id; /* relaxed: after the fence */
}

/* This thread's table, if call id was recorded (its start in *st). */
static struct sr_ttable *started(uint64_t id, struct call_start *st)
{
    struct sr_ttable *t = sr__ttable();
    return t && read_pending(id, st) ? t : NULL;
}

static void call_sent(uint64_t id, int to, int rc, int64_t t0, int64_t t1)
{
    struct call_start st;
    struct sr_ttable *t = started(id, &st);
    if (!t)
        return;
    if (rc) { /* never sent: the caller got the error, there is no call; the slot may be another's already */
        uint64_t mine = id;
        /* relaxed: only forgets this call's entry; a new call's release store is not undone */
        atomic_compare_exchange_strong_explicit(&slot_of(id)->id, &mine, 0, memory_order_relaxed, memory_order_relaxed);
        return;
    }
    if (mask() & SR_PROBE_TRACE)
        record(t, &(struct sr_rec){.kind = SR_REC_SEND, .t0 = t0, .t1 = t1, .flow = flow_id(my_rank, id),
                                          .name = st.name, .peer = to, .tid = t->tid});
}

static void call_end(uint64_t id, int from, int err, int64_t t0, int64_t t1)
{
    struct call_start st;
    struct sr_ttable *t = started(id, &st);
    if (!t)
        return;
    if (mask() & SR_PROBE_STATS) {
        struct sr_fn_block *b = sr__fn_block(t, st.name);
        if (b) {
            sr__bump(&b->calls, 1);
            sr__bump(&b->errors, err != 0);
            sr__hist_add(&b->rtt, t0 - st.t0); /* until the answer arrived: callbacks are not the call's */
        }
    }
    if (mask() & SR_PROBE_TRACE)
        record(t, &(struct sr_rec){.kind = from >= 0 ? SR_REC_ANSWER : SR_REC_LOST, .t0 = t0, .t1 = t1,
                                          .t2 = st.t0, .flow = flow_id(my_rank, id), .name = st.name, .peer = from,
                                          .err = err, .tid = t->tid, .tid2 = st.tid});
}

static void serve_in(const struct sr_probe_call *c)
{
    struct sr_ttable *t = sr__ttable();
    if (t && (mask() & SR_PROBE_TRACE))
        record(t, &(struct sr_rec){.kind = SR_REC_RECV, .t0 = c->t_arrive, .t1 = c->t_decoded,
                                          .flow = flow_id(c->caller, c->call_id), .name = sr__trace_name_id(c->name),
                                          .peer = c->caller, .tid = t->tid});
}

static void ran(const struct sr_probe_call *c)
{
    struct sr_ttable *t = sr__ttable();
    if (t && (mask() & SR_PROBE_TRACE))
        record(t, &(struct sr_rec){.kind = SR_REC_RUN, .t0 = c->t_run0, .t1 = c->t_run1, .t2 = c->t_decoded,
                                          .flow = flow_id(c->caller, c->call_id), .name = sr__trace_name_id(c->name),
                                          .peer = c->caller, .tid = t->tid});
}

static void served(const struct sr_probe_call *c, int err, int64_t at)
{
    struct sr_ttable *t = sr__ttable();
    struct sr_fn_block *b = t && (mask() & SR_PROBE_STATS) ? sr__fn_block(t, sr__trace_name_id(c->name)) : NULL;
    if (!b)
        return;
    sr__bump(&b->served, 1);
    sr__bump(&b->serve_errors, err != 0);
    if (c->t_run0) { /* 0: it never ran (refused before it started) */
        sr__hist_add(&b->queue, c->t_run0 - c->t_decoded);
        sr__hist_add(&b->run, at - c->t_run0);
    }
}

static void reply(const struct sr_probe_call *c, int err, int64_t t0, int64_t t1)
{
    struct sr_ttable *t = sr__ttable();
    if (t && (mask() & SR_PROBE_TRACE))
        record(t, &(struct sr_rec){.kind = SR_REC_REPLY, .t0 = t0, .t1 = t1, .flow = flow_id(c->caller, c->call_id),
                                          .name = sr__trace_name_id(c->name), .peer = c->caller, .err = err,
                                          .tid = t->tid});
}

static void msg(int dir, int peer, const char *name, int64_t at)
{
    struct sr_ttable *t = sr__ttable();
    if (t && (mask() & SR_PROBE_TRACE))
        record(t, &(struct sr_rec){.kind = dir ? SR_REC_MSG_IN : SR_REC_MSG_OUT, .t0 = at, .t1 = at,
                                          .name = sr__trace_name_id(name), .peer = peer, .tid = t->tid});
}

static void span(const char *cat, const char *name, int64_t t0, int64_t t1)
{
    (void)cat;
    struct sr_ttable *t = sr__ttable();
    if (t && (mask() & SR_PROBE_TRACE))
        record(t, &(struct sr_rec){.kind = SR_REC_SPAN, .t0 = t0, .t1 = t1, .name = sr__trace_name_id(name),
                                          .peer = -1, .tid = t->tid});
}

/* Tensor op spans (SHMRPC_TRACE_OPS; tensor_seam.h, "op spans"): the
 * start time is the token. */
static int64_t op_begin(const char *op)
{
    (void)op;
    return sr__probe_now();
}

static void op_end(const char *op, int64_t t0)
{
    struct sr_ttable *t = sr__ttable();
    if (t && (mask() & SR_PROBE_TRACE))
        record(t, &(struct sr_rec){.kind = SR_REC_SPAN, .t0 = t0, .t1 = sr__probe_now(), .name = sr__trace_name_id(op),
                                   .peer = SR_SPAN_OP, .tid = t->tid});
}

static const sr_op_hooks op_hooks = {.begin = op_begin, .end = op_end};

void sr__probes_ops(bool on) { sr__tensor_op_hooks_set(on ? &op_hooks : NULL); }

/* The profiler module's probe group (module.c). */
const struct sr_probe_ops sr__trace_probe_ops = {
    .call_out = call_out, .call_sent = call_sent, .call_end = call_end, .serve_in = serve_in,
    .ran = ran, .served = served, .reply = reply, .msg = msg, .span = span,
};
