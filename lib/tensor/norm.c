/* SPDX-License-Identifier: MIT */
/* layer_norm with its backward, one pass per row in the tensor's dtype
 * (sums in double). It normalises each sample over its trailing dims alone,
 * so a sample's output does not depend on the others in its batch: a batch
 * split into micro-batches gives the same outputs and the same summed
 * gradients (docs/TENSORS.md, "Convolution layers").
 *
 * Rows: x viewed as [M, D], D the normalized shape's size. Forward keeps
 * each row's mean and rstd = 1 / sqrt(var + eps) (biased variance). With
 * xhat = (x - mean) rstd and dxhat = dy * weight (dy without a weight):
 *   dx      = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))   per row
 *   dweight = sum over rows of dy xhat,   dbias = sum over rows of dy. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/engine.h"
#include "error.h"
#include "tensor_impl.h"

static int check_norm(const sr_tensor *x, int nd, const int64_t *shape, const sr_tensor *w, const sr_tensor *b)
{
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR], b3[SR_SHAPE_STR];
    if (sr__check_float("sr_layer_norm", x))
        return -EINVAL;
    bool ok = shape && nd >= 1 && nd <= x->ndim &&
              !memcmp(x->shape + x->ndim - nd, shape, (size_t)nd * sizeof(int64_t));
    if (!ok)
        return sr__fail(-EINVAL, "sr_layer_norm", "input %s does not end in the normalized shape %s",
                        sr__shape_str(x->ndim, x->shape, b1), shape && nd >= 1 && nd <= SR_MAX_DIMS ?
                        sr__shape_str(nd, shape, b2) : "(none)");
    const sr_tensor *p[2] = {w, b};
    for (int i = 0; i < 2; i++) {
        if (!p[i])
            continue;
        if (p[i]->ndim != nd || memcmp(p[i]->shape, shape, (size_t)nd * sizeof(int64_t)))
            return sr__fail(-EINVAL, "sr_layer_norm", "%s %s must have the normalized shape %s",
                            i ? "bias" : "weight", sr__shape_str(p[i]->ndim, p[i]->shape, b3),
                            sr__shape_str(nd, shape, b2));
        if (sr__check_same_dtype("sr_layer_norm", x, p[i]))
            return -EINVAL;
    }
    return 0;
}

struct ln_rows {
    int64_t m, d;
};

/* Row sums run in 8 independent partial sums (so they vectorise and do not
 * wait on one another); loop-invariant choices (weight or not) are made
 * outside the loops. */
#define DEFINE_LN(T, SUFFIX)                                                                                   \
    /* sum over n of x[j] - shift, or of its square: a row's sum, or its squared deviations */          \
    static double row_dot_##SUFFIX(const T *x, double shift, bool square, int64_t n)                           \
    {                                                                                                          \
        double part[8] = {0};                                                                                  \
        int64_t j = 0;                                                                                         \
        for (; j + 8 <= n; j += 8)                                                                             \
            for (int k = 0; k < 8; k++) {                                                                      \
                double v = (double)x[j + k] - shift;                                                           \
                part[k] += square ? v * v : v;                                                                 \
            }                                                                                                  \
        double s = 0.0;                                                                                        \
        for (int k = 0; k < 8; k++)                                                                            \
            s += part[k];                                                                                      \
        for (; j < n; j++) {                                                                                   \
            double v = (double)x[j] - shift;                                                                   \
            s += square ? v * v : v;                                                                           \
        }                                                                                                      \
        return s;                                                                                              \
    }                                                                                                          \
    /* y = xhat * w + b per row; stats[2 i] = mean, stats[2 i + 1] = rstd. */                                 \
    static void ln_fwd_##SUFFIX(struct ln_rows r, double eps, const T *x, const T *w, const T *b, T *y,        \
                                double *stats)                                                                 \
    {                                                                                                          \
        for (int64_t i = 0; i < r.m; i++, x += r.d, y += r.d) {                                                \
            double mean = row_dot_##SUFFIX(x, 0.0, false, r.d) / (double)r.d;                                  \
            double rstd = 1.0 / sqrt(row_dot_##SUFFIX(x, mean, true, r.d) / (double)r.d + eps);                \
            stats[2 * i] = mean;                                                                               \
            stats[2 * i + 1] = rstd;                                                                           \
            if (w && b)                                                                                        \
                for (int64_t j = 0; j < r.d; j++)                                                              \
                    y[j] = (T)(((double)x[j] - mean) * rstd * w[j] + b[j]);                                    \
            else if (w)                                                                                        \
                for (int64_t j = 0; j < r.d; j++)                                                              \
                    y[j] = (T)(((double)x[j] - mean) * rstd * w[j]);                                           \
            else                                                                                               \
                for (int64_t j = 0; j < r.d; j++)                                                              \
                    y[j] = (T)(((double)x[j] - mean) * rstd + (b ? (double)b[j] : 0.0));                       \
        }                                                                                                      \
    }                                                                                                          \
    /* g = dy * w (dy without w) into gbuf; returns mean(g) and *c = mean(g xhat). */                        \
    static double ln_row_means_##SUFFIX(struct ln_rows r, const T *x, const T *w, const T *dy, double mean,    \
                                        double rstd, double *gbuf, double *c)                                  \
    {                                                                                                          \
        double pa[8] = {0}, pc[8] = {0}, a = 0.0, cc = 0.0;                                                    \
        for (int64_t j = 0; j < r.d; j++)                                                                      \
            gbuf[j] = w ? (double)dy[j] * w[j] : (double)dy[j];                                                \
        int64_t j = 0;                                                                                         \
        for (; j + 8 <= r.d; j += 8)                                                                           \
            for (int k = 0; k < 8; k++) {                                                                      \
                pa[k] += gbuf[j + k];                                                                          \
                pc[k] += gbuf[j + k] * (((double)x[j + k] - mean) * rstd);                                     \
            }                                                                                                  \
        for (int k = 0; k < 8; k++)                                                                            \
            a += pa[k], cc += pc[k];                                                                           \
        for (; j < r.d; j++) {                                                                                 \
            a += gbuf[j];                                                                                      \
            cc += gbuf[j] * (((double)x[j] - mean) * rstd);                                                    \
        }                                                                                                      \
        *c = cc / (double)r.d;                                                                                 \
        return a / (double)r.d;                                                                                \
    }                                                                                                          \
    /* dx (if not NULL) per row; dw, db (if not NULL, zeroed) summed in double. gbuf: r.d doubles. */        \
    static void ln_bwd_##SUFFIX(struct ln_rows r, const T *x, const T *w, const T *dy, const double *stats,   \
                                T *dx, double *dw, double *db, double *gbuf)                                   \
    {                                                                                                          \
        for (int64_t i = 0; i < r.m; i++, x += r.d, dy += r.d) {                                               \
            double mean = stats[2 * i], rstd = stats[2 * i + 1], c;                                            \
            for (int64_t j = 0; dw && j < r.d; j++)                                                            \
                dw[j] += (double)dy[j] * (((double)x[j] - mean) * rstd);                                       \
            for (int64_t j = 0; db && j < r.d; j++)                                                            \
                db[j] += dy[j];                                                                                \
            if (!dx)                                                                                           \
                continue;                                                                                      \
            double a = ln_row_means_##SUFFIX(r, x, w, dy, mean, rstd, gbuf, &c);                               \
            for (int64_t j = 0; j < r.d; j++)                                                                  \
                dx[i * r.d + j] = (T)(rstd * (gbuf[j] - a - (((double)x[j] - mean) * rstd) * c));              \
        }                                                                                                      \
    }
DEFINE_LN(float, f32)
DEFINE_LN(double, f64)

struct ln_node {
    sr_node base;
    struct ln_rows r;
    int nd;                     /* the normalized shape: weight's and bias's */
    int64_t shape[SR_MAX_DIMS];
};

/* Contiguous tensors to read (new references, pinned); NULL entries stay NULL. */
static int open_inputs(sr_tensor *const *in, sr_tensor **c, const char **p, int n)
{
    int rc = 0;
    for (int i = 0; i < n; i++) {
        c[i] = in[i] && !rc ? sr_contiguous(in[i]) : NULL;
        p[i] = c[i] ? sr__tensor_pin(c[i]) : NULL;
        rc = in[i] && !c[i] ? -ENOMEM : rc;
    }
    return rc;
}

static void close_inputs(sr_tensor **c, int n)
{
    for (int i = 0; i < n; i++)
        if (c[i]) {
            sr__tensor_unpin(c[i]);
            sr_tensor_unref(c[i]);
        }
}

/* A new tensor of the normalized shape from the double sums. */
static sr_tensor *param_grad(const struct ln_node *n, sr_dtype dt, const double *acc)
{
    sr_tensor *t = sr__tensor_new("sr_layer_norm", dt, n->nd, n->shape);
    if (t)
        sr__store_f64(sr__tensor_new_data(t), (int64_t)sr_dtype_size(t->dtype), acc,
                      (int64_t)sr_tensor_numel(t), t->dtype);
    return t;
}

static int ln_grads(struct ln_node *n, sr_tensor *const *saved, const char *const *p, sr_tensor **out)
{
    struct ln_rows r = n->r;
    bool need[3] = {sr__node_needs_grad(&n->base, 0), sr__node_needs_grad(&n->base, 1),
                    sr__node_needs_grad(&n->base, 2)};
    double *acc = calloc(3 * (size_t)r.d + 1, sizeof(double)); /* dw, db, one row of g */
    sr_tensor *dx = need[0] ? sr__tensor_new("sr_layer_norm", saved[0]->dtype, saved[0]->ndim, saved[0]->shape) : NULL;
    if (!acc || (need[0] && !dx)) {
        free(acc);
        sr_tensor_unref(dx);
        return -ENOMEM;
    }
    const double *stats = (const double *)p[2];
    double *dw = need[1] ? acc : NULL, *db = need[2] ? acc + r.d : NULL;
    if (saved[0]->dtype == SR_F64)
        ln_bwd_f64(r, (const double *)p[0], (const double *)p[1], (const double *)p[3], stats,
                   dx ? (double *)sr__tensor_new_data(dx) : NULL, dw, db, acc + 2 * r.d);
    else
        ln_bwd_f32(r, (const float *)p[0], (const float *)p[1], (const float *)p[3], stats,
                   dx ? (float *)sr__tensor_new_data(dx) : NULL, dw, db, acc + 2 * r.d);
    out[0] = dx;
    out[1] = dw ? param_grad(n, saved[0]->dtype, dw) : NULL;
    out[2] = db ? param_grad(n, saved[0]->dtype, db) : NULL;
    free(acc);
    return (dw && !out[1]) || (db && !out[2]) ? -ENOMEM : 0;
}

/* saved: 0 x, 1 weight (or none), 2 stats [M, 2] f64. */
static int ln_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    sr_tensor *saved[3] = {NULL};
    int rc = 0;
    for (uint32_t i = 0; !rc && i < 3; i++)
        rc = sr__node_saved(node, i, &saved[i]);
    if (rc)
        return rc;
    sr_tensor *c[4] = {NULL}, *src[4] = {saved[0], saved[1], saved[2], in[0]};
    const char *p[4];
    rc = open_inputs(src, c, p, 4);
    if (!rc)
        rc = ln_grads((struct ln_node *)node, saved, p, out);
    close_inputs(c, 4);
    return rc;
}

static const sr_node_ops ln_ops = {.name = "NativeLayerNormBackward0", .apply = ln_apply};

static sr_tensor *ln_forward(sr_tensor *x, struct ln_rows r, sr_tensor *w, sr_tensor *b, double eps,
                             sr_tensor **stats)
{
    sr_tensor *out = sr__tensor_new("sr_layer_norm", x->dtype, x->ndim, x->shape);
    *stats = out ? sr__tensor_new("sr_layer_norm", SR_F64, 2, (const int64_t[]){r.m, 2}) : NULL;
    sr_tensor *c[3] = {NULL}, *src[3] = {x, w, b};
    const char *p[3];
    if (!*stats || open_inputs(src, c, p, 3)) {
        close_inputs(c, 3);
        sr_tensor_unref(out);
        sr_tensor_unref(*stats);
        return *stats = NULL;
    }
    double *st = (double *)sr__tensor_new_data(*stats);
    if (x->dtype == SR_F64)
        ln_fwd_f64(r, eps, (const double *)p[0], (const double *)p[1], (const double *)p[2],
                   (double *)sr__tensor_new_data(out), st);
    else
        ln_fwd_f32(r, eps, (const float *)p[0], (const float *)p[1], (const float *)p[2],
                   (float *)sr__tensor_new_data(out), st);
    close_inputs(c, 3);
    return out;
}

SR_API sr_tensor *sr_layer_norm(sr_tensor *x, int ndim, const int64_t *normalized_shape, sr_tensor *weight,
                                sr_tensor *bias, double eps)
{
    SR_OP_SPAN("layer_norm");
    if (!x || check_norm(x, ndim, normalized_shape, weight, bias))
        return NULL;
    struct ln_rows r = {.d = sr__numel(ndim, normalized_shape)};
    r.m = r.d ? sr__numel(x->ndim, x->shape) / r.d : 0;
    sr_tensor *in[3] = {x, weight, bias}, *stats;
    bool pinned = sr__pin_saved(in, 3); /* saves what it reads */
    sr_tensor *out = ln_forward(x, r, weight, bias, eps, &stats);
    if (out && sr__any_requires_grad(in, 3)) {
        struct ln_node *n = (struct ln_node *)sr__node_for_inputs(&ln_ops, sizeof(*n), in, 3, 1, 3);
        if (n) {
            n->r = r;
            n->nd = ndim;
            memcpy(n->shape, normalized_shape, (size_t)ndim * sizeof(int64_t));
            sr__node_save(&n->base, 0, x);
            sr__node_save(&n->base, 1, weight);
            sr__node_save(&n->base, 2, stats);
        }
        out = sr__attach(out, (sr_node *)n);
    }
    sr_tensor_unref(stats);
    sr__unpin_saved(pinned, in, 3);
    return out;
}
