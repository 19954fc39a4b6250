/* SPDX-License-Identifier: MIT */
/* Every op's backward against central finite differences, in f64 (see
 * gradcheck.h for the method and tolerances). Inputs are random from fixed
 * seeds, kept away from the points where an op is not differentiable (relu
 * at 0) or not defined (log, sqrt, pow of a non-positive base). */
#include <criterion/criterion.h>
#include <errno.h>

#include "gradcheck.h"
#include "shmrpc/autograd_function.h"
#include "common.h"

LEAK_CHECKED_SUITE(gradcheck);

#define IN(lo_, hi_, nd_, ...) {.ndim = nd_, .shape = {__VA_ARGS__}, .lo = lo_, .hi = hi_}
#define TARGET(classes, nd_, ...) {.ndim = nd_, .shape = {__VA_ARGS__}, .lo = 0, .hi = classes, .is_target = true}

typedef sr_tensor *(*unary_op)(sr_tensor *);
typedef sr_tensor *(*binary_op)(sr_tensor *, sr_tensor *);

static sr_tensor *apply_unary(sr_tensor *const *in, const void *arg) { return (*(const unary_op *)arg)(in[0]); }
static sr_tensor *apply_binary(sr_tensor *const *in, const void *arg)
{
    return (*(const binary_op *)arg)(in[0], in[1]);
}

static void check_binary(const char *name, binary_op op, struct gc_input a, struct gc_input b)
{
    struct gc_input in[2] = {a, b};
    gradcheck(name, apply_binary, &op, 2, in);
}

static void check_unary(const char *name, unary_op op, struct gc_input a)
{
    gradcheck(name, apply_unary, &op, 1, &a);
}

Test(gradcheck, add_sub_mul_div_with_broadcasting)
{
    binary_op ops[] = {sr_add, sr_sub, sr_mul};
    const char *names[] = {"add", "sub", "mul"};
    for (int i = 0; i < 3; i++) {
        check_binary(names[i], ops[i], (struct gc_input)IN(-1, 1, 2, 2, 3), (struct gc_input)IN(-1, 1, 1, 3));
        check_binary(names[i], ops[i], (struct gc_input)IN(-1, 1, 3, 2, 1, 3), (struct gc_input)IN(-1, 1, 2, 4, 1));
        check_binary(names[i], ops[i], (struct gc_input)IN(-1, 1, 0), (struct gc_input)IN(-1, 1, 2, 2, 2));
    }
    check_binary("div", sr_div, (struct gc_input)IN(-1, 1, 2, 2, 3), (struct gc_input)IN(0.5, 2, 2, 2, 1));
    check_binary("pow", sr_pow, (struct gc_input)IN(0.5, 2, 2, 2, 3), (struct gc_input)IN(-1, 2, 1, 3));
}

static sr_tensor *scalar_chain(sr_tensor *const *in, const void *arg)
{
    (void)arg;
    sr_tensor *a = sr_add_scalar(in[0], 2), *b = sr_sub_scalar(a, 0.5), *c = sr_mul_scalar(b, -3),
              *d = sr_div_scalar(c, 4), *e = sr_neg(d);
    sr_tensor_unref(a);
    sr_tensor_unref(b);
    sr_tensor_unref(c);
    sr_tensor_unref(d);
    return e;
}

static sr_tensor *pow_scalar(sr_tensor *const *in, const void *arg)
{
    return sr_pow_scalar(in[0], *(const double *)arg);
}

Test(gradcheck, scalar_ops_and_pow)
{
    struct gc_input a = IN(-1, 1, 2, 2, 3), p = IN(0.5, 2, 1, 5);
    gradcheck("scalar chain", scalar_chain, NULL, 1, &a);
    double exps[] = {2.5, 3, 0, -1.5};
    for (int i = 0; i < 4; i++)
        gradcheck("pow_scalar", pow_scalar, &exps[i], 1, &p);
}

Test(gradcheck, unary)
{
    check_unary("exp", sr_exp, (struct gc_input)IN(-2, 2, 2, 2, 3));
    check_unary("log", sr_log, (struct gc_input)IN(0.2, 3, 2, 2, 3));
    check_unary("sin", sr_sin, (struct gc_input)IN(-3, 3, 2, 2, 3));
    check_unary("cos", sr_cos, (struct gc_input)IN(-3, 3, 2, 2, 3));
    check_unary("tanh", sr_tanh, (struct gc_input)IN(-2, 2, 2, 2, 3));
    check_unary("relu", sr_relu, (struct gc_input)IN(-1, 1, 2, 3, 4));
    check_unary("sigmoid", sr_sigmoid, (struct gc_input)IN(-3, 3, 2, 2, 3));
    check_unary("sqrt", sr_sqrt, (struct gc_input)IN(0.2, 3, 2, 2, 3));
    check_unary("clone", sr_clone, (struct gc_input)IN(-1, 1, 2, 2, 3));
}

Test(gradcheck, matmul_mm_bmm)
{
    check_binary("mm", sr_mm, (struct gc_input)IN(-1, 1, 2, 3, 4), (struct gc_input)IN(-1, 1, 2, 4, 2));
    check_binary("bmm", sr_bmm, (struct gc_input)IN(-1, 1, 3, 2, 3, 4), (struct gc_input)IN(-1, 1, 3, 2, 4, 2));
    struct {
        struct gc_input a, b;
    } cases[] = {
        {IN(-1, 1, 1, 4), IN(-1, 1, 1, 4)},
        {IN(-1, 1, 2, 3, 4), IN(-1, 1, 1, 4)},
        {IN(-1, 1, 1, 4), IN(-1, 1, 2, 4, 3)},
        {IN(-1, 1, 3, 2, 3, 4), IN(-1, 1, 2, 4, 2)},
        {IN(-1, 1, 4, 2, 1, 3, 4), IN(-1, 1, 3, 3, 4, 2)},
        {IN(-1, 1, 1, 4), IN(-1, 1, 3, 2, 4, 3)},
        {IN(-1, 1, 3, 2, 3, 4), IN(-1, 1, 1, 4)},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_binary("matmul", sr_matmul, cases[i].a, cases[i].b);
}

static sr_tensor *reduce(sr_tensor *const *in, const void *arg)
{
    int which = *(const int *)arg;
    switch (which) {
    case 0: return sr_sum(in[0]);
    case 1: return sr_sum_dim(in[0], 1, false);
    case 2: return sr_sum_dim(in[0], -1, true);
    case 3: return sr_mean(in[0]);
    case 4: return sr_mean_dim(in[0], 0, false);
    default: return sr_mean_dim(in[0], 2, true);
    }
}

Test(gradcheck, sum_and_mean)
{
    struct gc_input a = IN(-1, 1, 3, 2, 3, 2);
    for (int i = 0; i < 6; i++)
        gradcheck("reduce", reduce, &i, 1, &a);
}

static sr_tensor *shape_op(sr_tensor *const *in, const void *arg)
{
    sr_tensor *a = in[0];
    switch (*(const int *)arg) {
    case 0: return sr_view(a, 2, (const int64_t[]){4, -1});
    case 1: {
        sr_tensor *t = sr_transpose(a, 0, 2), *r = sr_reshape(t, 1, (const int64_t[]){24});
        sr_tensor_unref(t);
        return r;
    }
    case 2: return sr_transpose(a, 1, -1);
    case 3: return sr_permute(a, (const int[]){2, 0, 1});
    case 4: return sr_narrow(a, 1, 1, 2);
    case 5: {
        sr_tensor *u = sr_unsqueeze(a, 1), *e = sr_expand(u, 4, (const int64_t[]){2, 3, 3, 4});
        sr_tensor_unref(u);
        return e;
    }
    case 6: {
        sr_tensor *n = sr_narrow(a, 1, 0, 1), *s = sr_squeeze(n, 1);
        sr_tensor_unref(n);
        return s;
    }
    default: {
        sr_tensor *t = sr_transpose(a, 0, 1), *c = sr_contiguous(t);
        sr_tensor_unref(t);
        return c;
    }
    }
}

static sr_tensor *t_op(sr_tensor *const *in, const void *arg)
{
    (void)arg;
    return sr_t(in[0]);
}

Test(gradcheck, views)
{
    struct gc_input a = IN(-1, 1, 3, 2, 3, 4), m = IN(-1, 1, 2, 3, 4);
    for (int i = 0; i < 8; i++)
        gradcheck("shape op", shape_op, &i, 1, &a);
    gradcheck("t", t_op, NULL, 1, &m);
}

static sr_tensor *join(sr_tensor *const *in, const void *arg)
{
    int which = *(const int *)arg;
    if (which == 0)
        return sr_cat(in, 3, 1);
    if (which == 1)
        return sr_stack(in, 3, -1);
    sr_tensor *parts[4], *scaled[4];
    int n = which == 2 ? sr_chunk(in[0], 3, 0, parts) : sr_split(in[0], 2, 1, parts);
    cr_assert(n > 0, "%s", sr_last_error());
    for (int i = 0; i < n; i++)
        scaled[i] = sr_mul_scalar(parts[i], i + 1);
    /* drop piece 1's gradient path entirely: the split node sees a missing grad */
    sr_tensor *out = sr_cat((sr_tensor *[]){scaled[0], scaled[n - 1]}, 2, which == 2 ? 0 : 1);
    for (int i = 0; i < n; i++) {
        sr_tensor_unref(parts[i]);
        sr_tensor_unref(scaled[i]);
    }
    return out;
}

Test(gradcheck, cat_stack_chunk_split)
{
    struct gc_input cat_in[3] = {IN(-1, 1, 2, 2, 1), IN(-1, 1, 2, 2, 3), IN(-1, 1, 2, 2, 2)};
    struct gc_input stack_in[3] = {IN(-1, 1, 2, 2, 3), IN(-1, 1, 2, 2, 3), IN(-1, 1, 2, 2, 3)};
    struct gc_input one[1] = {IN(-1, 1, 2, 5, 5)};
    int w[4] = {0, 1, 2, 3};
    gradcheck("cat", join, &w[0], 3, cat_in);
    gradcheck("stack", join, &w[1], 3, stack_in);
    gradcheck("chunk", join, &w[2], 1, one);
    gradcheck("split", join, &w[3], 1, one);
}

static sr_tensor *nn_op(sr_tensor *const *in, const void *arg)
{
    switch (*(const int *)arg) {
    case 0: return sr_log_softmax(in[0], 1);
    case 1: return sr_log_softmax(in[0], 0);
    case 2: return sr_softmax(in[0], -1);
    case 3: return sr_nll_loss(in[0], in[1]);
    case 4: return sr_cross_entropy(in[0], in[1]);
    default: return sr_mse_loss(in[0], in[1]);
    }
}

Test(gradcheck, losses)
{
    struct gc_input logits[2] = {IN(-2, 2, 2, 4, 5), TARGET(5, 1, 4)};
    struct gc_input logits1d[2] = {IN(-2, 2, 1, 5), TARGET(5, 0)};
    struct gc_input pair[2] = {IN(-1, 1, 2, 3, 4), IN(-1, 1, 2, 3, 4)};
    for (int i = 0; i < 3; i++)
        gradcheck("softmax", nn_op, &i, 1, logits);
    int nll = 3, ce = 4, mse = 5;
    gradcheck("nll_loss", nn_op, &nll, 2, logits);
    gradcheck("cross_entropy", nn_op, &ce, 2, logits);
    gradcheck("cross_entropy 1-d", nn_op, &ce, 2, logits1d);
    gradcheck("mse_loss", nn_op, &mse, 2, pair);
}

/* A composition, to exercise gradient accumulation across branches. */
static sr_tensor *mlp(sr_tensor *const *in, const void *arg)
{
    (void)arg;
    sr_tensor *h = sr_matmul(in[0], in[1]), *hb = sr_add(h, in[2]), *a = sr_tanh(hb), *o = sr_matmul(a, in[3]);
    sr_tensor *l = sr_cross_entropy(o, in[4]), *r = sr_mul(a, a), *rs = sr_mean(r), *loss = sr_add(l, rs);
    sr_tensor *ts[] = {h, hb, a, o, l, r, rs};
    for (int i = 0; i < 7; i++)
        sr_tensor_unref(ts[i]);
    return loss;
}

Test(gradcheck, mlp_composition)
{
    struct gc_input in[5] = {IN(-1, 1, 2, 4, 3), IN(-1, 1, 2, 3, 5), IN(-1, 1, 1, 5), IN(-1, 1, 2, 5, 2),
                             TARGET(2, 1, 4)};
    gradcheck("mlp", mlp, NULL, 5, in);
}

/* A user-defined function (shmrpc/autograd_function.h), x * sin(y), whose
 * backward is written by hand: its gradients against the numeric ones. */
static int xsin_fwd(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout)
{
    (void)n;
    (void)nout;
    int rc = sr_function_ctx_save_for_backward(ctx, in, 2);
    sr_tensor *s = rc ? NULL : sr_sin(in[1]);
    out[0] = sr_mul(in[0], s);
    sr_tensor_unref(s);
    return out[0] ? 0 : -EINVAL;
}

static int xsin_bwd(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, sr_tensor **gin, size_t n)
{
    (void)nout;
    (void)n;
    sr_tensor *x = NULL, *y = NULL;
    int rc = sr_function_ctx_saved(ctx, 0, &x);
    if (rc || (rc = sr_function_ctx_saved(ctx, 1, &y))) {
        sr_tensor_unref(x);
        return rc;
    }
    sr_tensor *s = sr_sin(y), *c = sr_cos(y), *xc = sr_mul(x, c);
    gin[0] = sr_mul(gout[0], s);
    gin[1] = sr_mul(gout[0], xc);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    sr_tensor_unref(s);
    sr_tensor_unref(c);
    sr_tensor_unref(xc);
    return gin[0] && gin[1] ? 0 : -EINVAL;
}

static const sr_autograd_function xsin = {"XSin", xsin_fwd, xsin_bwd, NULL};

static sr_tensor *apply_xsin(sr_tensor *const *in, const void *arg)
{
    (void)arg;
    sr_tensor *out;
    return sr_function_apply(&xsin, in, 2, &out, 1) ? NULL : out;
}

Test(gradcheck, custom_function)
{
    struct gc_input in[2] = {IN(-1, 1, 2, 2, 3), IN(-3, 3, 2, 2, 3)};
    gradcheck("custom XSin", apply_xsin, NULL, 2, in);
}

/* ---- convolution layers ---- */
struct conv_case {
    int64_t stride[2], padding[2], dilation[2], groups;
    bool bias;
};

static sr_tensor *conv_op(sr_tensor *const *in, const void *arg)
{
    const struct conv_case *c = arg;
    return sr_conv2d(in[0], in[1], c->bias ? in[2] : NULL, c->stride, c->padding, c->dilation, c->groups);
}

Test(gradcheck, conv2d)
{
    struct conv_case plain = {{1, 1}, {0, 0}, {1, 1}, 1, true}, strided = {{2, 1}, {1, 2}, {1, 1}, 1, true},
                     dilated = {{1, 2}, {1, 0}, {2, 1}, 1, false}, grouped = {{2, 2}, {1, 1}, {1, 1}, 2, true};
    struct gc_input a[3] = {IN(-1, 1, 4, 2, 2, 4, 5), IN(-1, 1, 4, 3, 2, 2, 3), IN(-1, 1, 1, 3)};
    gradcheck("conv2d", conv_op, &plain, 3, a);
    gradcheck("conv2d stride (2, 1) padding (1, 2)", conv_op, &strided, 3, a);
    struct gc_input d[2] = {IN(-1, 1, 4, 1, 2, 6, 5), IN(-1, 1, 4, 2, 2, 3, 2)};
    gradcheck("conv2d dilation (2, 1), no bias", conv_op, &dilated, 2, d);
    struct gc_input g[3] = {IN(-1, 1, 4, 2, 4, 5, 5), IN(-1, 1, 4, 4, 2, 3, 3), IN(-1, 1, 1, 4)};
    gradcheck("conv2d groups 2", conv_op, &grouped, 3, g);
}

/* The fast paths (docs/TENSORS.md, "Convolution layers"): the direct forward
 * for few input channels (K = C kH kW <= 32), over more than one block of
 * the width (16 doubles), with an odd channel count, batch 1; the backward
 * as a convolution of dY (stride 1, C >= 16), odd widths, padding below
 * and at kernel - 1. */
Test(gradcheck, conv2d_fast_paths)
{
    struct conv_case pad1 = {{1, 1}, {1, 1}, {1, 1}, 1, true}, wide = {{2, 1}, {1, 1}, {1, 1}, 1, true},
                     pad21 = {{1, 1}, {2, 1}, {1, 1}, 1, true}, pad10 = {{1, 1}, {1, 0}, {1, 1}, 1, false};
    struct gc_input direct[3] = {IN(-1, 1, 4, 1, 1, 3, 19), IN(-1, 1, 4, 3, 1, 3, 3), IN(-1, 1, 1, 3)};
    gradcheck("conv2d direct, one channel, width 19, stride (2, 1)", conv_op, &wide, 3, direct);
    struct gc_input c3[3] = {IN(-1, 1, 4, 2, 3, 5, 7), IN(-1, 1, 4, 5, 3, 3, 3), IN(-1, 1, 1, 5)};
    gradcheck("conv2d direct, three channels, padding (2, 1)", conv_op, &pad21, 3, c3);
    struct gc_input by_conv[3] = {IN(-1, 1, 4, 2, 16, 4, 5), IN(-1, 1, 4, 3, 16, 3, 3), IN(-1, 1, 1, 3)};
    gradcheck("conv2d backward by convolution, 16 channels", conv_op, &pad1, 3, by_conv);
    struct gc_input edge[2] = {IN(-1, 1, 4, 1, 16, 3, 7), IN(-1, 1, 4, 2, 16, 2, 3)};
    gradcheck("conv2d backward by convolution, kernel 2 x 3, padding (1, 0)", conv_op, &pad10, 2, edge);
}

static sr_tensor *pool_op(sr_tensor *const *in, const void *arg)
{
    const int64_t *k = arg; /* kernel, stride, padding, max? */
    return k[6] ? sr_max_pool2d(in[0], k, k + 2, k + 4) : sr_avg_pool2d(in[0], k, k + 2, k + 4);
}

Test(gradcheck, pooling)
{
    struct gc_input x = IN(-1, 1, 4, 2, 2, 5, 6);
    static const int64_t cfg[][7] = {{2, 2, 2, 2, 0, 0, 1}, {3, 2, 2, 1, 1, 1, 1}, {2, 2, 2, 2, 0, 0, 0},
                                     {3, 3, 2, 1, 1, 1, 0}};
    for (size_t i = 0; i < sizeof(cfg) / sizeof(cfg[0]); i++)
        gradcheck(cfg[i][6] ? "max_pool2d" : "avg_pool2d", pool_op, cfg[i], 1, &x);
}

static sr_tensor *norm_op(sr_tensor *const *in, const void *arg)
{
    (void)arg;
    return sr_layer_norm(in[0], 2, (const int64_t[]){3, 4}, in[1], in[2], 1e-5);
}

static sr_tensor *norm_bias_only(sr_tensor *const *in, const void *arg)
{
    (void)arg;
    return sr_layer_norm(in[0], 1, (const int64_t[]){5}, NULL, in[1], 1e-3);
}

static sr_tensor *flatten_op(sr_tensor *const *in, const void *arg)
{
    (void)arg;
    sr_tensor *f = sr_flatten(in[0], 1, 2), *out = f ? sr_mul(f, f) : NULL;
    sr_tensor_unref(f);
    return out;
}

Test(gradcheck, layer_norm_and_flatten)
{
    struct gc_input in[3] = {IN(-2, 2, 3, 2, 3, 4), IN(-1, 1, 2, 3, 4), IN(-1, 1, 2, 3, 4)};
    gradcheck("layer_norm", norm_op, NULL, 3, in);
    struct gc_input b[2] = {IN(-2, 2, 3, 2, 3, 5), IN(-1, 1, 1, 5)};
    gradcheck("layer_norm, bias only", norm_bias_only, NULL, 2, b);
    struct gc_input x = IN(-1, 1, 4, 2, 2, 3, 2);
    gradcheck("flatten", flatten_op, NULL, 1, &x);
}
