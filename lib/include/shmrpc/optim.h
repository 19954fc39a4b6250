/* SPDX-License-Identifier: MIT */
/* shmrpc: local optimizers, as torch.optim (1.13) computes them.
 *
 * An optimizer holds references to a list of parameters (leaf f32/f64
 * tensors) and, per parameter, its state tensors (moments, step counts).
 * Each step updates every parameter that has a gradient IN PLACE: the
 * parameter tensor itself changes, under no-grad, through copy-on-write (if
 * another holder shares the storage block, the storage first moves to a
 * private copy; local views follow, see tensor.h). State tensors are ordinary
 * tensors, so they live in the shared heap.
 *
 * Algorithms. Defaults, checks and update rules are those of torch.optim in
 * PyTorch 1.13, single-tensor ("for" loop) implementations, one parameter
 * group. The arithmetic runs op by op in the parameter's dtype, in torch's
 * order, so results agree with PyTorch to rounding (tests/golden/
 * make_optim_golden.py). State is created as torch creates it: lazily, at a
 * parameter's first step with a gradient, except for Adagrad (at creation).
 *
 * Lifetime. sr_optim_create() takes a reference on every parameter;
 * sr_optim_destroy() drops them and the state.
 *
 * Threads. An optimizer is not thread-safe: a step writes the parameters and
 * the state. Steps (and zero_grad, state import) of one optimizer, and of
 * any optimizers sharing parameters, need external serialisation, as do
 * other readers and writers of the parameters during a step (the distributed
 * optimizer holds one lock per worker, like torch's _LocalOptimizer).
 *
 * Errors. Calls return 0 or -errno with the detail in sr_last_error(),
 * naming the function, the optimizer and the bad value, e.g.
 *   "sr_optim_create: Adam: Invalid learning rate: -1.0"
 * (the texts after the kind are torch's ValueError messages).
 */
#ifndef SHMRPC_OPTIM_H
#define SHMRPC_OPTIM_H

#if defined(SR__BUILDING) && !defined(SR__SEES_TRAIN)
#error "shmrpc/optim.h belongs to the training (train) layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>

#include "error.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sr_optim_kind {
    SR_OPTIM_SGD,
    SR_OPTIM_ADAM,
    SR_OPTIM_ADAMW,
    SR_OPTIM_ADAGRAD,
    SR_OPTIM_RMSPROP,
    SR_OPTIM_ADADELTA,
    SR_OPTIM_ADAMAX,
    SR_OPTIM_RPROP,
} sr_optim_kind;

#define SR_OPTIM_NKINDS 8

/* Hyper-parameters of every kind; each kind reads only its own (torch's
 * keyword arguments) and ignores the others:
 *   SGD       lr (required), momentum, dampening, weight_decay, nesterov, maximize
 *   Adam      lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad, maximize
 *   AdamW     as Adam, but weight_decay=1e-2 (decoupled)
 *   Adagrad   lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10, maximize
 *   RMSprop   lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered, maximize
 *   Adadelta  lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, maximize
 *   Adamax    lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, maximize
 *   Rprop     lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50), maximize
 * A field left 0 takes the kind's default, so a designated initialiser
 * sets only what it names: (sr_optim_opts){.lr = 0.01} is Adam with
 * lr 0.01 and betas (0.9, 0.999), eps 1e-8. SGD's lr is required: 0 there
 * is "not specified" and refused. For an explicit 0 where the default is
 * not 0 (AdamW without weight decay, beta1 0, eps 0), write SR_OPTIM_ZERO.
 * Bools default to false. NaN, an infinity or a value out of range in any
 * field is -EINVAL naming the kind, the field and the value. */
typedef struct sr_optim_opts {
    double lr;
    double momentum, dampening, weight_decay;
    double betas[2];
    double eps;
    double alpha;
    double rho;
    double lr_decay, initial_accumulator_value;
    double etas[2];       /* Rprop: (etaminus, etaplus) */
    double step_sizes[2]; /* Rprop: (min, max) */
    bool nesterov, amsgrad, centered, maximize;
} sr_optim_opts;

/* An explicit 0 in a field whose default is not 0 (a plain 0 means "the
 * default"). It is -0.0: it compares equal to 0, and the sign tells it apart. */
#define SR_OPTIM_ZERO (-0.0)

typedef struct sr_optim sr_optim;

/* torch's defaults for kind k into *o; fields that k does not read are 0 or
 * false. SGD has no default learning rate (torch's `required`): its lr is
 * 0, "not specified", which sr_optim_create() rejects until it is set.
 * -EINVAL for a bad kind or a NULL o. */
SR_API int sr_optim_opts_default(sr_optim_kind k, sr_optim_opts *o);
/* The options sr_optim_create(k, in, ...) would use, into *out: in (NULL:
 * all zero) with its zero fields replaced by k's defaults, SR_OPTIM_ZERO
 * fields as 0, then checked as sr_optim_create checks them. 0 or -EINVAL
 * (*out untouched). */
SR_API int sr_optim_opts_resolve(sr_optim_kind k, const sr_optim_opts *in, sr_optim_opts *out);

/* torch's class name ("SGD", "Adam", "AdamW", "Adagrad", "RMSprop",
 * "Adadelta", "Adamax", "Rprop"); "?" for a bad value. */
SR_API const char *sr_optim_kind_name(sr_optim_kind k);
/* The kind named (case-insensitive), into *k. -EINVAL for an unknown name. */
SR_API int sr_optim_kind_parse(const char *name, sr_optim_kind *k);

/* An optimizer of kind k over params[0..n) with options o (NULL or zero
 * fields: the defaults, see sr_optim_opts), into *out. The parameters are referenced, not copied.
 * Errors (-EINVAL), with torch's texts where torch has one:
 *   an option out of range: "Invalid learning rate: -1.0", "Invalid momentum
 *     value: ...", "Invalid beta parameter at index 0: ...", "Invalid eta
 *     values: ...", "Nesterov momentum requires a momentum and zero
 *     dampening", "Invalid step_sizes values: ...", and for NaN or an
 *     infinity in any field "Invalid <field> value: nan"; SGD without lr:
 *     "parameter group didn't specify a value of required optimization
 *     parameter lr";
 *   n == 0: "optimizer got an empty parameter list";
 *   a NULL, non-floating or non-leaf parameter ("can't optimize a non-leaf
 *     Tensor"), or one listed twice (torch only warns);
 * -ENOMEM when memory or the heap runs out. */
SR_API int sr_optim_create(sr_optim_kind k, const sr_optim_opts *o, sr_tensor *const *params, size_t n,
                           sr_optim **out);
/* Drops the parameters and the state; NULL is ignored. */
SR_API void sr_optim_destroy(sr_optim *o);

/* One step with each parameter's .grad (sr_tensor_grad); a parameter whose
 * .grad is NULL is left unchanged and its state does not advance. Errors:
 * -EINVAL when a gradient's shape or dtype differs from its parameter's
 * (checked for all parameters before anything changes); -ENOMEM when memory
 * runs out mid-step (parameters before the failing one are updated). */
SR_API int sr_optim_step(sr_optim *o);
/* The same with explicit gradients grads[0..nparams), aligned with the
 * parameters, NULL for "no gradient" (torch's functional optimizers, used by
 * the distributed optimizer). The .grad fields are neither read nor set. */
SR_API int sr_optim_step_grads(sr_optim *o, sr_tensor *const *grads);

/* Clears every parameter's gradient: set_to_none drops .grad (the parameter
 * then keeps still at the next step), otherwise it is zeroed in place
 * (torch 1.13's default, zero_grad(set_to_none=False)). */
SR_API int sr_optim_zero_grad(sr_optim *o, bool set_to_none);

/* Accessors. For a NULL o (-EINVAL in sr_last_error()): kind_of gives
 * (sr_optim_kind)-EINVAL, options NULL, nparams 0. */
SR_API sr_optim_kind sr_optim_kind_of(const sr_optim *o);
/* The options in force (defaults filled in). Borrowed, valid for o's life. */
SR_API const sr_optim_opts *sr_optim_options(const sr_optim *o);
SR_API size_t sr_optim_nparams(const sr_optim *o);
/* Borrowed: parameter i (NULL if i is out of range). */
SR_API sr_tensor *sr_optim_param(const sr_optim *o, size_t i);

/* ---- state, for checkpoints ----
 * The state is a list of named tensors "<param index>.<name>", torch's state
 * keys: SGD momentum_buffer (with momentum); Adam/AdamW step, exp_avg,
 * exp_avg_sq, max_exp_avg_sq (amsgrad); Adagrad step, sum; RMSprop step,
 * square_avg, momentum_buffer (momentum > 0), grad_avg (centered); Adadelta
 * step, square_avg, acc_delta; Adamax step, exp_avg, exp_inf; Rprop step,
 * prev, step_size. A step count is a 0-d f64 tensor (torch keeps a float32
 * tensor or an int); the others have the parameter's shape and dtype. A
 * parameter that has not stepped yet has no entries (Adagrad's always do). */

/* Snapshots of the whole state, in parameter then name order: *n entries,
 * (*names)[i] (malloc'd strings) and (*tensors)[i] (new references to copies,
 * which later steps do not change). Release with sr_optim_state_free().
 * -ENOMEM. */
SR_API int sr_optim_state_export(const sr_optim *o, size_t *n, char ***names, sr_tensor ***tensors);
SR_API void sr_optim_state_free(size_t n, char **names, sr_tensor **tensors);

/* Replaces the whole state with copies of tensors[0..n) named names[0..n)
 * (as exported, possibly by another optimizer of the same kind and options).
 * Parameters without entries return to their initial state. Every entry is
 * checked before anything changes; -EINVAL for an unknown or duplicate name,
 * a parameter index out of range, a parameter with some but not all of its
 * entries, a shape that differs from the parameter's, or a step tensor that
 * is not a single element. Floating state is converted to the parameter's
 * dtype (like torch's load_state_dict). -ENOMEM. */
SR_API int sr_optim_state_import(sr_optim *o, size_t n, const char *const *names, sr_tensor *const *tensors);

#ifdef __cplusplus
}
#endif
#endif
