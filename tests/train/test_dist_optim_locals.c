/* SPDX-License-Identifier: MIT */
/* The two dist_optim accessors a parameter server's checkpoint uses:
 * a trainer hands its local optimizer's RRef to the owner
 * (sr_dist_optim_local_rref), and the owner reaches that optimizer under the
 * worker's step lock (sr_dist_optim_with_locals): its parameters and its
 * state are those of the steps made, and a bad RRef is refused before the
 * callback runs. */
#include "rpc_harness.h"
#include "shmrpc/dist_autograd.h"
#include "shmrpc/dist_optim.h"
#include "shmrpc/rref.h"

LEAK_CHECKED_SUITE(dist_optim_locals);

static sr_tensor *w;   /* rank 0: the parameter, [2] f64 = {1, -2} */
static sr_rref *w_ref; /* rank 0: its RRef */

/* own_param() -> RRef(w), made on first use. */
static int own_param(sr_call *c)
{
    if (!w_ref) {
        w = sr_from_data(SR_F64, 1, (const int64_t[]){2}, (const double[]){1, -2}, SR_REQUIRES_GRAD);
        sr_value *v = sr_value_from_tensor(w);
        if (sr_rref_create(v, &w_ref))
            return sr_call_fail(c, -EINVAL, "%s", sr_last_error());
        sr_value_unref(v);
    }
    return sr_call_return(c, sr_value_from_rref(w_ref));
}

/* loss() -> sum(w * w): its gradient is 2 w. */
static int loss(sr_call *c)
{
    sr_tensor *sq = sr_mul(w, w), *s = sr_sum(sq);
    sr_value *v = sr_value_from_tensor(s);
    sr_tensor_unref(sq);
    sr_tensor_unref(s);
    return sr_call_return(c, v);
}

/* After one SGD step (lr 0.1, momentum 0.9) from {1, -2}: w = {0.8, -1.6},
 * momentum_buffer = 2 w0 = {2, -4}. */
static int check_locked(sr_optim *const *os, size_t n, void *arg)
{
    (void)arg;
    double got[2], mom[2];
    size_t k;
    char **names;
    sr_tensor **ts;
    if (n != 1 || sr_optim_nparams(os[0]) != 1 || sr_optim_param(os[0], 0) != w)
        return sr_errorf(-EPROTO, "not the trainer's optimizer over w");
    if (sr_tensor_to_f64(w, got, 2) || got[0] != 0.8 || got[1] != -1.6)
        return sr_errorf(-EPROTO, "w is {%g, %g}", got[0], got[1]);
    int rc = sr_optim_state_export(os[0], &k, &names, &ts);
    if (rc)
        return rc;
    bool ok = k == 1 && !strcmp(names[0], "0.momentum_buffer") && !sr_tensor_to_f64(ts[0], mom, 2) &&
              mom[0] == 2 && mom[1] == -4;
    sr_optim_state_free(k, names, ts);
    return ok ? 0 : sr_errorf(-EPROTO, "unexpected optimizer state");
}

static int never(sr_optim *const *os, size_t n, void *arg)
{
    (void)os, (void)n;
    *(bool *)arg = true;
    return 0;
}

/* check(optimizer RRef) on the owner. */
static int check(sr_call *c)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    int rc = sr_dist_optim_with_locals(&r, 1, check_locked, NULL);
    if (rc)
        return sr_call_fail(c, rc, "with_locals: %s", sr_last_error());
    bool ran = false;
    sr_rref *bad[2] = {w_ref, NULL};
    if (sr_dist_optim_with_locals(&bad[0], 1, never, &ran) != -EINVAL || ran ||
        !strstr(sr_last_error(), "does not hold a local optimizer"))
        return sr_call_fail(c, -EPROTO, "a parameter's RRef was taken for an optimizer's: %s", sr_last_error());
    if (sr_dist_optim_with_locals(&bad[1], 1, never, &ran) != -EINVAL || ran)
        return sr_call_fail(c, -EPROTO, "a NULL RRef was accepted");
    return sr_call_return(c, NULL);
}

/* release(): the owner drops its own references (the job goes on). */
static int release(sr_call *c)
{
    sr_rref_unref(w_ref);
    sr_tensor_unref(w);
    w_ref = NULL, w = NULL;
    return sr_call_return(c, NULL);
}

static void register_fns(void)
{
    sr_register("release", release);
    sr_register("own_param", own_param);
    sr_register("loss", loss);
    sr_register("check", check);
}

static int scenario(int rank, int world)
{
    (void)world;
    if (rank == 0)
        return 0; /* serves from sr_shutdown */
    sr_value *pv = NULL, *lv = NULL;
    WCHECK(sr_rpc_sync(0, "own_param", SR_NOARGS, 0, &pv) == 0, "own_param: %s", sr_last_error());
    sr_rref *p = sr_value_rref(pv);
    sr_optim_opts o;
    sr_optim_opts_default(SR_OPTIM_SGD, &o);
    o.lr = 0.1, o.momentum = 0.9;
    sr_dist_optim *d;
    WCHECK(sr_dist_optim_create(SR_OPTIM_SGD, &o, &p, 1, &d) == 0, "create: %s", sr_last_error());
    WCHECK(sr_dist_optim_local_rref(d, 0) && !sr_dist_optim_local_rref(d, 1) && !sr_dist_optim_local_rref(NULL, 0),
           "local_rref names the wrong owners");
    int64_t ctx;
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "begin: %s", sr_last_error());
    WCHECK(sr_rpc_sync(0, "loss", SR_NOARGS, 0, &lv) == 0, "loss: %s", sr_last_error());
    sr_tensor *l = sr_value_tensor(lv);
    WCHECK(sr_dist_autograd_backward(ctx, &l, 1, false) == 0, "backward: %s", sr_last_error());
    WCHECK(sr_dist_optim_step(d, ctx) == 0, "step: %s", sr_last_error());
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "end: %s", sr_last_error());
    sr_value *rv = sr_value_from_rref(sr_dist_optim_local_rref(d, 0));
    WCHECK(sr_rpc_sync(0, "check", SR_ARGS(rv), 0, NULL) == 0, "check: %s", sr_last_error());
    sr_value_unref(rv);
    sr_value_unref(lv);
    sr_dist_optim_destroy(d);
    sr_value_unref(pv);
    WCHECK(sr_rpc_sync(0, "release", SR_NOARGS, 0, NULL) == 0, "release: %s", sr_last_error());
    return 0;
}

Test(dist_optim_locals, the_owner_reads_a_trainers_optimizer_under_the_step_lock, .timeout = 60)
{
    RUN_JOB("doptloc", 2, .scenario = scenario, .register_fns = register_fns);
}
