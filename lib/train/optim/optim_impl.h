/* SPDX-License-Identifier: MIT */
/* Optimizer internals shared by lib/train/optim.
 *
 * One sr_optim holds the parameters and a fixed table of state slots per
 * parameter (SR__OPTIM_SLOTS, NULL = absent). Each kind is a table of
 * operations (struct sr__optim_ops): its torch name, its slot names (torch's
 * state keys), the check of its options, which slots its options use, how a
 * parameter's state starts, and one parameter's update.
 *
 * Updates are written with the "expression" helpers below, which mirror the
 * torch code line by line: each helper does nothing once an earlier one
 * failed, so the first failure (and its sr_last_error() text) survives, and
 * the temporaries it makes are released together by sr__ox_end().
 */
#ifndef SR_LIB_OPTIM_IMPL_H
#define SR_LIB_OPTIM_IMPL_H

#if !defined(SR__IN_TRAIN)
#error "optim_impl.h is private to the training (train) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>

#include "shmrpc/optim.h"
#include "tensor_seam.h"

#define SR__OPTIM_SLOTS 4
#define SR__OX_TMPS 12

struct sr__optim_ops {
    const char *name;                      /* torch's class name */
    const char *slots[SR__OPTIM_SLOTS];    /* state keys, NULL past the last */
    /* 0 or -EINVAL with torch's message (fn and the kind name prefix it). */
    int (*check)(const sr_optim_opts *o, const char *fn, const char *kind);
    /* Bit s set: slot s is part of a parameter's state under options o. */
    unsigned (*used)(const sr_optim_opts *o);
    /* The fresh state of parameter i (before its first step). */
    int (*init)(sr_optim *o, size_t i);
    /* One step of parameter i with gradient grad (never NULL). */
    int (*update)(sr_optim *o, size_t i, sr_tensor *grad);
    bool eager; /* state made at creation (Adagrad), else at the first step with a gradient */
};

struct sr_optim {
    sr_optim_kind kind;
    sr_optim_opts opts;
    const struct sr__optim_ops *ops;
    size_t n;
    sr_tensor **params;  /* n owned references */
    sr_tensor **state;   /* n * SR__OPTIM_SLOTS owned references or NULL */
    bool *inited;        /* n: the parameter's state has been made */
};

/* Slot s of parameter i. */
static inline sr_tensor **sr__optim_slot(sr_optim *o, size_t i, int s)
{
    return &o->state[i * SR__OPTIM_SLOTS + (size_t)s];
}

extern const struct sr__optim_ops sr__optim_sgd, sr__optim_adam, sr__optim_adamw, sr__optim_adagrad,
    sr__optim_rmsprop, sr__optim_adadelta, sr__optim_adamax, sr__optim_rprop;
const struct sr__optim_ops *sr__optim_ops_of(sr_optim_kind k);

/* The options in force: in (NULL: all zero) with its zero fields replaced
 * by kind k's defaults, then checked. 0 or -EINVAL naming fn, the kind, the
 * field and the value. */
int sr__optim_resolve(sr_optim_kind k, const sr_optim_opts *in, sr_optim_opts *out, const char *fn);

/* ---- option checks (opts.c): 0, or -EINVAL with "fn: kind: <torch text>" ---- */
int sr__optim_check_lr(const sr_optim_opts *o, const char *fn, const char *kind);
int sr__optim_check_eps(const sr_optim_opts *o, const char *fn, const char *kind);
int sr__optim_check_wd(const sr_optim_opts *o, const char *fn, const char *kind);
int sr__optim_check_betas(const sr_optim_opts *o, const char *fn, const char *kind);
/* lr, eps, betas and weight_decay, in torch's order (Adam, AdamW, Adamax). */
int sr__optim_check_adam_like(const sr_optim_opts *o, const char *fn, const char *kind);
/* Python's repr() of a float ("-1.0", "1e-08", "nan"), as torch's messages print it. */
const char *sr__optim_repr(double v, char *buf, size_t len);

/* ---- state helpers (state.c) ---- */
/* Slot s of parameter i := a new 0-d f64 step count of 0, or zeros / v
 * like the parameter. */
int sr__optim_init_step(sr_optim *o, size_t i, int s);
int sr__optim_init_full(sr_optim *o, size_t i, int s, double v);
/* Every slot of the used mask: step counts for "step", zeros otherwise. */
int sr__optim_init_default(sr_optim *o, size_t i);
/* Release every slot of parameter i. */
void sr__optim_clear(sr_optim *o, size_t i);

/* ---- expressions (expr.c) ---- */
struct sr__ox {
    int rc;                       /* the first failure, 0 while none */
    int ntmp;
    sr_tensor *tmp[SR__OX_TMPS];  /* temporaries, released by sr__ox_end */
};

/* Release the temporaries; returns the first failure or 0. */
int sr__ox_end(struct sr__ox *x);
/* New temporaries (NULL once x has failed). */
sr_tensor *sr__ox_clone(struct sr__ox *x, sr_tensor *t);
sr_tensor *sr__ox_neg(struct sr__ox *x, sr_tensor *t);
sr_tensor *sr__ox_sqrt(struct sr__ox *x, sr_tensor *t);
sr_tensor *sr__ox_div(struct sr__ox *x, sr_tensor *a, sr_tensor *b);
sr_tensor *sr__ox_div_scalar(struct sr__ox *x, sr_tensor *t, double s);
/* f over in[0..nin) (nin <= 3), in in[0]'s dtype. */
sr_tensor *sr__ox_map(struct sr__ox *x, sr_tensor *const *in, int nin, sr_map_fn f, const void *arg);
/* In place; each returns its first argument (NULL once x has failed), so that
 * torch's chains read alike: sr__ox_add_(x, sr__ox_mul_(x, buf, m), g, 1 - d). */
sr_tensor *sr__ox_mul_(struct sr__ox *x, sr_tensor *t, double s);
sr_tensor *sr__ox_mul_t_(struct sr__ox *x, sr_tensor *t, sr_tensor *other);
sr_tensor *sr__ox_add_scalar_(struct sr__ox *x, sr_tensor *t, double s);
sr_tensor *sr__ox_add_(struct sr__ox *x, sr_tensor *t, sr_tensor *other, double alpha);
sr_tensor *sr__ox_addcmul_(struct sr__ox *x, sr_tensor *t, sr_tensor *a, sr_tensor *b, double value);
sr_tensor *sr__ox_addcdiv_(struct sr__ox *x, sr_tensor *t, sr_tensor *a, sr_tensor *b, double value);
sr_tensor *sr__ox_copy_(struct sr__ox *x, sr_tensor *dst, sr_tensor *src);
/* dst := f over in[0..nin) (which may include dst), in dst's dtype. */
sr_tensor *sr__ox_map_(struct sr__ox *x, sr_tensor *dst, sr_tensor *const *in, int nin, sr_map_fn f,
                       const void *arg);
/* torch.maximum (NaN propagates), elementwise: dst := max(dst, other). */
sr_tensor *sr__ox_maximum_(struct sr__ox *x, sr_tensor *dst, sr_tensor *other);
/* The gradient torch's loops start from: -grad if maximize, then
 * grad + wd * param if wd != 0 (grad itself when neither; treat as read-only). */
sr_tensor *sr__ox_grad(struct sr__ox *x, sr_tensor *grad, sr_tensor *param, bool maximize, double wd);
/* Step count: add one and return the new value (NaN once x has failed). */
double sr__ox_count(struct sr__ox *x, sr_tensor *step);

#endif
