/* SPDX-License-Identifier: MIT */
/* Unary maths with backward: exp, log, sin, cos, tanh, relu, sigmoid, sqrt.
 * Each op is a row of a table: the forward function and the derivative in
 * terms of the incoming gradient and either the input or the output,
 * whichever the op saves, computed in double; relu, between every layer of
 * a CNN, also has rows typed in its own dtype. */
#include <errno.h>
#include <math.h>

#include "autograd/engine.h"
#include "error.h"
#include "kernels.h"
#include "tensor_impl.h"

struct unary_def {
    const char *fn;
    sr_node_ops ops;
    double (*f)(double x);
    double (*df)(double g, double v); /* v: the output if use_output, else the input */
    bool use_output;
    /* Optional typed rows (ctx: the sr_dtype) for an op cheap enough that
     * the trip through doubles would dominate it: forward p[0] = f(p[1]);
     * backward p[0] = df(p[1], p[2]) with operands of one shape. */
    sr_inner_fn fast_f, fast_df;
};

static double relu_f(double x) { return x > 0.0 ? x : 0.0; }
static double sigmoid_f(double x) { return 1.0 / (1.0 + exp(-x)); }
static double d_exp(double g, double y) { return g * y; }
static double d_log(double g, double x) { return g / x; }
static double d_sin(double g, double x) { return g * cos(x); }
static double d_cos(double g, double x) { return -g * sin(x); }
static double d_tanh(double g, double y) { return g * (1.0 - y * y); }
static double d_relu(double g, double y) { return y > 0.0 ? g : 0.0; }
static double d_sigmoid(double g, double y) { return g * y * (1.0 - y); }
static double d_sqrt(double g, double y) { return g / (2.0 * y); }

/* relu in the tensor's own dtype: max(x, 0), and g where y > 0 (a NaN
 * gives 0, as relu_f and d_relu do). */
#define DEFINE_RELU_ROWS(T, SUFFIX)                                                                            \
    static void relu_##SUFFIX(char **p, const int64_t *s, int64_t n)                                           \
    {                                                                                                          \
        if (s[0] == sizeof(T) && s[1] == sizeof(T)) {                                                          \
            T *restrict y = (T *)p[0];                                                                         \
            const T *restrict x = (const T *)p[1];                                                             \
            for (int64_t k = 0; k < n; k++) {                                                                  \
                T xk = x[k];                                                                                   \
                y[k] = xk > 0 ? xk : (T)0;                                                                     \
            }                                                                                                  \
            return;                                                                                            \
        }                                                                                                      \
        for (int64_t k = 0; k < n; k++) {                                                                      \
            T v = *(const T *)(p[1] + k * s[1]);                                                               \
            *(T *)(p[0] + k * s[0]) = v > 0 ? v : (T)0;                                                        \
        }                                                                                                      \
    }                                                                                                          \
    static void relu_grad_##SUFFIX(char **p, const int64_t *s, int64_t n)                                      \
    {                                                                                                          \
        if (s[0] == sizeof(T) && s[1] == sizeof(T) && s[2] == sizeof(T)) {                                     \
            T *restrict o = (T *)p[0];                                                                         \
            const T *restrict g = (const T *)p[1], *restrict y = (const T *)p[2];                              \
            for (int64_t k = 0; k < n; k++) { /* both loaded: a select, no branch (signs are random) */      \
                T gk = g[k], yk = y[k];                                                                        \
                o[k] = yk > 0 ? gk : (T)0;                                                                     \
            }                                                                                                  \
            return;                                                                                            \
        }                                                                                                      \
        for (int64_t k = 0; k < n; k++) {                                                                      \
            T g = *(const T *)(p[1] + k * s[1]), y = *(const T *)(p[2] + k * s[2]);                            \
            *(T *)(p[0] + k * s[0]) = y > 0 ? g : (T)0;                                                        \
        }                                                                                                      \
    }
DEFINE_RELU_ROWS(float, f32)
DEFINE_RELU_ROWS(double, f64)

static void relu_row(char **p, const int64_t *s, int64_t n, void *ctx)
{
    if (*(const sr_dtype *)ctx == SR_F64)
        relu_f64(p, s, n);
    else
        relu_f32(p, s, n);
}

static void relu_grad_row(char **p, const int64_t *s, int64_t n, void *ctx)
{
    if (*(const sr_dtype *)ctx == SR_F64)
        relu_grad_f64(p, s, n);
    else
        relu_grad_f32(p, s, n);
}

static int unary_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out);

static const struct unary_def defs[] = {
    {"sr_exp", {.name = "ExpBackward0", .apply = unary_apply}, exp, d_exp, true, NULL, NULL},
    {"sr_log", {.name = "LogBackward0", .apply = unary_apply}, log, d_log, false, NULL, NULL},
    {"sr_sin", {.name = "SinBackward0", .apply = unary_apply}, sin, d_sin, false, NULL, NULL},
    {"sr_cos", {.name = "CosBackward0", .apply = unary_apply}, cos, d_cos, false, NULL, NULL},
    {"sr_tanh", {.name = "TanhBackward0", .apply = unary_apply}, tanh, d_tanh, true, NULL, NULL},
    {"sr_relu", {.name = "ReluBackward0", .apply = unary_apply}, relu_f, d_relu, true, relu_row, relu_grad_row},
    {"sr_sigmoid", {.name = "SigmoidBackward0", .apply = unary_apply}, sigmoid_f, d_sigmoid, true, NULL, NULL},
    {"sr_sqrt", {.name = "SqrtBackward0", .apply = unary_apply}, sqrt, d_sqrt, true, NULL, NULL},
};
enum { U_EXP, U_LOG, U_SIN, U_COS, U_TANH, U_RELU, U_SIGMOID, U_SQRT };

struct unary_node {
    sr_node base;
    const struct unary_def *def;
};

static double forward_elem(const double *x, const void *arg)
{
    return ((const struct unary_def *)arg)->f(x[0]);
}

static double backward_elem(const double *x, const void *arg)
{
    return ((const struct unary_def *)arg)->df(x[0], x[1]);
}

/* A new tensor of in[0]'s dtype and shape = row(in[0..nin)), all of one
 * shape and dtype (the typed path), through the strided loop. */
static sr_tensor *map_fast(const char *fn, sr_tensor *const *in, int nin, sr_inner_fn row)
{
    sr_tensor *out = sr__tensor_new(fn, in[0]->dtype, in[0]->ndim, in[0]->shape);
    if (!out)
        return NULL;
    const sr_tensor *ops[3] = {out, in[0], nin > 1 ? in[1] : NULL};
    sr_dtype dt = out->dtype;
    struct sr_loop L;
    sr__loop_init(&L, out->ndim, out->shape, nin + 1, 1, ops);
    sr__loop_run(&L, row, &dt);
    sr__loop_done(&L);
    return out;
}

static int unary_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    const struct unary_def *def = ((struct unary_node *)node)->def;
    sr_tensor *v;
    int rc = sr__node_saved(node, 0, &v);
    if (rc)
        return rc;
    sr_tensor *gv[2] = {in[0], v};
    if (def->fast_df && in[0]->dtype == v->dtype && sr__same_shape(in[0], v))
        out[0] = map_fast(def->ops.name, gv, 2, def->fast_df);
    else
        out[0] = sr__map(def->ops.name, gv, 2, backward_elem, def);
    return out[0] ? 0 : -EINVAL;
}

static sr_tensor *unary(int which, sr_tensor *a)
{
    const struct unary_def *def = &defs[which];
    if (!a || sr__check_float(def->fn, a))
        return NULL;
    bool pinned = !def->use_output && sr__pin_saved(&a, 1); /* saves what it reads */
    sr_tensor *out = def->fast_f ? map_fast(def->fn, &a, 1, def->fast_f) : sr__map(def->fn, &a, 1, forward_elem, def);
    if (out && sr__any_requires_grad(&a, 1)) {
        struct unary_node *n = (struct unary_node *)sr__node_for_inputs(&def->ops, sizeof(*n), &a, 1, 1, 1);
        if (n) {
            n->def = def;
            sr__node_save(&n->base, 0, def->use_output ? out : a);
        }
        out = sr__attach(out, (sr_node *)n);
    }
    sr__unpin_saved(pinned, &a, 1);
    return out;
}

SR_API sr_tensor *sr_exp(sr_tensor *a)
{
    SR_OP_SPAN("exp");
    return unary(U_EXP, a);
}
SR_API sr_tensor *sr_log(sr_tensor *a)
{
    SR_OP_SPAN("log");
    return unary(U_LOG, a);
}
SR_API sr_tensor *sr_sin(sr_tensor *a)
{
    SR_OP_SPAN("sin");
    return unary(U_SIN, a);
}
SR_API sr_tensor *sr_cos(sr_tensor *a)
{
    SR_OP_SPAN("cos");
    return unary(U_COS, a);
}
SR_API sr_tensor *sr_tanh(sr_tensor *a)
{
    SR_OP_SPAN("tanh");
    return unary(U_TANH, a);
}
SR_API sr_tensor *sr_relu(sr_tensor *a)
{
    SR_OP_SPAN("relu");
    return unary(U_RELU, a);
}
SR_API sr_tensor *sr_sigmoid(sr_tensor *a)
{
    SR_OP_SPAN("sigmoid");
    return unary(U_SIGMOID, a);
}
SR_API sr_tensor *sr_sqrt(sr_tensor *a)
{
    SR_OP_SPAN("sqrt");
    return unary(U_SQRT, a);
}
