/* SPDX-License-Identifier: MIT */
/* add, sub, mul, div, pow, neg (tensor-tensor with broadcasting, and
 * tensor-scalar), each with its backward. A broadcast input's gradient is
 * summed back to the input's shape (sr__sum_to). */
#include <errno.h>
#include <math.h>

#include "autograd/engine.h"
#include "error.h"
#include "kernels.h"
#include "tensor_impl.h"

struct bin_node {
    sr_node base;
    int nd[2];
    int64_t shape[2][SR_MAX_DIMS];
    double alpha; /* add/sub: b's factor; scalar ops: the scalar */
};

static void keep_shapes(struct bin_node *n, const sr_tensor *a, const sr_tensor *b)
{
    const sr_tensor *in[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        if (!in[i])
            continue;
        n->nd[i] = in[i]->ndim;
        for (int d = 0; d < in[i]->ndim; d++)
            n->shape[i][d] = in[i]->shape[d];
    }
}

/* out[i] := sum_to(g, input i's shape), owning g; -errno if it failed. */
static int grad_to(struct bin_node *n, int i, sr_tensor *g, sr_tensor **out)
{
    if (!g)
        return -EINVAL;
    out[i] = sr__sum_to(g, n->nd[i], n->shape[i]);
    sr_tensor_unref(g);
    return out[i] ? 0 : -EINVAL;
}

static int add_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct bin_node *n = (struct bin_node *)node;
    int rc = 0;
    if (sr__node_needs_grad(node, 0))
        rc = grad_to(n, 0, sr_tensor_ref(in[0]), out);
    if (!rc && sr__node_needs_grad(node, 1))
        rc = grad_to(n, 1, n->alpha == 1.0 ? sr_tensor_ref(in[0]) : sr_mul_scalar(in[0], n->alpha), out);
    return rc;
}

static int mul_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct bin_node *n = (struct bin_node *)node;
    sr_tensor *a = NULL, *b = NULL;
    int rc = 0;
    if (sr__node_needs_grad(node, 0) && !(rc = sr__node_saved(node, 1, &b)))
        rc = grad_to(n, 0, sr_mul(in[0], b), out);
    if (!rc && sr__node_needs_grad(node, 1) && !(rc = sr__node_saved(node, 0, &a)))
        rc = grad_to(n, 1, sr_mul(in[0], a), out);
    return rc;
}

static double div_grad_b(const double *x, const void *arg)
{
    (void)arg; /* x = {g, a, b} */
    return -x[0] * x[1] / (x[2] * x[2]);
}

static int div_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct bin_node *n = (struct bin_node *)node;
    sr_tensor *a = NULL, *b = NULL;
    int rc = sr__node_saved(node, 0, &a);
    if (!rc)
        rc = sr__node_saved(node, 1, &b);
    if (!rc && sr__node_needs_grad(node, 0))
        rc = grad_to(n, 0, sr_div(in[0], b), out);
    if (!rc && sr__node_needs_grad(node, 1))
        rc = grad_to(n, 1, sr__map("DivBackward0", (sr_tensor *[]){in[0], a, b}, 3, div_grad_b, NULL), out);
    return rc;
}

static double pow_grad_a(const double *x, const void *arg)
{
    (void)arg; /* x = {g, a, b}: d(a^b)/da = b a^(b-1) */
    return x[2] == 0.0 ? 0.0 : x[0] * x[2] * pow(x[1], x[2] - 1.0);
}

static double pow_grad_b(const double *x, const void *arg)
{
    (void)arg; /* d(a^b)/db = a^b log a, taken as 0 where a == 0 and b >= 0 (PyTorch) */
    return x[1] == 0.0 && x[2] >= 0.0 ? 0.0 : x[0] * pow(x[1], x[2]) * log(x[1]);
}

static int pow_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct bin_node *n = (struct bin_node *)node;
    sr_tensor *a = NULL, *b = NULL;
    int rc = sr__node_saved(node, 0, &a);
    if (!rc)
        rc = sr__node_saved(node, 1, &b);
    sr_tensor *args[3] = {in[0], a, b};
    if (!rc && sr__node_needs_grad(node, 0))
        rc = grad_to(n, 0, sr__map("PowBackward1", args, 3, pow_grad_a, NULL), out);
    if (!rc && sr__node_needs_grad(node, 1))
        rc = grad_to(n, 1, sr__map("PowBackward1", args, 3, pow_grad_b, NULL), out);
    return rc;
}

static const sr_node_ops add_ops = {.name = "AddBackward0", .apply = add_apply};
static const sr_node_ops sub_ops = {.name = "SubBackward0", .apply = add_apply};
static const sr_node_ops mul_ops = {.name = "MulBackward0", .apply = mul_apply};
static const sr_node_ops div_ops = {.name = "DivBackward0", .apply = div_apply};
static const sr_node_ops pow_ops = {.name = "PowBackward1", .apply = pow_apply};

/* Checks and the broadcast output; NULL (error set) if a or b is NULL or mismatched. */
static sr_tensor *binary_out(const char *fn, const sr_tensor *a, const sr_tensor *b, bool float_only)
{
    if (!a || !b)
        return NULL;
    if (sr__check_same_dtype(fn, a, b) || (float_only && sr__check_float(fn, a)))
        return NULL;
    int nd;
    int64_t shape[SR_MAX_DIMS];
    if (sr__broadcast_shapes(fn, a->ndim, a->shape, b->ndim, b->shape, &nd, shape))
        return NULL;
    return sr__tensor_new(fn, a->dtype, nd, shape);
}

/* Record a binary node saving {a, b} when save is set. */
static sr_tensor *record_binary(sr_tensor *out, const sr_node_ops *ops, sr_tensor *a, sr_tensor *b, double alpha,
                                bool save)
{
    sr_tensor *in[2] = {a, b};
    if (!out || !sr__any_requires_grad(in, 2))
        return out;
    struct bin_node *n = (struct bin_node *)sr__node_for_inputs(ops, sizeof(*n), in, 2, 1, 2);
    if (n) {
        keep_shapes(n, a, b);
        n->alpha = alpha;
        if (save) {
            sr__node_save(&n->base, 0, a);
            sr__node_save(&n->base, 1, b);
        }
    }
    return sr__attach(out, (sr_node *)n);
}

static sr_tensor *add_like(const char *fn, const sr_node_ops *ops, sr_tensor *a, sr_tensor *b, double alpha)
{
    sr_tensor *out = binary_out(fn, a, b, false);
    if (out)
        sr__binary_into(out, a, b, SR_BIN_ADD, alpha);
    return record_binary(out, ops, a, b, alpha, false);
}

SR_API sr_tensor *sr_add(sr_tensor *a, sr_tensor *b)
{
    SR_OP_SPAN("add");
    return add_like("sr_add", &add_ops, a, b, 1.0);
}
SR_API sr_tensor *sr_sub(sr_tensor *a, sr_tensor *b)
{
    SR_OP_SPAN("sub");
    return add_like("sr_sub", &sub_ops, a, b, -1.0);
}

SR_API sr_tensor *sr_mul(sr_tensor *a, sr_tensor *b)
{
    SR_OP_SPAN("mul");
    sr_tensor *in[2] = {a, b};
    bool pinned = sr__pin_saved(in, 2); /* saves what it reads */
    sr_tensor *out = binary_out("sr_mul", a, b, false);
    if (out)
        sr__binary_into(out, a, b, SR_BIN_MUL, 1.0);
    out = record_binary(out, &mul_ops, a, b, 1.0, true);
    sr__unpin_saved(pinned, in, 2);
    return out;
}

SR_API sr_tensor *sr_div(sr_tensor *a, sr_tensor *b)
{
    SR_OP_SPAN("div");
    sr_tensor *in[2] = {a, b};
    bool pinned = sr__pin_saved(in, 2); /* saves what it reads */
    sr_tensor *out = binary_out("sr_div", a, b, true);
    if (out)
        sr__binary_into(out, a, b, SR_BIN_DIV, 1.0);
    out = record_binary(out, &div_ops, a, b, 1.0, true);
    sr__unpin_saved(pinned, in, 2);
    return out;
}

static double pow_fn(const double *x, const void *arg)
{
    (void)arg;
    return pow(x[0], x[1]);
}

SR_API sr_tensor *sr_pow(sr_tensor *a, sr_tensor *b)
{
    SR_OP_SPAN("pow");
    sr_tensor *in[2] = {a, b};
    bool pinned = sr__pin_saved(in, 2); /* saves what it reads */
    sr_tensor *out = binary_out("sr_pow", a, b, true);
    if (out)
        sr__map_into(out, (sr_tensor *[]){a, b}, 2, pow_fn, NULL);
    out = record_binary(out, &pow_ops, a, b, 1.0, true);
    sr__unpin_saved(pinned, in, 2);
    return out;
}

/* ---- tensor-scalar ---- */

static int scalar_add_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    (void)node;
    out[0] = sr_tensor_ref(in[0]);
    return 0;
}

static int scalar_mul_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    out[0] = sr_mul_scalar(in[0], ((struct bin_node *)node)->alpha);
    return out[0] ? 0 : -EINVAL;
}

static int scalar_div_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    out[0] = sr_div_scalar(in[0], ((struct bin_node *)node)->alpha);
    return out[0] ? 0 : -EINVAL;
}

static double pow_scalar_grad(const double *x, const void *arg)
{
    double p = *(const double *)arg; /* x = {g, a} */
    return p == 0.0 ? 0.0 : x[0] * p * pow(x[1], p - 1.0);
}

static int pow_scalar_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    sr_tensor *a;
    int rc = sr__node_saved(node, 0, &a);
    if (rc)
        return rc;
    out[0] = sr__map("PowBackward0", (sr_tensor *[]){in[0], a}, 2, pow_scalar_grad, &((struct bin_node *)node)->alpha);
    return out[0] ? 0 : -EINVAL;
}

static const sr_node_ops add_scalar_ops = {.name = "AddBackward1", .apply = scalar_add_apply};
static const sr_node_ops sub_scalar_ops = {.name = "SubBackward1", .apply = scalar_add_apply};
static const sr_node_ops mul_scalar_ops = {.name = "MulBackward1", .apply = scalar_mul_apply};
static const sr_node_ops neg_ops = {.name = "NegBackward0", .apply = scalar_mul_apply};
static const sr_node_ops div_scalar_ops = {.name = "DivBackward1", .apply = scalar_div_apply};
static const sr_node_ops pow_scalar_ops = {.name = "PowBackward0", .apply = pow_scalar_apply};

static sr_tensor *record_scalar(sr_tensor *out, const sr_node_ops *ops, sr_tensor *a, double s, bool save)
{
    if (!out || !sr__any_requires_grad(&a, 1))
        return out;
    struct bin_node *n = (struct bin_node *)sr__node_for_inputs(ops, sizeof(*n), &a, 1, 1, 1);
    if (n) {
        n->alpha = s;
        if (save)
            sr__node_save(&n->base, 0, a);
    }
    return sr__attach(out, (sr_node *)n);
}

/* a op s through a 0-d tensor of a's dtype. */
static sr_tensor *scalar_op(const char *fn, sr_tensor *a, double s, enum sr_binop op, double alpha, bool float_only)
{
    if (!a || (float_only && sr__check_float(fn, a)) || sr__check_scalar(fn, a, s))
        return NULL;
    sr_tensor *b = sr_scalar_tensor(a->dtype, s, 0);
    sr_tensor *out = b ? sr__tensor_new(fn, a->dtype, a->ndim, a->shape) : NULL;
    if (out)
        sr__binary_into(out, a, b, op, alpha);
    sr_tensor_unref(b);
    return out;
}

SR_API sr_tensor *sr_add_scalar(sr_tensor *a, double s)
{
    SR_OP_SPAN("add_scalar");
    return record_scalar(scalar_op("sr_add_scalar", a, s, SR_BIN_ADD, 1.0, false), &add_scalar_ops, a, s, false);
}

SR_API sr_tensor *sr_sub_scalar(sr_tensor *a, double s)
{
    SR_OP_SPAN("sub_scalar");
    return record_scalar(scalar_op("sr_sub_scalar", a, s, SR_BIN_ADD, -1.0, false), &sub_scalar_ops, a, s, false);
}

SR_API sr_tensor *sr_mul_scalar(sr_tensor *a, double s)
{
    SR_OP_SPAN("mul_scalar");
    return record_scalar(scalar_op("sr_mul_scalar", a, s, SR_BIN_MUL, 1.0, false), &mul_scalar_ops, a, s, false);
}

SR_API sr_tensor *sr_neg(sr_tensor *a)
{
    SR_OP_SPAN("neg");
    return record_scalar(scalar_op("sr_neg", a, -1.0, SR_BIN_MUL, 1.0, false), &neg_ops, a, -1.0, false);
}

SR_API sr_tensor *sr_div_scalar(sr_tensor *a, double s)
{
    SR_OP_SPAN("div_scalar");
    return record_scalar(scalar_op("sr_div_scalar", a, s, SR_BIN_DIV, 1.0, true), &div_scalar_ops, a, s, false);
}

SR_API sr_tensor *sr_pow_scalar(sr_tensor *a, double p)
{
    SR_OP_SPAN("pow_scalar");
    if (!a || sr__check_float("sr_pow_scalar", a))
        return NULL;
    bool pinned = sr__pin_saved(&a, 1); /* saves what it reads */
    sr_tensor *out = sr__tensor_new("sr_pow_scalar", a->dtype, a->ndim, a->shape);
    if (out) {
        sr_tensor *b = sr_scalar_tensor(a->dtype, p, 0);
        if (b) {
            sr__map_into(out, (sr_tensor *[]){a, b}, 2, pow_fn, NULL);
            sr_tensor_unref(b);
        } else {
            sr_tensor_unref(out);
            out = NULL;
        }
    }
    out = record_scalar(out, &pow_scalar_ops, a, p, true);
    sr__unpin_saved(pinned, &a, 1);
    return out;
}
