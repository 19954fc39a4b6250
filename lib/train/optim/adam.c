/* SPDX-License-Identifier: MIT */
/* Adam and AdamW, as torch's _single_tensor_adam / _single_tensor_adamw
 * (1.13, not capturable): they differ only in how weight decay applies (L2
 * on the gradient, or decoupled on the parameter). */
#include <math.h>

#include "optim_impl.h"

enum { STEP, EXP_AVG, EXP_AVG_SQ, MAX_EXP_AVG_SQ };

static int check(const sr_optim_opts *o, const char *fn, const char *kind)
{
    return sr__optim_check_adam_like(o, fn, kind);
}

static unsigned used(const sr_optim_opts *o)
{
    return 1u << STEP | 1u << EXP_AVG | 1u << EXP_AVG_SQ | (o->amsgrad ? 1u << MAX_EXP_AVG_SQ : 0);
}

/* The shared tail: moments, bias corrections, the parameter update. */
static void moments_and_update(sr_optim *o, size_t i, sr_tensor *grad, struct sr__ox *x)
{
    const sr_optim_opts *op = &o->opts;
    double beta1 = op->betas[0], beta2 = op->betas[1];
    sr_tensor *exp_avg = *sr__optim_slot(o, i, EXP_AVG), *exp_avg_sq = *sr__optim_slot(o, i, EXP_AVG_SQ);
    sr__ox_add_(x, sr__ox_mul_(x, exp_avg, beta1), grad, 1 - beta1);
    sr__ox_addcmul_(x, sr__ox_mul_(x, exp_avg_sq, beta2), grad, grad, 1 - beta2);
    double step = sr_tensor_item(*sr__optim_slot(o, i, STEP));
    double bias_correction1 = 1 - pow(beta1, step), bias_correction2 = 1 - pow(beta2, step);
    double step_size = op->lr / bias_correction1, bias_correction2_sqrt = sqrt(bias_correction2);
    sr_tensor *v = exp_avg_sq;
    if (op->amsgrad) /* the maximum of all second moments so far */
        v = sr__ox_maximum_(x, *sr__optim_slot(o, i, MAX_EXP_AVG_SQ), exp_avg_sq);
    sr_tensor *denom = sr__ox_add_scalar_(x, sr__ox_div_scalar(x, sr__ox_sqrt(x, v), bias_correction2_sqrt), op->eps);
    sr__ox_addcdiv_(x, o->params[i], exp_avg, denom, -step_size);
}

static int adam_update(sr_optim *o, size_t i, sr_tensor *grad)
{
    const sr_optim_opts *op = &o->opts;
    struct sr__ox x = {0};
    sr_tensor *g = sr__ox_grad(&x, grad, NULL, op->maximize, 0);
    sr__ox_count(&x, *sr__optim_slot(o, i, STEP));
    if (op->weight_decay != 0) /* grad.add(param, alpha=weight_decay) */
        g = sr__ox_add_(&x, sr__ox_clone(&x, g), o->params[i], op->weight_decay);
    moments_and_update(o, i, g, &x);
    return sr__ox_end(&x);
}

static int adamw_update(sr_optim *o, size_t i, sr_tensor *grad)
{
    const sr_optim_opts *op = &o->opts;
    struct sr__ox x = {0};
    sr_tensor *g = sr__ox_grad(&x, grad, NULL, op->maximize, 0);
    sr__ox_count(&x, *sr__optim_slot(o, i, STEP));
    sr__ox_mul_(&x, o->params[i], 1 - op->lr * op->weight_decay); /* stepweight decay */
    moments_and_update(o, i, g, &x);
    return sr__ox_end(&x);
}

const struct sr__optim_ops sr__optim_adam = {
    .name = "Adam",
    .slots = {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    .check = check,
    .used = used,
    .init = sr__optim_init_default,
    .update = adam_update,
};

const struct sr__optim_ops sr__optim_adamw = {
    .name = "AdamW",
    .slots = {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    .check = check,
    .used = used,
    .init = sr__optim_init_default,
    .update = adamw_update,
};
