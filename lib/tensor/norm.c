/* SPDX-License-Identifier: MIT */
/* layer_norm with its backward, in the tensor's dtype. It normalises each
 * sample over its trailing dims alone, so a sample's output does not depend
 * on the others in its batch: a batch split into micro-batches gives the
 * same outputs and the same summed gradients (docs/TENSORS.md, "Convolution
 * layers").
 *
 * Rows: x viewed as [M, D], D the normalized shape's size. Forward keeps
 * each row's mean and rstd = 1 / sqrt(var + eps) (biased variance). With
 * xhat = (x - mean) rstd and dxhat = dy * weight (dy without a weight):
 *   dx      = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))   per row
 *   dweight = sum over rows of dy xhat,   dbias = sum over rows of dy.
 *
 * Sums are blocked: each block of LN_BLOCK elements of a row is summed in
 * the dtype, in the lanes of one or two vectors (partial sums that do not
 * wait on one another), and each block's total is added in double; dweight
 * and dbias add LN_ROWS rows in the dtype, then into double. So no partial
 * sum in f32 holds more than LN_BLOCK / 4 or LN_ROWS terms, whatever the
 * row length and the batch, and the passes over elements run in the dtype:
 * forward reads a row twice (its sums, its output), backward twice (one
 * pass for the row sums and the weight and bias gradients, one for dx),
 * from cache for rows up to a few hundred KiB. The forward's one pass of
 * sums is of x - k and its square, k the mean of the row's first block:
 * var = s2 / d - (s1 / d)^2 then cancels at most a factor 1 + d / LN_BLOCK
 * (the first block's mean is within sqrt(d / LN_BLOCK) standard deviations
 * of the row's), and in practice almost nothing.
 *
 * sr__layer_norm_relu (tensor_seam.h) is relu(layer_norm) in one op: the
 * forward clips each element as it writes it, and saves its output;
 * backward masks dY where that output is not > 0 inside both of its
 * passes, which is what relu's backward followed by this one computes,
 * element for element, so the bits are the same. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "autograd/engine.h"
#include "error.h"
#include "norm_impl.h"
#include "tensor_impl.h"

int sr__ln_check(const sr_tensor *x, int nd, const int64_t *shape, const sr_tensor *w, const sr_tensor *b)
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


/* Contiguous tensors to read (new references, pinned); NULL entries stay NULL. */
int sr__ln_open_inputs(sr_tensor *const *in, sr_tensor **c, const char **p, int n)
{
    int rc = 0;
    for (int i = 0; i < n; i++) {
        c[i] = in[i] && !rc ? sr_contiguous(in[i]) : NULL;
        p[i] = c[i] ? sr__tensor_pin(c[i]) : NULL;
        rc = in[i] && !c[i] ? -ENOMEM : rc;
    }
    return rc;
}

void sr__ln_close_inputs(sr_tensor **c, int n)
{
    for (int i = 0; i < n; i++)
        if (c[i]) {
            sr__tensor_unpin(c[i]);
            sr_tensor_unref(c[i]);
        }
}

/* A new tensor of the normalized shape from the double sums. */
sr_tensor *sr__ln_param_grad(const struct ln_node *n, sr_dtype dt, const double *acc)
{
    sr_tensor *t = sr__tensor_new("sr_layer_norm", dt, n->nd, n->shape);
    if (t)
        sr__store_f64(sr__tensor_new_data(t), (int64_t)sr_dtype_size(t->dtype), acc,
                      (int64_t)sr_tensor_numel(t), t->dtype);
    return t;
}

/* Backward's scratch: the double sums of dweight and dbias (d each) and
 * their LN_ROWS-row partial sums in the dtype (d each), zeroed (kept even
 * when neither gradient is needed: the row sums for dx fill them). A block of
 * the shared heap when this process is a worker (so a freed one is reused,
 * not faulted in again every call as a multi-page malloc is), else a
 * private block; sr__ln_grads owns it for the call and drops it at the end. */
sr_block *sr__ln_scratch(int64_t d, size_t elem, double **dw, double **db, char **dwr, char **dbr)
{
    size_t n = (size_t)d, bytes = 2 * n * sizeof(double) + 2 * n * elem;
    sr_block *blk = sr__block_alloc(bytes ? bytes : 1);
    if (!blk)
        return NULL;
    char *p = sr__block_data(blk);
    memset(p, 0, bytes);
    *dw = (double *)p;
    *db = *dw + n;
    *dwr = (char *)(*db + n);
    *dbr = *dwr + n * elem;
    return blk;
}

int sr__ln_grads(const struct ln_node *n, const sr_tensor *x, sr__ln_bwd_fn bwd, void *arg, sr_tensor **out)
{
    bool need[3] = {sr__node_needs_grad(&n->base, 0), sr__node_needs_grad(&n->base, 1),
                    sr__node_needs_grad(&n->base, 2)};
    struct ln_bufs b;
    sr_block *blk = sr__ln_scratch(n->r.d, sr_dtype_size(x->dtype), &b.dw, &b.db, &b.dwr, &b.dbr);
    sr_tensor *dx = need[0] ? sr__tensor_new("sr_layer_norm", x->dtype, x->ndim, x->shape) : NULL;
    if (!blk || (need[0] && !dx)) {
        if (blk)
            sr__block_unref(blk);
        sr_tensor_unref(dx);
        return -ENOMEM;
    }
    b.dx = dx ? sr__tensor_new_data(dx) : NULL;
    int rc = bwd(&b, arg);
    out[0] = rc ? (sr_tensor_unref(dx), NULL) : dx;
    out[1] = !rc && need[1] ? sr__ln_param_grad(n, x->dtype, b.dw) : NULL;
    out[2] = !rc && need[2] ? sr__ln_param_grad(n, x->dtype, b.db) : NULL;
    sr__block_unref(blk);
    return rc ? rc : (need[1] && !out[1]) || (need[2] && !out[2]) ? -ENOMEM : 0;
}

/* layer_norm's (and the fused relu's) kernel for sr__ln_grads; arg: ln_args. */
struct ln_args {
    struct ln_rows r;
    const char *const *p; /* 0 x, 1 weight, 2 stats, 3 dy, 4 the relu's output (or NULL) */
    sr_dtype dt;
};

static int ln_bwd(const struct ln_bufs *b, void *arg)
{
    const struct ln_args *a = arg;
    const char *const *p = a->p;
    const double *stats = (const double *)p[2];
    if (a->dt == SR_F64)
        ln_bwd_f64(a->r, (const double *)p[0], (const double *)p[1], (const double *)p[3], (const double *)p[4],
                   stats, (double *)b->dx, b->dw, b->db, (double *)b->dwr, (double *)b->dbr);
    else
        ln_bwd_f32(a->r, (const float *)p[0], (const float *)p[1], (const float *)p[3], (const float *)p[4], stats,
                   (float *)b->dx, b->dw, b->db, (float *)b->dwr, (float *)b->dbr);
    return 0;
}

/* saved: 0 x, 1 weight (or none), 2 stats [M, 2] f64, and with relu 3 the output. */
static int ln_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    sr_tensor *saved[4] = {NULL};
    uint32_t nsaved = ((struct ln_node *)node)->relu ? 4 : 3;
    int rc = 0;
    for (uint32_t i = 0; !rc && i < nsaved; i++)
        rc = sr__node_saved(node, i, &saved[i]);
    if (rc)
        return rc;
    sr_tensor *c[5] = {NULL}, *src[5] = {saved[0], saved[1], saved[2], in[0], saved[3]};
    const char *p[5];
    rc = sr__ln_open_inputs(src, c, p, 5);
    struct ln_args a = {((struct ln_node *)node)->r, p, saved[0]->dtype};
    if (!rc)
        rc = sr__ln_grads((struct ln_node *)node, saved[0], ln_bwd, &a, out);
    sr__ln_close_inputs(c, 5);
    return rc;
}

static const sr_node_ops ln_ops = {.name = "NativeLayerNormBackward0", .apply = ln_apply};
static const sr_node_ops ln_relu_ops = {.name = "LayerNormReluBackward0", .apply = ln_apply};

static sr_tensor *ln_forward(sr_tensor *x, struct ln_rows r, sr_tensor *w, sr_tensor *b, double eps, bool relu,
                             sr_tensor **stats)
{
    sr_tensor *out = sr__tensor_new("sr_layer_norm", x->dtype, x->ndim, x->shape);
    *stats = out ? sr__tensor_new("sr_layer_norm", SR_F64, 2, (const int64_t[]){r.m, 2}) : NULL;
    sr_tensor *c[3] = {NULL}, *src[3] = {x, w, b};
    const char *p[3];
    if (!*stats || sr__ln_open_inputs(src, c, p, 3)) {
        sr__ln_close_inputs(c, 3);
        sr_tensor_unref(out);
        sr_tensor_unref(*stats);
        return *stats = NULL;
    }
    double *st = (double *)sr__tensor_new_data(*stats);
    if (x->dtype == SR_F64)
        ln_fwd_f64(r, eps, (const double *)p[0], (const double *)p[1], (const double *)p[2],
                   (double *)sr__tensor_new_data(out), st, relu);
    else
        ln_fwd_f32(r, eps, (const float *)p[0], (const float *)p[1], (const float *)p[2],
                   (float *)sr__tensor_new_data(out), st, relu);
    sr__ln_close_inputs(c, 3);
    return out;
}

static sr_tensor *layer_norm(sr_tensor *x, int ndim, const int64_t *normalized_shape, sr_tensor *weight,
                             sr_tensor *bias, double eps, bool relu)
{
    if (!x || sr__ln_check(x, ndim, normalized_shape, weight, bias))
        return NULL;
    struct ln_rows r = {.d = sr__numel(ndim, normalized_shape)};
    r.m = r.d ? sr__numel(x->ndim, x->shape) / r.d : 0;
    sr_tensor *in[3] = {x, weight, bias}, *stats;
    bool pinned = sr__pin_saved(in, 3); /* saves what it reads */
    sr_tensor *out = ln_forward(x, r, weight, bias, eps, relu, &stats);
    if (out && sr__any_requires_grad(in, 3)) {
        struct ln_node *n = (struct ln_node *)sr__node_for_inputs(relu ? &ln_relu_ops : &ln_ops, sizeof(*n), in, 3,
                                                                  1, relu ? 4 : 3);
        if (n) {
            n->r = r;
            n->relu = relu;
            n->nd = ndim;
            memcpy(n->shape, normalized_shape, (size_t)ndim * sizeof(int64_t));
            sr__node_save(&n->base, 0, x);
            sr__node_save(&n->base, 1, weight);
            sr__node_save(&n->base, 2, stats);
            if (relu)
                sr__node_save(&n->base, 3, out);
        }
        out = sr__attach(out, (sr_node *)n);
    }
    sr_tensor_unref(stats);
    sr__unpin_saved(pinned, in, 3);
    return out;
}

SR_API sr_tensor *sr_layer_norm(sr_tensor *x, int ndim, const int64_t *normalized_shape, sr_tensor *weight,
                                sr_tensor *bias, double eps)
{
    SR_OP_SPAN("layer_norm");
    return layer_norm(x, ndim, normalized_shape, weight, bias, eps, false);
}

sr_tensor *sr__layer_norm_relu(sr_tensor *x, int ndim, const int64_t *normalized_shape, sr_tensor *weight,
                               sr_tensor *bias, double eps)
{
    SR_OP_SPAN("layer_norm_relu");
    return layer_norm(x, ndim, normalized_shape, weight, bias, eps, true);
}
