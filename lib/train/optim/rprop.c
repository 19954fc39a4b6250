/* SPDX-License-Identifier: MIT */
/* Rprop, as torch.optim.Rprop / _single_tensor_rprop (1.13). Per element:
 * where the gradient kept its sign the step size grows by etaplus, where it
 * flipped it shrinks by etaminus and that element does not move this step
 * (its gradient counts as 0, also as the next "prev"), where either is zero
 * it stays; step sizes stay within step_sizes; the parameter moves by
 * -sign(grad) * step_size. */
#include <errno.h>
#include <math.h>

#include "error.h"
#include "optim_impl.h"

enum { STEP, PREV, STEP_SIZE };

struct rprop_arg {
    double etaminus, etaplus, lo, hi;
    bool f32; /* round grad * prev to f32 before its sign, as torch computes it */
};

static int check(const sr_optim_opts *o, const char *fn, const char *kind)
{
    char b1[40], b2[40];
    int rc = sr__optim_check_lr(o, fn, kind);
    if (!rc && !(0.0 < o->etas[0] && o->etas[0] < 1.0 && 1.0 < o->etas[1]))
        rc = sr__fail(-EINVAL, fn, "%s: Invalid eta values: %s, %s", kind, sr__optim_repr(o->etas[0], b1, sizeof(b1)),
                      sr__optim_repr(o->etas[1], b2, sizeof(b2)));
    if (!rc && !(0.0 <= o->step_sizes[0] && o->step_sizes[0] <= o->step_sizes[1]))
        rc = sr__fail(-EINVAL, fn, "%s: Invalid step_sizes values: %s, %s", kind,
                      sr__optim_repr(o->step_sizes[0], b1, sizeof(b1)), sr__optim_repr(o->step_sizes[1], b2, sizeof(b2)));
    return rc;
}

static unsigned used(const sr_optim_opts *o)
{
    (void)o;
    return 1u << STEP | 1u << PREV | 1u << STEP_SIZE;
}

static int init(sr_optim *o, size_t i)
{
    int rc = sr__optim_init_step(o, i, STEP);
    if (!rc)
        rc = sr__optim_init_full(o, i, PREV, 0.0);
    return rc ? rc : sr__optim_init_full(o, i, STEP_SIZE, o->opts.lr);
}

/* sign(grad * prev) in the dtype: 1, -1, 0 (NaN stays NaN). */
static double product_sign(const double *v, const struct rprop_arg *a)
{
    double p = a->f32 ? (double)(float)(v[0] * v[1]) : v[0] * v[1];
    return p > 0 ? 1 : p < 0 ? -1 : p == 0 ? 0 : NAN;
}

static double eta_fn(const double *v, const void *arg)
{
    const struct rprop_arg *a = arg;
    double s = product_sign(v, a);
    return s > 0 ? a->etaplus : s < 0 ? a->etaminus : s == 0 ? 1 : NAN;
}

static double clamp_fn(const double *v, const void *arg)
{
    const struct rprop_arg *a = arg;
    return isnan(v[0]) ? v[0] : fmin(fmax(v[0], a->lo), a->hi);
}

static double masked_grad_fn(const double *v, const void *arg)
{
    return product_sign(v, arg) < 0 ? 0.0 : v[0];
}

static double sign_fn(const double *v, const void *arg)
{
    (void)arg;
    return v[0] > 0 ? 1 : v[0] < 0 ? -1 : v[0] == 0 ? 0 : NAN;
}

static int update(sr_optim *o, size_t i, sr_tensor *grad)
{
    const sr_optim_opts *op = &o->opts;
    sr_tensor *prev = *sr__optim_slot(o, i, PREV), *step_size = *sr__optim_slot(o, i, STEP_SIZE);
    struct rprop_arg a = {op->etas[0], op->etas[1], op->step_sizes[0], op->step_sizes[1],
                          sr_tensor_dtype(o->params[i]) == SR_F32};
    struct sr__ox x = {0};
    sr__ox_count(&x, *sr__optim_slot(o, i, STEP)); /* torch counts it but never reads it */
    sr_tensor *g = sr__ox_grad(&x, grad, NULL, op->maximize, 0);
    sr_tensor *gp[2] = {g, prev};
    sr_tensor *eta = sr__ox_map(&x, gp, 2, eta_fn, &a);
    sr__ox_map_(&x, step_size, (sr_tensor *[]){sr__ox_mul_t_(&x, step_size, eta)}, 1, clamp_fn, &a);
    sr_tensor *masked = sr__ox_map(&x, gp, 2, masked_grad_fn, &a); /* grad[sign.eq(etaminus)] = 0 */
    sr_tensor *sign = sr__ox_map(&x, &masked, 1, sign_fn, NULL);
    sr__ox_addcmul_(&x, o->params[i], sign, step_size, -1);
    sr__ox_copy_(&x, prev, masked);
    return sr__ox_end(&x);
}

const struct sr__optim_ops sr__optim_rprop = {
    .name = "Rprop",
    .slots = {"step", "prev", "step_size"},
    .check = check,
    .used = used,
    .init = init,
    .update = update,
};
