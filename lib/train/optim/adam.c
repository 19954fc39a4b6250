/* SPDX-License-Identifier: MIT */
/* Adam and AdamW, as torch's _single_tensor_adam / _single_tensor_adamw
 * (1.13, not capturable): they differ only in how weight decay applies (L2
 * on the gradient, or decoupled on the parameter). Contiguous f32 tensors
 * take the loops at the end of this file; the rest (f64, strided) the
 * tensor ops. */
#include <math.h>
#include <stdbool.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

/* ---- f32: one tight loop per tensor written ----
 *
 * The path above runs each torch op as a tensor op: a per-element call in
 * double, a pass over the parameter per op and temporaries per step. For
 * contiguous f32 tensors the same update is a handful of f32 loops, the
 * scalars (bias corrections, step size) computed once per step in double:
 * one loop per tensor written (exp_avg, exp_avg_sq, max_exp_avg_sq, the
 * parameter), since a writer holds its destination's storage lock for the
 * whole write and never two at once (tensor_impl.h). Each loop rounds as
 * torch's f32 ops do (the scalars cast to float, one rounding per op). */

/* The loops are compiled at -O3 so that they vectorise (GCC's -O2 vectorises
 * only the cheapest loops). The parameter's loop calls sqrtf, which the
 * compiler keeps scalar (errno for a negative argument, which a second
 * moment never is; an optimize attribute does not lift it): on x86-64 its
 * body is written with SSE2 (sqrtps is correctly rounded, as sqrtf), the
 * same operations in the same order as the scalar tail. */
#if defined(__GNUC__) && !defined(__clang__)
#define F32_LOOP __attribute__((optimize("O3")))
#else
#define F32_LOOP
#endif

struct f32_coef {
    float sign;          /* -1 when maximizing */
    float l2;            /* Adam's weight decay on the gradient, 0 for AdamW */
    float b1, omb1;      /* beta1, 1 - beta1 */
    float b2, omb2;      /* beta2, 1 - beta2 */
    float decay;         /* AdamW's 1 - lr * weight_decay, 1 for Adam */
    float neg_step_size; /* -lr / bias_correction1 */
    float bc2_sqrt, eps;
};

/* torch's grad for the moments: -grad if maximize, then grad + l2 * param
 * (p NULL: no weight decay). */
F32_LOOP static inline float f32_grad(const float *g, const float *p, size_t j, const struct f32_coef *c)
{
    float x = c->sign * g[j];
    return p ? x + c->l2 * p[j] : x;
}

/* s = {grad, param or NULL}: exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1) */
F32_LOOP static void f32_exp_avg(float *restrict m, const float *const *s, size_t n, const struct f32_coef *c)
{
    const float *restrict g = s[0], *restrict p = s[1];
    for (size_t j = 0; j < n; j++)
        m[j] = m[j] * c->b1 + c->omb1 * f32_grad(g, p, j, c);
}

/* s = {grad, param or NULL}: exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2) */
F32_LOOP static void f32_exp_avg_sq(float *restrict v, const float *const *s, size_t n, const struct f32_coef *c)
{
    const float *restrict g = s[0], *restrict p = s[1];
    for (size_t j = 0; j < n; j++) {
        float x = f32_grad(g, p, j, c);
        v[j] = v[j] * c->b2 + c->omb2 * x * x;
    }
}

/* s = {exp_avg_sq}: torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq), NaN propagating */
F32_LOOP static void f32_max(float *restrict mx, const float *const *s, size_t n, const struct f32_coef *c)
{
    (void)c;
    const float *restrict v = s[0];
    for (size_t j = 0; j < n; j++)
        mx[j] = isnan(mx[j]) || isnan(v[j]) ? NAN : mx[j] > v[j] ? mx[j] : v[j];
}

/* s = {exp_avg, the second moment used}: AdamW's param.mul_(decay), then
 * param.addcdiv_(exp_avg, sqrt(v) / bias_correction2_sqrt + eps, value=-step_size) */
F32_LOOP static void f32_param(float *restrict p, const float *const *s, size_t n, const struct f32_coef *c)
{
    const float *restrict m = s[0], *restrict v = s[1];
    size_t j = 0;
#if defined(__SSE2__)
    const __m128 bc2_sqrt = _mm_set1_ps(c->bc2_sqrt), eps = _mm_set1_ps(c->eps), decay = _mm_set1_ps(c->decay),
                 neg_step_size = _mm_set1_ps(c->neg_step_size);
    for (; j + 4 <= n; j += 4) {
        __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(_mm_loadu_ps(v + j)), bc2_sqrt), eps);
        __m128 upd = _mm_mul_ps(neg_step_size, _mm_div_ps(_mm_loadu_ps(m + j), denom));
        _mm_storeu_ps(p + j, _mm_add_ps(_mm_mul_ps(_mm_loadu_ps(p + j), decay), upd));
    }
#endif
    for (; j < n; j++) {
        float denom = sqrtf(v[j]) / c->bc2_sqrt + c->eps;
        p[j] = p[j] * c->decay + c->neg_step_size * (m[j] / denom);
    }
}

typedef void (*f32_loop)(float *restrict d, const float *const *s, size_t n, const struct f32_coef *c);

/* dst := loop(dst, src[0..2)) under dst's write lock. The sources (NULL
 * entries skipped) are pinned before the lock is taken; none shares dst's
 * storage (the state tensors are the optimizer's own, made by it). */
static int f32_pass(sr_tensor *dst, sr_tensor *src0, sr_tensor *src1, f32_loop loop, const struct f32_coef *c)
{
    sr_tensor *src[2] = {src0, src1};
    const float *s[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++)
        if (src[k])
            s[k] = (const float *)sr__tensor_pin(src[k]);
    int rc = sr__tensor_write_begin_from(dst, "sr_optim_step", NULL, 0);
    if (!rc) { /* dst is ours until _end: its data is read unlocked, as a written operand's */
        loop((float *)sr_tensor_data(dst), s, sr_tensor_numel(dst), c);
        sr__tensor_write_end_from(dst, NULL, 0);
    }
    for (int k = 0; k < 2; k++)
        if (src[k])
            sr__tensor_unpin(src[k]);
    return rc;
}

/* Parameter i, its gradient and its state are non-empty contiguous f32. */
static bool f32_path(sr_optim *o, size_t i, sr_tensor *grad)
{
    sr_tensor *t[] = {o->params[i], grad, *sr__optim_slot(o, i, EXP_AVG), *sr__optim_slot(o, i, EXP_AVG_SQ),
                      o->opts.amsgrad ? *sr__optim_slot(o, i, MAX_EXP_AVG_SQ) : grad};
    for (size_t k = 0; k < sizeof(t) / sizeof(t[0]); k++)
        if (!t[k] || sr_tensor_dtype(t[k]) != SR_F32 || !sr_tensor_is_contiguous(t[k]))
            return false;
    return sr_tensor_numel(t[0]) > 0;
}

/* The step count and the scalars of this step, in double, then cast once. */
static int f32_coefs(sr_optim *o, size_t i, bool adamw, struct f32_coef *c)
{
    const sr_optim_opts *op = &o->opts;
    struct sr__ox x = {0};
    double step = sr__ox_count(&x, *sr__optim_slot(o, i, STEP));
    int rc = sr__ox_end(&x);
    double beta1 = op->betas[0], beta2 = op->betas[1];
    double bias_correction1 = 1 - pow(beta1, step), bias_correction2 = 1 - pow(beta2, step);
    *c = (struct f32_coef){
        .sign = op->maximize ? -1.0f : 1.0f,
        .l2 = adamw ? 0.0f : (float)op->weight_decay,
        .b1 = (float)beta1,
        .omb1 = (float)(1 - beta1),
        .b2 = (float)beta2,
        .omb2 = (float)(1 - beta2),
        .decay = adamw ? (float)(1 - op->lr * op->weight_decay) : 1.0f,
        .neg_step_size = (float)(-(op->lr / bias_correction1)),
        .bc2_sqrt = (float)sqrt(bias_correction2),
        .eps = (float)op->eps,
    };
    return rc;
}

static int f32_update(sr_optim *o, size_t i, sr_tensor *grad, bool adamw)
{
    struct f32_coef c;
    int rc = f32_coefs(o, i, adamw, &c);
    sr_tensor *p = o->params[i], *m = *sr__optim_slot(o, i, EXP_AVG), *v = *sr__optim_slot(o, i, EXP_AVG_SQ);
    sr_tensor *wd = !adamw && o->opts.weight_decay != 0 ? p : NULL; /* read for the L2 term */
    if (!rc)
        rc = f32_pass(m, grad, wd, f32_exp_avg, &c);
    if (!rc)
        rc = f32_pass(v, grad, wd, f32_exp_avg_sq, &c);
    sr_tensor *mx = o->opts.amsgrad ? *sr__optim_slot(o, i, MAX_EXP_AVG_SQ) : NULL;
    if (!rc && mx) /* the maximum of all second moments so far */
        rc = f32_pass(mx, v, NULL, f32_max, &c);
    if (!rc)
        rc = f32_pass(p, m, mx ? mx : v, f32_param, &c);
    return rc;
}

static int adam_step(sr_optim *o, size_t i, sr_tensor *grad)
{
    return f32_path(o, i, grad) ? f32_update(o, i, grad, false) : adam_update(o, i, grad);
}

static int adamw_step(sr_optim *o, size_t i, sr_tensor *grad)
{
    return f32_path(o, i, grad) ? f32_update(o, i, grad, true) : adamw_update(o, i, grad);
}

const struct sr__optim_ops sr__optim_adam = {
    .name = "Adam",
    .slots = {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    .check = check,
    .used = used,
    .init = sr__optim_init_default,
    .update = adam_step,
};

const struct sr__optim_ops sr__optim_adamw = {
    .name = "AdamW",
    .slots = {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    .check = check,
    .used = used,
    .init = sr__optim_init_default,
    .update = adamw_step,
};
