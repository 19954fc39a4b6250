/* SPDX-License-Identifier: MIT */
/* mm, bmm and matmul. mm and bmm call the gemm kernel directly on row- or
 * column-major operands (a transposed view costs nothing); other layouts are
 * copied first. matmul is built from views, expand and bmm, so its backward
 * comes from theirs. */
#include <errno.h>
#include <string.h>

#include "autograd/engine.h"
#include "error.h"
#include "gemm.h"
#include "tensor_impl.h"

/* The last two dims of t as a gemm operand without copying, if possible. */
static bool as_operand(const sr_tensor *t, bool *trans, int64_t *ld)
{
    int64_t rows = t->shape[t->ndim - 2], cols = t->shape[t->ndim - 1];
    int64_t s0 = t->strides[t->ndim - 2], s1 = t->strides[t->ndim - 1];
    int64_t mc = cols > 1 ? cols : 1, mr = rows > 1 ? rows : 1;
    if ((s1 == 1 || cols == 1) && (rows == 1 || s0 >= mc)) {
        *trans = false;
        *ld = rows == 1 ? mc : s0;
        return true;
    }
    if ((s0 == 1 || rows == 1) && (cols == 1 || s1 >= mr)) {
        *trans = true;
        *ld = cols == 1 ? mr : s1;
        return true;
    }
    return false;
}

static sr_tensor *operand(sr_tensor *t, bool *trans, int64_t *ld)
{
    if (as_operand(t, trans, ld))
        return sr_tensor_ref(t);
    sr_tensor *c = sr__tensor_new("sr_matmul", t->dtype, t->ndim, t->shape);
    if (c) {
        sr__copy_raw(c, t);
        as_operand(c, trans, ld);
    }
    return c;
}

/* out[i] = a[i] b[i] for each of `batch` matrices (2-D: batch 1). a and b
 * are pinned for the whole op, so a copy made by operand() and a direct read
 * see the same version of a storage they share. */
static int multiply(const char *fn, sr_tensor *out, sr_tensor *a, sr_tensor *b, int64_t batch)
{
    struct sr_gemm g = {.dt = out->dtype, .m = out->shape[out->ndim - 2], .n = out->shape[out->ndim - 1],
                        .k = a->shape[a->ndim - 1], .ldc = out->shape[out->ndim - 1]};
    sr__tensor_pin(a);
    sr__tensor_pin(b);
    sr_tensor *ao = operand(a, &g.ta, &g.lda), *bo = ao ? operand(b, &g.tb, &g.ldb) : NULL;
    int rc = bo ? 0 : -ENOMEM;
    size_t es = sr_dtype_size(out->dtype);
    const char *pa = rc ? NULL : sr__tensor_pin(ao), *pb = rc ? NULL : sr__tensor_pin(bo);
    for (int64_t i = 0; !rc && i < batch; i++) {
        g.a = pa + (batch > 1 ? i * ao->strides[0] * (int64_t)es : 0);
        g.b = pb + (batch > 1 ? i * bo->strides[0] * (int64_t)es : 0);
        g.c = sr__tensor_ptr(out) + i * g.m * g.n * (int64_t)es;
        if (g.m && g.n && sr__gemm(&g))
            rc = sr__fail(-ENOMEM, fn, "out of memory for the blocked matmul");
    }
    if (pa) {
        sr__tensor_unpin(ao);
        sr__tensor_unpin(bo);
    }
    sr_tensor_unref(ao);
    sr_tensor_unref(bo);
    sr__tensor_unpin(a);
    sr__tensor_unpin(b);
    return rc;
}

static int mm_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out);
static int bmm_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out);
static const sr_node_ops mm_ops = {.name = "MmBackward0", .apply = mm_apply};
static const sr_node_ops bmm_ops = {.name = "BmmBackward0", .apply = bmm_apply};

/* t's last two dims are column-major (a transposed view of a dense matrix,
 * as the weight sr_linear multiplies by), and not row-major too. */
static bool col_major(const sr_tensor *t)
{
    int64_t rows = t->shape[t->ndim - 2], cols = t->shape[t->ndim - 1];
    return rows > 1 && cols > 1 && t->strides[t->ndim - 2] == 1 && t->strides[t->ndim - 1] >= rows;
}

/* x y, or with `flip` (x y)^T computed as y^T x^T, a dense product,
 * handed out transposed: the same values in the layout of a column-major
 * operand. */
static sr_tensor *product(sr_tensor *(*mul)(sr_tensor *, sr_tensor *), sr_tensor *x, sr_tensor *y, bool flip)
{
    if (!flip)
        return mul(x, y);
    sr_tensor *xt = sr_transpose(x, -2, -1), *yt = sr_transpose(y, -2, -1);
    sr_tensor *p = xt && yt ? mul(yt, xt) : NULL, *out = p ? sr_transpose(p, -2, -1) : NULL;
    sr_tensor_unref(xt), sr_tensor_unref(yt), sr_tensor_unref(p);
    return out;
}

/* d(ab)/da = g b^T, d(ab)/db = a^T g, over the last two dims. The gradient
 * of a column-major operand comes out column-major (as PyTorch's does): the
 * weight of sr_linear, multiplied as a transposed view, then gets a dense
 * gradient through the transpose's backward, which its AccumulateGrad keeps
 * as it is and later ones add to element for element, instead of a
 * transposed one that every accumulation copies or reads across rows. */
static int mm_like_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out,
                         sr_tensor *(*mul)(sr_tensor *, sr_tensor *))
{
    sr_tensor *a = NULL, *b = NULL;
    int rc = sr__node_saved(node, 0, &a);
    if (!rc)
        rc = sr__node_saved(node, 1, &b);
    for (int i = 0; !rc && i < 2; i++) {
        if (!sr__node_needs_grad(node, (uint32_t)i))
            continue;
        sr_tensor *other = sr_transpose(i == 0 ? b : a, -2, -1);
        bool flip = col_major(i == 0 ? a : b);
        out[i] = other ? (i == 0 ? product(mul, in[0], other, flip) : product(mul, other, in[0], flip)) : NULL;
        sr_tensor_unref(other);
        rc = out[i] ? 0 : -EINVAL;
    }
    return rc;
}

static int mm_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    return mm_like_apply(node, in, out, sr_mm);
}

static int bmm_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    return mm_like_apply(node, in, out, sr_bmm);
}

static int check_pair(const char *fn, const sr_tensor *a, const sr_tensor *b, int ndim)
{
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    if (sr__check_same_dtype(fn, a, b) || sr__check_float(fn, a))
        return -EINVAL;
    if (a->ndim != ndim || b->ndim != ndim)
        return sr__fail(-EINVAL, fn, "expected %d-D tensors, got shapes %s and %s", ndim,
                        sr__shape_str(a->ndim, a->shape, b1), sr__shape_str(b->ndim, b->shape, b2));
    if (a->shape[ndim - 1] != b->shape[ndim - 2] || (ndim == 3 && a->shape[0] != b->shape[0]))
        return sr__fail(-EINVAL, fn, "shapes %s and %s cannot be multiplied", sr__shape_str(a->ndim, a->shape, b1),
                        sr__shape_str(b->ndim, b->shape, b2));
    return 0;
}

static sr_tensor *mm_like(const char *fn, const sr_node_ops *ops, sr_tensor *a, sr_tensor *b, int ndim)
{
    if (!a || !b || check_pair(fn, a, b, ndim))
        return NULL;
    int64_t shape[3] = {a->shape[0], a->shape[1], b->shape[ndim - 1]};
    if (ndim == 2)
        shape[1] = b->shape[1];
    sr_tensor *in[2] = {a, b};
    bool pinned = sr__pin_saved(in, 2); /* saves what it reads */
    sr_tensor *out = sr__tensor_new(fn, a->dtype, ndim, shape);
    if (out && multiply(fn, out, a, b, ndim == 3 ? a->shape[0] : 1)) {
        sr_tensor_unref(out);
        out = NULL;
    }
    if (out && sr__any_requires_grad(in, 2)) {
        sr_node *n = sr__node_for_inputs(ops, sizeof(sr_node), in, 2, 1, 2);
        if (n) {
            sr__node_save(n, 0, a);
            sr__node_save(n, 1, b);
        }
        out = sr__attach(out, n);
    }
    sr__unpin_saved(pinned, in, 2);
    return out;
}

SR_API sr_tensor *sr_mm(sr_tensor *a, sr_tensor *b)
{
    SR_OP_SPAN("mm");
    return mm_like("sr_mm", &mm_ops, a, b, 2);
}
SR_API sr_tensor *sr_bmm(sr_tensor *a, sr_tensor *b)
{
    SR_OP_SPAN("bmm");
    return mm_like("sr_bmm", &bmm_ops, a, b, 3);
}

/* Replace *t by f(*t) (owning both). */
static bool step(sr_tensor **t, sr_tensor *next)
{
    sr_tensor_unref(*t);
    *t = next;
    return next != NULL;
}

/* Batched case: broadcast batch dims, fold them into one, bmm, unfold. */
static sr_tensor *batched(sr_tensor *a, sr_tensor *b, const int64_t *batch, int nb)
{
    int64_t n = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1], m = b->shape[b->ndim - 1];
    int64_t sa[SR_MAX_DIMS], sb[SR_MAX_DIMS], B = sr__numel(nb, batch);
    memcpy(sa, batch, (size_t)nb * sizeof(int64_t));
    memcpy(sb, batch, (size_t)nb * sizeof(int64_t));
    sa[nb] = n, sa[nb + 1] = k, sb[nb] = k, sb[nb + 1] = m;
    sr_tensor *x = sr_expand(a, nb + 2, sa), *y = sr_expand(b, nb + 2, sb), *c = NULL;
    if (x && y && step(&x, sr_reshape(x, 3, (int64_t[]){B, n, k})) && step(&y, sr_reshape(y, 3, (int64_t[]){B, k, m})))
        c = sr_bmm(x, y);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    sa[nb + 1] = m;
    if (c)
        step(&c, sr_reshape(c, nb + 2, sa));
    return c;
}

static int check_matmul(const sr_tensor *a, const sr_tensor *b, int64_t *batch, int *nb)
{
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    if (sr__check_same_dtype("sr_matmul", a, b) || sr__check_float("sr_matmul", a))
        return -EINVAL;
    if (a->ndim == 0 || b->ndim == 0)
        return sr__fail(-EINVAL, "sr_matmul", "both arguments to matmul need to be at least 1D, but they are %dD "
                        "and %dD", a->ndim, b->ndim);
    int64_t ka = a->shape[a->ndim - 1], kb = b->ndim == 1 ? b->shape[0] : b->shape[b->ndim - 2];
    if (ka != kb)
        return sr__fail(-EINVAL, "sr_matmul", "shapes %s and %s cannot be multiplied",
                        sr__shape_str(a->ndim, a->shape, b1), sr__shape_str(b->ndim, b->shape, b2));
    int na = a->ndim > 2 ? a->ndim - 2 : 0, nbb = b->ndim > 2 ? b->ndim - 2 : 0;
    return sr__broadcast_shapes("sr_matmul", na, a->shape, nbb, b->shape, nb, batch);
}

SR_API sr_tensor *sr_matmul(sr_tensor *a, sr_tensor *b)
{
    SR_OP_SPAN("matmul");
    int64_t batch[SR_MAX_DIMS];
    int nb;
    if (!a || !b || check_matmul(a, b, batch, &nb))
        return NULL;
    if (a->ndim == 2 && b->ndim == 2)
        return sr_mm(a, b);
    /* promote 1-D operands to matrices, remember to drop the added dims */
    sr_tensor *x = a->ndim == 1 ? sr_unsqueeze(a, 0) : sr_tensor_ref(a);
    sr_tensor *y = b->ndim == 1 ? sr_unsqueeze(b, 1) : sr_tensor_ref(b);
    sr_tensor *c = !x || !y ? NULL : nb == 0 ? sr_mm(x, y) : batched(x, y, batch, nb);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    if (c && b->ndim == 1)
        step(&c, sr_squeeze(c, -1));
    if (c && a->ndim == 1)
        step(&c, sr_squeeze(c, b->ndim == 1 ? -1 : -2));
    return c;
}
