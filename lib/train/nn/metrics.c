/* SPDX-License-Identifier: MIT */
/* Metrics: argmax and classification accuracy. Neither records history. */
#include <errno.h>
#include <math.h>

#include "error.h"
#include "shmrpc/nn.h"
#include "tensor_seam.h"

/* a > b for element indices of a contiguous tensor; NaN is the largest, and
 * the earlier of two NaNs wins (ties keep the first index). */
static bool greater(const char *p, int64_t a, int64_t b, sr_dtype dt)
{
    if (dt == SR_I64)
        return ((const int64_t *)p)[a] > ((const int64_t *)p)[b];
    double x, y;
    sr__load_f64(&x, p + a * (int64_t)sr_dtype_size(dt), 0, 1, dt);
    sr__load_f64(&y, p + b * (int64_t)sr_dtype_size(dt), 0, 1, dt);
    return isnan(y) ? false : isnan(x) || x > y;
}

/* out[o, i] = argmax_j c[o, j, i] over the middle axis of length k. */
static void argmax_rows(const sr_tensor *c, int64_t *out, int64_t outer, int64_t k, int64_t inner)
{
    const char *p = sr__tensor_pin(c); /* c may be the caller's tensor (sr_contiguous) */
    sr_dtype dt = sr_tensor_dtype(c);
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * k * inner + i, best = 0;
            for (int64_t j = 1; j < k; j++)
                if (greater(p, base + j * inner, base + best * inner, dt))
                    best = j;
            out[o * inner + i] = best;
        }
    }
    sr__tensor_unpin(c);
}

static int argmax_dim(const sr_tensor *t, int dim)
{
    int nd = sr_tensor_ndim(t), d = sr__wrap_dim("sr_argmax", dim, nd); /* a 0-d tensor takes 0 and -1 */
    if (d >= 0 && nd && sr_tensor_shape(t)[d] == 0)
        return sr__fail(-EINVAL, "sr_argmax", "dim %d has size 0: there is no largest value", d);
    return d;
}

SR_API sr_tensor *sr_argmax(sr_tensor *t, int dim)
{
    int d = t ? argmax_dim(t, dim) : -1;
    if (d < 0)
        return NULL;
    const int64_t *ts = sr_tensor_shape(t);
    int tnd = sr_tensor_ndim(t), nd = 0;
    int64_t shape[SR_MAX_DIMS], k = tnd ? ts[d] : 1, inner = 1;
    for (int i = 0; i < tnd; i++)
        if (i != d)
            shape[nd++] = ts[i];
    for (int i = d + 1; i < tnd; i++)
        inner *= ts[i];
    sr_tensor *c = sr_contiguous(t), *out = c ? sr__tensor_new("sr_argmax", SR_I64, nd, shape) : NULL;
    int64_t n = sr__numel(tnd, ts);
    if (out && n)
        argmax_rows(c, (int64_t *)sr__tensor_new_data(out), n / (k * inner), k, inner);
    sr_tensor_unref(c);
    return out;
}

static int check_accuracy(const sr_tensor *logits, const sr_tensor *targets)
{
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    if (sr__check_float("sr_accuracy", logits))
        return -EINVAL;
    sr_dtype tdt = sr_tensor_dtype(targets);
    if (tdt != SR_I64)
        return sr__fail(-EINVAL, "sr_accuracy", "targets must be i64, got %s", sr_dtype_name(tdt));
    const int64_t *ls = sr_tensor_shape(logits), *ts = sr_tensor_shape(targets);
    if (sr_tensor_ndim(logits) != 2 || sr_tensor_ndim(targets) != 1 || ts[0] != ls[0] || !ls[0])
        return sr__fail(-EINVAL, "sr_accuracy", "shapes %s and %s: expected logits [N, C] and targets [N], N >= 1",
                        sr__tensor_shape_str(logits, b1), sr__tensor_shape_str(targets, b2));
    return 0;
}

SR_API double sr_accuracy(sr_tensor *logits, sr_tensor *targets)
{
    if (!logits || !targets || check_accuracy(logits, targets))
        return NAN;
    sr_tensor *pred = sr_argmax(logits, 1), *tg = pred ? sr_contiguous(targets) : NULL;
    if (!tg) {
        sr_tensor_unref(pred);
        return NAN;
    }
    /* pred is ours; tg may be the caller's targets (sr_contiguous): pinned */
    const int64_t *p = sr_tensor_data(pred), *y = (const int64_t *)sr__tensor_pin(tg);
    int64_t n = sr_tensor_shape(logits)[0], correct = 0;
    for (int64_t i = 0; i < n; i++)
        correct += p[i] == y[i];
    sr__tensor_unpin(tg);
    sr_tensor_unref(pred);
    sr_tensor_unref(tg);
    return (double)correct / (double)n;
}
