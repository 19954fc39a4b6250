/* Unary maths with backward: exp, log, sin, cos, tanh, relu, sigmoid, sqrt.
 * Each op is a row of a table: the forward function and the derivative in
 * terms of the incoming gradient and either the input or the output,
 * whichever the op saves. */
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

static int unary_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out);

static const struct unary_def defs[] = {
    {"sr_exp", {.name = "ExpBackward0", .apply = unary_apply}, exp, d_exp, true},
    {"sr_log", {.name = "LogBackward0", .apply = unary_apply}, log, d_log, false},
    {"sr_sin", {.name = "SinBackward0", .apply = unary_apply}, sin, d_sin, false},
    {"sr_cos", {.name = "CosBackward0", .apply = unary_apply}, cos, d_cos, false},
    {"sr_tanh", {.name = "TanhBackward0", .apply = unary_apply}, tanh, d_tanh, true},
    {"sr_relu", {.name = "ReluBackward0", .apply = unary_apply}, relu_f, d_relu, true},
    {"sr_sigmoid", {.name = "SigmoidBackward0", .apply = unary_apply}, sigmoid_f, d_sigmoid, true},
    {"sr_sqrt", {.name = "SqrtBackward0", .apply = unary_apply}, sqrt, d_sqrt, true},
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

static int unary_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    const struct unary_def *def = ((struct unary_node *)node)->def;
    sr_tensor *v;
    int rc = sr__node_saved(node, 0, &v);
    if (rc)
        return rc;
    out[0] = sr__map(def->ops.name, (sr_tensor *[]){in[0], v}, 2, backward_elem, def);
    return out[0] ? 0 : -EINVAL;
}

static sr_tensor *unary(int which, sr_tensor *a)
{
    const struct unary_def *def = &defs[which];
    if (!a || sr__check_float(def->fn, a))
        return NULL;
    bool pinned = !def->use_output && sr__pin_saved(&a, 1); /* saves what it reads */
    sr_tensor *out = sr__map(def->fn, &a, 1, forward_elem, def);
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

SR_API sr_tensor *sr_exp(sr_tensor *a) { return unary(U_EXP, a); }
SR_API sr_tensor *sr_log(sr_tensor *a) { return unary(U_LOG, a); }
SR_API sr_tensor *sr_sin(sr_tensor *a) { return unary(U_SIN, a); }
SR_API sr_tensor *sr_cos(sr_tensor *a) { return unary(U_COS, a); }
SR_API sr_tensor *sr_tanh(sr_tensor *a) { return unary(U_TANH, a); }
SR_API sr_tensor *sr_relu(sr_tensor *a) { return unary(U_RELU, a); }
SR_API sr_tensor *sr_sigmoid(sr_tensor *a) { return unary(U_SIGMOID, a); }
SR_API sr_tensor *sr_sqrt(sr_tensor *a) { return unary(U_SQRT, a); }
