/* SPDX-License-Identifier: MIT */
/* Neural-network functions: log_softmax (and softmax), nll_loss,
 * cross_entropy and mse_loss. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/engine.h"
#include "error.h"
#include "tensor_impl.h"

#define IGNORE_INDEX (-100)

/* out[o, :, i] = x[o, :, i] - logsumexp(x[o, :, i]) over the middle axis (len k). */
static void log_softmax_rows(double *v, int64_t outer, int64_t k, int64_t inner)
{
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            double *p = v + o * k * inner + i, mx = -INFINITY, s = 0.0;
            for (int64_t j = 0; j < k; j++)
                mx = p[j * inner] > mx ? p[j * inner] : mx;
            for (int64_t j = 0; j < k; j++)
                s += exp(p[j * inner] - mx);
            double lse = mx + log(s);
            for (int64_t j = 0; j < k; j++)
                p[j * inner] -= isinf(mx) && mx < 0 ? 0.0 : lse;
        }
    }
}

struct dim_node {
    sr_node base;
    int dim;
};

/* grad_in = g - exp(out) * sum(g, dim, keepdim) */
static int log_softmax_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    sr_tensor *y;
    int rc = sr__node_saved(node, 0, &y);
    if (rc)
        return rc;
    int dim = ((struct dim_node *)node)->dim;
    sr_tensor *s = sr_sum_dim(in[0], dim, true), *e = sr_exp(y);
    sr_tensor *p = s && e ? sr_mul(e, s) : NULL;
    out[0] = p ? sr_sub(in[0], p) : NULL;
    sr_tensor_unref(s);
    sr_tensor_unref(e);
    sr_tensor_unref(p);
    return out[0] ? 0 : -EINVAL;
}

static const sr_node_ops log_softmax_ops = {.name = "LogSoftmaxBackward0", .apply = log_softmax_apply};

SR_API sr_tensor *sr_log_softmax(sr_tensor *a, int dim)
{
    SR_OP_SPAN("log_softmax");
    int d = a && !sr__check_float("sr_log_softmax", a) ? sr__wrap_dim("sr_log_softmax", dim, a->ndim) : -1;
    if (d < 0)
        return NULL;
    int64_t n = sr__numel(a->ndim, a->shape);
    sr_tensor *work = sr__tensor_new("sr_log_softmax", SR_F64, a->ndim, a->shape);
    sr_tensor *out = work ? sr__tensor_new("sr_log_softmax", a->dtype, a->ndim, a->shape) : NULL;
    if (!out) {
        sr_tensor_unref(work);
        return NULL;
    }
    sr__copy_raw(work, a);
    int64_t k = a->ndim ? a->shape[d] : 1, inner = 1;
    for (int i = d + 1; i < a->ndim; i++)
        inner *= a->shape[i];
    if (n)
        log_softmax_rows((double *)sr__tensor_ptr(work), n / (k * inner), k, inner);
    sr__copy_raw(out, work);
    sr_tensor_unref(work);
    if (!sr__any_requires_grad(&a, 1))
        return out;
    struct dim_node *node = (struct dim_node *)sr__node_for_inputs(&log_softmax_ops, sizeof(*node), &a, 1, 1, 1);
    if (node) {
        node->dim = d;
        sr__node_save(&node->base, 0, out);
    }
    return sr__attach(out, (sr_node *)node);
}

SR_API sr_tensor *sr_softmax(sr_tensor *a, int dim)
{
    SR_OP_SPAN("softmax");
    sr_tensor *l = sr_log_softmax(a, dim);
    sr_tensor *out = l ? sr_exp(l) : NULL;
    sr_tensor_unref(l);
    return out;
}

struct nll_node {
    sr_node base;
    int nd;
    int64_t shape[2]; /* logp's */
    double count;     /* targets not ignored */
};

static const int64_t *nll_targets(sr_node *node, int *rc)
{
    sr_tensor *t;
    *rc = sr__node_saved(node, 0, &t);
    return *rc ? NULL : (const int64_t *)sr__tensor_ptr(t);
}

/* d loss / d logp[i, t_i] = -g / count; zero elsewhere. */
static int nll_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct nll_node *n = (struct nll_node *)node;
    int rc;
    const int64_t *tg = nll_targets(node, &rc);
    if (rc)
        return rc;
    sr_tensor *g = sr_zeros(in[0]->dtype, n->nd, n->shape, 0);
    if (!g)
        return -ENOMEM;
    double v = -sr_tensor_item(in[0]) / n->count;
    int64_t rows = n->nd == 2 ? n->shape[0] : 1, c = n->shape[n->nd - 1];
    char *p = sr__tensor_ptr(g);
    size_t es = sr_dtype_size(g->dtype);
    for (int64_t i = 0; i < rows; i++)
        if (tg[i] != IGNORE_INDEX)
            sr__store_f64(p + (i * c + tg[i]) * (int64_t)es, 0, &v, 1, g->dtype);
    out[0] = g;
    return 0;
}

static const sr_node_ops nll_ops = {.name = "NllLossBackward0", .apply = nll_apply};

static int check_nll(const sr_tensor *logp, const sr_tensor *target)
{
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    if (sr__check_float("sr_nll_loss", logp))
        return -EINVAL;
    if (target->dtype != SR_I64)
        return sr__fail(-EINVAL, "sr_nll_loss", "target dtype must be i64, got %s", sr_dtype_name(target->dtype));
    bool ok = (logp->ndim == 2 && target->ndim == 1 && target->shape[0] == logp->shape[0]) ||
              (logp->ndim == 1 && target->ndim == 0);
    if (!ok)
        return sr__fail(-EINVAL, "sr_nll_loss", "shapes %s and %s do not match (input [N, C] with target [N], or "
                        "[C] with a 0-d target)", sr__shape_str(logp->ndim, logp->shape, b1),
                        sr__shape_str(target->ndim, target->shape, b2));
    return 0;
}

/* Sum of -logp[i, t_i] over kept targets; -EINVAL for a class out of range.
 * lp is contiguous; its elements are read from p (pinned by the caller). */
static int nll_sum(const sr_tensor *lp, const char *p, const int64_t *tg, double *sum, double *count)
{
    int64_t rows = lp->ndim == 2 ? lp->shape[0] : 1, c = lp->shape[lp->ndim - 1];
    *sum = 0.0;
    *count = 0.0;
    for (int64_t i = 0; i < rows; i++) {
        if (tg[i] == IGNORE_INDEX)
            continue;
        if (tg[i] < 0 || tg[i] >= c)
            return sr__fail(-EINVAL, "sr_nll_loss", "Target %lld is out of bounds (%lld classes)", (long long)tg[i],
                            (long long)c);
        double v;
        sr__load_f64(&v, p + (i * c + tg[i]) * (int64_t)sr_dtype_size(lp->dtype), 0, 1, lp->dtype);
        *sum -= v;
        *count += 1.0;
    }
    return 0;
}

SR_API sr_tensor *sr_nll_loss(sr_tensor *logp, sr_tensor *target)
{
    SR_OP_SPAN("nll_loss");
    if (!logp || !target || check_nll(logp, target))
        return NULL;
    sr_tensor *lp = sr_contiguous(logp), *tg = lp ? sr_contiguous(target) : NULL;
    double sum, count;
    int rc = -ENOMEM;
    if (tg) { /* sr_contiguous returns the input itself when it is contiguous: pin what is read */
        rc = nll_sum(lp, sr__tensor_pin(lp), (const int64_t *)sr__tensor_pin(tg), &sum, &count);
        sr__tensor_unpin(lp);
        sr__tensor_unpin(tg);
    }
    sr_tensor *out = rc ? NULL : sr_scalar_tensor(logp->dtype, sum / count, 0);
    sr_tensor_unref(lp);
    if (!out || !sr__any_requires_grad(&logp, 1)) {
        sr_tensor_unref(tg);
        return out;
    }
    sr_tensor *in[2] = {logp, NULL};
    struct nll_node *n = (struct nll_node *)sr__node_for_inputs(&nll_ops, sizeof(*n), in, 2, 1, 1);
    if (n) {
        n->nd = logp->ndim;
        memcpy(n->shape, logp->shape, (size_t)logp->ndim * sizeof(int64_t));
        n->count = count;
        sr__node_save(&n->base, 0, tg);
    }
    sr_tensor_unref(tg);
    return sr__attach(out, (sr_node *)n);
}

SR_API sr_tensor *sr_cross_entropy(sr_tensor *logits, sr_tensor *target)
{
    SR_OP_SPAN("cross_entropy");
    if (!logits || !target)
        return NULL;
    sr_tensor *l = sr_log_softmax(logits, logits->ndim >= 2 ? 1 : 0);
    sr_tensor *out = l ? sr_nll_loss(l, target) : NULL;
    sr_tensor_unref(l);
    return out;
}

SR_API sr_tensor *sr_mse_loss(sr_tensor *input, sr_tensor *target)
{
    SR_OP_SPAN("mse_loss");
    if (!input || !target)
        return NULL;
    int nd;
    int64_t shape[SR_MAX_DIMS];
    if (sr__check_same_dtype("sr_mse_loss", input, target) || sr__check_float("sr_mse_loss", input) ||
        sr__broadcast_shapes("sr_mse_loss", input->ndim, input->shape, target->ndim, target->shape, &nd, shape))
        return NULL;
    sr_tensor *d = sr_sub(input, target);
    sr_tensor *sq = d ? sr_mul(d, d) : NULL;
    sr_tensor *out = sq ? sr_mean(sq) : NULL;
    sr_tensor_unref(d);
    sr_tensor_unref(sq);
    return out;
}
