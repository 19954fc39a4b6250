/* SPDX-License-Identifier: MIT */
/* The caller's path: a call's checks and its request (sr__call_check,
 * sr__rpc_start), the calls in flight, and their answers
 * (sr__calls_response).
 *
 * Client calls in flight: a table of recycled slots (see agent.h).
 *
 * A call id is (generation << 32) | slot index. The generation is odd while
 * the slot is in use and bumped on every begin and end, so a response that
 * arrives after its call timed out (or a duplicate) finds a different
 * generation and is dropped.
 *
 * Besides the free list, every call in use is on two structures, both under
 * slots_lock and both proportional to the live calls, never to the table:
 *   - a binary min-heap of the calls that have a deadline (heap[]: each
 *     entry the deadline and the slot, whose heap_at is its position), so
 *     expiry pops only what is due;
 *   - its destination's doubly linked list (peer_head[to], peer_prev/next),
 *     so a peer's death fails only the calls to that peer.
 * Begin and end are O(log n) in the live calls with a deadline, O(1)
 * otherwise; slots_lock is the one lock they took before.
 *
 * Completing a future runs its callbacks, which may make calls or wait
 * (agent.h, nested waits), and so re-enter this file: futures are always
 * completed outside slots_lock, and expiry and peer failure take their calls
 * out of the table in small batches under the lock, then complete them. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "agent.h"
#include "codec.h"
#include "ext.h"
#include "error.h"
#include "log.h"
#include "module.h"
#include "payload.h"
#include "registry.h"
#include "timeout.h"

#define BATCH 32

int sr__calls_init(sr_agent *a, int32_t n)
{
    a->slots = calloc((size_t)n, sizeof(*a->slots));
    a->heap = calloc((size_t)n, sizeof(*a->heap));
    a->peer_head = malloc((size_t)a->world * sizeof(*a->peer_head));
    if (!a->slots || !a->heap || !a->peer_head) {
        free(a->slots), free(a->heap), free(a->peer_head);
        a->slots = NULL, a->heap = NULL, a->peer_head = NULL;
        return sr__fail(-ENOMEM, "sr_init", "worker%d: no memory for %d call slots", a->rank, n);
    }
    a->nslots = n;
    for (int32_t i = 0; i < n; i++) {
        a->slots[i].next_free = i + 1 < n ? i + 1 : -1;
        a->slots[i].heap_at = -1;
    }
    for (int r = 0; r < a->world; r++)
        a->peer_head[r] = -1;
    a->free_head = 0;
    a->heap_len = 0;
    sr__lock_init(&a->slots_lock);
    atomic_init(&a->earliest_deadline, -1);
    return 0;
}

/* ---- the deadline heap (under slots_lock) --------------------------------- */

static int64_t heap_key(const sr_agent *a, int32_t at) { return a->heap[at].deadline_ns; }

static void heap_put(sr_agent *a, int32_t at, struct sr_heap_entry e)
{
    a->heap[at] = e;
    a->slots[e.slot].heap_at = at;
}

static void sift_up(sr_agent *a, int32_t at)
{
    struct sr_heap_entry e = a->heap[at];
    while (at > 0 && heap_key(a, (at - 1) / 2) > e.deadline_ns) {
        heap_put(a, at, a->heap[(at - 1) / 2]);
        at = (at - 1) / 2;
    }
    heap_put(a, at, e);
}

static void sift_down(sr_agent *a, int32_t at)
{
    struct sr_heap_entry e = a->heap[at];
    for (;;) {
        int32_t c = 2 * at + 1;
        if (c >= a->heap_len)
            break;
        if (c + 1 < a->heap_len && heap_key(a, c + 1) < heap_key(a, c))
            c++;
        if (heap_key(a, c) >= e.deadline_ns)
            break;
        heap_put(a, at, a->heap[c]);
        at = c;
    }
    heap_put(a, at, e);
}

static void heap_remove(sr_agent *a, int32_t slot)
{
    int32_t at = a->slots[slot].heap_at;
    a->slots[slot].heap_at = -1;
    struct sr_heap_entry last = a->heap[--a->heap_len];
    if (at == a->heap_len)
        return;
    heap_put(a, at, last);
    sift_down(a, at);
    sift_up(a, a->slots[last.slot].heap_at);
}

/* ---- per-peer lists (under slots_lock) ------------------------------------ */

static void peer_link(sr_agent *a, int32_t i)
{
    struct sr_call_slot *s = &a->slots[i];
    s->peer_prev = -1;
    s->peer_next = a->peer_head[s->to];
    if (s->peer_next >= 0)
        a->slots[s->peer_next].peer_prev = i;
    a->peer_head[s->to] = i;
}

static void peer_unlink(sr_agent *a, int32_t i)
{
    struct sr_call_slot *s = &a->slots[i];
    if (s->peer_prev >= 0)
        a->slots[s->peer_prev].peer_next = s->peer_next;
    else
        a->peer_head[s->to] = s->peer_next;
    if (s->peer_next >= 0)
        a->slots[s->peer_next].peer_prev = s->peer_prev;
}

/* ---- begin / end ------------------------------------------------------------ */

int sr__call_begin(sr_agent *a, int to, int64_t timeout_ms, sr_future *fut, uint64_t *id)
{
    /* saturating: -1 for none, which reads no clock */
    int64_t deadline = timeout_ms > 0 ? sr__deadline_ns(sr__now_coarse_ns(), timeout_ms) : -1;
    bool kick = false;
    sr__lock_take(&a->slots_lock);
    if (sr_unlikely(a->calls_lost[0])) {
        int rc = sr__fail(-EPROTO, "sr_rpc", "worker%d: cannot call worker%d: %s", a->rank, to, a->calls_lost);
        sr__lock_give(&a->slots_lock);
        return rc;
    }
    int32_t i = a->free_head;
    if (i < 0) {
        sr__lock_give(&a->slots_lock);
        return sr__fail(-EBUSY, "sr_rpc", "worker%d: %d calls are already in flight from this worker", a->rank,
                        a->nslots);
    }
    struct sr_call_slot *s = &a->slots[i];
    a->free_head = s->next_free;
    s->to = to;
    s->timeout_ms = timeout_ms;
    s->fut = sr__future_is_call(fut) ? fut : sr_future_ref(fut); /* a call's own brings the slot's reference */
    peer_link(a, i);
    if (deadline >= 0) {
        a->heap_len++;
        heap_put(a, a->heap_len - 1, (struct sr_heap_entry){.deadline_ns = deadline, .slot = i});
        sift_up(a, a->heap_len - 1);
        /* relaxed: written only under slots_lock; read as a hint by the
         * pollers, which the kick below tells of an earlier deadline */
        int64_t cur = atomic_load_explicit(&a->earliest_deadline, memory_order_relaxed);
        if (cur < 0 || deadline < cur) {
            atomic_store_explicit(&a->earliest_deadline, deadline, memory_order_relaxed);
            kick = true;
        }
    }
    /* relaxed: under slots_lock, which every generation change holds; the
     * lock publishes the fields above to whoever matches this generation */
    uint32_t gen = atomic_load_explicit(&s->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&s->gen, gen, memory_order_relaxed);
    sr__count_locked(&a->ctr->calls_made);
    sr__lock_give(&a->slots_lock);
    sr__counters_sample(a);
    *id = (uint64_t)gen << 32 | (uint32_t)i;
    if (kick) /* the progress thread may be asleep with a later timer: wake it to re-arm */
        sr__agent_kick(a);
    return 0;
}

/* Take slot i (in use) out of every structure; returns its future. Under slots_lock. */
static sr_future *end_locked(sr_agent *a, int32_t i)
{
    struct sr_call_slot *s = &a->slots[i];
    sr_future *f = s->fut;
    s->fut = NULL;
    if (s->heap_at >= 0)
        heap_remove(a, i);
    peer_unlink(a, i);
    /* relaxed: under slots_lock */
    atomic_store_explicit(&s->gen, atomic_load_explicit(&s->gen, memory_order_relaxed) + 1, memory_order_relaxed);
    s->next_free = a->free_head;
    a->free_head = i;
    sr__count_locked(&a->ctr->calls_ended);
    return f;
}

/* A response from a rank the call was not sent to: a peer's bug (a wrong
 * call id) must not complete our call. Dropped, counted, and reported on
 * stderr (the first few: a peer that keeps doing it must not flood it). */
static void stray(sr_agent *a, uint64_t id, int from, int to)
{
    /* relaxed: a statistic; nothing is published with it */
    uint64_t n = atomic_fetch_add_explicit(&a->stray_responses, 1, memory_order_relaxed) + 1;
    if (n <= 8)
        sr_logf(SR_LOG_WARN, "dropped a response from worker%d to call %#" PRIx64
                            ", which was sent to worker%d (%" PRIu64 " dropped so far)",
               from, id, to, n);
}

/* End call id if it is in flight and, when from >= 0, was sent to from. */
static sr_future *end_call(sr_agent *a, uint64_t id, int from)
{
    uint32_t i = (uint32_t)id, gen = (uint32_t)(id >> 32);
    if (i >= (uint32_t)a->nslots || !(gen & 1))
        return NULL;
    sr__lock_take(&a->slots_lock);
    /* relaxed: under slots_lock, which every generation change holds */
    if (atomic_load_explicit(&a->slots[i].gen, memory_order_relaxed) != gen) {
        sr__lock_give(&a->slots_lock);
        return NULL; /* timed out, failed, or a duplicate: drop it */
    }
    if (from >= 0 && a->slots[i].to != from) {
        int to = a->slots[i].to;
        sr__lock_give(&a->slots_lock);
        stray(a, id, from, to);
        return NULL;
    }
    sr_future *f = end_locked(a, (int32_t)i);
    sr__lock_give(&a->slots_lock);
    return f;
}

sr_future *sr__call_end(sr_agent *a, uint64_t id) { return end_call(a, id, -1); }

sr_future *sr__call_answer(sr_agent *a, uint64_t id, int from) { return end_call(a, id, from); }

/* ---- expiry and peer failure ----------------------------------------------------- */

struct ended {
    sr_future *f;
    int64_t ms;
    int to;
    uint64_t id; /* for the profiler */
};

/* The id of slot i, in use. Under slots_lock. */
static uint64_t slot_id(sr_agent *a, int32_t i)
{
    /* relaxed: under slots_lock, which every generation change holds */
    return (uint64_t)atomic_load_explicit(&a->slots[i].gen, memory_order_relaxed) << 32 | (uint32_t)i;
}

/* The profiler: a call ended without an answer (err). */
static void probe_end(const struct ended *e, int err)
{
    if (sr__probing()) {
        int64_t t = sr__probe_now();
        sr__probe_ops->call_end(e->id, -1, err, t, t);
    }
}

/* Take up to BATCH due calls off the heap; refresh the earliest deadline. */
static int take_due(sr_agent *a, int64_t now, struct ended *out)
{
    int n = 0, looked = 0;
    sr__lock_take(&a->slots_lock);
    while (n < BATCH && a->heap_len) {
        looked++; /* the top: due, or the end of the due */
        if (heap_key(a, 0) > now)
            break;
        int32_t i = a->heap[0].slot;
        out[n] = (struct ended){.ms = a->slots[i].timeout_ms, .to = a->slots[i].to, .id = slot_id(a, i)};
        out[n++].f = end_locked(a, i);
    }
    atomic_fetch_add_explicit(&a->calls_examined, (uint64_t)looked, memory_order_relaxed); /* relaxed: statistics */
    /* relaxed: written under slots_lock (see sr__call_begin) */
    atomic_store_explicit(&a->earliest_deadline, a->heap_len ? heap_key(a, 0) : -1, memory_order_relaxed);
    sr__lock_give(&a->slots_lock);
    return n;
}

void sr__calls_expire(sr_agent *a, int64_t now)
{
    struct ended e[BATCH];
    int n;
    do {
        n = take_due(a, now, e);
        for (int k = 0; k < n; k++) {
            char why[512] = "";
            sr__outq_describe(a, e[k].to, why, sizeof(why)); /* its request may never have left */
            sr_logf(SR_LOG_DEBUG, "call %#" PRIx64 " to %s (rank %d) timed out after %" PRId64 " ms%s", e[k].id,
                    a->names[e[k].to], e[k].to, e[k].ms, why);
            probe_end(&e[k], -ETIMEDOUT); /* before the future wakes anyone: counted by then */
            sr_future_set_error(e[k].f, -ETIMEDOUT,
                                "RPC ran for more than set timeout (%" PRId64 " ms) and will now be marked with an error%s",
                                e[k].ms, why);
            sr_future_unref(e[k].f);
        }
    } while (n == BATCH);
}

static int take_peer(sr_agent *a, int rank, struct ended *out)
{
    int n = 0;
    sr__lock_take(&a->slots_lock);
    while (n < BATCH && a->peer_head[rank] >= 0) {
        out[n].id = slot_id(a, a->peer_head[rank]);
        out[n].to = rank;
        out[n++].f = end_locked(a, a->peer_head[rank]);
    }
    sr__lock_give(&a->slots_lock);
    atomic_fetch_add_explicit(&a->calls_examined, (uint64_t)n, memory_order_relaxed); /* relaxed: statistics */
    return n;
}

void sr__calls_fail_peer(sr_agent *a, int rank, const char *why)
{
    if (rank < 0 || rank >= a->world)
        return;
    struct ended e[BATCH];
    int n;
    do {
        n = take_peer(a, rank, e);
        for (int k = 0; k < n; k++) {
            probe_end(&e[k], -EPIPE);
            sr_future_set_error(e[k].f, -EPIPE, "worker%d: RPC to worker%d failed: the worker %s", a->rank, rank, why);
            sr_future_unref(e[k].f);
        }
    } while (n == BATCH);
}

/* Up to BATCH calls to any rank, first come first taken; the first call
 * records why every later begin fails (under the lock, so a begin either
 * sees it or made a call that this scan takes). */
static int take_any(sr_agent *a, const char *why, struct ended *out)
{
    int n = 0;
    sr__lock_take(&a->slots_lock);
    if (!a->calls_lost[0])
        snprintf(a->calls_lost, sizeof(a->calls_lost), "%s", why);
    for (int r = 0; r < a->world && n < BATCH; r++)
        while (n < BATCH && a->peer_head[r] >= 0)
            out[n++] = (struct ended){.f = end_locked(a, a->peer_head[r]), .to = r};
    sr__lock_give(&a->slots_lock);
    return n;
}

void sr__calls_fail_all(sr_agent *a, const char *why)
{
    struct ended e[BATCH];
    int n;
    do {
        n = take_any(a, why, e);
        for (int k = 0; k < n; k++) {
            sr_future_set_error(e[k].f, -EPROTO, "worker%d: RPC to worker%d failed: no answer can arrive: %s",
                                a->rank, e[k].to, why);
            sr_future_unref(e[k].f);
        }
    } while (n == BATCH);
}

/* No other thread is left: fail what is still in flight, peer by peer. */
void sr__calls_fini(sr_agent *a)
{
    for (int r = 0; r < a->world; r++) {
        struct ended e[BATCH];
        int n;
        do {
            n = take_peer(a, r, e);
            for (int k = 0; k < n; k++) {
                probe_end(&e[k], -SR_ESHUTDOWN);
                sr__future_fail_text(e[k].f, -SR_ESHUTDOWN, "RPC agent shut down before the response arrived");
                sr_future_unref(e[k].f);
            }
        } while (n == BATCH);
    }
    free(a->slots);
    free(a->heap);
    free(a->peer_head);
}

/* ---- requests (the caller's side of a call) ------------------------------- */

int sr__call_check(sr_agent *a, int to, const char *fn, sr_args args, double timeout, int64_t *ms)
{
    const char *who = "sr_rpc";
    if (to < 0 || to >= a->world)
        return sr__fail(-EINVAL, who, "destination rank %d is out of range [0, %d)", to, a->world);
    sr__agent_refresh(a); /* what the caller learns of `to` from now on (a module: its generation) is current */
    int rc = sr__fn_name_check(fn, who);
    if (rc)
        return rc;
    if (args.n && !args.v)
        return sr__fail(-EINVAL, who, "%zu arguments but the array is NULL", args.n);
    for (size_t i = 0; i < args.n; i++)
        if (!args.v[i])
            return sr__fail(-EINVAL, who, "argument %zu of '%s' is NULL", i, fn);
    if (timeout == 0) { /* SR_TIMEOUT_DEFAULT */
        /* relaxed: the default is captured now, at send time */
        *ms = atomic_load_explicit(&a->default_timeout_ms, memory_order_relaxed);
        return 0;
    }
    return sr__timeout_ms(timeout, who, ms); /* NaN and negative values: -EINVAL */
}

static enum sr_call_kind call_kind(const struct sr_req *q)
{
    return q->kind == SR_REQ_KEEP ? SR_CALL_KEEP : q->kind == SR_REQ_MODULE ? SR_CALL_MODULE : SR_CALL_UNKNOWN;
}

enum sr_call_kind sr__call_out_kind(const struct sr_call_out *o)
{
    if (o->kind != SR_CALL_UNKNOWN)
        return o->kind;
    const struct sr_fn_entry *e = o->fn ? sr__registry_find(o->fn, strlen(o->fn)) : NULL;
    return e && (e->kind == SR_FN_BUILTIN || e->kind == SR_FN_BUILTIN_CHEAP) ? SR_CALL_BUILTIN : SR_CALL_USER;
}

/* The modules' extension bytes for this request (ext.h). */
static void request_ext(int to, const struct sr_req *q, const char *fn, sr_args args, struct sr_ext_buf *e)
{
    struct sr_call_out o = {.to = to, .kind = call_kind(q), .fn = fn, .args = args,
                            .module = q->module, .sub = q->sub};
    sr__ext_request_out(&o, q->ext_len ? q->module : -1, q->ext, q->ext_len, e);
}

/* Encode [extension block] + name + args into m's payload (no name for a
 * module request); *enc and *enc_len locate the encoded args,
 * whose references (objects, tensor blocks, RRef forks) are released if the
 * request is never sent. */
static int build_request(sr_agent *a, int to, const struct sr_req *q, const char *fn, sr_args args, sr_msg *m,
                         struct sr_wire *w, const uint8_t **enc, size_t *enc_len)
{
    struct sr_ext_buf ext;
    request_ext(to, q, fn, args, &ext);
    size_t nlen = fn ? strlen(fn) : 0;
    int64_t alen = sr__codec_size(args.n, args.v, to == a->rank);
    if (alen < 0)
        return (int)alen;
    static const uint16_t wire_type[] = {[SR_REQ_CALL] = SR_MSG_REQ, [SR_REQ_KEEP] = SR_MSG_KEEP_CALL,
                                         [SR_REQ_MODULE] = SR_MSG_MOD_REQ};
    m->type = wire_type[q->kind];
    w->name_len = (uint16_t)(q->kind == SR_REQ_MODULE ? q->sub : nlen);
    w->ctrl = q->kind == SR_REQ_CALL ? 0 : (uint8_t)q->module;
    uint8_t *p = sr__payload_reserve(m, w, ext.len + nlen + (size_t)alen);
    if (!p)
        return -ENOMEM;
    w->flags |= ext.len ? SR_WIRE_EXT : 0;
    w->tag = q->tag;
    if (ext.len) /* none on most calls: no libc call for nothing */
        memcpy(p, ext.b, ext.len);
    p += ext.len;
    memcpy(p, fn ? fn : "", nlen);
    int64_t wrote = sr__codec_encode_to(args.n, args.v, to == a->rank, to, p + nlen, (size_t)alen);
    if (wrote != alen) {
        sr__payload_abandon(w);
        return wrote < 0 ? (int)wrote : sr__fail(-EINVAL, "sr_rpc", "cannot encode the arguments of '%s'", fn);
    }
    *enc = p + nlen;
    *enc_len = (size_t)alen;
    return 0;
}

/* The profiler learns of the call before its request can be answered. */
static int64_t probe_out(uint64_t id, int to, const struct sr_req *q, const char *fn)
{
    char buf[96];
    int64_t t0 = sr__probe_now();
    if (!fn)
        fn = sr__probe_module_name(q->module, SR_MSG_MOD_REQ, q->sub, NULL, buf, sizeof(buf));
    sr__probe_ops->call_out(id, to, fn, t0);
    return t0;
}

/* A request found its destination gone at send time: say so as the public
 * function the user called (q->who), not as the transport's. */
static int __attribute__((noinline, cold)) gone_at_send(sr_agent *a, int to, const struct sr_req *q, int rc)
{
    sr_tport *t = a->tp[to];
    if (rc != -EPIPE || !sr__tport_peer_gone(t, to)) /* not a departure: the transport's own text */
        return rc;
    char how[256];
    return sr__fail(-EPIPE, q->who ? q->who : "sr_rpc", "destination rank %d is gone: %s", to,
                    t->ops->live->gone_text(t, to, how, sizeof(how)));
}

/* A call's own future (sr__future_new_call) whose call did not start: the
 * reference it held for the call slot is dropped. */
static int not_started(sr_future *f, int rc)
{
    if (sr__future_is_call(f))
        sr_future_unref(f);
    return rc;
}

int sr__rpc_start(sr_agent *a, int to, const struct sr_req *q, const char *fn, sr_args args, int64_t ms,
                  sr_future *f)
{
    sr__agent_refresh(a); /* the request is stamped with the generation of `to` known now */
    sr_msg m = {0};
    struct sr_wire w = {0};
    const uint8_t *enc = NULL;
    size_t enc_len = 0;
    int rc = build_request(a, to, q, fn, args, &m, &w, &enc, &enc_len);
    if (rc)
        return not_started(f, rc);
    uint64_t id;
    if ((rc = sr__call_begin(a, to, ms, f, &id))) {
        if (enc_len)
            sr__codec_release(enc, enc_len);
        sr__payload_abandon(&w);
        return not_started(f, rc);
    }
    int64_t t0 = sr__probing() ? probe_out(id, to, q, fn) : 0;
    sr__wire_put_call(&m, &w, id);
    unsigned slot = sr__quiesce_sent(a, to);
    /* elastic jobs: counted, then the destination's state (segment.h, E2) */
    if ((a->elastic && (rc = sr__leave_refuse(a, to, q->who))) ||
        ((rc = sr__agent_send(a, to, &m)) && (rc = gone_at_send(a, to, q, rc)))) {
        sr_future *own = sr__call_end(a, id);
        sr_future_unref(own);
        if (enc_len)
            sr__codec_release(enc, enc_len);
        sr__payload_abandon(&w);
        sr__quiesce_unsent(a, to, slot);
    }
    if (t0 && sr__probing())
        sr__probe_ops->call_sent(id, to, rc, t0, sr__probe_now());
    return rc;
}

/* ---- answers (the caller's side of a response) ---------------------------- */

/* Where the encoded values of result m start, past its extension block. */
static int result_ext(const sr_msg *m, const uint8_t *p, size_t len, struct sr_ext_view *ext, size_t *used)
{
    ext->mask = 0;
    *used = 0;
    if ((sr__wire_flags(m) & SR_WIRE_EXT) && sr__ext_parse(p, len, m->src, ext, used))
        return -EBADMSG;
    return 0;
}

/* The one value of result m (a reference), given to the modules' hooks. */
static int decode_result(const sr_msg *m, const uint8_t *p, size_t len, sr_value **out)
{
    struct sr_ext_view ext;
    size_t used, n = 0;
    if (result_ext(m, p, len, &ext, &used) || sr__codec_decode_one(p + used, len - used, out, &n))
        return -EBADMSG;
    if (n != 1)
        return sr__fail(-EBADMSG, "sr_rpc", "a result from worker%d holds %zu values", m->src, n);
    if (ext.mask)
        sr__ext_response_in(m->src, &ext, *out);
    return 0;
}

/* The same, kept as the list of that one value (KEEP_RET). */
static int decode_result_list(const sr_msg *m, const uint8_t *p, size_t len, sr_value **list)
{
    sr_value *v = NULL;
    int rc = decode_result(m, p, len, &v);
    if (!rc && !(*list = sr_list(1, &v)))
        rc = -ENOMEM;
    sr_value_unref(v);
    return rc;
}

static void release_result(const sr_msg *m, const uint8_t *p, size_t len)
{
    struct sr_ext_view ext;
    size_t used = 0;
    if (!(sr__wire_flags(m) & SR_WIRE_EXT) || !sr__ext_parse(p, len, m->src, &ext, &used))
        sr__codec_release(p + used, len - used);
}

/* The profiler: the answer to call id from m->src arrived at t0 (before its
 * future completes, so that whoever it wakes sees the call counted). */
static void probe_answer(uint64_t id, const sr_msg *m, int err, int64_t t0)
{
    if (t0 && sr__probing())
        sr__probe_ops->call_end(id, m->src, err, t0, sr__probe_now());
}

void sr__calls_response(sr_agent *a, const sr_msg *m)
{
    int64_t t0 = sr__probing() ? sr__probe_now() : 0;
    struct sr_wire w = sr__wire_get(m);
    sr_future *f = sr__call_answer(a, w.call_id, m->src); /* only the rank called may answer */
    size_t len;
    const uint8_t *p = sr__payload_get(m, &len);
    sr_value *list = NULL;
    if (!f) { /* late (timed out), duplicate or stray: drop, releasing what it carried */
        if (p && m->type == SR_MSG_RESP)
            release_result(m, p, len);
    } else if (m->type == SR_MSG_KEEP_RET) { /* none, or the list of the value that rode along */
        bool value = p && (w.flags & SR_WIRE_VALUE) && !decode_result_list(m, p, len, &list);
        probe_answer(w.call_id, m, 0, t0);
        sr__future_complete_held(f, value ? list : NULL); /* adopts the list */
    } else if (!p) {
        probe_answer(w.call_id, m, -EBADMSG, t0);
        sr__future_fail_text(f, -EBADMSG, sr_last_error());
    } else if (m->type == SR_MSG_ERR) {
        char text[1024];
        snprintf(text, sizeof(text), "%.*s", (int)(len < sizeof(text) ? len : sizeof(text) - 1), (const char *)p);
        int code = w.code < 0 ? w.code : -SR_EREMOTE;
        probe_answer(w.call_id, m, code, t0);
        sr__future_fail_cause(f, code, w.cause < 0 ? w.cause : code, text);
    } else if (decode_result(m, p, len, &list)) {
        probe_answer(w.call_id, m, -EBADMSG, t0);
        sr__future_fail_text(f, -EBADMSG, sr_last_error());
    } else {
        probe_answer(w.call_id, m, 0, t0);
        sr__future_complete_held(f, list); /* adopts the value; we hold f (the slot's reference) */
    }
    sr__payload_done(m);
    sr_future_unref(f);
    sr__quiesce_done(a, m->src, m->gens);
}
