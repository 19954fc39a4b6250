/* SPDX-License-Identifier: MIT */
/* Distributed backward, FAST mode.
 *
 * A pass has an id (a message id of the worker that roots it). On every
 * worker it reaches, the pass has one graph task in the context, made when
 * the pass first arrives there: its dependencies are computed from the roots
 * (on the root worker only) plus every send function of the context, each of
 * which waits for one gradient by RPC.
 *
 *   root       feed 1 to every root, run; the pass is over when the root
 *              disengages (below); then check that every send function of
 *              the context received its gradient.
 *   PROPAGATE  {msg_id, pass, retain, grads...} to the worker that made
 *              send function msg_id: feed it and run. It runs on an
 *              executor; no thread waits while gradients are on their way.
 *              One thread at a time runs a pass on a worker (the pass's
 *              *runner*, see "Runner" below): a PROPAGATE that arrives
 *              while it runs joins its queue instead of blocking a thread
 *              on the engine's task lock.
 *   RecvRpcBackward (run by the engine, on the thread that runs the graph)
 *              sends PROPAGATE to its peer, counted in the pass's state on
 *              this worker.
 *
 * When is a pass over? Dijkstra-Scholten termination detection. On each
 * worker, the pass has a state while the worker is *engaged* in it:
 *   - a PROPAGATE that finds the worker not engaged engages it and becomes
 *     its *parent*: its answer is deferred. Any other PROPAGATE of the pass
 *     is answered as soon as its own run ends here (with that run's error),
 *     without waiting for the requests the run sent: they are the state's;
 *   - `deficit` counts the requests the worker sent for the pass and that
 *     have not answered (queued ones count once sent), `active` the runs in
 *     progress; an answer records its error (the first one wins);
 *   - when active == 0, deficit == 0 and nothing is queued, the worker
 *     disengages: it answers its parent, with the first error it recorded,
 *     and frees the state. A later PROPAGATE engages it again.
 * The root is engaged from the start; its "parent" is the pass's own
 * completion.
 *
 * Up: a run's gradients for the worker's parent are held until the run
 * ends; a worker then idle but for them disengages at once, and its answer
 * carries them, counted in at the parent with the answer (see "Up" below).
 *
 * Why it is right: a worker engages only from a request of an engaged worker
 * (counted in the sender's deficit), so the engaged workers form a tree
 * rooted at the root, each holding the edge to its parent open. A worker
 * leaves the tree only when it has no work and no request outstanding, and
 * only then answers its parent, which until that answer is itself engaged.
 * So when the root disengages, every worker is idle and no gradient is in
 * flight: the pass is over everywhere, and a failed pass fails only after
 * all its RPCs answered (no stale gradient reaches the next pass in the same
 * context). A worker appears at most once in the tree, so each worker has at
 * most its parent call plus its own requests (at most WINDOW) open: a chain
 * of hops, however long, no longer nests one call per hop (with two workers
 * the tree has depth 2). A dead peer fails the RPC to it (-EPIPE), which is
 * an answer with an error: deficits still reach 0. Errors climb the tree of
 * parents to the root ("Error on Node N: ...", -EPIPE for a dead peer).
 *
 * Nothing waits on anything but answers, and the engine runs a task's ready
 * nodes on the thread that calls run, one run at a time (its task lock): no
 * run waits for a request, so no cycle of waits can form. (Waiting, in a
 * run, for whatever is outstanding in the context deadlocked: a PROPAGATE
 * served on the root could take the RPC the root's own run sent, whose
 * answer waited for that very PROPAGATE.)
 *
 * Runner. The engine runs a task under its lock, so two runs of one pass on
 * a worker never overlap anyway; what matters is who waits. A PROPAGATE that
 * finds the pass running here is appended to the pass state's queue (`jobs`)
 * and its thread goes back at once: on the polling thread, before any
 * executor is woken for it (sr__dist_serve_propagate), or in job_run. The
 * runner feeds and runs the queued requests one at a time, in arrival
 * order, answering each after its own run, until the queue is empty; then
 * it stops being the runner, under the same lock as the queue, so a request
 * either joins a runner that will run it or becomes the runner itself. A
 * pipeline stage thus runs micro-batch k + 1's backward on the thread that
 * ran k's, as soon as k's ends, with no thread handed the task lock, woken
 * or started per micro-batch. The queue only holds requests of a pass that
 * is running here, each counted active, so a runner that drains it does a
 * bounded amount of work: the pass's gradients for this worker's send
 * functions. The root's own run (root_start) is not a runner: it runs
 * on the caller's thread, which goes on to wait for the pass.
 *
 * Locks: begin_lock -> engine task lock -> context lock (context.h). The
 * pass states of a context and all their fields are guarded by the context
 * lock, which is never held across an RPC, a future's completion or a call
 * into the engine.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "error.h"
#include "module.h"

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

/* Test hooks (tests/dist_autograd/test_dist_autograd_core.c): gradient requests served
 * here so far, and a function the root calls between its run and its wait. */
_Atomic uint64_t sr__dist_propagates_served;
void (*sr__dist_root_hook)(void);

/* ---- the pass on this worker: termination detection ----
 *
 * Dijkstra-Scholten (see the top). The state of pass `id` on this worker,
 * `struct sr__dpass`, exists while the worker is engaged in the pass: made
 * by the first PROPAGATE that finds none (or by the root), it is in c's
 * list `engaged`, so that every later PROPAGATE of the pass finds it and
 * is answered without waiting; it goes when the worker has no run in
 * progress and no request unanswered or queued, and then answers `parent`.
 *
 * Pacing: a worker can have 65,536 calls in flight (sr__call_begin's
 * table). A pass keeps at most WINDOW of its gradient requests in flight
 * from each worker and queues the rest; each answer sends the next queued
 * one, on the thread that completes the answer's future (chaining, as
 * sr_rpc_async in a callback: no thread waits, nothing polls). After an
 * error the queued requests are dropped unsent (the pass fails anyway) and
 * the ones in flight are still awaited.
 *
 * Who touches what: every field of the state is guarded by its context's
 * lock (c->lock, taken last: lock order task -> context), and the lock is
 * never held across an RPC or a future's completion. A request belongs to
 * whoever took it off the queue (or made it) until it is sent. The thread
 * whose count makes the state idle takes it out of the list under the lock,
 * and only that thread answers the parent and frees it: exactly once. */
enum { WINDOW = 1024 };

struct job {
    struct job *next;  /* in its pass's queue (struct sr__dpass, jobs) */
    int caller;
    int64_t ctx_id;
    bool parent;       /* its call is the pass's parent here: answered when the worker disengages */
    sr_value *args;
    sr_future *done;   /* NULL: gradients an answer carried ("Up"): nobody to answer */
    struct sr__dpass *pass; /* "Up": its pass, which counts it active */
};

struct req {
    struct req *next;
    struct sr__dpass *pass;
    int peer;
    int64_t ctx_id;
    size_t n;
    sr_value **vals; /* [n], owned */
};

struct sr__dpass {
    struct sr__dpass *next;  /* c->engaged */
    sr_dctx *c;              /* a reference */
    int64_t id;              /* the pass */
    bool retain;
    sr_future *parent;       /* the deferred answer (a reference): the engaging call's, or the root's */
    size_t active;           /* runs of the pass in progress here */
    size_t deficit;          /* requests sent and not answered: at most WINDOW */
    struct req *head, *tail; /* queued, not sent */
    int err;                 /* the first error, local or from an answer */
    char *text;
    bool running;            /* a runner serves the pass's requests here (see "Runner") */
    struct job *jobs, *jobs_tail; /* requests waiting for the runner, each counted in active */
    int parent_rank;         /* the worker whose request engaged this one; -1: the root */
    struct req *up, *up_tail; /* the run's gradients for the parent, held until the run ends ("Up") */
    struct req *attach;      /* those the parent's answer carries (pass_end) */
};

/* The pass state of the run in progress on this thread (set around run). */
static _Thread_local struct sr__dpass *this_pass;

static void req_free(struct req *q)
{
    for (size_t i = 0; q && i < q->n; i++)
        sr_value_unref(q->vals[i]);
    if (q)
        free(q->vals);
    free(q);
}

/* Every request of the list q. */
static void reqs_free(struct req *q)
{
    for (struct req *next; q; q = next) {
        next = q->next;
        req_free(q);
    }
}

/* Under c->lock: record err (the first wins); after an error, drop what is
 * queued. */
static void note_error_locked(struct sr__dpass *p, int err, const char *text)
{
    if (err && !p->err) {
        p->err = err;
        p->text = strdup(text ? text : "");
    }
    while (p->err && p->head) {
        struct req *q = p->head;
        p->head = q->next;
        req_free(q);
    }
}

/* Under c->lock: the state of pass id on this worker, or NULL. */
static struct sr__dpass *pass_find_locked(sr_dctx *c, int64_t id)
{
    struct sr__dpass *p = c->engaged;
    while (p && p->id != id)
        p = p->next;
    return p;
}

/* Under c->lock: job j waits for p's runner (p->running), counted active. */
static void job_queue_locked(struct sr__dpass *p, struct job *j);

/* A run of pass `id` begins here, for the PROPAGATE answered by `call` (for
 * the root: its completion). Engages the worker if it was not: `call`
 * becomes the parent (*parent set), answered when the worker disengages;
 * otherwise the caller answers `call` once its run ends. NULL: out of
 * memory. For a PROPAGATE (j, its job; NULL for the root): if the pass has
 * a runner here, j joins its queue (*joined set) and the runner answers it;
 * otherwise the caller becomes the runner. */
static struct sr__dpass *pass_enter(sr_dctx *c, int64_t id, bool retain, sr_future *call, bool *parent,
                                    struct job *j, bool *joined)
{
    pthread_mutex_lock(&c->lock);
    struct sr__dpass *p = pass_find_locked(c, id);
    *parent = !p;
    if (!p && (p = calloc(1, sizeof(*p)))) {
        *p = (struct sr__dpass){.next = c->engaged, .c = sr__dctx_ref(c), .id = id, .retain = retain,
                                .parent = sr_future_ref(call), .parent_rank = j ? j->caller : -1};
        c->engaged = p;
    }
    *joined = p && j && p->running;
    if (*joined)
        job_queue_locked(p, j);
    else if (p)
        p->active++;
    if (p && j)
        p->running = true;
    pthread_mutex_unlock(&c->lock);
    return p;
}

/* Under c->lock: whether p is idle (no run, nothing in flight or queued);
 * if so it leaves c's list, and the caller must call pass_end. */
static bool pass_idle_locked(struct sr__dpass *p)
{
    if (p->active || p->deficit || p->head)
        return false;
    struct sr__dpass **at = &p->c->engaged;
    while (*at != p)
        at = &(*at)->next;
    *at = p->next;
    return true;
}

static sr_value *up_value(struct req *q);

/* The worker disengages from the pass: answer the parent (with the first
 * error, or with the gradients for it that the last run held, "Up") and
 * free the state. No one else holds p any more. */
static void pass_end(struct sr__dpass *p)
{
    sr_value *up = p->attach && !p->err ? up_value(p->attach) : NULL;
    if (p->attach && !p->err && !up)
        note_error_locked(p, -ENOMEM, "out of memory for the gradients that end a backward pass here"); /* p is ours alone */
    reqs_free(p->attach);
    if (p->err)
        sr__future_fail_text(p->parent, p->err, p->text);
    else
        sr_future_set_result(p->parent, up);
    sr_value_unref(up);
    sr_future_unref(p->parent);
    sr__dctx_unref(p->c);
    free(p->text);
    free(p);
}

/* A run of p ended (err: its error, 0 for none). */
static void pass_leave(struct sr__dpass *p, int err, const char *text)
{
    pthread_mutex_lock(&p->c->lock);
    note_error_locked(p, err, text);
    p->active--;
    bool idle = pass_idle_locked(p);
    pthread_mutex_unlock(&p->c->lock);
    if (idle)
        pass_end(p);
}

static struct req *up_answered(struct sr__dpass *p, int err, const char *text, sr_value *up);

/* One request of p answered (err: its error, 0 for none). Returns the next
 * queued request, now counted in flight, for the caller to send; ends p if
 * it is idle now. */
static struct req *req_answered(struct sr__dpass *p, int err, const char *text)
{
    return up_answered(p, err, text, NULL);
}

static void req_pump(struct req *q);

static void req_on_answer(sr_future *f, void *p)
{
    sr_value *up = NULL;
    int rc = sr_future_value(f, &up);
    req_pump(up_answered(p, rc, rc ? sr_last_error() : NULL, up));
    sr_value_unref(up);
}

static void req_on_drop(void *p)
{
    req_pump(req_answered(p, -SR_ESHUTDOWN, "the RPC layer shut down during a backward pass"));
}

/* Send q (consumed); its answer comes to req_on_answer. 0 or -errno. */
static int req_send(struct req *q)
{
    struct sr__dpass *p = q->pass;
    sr_future *f = NULL;
    int rc = sr__module_rpc(q->peer, sr__dist_module, SR_DA_PROPAGATE, (uint64_t)q->ctx_id,
                            (sr_args){q->n, q->vals}, sr__rpc_default_timeout_ms(), &f, "sr_dist_autograd_backward");
    req_free(q);
    if (!rc && sr__future_on_done(f, req_on_answer, req_on_drop, p))
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
        struct sr__dpass *p = q->pass;
        int rc = req_send(q);
        if (rc) {
            struct req *next = req_answered(p, rc, sr_last_error());
            if (next) {
                next->next = pump_list;
                pump_list = next;
            }
        }
    }
    pumping = false;
}

/* q at the end of the list head..tail (the tail is valid while the list is
 * not empty). Under c->lock for the pass's lists. */
static void reqs_append(struct req **head, struct req **tail, struct req *q)
{
    q->next = NULL;
    if (*head)
        (*tail)->next = q;
    else
        *head = q;
    *tail = q;
}

/* A gradient request of the run in progress on this thread (q consumed):
 * sent now if the window allows, else queued. A send that fails now fails
 * the run (returned), as any node's error does. The run is active, so p
 * stays engaged meanwhile. */
static int run_submit(struct req *q)
{
    struct sr__dpass *p = q->pass;
    pthread_mutex_lock(&p->c->lock);
    bool failed = p->err != 0, now = !failed && p->deficit < WINDOW;
    p->deficit += now;
    if (!failed && !now)
        reqs_append(&p->head, &p->tail, q);
    pthread_mutex_unlock(&p->c->lock);
    if (failed) /* the pass failed: nothing more is sent */
        req_free(q);
    if (!now)
        return 0;
    int rc = req_send(q);
    if (rc)
        req_pump(req_answered(p, 0, NULL)); /* counted; the error goes back to the engine */
    return rc;
}

/* Run g, its gradient requests counted in p. */
static int run_counted(sr_graph_task *g, struct sr__dpass *p)
{
    struct sr__dpass *outer = this_pass;
    this_pass = p;
    int rc = sr__graph_task_run(g);
    this_pass = outer;
    return rc;
}

/* ---- Up: the gradients for the parent ride on the answer that disengages ----
 *
 * A run's gradients for the worker that engaged this one (its parent) are
 * held in the pass state until the run ends (up_hold). If the worker is
 * then idle but for them, it disengages at once, and its answer to the
 * parent carries them (pass_end, up_value): the parent counts them active
 * as it counts the answer in (up_answered), in one step under its lock, and
 * runs them as its own requests. One message instead of three: the
 * request, its answer, and the answer that disengages; and no order of
 * delivery is assumed, as that one message carries both. Otherwise
 * (another run, a request in flight or queued) they go as requests now,
 * paced as any (up_release_locked). After an error they are dropped, as
 * queued requests are. */

/* q (consumed) is for p's parent: hold it until the run ends. False if it
 * is not (the caller sends it). */
static bool up_hold(struct req *q)
{
    struct sr__dpass *p = q->pass;
    if (q->peer != p->parent_rank)
        return false;
    pthread_mutex_lock(&p->c->lock);
    bool failed = p->err != 0;
    if (!failed)
        reqs_append(&p->up, &p->up_tail, q);
    pthread_mutex_unlock(&p->c->lock);
    if (failed) /* the pass failed: nothing more is sent */
        req_free(q);
    return true;
}

/* Under c->lock, as a run of p ends (counted out): what its held gradients
 * become. Attached to the disengaging answer if p is idle but for them;
 * dropped after an error; else each counted in flight or queued, as
 * run_submit does, and the ones in flight returned for the caller to send. */
static struct req *up_release_locked(struct sr__dpass *p)
{
    struct req *up = p->up, *now = NULL, **at = &now;
    p->up = p->up_tail = NULL;
    if (up && p->err) {
        reqs_free(up);
    } else if (up && !p->active && !p->deficit && !p->head) {
        p->attach = up; /* pass_idle_locked: true; pass_end answers with them */
    } else {
        for (struct req *next; up; up = next) {
            next = up->next;
            up->next = NULL;
            if (p->deficit < WINDOW && !p->head) {
                p->deficit++;
                *at = up;
                at = &up->next;
            } else {
                reqs_append(&p->head, &p->tail, up);
            }
        }
    }
    return now;
}

/* The answer's value: one list per request, as a request's arguments. */
static sr_value *up_value(struct req *q)
{
    size_t n = 0;
    for (struct req *r = q; r; r = r->next)
        n++;
    sr_value **items = calloc(n, sizeof(*items));
    for (size_t i = 0; items && q; q = q->next, i++)
        if (!(items[i] = sr_list(q->n, q->vals)))
            break;
    sr_value *v = items && (!n || items[n - 1]) ? sr_list(n, items) : NULL;
    for (size_t i = 0; items && i < n; i++)
        sr_value_unref(items[i]);
    free(items);
    return v;
}

/* ---- sending gradients (RecvRpcBackward) ---- */

int sr__dist_send_grads(int64_t ctx_id, int64_t msg_id, int peer, sr_tensor *const *grads, size_t n)
{
    struct sr__dpass *p = this_pass;
    if (!p)
        return sr__fail(-EINVAL, "sr_dist_autograd_backward", "a RecvRpcBackward ran outside a backward run");
    struct req *q = calloc(1, sizeof(*q));
    sr_value **vals = q ? calloc(n + 3, sizeof(*vals)) : NULL;
    if (!vals) {
        free(q);
        return sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
    }
    *q = (struct req){.pass = p, .peer = peer, .ctx_id = ctx_id, .n = n + 3, .vals = vals};
    vals[0] = sr_int(msg_id);
    vals[1] = sr_int(p->id);     /* id and retain are fixed while p lives */
    vals[2] = sr_bool(p->retain);
    for (size_t i = 0; i < n; i++)
        vals[3 + i] = grads[i] ? sr_value_from_tensor(grads[i]) : sr_none();
    for (size_t i = 0; i < n + 3; i++) {
        if (!vals[i]) {
            req_free(q);
            return sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
        }
    }
    return up_hold(q) ? 0 : run_submit(q);
}

/* ---- PROPAGATE: gradients for one of our send functions ---- */


/* Test hook (tests/dist_autograd/test_dist_autograd_core.c): requests that
 * joined a running pass's queue instead of running themselves. */
_Atomic uint64_t sr__dist_propagates_joined;

/* Under c->lock: j waits for p's runner, counted active. */
static void job_append_locked(struct sr__dpass *p, struct job *j)
{
    j->next = NULL;
    j->parent = false; /* the pass was engaged before it: its parent is another call */
    if (p->jobs)
        p->jobs_tail->next = j;
    else
        p->jobs = j;
    p->jobs_tail = j;
    p->active++;
}

static void job_queue_locked(struct sr__dpass *p, struct job *j)
{
    job_append_locked(p, j);
    atomic_fetch_add_explicit(&sr__dist_propagates_joined, 1, memory_order_release); /* pairs with the test's acquire */
}

static void job_free(struct job *j)
{
    sr_value_unref(j->args);
    sr_future_unref(j->done);
    free(j);
}

/* Every job of the list j (Up jobs that will not run). */
static void jobs_free(struct job *j)
{
    for (struct job *next; j; j = next) {
        next = j->next;
        job_free(j);
    }
}

static int node_error(int err, const char *text, char *buf, size_t len)
{
    snprintf(buf, len, "Error on Node %d: %s", sr__rpc_rank(), text);
    return err == -EPIPE || err == -ETIMEDOUT ? err : -SR_EREMOTE;
}

/* Feed send function msg_id of pass p and run, counting the run's RPCs in p. */
static int run_send_fn(sr_dctx *c, int64_t msg_id, struct sr__dpass *p, sr_value *args)
{
    int rc = begin_pass(c, p->id, p->retain, NULL, 0);
    sr_graph_task *g = rc ? NULL : acquire_task(c, p->id);
    sr_node *fn = sr__dctx_send_fn(c, msg_id);
    size_t n = sr_value_list_len(args) - 3;
    if (!rc && !g)
        rc = sr__fail(-EINVAL, "sr_dist_autograd_backward", "pass %lld was overtaken by another", (long long)p->id);
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
        rc = run_counted(g, p);
    if (g)
        release_task(c);
    free(grads);
    sr__node_unref(fn);
    return rc;
}

static bool well_formed(sr_value *a)
{
    return sr_value_list_len(a) >= 3 && sr_value_type(sr_value_list_at(a, 0)) == SR_KIND_INT &&
           sr_value_type(sr_value_list_at(a, 1)) == SR_KIND_INT;
}

/* Answer j's call now unless it is the parent (answered when the worker
 * disengages), with its run's error: the requests the run sent are the
 * pass's, awaited by the parent. */
static void job_answer(struct job *j, int err, const char *text)
{
    if (j->parent || !j->done) /* an Up job's error is the pass's (runner_next) */
        return;
    if (err)
        sr__future_fail_text(j->done, err, text);
    else
        sr_future_set_result(j->done, NULL);
}

/* j's run ended with err: count it out of p, and take the next queued job,
 * or stop being p's runner if there is none, in one step under the lock
 * (see "Runner"). Ends p if it is idle now. */
static struct job *runner_next(struct sr__dpass *p, int err, const char *text)
{
    pthread_mutex_lock(&p->c->lock);
    note_error_locked(p, err, text);
    p->active--;
    struct job *next = p->jobs;
    if (next)
        p->jobs = next->next;
    else
        p->running = false;
    struct req *send = up_release_locked(p); /* the run's gradients for the parent */
    bool idle = pass_idle_locked(p); /* false while next is queued: it is counted active */
    pthread_mutex_unlock(&p->c->lock);
    while (send) {
        struct req *q = send;
        send = q->next;
        req_pump(q);
    }
    if (idle)
        pass_end(p); /* with them, when they end the pass here */
    return next;
}

/* p's runner: run j, then every request queued meanwhile, one at a time in
 * arrival order, each answered after its own run. */
static void runner(sr_dctx *c, struct sr__dpass *p, struct job *j)
{
    while (j) {
        char text[1024] = "";
        int err = run_send_fn(c, sr_value_int(sr_value_list_at(j->args, 0)), p, j->args);
        if (err)
            err = node_error(err, sr_last_error(), text, sizeof(text));
        job_answer(j, err, text);
        struct job *next = runner_next(p, err, text); /* may end the pass here: answers the parent */
        atomic_fetch_add_explicit(&sr__dist_propagates_served, 1, memory_order_release); /* pairs with the test's acquire */
        job_free(j);
        j = next;
    }
}

/* Test hook (tests/dist_autograd/test_dist_autograd_core.c): gradients that
 * came with an answer ("Up") rather than in a request of their own. */
_Atomic uint64_t sr__dist_gradients_carried;

/* An Up job: a gradient an answer carried, counted active in its pass. */
static void up_run(void *arg)
{
    struct job *j = arg;
    runner(j->pass->c, j->pass, j);
}

/* The Up jobs of answer value up (NULL: none, or *err set). */
static struct job *up_jobs(struct sr__dpass *p, sr_value *up, int *err, const char **why)
{
    struct job *head = NULL, **at = &head;
    size_t n = sr_value_type(up) == SR_KIND_LIST ? sr_value_list_len(up) : 0;
    for (size_t i = 0; i < n && !*err; i++) {
        sr_value *a = sr_value_list_at(up, i);
        bool ok = well_formed(a) && sr_value_int(sr_value_list_at(a, 1)) == p->id; /* of this pass */
        struct job *j = ok ? malloc(sizeof(*j)) : NULL;
        if (!j) {
            *err = ok ? -ENOMEM : -EBADMSG;
            *why = ok ? "out of memory" : "a malformed gradient in an answer, or another pass's";
            break;
        }
        *j = (struct job){.caller = -1, .ctx_id = p->c->id, .args = sr_value_ref(a), .pass = p};
        *at = j;
        at = &j->next;
    }
    if (*err)
        jobs_free(head);
    return *err ? NULL : head;
}

/* One request of p answered (err: its error, 0 for none), its value up
 * carrying the gradients of a child that disengaged ("Up"): they are
 * counted active before the answer is counted out, so p stays engaged, and
 * join p's runner or start one. Returns the next queued request, now
 * counted in flight, for the caller to send; ends p if it is idle now. */
static struct req *up_answered(struct sr__dpass *p, int err, const char *text, sr_value *up)
{
    const char *why = NULL;
    int bad = 0;
    struct job *jobs = !err && up ? up_jobs(p, up, &bad, &why) : NULL, *start = NULL;
    pthread_mutex_lock(&p->c->lock);
    note_error_locked(p, err ? err : bad, err ? text : why);
    p->deficit--;
    while (jobs && !p->err) {
        struct job *j = jobs;
        jobs = j->next;
        atomic_fetch_add_explicit(&sr__dist_gradients_carried, 1, memory_order_relaxed); /* relaxed: a count the test reads after the pass */
        if (!p->running) { /* the first becomes the runner; the others wait for it */
            p->running = true;
            p->active++;
            start = j;
        } else {
            job_append_locked(p, j);
        }
    }
    struct req *next = p->head;
    if (next) {
        p->head = next->next;
        p->deficit++;
    }
    bool idle = pass_idle_locked(p);
    pthread_mutex_unlock(&p->c->lock);
    jobs_free(jobs); /* the pass failed: not run */
    if (start && sr__exec_submit(up_run, start))
        up_run(start); /* no executor (shutting down): here, as a runner anyway */
    if (idle)
        pass_end(p);
    return next;
}

/* Serve one PROPAGATE: enter the pass (engaging this worker if it was not:
 * then this call is the parent, answered when the worker disengages), then
 * join the pass's runner or become it. */
static void job_run(void *arg)
{
    struct job *j = arg;
    char text[1024] = "";
    bool joined = false;
    struct sr__dpass *p = NULL;
    sr_dctx *c = sr__dctx_find(j->ctx_id);
    sr_value *a = j->args;
    /* a context that involved a worker that died since: its death (sr__dctx_peer_died) */
    int err = c ? sr__dctx_check_alive(c, "sr_dist_autograd_backward")
                : sr__dctx_not_found("sr_dist_autograd_backward", j->ctx_id);
    if (!err && !well_formed(a))
        err = sr__fail(-EBADMSG, "sr_dist_autograd_backward", "a malformed gradient message from worker%d", j->caller);
    else if (!err && !(p = pass_enter(c, sr_value_int(sr_value_list_at(a, 1)), sr_value_bool(sr_value_list_at(a, 2)),
                                      j->done, &j->parent, j, &joined)))
        err = sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
    if (err) { /* no pass entered: answered now */
        err = node_error(err, sr_last_error(), text, sizeof(text));
        j->parent = false;
        job_answer(j, err, text);
        atomic_fetch_add_explicit(&sr__dist_propagates_served, 1, memory_order_release); /* pairs with the test's acquire */
        job_free(j);
    } else if (!joined) {
        runner(c, p, j);
    }
    sr__dctx_unref(c);
}

/* On the polling thread: j joins the queue of its pass if the pass has a
 * runner here, so that no executor is woken for it; false otherwise (or if
 * anything is amiss: job_run then says what). */
static bool join_running(struct job *j)
{
    if (!well_formed(j->args))
        return false;
    sr_dctx *c = sr__dctx_find(j->ctx_id);
    if (!c)
        return false;
    pthread_mutex_lock(&c->lock);
    struct sr__dpass *p = c->dead_err ? NULL : pass_find_locked(c, sr_value_int(sr_value_list_at(j->args, 1)));
    bool joined = p && p->running;
    if (joined)
        job_queue_locked(p, j);
    pthread_mutex_unlock(&c->lock);
    sr__dctx_unref(c);
    return joined;
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
    int rc = join_running(j) ? 0 : sr__exec_submit(job_run, j);
    if (rc) {
        job_free(j);
        sr_future_unref(f);
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
 * compute: the root is engaged in the pass from the start, its parent being
 * `all`, which completes when this worker disengages, i.e. when every
 * worker the pass reached is idle with nothing in flight (see the top);
 * then check the send functions. */
struct root {
    sr_dctx *c;
    sr_graph_task *g;
    sr_future *all;   /* the root's parent: completes when the pass is over */
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

/* The root's run ended: the pass ends when the root disengages. */
static void root_wait(struct root *r, struct sr__dpass *p)
{
    sr_future *all = r->all;
    if (!p) { /* out of memory before the run: nothing was sent */
        sr_future_unref(all);
        root_finish(r);
        return;
    }
    pass_leave(p, 0, NULL); /* the root's own error is r->err */
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
    int64_t pass;
    bool engaged;
    struct sr__dpass *p = NULL;
    int rc = r->all ? sr__dctx_next_message_id(&pass) : sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
    bool joined;
    if (!rc && !(p = pass_enter(c, pass, retain, r->all, &engaged, NULL, &joined))) /* a new id: engaged, parent `all` */
        rc = sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
    if (!rc)
        rc = begin_pass(c, pass, retain, roots, n);
    r->g = rc ? NULL : acquire_task(c, pass);
    if (!rc && !(rc = feed_ones(r->g, roots, n)))
        rc = run_counted(r->g, p);
    if (rc) {
        r->err = rc;
        snprintf(r->text, sizeof(r->text), "%s", sr_last_error());
    }
    if (sr__dist_root_hook)
        sr__dist_root_hook();
    root_wait(r, p); /* always waits: no RPC of this pass may outlive it */
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
    if ((rc = sr__dctx_check_alive(c, "sr_dist_autograd_backward"))) {
        sr__dctx_unref(c);
        return rc;
    }
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
    int64_t t0 = sr__probing() ? sr__probe_now() : 0;
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
