/* SPDX-License-Identifier: MIT */
/* Forward recording: the module hooks that attach SendRpcBackward and
 * RecvRpcBackward to RPCs made inside a context (lib/rpc/module.h).
 *
 * Caller: a request inside a context records its destination as a known
 * worker, and carries {context_id, message_id} when an argument tensor
 * requires grad, and always for user functions, remote() and to_here() (so
 * the callee's context exists and cleanup reaches it). The tensors that
 * require grad get a send function. Callee: the context is created under the
 * same id, the tensors that arrived requiring grad get a recv function, and
 * the function runs with that context current. A result with tensors that
 * require grad goes back the same way.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "error.h"
#include "module.h"

#define EXT_LEN 16

struct call_state {
    sr_dctx *ctx;
    int64_t prev; /* the thread's context before run_enter */
};

static int collect(sr_value *v, sr_tensor ***ts, size_t *n, size_t *cap, int depth)
{
    sr_kind k = sr_value_type(v);
    if (k == SR_KIND_LIST && depth < 64) {
        for (size_t i = 0; i < sr_value_list_len(v); i++) {
            int rc = collect(sr_value_list_at(v, i), ts, n, cap, depth + 1);
            if (rc)
                return rc;
        }
        return 0;
    }
    sr_tensor *t = k == SR_KIND_TENSOR ? sr_value_tensor(v) : NULL;
    if (!t || !sr_tensor_requires_grad(t))
        return 0;
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 4;
        sr_tensor **g = realloc(*ts, c * sizeof(*g));
        if (!g)
            return sr__fail(-ENOMEM, "sr_rpc", "out of memory recording autograd");
        *ts = g;
        *cap = c;
    }
    (*ts)[(*n)++] = t;
    return 0;
}

int sr__grad_tensors(sr_value *const *vs, size_t nv, sr_tensor ***out, size_t *n)
{
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    int rc = 0;
    for (size_t i = 0; !rc && i < nv; i++)
        rc = vs[i] ? collect(vs[i], out, n, &cap, 0) : 0;
    if (rc) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

static void put_ids(uint8_t *ext, int64_t ctx, int64_t msg)
{
    memcpy(ext, &ctx, 8);
    memcpy(ext + 8, &msg, 8);
}

static int get_ids(const uint8_t *ext, size_t len, int64_t *ctx, int64_t *msg)
{
    if (len != EXT_LEN)
        return sr__fail(-EBADMSG, "sr_rpc", "distributed autograd header of %zu bytes (expected %d)", len, EXT_LEN);
    memcpy(ctx, ext, 8);
    memcpy(msg, ext + 8, 8);
    /* Every id a worker makes is >= 0 (rank-prefixed counters); -1 would be
     * the id maps' empty key, where a context or function is lost. */
    if (*ctx < 0 || *msg < 0)
        return sr__fail(-EBADMSG, "sr_rpc", "distributed autograd header names context %lld, message %lld: ids are "
                        "never negative", (long long)*ctx, (long long)*msg);
    return 0;
}

/* A send function for ts[n], recorded in c under the message id msg. */
static int record_send(sr_dctx *c, sr_tensor **ts, size_t n, int peer, const char *what, int64_t msg)
{
    int rc = 0;
    bool prev = sr_no_grad_enter();
    sr_node *fn = sr__send_fn_create(ts, n, peer, what);
    sr_no_grad_exit(prev);
    if (!fn)
        return sr__fail(-ENOMEM, "sr_rpc", "out of memory for SendRpcBackward");
    sr__send_fn_set_id(fn, msg);
    rc = sr__dctx_add_fn(c, true, msg, fn);
    sr__node_unref(fn);
    return rc;
}

static int record_recv(sr_dctx *c, int64_t msg, int peer, sr_value *v)
{
    sr_tensor **ts;
    size_t n;
    int rc = sr__grad_tensors(&v, 1, &ts, &n);
    if (rc || !n)
        return rc;
    sr_node *fn = sr__recv_fn_create(c->id, msg, peer, ts, n);
    free(ts);
    if (!fn)
        return sr__fail(-ENOMEM, "sr_rpc", "out of memory for RecvRpcBackward");
    rc = sr__dctx_add_fn(c, false, msg, fn);
    sr__node_unref(fn);
    return rc;
}

/* A call that carries the context even without tensors that require grad:
 * user functions, remote() calls and other modules' requests (to_here's
 * fetch), whose results may bring some back. */
static bool forced(const struct sr_call_out *o)
{
    enum sr_call_kind k = sr__call_out_kind(o);
    return k == SR_CALL_USER || k == SR_CALL_KEEP || k == SR_CALL_MODULE;
}

static int da_request_out(const struct sr_call_out *o, uint8_t *ext, size_t *len)
{
    int64_t cur = sr__dctx_current();
    if (cur == SR_NO_CONTEXT || (o->kind == SR_CALL_MODULE && o->module == sr__dist_module))
        return 0;
    sr_dctx *c = sr__dctx_find(cur);
    if (!c)
        return 0;
    sr__dctx_add_known(c, o->to);
    sr_tensor **ts = NULL;
    size_t n = 0;
    int64_t msg = 0;
    int rc = sr__grad_tensors(o->args.v, o->args.n, &ts, &n);
    if (!rc && (n || forced(o)))
        rc = sr__dctx_next_message_id(&msg);
    if (!rc && n) /* as PyTorch: a send function only for tensors that require grad */
        rc = record_send(c, ts, n, o->to, o->fn ? o->fn : "to_here", msg);
    if (!rc && (n || forced(o))) {
        put_ids(ext, c->id, msg);
        *len = EXT_LEN;
    }
    free(ts);
    sr__dctx_unref(c);
    return rc;
}

static int da_request_in(sr_call *call, const uint8_t *ext, size_t len)
{
    int64_t id = 0, msg = 0;
    bool released;
    int rc = get_ids(ext, len, &id, &msg);
    sr_dctx *c = rc ? NULL : sr__dctx_get_or_create(id, &released);
    if (!c)
        return rc ? rc : released ? 0 : sr__fail(-ENOMEM, "sr_rpc", "out of memory for an autograd context");
    int caller = sr_call_caller(call);
    sr__dctx_add_known(c, caller);
    rc = record_recv(c, msg, caller, sr__call_args(call)); /* the arguments as the caller sent them */
    struct call_state *st = rc ? NULL : malloc(sizeof(*st));
    if (!st) {
        sr__dctx_unref(c);
        return rc ? rc : sr__fail(-ENOMEM, "sr_rpc", "out of memory");
    }
    *st = (struct call_state){.ctx = c, .prev = SR_NO_CONTEXT};
    *sr__call_state(call, sr__dist_module) = st;
    return 0;
}

static void da_run_enter(sr_call *call)
{
    struct call_state *st = *sr__call_state(call, sr__dist_module);
    if (st)
        st->prev = sr__dctx_set_current(st->ctx->id);
}

static void da_run_exit(sr_call *call)
{
    struct call_state *st = *sr__call_state(call, sr__dist_module);
    if (st)
        sr__dctx_set_current(st->prev);
}

static void da_response_out(sr_call *call, sr_value *v, uint8_t *ext, size_t *len)
{
    struct call_state *st = *sr__call_state(call, sr__dist_module);
    sr_tensor **ts = NULL;
    size_t n = 0;
    int64_t msg = 0;
    if (!st || sr__grad_tensors(&v, 1, &ts, &n) || !n)
        return;
    if (!sr__dctx_next_message_id(&msg) && !record_send(st->ctx, ts, n, sr_call_caller(call), "result", msg)) {
        put_ids(ext, st->ctx->id, msg);
        *len = EXT_LEN;
    }
    free(ts);
}

static void da_call_done(sr_call *call)
{
    void **slot = sr__call_state(call, sr__dist_module);
    struct call_state *st = *slot;
    if (st) {
        sr__dctx_unref(st->ctx);
        free(st);
        *slot = NULL;
    }
}

static void da_response_in(int from, const uint8_t *ext, size_t len, sr_value *v)
{
    int64_t id = 0, msg = 0;
    if (get_ids(ext, len, &id, &msg))
        return;
    sr_dctx *c = sr__dctx_find(id);
    if (!c)
        return;
    sr__dctx_add_known(c, from);
    record_recv(c, msg, from, v);
    sr__dctx_unref(c);
}

const struct sr_module_call_ops sr__dist_call_ops = {
    .request_out = da_request_out,
    .response_in = da_response_in,
    .request_in = da_request_in,
    .run_enter = da_run_enter,
    .run_exit = da_run_exit,
    .response_out = da_response_out,
    .call_done = da_call_done,
};

const struct sr_module_tls_ops sr__dist_tls_ops = {
    .get = sr__dctx_current,
    .set = sr__dctx_set_current,
    .none = SR_NO_CONTEXT,
};
