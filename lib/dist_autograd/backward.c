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
 *
 * A run paces its requests (below, "the RPCs of one run"), so one run may
 * send any number of them. Known limit: each hop of a chain is a request
 * awaited by the run before it, so a chain holds one call per hop on each
 * worker until the pass ends, and a chain deeper than a worker's call table
 * (65,536) fails when the table is full.
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

/* ---- the RPCs of one run, paced ----
 *
 * A run may reach more RecvRpcBackward nodes than calls can be in flight
 * from one worker (the slot table of sr__call_begin, 65,536): it keeps at
 * most RUN_WINDOW of its gradient requests in flight and queues the rest;
 * each answer sends the next queued one, on the thread that completes the
 * answer's future (chaining, as sr_rpc_async in a callback: no thread waits,
 * nothing polls). The window belongs to the run, so a run never waits for
 * another run's requests (the waits still follow the gradients: see the
 * top). `done` completes once the run ended (run_end) and every request it
 * made was answered; after an error the queued requests are dropped unsent
 * (the pass fails anyway) and the ones in flight are still awaited.
 *
 * Who touches what: the fields under `lock`; a request belongs to whoever
 * took it off the queue (or made it) until it is sent; the last count
 * (open reaching 0) finishes and frees the run, exactly once. */
enum { RUN_WINDOW = 1024 };

struct req {
    struct req *next;
    struct run *run;
    int peer;
    int64_t ctx_id;
    size_t n;
    sr_value **vals; /* [n], owned */
};

struct run {
    pthread_mutex_t lock;
    size_t inflight;         /* sent and not answered: at most RUN_WINDOW */
    size_t open;             /* requests not answered (queued too), + 1 until run_end */
    struct req *head, *tail; /* queued, not sent */
    int err;                 /* the first error */
    char *text;
    sr_future *done;
};

/* The run this thread is in (set around feed + run). */
static _Thread_local struct run *this_run;

static struct run *run_new(sr_future *done)
{
    struct run *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    pthread_mutex_init(&r->lock, NULL);
    r->open = 1;
    r->done = sr_future_ref(done);
    return r;
}

static void req_free(struct req *q)
{
    for (size_t i = 0; q && i < q->n; i++)
        sr_value_unref(q->vals[i]);
    if (q)
        free(q->vals);
    free(q);
}

static void run_finish(struct run *r)
{
    if (r->err)
        sr__future_fail_text(r->done, r->err, r->text);
    else
        sr_future_set_result(r->done, NULL);
    sr_future_unref(r->done);
    free(r->text);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

/* Under r->lock: record err (the first wins); after an error, drop what is
 * queued. */
static void note_error_locked(struct run *r, int err, const char *text)
{
    if (err && !r->err) {
        r->err = err;
        r->text = strdup(text ? text : "");
    }
    while (r->err && r->head) {
        struct req *q = r->head;
        r->head = q->next;
        r->open--;
        req_free(q);
    }
}

/* One request of r answered (err: its error, 0 for none). Returns the next
 * queued request, now counted in flight, for the caller to send; frees r
 * if that was the last count. */
static struct req *req_answered(struct run *r, int err, const char *text)
{
    pthread_mutex_lock(&r->lock);
    note_error_locked(r, err, text);
    r->inflight--;
    r->open--;
    struct req *next = r->head;
    if (next) {
        r->head = next->next;
        r->inflight++;
    }
    bool last = r->open == 0;
    pthread_mutex_unlock(&r->lock);
    if (last)
        run_finish(r);
    return next;
}

static void req_pump(struct req *q);

static void req_on_answer(sr_future *f, void *p)
{
    int rc = sr_future_value(f, NULL);
    req_pump(req_answered(p, rc, rc ? sr_last_error() : NULL));
}

static void req_on_drop(void *p)
{
    req_pump(req_answered(p, -SR_ESHUTDOWN, "the RPC layer shut down during a backward pass"));
}

/* Send q (consumed); its answer comes to req_on_answer. 0 or -errno. */
static int req_send(struct req *q)
{
    struct run *r = q->run;
    sr_future *f = NULL;
    int rc = sr__module_rpc(q->peer, SR_MOD_DIST_AUTOGRAD, SR_DA_PROPAGATE, (uint64_t)q->ctx_id,
                            (sr_args){q->n, q->vals}, sr__rpc_default_timeout_ms(), &f);
    req_free(q);
    if (!rc && sr__future_on_done(f, req_on_answer, req_on_drop, r))
        rc = sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory"); /* its answer is dropped */
    sr_future_unref(f);
    return rc;
}

/* Send queued requests, starting with q (may be NULL), from an answer's
 * thread. Iterative: an answer that completes at once (inside
 * sr__future_on_done) hands its successor to the loop already running on
 * this thread instead of recursing. */
static _Thread_local struct req *pump_list;
static _Thread_local bool pumping;

static void req_pump(struct req *q)
{
    if (q) {
        q->next = pump_list;
        pump_list = q;
    }
    if (pumping)
        return;
    pumping = true;
    while ((q = pump_list)) {
        pump_list = q->next;
        struct run *r = q->run;
        int rc = req_send(q);
        if (rc) {
            struct req *next = req_answered(r, rc, sr_last_error());
            if (next) {
                next->next = pump_list;
                pump_list = next;
            }
        }
    }
    pumping = false;
}

/* A gradient request of the run in progress on this thread (q consumed):
 * sent now if the window allows, else queued. A send that fails now fails
 * the run (returned), as any node's error does. */
static int run_submit(struct req *q)
{
    struct run *r = q->run;
    pthread_mutex_lock(&r->lock);
    bool failed = r->err != 0, now = !failed && r->inflight < RUN_WINDOW;
    if (!failed) {
        r->open++;
        r->inflight += now;
        if (!now) {
            q->next = NULL;
            if (r->head) /* tail is valid while the queue is not empty */
                r->tail->next = q;
            else
                r->head = q;
            r->tail = q;
        }
    }
    pthread_mutex_unlock(&r->lock);
    if (failed) /* an answer failed the pass: nothing more is sent */
        req_free(q);
    if (!now)
        return 0;
    int rc = req_send(q);
    if (rc)
        req_pump(req_answered(r, 0, NULL)); /* counted; the error goes back to the engine */
    return rc;
}

/* The run ended (err: its own error, 0 for none): done completes once
 * every request it made was answered. */
static void run_end(struct run *r, int err, const char *text)
{
    pthread_mutex_lock(&r->lock);
    note_error_locked(r, err, text);
    bool last = --r->open == 0;
    pthread_mutex_unlock(&r->lock);
    if (last)
        run_finish(r);
}

/* Run g, its gradient requests going through run. */
static int run_collecting(sr_graph_task *g, struct run *run)
{
    struct run *outer = this_run;
    this_run = run;
    int rc = sr__graph_task_run(g);
    this_run = outer;
    return rc;
}

/* ---- sending gradients (RecvRpcBackward) ---- */

int sr__dist_send_grads(int64_t ctx_id, int64_t msg_id, int peer, sr_tensor *const *grads, size_t n)
{
    if (!this_run)
        return sr__fail(-EINVAL, "sr_dist_autograd_backward", "a RecvRpcBackward ran outside a backward run");
    sr_dctx *c = sr__dctx_find(ctx_id);
    if (!c)
        return sr__dctx_not_found("sr_dist_autograd_backward", ctx_id);
    pthread_mutex_lock(&c->lock);
    int64_t pass = c->pass;
    bool retain = c->retain;
    pthread_mutex_unlock(&c->lock);
    sr__dctx_unref(c);
    struct req *q = calloc(1, sizeof(*q));
    sr_value **vals = q ? calloc(n + 3, sizeof(*vals)) : NULL;
    if (!vals) {
        free(q);
        return sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
    }
    *q = (struct req){.run = this_run, .peer = peer, .ctx_id = ctx_id, .n = n + 3, .vals = vals};
    vals[0] = sr_int(msg_id);
    vals[1] = sr_int(pass);
    vals[2] = sr_bool(retain);
    for (size_t i = 0; i < n; i++)
        vals[3 + i] = grads[i] ? sr_tensor_value(grads[i]) : sr_none();
    for (size_t i = 0; i < n + 3; i++) {
        if (!vals[i]) {
            req_free(q);
            return sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
        }
    }
    return run_submit(q);
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
static int run_send_fn(sr_dctx *c, int64_t msg_id, int64_t pass, bool retain, sr_value *args, struct run *run)
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
        rc = run_collecting(g, run);
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
    struct run *run = run_new(j->done);
    sr_dctx *c = sr__dctx_find(j->ctx_id);
    sr_value *a = j->args;
    bool well_formed = sr_value_list_len(a) >= 3 && sr_value_type(sr_value_list_at(a, 0)) == SR_KIND_INT &&
                       sr_value_type(sr_value_list_at(a, 1)) == SR_KIND_INT;
    if (!run)
        err = sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
    else if (!c)
        err = sr__dctx_not_found("sr_dist_autograd_backward", j->ctx_id);
    else if (!well_formed)
        err = sr__fail(-EBADMSG, "sr_dist_autograd_backward", "a malformed gradient message from worker%d", j->caller);
    else
        err = run_send_fn(c, sr_value_int(sr_value_list_at(a, 0)), sr_value_int(sr_value_list_at(a, 1)),
                          sr_value_bool(sr_value_list_at(a, 2)), a, run);
    if (err)
        err = node_error(err, sr_last_error(), text, sizeof(text));
    if (run)
        run_end(run, err, text); /* answers once this run's RPCs have: see the top */
    else
        sr__future_fail_text(j->done, err, text);
    atomic_fetch_add_explicit(&sr__dist_propagates_served, 1, memory_order_release); /* pairs with the test's acquire */
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
    struct run *run;  /* the root's run: its RPCs complete `all` */
    sr_future *all;
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
    sr_future *all = r->all;
    if (!r->run) { /* out of memory before the run: nothing was sent */
        sr_future_unref(all);
        root_finish(r);
        return;
    }
    run_end(r->run, 0, NULL); /* the root's own error is r->err */
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
    r->all = sr_future_new();
    r->run = r->all ? run_new(r->all) : NULL;
    int64_t pass;
    int rc = r->run ? sr__dctx_next_message_id(&pass) : sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
    if (!rc)
        rc = begin_pass(c, pass, retain, roots, n);
    r->g = rc ? NULL : acquire_task(c, pass);
    if (!rc && !(rc = feed_ones(r->g, roots, n)))
        rc = run_collecting(r->g, r->run);
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
