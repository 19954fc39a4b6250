/* SPDX-License-Identifier: MIT */
/* nn.h's convolution-era layers: dropout (seeded masks, eval mode,
 * backward), sequential models of layer specs (PyTorch's state_dict names
 * and initialisation bounds, train/eval, ranges of layers as pipeline
 * stages), and a small CNN that learns. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "shmrpc/nn.h"
#include "shmrpc/optim.h"
#include "tensor_util.h"
#include "common.h"

LEAK_CHECKED_SUITE(dropout);
LEAK_CHECKED_SUITE(sequential);

static double *values(sr_tensor *t)
{
    size_t n = sr_tensor_numel(t);
    double *v = malloc((n + 1) * sizeof(double));
    cr_assert_eq(sr_tensor_to_f64(t, v, n), 0);
    return v;
}

/* ---- dropout ---- */

static sr_tensor *dropped(sr_tensor *x, double p, uint64_t seed)
{
    sr_generator g;
    sr_generator_init(&g, seed);
    sr_tensor *y = sr_dropout(x, p, true, &g);
    cr_assert(y, "%s", sr_last_error());
    return y;
}

Test(dropout, same_seed_same_mask_scaled_by_the_kept_fraction)
{
    enum { N = 4000 };
    sr_tensor *x = sr_ones(SR_F32, 2, SHAPE(40, 100), SR_REQUIRES_GRAD);
    sr_tensor *a = dropped(x, 0.25, 9), *b = dropped(x, 0.25, 9), *c = dropped(x, 0.25, 10);
    double *va = values(a), *vb = values(b), *vc = values(c);
    int kept = 0, differ = 0;
    for (int i = 0; i < N; i++) {
        if (va[i] != vb[i] || (va[i] != 0 && fabs(va[i] - 1 / 0.75) > 1e-6))
            cr_assert_fail("element %d: %g and %g (want 0 or %g, the same for one seed)", i, va[i], vb[i], 1 / 0.75);
        kept += va[i] != 0;
        differ += va[i] != vc[i];
    }
    cr_assert(kept > 2850 && kept < 3150, "kept %d of %d with p = 0.25", kept, N);
    cr_assert_gt(differ, 500, "seeds 9 and 10 gave nearly the same mask");
    /* backward: the gradient through the same mask */
    sr_tensor *s = sr_sum(a);
    cr_assert_eq(sr_backward(s, false), 0, "%s", sr_last_error());
    double *g = values(sr_tensor_grad(x));
    for (int i = 0; i < N; i++)
        if (fabs(g[i] - va[i]) > 1e-6)
            cr_assert_fail("grad[%d] = %g, the mask has %g", i, g[i], va[i]);
    free(va), free(vb), free(vc), free(g);
    sr_tensor *ts[] = {x, a, b, c, s};
    for (size_t i = 0; i < 5; i++)
        sr_tensor_unref(ts[i]);
}

Test(dropout, off_in_eval_and_at_zero_all_dropped_at_one)
{
    sr_tensor *x = sr_randn(SR_F64, 1, SHAPE(50), 0);
    sr_tensor *e = sr_dropout(x, 0.5, false, NULL), *z = dropped(x, 0.0, 1), *one = dropped(x, 1.0, 1);
    cr_assert(e && sr_tensor_shares_storage(e, x), "eval mode must give x itself");
    cr_assert(sr_tensor_shares_storage(z, x), "p = 0 must give x itself");
    double *v = values(one);
    for (int i = 0; i < 50; i++)
        cr_assert_eq(v[i], 0.0, "p = 1: element %d is %g", i, v[i]);
    free(v);
    sr_generator g;
    sr_generator_init(&g, 1);
    cr_assert_null(sr_dropout(x, 1.5, true, &g));
    cr_assert(strstr(sr_last_error(), "sr_dropout: dropout probability has to be between 0 and 1, but got 1.5"),
              "%s", sr_last_error());
    cr_assert_null(sr_dropout(x, 0.5, true, NULL));
    cr_assert(strstr(sr_last_error(), "sr_dropout: no generator"), "%s", sr_last_error());
    sr_tensor *ts[] = {x, e, z, one};
    for (size_t i = 0; i < 4; i++)
        sr_tensor_unref(ts[i]);
}

/* ---- sequential ---- */

/* The later demo's kind of model: nn.Sequential(Conv2d(1, 8, 3, padding=1),
 * ReLU, MaxPool2d(2), Conv2d(8, 16, 3, padding=1), LayerNorm([16, 14, 14]),
 * ReLU, MaxPool2d(2), Flatten, Dropout(0.5), Linear(16*7*7, 10)), on
 * 28 x 28 images. */
static const sr_layer_spec cnn_spec[] = {
    SR_CONV2D(1, 8, 3, 1, 1), SR_RELU(), SR_MAX_POOL2D(2, 2), SR_CONV2D(8, 16, 3, 1, 1),
    SR_LAYER_NORM_CHW(16, 14, 14), SR_RELU(), SR_MAX_POOL2D(2, 0), SR_FLATTEN(), SR_DROPOUT(0.5),
    SR_LINEAR(16 * 7 * 7, 10),
};
#define CNN_LAYERS ((int)(sizeof(cnn_spec) / sizeof(cnn_spec[0])))

static sr_module *make_cnn(sr_dtype dt, uint64_t seed)
{
    sr_generator g;
    sr_generator_init(&g, seed);
    sr_module *m = NULL;
    cr_assert_eq(sr_sequential_create(cnn_spec, CNN_LAYERS, dt, &g, &m), 0, "%s", sr_last_error());
    return m;
}

Test(sequential, names_shapes_and_bounds_are_pytorchs)
{
    sr_module *m = make_cnn(SR_F32, 1);
    size_t n;
    sr_tensor *const *p;
    const char *const *names;
    sr_module_params(m, &n, &p, &names);
    static const char *want[] = {"0.weight", "0.bias", "3.weight", "3.bias", "4.weight", "4.bias", "9.weight",
                                 "9.bias"};
    static const int64_t fan_in[] = {9, 9, 72, 72, 0, 0, 784, 784};
    cr_assert_eq(n, 8);
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(names[i], want[i]);
        cr_assert(sr_tensor_requires_grad(p[i]) && sr_tensor_dtype(p[i]) == SR_F32);
        double *v = values(p[i]), lo = INFINITY, hi = -INFINITY;
        for (size_t j = 0; j < sr_tensor_numel(p[i]); j++)
            lo = fmin(lo, v[j]), hi = fmax(hi, v[j]);
        free(v);
        if (!fan_in[i]) { /* layer norm: weight 1, bias 0 */
            cr_assert(lo == hi && lo == (i == 4 ? 1.0 : 0.0), "%s in [%g, %g]", names[i], lo, hi);
            continue;
        }
        double bound = 1 / sqrt((double)fan_in[i]);
        cr_assert(lo >= -bound && hi <= bound && hi - lo > bound / 2, "%s in [%g, %g], bound %g", names[i], lo, hi,
                  bound);
    }
    tu_expect_shape(p[2], 4, SHAPE(16, 8, 3, 3), "3.weight");
    tu_expect_shape(p[4], 3, SHAPE(16, 14, 14), "4.weight");
    tu_expect_shape(p[6], 2, SHAPE(10, 784), "9.weight");
    cr_assert_eq(sr_module_numel(m), 80 + 1168 + 2 * 3136 + 7850);
    sr_module_destroy(m);
}

Test(sequential, same_seed_same_model_and_eval_is_deterministic)
{
    sr_module *a = make_cnn(SR_F64, 5), *b = make_cnn(SR_F64, 5);
    sr_manual_seed(2);
    sr_tensor *x = sr_randn(SR_F64, 4, SHAPE(3, 1, 28, 28), 0);
    cr_assert(sr_module_is_training(a));
    sr_tensor *ya = sr_module_forward(a, x), *yb = sr_module_forward(b, x);
    cr_assert(ya && yb, "%s", sr_last_error());
    tu_expect_shape(ya, 2, SHAPE(3, 10), "logits");
    double *va = values(ya), *vb = values(yb);
    cr_assert_arr_eq(va, vb, 30 * sizeof(double), "one seed, one model, one dropout stream");
    /* eval: no dropout, so two forwards agree and differ from training's */
    sr_module_train(a, false);
    cr_assert(!sr_module_is_training(a));
    sr_tensor *e1 = sr_module_forward(a, x), *e2 = sr_module_forward(a, x);
    double *v1 = values(e1), *v2 = values(e2);
    cr_assert_arr_eq(v1, v2, 30 * sizeof(double));
    cr_assert(memcmp(v1, va, 30 * sizeof(double)), "eval mode gave training's output");
    free(va), free(vb), free(v1), free(v2);
    sr_tensor *ts[] = {x, ya, yb, e1, e2};
    for (size_t i = 0; i < 5; i++)
        sr_tensor_unref(ts[i]);
    sr_module_destroy(a);
    sr_module_destroy(b);
}

/* Stages [0, 4), [4, 8), [8, 10) run one after another give the whole
 * model's output, and their parameter runs tile the list. */
Test(sequential, ranges_compose_to_the_whole_model)
{
    sr_module *m = make_cnn(SR_F64, 3);
    sr_module_train(m, false);
    sr_manual_seed(4);
    sr_tensor *x = sr_randn(SR_F64, 4, SHAPE(2, 1, 28, 28), 0), *whole = sr_module_forward(m, x);
    int cut[] = {0, 4, 8, CNN_LAYERS};
    sr_tensor *h = sr_tensor_ref(x);
    size_t next = 0, first, count;
    for (int s = 0; s < 3; s++) {
        sr_tensor *y = sr_sequential_forward_range(m, h, cut[s], cut[s + 1]);
        cr_assert(y, "%s", sr_last_error());
        sr_tensor_unref(h);
        h = y;
        cr_assert_eq(sr_sequential_param_range(m, cut[s], cut[s + 1], &first, &count), 0);
        cr_assert_eq(first, next, "stage %d starts at parameter %zu", s, first);
        next += count;
    }
    cr_assert_eq(next, 8);
    double *a = values(whole), *b = values(h);
    cr_assert_arr_eq(a, b, 20 * sizeof(double));
    free(a), free(b);
    cr_assert_null(sr_sequential_forward_range(m, x, 3, 11));
    cr_assert(strstr(sr_last_error(), "layers [3, 11) are not within the model's 10"), "%s", sr_last_error());
    sr_tensor_unref(x);
    sr_tensor_unref(whole);
    sr_tensor_unref(h);
    sr_module_destroy(m);
}

Test(sequential, bad_specs_name_the_layer)
{
    sr_generator g;
    sr_generator_init(&g, 1);
    sr_module *m = NULL;
    sr_layer_spec bad_groups[] = {SR_CONV2D(3, 4, 3, 1, 0)};
    bad_groups[0].groups = 2;
    cr_assert_eq(sr_sequential_create(bad_groups, 1, SR_F32, &g, &m), -EINVAL);
    cr_assert(strstr(sr_last_error(), "layer 0 (conv2d): in and out channels"), "%s", sr_last_error());
    sr_layer_spec bad_p[] = {SR_RELU(), SR_DROPOUT(2.0)};
    cr_assert_eq(sr_sequential_create(bad_p, 2, SR_F32, &g, &m), -EINVAL);
    cr_assert(strstr(sr_last_error(), "layer 1 (dropout): p must be between 0 and 1"), "%s", sr_last_error());
    cr_assert_eq(sr_sequential_create(cnn_spec, CNN_LAYERS, SR_I64, &g, &m), -EINVAL);
    cr_assert_null(m);
    /* a shape error between layers names the op when the forward runs */
    sr_layer_spec two[] = {SR_FLATTEN(), SR_LINEAR(5, 2)};
    cr_assert_eq(sr_sequential_create(two, 2, SR_F32, &g, &m), 0, "%s", sr_last_error());
    sr_tensor *x = sr_zeros(SR_F32, 3, SHAPE(2, 2, 3), 0);
    cr_assert_null(sr_module_forward(m, x));
    cr_assert(strstr(sr_last_error(), "sr_linear: input [2, 6]"), "%s", sr_last_error());
    sr_tensor_unref(x);
    sr_module_destroy(m);
}

/* Why layer norm (docs/TENSORS.md): each sample is normalised alone, so
 * the gradient of a batch equals the mean of its micro-batches' gradients,
 * as a pipeline with micro-batches computes it. */
static void grads_of(sr_module *m, sr_tensor *x, sr_tensor *y, double scale, double *acc, size_t total)
{
    sr_module_zero_grad(m);
    sr_tensor *logits = sr_module_forward(m, x), *loss = logits ? sr_cross_entropy(logits, y) : NULL;
    cr_assert(loss, "%s", sr_last_error());
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    size_t n, off = 0;
    sr_tensor *const *p;
    sr_module_params(m, &n, &p, NULL);
    for (size_t i = 0; i < n; i++) {
        double *g = values(sr_tensor_grad(p[i]));
        for (size_t j = 0; j < sr_tensor_numel(p[i]); j++)
            acc[off + j] += scale * g[j];
        off += sr_tensor_numel(p[i]);
        free(g);
    }
    cr_assert_eq(off, total);
    sr_tensor_unref(logits);
    sr_tensor_unref(loss);
}

Test(sequential, micro_batches_sum_to_the_batch_with_layer_norm)
{
    sr_module *m = make_cnn(SR_F64, 11);
    sr_module_train(m, false); /* dropout off: the rest is the same in both modes */
    sr_manual_seed(12);
    sr_tensor *x = sr_randn(SR_F64, 4, SHAPE(6, 1, 28, 28), 0);
    int64_t labels[6] = {3, 1, 4, 1, 5, 9};
    sr_tensor *y = sr_from_data(SR_I64, 1, SHAPE(6), labels, 0);
    size_t total = sr_module_numel(m);
    double *whole = calloc(total, sizeof(double)), *micro = calloc(total, sizeof(double));
    grads_of(m, x, y, 1.0, whole, total);
    for (int k = 0; k < 3; k++) { /* three micro-batches of two: the mean of their means */
        sr_tensor *xk = sr_narrow(x, 0, 2 * k, 2), *yk = sr_narrow(y, 0, 2 * k, 2);
        grads_of(m, xk, yk, 1.0 / 3, micro, total);
        sr_tensor_unref(xk);
        sr_tensor_unref(yk);
    }
    for (size_t i = 0; i < total; i++)
        if (fabs(whole[i] - micro[i]) > 1e-12 + 1e-9 * fabs(whole[i]))
            cr_assert_fail("gradient element %zu: batch %.17g, micro-batches %.17g", i, whole[i], micro[i]);
    free(whole);
    free(micro);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    sr_module_destroy(m);
}

/* The gradients of x and of every parameter as doubles, after backward of
 * sum(y * gy); the tensors' grads are left for the next call to see. */
static double *grads_of_sum(sr_tensor *y, sr_tensor *gy, sr_tensor *const *leaves, int n, size_t *len)
{
    sr_tensor *yg = sr_mul(y, gy), *l = sr_sum(yg);
    cr_assert_eq(sr_backward(l, false), 0, "%s", sr_last_error());
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += sr_tensor_numel(leaves[i]);
    double *v = malloc((total + 1) * sizeof(double));
    for (int i = 0, at = 0; i < n; at += (int)sr_tensor_numel(leaves[i]), i++) {
        sr_tensor *g = sr_tensor_grad(leaves[i]);
        cr_assert(g, "leaf %d has no grad", i);
        cr_assert_eq(sr_tensor_to_f64(g, v + at, sr_tensor_numel(g)), 0);
    }
    sr_tensor_unref(yg);
    sr_tensor_unref(l);
    *len = total;
    return v;
}

/* A sequential model of `layers` (n, the first a layer norm over the nd
 * dims ns) whose weight and bias are drawn ~ N(0, 1) after
 * sr_manual_seed(9), so that the norm's outputs have both signs; *params:
 * its two parameters. */
static sr_module *norm_model(const sr_layer_spec *layers, int n, sr_dtype dt, int nd, const int64_t *ns,
                             sr_tensor *const **params)
{
    sr_generator g;
    sr_generator_init(&g, 8);
    sr_module *m = NULL;
    cr_assert_eq(sr_sequential_create(layers, n, dt, &g, &m), 0, "%s", sr_last_error());
    size_t np = 0;
    sr_module_params(m, &np, params, NULL);
    cr_assert_eq(np, 2);
    sr_manual_seed(9);
    bool prev = sr_no_grad_enter();
    for (size_t i = 0; i < 2; i++) {
        sr_tensor *r = sr_randn(dt, nd, ns, 0);
        cr_assert_eq(sr_copy_((*params)[i], r), 0, "%s", sr_last_error());
        sr_tensor_unref(r);
    }
    sr_no_grad_exit(prev);
    return m;
}

/* A layer norm followed by a relu runs as one op in a sequential model
 * (LayerNormReluBackward0): the output and every gradient must be those of
 * the two ops in turn, bit for bit, in f32 and f64, with a weight and bias
 * that make about half the outputs negative, and with the relu outside the
 * range (then no fusion). */
Test(sequential, layer_norm_then_relu_is_fused_bit_for_bit)
{
    static const sr_layer_spec layers[] = {SR_LAYER_NORM_CHW(3, 5, 7), SR_RELU()};
    for (int d = 0; d < 2; d++) {
        sr_dtype dt = d ? SR_F64 : SR_F32;
        sr_tensor *const *params = NULL;
        sr_module *m = norm_model(layers, 2, dt, 3, SHAPE(3, 5, 7), &params);
        bool prev = sr_no_grad_enter();
        sr_tensor *x0 = sr_randn(dt, 4, SHAPE(4, 3, 5, 7), 0), *gy = sr_randn(dt, 4, SHAPE(4, 3, 5, 7), 0);
        sr_tensor *x1 = sr_clone(x0), *x2 = sr_clone(x0), *w = sr_clone(params[0]), *b = sr_clone(params[1]);
        sr_no_grad_exit(prev); /* the clones are leaves */
        sr_tensor *leaves1[] = {x1, params[0], params[1]}, *leaves2[] = {x2, w, b};
        for (int i = 0; i < 3; i++) {
            sr_tensor_set_requires_grad(leaves1[i], true);
            sr_tensor_set_requires_grad(leaves2[i], true);
        }
        sr_tensor *fused = sr_module_forward(m, x1);
        cr_assert(fused, "%s", sr_last_error());
        cr_assert_str_eq(sr_tensor_grad_fn_name(fused), "LayerNormReluBackward0");
        sr_tensor *ln = sr_layer_norm(x2, 3, SHAPE(3, 5, 7), w, b, 1e-5), *two = sr_relu(ln);
        size_t n1, n2, ny = sr_tensor_numel(two);
        double *y1 = values(fused), *y2 = values(two);
        size_t zeros = 0;
        for (size_t i = 0; i < ny; i++) {
            cr_assert(!memcmp(&y1[i], &y2[i], sizeof(double)), "%s output [%zu]: %.17g fused, %.17g in turn",
                      sr_dtype_name(dt), i, y1[i], y2[i]);
            zeros += y2[i] == 0;
        }
        cr_assert(zeros > ny / 4 && zeros < 3 * ny / 4, "%zu of %zu outputs are 0: not a test of the mask", zeros,
                  ny);
        double *g1 = grads_of_sum(fused, gy, leaves1, 3, &n1), *g2 = grads_of_sum(two, gy, leaves2, 3, &n2);
        cr_assert_eq(n1, n2);
        for (size_t i = 0; i < n1; i++)
            cr_assert(!memcmp(&g1[i], &g2[i], sizeof(double)), "%s gradient [%zu]: %.17g fused, %.17g in turn",
                      sr_dtype_name(dt), i, g1[i], g2[i]);
        sr_tensor *alone = sr_sequential_forward_range(m, x1, 0, 1); /* the norm without its relu */
        cr_assert_str_eq(sr_tensor_grad_fn_name(alone), "NativeLayerNormBackward0");
        free(y1), free(y2), free(g1), free(g2);
        sr_tensor *ts[] = {x0, gy, x1, x2, w, b, fused, ln, two, alone};
        for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
            sr_tensor_unref(ts[i]);
        sr_module_destroy(m);
    }
}

/* One case of the fused norm, relu and 2 x 2 pool: a model of `layers`
 * (a layer norm over norm_nd trailing dims of x [4, shape...], a relu, a
 * pool) against the three ops in turn, output and gradients bit for bit;
 * fused: the model must run them as one op. */
static void check_norm_relu_pool(sr_dtype dt, const sr_layer_spec *layers, const int64_t *xs, int norm_nd, bool fused)
{
    const int64_t *ns = xs + 4 - norm_nd;
    sr_tensor *const *params = NULL;
    sr_module *m = norm_model(layers, 3, dt, norm_nd, ns, &params);
    bool prev = sr_no_grad_enter();
    sr_tensor *x0 = sr_randn(dt, 4, xs, 0), *x1 = sr_clone(x0), *x2 = sr_clone(x0);
    sr_tensor *w = sr_clone(params[0]), *b = sr_clone(params[1]);
    sr_no_grad_exit(prev); /* the clones are leaves */
    sr_tensor *leaves1[] = {x1, params[0], params[1]}, *leaves2[] = {x2, w, b};
    for (int i = 0; i < 3; i++) {
        sr_tensor_set_requires_grad(leaves1[i], true);
        sr_tensor_set_requires_grad(leaves2[i], true);
    }
    sr_tensor *one = sr_module_forward(m, x1);
    cr_assert(one, "%s", sr_last_error());
    cr_assert_str_eq(sr_tensor_grad_fn_name(one), fused ? "LayerNormReluMaxPool2DBackward0"
                                                        : "MaxPool2DWithIndicesBackward0");
    sr_tensor *ln = sr_layer_norm(x2, norm_nd, ns, w, b, 1e-5), *rl = sr_relu(ln);
    sr_tensor *three = sr_max_pool2d(rl, layers[2].kernel, layers[2].stride, (const int64_t[]){0, 0});
    cr_assert(three, "%s", sr_last_error());
    sr_tensor *gy = sr_randn(dt, sr_tensor_ndim(three), sr_tensor_shape(three), 0);
    size_t n1, n2, ny = sr_tensor_numel(three), zeros = 0;
    cr_assert_eq(sr_tensor_numel(one), ny);
    double *y1 = values(one), *y2 = values(three);
    for (size_t i = 0; i < ny; i++) {
        cr_assert(!memcmp(&y1[i], &y2[i], sizeof(double)), "%s output [%zu]: %.17g as one op, %.17g in turn",
                  sr_dtype_name(dt), i, y1[i], y2[i]);
        zeros += y2[i] == 0;
    }
    cr_assert(!fused || (zeros > 0 && zeros < ny / 2), "%zu of %zu windows are all <= 0: not a test of the mask",
              zeros, ny);
    double *g1 = grads_of_sum(one, gy, leaves1, 3, &n1), *g2 = grads_of_sum(three, gy, leaves2, 3, &n2);
    cr_assert_eq(n1, n2);
    for (size_t i = 0; i < n1; i++)
        cr_assert(!memcmp(&g1[i], &g2[i], sizeof(double)), "%s gradient [%zu]: %.17g as one op, %.17g in turn",
                  sr_dtype_name(dt), i, g1[i], g2[i]);
    free(y1), free(y2), free(g1), free(g2);
    sr_tensor *ts[] = {x0, gy, x1, x2, w, b, one, ln, rl, three};
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
        sr_tensor_unref(ts[i]);
    sr_module_destroy(m);
}

/* A layer norm, a relu and a 2 x 2 max pool of stride 2 run as one op in a
 * sequential model (LayerNormReluMaxPool2DBackward0), with the three ops'
 * output and gradients bit for bit, in f32 and f64: even planes, planes of
 * odd height and width (the last row and column are not pooled), planes
 * narrower than a vector, and the norm over [H, W] only; a pool of another
 * window is not fused. */
Test(sequential, layer_norm_relu_and_2x2_max_pool_are_fused_bit_for_bit)
{
    static const sr_layer_spec chw[] = {SR_LAYER_NORM_CHW(3, 6, 20), SR_RELU(), SR_MAX_POOL2D(2, 2)};
    static const sr_layer_spec odd[] = {SR_LAYER_NORM_CHW(2, 7, 11), SR_RELU(), SR_MAX_POOL2D(2, 2)};
    static const sr_layer_spec thin[] = {SR_LAYER_NORM_CHW(3, 4, 5), SR_RELU(), SR_MAX_POOL2D(2, 2)};
    sr_layer_spec hw[] = {SR_LAYER_NORM_CHW(3, 6, 8), SR_RELU(), SR_MAX_POOL2D(2, 2)};
    hw[0].norm_ndim = 2, hw[0].norm_shape[0] = 6, hw[0].norm_shape[1] = 8;
    static const sr_layer_spec wide[] = {SR_LAYER_NORM_CHW(3, 6, 8), SR_RELU(), SR_MAX_POOL2D(3, 2)};
    for (int d = 0; d < 2; d++) {
        sr_dtype dt = d ? SR_F64 : SR_F32;
        check_norm_relu_pool(dt, chw, SHAPE(4, 3, 6, 20), 3, true);
        check_norm_relu_pool(dt, odd, SHAPE(4, 2, 7, 11), 3, true);
        check_norm_relu_pool(dt, thin, SHAPE(4, 3, 4, 5), 3, true);
        check_norm_relu_pool(dt, hw, SHAPE(4, 3, 6, 8), 2, true);
        check_norm_relu_pool(dt, wide, SHAPE(4, 3, 6, 8), 3, false);
    }
}

/* A lone layer is nn.Conv2d: "weight" and "bias", the same draws as the
 * same layer first in a sequential model. */
Test(sequential, a_lone_layer_is_a_module)
{
    sr_layer_spec conv = SR_CONV2D(2, 4, 3, 2, 1);
    conv.groups = 2;
    sr_generator g1, g2;
    sr_generator_init(&g1, 6);
    sr_generator_init(&g2, 6);
    sr_module *lone, *seq;
    cr_assert_eq(sr_layer_create(&conv, SR_F64, &g1, &lone), 0, "%s", sr_last_error());
    cr_assert_eq(sr_sequential_create(&conv, 1, SR_F64, &g2, &seq), 0, "%s", sr_last_error());
    size_t n;
    const char *const *names;
    sr_module_params(lone, &n, NULL, &names);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(names[0], "weight");
    cr_assert_str_eq(names[1], "bias");
    sr_tensor *w = sr_module_param(lone, "weight"), *w0 = sr_module_param(seq, "0.weight");
    tu_expect_shape(w, 4, SHAPE(4, 1, 3, 3), "weight"); /* in / groups channels */
    double *a = values(w), *b = values(w0);
    cr_assert_arr_eq(a, b, 36 * sizeof(double));
    free(a), free(b);
    sr_tensor *x = sr_randn(SR_F64, 4, SHAPE(1, 2, 5, 5), 0), *y = sr_module_forward(lone, x);
    tu_expect_shape(y, 4, SHAPE(1, 4, 3, 3), "output");
    sr_layer_spec bad = SR_DROPOUT(-1);
    sr_module *none = seq;
    cr_assert_eq(sr_layer_create(&bad, SR_F32, &g1, &none), -EINVAL);
    cr_assert_null(none, "a failed create leaves *m NULL");
    cr_assert(strstr(sr_last_error(), "sr_layer_create: layer 0 (dropout)"), "%s", sr_last_error());
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    sr_module_destroy(seq);
    sr_module_destroy(lone);
}

/* The CNN with Adam fits one batch of 16 random images to random labels:
 * conv2d, pooling, layer norm, dropout and linear all learn through the
 * module. */
Test(sequential, a_cnn_learns_a_batch)
{
    sr_module *m = make_cnn(SR_F32, 7);
    sr_manual_seed(8);
    sr_tensor *x = sr_randn(SR_F32, 4, SHAPE(16, 1, 28, 28), 0);
    int64_t labels[16];
    for (int i = 0; i < 16; i++)
        labels[i] = (i * 7) % 10;
    sr_tensor *y = sr_from_data(SR_I64, 1, SHAPE(16), labels, 0);
    size_t n;
    sr_tensor *const *p;
    sr_module_params(m, &n, &p, NULL);
    sr_optim_opts o;
    sr_optim_opts_default(SR_OPTIM_ADAM, &o);
    o.lr = 3e-3;
    sr_optim *opt;
    cr_assert_eq(sr_optim_create(SR_OPTIM_ADAM, &o, p, n, &opt), 0, "%s", sr_last_error());
    double first = 0, last = 0;
    for (int step = 0; step < 25; step++) {
        sr_module_zero_grad(m);
        sr_tensor *logits = sr_module_forward(m, x), *loss = logits ? sr_cross_entropy(logits, y) : NULL;
        cr_assert(loss, "%s", sr_last_error());
        last = sr_tensor_item(loss);
        first = step ? first : last;
        cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
        for (size_t i = 0; i < n; i++)
            cr_assert(sr_tensor_grad(p[i]), "parameter %zu got no gradient", i);
        cr_assert_eq(sr_optim_step(opt), 0, "%s", sr_last_error());
        sr_tensor_unref(logits);
        sr_tensor_unref(loss);
    }
    cr_assert_lt(last, first / 4, "loss went from %g to %g", first, last);
    sr_optim_destroy(opt);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    sr_module_destroy(m);
}
