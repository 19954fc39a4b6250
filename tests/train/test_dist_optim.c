/* SPDX-License-Identifier: MIT */
/* The distributed optimizer: PyTorch's dist_optimizer_test.py ported (two
 * modules on two other workers, one step in a context, equal to the same
 * computation done locally), every optimizer kind over two steps, missing
 * gradients, failures on an owner in step and in the constructor, unknown
 * contexts, and three trainers stepping one parameter server at once. Also
 * run under the reordering mode (tests/meson.build). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "dist_autograd_seam.h" /* sr__dctx_accumulate_grad */
#include "dist_optim/dist_optim_impl.h"
#include "rpc_harness.h"
#include "shmrpc/dist_autograd.h"
#include "shmrpc/dist_optim.h"
#include "shmrpc/rref.h"
#include "shmrpc/tensor.h"

LEAK_CHECKED_SUITE(dist_optim);

#define WAIT_S 30.0 /* bound of every wait in these tests */

/* PYTORCH_SEMANTICS.md, test 78's worked example: both modules start at W. */
static const double W0[9] = {1, 2, 0, 0, 1, 3, 1, 0, 1};
static const double T2[9] = {1, 0, 2, 0, 1, 0, 1, 1, 0};
static const double T1[9] = {0.5, -1, 2, 0, 3, 1, -2, 0.25, 1}; /* "any t1" */
static const int64_t SHAPE33[2] = {3, 3};

static sr_tensor *mat33(const double *v, bool grad)
{
    return sr_from_data(SR_F64, 2, SHAPE33, v, grad ? SR_REQUIRES_GRAD : 0);
}

static bool near(const double *a, const double *b, size_t n, double tol)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabs(a[i] - b[i]) <= tol * (1 + fabs(b[i]))))
            return false;
    return true;
}

/* ---- MyModule: w (3x3), forward(x) = w @ x, on its owner ---- */

struct module {
    sr_tensor *w;
};

static void module_free(void *p)
{
    struct module *m = p;
    sr_tensor_unref(m->w);
    free(m);
}

static struct module *module_of(sr_call *c)
{
    sr_value *v = sr_call_arg(c, 0);
    return sr_value_object(v) && !strcmp(sr_value_object_type(v), "MyModule") ? sr_value_object(v) : NULL;
}

/* mod_new(w0, requires_grad): a MyModule holding a leaf copy of w0. */
static int fn_mod_new(sr_call *c)
{
    double w[9];
    sr_tensor *t = sr_value_tensor(sr_call_arg(c, 0));
    if (!t || sr_tensor_numel(t) != 9 || sr_tensor_to_f64(t, w, 9))
        return sr_call_fail(c, -EINVAL, "mod_new wants a 3x3 tensor");
    struct module *m = calloc(1, sizeof(*m));
    m->w = mat33(w, sr_value_bool(sr_call_arg(c, 1)));
    return sr_call_return(c, sr_object(m, module_free, "MyModule"));
}

/* mod_get_w(module), a proxy call: the module's w itself. */
static int fn_mod_get_w(sr_call *c)
{
    struct module *m = module_of(c);
    return m ? sr_call_return(c, sr_value_from_tensor(m->w)) : sr_call_fail(c, -EINVAL, "not a MyModule");
}

/* call_get_w(module RRef): as PyTorch's remote_method(MyModule.get_w, rref). */
static int fn_call_get_w(sr_call *c)
{
    sr_value *v = NULL;
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    int rc = r ? sr_rref_local_value(r, &v) : -EINVAL;
    struct module *m = rc ? NULL : sr_value_object(v);
    sr_value_unref(v); /* the RRef keeps the module */
    return m ? sr_call_return(c, sr_value_from_tensor(m->w)) : sr_call_fail(c, -EINVAL, "no module: %s", sr_last_error());
}

/* mod_forward(module, x), a proxy call: w @ x. */
static int fn_mod_forward(sr_call *c)
{
    struct module *m = module_of(c);
    sr_tensor *y = m ? sr_mm(m->w, sr_value_tensor(sr_call_arg(c, 1))) : NULL;
    if (!y)
        return sr_call_fail(c, -EINVAL, "forward: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(y);
    sr_tensor_unref(y);
    return sr_call_return(c, v);
}

/* bad_grad(module, context id), a proxy call: stores a gradient of shape [2]
 * for w in the context, as if a backward pass had. */
static int fn_bad_grad(sr_call *c)
{
    struct module *m = module_of(c);
    if (!m)
        return sr_call_fail(c, -EINVAL, "bad_grad: no module");
    sr_tensor *g = sr_from_data(SR_F64, 1, (const int64_t[]){2}, (const double[]){1, 2}, 0);
    int rc = sr__dctx_accumulate_grad(sr_value_int(sr_call_arg(c, 1)), m->w, g);
    sr_tensor_unref(g);
    return rc ? sr_call_fail(c, rc, "bad_grad: %s", sr_last_error()) : sr_call_return(c, NULL);
}

/* dopt_stats(): [steps run here, most steps inside the lock at once]. */
static int fn_dopt_stats(sr_call *c)
{
    struct sr__dist_optim_stats s;
    sr__dist_optim_stats_get(&s);
    sr_value *a = sr_int((int64_t)s.steps), *b = sr_int(s.max_inside);
    sr_value *l = sr_list(2, (sr_value *[]){a, b});
    sr_value_unref(a);
    sr_value_unref(b);
    return sr_call_return(c, l);
}

/* ---- the PyTorch scenario on three workers: trainer 0, owners 1 and 2 ---- */

struct remote_modules {
    sr_rref *m[2]; /* the modules, on workers 1 and 2 */
    sr_rref *p[2]; /* their w, as parameter RRefs */
};

static int make_modules(struct remote_modules *rm, bool grad2, bool by_proxy)
{
    sr_tensor *w0 = mat33(W0, false);
    sr_value *wv = sr_value_from_tensor(w0);
    for (int k = 0; k < 2; k++) {
        sr_value *rg = sr_bool(k == 0 || grad2);
        WCHECK(sr_remote(k + 1, "mod_new", SR_ARGS(wv, rg), WAIT_S, &rm->m[k]) == 0, "remote: %s", sr_last_error());
        sr_value_unref(rg);
        if (by_proxy) { /* remote_module.remote().get_w() */
            WCHECK(sr_rref_remote(rm->m[k], "mod_get_w", SR_NOARGS, WAIT_S, &rm->p[k]) == 0, "get_w: %s",
                   sr_last_error());
        } else { /* remote_method(MyModule.get_w, remote_module) */
            sr_value *mv = sr_value_from_rref(rm->m[k]);
            WCHECK(sr_remote(k + 1, "call_get_w", SR_ARGS(mv), WAIT_S, &rm->p[k]) == 0, "remote_method: %s",
                   sr_last_error());
            sr_value_unref(mv);
        }
    }
    sr_value_unref(wv);
    sr_tensor_unref(w0);
    return 0;
}

static void drop_modules(struct remote_modules *rm)
{
    for (int k = 0; k < 2; k++) {
        sr_rref_unref(rm->p[k]);
        sr_rref_unref(rm->m[k]);
    }
}

/* The owner's w of module k, now, into out[9]. */
static int read_w(struct remote_modules *rm, int k, double *out)
{
    sr_value *v = NULL;
    WCHECK(sr_rref_rpc_sync(rm->m[k], "mod_get_w", SR_NOARGS, WAIT_S, &v) == 0, "get_w: %s", sr_last_error());
    WCHECK(sr_tensor_to_f64(sr_value_tensor(v), out, 9) == 0, "w is not a 3x3 tensor");
    sr_value_unref(v);
    return 0;
}

/* A remote proxy call forward(x) on module k, waited for. */
static sr_tensor *remote_forward(struct remote_modules *rm, int k, sr_tensor *x)
{
    sr_value *xv = sr_value_from_tensor(x), *out = NULL;
    sr_future *f = NULL;
    int rc = sr_rref_rpc_async(rm->m[k], "mod_forward", SR_ARGS(xv), WAIT_S, &f);
    if (!rc)
        rc = sr_future_wait(f, &out);
    sr_future_unref(f);
    sr_value_unref(xv);
    sr_tensor *y = rc ? NULL : sr_tensor_ref(sr_value_tensor(out));
    sr_value_unref(out);
    return y;
}

/* loss = sum(w2 @ (w1 @ t2) + t1), forward through both modules. */
static sr_tensor *dist_loss(struct remote_modules *rm, sr_tensor *t1, sr_tensor *t2)
{
    sr_tensor *o1 = remote_forward(rm, 0, t2);
    sr_tensor *o2 = o1 ? remote_forward(rm, 1, o1) : NULL;
    sr_tensor *s = o2 ? sr_add(o2, t1) : NULL, *loss = s ? sr_sum(s) : NULL;
    sr_tensor_unref(o1);
    sr_tensor_unref(o2);
    sr_tensor_unref(s);
    return loss;
}

/* One distributed iteration: a context, forward, backward, step, end. */
static int dist_iteration(struct remote_modules *rm, sr_dist_optim *d, sr_tensor *t1, sr_tensor *t2)
{
    int64_t ctx;
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "begin: %s", sr_last_error());
    sr_tensor *loss = dist_loss(rm, t1, t2);
    WCHECK(loss, "forward: %s", sr_last_error());
    WCHECK(sr_dist_autograd_backward(ctx, &loss, 1, false) == 0, "backward: %s", sr_last_error());
    WCHECK(sr_dist_optim_step(d, ctx) == 0, "step: %s", sr_last_error());
    WCHECK(!sr_tensor_grad(t1) && !sr_tensor_grad(t2), "a distributed step wrote .grad");
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "end: %s", sr_last_error());
    sr_tensor_unref(loss);
    return 0;
}

/* The same computation with local tensors and a local optimizer over
 * params (w1, w2 and, if opt_t1, t1). */
static int local_iteration(sr_optim *o, sr_tensor *w1, sr_tensor *w2, sr_tensor *t1, sr_tensor *t2)
{
    WCHECK(sr_optim_zero_grad(o, true) == 0, "zero_grad: %s", sr_last_error());
    sr_tensor *o1 = sr_mm(w1, t2), *o2 = sr_mm(w2, o1), *s = sr_add(o2, t1), *loss = sr_sum(s);
    WCHECK(loss && sr_backward(loss, false) == 0, "local backward: %s", sr_last_error());
    WCHECK(sr_optim_step(o) == 0, "local step: %s", sr_last_error());
    sr_tensor_unref(o1);
    sr_tensor_unref(o2);
    sr_tensor_unref(s);
    sr_tensor_unref(loss);
    return 0;
}

/* test_dist_optim: SGD(lr=0.05), one step; the worked example's numbers. */
static int sc_pytorch(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_tensor *w1 = mat33(W0, true), *w2 = mat33(W0, true), *t1 = mat33(T1, true), *t2 = mat33(T2, true);
    sr_optim_opts oo;
    sr_optim_opts_default(SR_OPTIM_SGD, &oo);
    oo.lr = 0.05;
    sr_optim *lo = NULL;
    WCHECK(sr_optim_create(SR_OPTIM_SGD, &oo, (sr_tensor *[]){w1, w2}, 2, &lo) == 0, "local: %s", sr_last_error());
    if (local_iteration(lo, w1, w2, t1, t2))
        return 1;

    struct remote_modules rm;
    if (make_modules(&rm, true, false))
        return 1;
    double got[9], want[9];
    for (int k = 0; k < 2; k++) { /* sanity: the owners start at W */
        sr_value *v = NULL;
        WCHECK(sr_rref_to_here(rm.p[k], WAIT_S, &v) == 0, "to_here: %s", sr_last_error());
        WCHECK(sr_tensor_to_f64(sr_value_tensor(v), got, 9) == 0 && near(got, W0, 9, 0), "w%d does not start at W",
               k + 1);
        sr_value_unref(v);
    }
    sr_dist_optim *d = NULL;
    WCHECK(sr_dist_optim_create(SR_OPTIM_SGD, &oo, rm.p, 2, &d) == 0, "create: %s", sr_last_error());
    sr_tensor *u1 = mat33(T1, true), *u2 = mat33(T2, true); /* fresh inputs, as torch's test draws them again */
    if (dist_iteration(&rm, d, u1, u2))
        return 1;
    sr_tensor_unref(u1);
    sr_tensor_unref(u2);
    static const double new_w1[9] = {0.70, 1.90, -0.20, -0.45, 0.85, 2.70, 0.40, -0.20, 0.60};
    static const double new_w2[9] = {0.75, 1.65, -0.25, -0.25, 0.65, 2.75, 0.75, -0.35, 0.75};
    sr_tensor *lw[2] = {w1, w2};
    const double *ex[2] = {new_w1, new_w2};
    for (int k = 0; k < 2; k++) {
        if (read_w(&rm, k, got))
            return 1;
        WCHECK(!near(got, W0, 9, 0), "w%d did not change", k + 1);
        WCHECK(sr_tensor_to_f64(lw[k], want, 9) == 0 && near(got, want, 9, 1e-15), "w%d differs from the local run",
               k + 1);
        WCHECK(near(got, ex[k], 9, 1e-14), "w%d differs from the worked example", k + 1);
    }
    sr_dist_optim_destroy(d);
    drop_modules(&rm);
    sr_optim_destroy(lo);
    sr_tensor_unref(w1);
    sr_tensor_unref(w2);
    sr_tensor_unref(t1);
    sr_tensor_unref(t2);
    return 0;
}

/* ---- every kind, two steps ---- */

/* PyTorch's list in test_dist_optim (the latest version): kind and options
 * of configuration i < NCONFIGS. */
#define NCONFIGS 9
static sr_optim_kind pytorch_config(int i, sr_optim_opts *o)
{
    static const sr_optim_kind kinds[NCONFIGS] = {SR_OPTIM_ADAGRAD, SR_OPTIM_ADAM,     SR_OPTIM_ADAMW,
                                                  SR_OPTIM_SGD,     SR_OPTIM_SGD,      SR_OPTIM_ADADELTA,
                                                  SR_OPTIM_RMSPROP, SR_OPTIM_ADAMAX,   SR_OPTIM_RPROP};
    sr_optim_kind k = kinds[i];
    sr_optim_opts_default(k, o);
    static const double lr[NCONFIGS] = {0.05, 1e-2, 0.05, 0.05, 1e-3, NAN, 0.05, 0.05, 0.05};
    if (!isnan(lr[i]))
        o->lr = lr[i];
    o->amsgrad = i == 1 || i == 2;
    if (i == 4) { /* SGD(lr=1e-3, momentum=1, weight_decay=1, nesterov=True) */
        o->momentum = 1;
        o->weight_decay = 1;
        o->nesterov = true;
    }
    if (i == 5) /* Adadelta(rho=0.95) */
        o->rho = 0.95;
    return k;
}

/* The owners' w1, w2 and the trainer's t1 equal the local run's. */
static int expect_equal_to_local(struct remote_modules *rm, sr_tensor *t1, sr_tensor *const *local, int config,
                                 int it)
{
    double got[9], want[9];
    for (int k = 0; k < 3; k++) {
        if (k < 2 && read_w(rm, k, got))
            return 1;
        WCHECK(k < 2 || sr_tensor_to_f64(t1, got, 9) == 0, "t1 is not 3x3");
        WCHECK(sr_tensor_to_f64(local[k], want, 9) == 0 && near(got, want, 9, 1e-14),
               "config %d (%s), step %d: %s differs from the local run: %.17g vs %.17g", config,
               sr_optim_kind_name(pytorch_config(config, &(sr_optim_opts){0})), it, k == 2 ? "t1" : k ? "w2" : "w1",
               got[0], want[0]);
        WCHECK(!near(got, k == 2 ? T1 : W0, 9, 0), "config %d: parameter %d never moved", config, k);
    }
    return 0;
}

/* One configuration: parameters w1 (worker1), t1 (this worker, an OwnerRRef
 * of a local leaf) and w2 (worker2), in that order, so creation groups
 * three owners out of order; two iterations, checked after each. */
static int one_config(int i)
{
    sr_optim_opts oo;
    sr_optim_kind kind = pytorch_config(i, &oo);
    sr_tensor *lw1 = mat33(W0, true), *lw2 = mat33(W0, true), *lt1 = mat33(T1, true), *lt2 = mat33(T2, true);
    sr_tensor *local[3] = {lw1, lw2, lt1};
    sr_optim *lo = NULL;
    WCHECK(sr_optim_create(kind, &oo, local, 3, &lo) == 0, "local: %s", sr_last_error());
    struct remote_modules rm;
    if (make_modules(&rm, true, i % 2))
        return 1;
    sr_tensor *t1 = mat33(T1, true), *t2 = mat33(T2, true);
    sr_value *t1v = sr_value_from_tensor(t1);
    sr_rref *p0 = NULL;
    WCHECK(sr_rref_create(t1v, &p0) == 0, "RRef(t1): %s", sr_last_error());
    sr_dist_optim *d = NULL;
    WCHECK(sr_dist_optim_create(kind, &oo, (sr_rref *[]){rm.p[0], p0, rm.p[1]}, 3, &d) == 0, "create: %s",
           sr_last_error());
    for (int it = 0; it < 2; it++)
        if (local_iteration(lo, lw1, lw2, lt1, lt2) || dist_iteration(&rm, d, t1, t2) ||
            expect_equal_to_local(&rm, t1, local, i, it))
            return 1;
    sr_dist_optim_destroy(d);
    sr_rref_unref(p0);
    sr_value_unref(t1v);
    drop_modules(&rm);
    sr_optim_destroy(lo);
    for (int k = 0; k < 3; k++)
        sr_tensor_unref(local[k]);
    sr_tensor_unref(lt2);
    sr_tensor_unref(t1);
    sr_tensor_unref(t2);
    return 0;
}

/* The local optimizers alive on worker w (they go with their last RRef). */
static int64_t live_on(int w)
{
    sr_value *v = NULL;
    if (sr_rpc_sync(w, "dopt_stats", SR_NOARGS, WAIT_S, &v))
        return -1;
    int64_t n = sr_value_int(sr_value_list_at(v, 2));
    sr_value_unref(v);
    return n;
}

/* The configuration of the job (set by the test before sr_spawn forks): one
 * per job, so a failure names its kind. */
static int job_config;

static int sc_all_kinds(int rank, int world)
{
    if (rank != 0)
        return 0;
    if (one_config(job_config))
        return 1;
    /* Destroy dropped every owner's optimizer once its deletes were applied. */
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    for (int w = 0; w < world; w++)
        WCHECK(live_on(w) == 0, "worker%d still has %lld local optimizers", w, (long long)live_on(w));
    return 0;
}

/* ---- missing gradients ---- */

/* test_dist_optim_none_grads: module 2's w does not require grad, so the
 * context holds no gradient for it; it stays as it was, w1 moves as in the
 * local run. Parameters through remote_module.remote().get_w(). */
static int sc_none_grads(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_optim_opts oo;
    sr_optim_kind kind = pytorch_config(job_config, &oo);
    sr_tensor *w1 = mat33(W0, true), *w2 = mat33(W0, false), *t1 = mat33(T1, true), *t2 = mat33(T2, true);
    sr_optim *lo = NULL;
    WCHECK(sr_optim_create(kind, &oo, (sr_tensor *[]){w1, w2}, 2, &lo) == 0, "local: %s", sr_last_error());
    if (local_iteration(lo, w1, w2, t1, t2))
        return 1;
    struct remote_modules rm;
    sr_dist_optim *d = NULL;
    if (make_modules(&rm, false, true))
        return 1;
    WCHECK(sr_dist_optim_create(kind, &oo, rm.p, 2, &d) == 0, "create: %s", sr_last_error());
    sr_tensor *u1 = mat33(T1, true), *u2 = mat33(T2, true);
    if (dist_iteration(&rm, d, u1, u2))
        return 1;
    double got[9], want[9];
    if (read_w(&rm, 1, got))
        return 1;
    WCHECK(near(got, W0, 9, 0), "%s: w2 had no gradient and moved", sr_optim_kind_name(kind));
    if (read_w(&rm, 0, got))
        return 1;
    WCHECK(sr_tensor_to_f64(w1, want, 9) == 0 && near(got, want, 9, 1e-14) && !near(got, W0, 9, 0),
           "%s: w1 differs from the local run", sr_optim_kind_name(kind));
    sr_dist_optim_destroy(d);
    drop_modules(&rm);
    sr_optim_destroy(lo);
    sr_tensor *ts[6] = {w1, w2, t1, t2, u1, u2};
    for (int k = 0; k < 6; k++)
        sr_tensor_unref(ts[k]);
    return 0;
}

/* ---- failures ---- */

/* w of module k is W0 - lr * G (G given), or W0 when G is NULL. */
static int expect_w(struct remote_modules *rm, int k, const double *g, double lr, const char *what)
{
    double got[9], want[9];
    if (read_w(rm, k, got))
        return 1;
    for (int i = 0; i < 9; i++)
        want[i] = g ? W0[i] - lr * g[i] : W0[i];
    WCHECK(near(got, want, 9, 1e-15), "%s: w%d is %g %g %g ..., want %g %g %g ...", what, k + 1, got[0], got[1],
           got[2], want[0], want[1], want[2]);
    return 0;
}

/* A step that fails on one owner (a gradient of the wrong shape on worker2)
 * reports it after the other owner stepped; one that fails on both (neither
 * owner ever saw the context) reports the last owner's error; unknown ids
 * are refused here with PyTorch's text. */
static int sc_step_errors(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    struct remote_modules rm;
    if (make_modules(&rm, true, true))
        return 1;
    sr_optim_opts oo;
    sr_optim_opts_default(SR_OPTIM_SGD, &oo);
    oo.lr = 0.05;
    sr_dist_optim *d = NULL;
    WCHECK(sr_dist_optim_create(SR_OPTIM_SGD, &oo, rm.p, 2, &d) == 0, "create: %s", sr_last_error());

    int64_t ctx;
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "begin: %s", sr_last_error());
    sr_tensor *t2 = mat33(T2, true), *o1 = remote_forward(&rm, 0, t2), *loss = o1 ? sr_sum(o1) : NULL;
    WCHECK(loss && sr_dist_autograd_backward(ctx, &loss, 1, false) == 0, "backward: %s", sr_last_error());
    sr_value *cv = sr_int(ctx);
    WCHECK(sr_rref_rpc_sync(rm.m[1], "bad_grad", SR_ARGS(cv), WAIT_S, NULL) == 0, "bad_grad: %s", sr_last_error());
    int rc = sr_dist_optim_step(d, ctx);
    WEXPECT_ERR(rc, -SR_EREMOTE, "sr_dist_optim_step: Error running optimizer. Error on Node 2: ");
    WEXPECT_ERR(rc, -SR_EREMOTE, "gradient 0 has shape [2] but its parameter has shape [3, 3]");
    /* sum(w1 @ t2): every row of G1 is t2's row sums. */
    static const double g1[9] = {3, 1, 2, 3, 1, 2, 3, 1, 2};
    if (expect_w(&rm, 0, g1, 0.05, "the owner that did not fail") || expect_w(&rm, 1, NULL, 0, "the failed owner"))
        return 1;
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "end: %s", sr_last_error());
    char want[192];
    snprintf(want, sizeof(want), "Could not find autograd context with id: %lld", (long long)ctx);
    WEXPECT_ERR(sr_dist_optim_step(d, ctx), -EINVAL, want); /* ended */
    WEXPECT_ERR(sr_dist_optim_step(d, 12345), -EINVAL, "Could not find autograd context with id: 12345");

    int64_t ctx2; /* a context no owner has seen */
    WCHECK(sr_dist_autograd_context_begin(&ctx2) == 0, "begin: %s", sr_last_error());
    snprintf(want, sizeof(want),
             "Error on Node 2: in 'sr.dist_optim.step': sr_dist_autograd_get_gradient: Could not find autograd "
             "context with id: %lld", (long long)ctx2);
    WEXPECT_ERR(sr_dist_optim_step(d, ctx2), -SR_EREMOTE, want);
    WCHECK(sr_dist_autograd_context_end(ctx2) == 0, "end: %s", sr_last_error());
    if (expect_w(&rm, 0, g1, 0.05, "after a failed step") || expect_w(&rm, 1, NULL, 0, "after a failed step"))
        return 1;
    WEXPECT_ERR(sr_dist_optim_step(NULL, ctx2), -EINVAL, "NULL");
    sr_value_unref(cv);
    sr_tensor_unref(loss);
    sr_tensor_unref(o1);
    sr_tensor_unref(t2);
    sr_dist_optim_destroy(d);
    drop_modules(&rm);
    return 0;
}

/* Constructor errors come back with the owner's text, after every owner
 * answered; the optimizers the other owners built are dropped again. */
static int sc_ctor_errors(int rank, int world)
{
    if (rank != 0)
        return 0;
    struct remote_modules rm;
    if (make_modules(&rm, true, false))
        return 1;
    sr_optim_opts oo;
    sr_optim_opts_default(SR_OPTIM_SGD, &oo);
    oo.lr = -1;
    sr_dist_optim *d = (sr_dist_optim *)&oo; /* must be reset to NULL */
    WEXPECT_ERR(sr_dist_optim_create(SR_OPTIM_SGD, &oo, rm.p, 2, &d), -SR_EREMOTE,
                "sr_dist_optim_create: Error creating optimizer. Error on Node 2: in 'sr.dist_optim.new': "
                "sr_optim_create: SGD: Invalid learning rate: -1.0");
    WCHECK(d == NULL, "a failed create left *out set");
    WEXPECT_ERR(sr_dist_optim_create(SR_OPTIM_SGD, NULL, rm.p, 2, &d), -SR_EREMOTE,
                "parameter group didn't specify a value of required optimization parameter lr");
    /* Worker1 builds its optimizer, worker2 fails: the module is no tensor. */
    WEXPECT_ERR(sr_dist_optim_create(SR_OPTIM_ADAM, NULL, (sr_rref *[]){rm.p[0], rm.m[1]}, 2, &d), -SR_EREMOTE,
                "Error creating optimizer. Error on Node 2: in 'sr.dist_optim.new': parameter 0 holds a object, "
                "not a tensor");
    WEXPECT_ERR(sr_dist_optim_create(SR_OPTIM_ADAM, NULL, (sr_rref *[]){rm.p[0], rm.p[0]}, 2, &d), -SR_EREMOTE,
                "Error on Node 1: in 'sr.dist_optim.new': sr_optim_create: parameter 1 is parameter 0 again");
    WEXPECT_ERR(sr_dist_optim_create(SR_OPTIM_ADAM, NULL, (sr_rref *[]){rm.p[0], NULL}, 2, &d), -EINVAL,
                "parameter RRef 1 is NULL");
    WEXPECT_ERR(sr_dist_optim_create((sr_optim_kind)42, NULL, rm.p, 2, &d), -EINVAL, "bad optimizer kind 42");
    WEXPECT_ERR(sr_dist_optim_create(SR_OPTIM_ADAM, NULL, rm.p, 2, NULL), -EINVAL, "out is NULL");
    /* No parameters: nothing to build, a step that does nothing (torch's). */
    int64_t ctx;
    WCHECK(sr_dist_optim_create(SR_OPTIM_ADAM, NULL, NULL, 0, &d) == 0, "empty: %s", sr_last_error());
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0 && sr_dist_optim_step(d, ctx) == 0, "empty step: %s",
           sr_last_error());
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "end: %s", sr_last_error());
    sr_dist_optim_destroy(d);
    sr_dist_optim_destroy(NULL);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    for (int w = 0; w < world; w++)
        WCHECK(live_on(w) == 0, "worker%d kept %lld local optimizers of failed creations", w, (long long)live_on(w));
    drop_modules(&rm);
    return 0;
}

/* ---- three trainers, one parameter server ---- */

#define TRAINERS 3
#define ITERS 8
#define PS_LR 0.125 /* with small integers, every update and sum is exact */
static const int64_t PS_SHAPE[2] = {2, 3};

/* The loss weights of trainer r at iteration it: the gradient of
 * loss = sum((W + x) * c) for W is c, whatever W is. */
static void coeffs(int r, int it, double *c)
{
    for (int i = 0; i < 6; i++)
        c[i] = (double)((r * 7 + it * 3 + i * 5) % 11) - 5;
}

/* add_x(W, x), a proxy call on the parameter RRef: W + x (saves nothing, so
 * steps of other trainers between this forward and its backward are fine). */
static int fn_add_x(sr_call *c)
{
    sr_tensor *y = sr_add(sr_value_tensor(sr_call_arg(c, 0)), sr_value_tensor(sr_call_arg(c, 1)));
    if (!y)
        return sr_call_fail(c, -EINVAL, "add_x: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(y);
    sr_tensor_unref(y);
    return sr_call_return(c, v);
}

/* One trainer iteration in its own context: forward on the server, loss
 * here, backward, step. */
static int train_once(sr_rref *w, sr_dist_optim *d, int it)
{
    double xv[6] = {1, 2, 3, 4, 5, 6}, cv[6];
    coeffs(sr_rank(), it, cv);
    sr_tensor *x = sr_from_data(SR_F64, 2, PS_SHAPE, xv, 0), *c = sr_from_data(SR_F64, 2, PS_SHAPE, cv, 0);
    sr_value *xval = sr_value_from_tensor(x), *y = NULL;
    int64_t ctx;
    int rc = sr_dist_autograd_context_begin(&ctx);
    if (!rc)
        rc = sr_rref_rpc_sync(w, "add_x", SR_ARGS(xval), WAIT_S, &y);
    sr_tensor *p = rc ? NULL : sr_mul(sr_value_tensor(y), c), *loss = p ? sr_sum(p) : NULL;
    if (!rc)
        rc = loss ? sr_dist_autograd_backward(ctx, &loss, 1, false) : -EINVAL;
    if (!rc)
        rc = sr_dist_optim_step(d, ctx);
    if (ctx != SR_NO_CONTEXT && sr_dist_autograd_current_context() == ctx)
        sr_dist_autograd_context_end(ctx);
    sr_tensor *ts[4] = {x, c, p, loss};
    for (int i = 0; i < 4; i++)
        sr_tensor_unref(ts[i]);
    sr_value_unref(xval);
    sr_value_unref(y);
    return rc;
}

/* trainer(W RRef): its own distributed optimizer over W, ITERS iterations. */
static int fn_trainer(sr_call *c)
{
    sr_rref *w = sr_value_rref(sr_call_arg(c, 0));
    sr_optim_opts oo;
    sr_optim_opts_default(SR_OPTIM_SGD, &oo);
    oo.lr = PS_LR;
    sr_dist_optim *d = NULL;
    int rc = w ? sr_dist_optim_create(SR_OPTIM_SGD, &oo, &w, 1, &d) : -EINVAL;
    for (int it = 0; it < ITERS && !rc; it++)
        rc = train_once(w, d, it);
    sr_dist_optim_destroy(d);
    return rc ? sr_call_fail(c, rc, "trainer %d: %s", sr_rank(), sr_last_error()) : sr_call_return(c, NULL);
}

static int sc_trainers(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    double w0[6] = {1, -2, 3, 0.5, 8, -1}, want[6], got[6], cv[6];
    memcpy(want, w0, sizeof(want));
    for (int r = 1; r <= TRAINERS; r++)
        for (int it = 0; it < ITERS; it++) {
            coeffs(r, it, cv);
            for (int i = 0; i < 6; i++)
                want[i] -= PS_LR * cv[i];
        }
    sr_tensor *w = sr_from_data(SR_F64, 2, PS_SHAPE, w0, SR_REQUIRES_GRAD);
    sr_value *wv = sr_value_from_tensor(w);
    sr_rref *r = NULL;
    WCHECK(sr_rref_create(wv, &r) == 0, "RRef(W): %s", sr_last_error());
    sr_value *rv = sr_value_from_rref(r), *v = NULL;
    sr_future *fs[TRAINERS];
    for (int t = 0; t < TRAINERS; t++)
        WCHECK(sr_rpc_async(t + 1, "trainer", SR_ARGS(rv), WAIT_S * 4, &fs[t]) == 0, "trainer: %s", sr_last_error());
    WCHECK(sr_future_wait_all(fs, TRAINERS, &v) == 0, "trainers: %s", sr_last_error());
    sr_value_unref(v);
    for (int t = 0; t < TRAINERS; t++)
        sr_future_unref(fs[t]);
    WCHECK(sr_tensor_to_f64(w, got, 6) == 0 && near(got, want, 6, 0),
           "W after %d steps is %g %g %g %g %g %g, want %g %g %g %g %g %g", TRAINERS * ITERS, got[0], got[1], got[2],
           got[3], got[4], got[5], want[0], want[1], want[2], want[3], want[4], want[5]);
    struct sr__dist_optim_stats s;
    sr__dist_optim_stats_get(&s);
    WCHECK(s.steps == TRAINERS * ITERS && s.max_inside == 1, "%llu steps here, up to %u at once",
           (unsigned long long)s.steps, s.max_inside);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0 && live_on(0) == 0, "the trainers' optimizers are still alive");
    sr_rref_unref(r);
    sr_value_unref(rv);
    sr_value_unref(wv);
    sr_tensor_unref(w);
    return 0;
}

/* ---- job plumbing ---- */

static void register_fns(void)
{
    sr_register("mod_new", fn_mod_new);
    sr_register("mod_get_w", fn_mod_get_w);
    sr_register("call_get_w", fn_call_get_w);
    sr_register("mod_forward", fn_mod_forward);
    sr_register("bad_grad", fn_bad_grad);
    sr_register("dopt_stats", fn_dopt_stats);
    sr_register("add_x", fn_add_x);
    sr_register("trainer", fn_trainer);
}

/* A failing worker leaves at once, so the job ends with its report instead
 * of its peers waiting out their shutdown bounds. */
static scenario_fn scenario; /* set by the test before sr_spawn forks */

static int fail_fast(int rank, int world)
{
    int rc = scenario(rank, world);
    if (rc) {
        fflush(stderr);
        _exit(rc);
    }
    return 0;
}

#define DOPT_JOB(name, world, sc, ...)                                                                   \
    do {                                                                                                 \
        scenario = sc;                                                                                   \
        RUN_JOB(name, world, .scenario = fail_fast, .register_fns = register_fns, .shutdown_timeout = 60,  \
                __VA_ARGS__);                                                                            \
    } while (0)

Test(dist_optim, pytorch_dist_optim_sgd_worked_example, .timeout = 120)
{
    DOPT_JOB("doptpt", 3, sc_pytorch);
}

/* Every configuration of PyTorch's list: Adagrad, Adam(amsgrad), AdamW
 * (amsgrad), SGD, SGD(momentum, weight decay, nesterov), Adadelta, RMSprop,
 * Adamax, Rprop. */
#define KIND_TEST(i, name)                                                 \
    Test(dist_optim, two_steps_equal_local_##name, .timeout = 120)         \
    {                                                                      \
        job_config = i;                                                    \
        DOPT_JOB("doptkind" #i, 3, sc_all_kinds);                          \
    }
KIND_TEST(0, adagrad)
KIND_TEST(1, adam_amsgrad)
KIND_TEST(2, adamw_amsgrad)
KIND_TEST(3, sgd)
KIND_TEST(4, sgd_nesterov)
KIND_TEST(5, adadelta)
KIND_TEST(6, rmsprop)
KIND_TEST(7, adamax)
KIND_TEST(8, rprop)

/* test_dist_optim_none_grads's kinds: SGD, RMSprop, Rprop, Adadelta. */
#define NONE_TEST(i, name)                                                 \
    Test(dist_optim, none_grads_unchanged_##name, .timeout = 120)          \
    {                                                                      \
        job_config = i;                                                    \
        DOPT_JOB("doptnone" #i, 3, sc_none_grads);                         \
    }
NONE_TEST(3, sgd)
NONE_TEST(6, rmsprop)
NONE_TEST(8, rprop)
NONE_TEST(5, adadelta)

Test(dist_optim, step_error_on_one_owner_after_all_answered, .timeout = 120)
{
    DOPT_JOB("dopterr", 3, sc_step_errors);
}

Test(dist_optim, constructor_error_raised_with_owner_text, .timeout = 120)
{
    DOPT_JOB("doptctor", 3, sc_ctor_errors);
}

Test(dist_optim, three_trainers_step_one_server_concurrently, .timeout = 240)
{
    DOPT_JOB("dopttrain", 1 + TRAINERS, sc_trainers);
}
