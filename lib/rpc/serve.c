/* SPDX-License-Identifier: MIT */
/* Dispatch of incoming RPC messages: requests run a function (inline or on
 * an executor) and answer; responses complete the caller's future.
 * See agent.h for the inline policy.
 *
 * Modules (module.h) take part through hooks: a KEEP_CALL runs like a request
 * but its result goes to the keeping module and the answer is an empty
 * KEEP_RET; a MOD_REQ is served by its module's future; raw module messages
 * go to their module. A call that a module gates (RRef arguments not usable
 * yet) is deferred on a future, without holding a thread, and runs when it
 * completes; modules may prepare the arguments just before the function
 * runs (an RRef proxy call gets the owner's local value). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "codec.h"
#include "crash.h"
#include "error.h"
#include "log.h"
#include "ext.h"
#include "module.h"
#include "objcache.h"
#include "payload.h"
#include "registry.h"
#include "thread.h"
#include "shmrpc/tensor.h"

struct sr_call {
    sr_agent *a;
    int caller;
    uint8_t caller_gens; /* the request's sr_msg.gens: whose generation it came from, for the quiescence count */
    uint64_t call_id;
    const struct sr_fn_entry *fn;
    sr_value *args;     /* a list */
    sr_value *result;   /* set by sr_call_return */
    int err;
    int cause;          /* err's cause: for -SR_EREMOTE, the innermost failed function's code */
    char *msg;          /* set by sr_call_fail; NULL on the fast path */
    bool raw_error;     /* module request: the error text goes back as it is */
    int8_t module;      /* MOD_REQ: the module that serves it; -1 otherwise */
    int8_t keeper;      /* KEEP_CALL: the module that keeps the result; -1 otherwise */
    uint8_t sub;        /* MOD_REQ: its sub-kind */
    uint64_t tag;       /* KEEP_CALL, MOD_REQ: the module's word */
    void *kept;         /* KEEP_CALL: the keeper's handle for the result */
    void *state[SR_MODULE_MAX]; /* modules' per-call state (module.h); state[m] is set only if mods has bit m */
    uint32_t mods;              /* the modules that took their state slot (sr__call_state) for this call */
    struct sr_call *next_deferred;
    struct sr_probe_call probe; /* the profiler's times (rpc/module.h, "Probes"); t_arrive 0: not profiled */
    char probe_name[48];        /* a module request's name, for probe.name */
};

/* The slot is NULL-initialised when first taken, and taking it signs the
 * module up for the call's later hooks (module.h): a call that no module
 * took a slot of runs none of them. */
void **sr__call_state(sr_call *c, int module)
{
    uint32_t bit = 1u << module;
    if (!(c->mods & bit)) {
        c->mods |= bit;
        c->state[module] = NULL;
    }
    return &c->state[module];
}

/* ---- call records -----------------------------------------------------------
 * Freed records are kept by the thread that freed them, for the next request
 * it decodes (objcache.h): a poller that serves calls inline (the no-op,
 * cheap built-ins, async functions) then allocates nothing per call, as the
 * caller's futures (future.c). A record enters the cache only from
 * call_release, once nothing refers to it (the call was answered or
 * dropped). A record freed on an executor stays in that executor's cache. */
static _Thread_local struct sr__objcache call_cache = SR__OBJCACHE_INIT(4, free);

/* A record to fill (every field: decode_request), from this thread's cache
 * when it has one. */
static struct sr_call *call_new(void)
{
    struct sr_call *c = sr__objcache_get(&call_cache);
    return c ? c : malloc(sizeof(struct sr_call));
}

/* Every field of a new record, one store each: a compound literal would
 * clear the whole record (some 250 bytes, the probe's name buffer
 * included) with a `rep stos` on every request, which the no-op's
 * profile showed as the decoding's hottest instruction. probe_name is
 * written before it is read (probe_in). */
static void call_init(struct sr_call *c, sr_agent *a, const sr_msg *m, const struct sr_wire *w,
                      const struct sr_fn_entry *fn)
{
    c->a = a;
    c->caller = m->src;
    c->caller_gens = m->gens;
    c->call_id = w->call_id;
    c->fn = fn;
    c->args = c->result = NULL;
    c->err = c->cause = 0;
    c->msg = NULL;
    c->raw_error = false;
    c->module = c->keeper = -1;
    c->sub = 0;
    c->tag = w->tag;
    c->kept = NULL;
    c->mods = 0;
    c->next_deferred = NULL;
    c->probe = (struct sr_probe_call){0};
}

/* c is no longer referred to: keep it for this thread's next call_new, or free it. */
static void call_release(struct sr_call *c)
{
    if (!sr__objcache_put(&call_cache, c))
        free(c);
}

SR_API size_t sr_call_nargs(const sr_call *c)
{
    if (!c)
        sr__fail(-EINVAL, "sr_call_nargs", "call is NULL");
    return c ? sr_value_list_len(c->args) : 0;
}

SR_API sr_value *sr_call_arg(const sr_call *c, size_t i)
{
    if (!c)
        sr__fail(-EINVAL, "sr_call_arg", "call is NULL (argument %zu)", i);
    return c ? sr_value_list_at(c->args, i) : NULL;
}

SR_API int sr_call_caller(const sr_call *c) { return c ? c->caller : sr__fail(-EINVAL, "sr_call_caller", "call is NULL"); }

SR_API int sr_call_return(sr_call *c, sr_value *v)
{
    if (!c) {
        sr_value_unref(v); /* it was given to us */
        return sr__fail(-EINVAL, "sr_call_return", "call is NULL");
    }
    sr_value_unref(c->result);
    c->result = v ? v : sr_none();
    return 0;
}

SR_API int sr_call_fail(sr_call *c, int err, const char *fmt, ...)
{
    if (!c)
        return sr__fail(-EINVAL, "sr_call_fail", "call is NULL (error %d)", err);
    free(c->msg);
    c->msg = NULL;
    if (fmt) { /* a NULL format: no message */
        va_list ap;
        va_start(ap, fmt);
        if (vasprintf(&c->msg, fmt, ap) < 0)
            c->msg = NULL;
        va_end(ap);
    }
    c->err = err < 0 ? err : -EINVAL;
    c->cause = sr__error_cause(c->err); /* forwarding a failed nested call: its callee's code */
    return c->err;
}

/* ---- answering ------------------------------------------------------------ */

/* What the profiler records of an answer: the probe's times, the error and
 * when answering began (f0; 0: not recorded). NULL for refusals. */
struct answering {
    const struct sr_probe_call *probe;
    int err;
    int64_t f0;
};

/* Send the answer m (its wire header w) to `to`, counted for quiescence.
 * The reply record is made before the send: once the answer is out, the
 * caller may go on and this worker may be killed at once (a forwarded
 * Ctrl-C), and a trace must not hold the caller's end of an answer without
 * the callee's (docs/PROFILING.md). On failure, the caller releases the
 * payload. */
static int send_answer(sr_agent *a, int to, sr_msg *m, const struct sr_wire *w, const struct answering *ans)
{
    sr__wire_put(m, w, false);
    if (ans && ans->f0 && sr__probing())
        sr__probe_ops->reply(ans->probe, ans->err, ans->f0, sr__probe_now());
    unsigned slot = sr__quiesce_sent(a, to);
    int rc = sr__agent_send(a, to, m);
    if (rc)
        sr__quiesce_unsent(a, to, slot);
    return rc;
}

static void send_error(sr_agent *a, int to, uint64_t id, int code, int cause, const char *text,
                       const struct answering *ans)
{
    sr_msg m = {.type = SR_MSG_ERR};
    struct sr_wire w = {.call_id = id, .code = code, .cause = cause};
    size_t len = strlen(text);
    uint8_t *p = sr__payload_reserve(&m, &w, len);
    if (!p) { /* no heap for a long message: cut it to fit inline */
        len = SR_WIRE_INLINE;
        p = sr__payload_reserve(&m, &w, len);
    }
    memcpy(p, text, len);
    if (send_answer(a, to, &m, &w, ans))
        sr__payload_abandon(&w);
}

/* ext: the modules' extension block for the result (NULL: none). */
static void send_result(sr_agent *a, int to, uint64_t id, sr_value *v, const struct sr_ext_buf *ext,
                        const struct answering *ans)
{
    sr_value *one[1] = {v};
    size_t elen = ext ? ext->len : 0;
    int64_t len = sr__codec_size(1, one, to == a->rank);
    sr_msg m = {.type = SR_MSG_RESP};
    struct sr_wire w = {.call_id = id};
    uint8_t *p = len >= 0 ? sr__payload_reserve(&m, &w, elen + (size_t)len) : NULL;
    if (p && elen) {
        memcpy(p, ext->b, elen);
        w.flags |= SR_WIRE_EXT;
    }
    if (!p || sr__codec_encode_to(1, one, to == a->rank, to, p + elen, (size_t)len) != len) {
        char text[512];
        snprintf(text, sizeof(text), "Error on Node %d: cannot send the result: %s", a->rank, sr_last_error());
        if (p)
            sr__payload_abandon(&w);
        send_error(a, to, id, -SR_EREMOTE, sr__error_cause(-SR_EREMOTE), text, ans);
        return;
    }
    if (send_answer(a, to, &m, &w, ans)) {
        sr__codec_release(p + elen, (size_t)len);
        sr__payload_abandon(&w);
    }
}

/* Immutable plain data (no tensor, object or RRef): a copy made now is the
 * same as a copy made at any later fetch. */
static bool plain(const sr_value *v, int depth)
{
    sr_kind k = sr_value_type(v);
    if (k == SR_KIND_LIST && depth < 4) {
        for (size_t i = 0; i < sr_value_list_len(v); i++)
            if (!plain(sr_value_list_at(v, i), depth + 1))
                return false;
        return true;
    }
    return k != SR_KIND_LIST && k != SR_KIND_TENSOR && k != SR_KIND_OBJECT && !sr__value_kind(k);
}

/* The answer to a KEEP_CALL: the keeper has the value (or error). A plain
 * value of up to SR_REMOTE_RET_MAX encoded bytes rides along, so the caller
 * (an RRef's creator calling to_here()) needs no fetch. The cap keeps a large
 * result that nobody may ever fetch from being copied into the heap. */
#define SR_REMOTE_RET_MAX 4096
static void send_remote_ret(sr_agent *a, int to, uint64_t id, sr_value *v, const struct answering *ans)
{
    sr_msg m = {.type = SR_MSG_KEEP_RET};
    struct sr_wire w = {.call_id = id};
    sr_value *one[1] = {v};
    int64_t len = v && plain(v, 0) ? sr__codec_size(1, one, to == a->rank) : -1;
    uint8_t *p = len > 0 && len <= SR_REMOTE_RET_MAX ? sr__payload_reserve(&m, &w, (size_t)len) : NULL;
    if (p && sr__codec_encode_to(1, one, to == a->rank, to, p, (size_t)len) == len) {
        w.flags |= SR_WIRE_VALUE;
    } else if (p) { /* cannot happen for plain data; send no value rather than none */
        sr__payload_abandon(&w);
        w = (struct sr_wire){.call_id = id};
    } else {
        w.len = 0;
    }
    if (send_answer(a, to, &m, &w, ans)) /* the caller is gone: the value's block is ours again */
        sr__payload_abandon(&w);
}

/* The end of a served call: c is freed, and counted as fully processed
 * under its caller's generation (agent.h, quiesce). */
static void call_free(sr_agent *a, struct sr_call *c)
{
    int caller = c->caller;
    uint8_t gens = c->caller_gens;
    if (c->msg) /* set only by sr_call_fail: no call into the allocator on the fast path */
        free(c->msg);
    call_release(c);
    sr__count(&a->ctr->served_out);
    sr__quiesce_done(a, caller, gens);
}

static void modules_call_done(struct sr_call *c)
{
    for (unsigned m = sr__hooks[SR_HOOK_CALL_DONE] & c->mods; m;)
        sr__modules[sr__hook_next(&m)]->call->call_done(c);
}

/* "Error on Node 1: in 'train_step': <the function's message>" (PyTorch's
 * "Error on Node N: ", naming the function; a module request has no name). */
static void remote_error_text(const struct sr_call *c, char *text, size_t len)
{
    const char *msg = c->msg && c->msg[0] ? c->msg : sr_strerror(c->err);
    if (c->fn)
        snprintf(text, len, "Error on Node %d: in '%s': %s", c->a->rank, c->fn->name, msg);
    else
        snprintf(text, len, "Error on Node %d: %s", c->a->rank, msg);
}




sr_call *sr__call_decoding(void) { return sr__thr.decoding; }

static void finish_call(struct sr_call *c)
{
    sr_agent *a = c->a;
    int64_t f0 = 0;
    if (c->probe.t_arrive && sr__probing()) { /* counted before the caller can see the answer */
        f0 = sr__probe_now();
        sr__probe_ops->served(&c->probe, c->err, f0);
    }
    /* The arguments go before the answer: RRefs among them are deleted (or
     * their forks retired) before the caller can see the call finished.
     * Every branch below answers the caller, so the module messages to it
     * that this causes (an RRef child released) go quietly and are read
     * with the answer. */
    const struct answering ans = {.probe = &c->probe, .err = c->err, .f0 = f0};
    int prev = sr__thr.answer_to;
    sr__thr.answer_to = c->caller;
    sr_value_unref(c->args);
    sr__thr.answer_to = prev;
    c->args = NULL;
    if (c->err && c->raw_error) {
        send_error(a, c->caller, c->call_id, c->err, c->cause, c->msg ? c->msg : sr_strerror(c->err), &ans);
    } else if (c->kept) {
        char text[512] = "";
        if (c->err)
            remote_error_text(c, text, sizeof(text));
        sr__modules[c->keeper]->keep->set(c->kept, c->err ? -SR_EREMOTE : 0, c->err ? c->cause : 0, text,
                                          c->result); /* NULL: None */
        c->kept = NULL;
        send_remote_ret(a, c->caller, c->call_id, c->err ? NULL : c->result, &ans);
    } else if (c->err) {
        char text[512];
        remote_error_text(c, text, sizeof(text));
        send_error(a, c->caller, c->call_id, -SR_EREMOTE, c->cause, text, &ans);
    } else {
        struct sr_ext_buf ext;
        sr__ext_response_out(c, c->mods, c->result, &ext);
        send_result(a, c->caller, c->call_id, c->result ? c->result : NULL, &ext, &ans);
    }
    modules_call_done(c);
    sr_value_unref(c->result);
    call_free(a, c); /* the response was counted as sent before this: the sums stay balanced */
}

static void on_async_done(sr_future *f, void *p)
{
    struct sr_call *c = p;
    int rc = sr_future_value(f, &c->result);
    if (rc)
        sr_call_fail(c, rc, "%s", sr_last_error());
    sr_future_unref(f);
    atomic_fetch_sub_explicit(&c->a->server_async, 1, memory_order_relaxed); /* relaxed: statistics */
    finish_call(c);
}

static void modules_enter(struct sr_call *c)
{
    for (unsigned m = sr__hooks[SR_HOOK_RUN_ENTER] & c->mods; m;)
        sr__modules[sr__hook_next(&m)]->call->run_enter(c);
}

static void modules_exit(struct sr_call *c) /* in reverse order */
{
    for (unsigned m = sr__hooks[SR_HOOK_RUN_EXIT] & c->mods; m;)
        sr__modules[sr__hook_last(&m)]->call->run_exit(c);
}

/* A module request: the module's serve gives the future of the answer. */
static int serve_module(struct sr_call *c, sr_future **f)
{
    /* c->module is SR_MODULE_MAX for a module id past the table (decode_request) */
    const sr_module *m = c->module < SR_MODULE_MAX ? sr__modules[c->module] : NULL;
    if (!m || !m->request || !m->request->serve)
        return sr_call_fail(c, -ENOENT, "worker%d has no module %d to serve a request", c->a->rank, c->module);
    return m->request->serve(c->caller, c->sub, c->tag, c->args, f);
}

/* The profiler: the function ran on this thread from t_run0 until now. */
static void probe_ran(struct sr_call *c)
{
    if (c->probe.t_arrive && sr__probing()) {
        c->probe.t_run1 = sr__probe_now();
        sr__probe_ops->ran(&c->probe);
    }
}

/* retake (non-NULL): a plain call that an idle waiter runs after handing
 * the inbox back (sr__dispatch_run_deferred), the last one it has: take the
 * inbox again before the answer goes out (the waiter's retake is
 * sr__agent_pretake, wait.c), so the caller's next
 * request finds it held (doorbell AWAKE) and wakes nobody, instead of
 * racing the waiter's return to its poll and waking the parked progress
 * thread, which would then serve in its place. */
static void run_call_then(struct sr_call *c, void (*retake)(sr_agent *a))
{
    if (c->probe.t_arrive && sr__probing())
        c->probe.t_run0 = sr__probe_now();
    modules_enter(c);
    if (c->module < 0 && c->fn->kind != SR_FN_ASYNC) {
        struct sr__serving prev = sr__serving_enter(c->fn->name, c->caller);
        int rc = c->fn->fn(c);
        sr__serving_exit(prev);
        if (rc && !c->err)
            sr_call_fail(c, rc, "%s", sr_last_error()[0] ? sr_last_error() : sr_strerror(rc));
        modules_exit(c);
        probe_ran(c);
        if (retake)
            retake(c->a);
        finish_call(c);
        return;
    }
    sr_future *f = NULL;
    struct sr__serving prev = sr__serving_enter(c->fn ? c->fn->name : NULL, c->caller);
    int rc = c->module >= 0 ? serve_module(c, &f) : c->fn->afn(c, &f);
    sr__serving_exit(prev);
    modules_exit(c);
    probe_ran(c);
    if (!rc && !f)
        rc = sr_call_fail(c, -EINVAL, "Functions registered with sr_register_async must return a future");
    if (rc) {
        if (!c->err)
            sr_call_fail(c, rc, "%s", sr_last_error());
        sr_future_unref(f);
        finish_call(c);
        return;
    }
    atomic_fetch_add_explicit(&c->a->server_async, 1, memory_order_relaxed); /* relaxed: statistics */
    if (sr__future_on_done(f, on_async_done, NULL, c)) { /* -ENOMEM: answer with the error now */
        atomic_fetch_sub_explicit(&c->a->server_async, 1, memory_order_relaxed); /* relaxed: statistics */
        sr_call_fail(c, -ENOMEM, "cannot wait for the async function's future: %s", sr_last_error());
        sr_future_unref(f);
        finish_call(c);
    }
}

static void run_call(struct sr_call *c) { run_call_then(c, NULL); }

/* ---- to the executors (exec.c) ------------------------------------------ */

static void run_call_job(void *p) { run_call(p); }

/* The pool shut down before the call ran (sr__exec_fini): answer with the error. */
static void shut_call_job(void *p)
{
    struct sr_call *c = p;
    sr_call_fail(c, -SR_ESHUTDOWN, "worker%d shut down before the call ran", c->a->rank);
    finish_call(c);
}

static void enqueue(sr_agent *a, struct sr_call *c)
{
    if (sr__exec_push(a, run_call_job, shut_call_job, c)) /* no memory for the item: run it here, not drop it */
        run_call(c);
}

/* ---- incoming messages ------------------------------------------------------- */

/* The request's extension block, if any: skipped in *p / *len. */
static int request_ext(const sr_msg *m, const uint8_t **p, size_t *len, struct sr_ext_view *v)
{
    size_t used = 0;
    bool ext = sr__wire_flags(m) & SR_WIRE_EXT;
    int rc = ext ? sr__ext_parse(*p, *len, m->src, v, &used) : 0;
    if (!ext)
        v->mask = 0;
    *p += used;
    *len -= used;
    return rc;
}

/* The module hooks of a request that carried their extension. */
static int modules_request_in(struct sr_call *c, const struct sr_ext_view *v)
{
    for (unsigned mask = v->mask & sr__hooks[SR_HOOK_REQUEST_IN]; mask;) {
        int id = sr__hook_next(&mask);
        int rc = sr__modules[id]->call->request_in(c, v->data[id], v->len[id]);
        if (rc)
            return sr_call_fail(c, rc, "%s", sr_last_error());
    }
    return 0;
}

static const struct sr_fn_entry *find_fn(sr_agent *a, const sr_msg *m, const uint8_t *p, size_t len, char *text,
                                         size_t tl)
{
    if (m->type == SR_MSG_MOD_REQ)
        return NULL;
    uint16_t name_len = sr__wire_name_len(m);
    const struct sr_fn_entry *fn = name_len <= len ? sr__registry_find((const char *)p, name_len) : NULL;
    if (!fn)
        snprintf(text, tl, "Error on Node %d: function '%.*s' is not registered on worker%d", a->rank,
                 (int)(name_len <= len && name_len < 64 ? name_len : 0), (const char *)p, a->rank);
    return fn;
}

/* Decode a request (after its extension block); on failure fill *code and
 * text and return NULL. */
static struct sr_call *decode_request(sr_agent *a, const sr_msg *m, const uint8_t *p, size_t len, int *code,
                                      char *text, size_t tl)
{
    struct sr_wire w = sr__wire_get(m);
    bool named = m->type != SR_MSG_MOD_REQ;
    const struct sr_fn_entry *fn = find_fn(a, m, p, len, text, tl);
    if (named && !fn) {
        if (w.name_len <= len) /* what the arguments carry (tensor blocks, RRef forks) must still be let go */
            sr__codec_release(p + w.name_len, len - w.name_len);
        *code = -ENOENT;
        return NULL;
    }
    size_t skip = named ? w.name_len : 0;
    struct sr_call *c = call_new();
    if (!c) {
        snprintf(text, tl, "Error on Node %d: out of memory", a->rank);
        *code = -ENOMEM;
        sr__codec_release(p + skip, len - skip);
        return NULL;
    }
    call_init(c, a, m, &w, fn);
    if (m->type == SR_MSG_MOD_REQ) {
        c->module = (int8_t)(w.ctrl < SR_MODULE_MAX ? w.ctrl : SR_MODULE_MAX);
        c->sub = (uint8_t)w.name_len;
        c->raw_error = true;
    }
    /* Module value kinds may tie what they decode to the call (module.h). */
    struct sr_call *prev = sr__thr.decoding;
    sr__thr.decoding = c;
    int rc = sr__codec_decode(p + skip, len - skip, &c->args);
    sr__thr.decoding = prev;
    if (rc) {
        snprintf(text, tl, "Error on Node %d: %s", a->rank, sr_last_error());
        *code = -EBADMSG;
        modules_call_done(c); /* what the decode tied to the call */
        call_release(c);
        return NULL;
    }
    return c;
}

/* Inline on the polling thread: async functions (they must not block),
 * cheap built-ins (no-op, echo, views: the same cost at any size), and
 * computing built-ins on scalars. A computing built-in given a tensor (a
 * 64 MiB add, a matmul) is handled like a plain function (a serving waiter
 * keeps it, else the executors run it), and the polling thread keeps
 * serving. When the poller is idle (sr_shutdown's
 * waits) built-ins run inline whatever their arguments. A plain function
 * never does: it may make a nested blocking call, and the thread that holds
 * the inbox cannot wait for an answer that only it could read (a worker in
 * sr_shutdown serving a plain function that calls out would deadlock). */
static bool runs_inline(const struct sr_call *c, enum sr_poll_mode mode)
{
    if (c->module >= 0)
        return true; /* serve only starts the work (module.h) */
    if (c->fn->kind == SR_FN_PLAIN)
        return false;
    if (mode == SR_POLL_IDLE || c->fn->kind == SR_FN_ASYNC || c->fn->kind == SR_FN_BUILTIN_CHEAP)
        return true;
    for (size_t i = 0; i < sr_call_nargs(c); i++)
        if (sr_value_type(sr_call_arg(c, i)) == SR_KIND_TENSOR)
            return false;
    return true;
}

int sr__call_set_arg(sr_call *c, size_t i, sr_value *v)
{
    size_t n = sr_value_list_len(c->args);
    sr_value **items = i < n ? malloc(n * sizeof(*items)) : NULL;
    sr_value *list = NULL;
    for (size_t k = 0; items && k < n; k++)
        items[k] = k == i ? v : sr_value_list_at(c->args, k);
    list = items ? sr_list(n, items) : NULL;
    free(items);
    sr_value_unref(v);
    if (!list)
        return i < n ? -ENOMEM : -EINVAL;
    sr_value_unref(c->args);
    c->args = list;
    return 0;
}

sr_value *sr__call_args(sr_call *c) { return c->args; }

/* The modules' last word before the function runs. */
static int modules_prepare(struct sr_call *c)
{
    for (unsigned mask = sr__hooks[SR_HOOK_PREPARE] & c->mods; mask;) {
        int rc = sr__modules[sr__hook_next(&mask)]->gate->prepare(c);
        if (rc)
            return sr_call_fail(c, rc, "%s", sr_last_error());
    }
    return 0;
}

/* The plain call taken by an idle poller (a thread inside sr_shutdown or
 * sr_serve_until), a serving waiter (sr_future_wait, sr_rpc_sync; agent.h,
 * "Serving waiters") or the progress thread's own loop (PROGRESS mode;
 * agent.h, "The progress thread serves"): that same thread runs it once it
 * has handed the inbox back, so a nested call inside can be answered, and
 * no thread hop is paid.
 * One at a time: the other plain calls of the same burst go to the
 * executors, since the kept one may block until one of them has run (a lock
 * that a later call releases: bench_train's serialised mode deadlocked with
 * both kept behind each other on one thread). Per thread: the list is
 * sr__thr.deferred_head (thread.h). */

static void defer(struct sr_call *c)
{
    c->next_deferred = NULL;
    if (sr__thr.deferred_tail)
        sr__thr.deferred_tail->next_deferred = c;
    else
        sr__thr.deferred_head = c;
    sr__thr.deferred_tail = c;
}

bool sr__dispatch_has_deferred(void) { return sr__thr.deferred_head != NULL || sr__exec_has_kept(); }

void sr__dispatch_hand_off(sr_agent *a)
{
    sr__exec_hand_off_kept(a);
    while (sr__thr.deferred_head) {
        struct sr_call *c = sr__thr.deferred_head;
        sr__thr.deferred_head = c->next_deferred;
        enqueue(a, c);
    }
    sr__thr.deferred_tail = NULL;
}

/* Run what this waiting thread kept, as an executor would: grad mode on,
 * the modules' thread context cleared (agent.h, "Serving waiters"). Module
 * jobs that the jobs submit are kept too and run in the same loop (a
 * backward pass hop by hop, with no executor wake); what a plain function
 * submits is run by the wait's next round, or handed to the executors
 * when the wait ends (wait.c). One level deeper for the waits inside
 * (SR_SERVE_DEPTH_MAX). */
void sr__dispatch_run_deferred(void (*retake)(sr_agent *a))
{
    struct sr_tls_snap tls;
    bool grad = sr_set_grad_enabled(true);
    sr__tls_clear(&tls);
    sr__thr.serve_depth++;
    sr__exec_run_kept();
    while (sr__thr.deferred_head) {
        struct sr_call *c = sr__thr.deferred_head;
        sr__thr.deferred_head = c->next_deferred;
        if (!sr__thr.deferred_head)
            sr__thr.deferred_tail = NULL;
        /* never hold the inbox across another call's function */
        run_call_then(c, sr__thr.deferred_head ? NULL : retake);
    }
    sr__thr.serve_depth--;
    sr__tls_swap(&tls);
    sr_set_grad_enabled(grad);
}

/* Every RRef argument is usable: run per the inline policy. */
static void start_call(struct sr_call *c, enum sr_poll_mode mode)
{
    if (modules_prepare(c)) {
        finish_call(c);
        return;
    }
    if (runs_inline(c, mode))
        run_call(c);
    else if (mode != SR_POLL_NESTED && c->fn && !sr__thr.deferred_head)
        defer(c); /* a plain function, or (WAIT) a built-in given a tensor; one at a time: see defer */
    else
        enqueue(c->a, c);
}

static void gate_call(struct sr_call *c, enum sr_poll_mode mode);

static void resume_call(sr_future *gate, void *p)
{
    struct sr_call *c = p;
    if (sr_future_value(gate, NULL)) {
        sr_call_fail(c, -EINVAL, "%s", sr_last_error());
        finish_call(c);
        return;
    }
    /* Whoever completed the gate may be in the middle of anything: never run
     * a plain function inline here. The gate is collected again in case some
     * RRefs were beyond its capacity. */
    gate_call(c, SR_POLL_NESTED);
}

/* Teardown destroyed the gate before it completed: drop the call unanswered. */
static void drop_call(void *p)
{
    struct sr_call *c = p;
    sr_agent *a = c->a;
    modules_call_done(c);
    if (c->kept)
        sr__modules[c->keeper]->keep->drop(c->kept);
    sr_value_unref(c->args);
    sr_value_unref(c->result);
    call_free(a, c);
}

/* Run c now, or once its RRef arguments are usable (no thread waits). */
static void gate_call(struct sr_call *c, enum sr_poll_mode mode)
{
    sr_future *gate = NULL;
    for (unsigned m = sr__hooks[SR_HOOK_GATE]; !gate && m;)
        gate = sr__modules[sr__hook_next(&m)]->gate->gate(c);
    if (!gate) {
        start_call(c, mode);
        return;
    }
    if (sr__future_on_done(gate, resume_call, drop_call, c)) {
        sr_call_fail(c, -ENOMEM, "%s", sr_last_error());
        finish_call(c);
    }
    sr_future_unref(gate);
}

/* A KEEP_CALL's keeper: its handle attached to c, or (c failed to decode)
 * given the error as the kept value. False if the caller must get an ERR. */
static bool keep_open(sr_agent *a, const sr_msg *m, struct sr_call **pc, int code, char *text, size_t tl)
{
    struct sr_wire w = sr__wire_get(m);
    const sr_module *k = w.ctrl < SR_MODULE_MAX ? sr__modules[w.ctrl] : NULL;
    void *h = k && k->keep && k->keep->open ? k->keep->open(w.tag, m->src) : NULL;
    if (!h) {
        snprintf(text, tl, "Error on Node %d: %s", a->rank, k ? sr_last_error() : "no module keeps this call");
        if (*pc) {
            sr_value_unref((*pc)->args);
            modules_call_done(*pc); /* the state its decode and request_in hooks made */
            call_release(*pc);
            *pc = NULL;
        }
        return false;
    }
    if (*pc) {
        (*pc)->kept = h;
        (*pc)->keeper = (int8_t)w.ctrl;
        return true;
    }
    k->keep->set(h, code, code, text, NULL); /* the kept value is the error */
    send_remote_ret(a, m->src, w.call_id, NULL, NULL);
    return true;
}

/* Decode a request and run the modules' hooks on it. NULL with *code and
 * text when it cannot be decoded; a call that a module refused is answered
 * here (*answered). */
static struct sr_call *take_request(sr_agent *a, const sr_msg *m, int *code, char *text, size_t tl, bool *answered)
{
    size_t len;
    struct sr_ext_view ext;
    const uint8_t *p = sr__payload_get(m, &len);
    struct sr_call *c = NULL;
    *answered = false;
    if (!p || request_ext(m, &p, &len, &ext))
        snprintf(text, tl, "%s", sr_last_error());
    else
        c = decode_request(a, m, p, len, code, text, tl);
    /* ext points into the payload: the hooks read it before the block is
     * released, or the sender may reuse the block for its next message and
     * the hooks read that one's bytes (another call's autograd ids). */
    bool refused = c && modules_request_in(c, &ext);
    sr__payload_done(m);
    if (refused) {
        sr__count_locked(&a->ctr->served_in); /* under the token (sr__serve_request) */
        c->raw_error = false;
        finish_call(c); /* answered with the module's error; the hooks' state is dropped */
        *answered = true;
        return NULL;
    }
    return c;
}

/* The profiler: a request arrived at t0 and was decoded into c. */
static void probe_in(struct sr_call *c, const sr_msg *m, int64_t t0)
{
    const char *name = c->fn ? c->fn->name
                             : sr__probe_module_name(c->module, m->type, c->sub, NULL, c->probe_name, sizeof(c->probe_name));
    c->probe = (struct sr_probe_call){.caller = c->caller, .call_id = c->call_id, .name = name, .t_arrive = t0,
                                      .t_decoded = sr__probe_now()};
    sr__probe_ops->serve_in(&c->probe);
}

void sr__serve_request(sr_agent *a, const sr_msg *m, enum sr_poll_mode mode)
{
    int code = -EBADMSG;
    char text[256];
    bool answered;
    int64_t t0 = sr__probing() ? sr__probe_now() : 0;
    struct sr_call *c = take_request(a, m, &code, text, sizeof(text), &answered);
    if (answered)
        return;
    if (c && t0 && sr__probing())
        probe_in(c, m, t0);
    answered = m->type == SR_MSG_KEEP_CALL && keep_open(a, m, &c, code, text, sizeof(text)) && !c;
    if (!c) {
        if (!answered)
            send_error(a, m->src, sr__wire_get(m).call_id, m->type == SR_MSG_KEEP_CALL ? -ENOMEM : code, 0, text,
                       NULL);
        sr__quiesce_done(a, m->src, m->gens); /* after the answer was counted */
        return;
    }
    /* A load and a store: requests are served only by the token holder
     * (poll.c), and the token's hand-over (release, then the next holder's
     * acquire CAS: wait.c, progress.c) orders every writer of served_in. */
    sr__count_locked(&a->ctr->served_in);
    sr__counters_sample(a);
    gate_call(c, mode);
}

/* A result's payload: its extension block handed to the modules with the
 * decoded value. 0, or -EBADMSG (the reason in sr_last_error). */
