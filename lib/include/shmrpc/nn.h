/* SPDX-License-Identifier: MIT */
/* shmrpc: what training needs on top of tensor.h — a seeded generator,
 * Linear layers and MLPs with PyTorch's initialisation, and metrics.
 *
 * Generators. An sr_generator is caller memory (init only, no fini): a
 * xoshiro256** state seeded through splitmix64. Its streams depend on the
 * seed alone, never on the machine, the thread or the process, so that two
 * workers seeded alike draw the same data order and the same initial weights.
 * It is not locked: one generator per thread, or external locking. It is
 * independent of the process-wide generator behind sr_rand/sr_manual_seed.
 * The streams differ from PyTorch's.
 *
 * Modules. An sr_module is an ordered list of named parameters plus the
 * forward function that uses them: a Linear layer ("weight", "bias"), an
 * MLP, Linear-ReLU-...-Linear, or a sequential model of layer specs (conv2d,
 * pooling, flatten, dropout, relu, linear, layer norm), whose names are
 * those of PyTorch's nn.Sequential state_dict: "0.weight", "0.bias",
 * "2.weight", "2.bias", ... Parameters are plain leaf tensors that require
 * grad; sr_backward accumulates into their .grad.
 *
 * Lifetime rule. The module holds one reference on each parameter and drops
 * it in sr_module_destroy(). Pointers handed out by sr_module_params() and
 * sr_module_param() are borrowed: valid until sr_module_destroy(). To keep a
 * parameter longer (e.g. to wrap it in an RRef, one per parameter, or to send
 * it to another worker), take a reference with sr_tensor_ref() or hand it to
 * a call that takes its own (sr_value, sr_rref_create); the tensor then
 * outlives the module. Updating a parameter in place (sr_add_, sr_copy_)
 * needs grad mode off (sr_no_grad_enter), as in PyTorch, and goes through
 * copy-on-write like every in-place write. Parameters live where every
 * tensor does: create a module after the worker joined its job if its
 * parameters will be sent or held by RRefs, since a tensor made before the
 * shared heap is attached stays in private memory and cannot be sent
 * (docs/TENSORS.md).
 *
 * Threads. sr_linear (and so sr_mlp_apply and sr_module_forward) may run
 * while another thread updates the weight and bias in place (an optimizer
 * step, grad mode off), as every op may (tensor.h, "Threads"): its matmul
 * and add pin what they read, so the output and what backward saves come
 * from one whole version of each parameter, before or after the step, never
 * a mix. This is what a parameter server with unserialised trainers needs.
 *
 * Errors as in tensor.h: calls returning int give 0 or -errno (-EINVAL for a
 * bad argument, -ENOMEM), tensor maths returns NULL, both with the detail in
 * sr_last_error().
 */
#ifndef SHMRPC_NN_H
#define SHMRPC_NN_H

#if defined(SR__BUILDING) && !defined(SR__SEES_TRAIN)
#error "shmrpc/nn.h belongs to the training (train) layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- seeded generator ---- */
typedef struct sr_generator {
    uint64_t s[4]; /* xoshiro256** state; never all zero after init */
} sr_generator;

/* A NULL g is -EINVAL in sr_last_error(): init does nothing, next and
 * below return 0, uniform NaN. */
SR_API void sr_generator_init(sr_generator *g, uint64_t seed);
/* The next 64 random bits. */
SR_API uint64_t sr_generator_next(sr_generator *g);
/* Uniform double in [0, 1) with 53 random bits. */
SR_API double sr_generator_uniform(sr_generator *g);
/* Uniform integer in [0, n), without modulo bias; 0 when n == 0. */
SR_API uint64_t sr_generator_below(sr_generator *g, uint64_t n);
/* A uniformly random permutation of 0..n-1 into out[0..n-1] (Fisher-Yates).
 * 0, or -EINVAL for n < 0 or a NULL out with n > 0. */
SR_API int sr_generator_permutation(sr_generator *g, int64_t n, int64_t *out);
/* A new f32/f64 tensor, uniform in [lo, hi) (computed in double, then
 * rounded to dt, so an f32 value may equal hi): torch.nn.init.uniform_. */
SR_API sr_tensor *sr_generator_uniform_tensor(sr_generator *g, sr_dtype dt, int ndim, const int64_t *shape,
                                              double lo, double hi, unsigned flags);

/* ---- functional layers (torch.nn.functional) ---- */
/* y = x W^T + b, recording autograd. x [..., in] (1-D or more), weight
 * [out, in], bias [out] or NULL; one dtype. NULL with -EINVAL naming the
 * shapes when in does not match. */
SR_API sr_tensor *sr_linear(sr_tensor *x, sr_tensor *weight, sr_tensor *bias);
/* The MLP forward with the given parameters, in sr_module_params order:
 * params = {W0, b0, W1, b1, ...} (2 * nlayers tensors), ReLU between layers,
 * none after the last. For parameters fetched from elsewhere (RRefs). */
SR_API sr_tensor *sr_mlp_apply(sr_tensor *x, sr_tensor *const *params, int nlayers);
/* torch.nn.functional.dropout: training and p > 0, each element is kept with
 * probability 1 - p and scaled by 1 / (1 - p), else zeroed (all zeroed for
 * p = 1); the mask takes one sr_generator_uniform draw per element, in
 * row-major order, so the same seed gives the same mask. Backward: the
 * gradient times the same mask. Not training, or p = 0: x itself (a new
 * reference), and g is not used (it may be NULL). -EINVAL for p outside
 * [0, 1], a NULL g when a mask is drawn, an integer dtype. */
SR_API sr_tensor *sr_dropout(sr_tensor *x, double p, bool training, sr_generator *g);

/* ---- modules ---- */
typedef struct sr_module sr_module;

/* Layers of a sequential model (torch.nn.Sequential), one spec each. Zero
 * fields take PyTorch's defaults, as noted; the SR_* macros below fill the
 * common cases, and a compound literal sets the rest. */
typedef enum sr_layer_kind {
    SR_LAYER_LINEAR = 1, /* in -> out features, bias unless no_bias */
    SR_LAYER_CONV2D,     /* in -> out channels, kernel, stride (0: 1), padding, dilation (0: 1), groups (0: 1) */
    SR_LAYER_RELU,
    SR_LAYER_MAX_POOL2D, /* kernel, stride (0: the kernel), padding */
    SR_LAYER_AVG_POOL2D, /* the same */
    SR_LAYER_FLATTEN,    /* start_dim..end_dim; both 0: nn.Flatten()'s 1..-1 */
    SR_LAYER_DROPOUT,    /* p; off in eval mode */
    SR_LAYER_LAYER_NORM, /* norm_shape[norm_ndim] (nn.LayerNorm), eps (0: 1e-5) */
} sr_layer_kind;

typedef struct sr_layer_spec {
    sr_layer_kind kind;
    int64_t in, out;
    int64_t kernel[2], stride[2], padding[2], dilation[2];
    int64_t groups;
    bool no_bias;
    double p;
    int start_dim, end_dim;
    int norm_ndim;
    int64_t norm_shape[4];
    double eps;
} sr_layer_spec;

#define SR_LINEAR(in_, out_) ((sr_layer_spec){.kind = SR_LAYER_LINEAR, .in = (in_), .out = (out_)})
#define SR_CONV2D(in_, out_, k_, stride_, pad_)                                                                \
    ((sr_layer_spec){.kind = SR_LAYER_CONV2D, .in = (in_), .out = (out_), .kernel = {(k_), (k_)},             \
                     .stride = {(stride_), (stride_)}, .padding = {(pad_), (pad_)}})
#define SR_RELU() ((sr_layer_spec){.kind = SR_LAYER_RELU})
#define SR_MAX_POOL2D(k_, stride_)                                                                             \
    ((sr_layer_spec){.kind = SR_LAYER_MAX_POOL2D, .kernel = {(k_), (k_)}, .stride = {(stride_), (stride_)}})
#define SR_AVG_POOL2D(k_, stride_)                                                                             \
    ((sr_layer_spec){.kind = SR_LAYER_AVG_POOL2D, .kernel = {(k_), (k_)}, .stride = {(stride_), (stride_)}})
#define SR_FLATTEN() ((sr_layer_spec){.kind = SR_LAYER_FLATTEN})
#define SR_DROPOUT(p_) ((sr_layer_spec){.kind = SR_LAYER_DROPOUT, .p = (p_)})
/* nn.LayerNorm([c, h, w]): over a sample's channels and plane. */
#define SR_LAYER_NORM_CHW(c_, h_, w_)                                                                          \
    ((sr_layer_spec){.kind = SR_LAYER_LAYER_NORM, .norm_ndim = 3, .norm_shape = {(c_), (h_), (w_)}})

/* A Linear layer initialised as torch.nn.Linear: weight [out, in] and bias
 * [out] both ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform_ with a =
 * sqrt(5)), drawn from g in that order. bias false: no bias parameter.
 * dt: SR_F32 (PyTorch's default) or SR_F64. -EINVAL for in/out < 1 or an
 * integer dtype; -ENOMEM. */
SR_API int sr_linear_create(int64_t in, int64_t out, bool bias, sr_dtype dt, sr_generator *g, sr_module **m);
/* An MLP of nlayers Linear layers, sizes[0] -> sizes[1] -> ... ->
 * sizes[nlayers] (e.g. {784, 128, 10}, nlayers 2), ReLU between layers.
 * Layers are initialised in order as sr_linear_create does. */
SR_API int sr_mlp_create(const int64_t *sizes, int nlayers, sr_generator *g, sr_dtype dt, sr_module **m);
/* A sequential model of n layers, initialised in order from g as PyTorch
 * does: conv2d and linear weights kaiming_uniform_(a = sqrt(5)), i.e.
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in * kH * kW / groups
 * (in for linear), then the bias from the same bound; layer norm weight 1,
 * bias 0. Parameters are named as nn.Sequential's state_dict: "<i>.weight",
 * "<i>.bias" with i the layer's index. After the parameters, one draw of g
 * seeds the model's own dropout generator (sr_module_seed replaces it). The
 * model starts in training mode. Shapes between layers are checked when the
 * forward runs (errors name the layer's op). -EINVAL naming the layer for a
 * bad spec; -ENOMEM; *m is NULL after any error. */
SR_API int sr_sequential_create(const sr_layer_spec *layers, int n, sr_dtype dt, sr_generator *g, sr_module **m);
/* One layer as a module of its own (nn.Conv2d(...), nn.LayerNorm(...), ...):
 * initialised as in a sequential model, its parameters named "weight" and
 * "bias" as that layer's state_dict; the same modes and forward. */
SR_API int sr_layer_create(const sr_layer_spec *layer, sr_dtype dt, sr_generator *g, sr_module **m);
/* Layers [from, to) of a sequential model only (a pipeline stage of a model
 * built whole on every stage: the same seed gives every stage the same
 * parameters and the names of the whole model). NULL with -EINVAL when m is
 * not sequential or the range is not within 0 <= from <= to <= n. */
SR_API sr_tensor *sr_sequential_forward_range(sr_module *m, sr_tensor *x, int from, int to);
/* The parameters of layers [from, to) are params[*first .. *first + *count)
 * of sr_module_params. 0 or -EINVAL as above. */
SR_API int sr_sequential_param_range(const sr_module *m, int from, int to, size_t *first, size_t *count);
/* Training (true, the default) or eval mode (model.train() / model.eval()):
 * dropout is on only in training. A Linear layer or MLP has no mode-dependent
 * layer; its mode is recorded all the same. */
SR_API void sr_module_train(sr_module *m, bool training);
SR_API bool sr_module_is_training(const sr_module *m);
/* Reseeds a sequential model's dropout generator. */
SR_API void sr_module_seed(sr_module *m, uint64_t seed);
/* NULL is ignored. Drops the module's references on its parameters. */
SR_API void sr_module_destroy(sr_module *m);

/* The forward pass (a new tensor, NULL on error): logits for an MLP; every
 * layer in order for a sequential model (its dropout layers draw from its
 * generator, so the module's forward is not for concurrent threads). */
SR_API sr_tensor *sr_module_forward(sr_module *m, sr_tensor *x);
/* Borrowed arrays of the n parameters and their names, in creation order
 * (weight before bias, layer by layer). Any out pointer may be NULL. */
SR_API void sr_module_params(const sr_module *m, size_t *n, sr_tensor *const **params,
                             const char *const **names);
/* Borrowed parameter by name, or NULL with -ENOENT in sr_last_error(). */
SR_API sr_tensor *sr_module_param(const sr_module *m, const char *name);
/* Total number of parameter elements (torch: sum(p.numel())); 0 with
 * -EINVAL for a NULL m (and zero_grad(NULL) does nothing). */
SR_API size_t sr_module_numel(const sr_module *m);
/* Clears every parameter's .grad (zero_grad(set_to_none=True)). */
SR_API void sr_module_zero_grad(sr_module *m);

/* ---- module state (state_dict / load_state_dict) ----
 * The state of a module is its parameters as a named list, in
 * sr_module_params order, named "<prefix><name>" (prefix NULL or "": the
 * names themselves, "0.weight", ...; "stage1." gives "stage1.0.weight", as
 * torch's state_dict(prefix=...)).
 *
 * Ownership rule. sr_module_state_dict() hands back two malloc'd arrays of
 * *n entries: names[i], malloc'd copies, and tensors[i], one new reference
 * each to the module's parameter itself (not a copy, as torch's state_dict
 * shares the parameters' storage; sr_clone one for a snapshot that later
 * steps do not change). They are the caller's, valid after the module is
 * destroyed, and go with one sr_module_state_free(n, names, tensors), which
 * takes any of them NULL. Send the tensors (sr_value_from_tensor) to load them on
 * another worker, or save them (sr_checkpoint_save).
 *
 * Loading copies tensors[k] into the parameter called names[k] (grad mode
 * off, so a parameter that requires grad takes the values in place without
 * history, as load_state_dict does). The tensors and names are borrowed.
 * Everything is checked before anything is copied, so on an error no
 * parameter has changed; the errors name the parameter:
 *   -ENOENT  "unexpected key '3.weight': the module has no such parameter";
 *            strict, "missing key '0.bias': the state has no value ...";
 *   -EINVAL  a NULL argument, a name given twice, a dtype or shape that
 *            differs: "'0.weight' has shape [8, 1, 3, 3] in the state,
 *            [16, 1, 3, 3] in the module";
 *   -ENOMEM  copy-on-write of a shared parameter failed; the parameters
 *            before it have been copied (the only partial outcome).
 * strict false leaves the parameters the state does not name as they are
 * (a pipeline stage loading its own layers), but, unlike torch's, still
 * refuses an unexpected key: a name that matches nothing is a mistake. */
SR_API int sr_module_state_dict(const sr_module *m, const char *prefix, size_t *n, char ***names,
                                sr_tensor ***tensors);
SR_API void sr_module_state_free(size_t n, char **names, sr_tensor **tensors);
SR_API int sr_module_load_state_dict(sr_module *m, size_t n, const char *const *names, sr_tensor *const *tensors,
                                     bool strict);

/* ---- metrics ---- */
/* Index of the largest value along dim (the first one on ties; a NaN counts
 * as the largest, as in PyTorch), dim removed: an i64 tensor that records no
 * history. Any dtype; a 0-d input gives a 0-d 0. */
SR_API sr_tensor *sr_argmax(sr_tensor *t, int dim);
/* Fraction of rows whose argmax over dim 1 equals the target: logits [N, C]
 * f32/f64, targets i64 [N], N >= 1. NaN on error (with sr_last_error()). */
SR_API double sr_accuracy(sr_tensor *logits, sr_tensor *targets);

#ifdef __cplusplus
}
#endif
#endif
