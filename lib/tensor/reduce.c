/* SPDX-License-Identifier: MIT */
/* Sums and means. One kernel reduces a tensor into any shape it broadcasts
 * from (sr__sum_to): sum over all dims, over one dim, and the gradient of a
 * broadcast input are all that. Floating sums accumulate in double, i64 sums
 * in int64. */
#include <errno.h>
#include <string.h>

#include "autograd/engine.h"
#include "error.h"
#include "kernels.h"
#include "tensor_impl.h"

#define CHUNK 256

static void sum_row_f64(char **p, const int64_t *s, int64_t n, void *vctx)
{
    sr_dtype dt = *(const sr_dtype *)vctx;
    double buf[CHUNK];
    for (int64_t k0 = 0; k0 < n; k0 += CHUNK) {
        int64_t m = n - k0 < CHUNK ? n - k0 : CHUNK;
        sr__load_f64(buf, p[1] + k0 * s[1], s[1], m, dt);
        if (s[0] == 0) {
            double acc = 0.0;
            for (int64_t k = 0; k < m; k++)
                acc += buf[k];
            *(double *)p[0] += acc;
        } else {
            for (int64_t k = 0; k < m; k++)
                *(double *)(p[0] + (k0 + k) * s[0]) += buf[k];
        }
    }
}

static void sum_row_i64(char **p, const int64_t *s, int64_t n, void *vctx)
{
    (void)vctx;
    for (int64_t k = 0; k < n; k++) { /* unsigned: wrap-around like PyTorch, without UB */
        int64_t *acc = (int64_t *)(p[0] + k * s[0]);
        *acc = (int64_t)((uint64_t)*acc + (uint64_t)*(const int64_t *)(p[1] + k * s[1]));
    }
}

/* A new tensor of t's dtype and `shape` (which broadcasts to t's shape),
 * holding the sums of t over the broadcast dims. */
static sr_tensor *reduce_to(const char *fn, const sr_tensor *t, int nd, const int64_t *shape)
{
    sr_dtype acc_dt = t->dtype == SR_I64 ? SR_I64 : SR_F64;
    sr_tensor *acc = sr__tensor_new(fn, acc_dt, nd, shape);
    if (!acc)
        return NULL;
    memset(sr__tensor_ptr(acc), 0, (size_t)sr__numel(nd, shape) * 8);
    const sr_tensor *ops[2] = {acc, t};
    struct sr_loop L;
    sr__loop_init(&L, t->ndim, t->shape, 2, 1, ops);
    sr_dtype dt = t->dtype;
    sr__loop_run(&L, acc_dt == SR_I64 ? sum_row_i64 : sum_row_f64, &dt);
    sr__loop_done(&L);
    if (t->dtype == acc_dt)
        return acc;
    sr_tensor *out = sr__tensor_new(fn, t->dtype, nd, shape);
    if (out)
        sr__copy_raw(out, acc);
    sr_tensor_unref(acc);
    return out;
}

sr_tensor *sr__sum_to(sr_tensor *g, int ndim, const int64_t *shape)
{
    if (g->ndim == ndim && !memcmp(g->shape, shape, (size_t)ndim * sizeof(int64_t)))
        return sr_tensor_ref(g);
    bool ok = ndim <= g->ndim;
    for (int i = 0; ok && i < ndim; i++) {
        int64_t have = g->shape[g->ndim - ndim + i];
        ok = shape[i] == have || shape[i] == 1;
    }
    if (!ok) { /* a backward function produced a gradient of the wrong shape */
        char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
        sr__fail(-EINVAL, "sr_backward", "a gradient of shape %s cannot be summed to %s",
                 sr__shape_str(g->ndim, g->shape, b1), sr__shape_str(ndim, shape, b2));
        return NULL;
    }
    return reduce_to("sr__sum_to", g, ndim, shape);
}

struct reduce_node {
    sr_node base;
    int nd;
    int64_t shape[SR_MAX_DIMS]; /* the input's */
    int dim;                    /* -1: all dims */
    bool keepdim;
    double divisor;             /* 1 for sums, the count for means */
};

/* The gradient of a sum or mean: g (unsqueezed back) expanded to the input. */
static int reduce_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct reduce_node *n = (struct reduce_node *)node;
    sr_tensor *g = n->divisor == 1.0 ? sr_tensor_ref(in[0]) : sr_div_scalar(in[0], n->divisor);
    if (g && n->dim >= 0 && !n->keepdim && n->nd > 0) {
        sr_tensor *u = sr_unsqueeze(g, n->dim);
        sr_tensor_unref(g);
        g = u;
    }
    if (g && n->dim < 0 && g->ndim != 0) { /* a scalar result may arrive as any one-element shape */
        sr_tensor *r = sr_reshape(g, 0, NULL);
        sr_tensor_unref(g);
        g = r;
    }
    out[0] = g ? sr_expand(g, n->nd, n->shape) : NULL;
    sr_tensor_unref(g);
    return out[0] ? 0 : -EINVAL;
}

static const sr_node_ops sum_ops = {.name = "SumBackward0", .apply = reduce_apply};
static const sr_node_ops sum_dim_ops = {.name = "SumBackward1", .apply = reduce_apply};
static const sr_node_ops mean_ops = {.name = "MeanBackward0", .apply = reduce_apply};
static const sr_node_ops mean_dim_ops = {.name = "MeanBackward1", .apply = reduce_apply};

static sr_tensor *record(sr_tensor *out, const sr_node_ops *ops, sr_tensor *a, int dim, bool keepdim,
                         double divisor)
{
    if (!out || !sr__any_requires_grad(&a, 1))
        return out;
    struct reduce_node *n = (struct reduce_node *)sr__node_for_inputs(ops, sizeof(*n), &a, 1, 1, 0);
    if (n) {
        n->nd = a->ndim;
        memcpy(n->shape, a->shape, sizeof(n->shape));
        n->dim = dim;
        n->keepdim = keepdim;
        n->divisor = divisor;
    }
    return sr__attach(out, (sr_node *)n);
}

/* Sum over dim (-1 with all=true: every dim) with the result's final shape. */
static sr_tensor *sum_forward(const char *fn, sr_tensor *a, int dim, bool all, bool keepdim)
{
    int64_t shape[SR_MAX_DIMS] = {0};
    if (all)
        return reduce_to(fn, a, 0, shape);
    memcpy(shape, a->shape, sizeof(shape));
    if (a->ndim > 0)
        shape[dim] = 1;
    sr_tensor *out = reduce_to(fn, a, a->ndim, shape);
    if (!out || keepdim || a->ndim == 0)
        return out;
    for (int d = dim; d + 1 < a->ndim; d++)
        shape[d] = a->shape[d + 1];
    int64_t strides[SR_MAX_DIMS];
    sr__contiguous_strides(a->ndim - 1, shape, strides);
    sr_tensor *v = sr__tensor_alias(out, a->ndim - 1, shape, strides, out->offset);
    sr_tensor_unref(out);
    return v;
}

SR_API sr_tensor *sr_sum(sr_tensor *a)
{
    SR_OP_SPAN("sum");
    if (!a)
        return NULL;
    return record(sum_forward("sr_sum", a, -1, true, false), &sum_ops, a, -1, false, 1.0);
}

SR_API sr_tensor *sr_sum_dim(sr_tensor *a, int dim, bool keepdim)
{
    SR_OP_SPAN("sum_dim");
    int d = a ? sr__wrap_dim("sr_sum_dim", dim, a->ndim) : -1;
    if (d < 0)
        return NULL;
    return record(sum_forward("sr_sum_dim", a, d, false, keepdim), &sum_dim_ops, a, d, keepdim, 1.0);
}

/* t (fresh and private) divided in place by count. */
static sr_tensor *divided(sr_tensor *t, double count)
{
    if (!t)
        return NULL;
    sr_tensor *c = sr_scalar_tensor(t->dtype, count, 0);
    if (!c) {
        sr_tensor_unref(t);
        return NULL;
    }
    sr__binary_into(t, t, c, SR_BIN_DIV, 1.0);
    sr_tensor_unref(c);
    return t;
}

SR_API sr_tensor *sr_mean(sr_tensor *a)
{
    SR_OP_SPAN("mean");
    if (!a || sr__check_float("sr_mean", a))
        return NULL;
    double count = (double)sr__numel(a->ndim, a->shape);
    sr_tensor *out = divided(sum_forward("sr_mean", a, -1, true, false), count);
    return record(out, &mean_ops, a, -1, false, count);
}

SR_API sr_tensor *sr_mean_dim(sr_tensor *a, int dim, bool keepdim)
{
    SR_OP_SPAN("mean_dim");
    int d = a && !sr__check_float("sr_mean_dim", a) ? sr__wrap_dim("sr_mean_dim", dim, a->ndim) : -1;
    if (d < 0)
        return NULL;
    double count = (double)(a->ndim ? a->shape[d] : 1);
    sr_tensor *out = divided(sum_forward("sr_mean_dim", a, d, false, keepdim), count);
    return record(out, &mean_dim_ops, a, d, keepdim, count);
}
