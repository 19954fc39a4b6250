/* Dispatch of incoming RPC messages: requests run a function (inline or on
 * an executor) and answer; responses complete the caller's future.
 * See agent.h for the inline policy.
 *
 * RRefs (lib/rref/hooks.h): a REMOTE_CALL runs like a request but its result
 * goes into the callee's OwnerRRef and the answer is an empty REMOTE_RET; an
 * RREF_FETCH is answered with the owner's value once it is set; RREF control
 * messages go to lib/rref. A call whose arguments hold RRefs that are not
 * usable yet (users not confirmed by their owner, owners without their
 * value) is deferred on a future, without holding a thread, and runs when
 * they are. A proxy call (SR_WIRE_PROXY) gets the owner's local value in
 * place of its RRef argument 0. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "codec.h"
#include "error.h"
#include "payload.h"
#include "registry.h"
#include "rref/hooks.h"

struct sr_call {
    sr_agent *a;
    int caller;
    uint64_t call_id;
    const struct sr_fn_entry *fn;
    sr_value *args;     /* a list */
    sr_value *result;   /* set by sr_call_return */
    int err;
    char *msg;          /* set by sr_call_fail; NULL on the fast path */
    bool proxy;         /* SR_WIRE_PROXY: argument 0 becomes the owner's local value */
    sr_rref *owner;     /* REMOTE_CALL: the OwnerRRef that receives the result */
    struct sr_call *next_deferred;
};

struct sr_job_item {
    struct sr_job_item *next;
    struct sr_call *call;
};

SR_API size_t sr_call_nargs(const sr_call *c) { return sr_value_list_len(c->args); }
SR_API sr_value *sr_call_arg(const sr_call *c, size_t i) { return sr_value_list_at(c->args, i); }
SR_API int sr_call_caller(const sr_call *c) { return c->caller; }

SR_API int sr_call_return(sr_call *c, sr_value *v)
{
    sr_value_unref(c->result);
    c->result = v ? v : sr_none();
    return 0;
}

SR_API int sr_call_fail(sr_call *c, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    free(c->msg);
    if (vasprintf(&c->msg, fmt, ap) < 0)
        c->msg = NULL;
    va_end(ap);
    c->err = err < 0 ? err : -EINVAL;
    return c->err;
}

/* ---- answering ------------------------------------------------------------ */

static void send_error(sr_agent *a, int to, uint64_t id, int code, const char *text)
{
    sr_msg m = {.type = SR_MSG_ERR};
    struct sr_wire w = {.call_id = id, .code = code};
    size_t len = strlen(text);
    uint8_t *p = sr__payload_reserve(&m, &w, len);
    if (!p) { /* no heap for a long message: cut it to fit inline */
        len = SR_WIRE_INLINE;
        p = sr__payload_reserve(&m, &w, len);
    }
    memcpy(p, text, len);
    sr_wire_put(&m, &w, false);
    atomic_fetch_add_explicit(&a->user_sent, 1, memory_order_relaxed); /* relaxed: counted before it can arrive */
    if (sr__agent_send(a, to, &m)) {
        sr__payload_abandon(&w);
        atomic_fetch_add_explicit(&a->user_done, 1, memory_order_relaxed); /* relaxed: it never arrives */
    }
}

static void send_result(sr_agent *a, int to, uint64_t id, sr_value *v)
{
    sr_value *one[1] = {v};
    int64_t len = sr_codec_size(1, one, to == a->rank);
    sr_msg m = {.type = SR_MSG_RESP};
    struct sr_wire w = {.call_id = id};
    uint8_t *p = len >= 0 ? sr__payload_reserve(&m, &w, (size_t)len) : NULL;
    if (!p || sr_codec_encode(1, one, to == a->rank, p, (size_t)len) != len) {
        char text[512];
        snprintf(text, sizeof(text), "Error on Node %d: cannot send the result: %s", a->rank, sr_last_error());
        if (p)
            sr__payload_abandon(&w);
        send_error(a, to, id, -SR_EREMOTE, text);
        return;
    }
    sr_wire_put(&m, &w, false);
    atomic_fetch_add_explicit(&a->user_sent, 1, memory_order_relaxed); /* relaxed: counted before it can arrive */
    if (sr__agent_send(a, to, &m)) {
        sr_codec_release(p, (size_t)len);
        sr__payload_abandon(&w);
        atomic_fetch_add_explicit(&a->user_done, 1, memory_order_relaxed); /* relaxed: never arrives */
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
    return k != SR_KIND_LIST && k != SR_KIND_TENSOR && k != SR_KIND_OBJECT && k != SR_KIND_RREF;
}

/* The answer to a REMOTE_CALL: the OwnerRRef now has its value (or error).
 * A plain value of up to SR_REMOTE_RET_MAX encoded bytes rides along, so the
 * creator's to_here() needs no fetch (lib/rref/use.c). The cap keeps a large
 * result that nobody may ever fetch from being copied into the heap. */
#define SR_REMOTE_RET_MAX 4096
static void send_remote_ret(sr_agent *a, int to, uint64_t id, sr_value *v)
{
    sr_msg m = {.type = SR_MSG_REMOTE_RET};
    struct sr_wire w = {.call_id = id};
    sr_value *one[1] = {v};
    int64_t len = v && plain(v, 0) ? sr_codec_size(1, one, to == a->rank) : -1;
    uint8_t *p = len > 0 && len <= SR_REMOTE_RET_MAX ? sr__payload_reserve(&m, &w, (size_t)len) : NULL;
    if (p && sr_codec_encode(1, one, to == a->rank, p, (size_t)len) == len) {
        w.flags |= SR_WIRE_VALUE;
    } else if (p) { /* cannot happen for plain data; send no value rather than none */
        sr__payload_abandon(&w);
        w = (struct sr_wire){.call_id = id};
    } else {
        w.len = 0;
    }
    sr_wire_put(&m, &w, false);
    atomic_fetch_add_explicit(&a->user_sent, 1, memory_order_relaxed); /* relaxed: counted before it can arrive */
    if (sr__agent_send(a, to, &m))
        atomic_fetch_add_explicit(&a->user_done, 1, memory_order_relaxed); /* relaxed: it never arrives */
}

static void finish_call(struct sr_call *c)
{
    sr_agent *a = c->a;
    /* The arguments go before the answer: RRefs among them are deleted (or
     * their forks retired) before the caller can see the call finished. */
    sr_value_unref(c->args);
    c->args = NULL;
    if (c->owner) {
        char text[512] = "";
        if (c->err)
            snprintf(text, sizeof(text), "Error on Node %d: %s", a->rank,
                     c->msg && c->msg[0] ? c->msg : sr_strerror(c->err));
        sr__rref_owner_set(c->owner, c->err ? -SR_EREMOTE : 0, text, c->result); /* NULL: None */
        send_remote_ret(a, c->caller, c->call_id, c->err ? NULL : c->result);
        sr_rref_unref(c->owner);
    } else if (c->err) {
        char text[512];
        snprintf(text, sizeof(text), "Error on Node %d: %s", a->rank, c->msg && c->msg[0] ? c->msg : sr_strerror(c->err));
        send_error(a, c->caller, c->call_id, -SR_EREMOTE, text);
    } else {
        send_result(a, c->caller, c->call_id, c->result ? c->result : NULL);
    }
    sr_value_unref(c->result);
    free(c->msg);
    free(c);
    atomic_fetch_sub_explicit(&a->server_active, 1, memory_order_relaxed); /* relaxed: statistics */
    /* relaxed: the response was counted as sent before this, so the sum stays balanced */
    atomic_fetch_add_explicit(&a->user_done, 1, memory_order_relaxed);
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

static void run_call(struct sr_call *c)
{
    if (c->fn->kind != SR_FN_ASYNC) {
        int rc = c->fn->fn(c);
        if (rc && !c->err)
            sr_call_fail(c, rc, "%s", sr_last_error()[0] ? sr_last_error() : sr_strerror(rc));
        finish_call(c);
        return;
    }
    sr_future *f = NULL;
    int rc = c->fn->afn(c, &f);
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
    if (sr_future_add_done_callback(f, on_async_done, c)) { /* -ENOMEM: answer with the error now */
        atomic_fetch_sub_explicit(&c->a->server_async, 1, memory_order_relaxed); /* relaxed: statistics */
        sr_call_fail(c, -ENOMEM, "cannot wait for the async function's future: %s", sr_last_error());
        sr_future_unref(f);
        finish_call(c);
    }
}

/* ---- executors -------------------------------------------------------------- */

static void enqueue(sr_agent *a, struct sr_call *c)
{
    struct sr_job_item *it = malloc(sizeof(*it));
    if (!it) { /* no memory for the queue item: run it here rather than drop it */
        run_call(c);
        return;
    }
    it->next = NULL;
    it->call = c;
    pthread_mutex_lock(&a->q_lock);
    *a->q_tail = it;
    a->q_tail = &it->next;
    pthread_cond_signal(&a->q_cond);
    pthread_mutex_unlock(&a->q_lock);
}

static void *executor_main(void *p)
{
    sr_agent *a = p;
    pthread_mutex_lock(&a->q_lock);
    for (;;) {
        while (!a->q_head && !a->exec_stopping) {
            atomic_fetch_add_explicit(&a->exec_idle, 1, memory_order_relaxed); /* relaxed: statistics */
            pthread_cond_wait(&a->q_cond, &a->q_lock);
            atomic_fetch_sub_explicit(&a->exec_idle, 1, memory_order_relaxed); /* relaxed: statistics */
        }
        if (!a->q_head)
            break;
        struct sr_job_item *it = a->q_head;
        a->q_head = it->next;
        if (!a->q_head)
            a->q_tail = &a->q_head;
        pthread_mutex_unlock(&a->q_lock);
        sr_xport_awake(a->x, 1); /* runnable while it runs a function */
        run_call(it->call);
        sr_xport_awake(a->x, -1);
        free(it);
        pthread_mutex_lock(&a->q_lock);
    }
    pthread_mutex_unlock(&a->q_lock);
    return NULL;
}

int sr__exec_start(sr_agent *a, int n)
{
    pthread_mutex_init(&a->q_lock, NULL);
    pthread_cond_init(&a->q_cond, NULL);
    a->q_head = NULL;
    a->q_tail = &a->q_head;
    a->executors = calloc((size_t)n, sizeof(pthread_t));
    if (!a->executors)
        return sr__fail(-ENOMEM, "sr_init", "no memory for %d executor threads", n);
    for (a->nexec = 0; a->nexec < n; a->nexec++) {
        int rc = pthread_create(&a->executors[a->nexec], NULL, executor_main, a);
        if (rc)
            return sr__fail(-rc, "sr_init", "cannot start executor thread %d: %s", a->nexec, strerror(rc));
    }
    return 0;
}

/* Executors finish the queue and the functions they run, then exit. Called
 * while the progress thread still serves the inbox, so a function finishing
 * a nested call is answered. */
void sr__exec_stop(sr_agent *a)
{
    pthread_mutex_lock(&a->q_lock);
    a->exec_stopping = true;
    pthread_cond_broadcast(&a->q_cond);
    pthread_mutex_unlock(&a->q_lock);
    for (int i = 0; i < a->nexec; i++)
        pthread_join(a->executors[i], NULL);
    free(a->executors);
    a->executors = NULL;
    a->nexec = 0;
    pthread_cond_destroy(&a->q_cond);
    pthread_mutex_destroy(&a->q_lock);
}

/* ---- incoming messages ------------------------------------------------------- */

/* Decode a request; on failure fill *code and text and return NULL. */
static struct sr_call *decode_request(sr_agent *a, const sr_msg *m, const uint8_t *p, size_t len, int *code,
                                      char *text, size_t tl)
{
    struct sr_wire w = sr_wire_get(m);
    const struct sr_fn_entry *fn = w.name_len <= len ? sr__registry_find((const char *)p, w.name_len) : NULL;
    if (!fn) {
        snprintf(text, tl, "function '%.*s' is not registered on worker%d",
                 (int)(w.name_len <= len && w.name_len < 64 ? w.name_len : 0), (const char *)p, a->rank);
        if (w.name_len <= len) /* what the arguments carry (tensor blocks, RRef forks) must still be let go */
            sr_codec_release(p + w.name_len, len - w.name_len);
        *code = -ENOENT;
        return NULL;
    }
    struct sr_call *c = malloc(sizeof(*c));
    if (c)
        c->args = NULL;
    if (!c || sr_codec_decode(p + w.name_len, len - w.name_len, &c->args)) {
        snprintf(text, tl, "Error on Node %d: %s", a->rank, c ? sr_last_error() : "out of memory");
        *code = c ? -EBADMSG : -ENOMEM;
        free(c);
        return NULL;
    }
    *c = (struct sr_call){.a = a, .caller = m->src, .call_id = w.call_id, .fn = fn, .args = c->args,
                          .proxy = (w.flags & SR_WIRE_PROXY) != 0};
    return c;
}

/* Inline on the polling thread: async functions (they must not block),
 * cheap built-ins (no-op, echo, views: the same cost at any size), and
 * computing built-ins on scalars. A computing built-in given a tensor (a
 * 64 MiB add, a matmul) goes to the executors like a plain function, and the
 * polling thread keeps serving. When the poller is idle (sr_shutdown's
 * waits) built-ins run inline whatever their arguments. A plain function
 * never does: it may make a nested blocking call, and the thread that holds
 * the inbox cannot wait for an answer that only it could read (a worker in
 * sr_shutdown serving a plain function that calls out would deadlock). */
static bool runs_inline(const struct sr_call *c, enum sr_poll_mode mode)
{
    if (c->fn->kind == SR_FN_PLAIN)
        return false;
    if (mode == SR_POLL_IDLE || c->fn->kind == SR_FN_ASYNC || c->fn->kind == SR_FN_BUILTIN_CHEAP)
        return true;
    for (size_t i = 0; i < sr_call_nargs(c); i++)
        if (sr_value_type(sr_call_arg(c, i)) == SR_KIND_TENSOR)
            return false;
    return true;
}

/* Replace argument 0 of a proxy call by the owner's local value. */
static int proxy_args(struct sr_call *c)
{
    size_t n = sr_value_list_len(c->args);
    sr_value *v = NULL;
    if (!n)
        return sr_call_fail(c, -EINVAL, "a proxy call needs the RRef as argument 0");
    if (sr__rref_proxy_value(sr_value_list_at(c->args, 0), &v))
        return sr_call_fail(c, -EINVAL, "%s", sr_last_error());
    sr_value **items = malloc(n * sizeof(*items));
    sr_value *list = NULL;
    if (items) {
        items[0] = v;
        for (size_t i = 1; i < n; i++)
            items[i] = sr_value_list_at(c->args, i);
        list = sr_list(n, items);
    }
    free(items);
    sr_value_unref(v);
    if (!list)
        return sr_call_fail(c, -ENOMEM, "out of memory");
    sr_value_unref(c->args);
    c->args = list;
    return 0;
}

/* Plain calls taken by an idle poller (a thread inside sr_shutdown): that
 * same thread runs them once it has handed the inbox back, so a nested call
 * inside can be answered, and no thread hop is paid. FIFO, per thread. */
static _Thread_local struct sr_call *deferred_head, *deferred_tail;

static void defer(struct sr_call *c)
{
    c->next_deferred = NULL;
    if (deferred_tail)
        deferred_tail->next_deferred = c;
    else
        deferred_head = c;
    deferred_tail = c;
}

bool sr__dispatch_has_deferred(void) { return deferred_head != NULL; }

void sr__dispatch_run_deferred(void)
{
    while (deferred_head) {
        struct sr_call *c = deferred_head;
        deferred_head = c->next_deferred;
        if (!deferred_head)
            deferred_tail = NULL;
        run_call(c);
    }
}

/* Every RRef argument is usable: run per the inline policy. */
static void start_call(struct sr_call *c, enum sr_poll_mode mode)
{
    if (c->proxy && proxy_args(c)) {
        finish_call(c);
        return;
    }
    if (runs_inline(c, mode))
        run_call(c);
    else if (mode == SR_POLL_IDLE && c->fn->kind == SR_FN_PLAIN)
        defer(c);
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
    sr_rref_unref(c->owner);
    sr_value_unref(c->args);
    free(c->msg);
    free(c);
    atomic_fetch_sub_explicit(&a->server_active, 1, memory_order_relaxed); /* relaxed: statistics */
    atomic_fetch_add_explicit(&a->user_done, 1, memory_order_relaxed);   /* relaxed: quiescence counter */
}

/* Run c now, or once its RRef arguments are usable (no thread waits). */
static void gate_call(struct sr_call *c, enum sr_poll_mode mode)
{
    sr_future *gate = sr__rref_gate(c->args);
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

/* A REMOTE_CALL's OwnerRRef: attached to c, or (c failed to decode) given
 * the error as its value. False if the caller must get an ERR instead. */
static bool remote_owner(sr_agent *a, const sr_msg *m, struct sr_call **pc, int code, char *text, size_t tl)
{
    struct sr_wire w = sr_wire_get(m);
    sr_rref *owner = sr__rref_remote_owner(w.rref_id, m->src);
    if (!owner) {
        snprintf(text, tl, "Error on Node %d: %s", a->rank, sr_last_error());
        if (*pc) {
            sr_value_unref((*pc)->args);
            free(*pc);
            *pc = NULL;
        }
        return false;
    }
    if (*pc) {
        (*pc)->owner = owner;
        return true;
    }
    sr__rref_owner_set(owner, code, text, NULL); /* the RRef exists; its value is the error */
    sr_rref_unref(owner);
    send_remote_ret(a, m->src, w.call_id, NULL);
    return true;
}

static void handle_request(sr_agent *a, const sr_msg *m, enum sr_poll_mode mode)
{
    size_t len;
    int code = -EBADMSG;
    char text[256];
    const uint8_t *p = sr__payload_get(m, &len);
    struct sr_call *c = NULL;
    if (!p)
        snprintf(text, sizeof(text), "%s", sr_last_error());
    else
        c = decode_request(a, m, p, len, &code, text, sizeof(text));
    sr__payload_done(m);
    bool answered = m->type == SR_MSG_REMOTE_CALL && remote_owner(a, m, &c, code, text, sizeof(text)) && !c;
    if (!c) {
        if (!answered)
            send_error(a, m->src, sr_wire_get(m).call_id, m->type == SR_MSG_REMOTE_CALL ? -ENOMEM : code, text);
        atomic_fetch_add_explicit(&a->user_done, 1, memory_order_relaxed); /* relaxed: after the answer was counted */
        return;
    }
    atomic_fetch_add_explicit(&a->server_active, 1, memory_order_relaxed); /* relaxed: statistics */
    gate_call(c, mode);
}

/* RREF_FETCH: answer with the owner's value once it is set. */
struct fetch {
    sr_agent *a;
    int caller;
    uint64_t call_id;
};

static void fetch_done(sr_future *vf, void *p)
{
    struct fetch *fx = p;
    sr_agent *a = fx->a;
    sr_value *v = NULL;
    int rc = sr_future_value(vf, &v);
    if (rc)
        send_error(a, fx->caller, fx->call_id, rc, sr_last_error());
    else
        send_result(a, fx->caller, fx->call_id, v);
    sr_value_unref(v);
    atomic_fetch_add_explicit(&a->user_done, 1, memory_order_relaxed); /* relaxed: after the answer was counted */
}

static void fetch_done_free(sr_future *vf, void *p)
{
    fetch_done(vf, p);
    free(p);
}

static void fetch_drop(void *p)
{
    struct fetch *fx = p;
    atomic_fetch_add_explicit(&fx->a->user_done, 1, memory_order_relaxed); /* relaxed: never answered (teardown) */
    free(fx);
}

static void handle_fetch(sr_agent *a, const sr_msg *m)
{
    struct sr_wire w = sr_wire_get(m);
    char text[256];
    int code = 0;
    sr_future *vf = sr__rref_fetch_value(w.rref_id, w.flags & SR_WIRE_CONFIRMED, &code, text, sizeof(text));
    if (vf && sr_future_done(vf)) { /* the common case: the value is there */
        struct fetch fx = {.a = a, .caller = m->src, .call_id = w.call_id};
        fetch_done(vf, &fx);
        sr_future_unref(vf);
        return;
    }
    struct fetch *fx = vf ? malloc(sizeof(*fx)) : NULL;
    if (!fx) {
        send_error(a, m->src, w.call_id, vf ? -ENOMEM : code, vf ? "out of memory" : text);
        atomic_fetch_add_explicit(&a->user_done, 1, memory_order_relaxed); /* relaxed: after the answer was counted */
    } else {
        *fx = (struct fetch){.a = a, .caller = m->src, .call_id = w.call_id};
        if (sr__future_on_done(vf, fetch_done_free, fetch_drop, fx)) {
            send_error(a, m->src, w.call_id, -ENOMEM, sr_last_error());
            fetch_drop(fx);
        }
    }
    sr_future_unref(vf);
}

static void handle_response(sr_agent *a, const sr_msg *m)
{
    struct sr_wire w = sr_wire_get(m);
    sr_future *f = sr__call_end(a, w.call_id);
    size_t len;
    const uint8_t *p = sr__payload_get(m, &len);
    if (!f) { /* late (timed out) or duplicate: drop, releasing what it carried */
        if (p && m->type == SR_MSG_RESP)
            sr_codec_release(p, len);
    } else if (m->type == SR_MSG_REMOTE_RET) { /* none, or the list of the value that rode along */
        sr_value *list = NULL;
        if (p && (w.flags & SR_WIRE_VALUE) && !sr_codec_decode(p, len, &list) && sr_value_list_len(list) == 1)
            sr_future_set_result(f, list);
        else
            sr_future_set_result(f, NULL);
        sr_value_unref(list);
    } else if (!p) {
        sr__future_fail_text(f, -EBADMSG, sr_last_error());
    } else if (m->type == SR_MSG_ERR) {
        char text[1024];
        snprintf(text, sizeof(text), "%.*s", (int)(len < sizeof(text) ? len : sizeof(text) - 1), (const char *)p);
        sr__future_fail_text(f, w.code < 0 ? w.code : -SR_EREMOTE, text);
    } else {
        sr_value *list = NULL;
        if (sr_codec_decode(p, len, &list) || sr_value_list_len(list) != 1)
            sr__future_fail_text(f, -EBADMSG, sr_last_error());
        else
            sr_future_set_result(f, sr_value_list_at(list, 0));
        sr_value_unref(list);
    }
    sr__payload_done(m);
    sr_future_unref(f);
    atomic_fetch_add_explicit(&a->user_done, 1, memory_order_relaxed); /* relaxed: quiescence counter */
}

void sr__dispatch(sr_agent *a, const sr_msg *m, enum sr_poll_mode mode)
{
    switch (m->type) {
    case SR_MSG_REQ:
    case SR_MSG_REMOTE_CALL:
        handle_request(a, m, mode);
        break;
    case SR_MSG_RESP:
    case SR_MSG_ERR:
    case SR_MSG_REMOTE_RET:
        handle_response(a, m);
        break;
    case SR_MSG_RREF_FETCH:
        handle_fetch(a, m);
        break;
    case SR_MSG_RREF:
        sr__rref_ctrl(a, m);
        atomic_fetch_add_explicit(&a->user_done, 1, memory_order_relaxed); /* relaxed: after its answers were counted */
        break;
    case SR_MSG_CTRL:
        sr__ctrl_dispatch(a, m);
        break;
    default:
        fprintf(stderr, "worker%d: dropped a message of unknown type %u from worker%u\n", a->rank, m->type, m->src);
    }
}
