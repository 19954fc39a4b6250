/* Distributed backward, FAST mode.
 *
 * A pass has an id (a message id of the worker that roots it). On every
 * worker it reaches, the pass has one graph task in the context, made when
 * the pass first arrives there: its dependencies are computed from the roots
 * (on the root worker only) plus every send function of the context, each of
 * which waits for one gradient by RPC.
 *
 *   root       feed 1 to every root, run; wait for the RPCs that run sent;
 *              then check that every send function of the context received
 *              its gradient.
 *   PROPAGATE  {msg_id, pass, retain, grads...} to the worker that made
 *              send function msg_id: feed it, run, and answer when every RPC
 *              that run sent has answered. It runs on an executor; no
 *              thread waits while gradients are on their way.
 *   RecvRpcBackward (run by the engine, on the thread that runs the graph)
 *              sends PROPAGATE to its peer; the future joins that run's list.
 * The engine runs a task's ready nodes on the thread that calls run, one run
 * at a time (its task lock), so every RPC belongs to exactly one run, and a
 * run waits only for RPCs it sent itself: the waits follow the causality of
 * the gradients and can never form a cycle. (Waiting for whatever is
 * outstanding in the context instead deadlocks: a PROPAGATE served on the
 * root can take the RPC the root's own run sent, whose answer waits for that
 * very PROPAGATE.) Each run is awaited by the RPC that caused it, up to the
 * root: when the root's wait ends, every worker has finished. Errors travel
 * back the same way ("Error on Node N: ...", -EPIPE for a dead peer), and a
 * pass fails only after all its RPCs answered, so no stale gradient reaches
 * the next pass in the same context.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_autograd/context.h"
#include "error.h"
#include "rpc/probe.h"
#include "rpc/future_internal.h"
#include "rpc/module.h"

/* ---- the pass's graph task ---- */

/* Send functions of c: *n references in a malloc'd array. */
static sr_node **send_fns(sr_dctx *c, size_t *n)
{
    pthread_mutex_lock(&c->lock);
    sr_node **fns = malloc((c->send.len ? c->send.len : 1) * sizeof(*fns));
    size_t k = 0;
    for (size_t i = 0; fns && i < c->send.cap; i++)
        if (c->send.keys[i])
            fns[k++] = sr__node_ref(c->send.vals[i]);
    pthread_mutex_unlock(&c->lock);
    *n = k;
    return fns;
}

static void unref_fns(sr_node **fns, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sr__node_unref(fns[i]);
    free(fns);
}

/* Make the task of pass `pass` (c has none: begin_pass) and install it. */
static int build_task(sr_dctx *c, bool retain, sr_tensor *const *roots, size_t nroots, int64_t pass)
{
    sr_graph_task *g;
    size_t nfns;
    int rc = sr__graph_task_create(retain, &c->sink, &g);
    if (rc)
        return rc;
    for (size_t i = 0; !rc && i < nroots; i++) {
        sr_edge e = sr__tensor_gradient_edge(roots[i]); /* a reference */
        rc = sr__graph_task_add_root(g, e);
        sr__node_unref(e.fn);
    }
    sr_node **fns = rc ? NULL : send_fns(c, &nfns);
    if (!rc && !fns)
        rc = sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
    for (size_t i = 0; !rc && i < nfns; i++)
        rc = sr__graph_task_add_root(g, (sr_edge){fns[i], 0});
    if (fns)
        unref_fns(fns, nfns);
    if (rc) {
        sr__graph_task_destroy(g);
        return rc;
    }
    pthread_mutex_lock(&c->lock);
    c->task = g;
    c->pass = pass;
    c->retain = retain;
    pthread_mutex_unlock(&c->lock);
    return 0;
}

/* A task for pass `pass` whose roots are roots[nroots] and every send
 * function, installed in c. One thread at a time builds a context's task
 * (begin_lock), so threads that bring the first gradients of one pass
 * concurrently make one task: the others find it installed. The previous
 * pass's task goes first, when nobody uses it, so that the nodes it held
 * but never ran are free for this pass (engine.h, "Concurrent passes").
 * Returns 0; the installed task is c->task. */
static int begin_pass(sr_dctx *c, int64_t pass, bool retain, sr_tensor *const *roots, size_t nroots)
{
    pthread_mutex_lock(&c->begin_lock);
    pthread_mutex_lock(&c->lock);
    bool current = c->pass == pass;
    bool busy = !current && c->task_users; /* two roots in one context at once */
    int64_t running = c->pass;
    sr_graph_task *old = current || busy ? NULL : c->task;
    if (old) {
        c->task = NULL;
        c->pass = SR_NO_CONTEXT;
    }
    pthread_mutex_unlock(&c->lock);
    sr__graph_task_destroy(old); /* nobody uses it: task_users was 0 under the lock */
    int rc = busy ? sr__fail(-EBUSY, "sr_dist_autograd_backward", "worker%d: backward pass %lld is still running in "
                             "context %lld; another pass cannot start in it until that one ends", sr__rpc_rank(),
                             (long long)running, (long long)c->id)
                  : 0;
    if (!rc && !current) /* the common case is current: another gradient of a pass already here */
        rc = build_task(c, retain, roots, nroots, pass);
    pthread_mutex_unlock(&c->begin_lock);
    return rc;
}

/* Count a thread in or out of c's task (under c's lock). A context whose
 * task has users is a backward pass in progress here (debug info). */
static void users_add_locked(sr_dctx *c, int d)
{
    uint32_t before = c->task_users;
    c->task_users = (uint32_t)((int)before + d);
    if (!before != !c->task_users) /* relaxed: statistics */
        atomic_fetch_add_explicit(&sr__dctx_passes, before ? -1 : 1, memory_order_relaxed);
}

/* The current task if it belongs to pass, counted as used until
 * release_task (the caller runs it without the context lock: lock order
 * task -> context); no other pass can replace it meanwhile. */
static sr_graph_task *acquire_task(sr_dctx *c, int64_t pass)
{
    pthread_mutex_lock(&c->lock);
    sr_graph_task *g = c->pass == pass ? c->task : NULL;
    if (g)
        users_add_locked(c, 1);
    pthread_mutex_unlock(&c->lock);
    return g;
}

static void release_task(sr_dctx *c)
{
    pthread_mutex_lock(&c->lock);
    users_add_locked(c, -1);
    pthread_mutex_unlock(&c->lock);
}

/* Test hooks (tests/test_dist_autograd_core.c): gradient requests served
 * here so far, and a function the root calls between its run and its wait. */
_Atomic uint64_t sr__dist_propagates_served;
void (*sr__dist_root_hook)(void);

/* ---- the RPCs of one run ---- */

struct run_rpcs {
    sr_future **f;
    size_t n, cap;
};

/* The run this thread is in (set around feed + run). */
static _Thread_local struct run_rpcs *this_run;

static int run_add(sr_future *f)
{
    struct run_rpcs *r = this_run;
    if (!r) {
        sr_future_unref(f);
        return sr__fail(-EINVAL, "sr_dist_autograd_backward", "a RecvRpcBackward ran outside a backward run");
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 8;
        sr_future **g = realloc(r->f, cap * sizeof(*g));
        if (!g) {
            sr_future_unref(f); /* its answer is dropped; the pass fails */
            return sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
        }
        r->f = g;
        r->cap = cap;
    }
    r->f[r->n++] = f;
    return 0;
}

/* Run g, collecting the RPCs the run sends into rr. */
static int run_collecting(sr_graph_task *g, struct run_rpcs *rr)
{
    struct run_rpcs *outer = this_run;
    this_run = rr;
    int rc = sr__graph_task_run(g);
    this_run = outer;
    return rc;
}

/* ---- sending gradients (RecvRpcBackward) ---- */

int sr__dist_send_grads(int64_t ctx_id, int64_t msg_id, int peer, sr_tensor *const *grads, size_t n)
{
    sr_dctx *c = sr__dctx_find(ctx_id);
    if (!c)
        return sr__dctx_not_found("sr_dist_autograd_backward", ctx_id);
    pthread_mutex_lock(&c->lock);
    int64_t pass = c->pass;
    bool retain = c->retain;
    pthread_mutex_unlock(&c->lock);
    sr_value **vals = calloc(n + 3, sizeof(*vals));
    int rc = vals ? 0 : -ENOMEM;
    if (vals) {
        vals[0] = sr_int(msg_id);
        vals[1] = sr_int(pass);
        vals[2] = sr_bool(retain);
        for (size_t i = 0; i < n; i++)
            vals[3 + i] = grads[i] ? sr_tensor_value(grads[i]) : sr_none();
        for (size_t i = 0; i < n + 3; i++)
            rc = vals[i] ? rc : -ENOMEM;
    }
    sr_future *f = NULL;
    if (!rc)
        rc = sr__module_rpc(peer, SR_MOD_DIST_AUTOGRAD, SR_DA_PROPAGATE, (uint64_t)ctx_id, (sr_args){n + 3, vals},
                            sr__rpc_default_timeout_ms(), &f);
    if (!rc)
        rc = run_add(f);
    for (size_t i = 0; vals && i < n + 3; i++)
        sr_value_unref(vals[i]);
    free(vals);
    sr__dctx_unref(c);
    return rc == -ENOMEM ? sr__fail(rc, "sr_dist_autograd_backward", "out of memory") : rc;
}

/* ---- waiting for outstanding RPCs without a thread (PROPAGATE) ---- */

struct agg {
    pthread_mutex_t lock;
    size_t pending;
    int err;
    char *text;
    sr_future *done; /* completed when pending reaches 0 */
};

static void agg_finish(struct agg *a)
{
    if (a->err)
        sr__future_fail_text(a->done, a->err, a->text);
    else
        sr_future_set_result(a->done, NULL);
    sr_future_unref(a->done);
    free(a->text);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

/* Record an error (the first wins) and count one answer; the last finishes. */
static void agg_count(struct agg *a, int err, const char *text)
{
    pthread_mutex_lock(&a->lock);
    if (err && !a->err) {
        a->err = err;
        a->text = strdup(text ? text : "");
    }
    bool last = --a->pending == 0;
    pthread_mutex_unlock(&a->lock);
    if (last)
        agg_finish(a);
}

static void agg_one(sr_future *f, void *p)
{
    int rc = sr_future_value(f, NULL);
    agg_count(p, rc, rc ? sr_last_error() : NULL);
}

static void agg_drop(void *p) { agg_count(p, -SR_ESHUTDOWN, "the RPC layer shut down during a backward pass"); }

/* Complete `done` when every future of fs[n] has (consumes their
 * references), with local error err/text if set, else the first of theirs. */
static void await_all(sr_future **fs, size_t n, int err, const char *text, sr_future *done)
{
    struct agg *a = calloc(1, sizeof(*a));
    if (!a) {
        sr__future_fail_text(done, -ENOMEM, "out of memory");
        for (size_t i = 0; i < n; i++)
            sr_future_unref(fs[i]);
        return;
    }
    pthread_mutex_init(&a->lock, NULL);
    a->pending = n + 1; /* + this function's own count, below */
    a->done = sr_future_ref(done);
    for (size_t i = 0; i < n; i++) {
        if (sr__future_on_done(fs[i], agg_one, agg_drop, a))
            agg_count(a, -ENOMEM, "out of memory");
        sr_future_unref(fs[i]);
    }
    agg_count(a, err, text);
}

/* ---- PROPAGATE: gradients for one of our send functions ---- */

struct job {
    int caller;
    int64_t ctx_id;
    sr_value *args;
    sr_future *done;
};

static int node_error(int err, const char *text, char *buf, size_t len)
{
    snprintf(buf, len, "Error on Node %d: %s", sr__rpc_rank(), text);
    return err == -EPIPE || err == -ETIMEDOUT ? err : -SR_EREMOTE;
}

/* Feed send function msg_id of pass and run, collecting the run's RPCs. */
static int run_send_fn(sr_dctx *c, int64_t msg_id, int64_t pass, bool retain, sr_value *args, struct run_rpcs *rr)
{
    int rc = begin_pass(c, pass, retain, NULL, 0);
    sr_graph_task *g = rc ? NULL : acquire_task(c, pass);
    sr_node *fn = sr__dctx_send_fn(c, msg_id);
    size_t n = sr_value_list_len(args) - 3;
    if (!rc && !g)
        rc = sr__fail(-EINVAL, "sr_dist_autograd_backward", "pass %lld was overtaken by another", (long long)pass);
    if (!rc && (!fn || fn->num_inputs != n))
        rc = sr__fail(-EINVAL, "sr_dist_autograd_backward", "no send function with message id %lld and %zu inputs in "
                      "context %lld", (long long)msg_id, n, (long long)c->id);
    sr_tensor **grads = rc ? NULL : calloc(n ? n : 1, sizeof(*grads));
    if (!rc && !grads)
        rc = sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
    for (size_t i = 0; !rc && i < n; i++)
        grads[i] = sr_value_tensor(sr_value_list_at(args, 3 + i)); /* NULL for None */
    if (!rc)
        rc = sr__graph_task_feed_node(g, fn, grads);
    if (!rc)
        rc = run_collecting(g, rr);
    if (g)
        release_task(c);
    free(grads);
    sr__node_unref(fn);
    return rc;
}

static void job_run(void *p)
{
    struct job *j = p;
    char text[1024] = "";
    int err = 0;
    struct run_rpcs rr = {0};
    sr_dctx *c = sr__dctx_find(j->ctx_id);
    sr_value *a = j->args;
    bool well_formed = sr_value_list_len(a) >= 3 && sr_value_type(sr_value_list_at(a, 0)) == SR_KIND_INT &&
                       sr_value_type(sr_value_list_at(a, 1)) == SR_KIND_INT;
    if (!c)
        err = sr__dctx_not_found("sr_dist_autograd_backward", j->ctx_id);
    else if (!well_formed)
        err = sr__fail(-EBADMSG, "sr_dist_autograd_backward", "a malformed gradient message from worker%d", j->caller);
    else
        err = run_send_fn(c, sr_value_int(sr_value_list_at(a, 0)), sr_value_int(sr_value_list_at(a, 1)),
                          sr_value_bool(sr_value_list_at(a, 2)), a, &rr);
    if (err)
        err = node_error(err, sr_last_error(), text, sizeof(text));
    await_all(rr.f, rr.n, err, text, j->done); /* only this run's RPCs: see the top */
    atomic_fetch_add_explicit(&sr__dist_propagates_served, 1, memory_order_release); /* pairs with the test's acquire */
    free(rr.f);
    sr__dctx_unref(c);
    sr_value_unref(j->args);
    sr_future_unref(j->done);
    free(j);
}

int sr__dist_serve_propagate(int caller, uint64_t ctx_id, sr_value *args, sr_future **out)
{
    struct job *j = malloc(sizeof(*j));
    sr_future *f = j ? sr_future_new() : NULL;
    if (!f) {
        free(j);
        return sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
    }
    *j = (struct job){.caller = caller, .ctx_id = (int64_t)ctx_id, .args = sr_value_ref(args),
                      .done = sr_future_ref(f)};
    int rc = sr__exec_submit(job_run, j);
    if (rc) {
        sr_value_unref(j->args);
        sr_future_unref(j->done);
        sr_future_unref(f);
        free(j);
        return rc;
    }
    *out = f;
    return 0;
}

/* ---- the root ---- */

static int check_roots(sr_tensor *const *roots, size_t n)
{
    const char *who = "sr_dist_autograd_backward";
    if (!roots || !n)
        return sr__fail(-EINVAL, who, "No tensors provided for gradient computation.");
    for (size_t i = 0; i < n; i++) {
        if (!roots[i])
            return sr__fail(-EINVAL, who, "root %zu is NULL", i);
        if (!sr_tensor_requires_grad(roots[i]))
            return sr__fail(-EINVAL, who, "requires_grad not set on root %zu", i);
        if (sr_tensor_numel(roots[i]) != 1)
            return sr__fail(-EINVAL, who, "Tensor %zu is not a scalar, all roots need to be scalar", i);
        if (sr_tensor_is_leaf(roots[i]))
            return sr__fail(-EINVAL, who, "Tensor %zu does not have a valid gradient function", i);
    }
    return 0;
}

/* FAST mode's limit: a send function still waiting when everything has
 * answered would make PyTorch hang; here the pass fails naming the call. */
static int check_send_fns(sr_dctx *c, sr_graph_task *g)
{
    size_t n;
    sr_node **fns = send_fns(c, &n);
    int rc = fns ? 0 : sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
    for (size_t i = 0; !rc && i < n; i++)
        if (!sr__graph_task_executed(g, fns[i]))
            rc = sr__fail(-EDEADLK, "sr_dist_autograd_backward",
                          "worker%d: the send function of the RPC '%s' to worker%d (autograd message id %lld) never "
                          "received a gradient: that RPC's output is not used by any root of this pass, so the "
                          "gradients of the tensors it sent cannot be completed (FAST mode; PyTorch would hang)",
                          sr__rpc_rank(), sr__send_fn_call(fns[i]), sr__send_fn_peer(fns[i]),
                          (long long)sr__fn_message_id(fns[i]));
    if (fns)
        unref_fns(fns, n);
    return rc;
}

static int feed_ones(sr_graph_task *g, sr_tensor *const *roots, size_t n)
{
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        sr_tensor *one = sr_ones_like(roots[i]);
        sr_edge e = sr__tensor_gradient_edge(roots[i]); /* a reference */
        rc = one ? sr__graph_task_feed(g, e, one) : -ENOMEM;
        sr__node_unref(e.fn);
        sr_tensor_unref(one);
    }
    return rc;
}

/* A pass rooted here, run without holding a thread while other workers
 * compute: run locally, then wait with callbacks for the RPCs the run sent;
 * then check the send functions. */
struct root {
    sr_dctx *c;
    sr_graph_task *g;
    struct run_rpcs rr;
    int err;          /* the first error, local or remote */
    char text[1024];
    sr_future *done;
};

static void root_finish(struct root *r)
{
    int rc = r->err;
    if (!rc && (rc = check_send_fns(r->c, r->g)))
        snprintf(r->text, sizeof(r->text), "%s", sr_last_error());
    pthread_mutex_lock(&r->c->lock);
    r->c->root_busy = false;
    if (r->g)
        users_add_locked(r->c, -1);
    pthread_mutex_unlock(&r->c->lock);
    if (rc)
        sr__future_fail_text(r->done, rc, r->text);
    else
        sr_future_set_result(r->done, NULL);
    sr_future_unref(r->done);
    sr__dctx_unref(r->c);
    free(r);
}

static void root_answered(sr_future *f, void *p)
{
    struct root *r = p;
    int rc = sr_future_value(f, NULL);
    if (rc && !r->err) { /* the text is the failing node's: "Error on Node N: ..." */
        r->err = rc == -EPIPE || rc == -ETIMEDOUT || rc == -SR_ESHUTDOWN ? rc : -SR_EREMOTE;
        snprintf(r->text, sizeof(r->text), "%s", sr_last_error());
    }
    root_finish(r);
}

/* Wait for the RPCs the root's run sent (their answers come after every
 * worker they reached has finished). */
static void root_wait(struct root *r)
{
    sr_future *all = r->rr.n ? sr_future_new() : NULL;
    if (!all) {
        if (r->rr.n && !r->err) {
            r->err = -ENOMEM;
            snprintf(r->text, sizeof(r->text), "out of memory");
        }
        for (size_t i = 0; i < r->rr.n; i++)
            sr_future_unref(r->rr.f[i]);
        free(r->rr.f);
        root_finish(r);
        return;
    }
    await_all(r->rr.f, r->rr.n, 0, NULL, all);
    free(r->rr.f);
    r->rr = (struct run_rpcs){0};
    /* Internal callback: the thread context is not the user's to keep. */
    if (sr__future_on_done(all, root_answered, NULL, r))
        root_answered(all, r);
    sr_future_unref(all);
}

/* Start a pass rooted here in c; done completes when every worker involved
 * has finished. Takes its own reference on c. */
static int root_start(sr_dctx *c, sr_tensor *const *roots, size_t n, bool retain, sr_future *done)
{
    pthread_mutex_lock(&c->lock);
    bool busy = c->root_busy;
    c->root_busy = true;
    pthread_mutex_unlock(&c->lock);
    if (busy)
        return sr__fail(-EBUSY, "sr_dist_autograd_backward", "a backward pass is already running in context %lld",
                        (long long)c->id);
    struct root *r = calloc(1, sizeof(*r));
    if (!r) {
        pthread_mutex_lock(&c->lock);
        c->root_busy = false;
        pthread_mutex_unlock(&c->lock);
        return sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
    }
    *r = (struct root){.c = sr__dctx_ref(c), .done = sr_future_ref(done)};
    int64_t pass;
    int rc = sr__dctx_next_message_id(&pass);
    if (!rc)
        rc = begin_pass(c, pass, retain, roots, n);
    r->g = rc ? NULL : acquire_task(c, pass);
    if (!rc && !(rc = feed_ones(r->g, roots, n)))
        rc = run_collecting(r->g, &r->rr);
    if (rc) {
        r->err = rc;
        snprintf(r->text, sizeof(r->text), "%s", sr_last_error());
    }
    if (sr__dist_root_hook)
        sr__dist_root_hook();
    root_wait(r); /* always waits: no RPC of this pass may outlive it */
    return 0;
}

int sr__dist_backward_async(int64_t context_id, sr_tensor *const *roots, size_t n, bool retain, sr_future **out)
{
    int rc = check_roots(roots, n);
    if (rc)
        return rc;
    sr_dctx *c = sr__dctx_find(context_id);
    if (!c)
        return sr__dctx_not_found("sr_dist_autograd_backward", context_id);
    sr_future *f = sr_future_new();
    rc = f ? root_start(c, roots, n, retain, f) : -ENOMEM;
    sr__dctx_unref(c);
    if (rc) {
        sr_future_unref(f);
        return rc;
    }
    *out = f;
    return 0;
}

SR_API int sr_dist_autograd_backward(int64_t context_id, sr_tensor *const *roots, size_t n, bool retain_graph)
{
    sr_future *f;
    int64_t t0 = sr__probing() ? sr_probe_now() : 0;
    int rc = sr__dist_backward_async(context_id, roots, n, retain_graph, &f);
    if (rc)
        return rc;
    rc = sr__module_wait(f, -1); /* every RPC of the pass has its own timeout */
    rc = rc ? rc : sr_future_value(f, NULL);
    sr_future_unref(f);
    if (t0)
        sr__probe_span("autograd", "dist_autograd:backward_pass", t0);
    return rc;
}
