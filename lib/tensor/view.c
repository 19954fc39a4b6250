/* SPDX-License-Identifier: MIT */
/* Shape ops: views that share storage (view, reshape when possible,
 * transpose, t, permute, narrow, squeeze, unsqueeze, expand, detach) and the
 * copies clone / contiguous, each with its backward. */
#include <errno.h>
#include <string.h>

#include "autograd/engine.h"
#include "error.h"
#include "tensor_impl.h"

struct shape_node {
    sr_node base;
    int nd;
    int64_t shape[SR_MAX_DIMS]; /* the input's */
    int dim0, dim1;             /* transpose dims; narrow: dim0 */
    int64_t start;              /* narrow */
    int perm[SR_MAX_DIMS];      /* permute */
};

static int reshape_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct shape_node *n = (struct shape_node *)node;
    out[0] = sr_reshape(in[0], n->nd, n->shape);
    return out[0] ? 0 : -EINVAL;
}

static int transpose_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct shape_node *n = (struct shape_node *)node;
    out[0] = sr_transpose(in[0], n->dim0, n->dim1);
    return out[0] ? 0 : -EINVAL;
}

static int permute_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct shape_node *n = (struct shape_node *)node;
    int inverse[SR_MAX_DIMS];
    for (int i = 0; i < n->nd; i++)
        inverse[n->perm[i]] = i;
    out[0] = sr_permute(in[0], inverse);
    return out[0] ? 0 : -EINVAL;
}

static int narrow_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct shape_node *n = (struct shape_node *)node;
    sr_tensor *g = sr_zeros(in[0]->dtype, n->nd, n->shape, 0);
    sr_tensor *slice = g ? sr_narrow(g, n->dim0, n->start, in[0]->shape[n->dim0]) : NULL;
    if (slice)
        sr__copy_raw(slice, in[0]);
    sr_tensor_unref(slice);
    if (!slice) {
        sr_tensor_unref(g);
        return -EINVAL;
    }
    out[0] = g;
    return 0;
}

static int expand_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct shape_node *n = (struct shape_node *)node;
    out[0] = sr__sum_to(in[0], n->nd, n->shape);
    return out[0] ? 0 : -EINVAL;
}

static int identity_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    (void)node;
    out[0] = sr_tensor_ref(in[0]);
    return 0;
}

static const sr_node_ops view_ops = {.name = "ViewBackward0", .apply = reshape_apply};
static const sr_node_ops reshape_ops = {.name = "ReshapeBackward0", .apply = reshape_apply};
static const sr_node_ops squeeze_ops = {.name = "SqueezeBackward1", .apply = reshape_apply};
static const sr_node_ops unsqueeze_ops = {.name = "UnsqueezeBackward0", .apply = reshape_apply};
static const sr_node_ops transpose_ops = {.name = "TransposeBackward0", .apply = transpose_apply};
static const sr_node_ops permute_ops = {.name = "PermuteBackward0", .apply = permute_apply};
static const sr_node_ops narrow_ops = {.name = "NarrowBackward0", .apply = narrow_apply};
static const sr_node_ops expand_ops = {.name = "ExpandBackward0", .apply = expand_apply};
static const sr_node_ops clone_ops = {.name = "CloneBackward0", .apply = identity_apply};

/* Record a shape node on out; the caller fills the op-specific fields via *n. */
static sr_tensor *record(sr_tensor *out, const sr_node_ops *ops, sr_tensor *a, struct shape_node **pn)
{
    *pn = NULL;
    if (!out || !sr__any_requires_grad(&a, 1))
        return out;
    struct shape_node *n = (struct shape_node *)sr__node_for_inputs(ops, sizeof(*n), &a, 1, 1, 0);
    if (n) {
        n->nd = a->ndim;
        memcpy(n->shape, a->shape, sizeof(n->shape));
    }
    *pn = n;
    return sr__attach(out, (sr_node *)n);
}

static sr_tensor *record_plain(sr_tensor *out, const sr_node_ops *ops, sr_tensor *a)
{
    struct shape_node *n;
    return record(out, ops, a, &n);
}

/* Resolve one -1 entry; -EINVAL names fn if the element counts differ. */
static int infer_shape(const char *fn, const sr_tensor *a, int nd, const int64_t *shape, int64_t *out)
{
    if (nd < 0 || nd > SR_MAX_DIMS || (nd && !shape))
        return sr__fail(-EINVAL, fn, "bad shape (ndim %d)", nd);
    int infer = -1;
    int64_t known = 1, numel = sr__numel(a->ndim, a->shape);
    bool overflow = false; /* the product wrapped: it could match numel by accident */
    for (int i = 0; i < nd; i++) {
        out[i] = shape[i];
        if (shape[i] == -1 && infer < 0)
            infer = i;
        else if (shape[i] < 0)
            infer = -2;
        else
            overflow |= __builtin_mul_overflow(known, shape[i], &known);
    }
    if (!overflow && infer >= 0 && known > 0 && numel % known == 0)
        out[infer] = numel / known;
    if (!overflow && infer != -2 && (infer >= 0 ? known > 0 && numel % known == 0 : known == numel))
        return sr__check_shape(fn, nd, out); /* the same element limit as a new tensor */
    char b[SR_SHAPE_STR];
    return sr__fail(-EINVAL, fn, "shape '%s' is invalid for input of size %lld", sr__shape_str(nd, shape, b),
                    (long long)numel);
}

/* Strides that let a tensor of (ond, oshape, ostride) be read with shape
 * nshape without copying: old dims are grouped into runs that are
 * contiguous with each other, and the new dims must split exactly those runs. */
static bool view_strides(const sr_tensor *a, int nnd, const int64_t *nshape, int64_t *nstride)
{
    if (sr__numel(a->ndim, a->shape) == 0 || a->ndim == 0) {
        sr__contiguous_strides(nnd, nshape, nstride);
        return true;
    }
    int vd = nnd - 1;
    int64_t base = a->strides[a->ndim - 1], run = 1, vrun = 1;
    for (int d = a->ndim - 1; d >= 0; d--) {
        run *= a->shape[d];
        bool run_ends = d == 0 || (a->shape[d - 1] != 1 && a->strides[d - 1] != run * base);
        if (!run_ends)
            continue;
        while (vd >= 0 && (vrun < run || nshape[vd] == 1)) {
            nstride[vd] = vrun * base;
            vrun *= nshape[vd];
            vd--;
        }
        if (vrun != run)
            return false;
        if (d > 0) {
            base = a->strides[d - 1];
            run = vrun = 1;
        }
    }
    return vd == -1;
}

SR_API sr_tensor *sr_view(sr_tensor *a, int ndim, const int64_t *shape)
{
    int64_t ns[SR_MAX_DIMS], st[SR_MAX_DIMS];
    if (!a || infer_shape("sr_view", a, ndim, shape, ns))
        return NULL;
    if (!view_strides(a, ndim, ns, st)) {
        char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
        sr__fail(-EINVAL, "sr_view", "view size %s is not compatible with input tensor's size %s and stride "
                 "(at least one dimension spans across two contiguous subspaces). Use sr_reshape instead",
                 sr__shape_str(ndim, ns, b1), sr__shape_str(a->ndim, a->shape, b2));
        return NULL;
    }
    return record_plain(sr__tensor_alias(a, ndim, ns, st, a->offset), &view_ops, a);
}

SR_API sr_tensor *sr_reshape(sr_tensor *a, int ndim, const int64_t *shape)
{
    int64_t ns[SR_MAX_DIMS], st[SR_MAX_DIMS];
    if (!a || infer_shape("sr_reshape", a, ndim, shape, ns))
        return NULL;
    sr_tensor *out;
    if (view_strides(a, ndim, ns, st)) {
        out = sr__tensor_alias(a, ndim, ns, st, a->offset);
    } else {
        out = sr__tensor_new("sr_reshape", a->dtype, a->ndim, a->shape);
        if (out) {
            sr__copy_raw(out, a);
            out->ndim = ndim;
            memcpy(out->shape, ns, sizeof(ns));
            sr__contiguous_strides(ndim, ns, out->strides);
        }
    }
    return record_plain(out, &reshape_ops, a);
}

SR_API sr_tensor *sr_transpose(sr_tensor *a, int dim0, int dim1)
{
    int d0 = a ? sr__wrap_dim("sr_transpose", dim0, a->ndim) : -1;
    int d1 = d0 >= 0 ? sr__wrap_dim("sr_transpose", dim1, a->ndim) : -1;
    if (d1 < 0)
        return NULL;
    int64_t sh[SR_MAX_DIMS], st[SR_MAX_DIMS];
    memcpy(sh, a->shape, sizeof(sh));
    memcpy(st, a->strides, sizeof(st));
    if (a->ndim > 0) {
        sh[d0] = a->shape[d1], sh[d1] = a->shape[d0];
        st[d0] = a->strides[d1], st[d1] = a->strides[d0];
    }
    struct shape_node *n;
    sr_tensor *out = record(sr__tensor_alias(a, a->ndim, sh, st, a->offset), &transpose_ops, a, &n);
    if (n)
        n->dim0 = d0, n->dim1 = d1;
    return out;
}

SR_API sr_tensor *sr_t(sr_tensor *a)
{
    if (a && a->ndim > 2) {
        sr__fail(-EINVAL, "sr_t", "t() expects a tensor with <= 2 dimensions, but self is %dD", a->ndim);
        return NULL;
    }
    return sr_transpose(a, 0, a && a->ndim == 2 ? 1 : 0);
}

SR_API sr_tensor *sr_permute(sr_tensor *a, const int *dims)
{
    if (!a)
        return NULL;
    int64_t sh[SR_MAX_DIMS], st[SR_MAX_DIMS];
    int perm[SR_MAX_DIMS];
    unsigned seen = 0;
    for (int i = 0; i < a->ndim; i++) {
        int d = sr__wrap_dim("sr_permute", dims ? dims[i] : -99, a->ndim);
        if (d < 0)
            return NULL;
        if (seen & (1u << d)) {
            sr__fail(-EINVAL, "sr_permute", "repeated dim %d in the permutation", d);
            return NULL;
        }
        seen |= 1u << d;
        perm[i] = d;
        sh[i] = a->shape[d];
        st[i] = a->strides[d];
    }
    struct shape_node *n;
    sr_tensor *out = record(sr__tensor_alias(a, a->ndim, sh, st, a->offset), &permute_ops, a, &n);
    if (n)
        memcpy(n->perm, perm, sizeof(perm));
    return out;
}

SR_API sr_tensor *sr_narrow(sr_tensor *a, int dim, int64_t start, int64_t length)
{
    int d = a ? sr__wrap_dim("sr_narrow", dim, a->ndim) : -1;
    if (d < 0)
        return NULL;
    if (a->ndim == 0) {
        sr__fail(-EINVAL, "sr_narrow", "narrow() cannot be applied to a 0-dim tensor");
        return NULL;
    }
    int64_t size = a->shape[d];
    if (start < 0 && start >= -size)
        start += size;
    if (start < 0 || start > size || length < 0 || start + length > size) {
        sr__fail(-EINVAL, "sr_narrow", "start %lld and length %lld are out of range for dimension %d of size %lld",
                 (long long)start, (long long)length, d, (long long)size);
        return NULL;
    }
    int64_t sh[SR_MAX_DIMS];
    memcpy(sh, a->shape, sizeof(sh));
    sh[d] = length;
    struct shape_node *n;
    sr_tensor *out = record(sr__tensor_alias(a, a->ndim, sh, a->strides, a->offset + start * a->strides[d]),
                            &narrow_ops, a, &n);
    if (n)
        n->dim0 = d, n->start = start;
    return out;
}

SR_API sr_tensor *sr_squeeze(sr_tensor *a, int dim)
{
    int d = a ? sr__wrap_dim("sr_squeeze", dim, a->ndim) : -1;
    if (d < 0)
        return NULL;
    int64_t sh[SR_MAX_DIMS], st[SR_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < a->ndim; i++) {
        if (i == d && a->shape[i] == 1)
            continue;
        sh[nd] = a->shape[i];
        st[nd++] = a->strides[i];
    }
    return record_plain(sr__tensor_alias(a, nd, sh, st, a->offset), &squeeze_ops, a);
}

SR_API sr_tensor *sr_unsqueeze(sr_tensor *a, int dim)
{
    if (!a)
        return NULL;
    if (a->ndim == SR_MAX_DIMS) {
        sr__fail(-EINVAL, "sr_unsqueeze", "a tensor cannot have more than %d dims", SR_MAX_DIMS);
        return NULL;
    }
    int d = sr__wrap_dim("sr_unsqueeze", dim, a->ndim + 1);
    if (d < 0)
        return NULL;
    int64_t sh[SR_MAX_DIMS], st[SR_MAX_DIMS];
    for (int i = 0, j = 0; i <= a->ndim; i++) {
        if (i == d) {
            sh[i] = 1;
            st[i] = d < a->ndim ? a->shape[d] * a->strides[d] : 1;
        } else {
            sh[i] = a->shape[j];
            st[i] = a->strides[j++];
        }
    }
    return record_plain(sr__tensor_alias(a, a->ndim + 1, sh, st, a->offset), &unsqueeze_ops, a);
}

SR_API sr_tensor *sr_expand(sr_tensor *a, int ndim, const int64_t *shape)
{
    if (!a)
        return NULL;
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    if (ndim < a->ndim || ndim > SR_MAX_DIMS || (ndim && !shape)) {
        sr__fail(-EINVAL, "sr_expand", "cannot expand shape %s to %d dims", sr__shape_str(a->ndim, a->shape, b1),
                 ndim);
        return NULL;
    }
    int64_t sh[SR_MAX_DIMS], st[SR_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        int j = i - (ndim - a->ndim);
        int64_t have = j >= 0 ? a->shape[j] : 1, want = shape[i] == -1 && j >= 0 ? have : shape[i];
        if (want < 0 || (have != want && have != 1)) {
            sr__fail(-EINVAL, "sr_expand", "shape %s cannot be expanded to %s", sr__shape_str(a->ndim, a->shape, b1),
                     sr__shape_str(ndim, shape, b2));
            return NULL;
        }
        sh[i] = want;
        st[i] = j >= 0 && have == want ? a->strides[j] : 0;
    }
    if (sr__check_shape("sr_expand", ndim, sh)) /* its element count must not overflow either */
        return NULL;
    return record_plain(sr__tensor_alias(a, ndim, sh, st, a->offset), &expand_ops, a);
}

SR_API sr_tensor *sr_detach(sr_tensor *a)
{
    return a ? sr__tensor_alias(a, a->ndim, a->shape, a->strides, a->offset) : NULL;
}

SR_API sr_tensor *sr_clone(sr_tensor *a)
{
    SR_OP_SPAN("clone");
    if (!a)
        return NULL;
    sr_tensor *out = sr__tensor_new("sr_clone", a->dtype, a->ndim, a->shape);
    if (out)
        sr__copy_raw(out, a);
    return record_plain(out, &clone_ops, a);
}

SR_API sr_tensor *sr_contiguous(sr_tensor *a)
{
    SR_OP_SPAN("contiguous");
    if (a && sr_tensor_is_contiguous(a))
        return sr_tensor_ref(a);
    return sr_clone(a);
}
