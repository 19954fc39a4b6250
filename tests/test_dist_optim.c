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

#include "dist_autograd/context.h"
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
    return m ? sr_call_return(c, sr_tensor_value(m->w)) : sr_call_fail(c, -EINVAL, "not a MyModule");
}

/* call_get_w(module RRef): as PyTorch's remote_method(MyModule.get_w, rref). */
static int fn_call_get_w(sr_call *c)
{
    sr_value *v = NULL;
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    int rc = r ? sr_rref_local_value(r, &v) : -EINVAL;
    struct module *m = rc ? NULL : sr_value_object(v);
    sr_value_unref(v); /* the RRef keeps the module */
    return m ? sr_call_return(c, sr_tensor_value(m->w)) : sr_call_fail(c, -EINVAL, "no module: %s", sr_last_error());
}

/* mod_forward(module, x), a proxy call: w @ x. */
static int fn_mod_forward(sr_call *c)
{
    struct module *m = module_of(c);
    sr_tensor *y = m ? sr_mm(m->w, sr_value_tensor(sr_call_arg(c, 1))) : NULL;
    if (!y)
        return sr_call_fail(c, -EINVAL, "forward: %s", sr_last_error());
    sr_value *v = sr_tensor_value(y);
    sr_tensor_unref(y);
    return sr_call_return(c, v);
}

/* bad_grad(module, context id), a proxy call: stores a gradient of shape [2]
 * for w in the context, as if a backward pass had. */
static int fn_bad_grad(sr_call *c)
{
    struct module *m = module_of(c);
    bool released = false;
    sr_dctx *ctx = m ? sr__dctx_get_or_create(sr_value_int(sr_call_arg(c, 1)), &released) : NULL;
    if (!ctx)
        return sr_call_fail(c, -EINVAL, "bad_grad: no module or context");
    sr_tensor *g = sr_from_data(SR_F64, 1, (const int64_t[]){2}, (const double[]){1, 2}, 0);
    int rc = ctx->sink.accumulate(&ctx->sink, m->w, g);
    sr_tensor_unref(g);
    sr__dctx_unref(ctx);
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
    sr_value *wv = sr_tensor_value(w0);
    for (int k = 0; k < 2; k++) {
        sr_value *rg = sr_bool(k == 0 || grad2);
        WCHECK(sr_remote(k + 1, "mod_new", SR_ARGS(wv, rg), WAIT_S, &rm->m[k]) == 0, "remote: %s", sr_last_error());
        sr_value_unref(rg);
        if (by_proxy) { /* remote_module.remote().get_w() */
            WCHECK(sr_rref_remote(rm->m[k], "mod_get_w", SR_NOARGS, WAIT_S, &rm->p[k]) == 0, "get_w: %s",
                   sr_last_error());
        } else { /* remote_method(MyModule.get_w, remote_module) */
            sr_value *mv = sr_rref_value(rm->m[k]);
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
    sr_value *xv = sr_tensor_value(x), *out = NULL;
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

/* ---- job plumbing ---- */

static void register_fns(void)
{
    sr_register("mod_new", fn_mod_new);
    sr_register("mod_get_w", fn_mod_get_w);
    sr_register("call_get_w", fn_call_get_w);
    sr_register("mod_forward", fn_mod_forward);
    sr_register("bad_grad", fn_bad_grad);
    sr_register("dopt_stats", fn_dopt_stats);
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
