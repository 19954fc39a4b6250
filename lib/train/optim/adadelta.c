/* SPDX-License-Identifier: MIT */
/* Adadelta, as torch.optim.Adadelta / _single_tensor_adadelta (1.13). */
#include <errno.h>

#include "error.h"
#include "optim_impl.h"

enum { STEP, SQUARE_AVG, ACC_DELTA };

static int check(const sr_optim_opts *o, const char *fn, const char *kind)
{
    char b[40];
    int rc = sr__optim_check_lr(o, fn, kind);
    if (!rc && !(0.0 <= o->rho && o->rho <= 1.0))
        rc = sr__fail(-EINVAL, fn, "%s: Invalid rho value: %s", kind, sr__optim_repr(o->rho, b, sizeof(b)));
    if (!rc)
        rc = sr__optim_check_eps(o, fn, kind);
    if (!rc)
        rc = sr__optim_check_wd(o, fn, kind);
    return rc;
}

static unsigned used(const sr_optim_opts *o)
{
    (void)o;
    return 1u << STEP | 1u << SQUARE_AVG | 1u << ACC_DELTA;
}

static int update(sr_optim *o, size_t i, sr_tensor *grad)
{
    const sr_optim_opts *op = &o->opts;
    double rho = op->rho, eps = op->eps;
    sr_tensor *param = o->params[i], *square_avg = *sr__optim_slot(o, i, SQUARE_AVG);
    sr_tensor *acc_delta = *sr__optim_slot(o, i, ACC_DELTA);
    struct sr__ox x = {0};
    sr__ox_count(&x, *sr__optim_slot(o, i, STEP)); /* torch counts it but never reads it */
    sr_tensor *g = sr__ox_grad(&x, grad, param, op->maximize, op->weight_decay);
    sr__ox_addcmul_(&x, sr__ox_mul_(&x, square_avg, rho), g, g, 1 - rho);
    sr_tensor *std = sr__ox_sqrt(&x, sr__ox_add_scalar_(&x, sr__ox_clone(&x, square_avg), eps));
    sr_tensor *rms_delta = sr__ox_sqrt(&x, sr__ox_add_scalar_(&x, sr__ox_clone(&x, acc_delta), eps));
    sr_tensor *delta = sr__ox_mul_t_(&x, sr__ox_div(&x, rms_delta, std), g);
    sr__ox_addcmul_(&x, sr__ox_mul_(&x, acc_delta, rho), delta, delta, 1 - rho);
    sr__ox_add_(&x, param, delta, -op->lr);
    return sr__ox_end(&x);
}

const struct sr__optim_ops sr__optim_adadelta = {
    .name = "Adadelta",
    .slots = {"step", "square_avg", "acc_delta"},
    .check = check,
    .used = used,
    .init = sr__optim_init_default,
    .update = update,
};
