/* Dispatch of incoming RPC messages: requests run a function (inline or on
 * an executor) and answer; responses complete the caller's future.
 * See agent.h for the inline policy. */
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

struct sr_call {
    sr_agent *a;
    int caller;
    uint64_t call_id;
    const struct sr_fn_entry *fn;
    sr_value *args;     /* a list */
    sr_value *result;   /* set by sr_call_return */
    int err;
    char *msg;          /* set by sr_call_fail; NULL on the fast path */
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

static void finish_call(struct sr_call *c)
{
    sr_agent *a = c->a;
    if (c->err) {
        char text[512];
        snprintf(text, sizeof(text), "Error on Node %d: %s", a->rank, c->msg && c->msg[0] ? c->msg : sr_strerror(c->err));
        send_error(a, c->caller, c->call_id, -SR_EREMOTE, text);
    } else {
        send_result(a, c->caller, c->call_id, c->result ? c->result : NULL);
    }
    sr_value_unref(c->result);
    sr_value_unref(c->args);
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

static struct sr_call *decode_request(sr_agent *a, const sr_msg *m, const uint8_t *p, size_t len)
{
    struct sr_wire w = sr_wire_get(m);
    uint64_t id = w.call_id;
    char text[256];
    const struct sr_fn_entry *fn = w.name_len <= len ? sr__registry_find((const char *)p, w.name_len) : NULL;
    if (!fn) {
        snprintf(text, sizeof(text), "function '%.*s' is not registered on worker%d",
                 (int)(w.name_len <= len && w.name_len < 64 ? w.name_len : 0), (const char *)p, a->rank);
        send_error(a, m->src, id, -ENOENT, text);
        return NULL;
    }
    struct sr_call *c = malloc(sizeof(*c));
    if (c)
        c->args = NULL;
    if (!c || sr_codec_decode(p + w.name_len, len - w.name_len, &c->args)) {
        snprintf(text, sizeof(text), "Error on Node %d: %s", a->rank, c ? sr_last_error() : "out of memory");
        send_error(a, m->src, id, c ? -EBADMSG : -ENOMEM, text);
        free(c);
        return NULL;
    }
    *c = (struct sr_call){.a = a, .caller = m->src, .call_id = id, .fn = fn, .args = c->args};
    return c;
}

/* Inline on the polling thread: async functions (they must not block),
 * cheap built-ins (no-op, echo, views: the same cost at any size), and
 * computing built-ins on scalars. A computing built-in given a tensor (a
 * 64 MiB add, a matmul) goes to the executors like a plain function, and the
 * polling thread keeps serving. When the poller is idle anything runs inline. */
static bool runs_inline(const struct sr_call *c, enum sr_poll_mode mode)
{
    if (mode == SR_POLL_IDLE || c->fn->kind == SR_FN_ASYNC || c->fn->kind == SR_FN_BUILTIN_CHEAP)
        return true;
    if (c->fn->kind == SR_FN_PLAIN)
        return false;
    for (size_t i = 0; i < sr_call_nargs(c); i++)
        if (sr_value_type(sr_call_arg(c, i)) == SR_KIND_TENSOR)
            return false;
    return true;
}

static void handle_request(sr_agent *a, const sr_msg *m, enum sr_poll_mode mode)
{
    size_t len;
    const uint8_t *p = sr__payload_get(m, &len);
    struct sr_call *c = NULL;
    if (!p)
        send_error(a, m->src, sr_wire_get(m).call_id, -EBADMSG, sr_last_error());
    else
        c = decode_request(a, m, p, len);
    sr__payload_done(m);
    if (!c) {
        atomic_fetch_add_explicit(&a->user_done, 1, memory_order_relaxed); /* relaxed: after the error was counted */
        return;
    }
    atomic_fetch_add_explicit(&a->server_active, 1, memory_order_relaxed); /* relaxed: statistics */
    if (runs_inline(c, mode))
        run_call(c);
    else
        enqueue(a, c);
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
        handle_request(a, m, mode);
        break;
    case SR_MSG_RESP:
    case SR_MSG_ERR:
        handle_response(a, m);
        break;
    case SR_MSG_CTRL:
        sr__ctrl_dispatch(a, m);
        break;
    default:
        fprintf(stderr, "worker%d: dropped a message of unknown type %u from worker%u\n", a->rank, m->type, m->src);
    }
}
