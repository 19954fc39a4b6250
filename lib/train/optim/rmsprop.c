/* SPDX-License-Identifier: MIT */
/* RMSprop, as torch.optim.RMSprop / _single_tensor_rmsprop (1.13). The
 * momentum buffer and the centred gradient average start at zero. */
#include <errno.h>

#include "error.h"
#include "optim_impl.h"

enum { STEP, SQUARE_AVG, MOMENTUM_BUFFER, GRAD_AVG };

static int check(const sr_optim_opts *o, const char *fn, const char *kind)
{
    char b[40];
    int rc = sr__optim_check_lr(o, fn, kind);
    if (!rc)
        rc = sr__optim_check_eps(o, fn, kind);
    if (!rc && !(0.0 <= o->momentum))
        rc = sr__fail(-EINVAL, fn, "%s: Invalid momentum value: %s", kind, sr__optim_repr(o->momentum, b, sizeof(b)));
    if (!rc)
        rc = sr__optim_check_wd(o, fn, kind);
    if (!rc && !(0.0 <= o->alpha))
        rc = sr__fail(-EINVAL, fn, "%s: Invalid alpha value: %s", kind, sr__optim_repr(o->alpha, b, sizeof(b)));
    return rc;
}

static unsigned used(const sr_optim_opts *o)
{
    return 1u << STEP | 1u << SQUARE_AVG | (o->momentum > 0 ? 1u << MOMENTUM_BUFFER : 0) |
           (o->centered ? 1u << GRAD_AVG : 0);
}

/* sqrt(square_avg - grad_avg^2) when centred, else sqrt(square_avg); + eps. */
static sr_tensor *average(sr_optim *o, size_t i, sr_tensor *g, struct sr__ox *x)
{
    const sr_optim_opts *op = &o->opts;
    sr_tensor *square_avg = *sr__optim_slot(o, i, SQUARE_AVG), *avg;
    if (op->centered) {
        sr_tensor *grad_avg = *sr__optim_slot(o, i, GRAD_AVG);
        sr__ox_add_(x, sr__ox_mul_(x, grad_avg, op->alpha), g, 1 - op->alpha);
        avg = sr__ox_sqrt(x, sr__ox_addcmul_(x, sr__ox_clone(x, square_avg), grad_avg, grad_avg, -1));
    } else {
        avg = sr__ox_sqrt(x, square_avg);
    }
    return sr__ox_add_scalar_(x, avg, op->eps);
}

static int update(sr_optim *o, size_t i, sr_tensor *grad)
{
    const sr_optim_opts *op = &o->opts;
    sr_tensor *param = o->params[i], *square_avg = *sr__optim_slot(o, i, SQUARE_AVG);
    struct sr__ox x = {0};
    sr__ox_count(&x, *sr__optim_slot(o, i, STEP)); /* torch counts it but never reads it */
    sr_tensor *g = sr__ox_grad(&x, grad, param, op->maximize, op->weight_decay);
    sr__ox_addcmul_(&x, sr__ox_mul_(&x, square_avg, op->alpha), g, g, 1 - op->alpha);
    sr_tensor *avg = average(o, i, g, &x);
    if (op->momentum > 0) {
        sr_tensor *buf = *sr__optim_slot(o, i, MOMENTUM_BUFFER);
        sr__ox_addcdiv_(&x, sr__ox_mul_(&x, buf, op->momentum), g, avg, 1);
        sr__ox_add_(&x, param, buf, -op->lr);
    } else {
        sr__ox_addcdiv_(&x, param, g, avg, -op->lr);
    }
    return sr__ox_end(&x);
}

const struct sr__optim_ops sr__optim_rmsprop = {
    .name = "RMSprop",
    .slots = {"step", "square_avg", "momentum_buffer", "grad_avg"},
    .check = check,
    .used = used,
    .init = sr__optim_init_default,
    .update = update,
};
