/* SPDX-License-Identifier: MIT */
/* Adagrad, as torch.optim.Adagrad / _single_tensor_adagrad (1.13, dense
 * gradients). Its state exists from construction: the sum starts at
 * initial_accumulator_value. */
#include <errno.h>
#include <math.h>

#include "error.h"
#include "optim_impl.h"

enum { STEP, SUM };

static int check(const sr_optim_opts *o, const char *fn, const char *kind)
{
    char b[40];
    int rc = sr__optim_check_lr(o, fn, kind);
    if (!rc && !(0.0 <= o->lr_decay))
        rc = sr__fail(-EINVAL, fn, "%s: Invalid lr_decay value: %s", kind, sr__optim_repr(o->lr_decay, b, sizeof(b)));
    if (!rc)
        rc = sr__optim_check_wd(o, fn, kind);
    if (!rc && !(0.0 <= o->initial_accumulator_value))
        rc = sr__fail(-EINVAL, fn, "%s: Invalid initial_accumulator_value value: %s", kind,
                      sr__optim_repr(o->initial_accumulator_value, b, sizeof(b)));
    if (!rc)
        rc = sr__optim_check_eps(o, fn, kind);
    return rc;
}

static unsigned used(const sr_optim_opts *o)
{
    (void)o;
    return 1u << STEP | 1u << SUM;
}

static int init(sr_optim *o, size_t i)
{
    int rc = sr__optim_init_step(o, i, STEP);
    return rc ? rc : sr__optim_init_full(o, i, SUM, o->opts.initial_accumulator_value);
}

static int update(sr_optim *o, size_t i, sr_tensor *grad)
{
    const sr_optim_opts *op = &o->opts;
    sr_tensor *param = o->params[i], *state_sum = *sr__optim_slot(o, i, SUM);
    struct sr__ox x = {0};
    double step = sr__ox_count(&x, *sr__optim_slot(o, i, STEP));
    sr_tensor *g = sr__ox_grad(&x, grad, param, op->maximize, op->weight_decay);
    double clr = op->lr / (1 + (step - 1) * op->lr_decay);
    sr__ox_addcmul_(&x, state_sum, g, g, 1);
    sr_tensor *std = sr__ox_add_scalar_(&x, sr__ox_sqrt(&x, state_sum), op->eps);
    sr__ox_addcdiv_(&x, param, g, std, -clr);
    return sr__ox_end(&x);
}

const struct sr__optim_ops sr__optim_adagrad = {
    .name = "Adagrad",
    .slots = {"step", "sum"},
    .check = check,
    .used = used,
    .init = init,
    .update = update,
    .eager = true,
};
