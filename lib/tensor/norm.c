/* layer_norm, built from recorded ops (reshape, means, sub, mul, pow), so its
 * backward comes from theirs. It normalises each sample over its trailing
 * dims alone, so a sample's output does not depend on the others in its
 * batch: a batch split into micro-batches gives the same outputs and the
 * same summed gradients (docs/TENSORS.md, "Convolution layers"). */
#include <errno.h>
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

/* Replace *t by next (owning both); false when next is NULL. */
static bool step(sr_tensor **t, sr_tensor *next)
{
    sr_tensor_unref(*t);
    *t = next;
    return next != NULL;
}

/* (x - mean) / sqrt(var + eps) over the last dim of x2 [M, D]. */
static sr_tensor *normalise_rows(sr_tensor *x2, double eps)
{
    sr_tensor *mu = sr_mean_dim(x2, 1, true), *xc = mu ? sr_sub(x2, mu) : NULL;
    sr_tensor *var = xc ? sr_mul(xc, xc) : NULL, *y = NULL;
    if (var && step(&var, sr_mean_dim(var, 1, true)) && step(&var, sr_add_scalar(var, eps)) &&
        step(&var, sr_pow_scalar(var, -0.5)))
        y = sr_mul(xc, var);
    sr_tensor_unref(mu);
    sr_tensor_unref(xc);
    sr_tensor_unref(var);
    return y;
}

SR_API sr_tensor *sr_layer_norm(sr_tensor *x, int ndim, const int64_t *normalized_shape, sr_tensor *weight,
                                sr_tensor *bias, double eps)
{
    if (!x || check_norm(x, ndim, normalized_shape, weight, bias))
        return NULL;
    int64_t d = sr__numel(ndim, normalized_shape), m = sr__numel(x->ndim - ndim, x->shape);
    sr_tensor *y = sr_reshape(x, 2, (const int64_t[]){m, d});
    if (y && step(&y, normalise_rows(y, eps)) && step(&y, sr_reshape(y, x->ndim, x->shape)) && weight)
        step(&y, sr_mul(y, weight));
    if (y && bias)
        step(&y, sr_add(y, bias));
    return y;
}
