/* SPDX-License-Identifier: MIT */
/* Concurrent trainers need no lock: the parameter-server pattern of
 * bench/demo_train with 3 trainers that update the server's parameters in
 * place while the others' backward passes still need the values their
 * forwards used.
 *
 * Rank 0 holds an MLP 6-5-3 (f64) and runs the forward ("sv_forward"); ranks
 * 1-3 train it with their own DistributedOptimizer (SGD), each step a
 * forward by RPC inside a distributed autograd context, a distributed
 * backward and a step, with no lock anywhere.
 *
 * interleaved: a fixed schedule, the same every run, makes the worst case
 * happen each round: all three forwards first, then trainer 1's backward and
 * step, then trainer 2's (whose graph saved the weights trainer 1 has just
 * changed in place), then trainer 3's (two steps behind). Each forward also
 * returns the weights it used; the trainer recomputes the expected gradient
 * locally from them, and the gradients that its distributed backward left on
 * the server must equal it bit for bit. PyTorch fails here with "modified by
 * an inplace operation" (pytorch/tutorials#2095). The schedule is a turn
 * counter on the server that trainers wait on between phases (bounded); it
 * orders the phases, it never guards a forward, a backward or a step.
 *
 * free_running: the same three trainers without any schedule, many steps,
 * with the forward of bench/demo_train (on copies of the weights, made while
 * other trainers may be stepping): every call succeeds.
 */
#include <math.h>
#include <pthread.h>
#include <time.h>

#include "rpc_harness.h"
#include "shmrpc/dist_autograd.h"
#include "shmrpc/dist_optim.h"
#include "shmrpc/nn.h"
#include "shmrpc/rref.h"

LEAK_CHECKED_SUITE(train_concurrent);

#define TRAINERS 3
#define NPARAMS 4
#define BATCH 4
#define ROUNDS 4
#define FREE_STEPS 40
#define WAIT_S 60

static const int64_t SIZES[3] = {6, 5, 3};

/* ---- the server (rank 0) ---- */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t ready; /* 1 once the parameters exist */
    int64_t turn;  /* the schedule's clock */
    int64_t done;  /* trainers finished */
    sr_module *model;
    sr_tensor *const *params;
    sr_rref *rrefs[NPARAMS];
} sv = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* Wait (sv.mu held) until *v >= want, at most WAIT_S seconds. */
static int wait_for(const int64_t *v, int64_t want, const char *what)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += WAIT_S;
    while (*v < want)
        if (pthread_cond_timedwait(&sv.cv, &sv.mu, &dl) == ETIMEDOUT)
            return sr_errorf(-ETIMEDOUT, "waited %d s for %s %lld (at %lld)", WAIT_S, what, (long long)want,
                             (long long)*v);
    return 0;
}

static int sv_params(sr_call *c)
{
    pthread_mutex_lock(&sv.mu);
    int rc = wait_for(&sv.ready, 1, "the server to be ready:");
    pthread_mutex_unlock(&sv.mu);
    if (rc)
        return sr_call_fail(c, rc, "%s", sr_last_error());
    sr_value *items[NPARAMS];
    for (int i = 0; i < NPARAMS; i++)
        items[i] = sr_value_from_rref(sv.rrefs[i]);
    sr_value *list = sr_list(NPARAMS, items);
    for (int i = 0; i < NPARAMS; i++)
        sr_value_unref(items[i]);
    return sr_call_return(c, list);
}

/* sv_forward(x) -> [logits, W0, b0, W1, b1]: the weights as the forward used
 * them (detached; nothing can step while a forward runs in the schedule). */
static int sv_forward(sr_call *c)
{
    sr_tensor *logits = sr_mlp_apply(sr_value_tensor(sr_call_arg(c, 0)), sv.params, 2);
    if (!logits)
        return sr_call_fail(c, -EINVAL, "sv_forward: %s", sr_last_error());
    sr_value *items[1 + NPARAMS] = {sr_value_from_tensor(logits)};
    for (int i = 0; i < NPARAMS; i++) {
        sr_tensor *d = sr_detach(sv.params[i]);
        items[1 + i] = sr_value_from_tensor(d);
        sr_tensor_unref(d);
    }
    sr_value *list = sr_list(1 + NPARAMS, items);
    for (int i = 0; i < 1 + NPARAMS; i++)
        sr_value_unref(items[i]);
    sr_tensor_unref(logits);
    return sr_call_return(c, list);
}

/* sv_forward_copy(x) -> logits, computed as bench/demo_train computes them:
 * on copies of the weights (a forward that reads the weights themselves
 * while another trainer's step moves them by copy-on-write could read a
 * block freed meanwhile; see demo_train's ps_forward). */
static int sv_forward_copy(sr_call *c)
{
    sr_tensor *w[NPARAMS];
    for (int i = 0; i < NPARAMS; i++)
        w[i] = sr_clone(sv.params[i]);
    sr_tensor *logits = sr_mlp_apply(sr_value_tensor(sr_call_arg(c, 0)), w, 2);
    for (int i = 0; i < NPARAMS; i++)
        sr_tensor_unref(w[i]);
    if (!logits)
        return sr_call_fail(c, -EINVAL, "sv_forward_copy: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(logits);
    sr_tensor_unref(logits);
    return sr_call_return(c, v);
}

/* sv_grads(ctx) -> the gradients the context holds here for W0, b0, W1, b1. */
static int sv_grads(sr_call *c)
{
    int64_t ctx = sr_value_int(sr_call_arg(c, 0));
    sr_value *items[NPARAMS] = {0};
    int rc = 0;
    for (int i = 0; i < NPARAMS && !rc; i++) {
        sr_tensor *g = NULL;
        if (!(rc = sr_dist_autograd_get_gradient(ctx, sv.params[i], &g)))
            items[i] = sr_value_from_tensor(g);
        sr_tensor_unref(g);
    }
    sr_value *list = rc ? NULL : sr_list(NPARAMS, items);
    for (int i = 0; i < NPARAMS; i++)
        sr_value_unref(items[i]);
    return rc ? sr_call_fail(c, rc, "sv_grads: %s", sr_last_error()) : sr_call_return(c, list);
}

/* sv_turn(t): return when the clock reads t. sv_next(t): advance it to t + 1. */
static int sv_turn(sr_call *c)
{
    pthread_mutex_lock(&sv.mu);
    int rc = wait_for(&sv.turn, sr_value_int(sr_call_arg(c, 0)), "turn");
    pthread_mutex_unlock(&sv.mu);
    return rc ? sr_call_fail(c, rc, "%s", sr_last_error()) : sr_call_return(c, NULL);
}

static int sv_next(sr_call *c)
{
    pthread_mutex_lock(&sv.mu);
    sv.turn = sr_value_int(sr_call_arg(c, 0)) + 1;
    pthread_cond_broadcast(&sv.cv);
    pthread_mutex_unlock(&sv.mu);
    return sr_call_return(c, NULL);
}

static int sv_done(sr_call *c)
{
    pthread_mutex_lock(&sv.mu);
    sv.done++;
    pthread_cond_broadcast(&sv.cv);
    pthread_mutex_unlock(&sv.mu);
    return sr_call_return(c, NULL);
}

static void register_fns(void)
{
    sr_register("sv_params", sv_params);
    sr_register("sv_forward", sv_forward);
    sr_register("sv_forward_copy", sv_forward_copy);
    sr_register("sv_grads", sv_grads);
    sr_register("sv_turn", sv_turn);
    sr_register("sv_next", sv_next);
    sr_register("sv_done", sv_done);
}

static int server(void)
{
    sr_generator g;
    sr_generator_init(&g, 11);
    WCHECK(sr_mlp_create(SIZES, 2, &g, SR_F64, &sv.model) == 0, "mlp: %s", sr_last_error());
    sr_module_params(sv.model, NULL, &sv.params, NULL);
    for (int i = 0; i < NPARAMS; i++) {
        sr_value *v = sr_value_from_tensor(sv.params[i]);
        WCHECK(sr_rref_create(v, &sv.rrefs[i]) == 0, "rref: %s", sr_last_error());
        sr_value_unref(v);
    }
    pthread_mutex_lock(&sv.mu);
    sv.ready = 1;
    pthread_cond_broadcast(&sv.cv);
    int rc = wait_for(&sv.done, TRAINERS, "the trainers to finish:");
    pthread_mutex_unlock(&sv.mu);
    for (int i = 0; i < NPARAMS; i++)
        sr_rref_unref(sv.rrefs[i]);
    sr_module_destroy(sv.model);
    WCHECK(!rc, "%s", sr_last_error());
    return 0;
}

/* ---- a trainer ---- */

struct trainer {
    sr_rref *params[NPARAMS];
    sr_dist_optim *optim;
    sr_generator g;
};

static int call_int(const char *fn, int64_t v)
{
    sr_value *a = sr_int(v);
    int rc = sr_rpc_sync(0, fn, SR_ARGS(a), 0, NULL);
    sr_value_unref(a);
    WCHECK(rc == 0, "%s(%lld): %s", fn, (long long)v, sr_last_error());
    return 0;
}

/* A batch drawn from the trainer's generator: x in [-1, 1), labels 0..2. */
static void batch(struct trainer *t, sr_tensor **x, sr_tensor **y)
{
    int64_t xs[2] = {BATCH, SIZES[0]}, ys[1] = {BATCH}, labels[BATCH];
    *x = sr_generator_uniform_tensor(&t->g, SR_F64, 2, xs, -1, 1, 0);
    for (int i = 0; i < BATCH; i++)
        labels[i] = (int64_t)sr_generator_below(&t->g, 3);
    *y = sr_from_data(SR_I64, 1, ys, labels, 0);
}

static bool same_bits(sr_tensor *a, sr_tensor *b)
{
    size_t n = sr_tensor_numel(a);
    if (n != sr_tensor_numel(b) || n > 64)
        return false;
    double va[64], vb[64];
    return !sr_tensor_to_f64(a, va, n) && !sr_tensor_to_f64(b, vb, n) && !memcmp(va, vb, n * sizeof(double));
}

/* The gradients of cross_entropy(MLP(x; w), y) for the weights w, computed
 * here with local autograd: grads[i], new references. */
static int expected_grads(sr_value *fwd, sr_tensor *x, sr_tensor *y, sr_tensor **grads)
{
    sr_tensor *w[NPARAMS];
    for (int i = 0; i < NPARAMS; i++) {
        w[i] = sr_clone(sr_value_tensor(sr_value_list_at(fwd, (size_t)i + 1)));
        WCHECK(w[i] && sr_tensor_set_requires_grad(w[i], true) == 0, "leaf: %s", sr_last_error());
    }
    sr_tensor *logits = sr_mlp_apply(x, w, 2), *loss = sr_cross_entropy(logits, y);
    WCHECK(same_bits(logits, sr_value_tensor(sr_value_list_at(fwd, 0))),
           "the server's logits differ from those of the weights it returned");
    WCHECK(sr_backward(loss, false) == 0, "local backward: %s", sr_last_error());
    for (int i = 0; i < NPARAMS; i++) {
        grads[i] = sr_tensor_ref(sr_tensor_grad(w[i]));
        sr_tensor_unref(w[i]);
    }
    sr_tensor_unref(logits);
    sr_tensor_unref(loss);
    return 0;
}

/* Backward from the server's logits, then the server's gradients must be
 * exactly those of the weights that forward used. */
static int backward_checked(int64_t ctx, sr_value *fwd, sr_tensor *x, sr_tensor *y, int round)
{
    sr_tensor *want[NPARAMS], *loss = sr_cross_entropy(sr_value_tensor(sr_value_list_at(fwd, 0)), y);
    WCHECK(expected_grads(fwd, x, y, want) == 0, "expected gradients");
    WCHECK(sr_dist_autograd_backward(ctx, &loss, 1, false) == 0, "round %d: backward: %s", round, sr_last_error());
    sr_value *c = sr_int(ctx), *got = NULL;
    WCHECK(sr_rpc_sync(0, "sv_grads", SR_ARGS(c), 0, &got) == 0, "sv_grads: %s", sr_last_error());
    for (int i = 0; i < NPARAMS; i++) {
        WCHECK(same_bits(sr_value_tensor(sr_value_list_at(got, (size_t)i)), want[i]),
               "round %d, trainer %d: the gradient of parameter %d is not the one of the weights its forward used",
               round, sr_rank(), i);
        sr_tensor_unref(want[i]);
    }
    sr_value_unref(c);
    sr_value_unref(got);
    sr_tensor_unref(loss);
    return 0;
}

/* One round of the schedule: forwards at ticks 6r + 0..2, backward and step
 * at 6r + 3..5, trainer k (0-based) at its own offset. */
static int scheduled_round(struct trainer *t, int round)
{
    int64_t k = sr_rank() - 1, base = (int64_t)round * 2 * TRAINERS, ctx;
    sr_tensor *x, *y;
    batch(t, &x, &y);
    sr_value *xv = sr_value_from_tensor(x), *fwd = NULL;
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "begin: %s", sr_last_error());
    WCHECK(call_int("sv_turn", base + k) == 0, "turn");
    WCHECK(sr_rpc_sync(0, "sv_forward", SR_ARGS(xv), 0, &fwd) == 0, "forward: %s", sr_last_error());
    WCHECK(call_int("sv_next", base + k) == 0 && call_int("sv_turn", base + TRAINERS + k) == 0, "turn");
    WCHECK(backward_checked(ctx, fwd, x, y, round) == 0, "backward");
    WCHECK(sr_dist_optim_step(t->optim, ctx) == 0, "step: %s", sr_last_error());
    WCHECK(call_int("sv_next", base + TRAINERS + k) == 0, "turn");
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "end: %s", sr_last_error());
    sr_value_unref(fwd);
    sr_value_unref(xv);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    return 0;
}

/* One unscheduled step: forward, backward, step. */
static int free_step(struct trainer *t, int i)
{
    int64_t ctx;
    sr_tensor *x, *y;
    batch(t, &x, &y);
    sr_value *xv = sr_value_from_tensor(x), *fwd = NULL;
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "begin: %s", sr_last_error());
    WCHECK(sr_rpc_sync(0, "sv_forward_copy", SR_ARGS(xv), 0, &fwd) == 0, "forward: %s", sr_last_error());
    sr_tensor *loss = sr_cross_entropy(sr_value_tensor(fwd), y);
    WCHECK(sr_dist_autograd_backward(ctx, &loss, 1, false) == 0, "step %d: backward: %s", i, sr_last_error());
    WCHECK(sr_dist_optim_step(t->optim, ctx) == 0, "step %d: %s", i, sr_last_error());
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "end: %s", sr_last_error());
    sr_tensor_unref(loss);
    sr_value_unref(fwd);
    sr_value_unref(xv);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    return 0;
}

static int trainer_setup(struct trainer *t)
{
    sr_value *list = NULL;
    WCHECK(sr_rpc_sync(0, "sv_params", SR_NOARGS, 0, &list) == 0, "sv_params: %s", sr_last_error());
    for (int i = 0; i < NPARAMS; i++)
        t->params[i] = sr_rref_ref(sr_value_rref(sr_value_list_at(list, (size_t)i)));
    sr_value_unref(list);
    sr_optim_opts o;
    sr_optim_opts_default(SR_OPTIM_SGD, &o);
    o.lr = 0.1;
    WCHECK(sr_dist_optim_create(SR_OPTIM_SGD, &o, t->params, NPARAMS, &t->optim) == 0, "optim: %s",
           sr_last_error());
    sr_generator_init(&t->g, (uint64_t)sr_rank());
    return 0;
}

static void trainer_teardown(struct trainer *t)
{
    sr_dist_optim_destroy(t->optim);
    for (int i = 0; i < NPARAMS; i++)
        sr_rref_unref(t->params[i]);
}

static bool scheduled;

static int scenario(int rank, int world)
{
    (void)world;
    if (rank == 0)
        return server();
    struct trainer t = {0};
    int rc = trainer_setup(&t);
    for (int i = 0; !rc && i < (scheduled ? ROUNDS : FREE_STEPS); i++)
        rc = scheduled ? scheduled_round(&t, i) : free_step(&t, i);
    trainer_teardown(&t);
    WCHECK(rc == 0, "trainer %d failed", rank);
    return call_int("sv_done", rank);
}

Test(train_concurrent, interleaved_steps_give_every_trainer_the_gradient_of_its_own_forward, .timeout = 120)
{
    scheduled = true;
    RUN_JOB("trsched", 1 + TRAINERS, .scenario = scenario, .register_fns = register_fns);
}

Test(train_concurrent, free_running_trainers_need_no_lock, .timeout = 120)
{
    scheduled = false;
    RUN_JOB("trfree", 1 + TRAINERS, .scenario = scenario, .register_fns = register_fns);
}
