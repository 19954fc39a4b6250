/* SPDX-License-Identifier: MIT */
/* Adamax, as torch.optim.Adamax / _single_tensor_adamax (1.13): the second
 * moment is an exponentially weighted infinity norm. */
#include <math.h>

#include "optim_impl.h"

enum { STEP, EXP_AVG, EXP_INF };

static int check(const sr_optim_opts *o, const char *fn, const char *kind)
{
    return sr__optim_check_adam_like(o, fn, kind);
}

static unsigned used(const sr_optim_opts *o)
{
    (void)o;
    return 1u << STEP | 1u << EXP_AVG | 1u << EXP_INF;
}

static double abs_fn(const double *v, const void *arg)
{
    (void)arg;
    return fabs(v[0]);
}

static int update(sr_optim *o, size_t i, sr_tensor *grad)
{
    const sr_optim_opts *op = &o->opts;
    double beta1 = op->betas[0], beta2 = op->betas[1];
    sr_tensor *exp_avg = *sr__optim_slot(o, i, EXP_AVG), *exp_inf = *sr__optim_slot(o, i, EXP_INF);
    struct sr__ox x = {0};
    double step = sr__ox_count(&x, *sr__optim_slot(o, i, STEP));
    sr_tensor *g = sr__ox_grad(&x, grad, o->params[i], op->maximize, op->weight_decay);
    sr__ox_add_(&x, sr__ox_mul_(&x, exp_avg, beta1), g, 1 - beta1);
    /* exp_inf = amax([exp_inf * beta2, |grad| + eps]), NaN propagating */
    sr_tensor *norm = sr__ox_add_scalar_(&x, sr__ox_map(&x, &g, 1, abs_fn, NULL), op->eps);
    sr__ox_maximum_(&x, sr__ox_mul_(&x, exp_inf, beta2), norm);
    double clr = op->lr / (1 - pow(beta1, step));
    sr__ox_addcdiv_(&x, o->params[i], exp_avg, exp_inf, -clr);
    return sr__ox_end(&x);
}

const struct sr__optim_ops sr__optim_adamax = {
    .name = "Adamax",
    .slots = {"step", "exp_avg", "exp_inf"},
    .check = check,
    .used = used,
    .init = sr__optim_init_default,
    .update = update,
};
