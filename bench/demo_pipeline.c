/* SPDX-License-Identifier: MIT */
/* Demo: pipeline parallelism over RPC, the pattern of PyTorch's tutorial
 * "Distributed Pipeline Parallelism Using RPC", on Fashion-MNIST.
 *
 *   shmrun -n 3 ./demo_pipeline [options]     (1 master + 2 stage workers)
 *
 * The model is a CNN, Conv2d(1, 32, 3, p 1)-LayerNorm-ReLU-MaxPool2d(2)-
 * Conv2d(32, 64, 3, p 1)-LayerNorm-ReLU-MaxPool2d(2)-Flatten-Linear(3136, 10),
 * split into --stages consecutive layer ranges (2 to 4; by default one per
 * worker). Worker s mod W + 1 of the W stage workers holds stage s
 * (0-based): the master creates it there with sr_remote(), so the stage is
 * an object its worker owns and the master holds through an RRef. With
 * more stages than workers a worker holds several, not consecutive ones
 * (3 stages on 2 workers: worker 1 holds the first and the last, worker 2
 * the middle one), which balances a model whose costly layer cannot be
 * cut: the interleaved placement of pipeline schedules that give a device
 * several model chunks (docs/PERFORMANCE.md, "Three stages on two
 * workers"). Every
 * stage builds the whole model from the one seed (the same initial weights
 * as an unsplit model) and keeps its own layer range.
 *
 * Rank 0, the master, holds the data. For each batch it begins a distributed
 * autograd context and cuts the batch into --splits micro-batches; for each
 * one it chains remote() calls through the stages (stage s's output stays on
 * its worker as an RRef, whose value stage s + 1 fetches) and ends with an
 * rpc_async to the last stage. Nothing waits between micro-batches, so while
 * stage 2 runs micro-batch k, stage 1 runs micro-batch k + 1. The
 * master joins the outputs in order, computes the cross-entropy, runs the
 * distributed backward (through every stage) and steps a DistributedOptimizer
 * (Adam) over the stages' parameter RRefs.
 *
 * It prints progress, the test accuracy on the 10k test images (through the
 * same pipeline, no grad), the time and samples/s, and writes the loss curve
 * (SVG). --checkpoint-dir saves the parameters (fetched from the stages with
 * their module state), each stage's Adam state and the position every
 * --save-every steps; --resume sends them back (each stage loads its own
 * layers by name) and continues: the same steps as an uninterrupted run.
 * With one micro-batch it ends with the same parameters, bit for bit
 * (tests/e2e/test_pipeline.c); with several, a stage sums the
 * micro-batches' gradients in the order their backward messages arrive, so
 * any two runs, resumed or not, differ in the last bits.
 *
 * --local trains the same model in this one process instead, without RPC
 * (run it without shmrun): the whole model, a local Adam, the batch in one
 * piece, the same data order and the same output. It is the baseline of a
 * step's overhead (bench/pipeline_compare.sh), so it is a one-worker job
 * (sr_init) whose tensors come from the shared heap, as the stages' do.
 *
 * A stage's forward is an async function (pp_forward) run by its worker's
 * one forward thread (runner_main), shared by the stages the worker holds.
 * PyTorch's tutorial runs each micro-batch's
 * call on a thread of the RPC pool that blocks in to_here and then on the
 * stage's lock; here the call only queues its micro-batch (after an async
 * fetch of its input: pp_value on the owner, inside the call's distributed
 * autograd context, so the fetch's send and recv are recorded as
 * to_here's are), and the stage's thread runs the queue in order and
 * answers each call as soon as its forward is done. No thread per
 * micro-batch is woken or parked, and no answer waits while the thread a
 * lock hand-off woke runs the next micro-batch (docs/PERFORMANCE.md, "The
 * stage's forward on a thread of its own").
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "demo_cli.h"
#include "loss_svg.h"
#include "shmrpc/shmrpc.h"

#define MAX_STAGES 4
#define MAX_SPLITS 64
#define NLAYERS 10
#define CKPT_NAME "pipeline.ckpt"
#define STAGE_TYPE "pp_stage"

/* Layer ranges of each split: stage s runs layers [BOUNDS[S][s], BOUNDS[S][s + 1]).
 * Balanced by each range's forward + backward time (batch 64, one thread;
 * docs/PERFORMANCE.md, "Pipeline parallelism: the baseline and the stage
 * bounds"): the second convolution (layer 4) alone is about half of the
 * step and cannot be cut, so it sets the slowest stage. With 2 stages the
 * cut goes before it (layers 0..3 are about 40 % of the step, 4..9 60 %;
 * after it, 0..4 would be 90 %); with 3 and 4 it has a stage of its own, and
 * the layers before it are cut in two with 4. */
static const int BOUNDS[MAX_STAGES + 1][MAX_STAGES + 1] = {
    [1] = {0, NLAYERS}, [2] = {0, 4, NLAYERS}, [3] = {0, 4, 5, NLAYERS}, [4] = {0, 2, 4, 5, NLAYERS}};

static int model_create(uint64_t seed, sr_module **m)
{
    static const sr_layer_spec layers[NLAYERS] = {
        SR_CONV2D(1, 32, 3, 1, 1),  SR_LAYER_NORM_CHW(32, 28, 28), SR_RELU(), SR_MAX_POOL2D(2, 2),
        SR_CONV2D(32, 64, 3, 1, 1), SR_LAYER_NORM_CHW(64, 14, 14), SR_RELU(), SR_MAX_POOL2D(2, 2),
        SR_FLATTEN(),               SR_LINEAR(3136, 10)};
    sr_generator g;
    sr_generator_init(&g, seed);
    return sr_sequential_create(layers, NLAYERS, SR_F32, &g, m);
}

static struct opts {
    int epochs, stages, workers, splits;
    int64_t batch, save_every, limit, test_limit, warmup;
    double lr;
    uint64_t seed;
    const char *ckpt_dir, *plot, *data;
    bool resume, local;
} opt = {.epochs = 2, .splits = 4, .batch = 64, .lr = 1e-3, .plot = "pipeline_loss.svg"};

/* The worker that holds stage s (0-based): round robin over the workers,
 * so with more stages than workers a worker holds stages s and s + W. */
static int stage_worker(int s)
{
    return s % opt.workers + 1;
}

/* s is the first stage its worker holds: the one whose calls carry the
 * worker's optimizer state in checkpoints. */
static bool first_on_worker(int s)
{
    return s < opt.workers;
}

static int fail(int rc, const char *what)
{
    fprintf(stderr, "demo_pipeline: worker%d: %s: %s\n", sr_rank(), what, sr_last_error());
    return rc ? rc : -EINVAL;
}

/* ============================ a stage (ranks 1..S) ========================= */

struct stage;

/* A micro-batch's forward, queued for its worker's runner (which frees it). */
struct fwd_job {
    struct fwd_job *next;
    struct stage *st; /* alive while the job is: its call holds the stage's value */
    sr_future *done;  /* the call's answer: one reference, the job's */
    sr_value *in;     /* the input tensor (value), once it is here */
    bool train;
};

/* The worker's one thread for its stages' forwards: a worker that holds
 * several stages (--stages above the workers) runs them one at a time, in
 * the order their inputs come, as one device would.
 * Lifetime: made by the first stage (runner_get), destroyed when the last
 * stage goes (runner_put: it joins the thread, or, if the runner's thread
 * itself drops the last stage while it answers a call, leaves the freeing
 * to that thread). mu and runner_mu (the current runner) are leaf locks,
 * never held together. */
struct runner {
    pthread_mutex_t mu; /* head, tail, stop, self_free */
    pthread_cond_t cv;  /* signalled with mu held: a job queued, or stop */
    struct fwd_job *head, *tail;
    bool stop, self_free;
    int stages; /* the stages that use it; under runner_mu */
    pthread_t thread;
};

static pthread_mutex_t runner_mu = PTHREAD_MUTEX_INITIALIZER;
static struct runner *runner_now; /* under runner_mu */

/* A stage's layers of the model, its parameters, and its worker's runner.
 * Lifetime: made by pp_stage_new, kept by its OwnerRRef's value, destroyed
 * by stage_free when that value goes; no job of it is queued then (each
 * holds the value through its call). The module is used by the runner
 * (forwards) and by the calls the master makes between steps (parameters,
 * state, loading), never at once. */
struct stage {
    sr_module *m;
    int from, to;    /* its layers */
    size_t first, n; /* its parameters in sr_module_params order */
    struct runner *run;
};

/* The job's forward, then its answer (completing the call's future sends it). */
static void fwd_run(struct fwd_job *j)
{
    struct stage *st = j->st;
    sr_tensor *x = sr_value_tensor(j->in), *y = NULL;
    if (x) {
        bool prev = j->train ? false : sr_no_grad_enter();
        y = sr_sequential_forward_range(st->m, x, st->from, st->to);
        if (!j->train)
            sr_no_grad_exit(prev);
    }
    sr_value *v = y ? sr_value_from_tensor(y) : NULL;
    sr_tensor_unref(y);
    if (v)
        sr_future_set_result(j->done, v);
    else
        sr_future_set_error(j->done, -EINVAL, "worker%d: pp_forward: %s", sr_rank(),
                            x ? sr_last_error() : "the input is not a tensor");
    sr_value_unref(v);
    sr_value_unref(j->in);
    sr_future_unref(j->done);
    free(j);
}

static void runner_release(struct runner *r)
{
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* The runner's thread: the queued forwards in arrival order, until stop. */
static void *runner_main(void *p)
{
    struct runner *r = p;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->head && !r->stop)
            pthread_cond_wait(&r->cv, &r->mu);
        struct fwd_job *j = r->head;
        if (!j)
            break;
        r->head = j->next;
        if (!r->head)
            r->tail = NULL;
        pthread_mutex_unlock(&r->mu);
        fwd_run(j);
        pthread_mutex_lock(&r->mu);
    }
    bool self_free = r->self_free;
    pthread_mutex_unlock(&r->mu);
    if (self_free) { /* runner_put ran on this thread: nobody joins it */
        pthread_detach(pthread_self());
        runner_release(r);
    }
    return NULL;
}

/* The worker's runner, started by its first stage; NULL with errno's code in *rc. */
static struct runner *runner_get(int *rc)
{
    pthread_mutex_lock(&runner_mu);
    struct runner *r = runner_now;
    if (!r && (r = calloc(1, sizeof(*r)))) {
        pthread_mutex_init(&r->mu, NULL);
        pthread_cond_init(&r->cv, NULL);
        if ((*rc = -pthread_create(&r->thread, NULL, runner_main, r))) {
            runner_release(r);
            r = NULL;
        }
        runner_now = r;
    } else if (!r) {
        *rc = -ENOMEM;
    }
    if (r)
        r->stages++;
    pthread_mutex_unlock(&runner_mu);
    return r;
}

/* A stage lets go of its runner; the last one stops it. */
static void runner_put(struct runner *r)
{
    pthread_mutex_lock(&runner_mu);
    bool last = --r->stages == 0;
    if (last)
        runner_now = NULL;
    pthread_mutex_unlock(&runner_mu);
    if (!last)
        return;
    bool self = pthread_equal(pthread_self(), r->thread);
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    r->self_free = self;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (!self) {
        pthread_join(r->thread, NULL);
        runner_release(r);
    }
}

static void runner_push(struct runner *r, struct fwd_job *j)
{
    pthread_mutex_lock(&r->mu);
    if (r->tail)
        r->tail->next = j;
    else
        r->head = j;
    r->tail = j;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* The value's destroy (or a failed pp_stage_new's). */
static void stage_free(void *p)
{
    struct stage *st = p;
    if (st->run)
        runner_put(st->run);
    sr_module_destroy(st->m);
    free(st);
}

static struct stage *stage_of(sr_call *c)
{
    sr_value *v = sr_call_nargs(c) ? sr_call_arg(c, 0) : NULL;
    const char *type = v && sr_value_type(v) == SR_KIND_OBJECT ? sr_value_object_type(v) : NULL;
    return type && !strcmp(type, STAGE_TYPE) ? sr_value_object(v) : NULL;
}

/* pp_stage_new(seed, from, to) -> the stage object (kept by the RRef). */
static int pp_stage_new(sr_call *c)
{
    if (sr_call_nargs(c) != 3)
        return sr_call_fail(c, -EINVAL, "pp_stage_new takes (seed, from, to)");
    struct stage *st = calloc(1, sizeof(*st));
    if (!st)
        return sr_call_fail(c, -ENOMEM, "pp_stage_new: out of memory");
    st->from = (int)sr_value_int(sr_call_arg(c, 1));
    st->to = (int)sr_value_int(sr_call_arg(c, 2));
    int rc = model_create((uint64_t)sr_value_int(sr_call_arg(c, 0)), &st->m);
    if (!rc)
        rc = sr_sequential_param_range(st->m, st->from, st->to, &st->first, &st->n);
    if (!rc)
        st->run = runner_get(&rc);
    sr_value *v = rc ? NULL : sr_object(st, stage_free, STAGE_TYPE);
    if (!v) {
        rc = sr_call_fail(c, rc ? rc : -ENOMEM, "pp_stage_new: %s", sr_last_error());
        stage_free(st);
        return rc;
    }
    return sr_call_return(c, v);
}

/* The input of a queued forward came (from its owner): queue it, or fail the call. */
static void fwd_fetched(sr_future *f, void *arg)
{
    struct fwd_job *j = arg;
    int rc = sr_future_value(f, &j->in);
    if (rc) {
        sr_future_set_error(j->done, rc, "worker%d: pp_forward: fetching the input: %s", sr_rank(), sr_last_error());
        sr_future_unref(j->done);
        free(j);
        return;
    }
    runner_push(j->st->run, j);
}

/* pp_forward(stage, x or RRef(x), train) -> the stage's output. Async: it
 * queues the micro-batch for the stage's thread, or first asks the RRef's
 * owner for its value (pp_value); it never blocks. */
static int pp_forward(sr_call *c, sr_future **out)
{
    struct stage *st = stage_of(c);
    if (!st || sr_call_nargs(c) != 3)
        return sr_call_fail(c, -EINVAL, "pp_forward takes (stage, x, train)");
    struct fwd_job *j = calloc(1, sizeof(*j));
    sr_future *done = j ? sr_future_new() : NULL;
    if (!done) {
        free(j);
        return sr_call_fail(c, -ENOMEM, "pp_forward: out of memory");
    }
    j->done = done;
    j->st = st;
    j->train = sr_value_bool(sr_call_arg(c, 2));
    *out = sr_future_ref(done);
    sr_value *in = sr_call_arg(c, 1);
    sr_rref *r = sr_value_rref(in);
    if (!r) {
        j->in = sr_value_ref(in);
        runner_push(st->run, j);
        return 0;
    }
    sr_future *f = NULL;
    int rc = sr_rref_rpc_async(r, "pp_value", SR_ARGS(), 0, &f);
    if (!rc)
        rc = sr_future_add_done_callback(f, fwd_fetched, j);
    sr_future_unref(f);
    if (rc) {
        sr_future_set_error(done, rc, "worker%d: pp_forward: fetching the input: %s", sr_rank(), sr_last_error());
        sr_future_unref(done);
        free(j);
    }
    return 0;
}

/* pp_value(value) -> value: an RRef's value, for the stage that uses it. */
static int pp_value(sr_call *c, sr_future **out)
{
    sr_future *f = sr_future_new();
    if (!f)
        return sr_call_fail(c, -ENOMEM, "pp_value: out of memory");
    sr_future_set_result(f, sr_call_nargs(c) ? sr_call_arg(c, 0) : NULL);
    *out = f;
    return 0;
}

/* pp_params(stage) -> [RRef(param) ...] of its layers, owned here. */
static int pp_params(sr_call *c)
{
    struct stage *st = stage_of(c);
    if (!st)
        return sr_call_fail(c, -EINVAL, "pp_params takes (stage)");
    sr_tensor *const *params;
    sr_module_params(st->m, NULL, &params, NULL);
    sr_value *items[16] = {0}, *list = NULL;
    int rc = st->n <= 16 ? 0 : -E2BIG;
    for (size_t i = 0; !rc && i < st->n; i++) {
        sr_value *t = sr_value_from_tensor(params[st->first + i]);
        sr_rref *r = NULL;
        rc = t ? sr_rref_create(t, &r) : -ENOMEM;
        items[i] = r ? sr_value_from_rref(r) : NULL;
        sr_rref_unref(r);
        sr_value_unref(t);
    }
    if (!rc)
        list = sr_list(st->n, items);
    for (size_t i = 0; i < st->n && i < 16; i++)
        sr_value_unref(items[i]);
    return list ? sr_call_return(c, list) : sr_call_fail(c, rc ? rc : -ENOMEM, "pp_params: %s", sr_last_error());
}

/* What pp_state and pp_load hand to the step lock's callback. */
struct state_job {
    struct stage *st;
    bool with_optim;           /* the worker's optimizer state too (its first stage) */
    sr_value *names, *tensors; /* pp_load: in; pp_state: out */
};

/* A list of n values made from items[from..from + n): strings from names
 * (char *const *), or tensor values from tensors (sr_tensor *const *). */
static sr_value *value_list(size_t n, const void *items, bool tensors, size_t from)
{
    sr_value **v = calloc(n ? n : 1, sizeof(*v)), *list = NULL;
    size_t made = 0;
    for (; v && made < n; made++)
        if (!(v[made] = tensors ? sr_value_from_tensor(((sr_tensor *const *)items)[from + made])
                                : sr_str(((char *const *)items)[from + made])))
            break;
    if (v && made == n)
        list = sr_list(n, v);
    for (size_t i = 0; v && i < made; i++)
        sr_value_unref(v[i]);
    free(v);
    return list;
}

/* Appends list b's items to list a (both lists; the result is new). */
static sr_value *list_cat(sr_value *a, sr_value *b)
{
    size_t na = sr_value_list_len(a), nb = sr_value_list_len(b);
    sr_value **v = calloc(na + nb + 1, sizeof(*v)), *list = NULL;
    for (size_t i = 0; v && i < na + nb; i++)
        v[i] = i < na ? sr_value_list_at(a, i) : sr_value_list_at(b, i - na);
    if (v)
        list = sr_list(na + nb, v);
    free(v);
    return list;
}

/* Under the step lock: the stage's parameters (module state, "param.<name>",
 * copies) and, with_optim, its worker's optimizer state ("optim.<name>"). */
static int export_locked(sr_optim *const *optims, size_t n, void *arg)
{
    (void)n;
    struct state_job *job = arg;
    size_t np, no = 0;
    char **pn, **on = NULL;
    sr_tensor **pt, **ot = NULL;
    int rc = sr_module_state_dict(job->st->m, "param.", &np, &pn, &pt);
    if (rc)
        return rc;
    for (size_t i = job->st->first; i < job->st->first + job->st->n; i++) {
        sr_tensor *copy = sr_clone(pt[i]);
        sr_tensor_unref(pt[i]);
        pt[i] = copy;
        rc = copy ? rc : -ENOMEM;
    }
    if (!rc && job->with_optim)
        rc = sr_optim_state_export(optims[0], &no, &on, &ot);
    if (!rc) {
        for (size_t i = 0; i < no; i++) { /* "optim." + name */
            char *p = malloc(strlen(on[i]) + 7);
            if (p)
                sprintf(p, "optim.%s", on[i]);
            free(on[i]);
            on[i] = p;
        }
        sr_value *a = value_list(job->st->n, pn, false, job->st->first), *b = value_list(no, on, false, 0);
        sr_value *c = value_list(job->st->n, pt, true, job->st->first), *d = value_list(no, ot, true, 0);
        job->names = a && b ? list_cat(a, b) : NULL;
        job->tensors = c && d ? list_cat(c, d) : NULL;
        rc = job->names && job->tensors ? 0 : -ENOMEM;
        sr_value_unref(a), sr_value_unref(b), sr_value_unref(c), sr_value_unref(d);
    }
    if (on)
        sr_optim_state_free(no, on, ot);
    sr_module_state_free(np, pn, pt);
    return rc;
}

/* pp_state(stage, RRef(local optimizer), with_optim) -> [names, tensors]. */
static int pp_state(sr_call *c)
{
    struct stage *st = stage_of(c);
    sr_rref *o = sr_call_nargs(c) == 3 ? sr_value_rref(sr_call_arg(c, 1)) : NULL;
    if (!st || !o)
        return sr_call_fail(c, -EINVAL, "pp_state takes (stage, optimizer RRef, with_optim)");
    struct state_job job = {.st = st, .with_optim = sr_value_bool(sr_call_arg(c, 2))};
    int rc = sr_dist_optim_with_locals(&o, 1, export_locked, &job);
    sr_value *out = rc ? NULL : sr_list(2, (sr_value *[]){job.names, job.tensors});
    sr_value_unref(job.names), sr_value_unref(job.tensors);
    return out ? sr_call_return(c, out) : sr_call_fail(c, rc ? rc : -ENOMEM, "pp_state: %s", sr_last_error());
}

/* name is a parameter of the stage's own layers. */
static bool own_param(const struct stage *st, const char *name)
{
    const char *const *names;
    sr_module_params(st->m, NULL, NULL, &names);
    for (size_t i = st->first; i < st->first + st->n; i++)
        if (!strcmp(names[i], name))
            return true;
    return false;
}

/* Under the step lock: load the entries "param.<name>" of its own layers
 * into the module (every one of them must be there; the other stages'
 * are skipped) and, with_optim, "optim.<name>" into the worker's optimizer. */
static int import_locked(sr_optim *const *optims, size_t n, void *arg)
{
    (void)n;
    struct state_job *job = arg;
    size_t cnt = sr_value_list_len(job->names), np = 0, no = 0;
    const char **pn = calloc(cnt + 1, sizeof(*pn)), **on = calloc(cnt + 1, sizeof(*on));
    sr_tensor **pt = calloc(cnt + 1, sizeof(*pt)), **ot = calloc(cnt + 1, sizeof(*ot));
    int rc = pn && on && pt && ot ? 0 : sr_errorf(-ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < cnt; i++) {
        const char *nm = sr_value_str(sr_value_list_at(job->names, i));
        sr_tensor *t = sr_value_tensor(sr_value_list_at(job->tensors, i));
        if (!nm || !t)
            rc = sr_errorf(-EINVAL, "entry %zu is not a name and a tensor", i);
        else if (!strncmp(nm, "param.", 6) && own_param(job->st, nm + 6))
            pn[np] = nm + 6, pt[np++] = t;
        else if (!strncmp(nm, "optim.", 6))
            on[no] = nm + 6, ot[no++] = t;
    }
    if (!rc && np != job->st->n)
        rc = sr_errorf(-EINVAL, "%zu parameters sent for a stage of %zu", np, job->st->n);
    if (!rc)
        rc = sr_module_load_state_dict(job->st->m, np, pn, pt, false);
    if (!rc && job->with_optim)
        rc = sr_optim_state_import(optims[0], no, on, ot);
    free(pn), free(on), free(pt), free(ot);
    return rc;
}

/* pp_load(stage, RRef(local optimizer), with_optim, names, tensors). */
static int pp_load(sr_call *c)
{
    struct stage *st = stage_of(c);
    sr_rref *o = sr_call_nargs(c) == 5 ? sr_value_rref(sr_call_arg(c, 1)) : NULL;
    if (!st || !o)
        return sr_call_fail(c, -EINVAL, "pp_load takes (stage, optimizer RRef, with_optim, names, tensors)");
    struct state_job job = {.st = st, .with_optim = sr_value_bool(sr_call_arg(c, 2)),
                            .names = sr_call_arg(c, 3), .tensors = sr_call_arg(c, 4)};
    int rc = sr_value_list_len(job.names) == sr_value_list_len(job.tensors)
                 ? sr_dist_optim_with_locals(&o, 1, import_locked, &job)
                 : sr_errorf(-EINVAL, "as many names as tensors");
    return rc ? sr_call_fail(c, rc, "pp_load: %s", sr_last_error()) : sr_call_return(c, NULL);
}

/* ============================ the master (rank 0) ========================== */

static struct master {
    sr_rref *stage[MAX_STAGES];
    sr_rref **params;
    size_t nparams;
    sr_dist_optim *optim;
    sr_module *model;     /* --local: the whole model, here */
    sr_optim *local_optim; /* --local: its Adam */
    double *loss;
    int64_t nb, total, step, first_step, timed_from, samples, saved;
    double t_train, t_print;
    bool tty;
} M;

/* The stages' output for x [n, 1, 28, 28], through the pipeline in
 * opt.splits micro-batches, all in flight at once; joined in order. */
static sr_tensor *pipeline_forward(sr_tensor *x, bool train)
{
    int64_t n = sr_tensor_shape(x)[0], per = (n + opt.splits - 1) / opt.splits;
    sr_future *futs[MAX_SPLITS] = {0};
    size_t k = 0;
    int rc = 0;
    sr_value *tr = sr_bool(train);
    for (int64_t at = 0; !rc && at < n; at += per, k++) {
        sr_tensor *xk = sr_narrow(x, 0, at, n - at < per ? n - at : per);
        sr_value *cur = xk ? sr_value_from_tensor(xk) : NULL;
        sr_tensor_unref(xk);
        rc = cur ? 0 : -ENOMEM;
        for (int s = 0; !rc && s < opt.stages - 1; s++) {
            sr_rref *r = NULL;
            rc = sr_rref_remote(M.stage[s], "pp_forward", SR_ARGS(cur, tr), 0, &r);
            sr_value_unref(cur);
            cur = r ? sr_value_from_rref(r) : NULL;
            sr_rref_unref(r);
        }
        if (!rc)
            rc = sr_rref_rpc_async(M.stage[opt.stages - 1], "pp_forward", SR_ARGS(cur, tr), 0, &futs[k]);
        sr_value_unref(cur);
    }
    sr_value_unref(tr);
    sr_value *outs = NULL;
    if (!rc)
        rc = sr_future_wait_all(futs, k, &outs);
    for (size_t i = 0; i < k; i++)
        sr_future_unref(futs[i]);
    sr_tensor *ts[MAX_SPLITS], *y = NULL;
    for (size_t i = 0; !rc && i < k; i++)
        rc = (ts[i] = sr_value_tensor(sr_value_list_at(outs, i))) ? 0 : -EPROTO;
    if (!rc)
        y = sr_cat(ts, k, 0);
    sr_value_unref(outs);
    if (!y)
        fail(rc, "the pipeline's forward");
    return y;
}

/* --local: the whole model's output for x, in this process. */
static sr_tensor *local_forward(sr_tensor *x, bool train)
{
    bool prev = train ? false : sr_no_grad_enter();
    sr_tensor *y = sr_module_forward(M.model, x);
    if (!train)
        sr_no_grad_exit(prev);
    if (!y)
        fail(-EINVAL, "the model's forward");
    return y;
}

static sr_tensor *model_forward(sr_tensor *x, bool train)
{
    return opt.local ? local_forward(x, train) : pipeline_forward(x, train);
}

static int batch_images(const sr_dataset *ds, const int64_t *idx, int64_t n, sr_tensor **x, sr_tensor **y)
{
    sr_tensor *flat = NULL;
    int rc = sr_dataset_batch(ds, idx, n, &flat, y);
    *x = rc ? NULL : sr_view(flat, 4, (const int64_t[]){n, 1, 28, 28});
    sr_tensor_unref(flat);
    return rc ? rc : *x ? 0 : -EINVAL;
}

/* --local: forward, loss, backward and Adam's step, all here. */
static int local_step(sr_tensor *x, sr_tensor *y, sr_tensor **loss)
{
    sr_tensor *logits = local_forward(x, true);
    *loss = logits ? sr_cross_entropy(logits, y) : NULL;
    sr_tensor_unref(logits);
    int rc = *loss ? sr_backward(*loss, false) : -EINVAL;
    if (!rc)
        rc = sr_optim_step(M.local_optim);
    sr_module_zero_grad(M.model);
    return rc;
}

static int train_step(const sr_dataset *ds, const int64_t *idx, int64_t n, double *loss_out)
{
    sr_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL;
    int64_t ctx = SR_NO_CONTEXT;
    int rc = batch_images(ds, idx, n, &x, &y);
    if (!rc && opt.local) {
        rc = local_step(x, y, &loss);
    } else if (!rc && !(rc = sr_dist_autograd_context_begin(&ctx))) {
        logits = pipeline_forward(x, true);
        loss = logits ? sr_cross_entropy(logits, y) : NULL;
        rc = loss ? sr_dist_autograd_backward(ctx, &loss, 1, false) : -EINVAL;
        if (!rc)
            rc = sr_dist_optim_step(M.optim, ctx);
        int end = sr_dist_autograd_context_end(ctx);
        rc = rc ? rc : end;
    }
    if (!rc)
        *loss_out = sr_tensor_item(loss);
    sr_tensor_unref(x), sr_tensor_unref(y), sr_tensor_unref(logits), sr_tensor_unref(loss);
    return rc ? fail(rc, "training step") : 0;
}

/* ---- checkpoints ---- */

static void ckpt_path(char *buf, size_t n)
{
    snprintf(buf, n, "%s/%s", opt.ckpt_dir, CKPT_NAME);
}

struct entries {
    size_t n;
    char *names[1024];
    sr_tensor *ts[1024];
};

static void entries_free(struct entries *e)
{
    for (size_t i = 0; i < e->n; i++) {
        free(e->names[i]);
        sr_tensor_unref(e->ts[i]);
    }
}

/* Stage s's entries, and with the first stage of each worker that worker's
 * optimizer state, renamed "optim.<w>.<name>" (w: the worker, 0-based). A
 * worker without parameters (ReLU and pooling) has no optimizer and
 * nothing to save. */
static int add_stage_state(struct entries *e, int s)
{
    int w = stage_worker(s);
    sr_rref *opt_w = sr_dist_optim_local_rref(M.optim, w);
    if (!opt_w)
        return 0;
    sr_value *o = sr_value_from_rref(opt_w), *out = NULL, *with = sr_bool(first_on_worker(s));
    int rc = sr_rref_rpc_sync(M.stage[s], "pp_state", SR_ARGS(o, with), 0, &out);
    sr_value_unref(o), sr_value_unref(with);
    sr_value *names = rc ? NULL : sr_value_list_at(out, 0), *ts = rc ? NULL : sr_value_list_at(out, 1);
    for (size_t i = 0; !rc && i < sr_value_list_len(names) && e->n < 1024; i++) {
        const char *nm = sr_value_str(sr_value_list_at(names, i));
        char buf[256];
        if (nm && !strncmp(nm, "optim.", 6))
            snprintf(buf, sizeof(buf), "optim.%d.%s", w - 1, nm + 6);
        else
            snprintf(buf, sizeof(buf), "%s", nm ? nm : "");
        sr_tensor *t = sr_value_tensor(sr_value_list_at(ts, i));
        if (!nm || !t || !(e->names[e->n] = strdup(buf)))
            rc = sr_errorf(-EPROTO, "pp_state's entry %zu is not a name and a tensor", i);
        else
            e->ts[e->n++] = sr_tensor_ref(t);
    }
    sr_value_unref(out);
    return rc;
}

static int save(void)
{
    char path[4096];
    ckpt_path(path, sizeof(path));
    struct entries e = {0};
    int rc = 0;
    for (int s = 0; s < opt.stages && !rc; s++)
        rc = add_stage_state(&e, s);
    if (!rc && M.step) {
        e.names[e.n] = strdup("loss_curve");
        e.ts[e.n++] = sr_from_data(SR_F64, 1, (const int64_t[]){M.step}, M.loss, 0);
    }
    static const char *meta[] = {"step", "seed", "stages", "batch", "limit_batches", "workers"};
    int64_t vals[] = {M.step, (int64_t)opt.seed, opt.stages, opt.batch, opt.limit, opt.workers};
    if (!rc)
        rc = sr_checkpoint_save(path, e.n, (const char *const *)e.names, e.ts, 6, meta, vals);
    entries_free(&e);
    if (rc)
        return fail(rc, "saving the checkpoint");
    M.saved = M.step;
    if (!M.tty)
        printf("checkpoint: step %" PRId64 " saved to %s\n", M.step, path);
    return 0;
}

static int meta_expect(const sr_checkpoint *ck, const char *name, int64_t want)
{
    int64_t v;
    if (sr_checkpoint_meta(ck, name, &v))
        return sr_errorf(-EBADMSG, "the checkpoint has no '%s'", name);
    return v == want ? 0 : sr_errorf(-EINVAL, "the checkpoint was written with %s %" PRId64 ", this run has %" PRId64
                                              " (resume with the same settings)", name, v, want);
}

/* Stage s's entries of the checkpoint: "param.*" (every stage takes its
 * own layers by name) and, for the first stage of each worker, "optim.<w>.*"
 * renamed "optim.*". A worker without parameters has nothing to load. */
static int load_stage(const sr_checkpoint *ck, int s)
{
    int w = stage_worker(s);
    if (!sr_dist_optim_local_rref(M.optim, w))
        return 0;
    size_t cnt = sr_checkpoint_count(ck), k = 0;
    sr_value **nv = calloc(cnt + 1, sizeof(*nv)), **tv = calloc(cnt + 1, sizeof(*tv));
    char prefix[32];
    size_t plen = (size_t)snprintf(prefix, sizeof(prefix), "optim.%d.", w - 1);
    int rc = nv && tv ? 0 : -ENOMEM;
    for (size_t i = 0; !rc && i < cnt; i++) {
        const char *nm = sr_checkpoint_name(ck, i);
        char buf[256];
        if (first_on_worker(s) && !strncmp(nm, prefix, plen))
            snprintf(buf, sizeof(buf), "optim.%s", nm + plen);
        else if (!strncmp(nm, "param.", 6))
            snprintf(buf, sizeof(buf), "%s", nm);
        else
            continue;
        nv[k] = sr_str(buf);
        tv[k++] = sr_value_from_tensor(sr_checkpoint_tensor(ck, nm));
    }
    sr_value *names = rc ? NULL : sr_list(k, nv), *ts = rc ? NULL : sr_list(k, tv);
    sr_value *o = sr_value_from_rref(sr_dist_optim_local_rref(M.optim, w)), *with = sr_bool(first_on_worker(s));
    if (!rc)
        rc = names && ts && o && with ? sr_rref_rpc_sync(M.stage[s], "pp_load", SR_ARGS(o, with, names, ts), 0, NULL)
                                      : -ENOMEM;
    for (size_t i = 0; i < k; i++)
        sr_value_unref(nv[i]), sr_value_unref(tv[i]);
    free(nv), free(tv);
    sr_value_unref(names), sr_value_unref(ts), sr_value_unref(o), sr_value_unref(with);
    return rc;
}

/* A checkpoint from before --stages could exceed the workers has no
 * "workers": it had a worker per stage. */
static int workers_expect(const sr_checkpoint *ck)
{
    int64_t v;
    return sr_checkpoint_meta(ck, "workers", &v) ? meta_expect(ck, "stages", opt.workers)
                                                  : meta_expect(ck, "workers", opt.workers);
}

static int resume(void)
{
    char path[4096];
    ckpt_path(path, sizeof(path));
    sr_checkpoint *ck;
    int rc = sr_checkpoint_load(path, &ck);
    if (rc)
        return fail(rc, "--resume");
    if (!(rc = meta_expect(ck, "seed", (int64_t)opt.seed)) && !(rc = meta_expect(ck, "stages", opt.stages)) &&
        !(rc = meta_expect(ck, "batch", opt.batch)) && !(rc = meta_expect(ck, "limit_batches", opt.limit)) &&
        !(rc = workers_expect(ck)))
        rc = sr_checkpoint_meta(ck, "step", &M.step);
    if (!rc && M.step > M.total)
        rc = sr_errorf(-EINVAL, "the checkpoint is at step %" PRId64 ", past this run's %" PRId64, M.step, M.total);
    sr_tensor *curve = !rc && M.step ? sr_checkpoint_tensor(ck, "loss_curve") : NULL;
    if (curve)
        rc = (int64_t)sr_tensor_numel(curve) == M.step ? sr_tensor_to_f64(curve, M.loss, (size_t)M.step)
                                                         : sr_errorf(-EBADMSG, "the loss curve's length");
    for (int s = 0; !rc && s < opt.stages; s++)
        rc = load_stage(ck, s);
    sr_checkpoint_destroy(ck);
    if (rc)
        return fail(rc, "--resume");
    M.saved = M.step;
    printf("resumed from %s at step %" PRId64 "\n", path, M.step);
    return 0;
}

/* ---- the master's main line ---- */

static int setup(void)
{
    int rc = 0;
    for (int s = 0; s < opt.stages && !rc; s++) {
        sr_value *seed = sr_int((int64_t)opt.seed), *from = sr_int(BOUNDS[opt.stages][s]),
                 *to = sr_int(BOUNDS[opt.stages][s + 1]);
        rc = sr_remote(stage_worker(s), "pp_stage_new", SR_ARGS(seed, from, to), 0, &M.stage[s]);
        sr_value_unref(seed), sr_value_unref(from), sr_value_unref(to);
    }
    if (rc)
        return fail(rc, "creating the stages");
    M.params = calloc(64, sizeof(*M.params));
    for (int s = 0; s < opt.stages && !rc; s++) {
        sr_value *list = NULL;
        if ((rc = sr_rref_rpc_sync(M.stage[s], "pp_params", SR_NOARGS, 0, &list)))
            return fail(rc, "pp_params");
        for (size_t i = 0; i < sr_value_list_len(list) && M.nparams < 64; i++)
            M.params[M.nparams++] = sr_rref_ref(sr_value_rref(sr_value_list_at(list, i)));
        sr_value_unref(list);
    }
    sr_optim_opts o;
    sr_optim_opts_default(SR_OPTIM_ADAM, &o);
    o.lr = opt.lr;
    if ((rc = sr_dist_optim_create(SR_OPTIM_ADAM, &o, M.params, M.nparams, &M.optim)))
        return fail(rc, "sr_dist_optim_create");
    M.total = M.nb * opt.epochs;
    if (!(M.loss = calloc((size_t)M.total + 1, sizeof(*M.loss))))
        return fail(-ENOMEM, "the loss curve");
    rc = opt.resume ? resume() : 0;
    M.first_step = M.timed_from = M.step;
    return rc;
}

/* --local: the whole model and a local Adam over its parameters. */
static int setup_local(void)
{
    int rc = model_create(opt.seed, &M.model);
    sr_tensor *const *params = NULL;
    size_t n = 0;
    if (rc)
        return fail(rc, "the model");
    sr_module_params(M.model, &n, &params, NULL);
    sr_optim_opts o;
    sr_optim_opts_default(SR_OPTIM_ADAM, &o);
    o.lr = opt.lr;
    if ((rc = sr_optim_create(SR_OPTIM_ADAM, &o, params, n, &M.local_optim)))
        return fail(rc, "sr_optim_create");
    M.total = M.nb * opt.epochs;
    if (!(M.loss = calloc((size_t)M.total + 1, sizeof(*M.loss))))
        return fail(-ENOMEM, "the loss curve");
    return 0;
}

static void progress(void)
{
    double t = demo_now_s();
    bool last = M.step == M.total;
    if (!demo_progress_due(M.tty, t, M.t_print, M.step, M.total))
        return;
    M.t_print = t;
    int64_t epoch = last ? M.step / M.nb : M.step / M.nb + 1, in_epoch = M.step - (epoch - 1) * M.nb;
    printf("%sepoch %" PRId64 "/%d   batch %5" PRId64 "/%" PRId64 "   loss %.4f   %6.0f samples/s%s",
           M.tty ? "\r" : "", epoch, opt.epochs, in_epoch, M.nb, demo_running_loss(M.loss, M.step),
           M.samples / (t - M.t_train > 1e-9 ? t - M.t_train : 1e-9), M.tty && !last ? "" : "\n");
    fflush(stdout);
}

/* The data order of an epoch: a permutation drawn from (seed, epoch) alone. */
static int epoch_order(int64_t epoch, int64_t n, int64_t *perm)
{
    sr_generator g;
    sr_generator_init(&g, opt.seed ^ (UINT64_C(0x9E3779B97F4A7C15) * (uint64_t)(epoch + 1)));
    return sr_generator_permutation(&g, n, perm);
}

static int train(const sr_dataset *ds)
{
    int64_t N = sr_dataset_size(ds), epoch = -1, *perm = malloc((size_t)N * sizeof(*perm));
    int rc = perm ? 0 : fail(-ENOMEM, "the data order");
    M.t_train = demo_now_s();
    while (!rc && M.step < M.total) {
        if (M.step / M.nb != epoch && epoch_order(epoch = M.step / M.nb, N, perm))
            return free(perm), fail(-EINVAL, "the data order");
        int64_t at = (M.step % M.nb) * opt.batch, n = N - at < opt.batch ? N - at : opt.batch;
        double loss = NAN;
        if ((rc = train_step(ds, perm + at, n, &loss)))
            break;
        M.loss[M.step++] = loss;
        M.samples += n;
        if (M.step - M.first_step == opt.warmup) { /* the timed steps start here */
            M.t_train = demo_now_s();
            M.timed_from = M.step;
            M.samples = 0;
        }
        progress();
        if (demo_ckpt_due(opt.ckpt_dir, M.step, opt.save_every, M.total))
            rc = save();
    }
    free(perm);
    return rc;
}

static double test_accuracy(const sr_dataset *test, int64_t n)
{
    int64_t chunk = 1000, correct = 0;
    int64_t *idx = malloc((size_t)chunk * sizeof(*idx));
    if (!idx)
        return NAN;
    for (int64_t at = 0; at < n; at += chunk) {
        int64_t m = n - at < chunk ? n - at : chunk;
        for (int64_t i = 0; i < m; i++)
            idx[i] = at + i;
        sr_tensor *x = NULL, *y = NULL, *logits = NULL;
        if (!batch_images(test, idx, m, &x, &y))
            logits = model_forward(x, false);
        double acc = logits ? sr_accuracy(logits, y) : NAN;
        sr_tensor_unref(x), sr_tensor_unref(y), sr_tensor_unref(logits);
        if (isnan(acc)) {
            free(idx);
            return NAN;
        }
        correct += llround(acc * (double)m);
    }
    free(idx);
    return (double)correct / (double)n;
}

static int finish(const sr_dataset *test, double t0)
{
    int rc = opt.ckpt_dir && M.saved != M.step ? save() : 0;
    double train_s = demo_now_s() - M.t_train;
    int64_t n = opt.test_limit > 0 && opt.test_limit < sr_dataset_size(test) ? opt.test_limit : sr_dataset_size(test);
    double acc = rc ? NAN : test_accuracy(test, n);
    if (isnan(acc))
        return rc ? rc : fail(-EINVAL, "test accuracy");
    printf("test accuracy: %.2f %% (%" PRId64 " test images)\n", 100 * acc, n);
    printf("time: %.1f s in all, %.1f s training (%" PRId64 " steps, %.0f samples/s)\n", demo_now_s() - t0, train_s,
           M.step - M.timed_from, (double)M.samples / train_s);
    char title[160];
    if (opt.local)
        snprintf(title, sizeof(title), "CNN on Fashion-MNIST: one process, batch %" PRId64 ", Adam lr %g", opt.batch,
                 opt.lr);
    else
        snprintf(title, sizeof(title), "CNN on Fashion-MNIST: %d stages, %d micro-batches of a batch of %" PRId64
                 ", Adam lr %g", opt.stages, opt.splits, opt.batch, opt.lr);
    if (!(rc = loss_svg_write(opt.plot, title, M.loss, (size_t)M.step))) {
        char *abs = realpath(opt.plot, NULL);
        printf("loss curve: %s\n", abs ? abs : opt.plot);
        free(abs);
    }
    return rc;
}

static void release(void)
{
    sr_optim_destroy(M.local_optim);
    sr_module_destroy(M.model);
    sr_dist_optim_destroy(M.optim);
    for (size_t i = 0; i < M.nparams; i++)
        sr_rref_unref(M.params[i]);
    free(M.params);
    for (int s = 0; s < MAX_STAGES; s++)
        sr_rref_unref(M.stage[s]);
    free(M.loss);
}

static int master(double t0)
{
    sr_dataset *train_ds = NULL, *test = NULL;
    M.tty = isatty(1);
    int rc = sr_fashion_mnist_load(opt.data, true, &train_ds);
    if (rc || (rc = sr_fashion_mnist_load(opt.data, false, &test)))
        fail(rc, "loading Fashion-MNIST");
    if (!rc) {
        int64_t nb = (sr_dataset_size(train_ds) + opt.batch - 1) / opt.batch;
        M.nb = opt.limit > 0 && opt.limit < nb ? opt.limit : nb;
        rc = opt.local ? setup_local() : setup();
    }
    if (!rc) {
        sr_module *whole = NULL;
        size_t numel = model_create(opt.seed, &whole) ? 0 : sr_module_numel(whole);
        sr_module_destroy(whole);
        if (opt.local)
            printf("local: CNN (%zu parameters) in this process, batch %" PRId64 ", %" PRId64
                   " batches per epoch, %d epoch%s\n", numel, opt.batch, M.nb, opt.epochs, opt.epochs > 1 ? "s" : "");
        else
            printf("pipeline: CNN (%zu parameters) in %d stages on %d workers, batch %" PRId64 " in %d micro-batch%s, %"
                   PRId64 " batches per epoch, %d epoch%s\n", numel, opt.stages, opt.workers, opt.batch, opt.splits,
                   opt.splits > 1 ? "es" : "", M.nb, opt.epochs, opt.epochs > 1 ? "s" : "");
        for (int s = 0; !opt.local && s < opt.stages; s++)
            printf("  stage %d on worker%d: layers %d..%d\n", s + 1, stage_worker(s), BOUNDS[opt.stages][s],
                   BOUNDS[opt.stages][s + 1] - 1);
        fflush(stdout);
        rc = train(train_ds);
    }
    if (!rc)
        rc = finish(test, t0);
    release();
    sr_dataset_destroy(train_ds);
    sr_dataset_destroy(test);
    return rc;
}

/* ============================ command line ================================ */

static const char usage[] =
    "usage: shmrun -n W+1 demo_pipeline [options]    (rank 0: the master; ranks 1..W: the stage workers)\n"
    "  --stages S            pipeline stages, W to 4 (default W, a stage per worker); stage s (from 0)\n"
    "                        goes to worker s mod W + 1: 3 stages on 2 workers balance this CNN best\n"
    "  --splits K            micro-batches per batch, 1 to " "64 (default 4)\n"
    "  --epochs E            epochs to train (default 2)\n"
    "  --batch B             samples per batch (default 64)\n"
    "  --lr LR               Adam learning rate (default 0.001)\n"
    "  --seed S              seed of the initial weights and of the data order (default 0)\n"
    "  --checkpoint-dir DIR  save checkpoints to DIR/" CKPT_NAME "\n"
    "  --save-every N        save every N steps (default 100, with --checkpoint-dir)\n"
    "  --resume              continue from the checkpoint in --checkpoint-dir\n"
    "  --limit-batches K     train only the first K batches of each epoch (short runs, tests)\n"
    "  --test-limit N        measure the accuracy on the first N test images only\n"
    "  --warmup N            train the first N steps untimed: the time and samples/s are the rest's\n"
    "  --loss-curve FILE     the loss curve, SVG (default pipeline_loss.svg)\n"
    "  --data DIR            Fashion-MNIST directory (default " SR_FASHION_MNIST_DIR ")\n"
    "  --local               train the same model in this one process, no RPC (without shmrun;\n"
    "                        the baseline of a step's overhead; no checkpoints)\n";

static const struct demo_cli CLI = {"demo_pipeline", usage};

static int bad(const char *what, const char *val) { return demo_bad(&CLI, what, val); }
static bool num(const char *s, double lo, double hi, double *out) { return demo_num(s, lo, hi, out); }

enum { O_STAGES = 256, O_SPLITS, O_EPOCHS, O_BATCH, O_LR, O_SEED, O_DIR, O_EVERY, O_RESUME, O_LIMIT, O_TEST,
       O_PLOT, O_DATA, O_LOCAL, O_WARMUP };

static int set_opt(int c, const char *arg, int world)
{
    double v;
    switch (c) {
    case O_STAGES:
        return num(arg, 2, MAX_STAGES, &v) && (world < 2 || (int)v >= world - 1)
                   ? (opt.stages = (int)v, 0) : bad("--stages takes 2..4, at least shmrun's -n minus 1", arg);
    case O_SPLITS: return num(arg, 1, MAX_SPLITS, &v) ? (opt.splits = (int)v, 0) : bad("--splits takes 1..64", arg);
    case O_EPOCHS: return num(arg, 1, 1000, &v) ? (opt.epochs = (int)v, 0) : bad("--epochs takes 1..1000", arg);
    case O_BATCH: return num(arg, 1, 60000, &v) ? (opt.batch = (int64_t)v, 0) : bad("--batch takes 1..60000", arg);
    case O_LR: return num(arg, 1e-9, 100, &v) ? (opt.lr = v, 0) : bad("--lr takes a positive number", arg);
    case O_SEED: return num(arg, 0, 1e15, &v) ? (opt.seed = (uint64_t)v, 0) : bad("--seed takes a number", arg);
    case O_DIR: return opt.ckpt_dir = arg, 0;
    case O_EVERY: return num(arg, 1, 1e12, &v) ? (opt.save_every = (int64_t)v, 0) : bad("--save-every takes N >= 1", arg);
    case O_RESUME: return opt.resume = true, 0;
    case O_LIMIT: return num(arg, 1, 1e12, &v) ? (opt.limit = (int64_t)v, 0) : bad("--limit-batches takes K >= 1", arg);
    case O_TEST: return num(arg, 1, 1e12, &v) ? (opt.test_limit = (int64_t)v, 0) : bad("--test-limit takes N >= 1", arg);
    case O_PLOT: return opt.plot = arg, 0;
    case O_DATA: return opt.data = arg, 0;
    case O_LOCAL: return opt.local = true, 0;
    case O_WARMUP: return num(arg, 0, 1e12, &v) ? (opt.warmup = (int64_t)v, 0) : bad("--warmup takes N >= 0", arg);
    case 'h': {
        const char *rank = getenv("SHMRPC_RANK");
        if (!rank || !strcmp(rank, "0"))
            fputs(usage, stdout);
        return 1;
    }
    default: return bad("unknown option", arg);
    }
}

static int parse(int argc, char **argv, int world)
{
    static const struct option longs[] = {
        {"stages", 1, 0, O_STAGES}, {"splits", 1, 0, O_SPLITS}, {"epochs", 1, 0, O_EPOCHS},
        {"batch", 1, 0, O_BATCH}, {"lr", 1, 0, O_LR}, {"seed", 1, 0, O_SEED},
        {"checkpoint-dir", 1, 0, O_DIR}, {"save-every", 1, 0, O_EVERY}, {"resume", 0, 0, O_RESUME},
        {"limit-batches", 1, 0, O_LIMIT}, {"test-limit", 1, 0, O_TEST}, {"loss-curve", 1, 0, O_PLOT},
        {"data", 1, 0, O_DATA}, {"local", 0, 0, O_LOCAL}, {"warmup", 1, 0, O_WARMUP}, {"help", 0, 0, 'h'},
        {0, 0, 0, 0}};
    int rc = demo_parse(&CLI, argc, argv, "h", longs, set_opt, world);
    if (rc || (rc = demo_ckpt_opts(&CLI, opt.resume, opt.ckpt_dir, &opt.save_every)))
        return rc;
    if (opt.local && (opt.ckpt_dir || world > 1))
        return bad("--local runs alone, without shmrun and checkpoints", opt.ckpt_dir ? opt.ckpt_dir : "shmrun");
    return 0;
}

/* --local: a one-worker job of its own, so that its tensors come from the
 * shared heap as the stages' do. Without sr_init they would be private
 * blocks (glibc's malloc), which gives the pages of a step's 6 MiB
 * activations back to the kernel and faults them in again every step:
 * 5,800 more page faults a step and a third more CPU time than the stages'
 * allocator (docs/PERFORMANCE.md, "Pipeline parallelism: the baseline and
 * the stage bounds"), which is not what overhead_over_local compares. */
static int run_local(double t0)
{
    setenv("SHMRPC_WORLD_SIZE", "1", 0); /* one worker on purpose: no warning */
    int rc = sr_init(NULL);
    if (rc)
        return fail(rc, "sr_init"), 1;
    rc = master(t0);
    int sd = sr_shutdown(rc == 0, 0);
    if (sd)
        fprintf(stderr, "demo_pipeline: worker%d: sr_shutdown: %s\n", sr_rank(), sr_last_error());
    return rc || sd ? 1 : 0;
}

int main(int argc, char **argv)
{
    double t0 = demo_now_s();
    int world = demo_world_from_env();
    int rc = parse(argc, argv, world);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (opt.local)
        return run_local(t0);
    if (world < 3 || world > MAX_STAGES + 1) {
        fprintf(stderr, "demo_pipeline: run it under shmrun with 3 to %d workers (a master and 2 to %d stage workers): "
                        "shmrun -n 3 %s\n", MAX_STAGES + 1, MAX_STAGES, argv[0]);
        return 2;
    }
    opt.workers = world - 1;
    if (!opt.stages)
        opt.stages = opt.workers;
    sr_register("pp_stage_new", pp_stage_new);
    sr_register_async("pp_forward", pp_forward);
    sr_register_async("pp_value", pp_value);
    sr_register("pp_params", pp_params);
    sr_register("pp_state", pp_state);
    sr_register("pp_load", pp_load);
    if ((rc = sr_init(NULL)))
        return fail(rc, "sr_init"), 1;
    int rank = sr_rank();
    /* The stages serve the master's calls until it is done: their shutdown
     * waits for it (shmrun stops the job if the master fails). */
    rc = rank == 0 ? master(t0) : 0;
    int sd = sr_shutdown(rc == 0, rank == 0 ? 60 : 0);
    if (sd)
        fprintf(stderr, "demo_pipeline: worker%d: sr_shutdown: %s\n", rank, sr_last_error());
    return rc || sd ? 1 : 0;
}
