/* SPDX-License-Identifier: MIT */
/* cat and stack (copies) and split / chunk (views), with backward. split is
 * one node with one output per piece, so the pieces' gradients meet in a
 * single buffer instead of one zero-padded tensor per piece. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/engine.h"
#include "error.h"
#include "tensor_impl.h"

struct cat_node {
    sr_node base;
    int dim;
    int64_t sizes[]; /* one per input, along dim */
};

static int cat_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct cat_node *n = (struct cat_node *)node;
    int64_t at = 0;
    for (uint32_t i = 0; i < node->num_next; i++) {
        if (sr__node_needs_grad(node, i) && !(out[i] = sr_narrow(in[0], n->dim, at, n->sizes[i])))
            return -EINVAL;
        at += n->sizes[i];
    }
    return 0;
}

static const sr_node_ops cat_ops = {.name = "CatBackward0", .apply = cat_apply};

/* -EINVAL unless ts[0..n) can be concatenated along dim (already wrapped). */
static int check_cat(const char *fn, sr_tensor *const *ts, size_t n, int dim)
{
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    for (size_t i = 0; i < n; i++) {
        if (sr__check_same_dtype(fn, ts[0], ts[i]))
            return -EINVAL;
        bool ok = ts[i]->ndim == ts[0]->ndim;
        for (int d = 0; ok && d < ts[0]->ndim; d++)
            ok = d == dim || ts[i]->shape[d] == ts[0]->shape[d];
        if (!ok)
            return sr__fail(-EINVAL, fn, "shapes %s (entry 0) and %s (entry %zu) differ outside dimension %d",
                            sr__shape_str(ts[0]->ndim, ts[0]->shape, b1), sr__shape_str(ts[i]->ndim, ts[i]->shape, b2),
                            i, dim);
    }
    return 0;
}

static int check_list(const char *fn, sr_tensor *const *ts, size_t n)
{
    if (!ts || n == 0)
        return sr__fail(-EINVAL, fn, "expected a non-empty list of tensors");
    for (size_t i = 0; i < n; i++)
        if (!ts[i])
            return -EINVAL; /* a failed op upstream already said why */
    return 0;
}

static sr_tensor *record_cat(sr_tensor *out, sr_tensor *const *ts, size_t n, int dim)
{
    if (!out || !sr__any_requires_grad(ts, n))
        return out;
    struct cat_node *node = (struct cat_node *)sr__node_for_inputs(
        &cat_ops, sizeof(struct cat_node) + n * sizeof(int64_t), ts, n, 1, 0);
    if (node) {
        node->dim = dim;
        for (size_t i = 0; i < n; i++)
            node->sizes[i] = ts[i]->shape[dim];
    }
    return sr__attach(out, (sr_node *)node);
}

SR_API sr_tensor *sr_cat(sr_tensor *const *ts, size_t n, int dim)
{
    SR_OP_SPAN("cat");
    if (check_list("sr_cat", ts, n))
        return NULL;
    if (ts[0]->ndim == 0) {
        sr__fail(-EINVAL, "sr_cat", "zero-dimensional tensor (at position 0) cannot be concatenated");
        return NULL;
    }
    int d = sr__wrap_dim("sr_cat", dim, ts[0]->ndim);
    if (d < 0 || check_cat("sr_cat", ts, n, d))
        return NULL;
    int64_t shape[SR_MAX_DIMS];
    memcpy(shape, ts[0]->shape, sizeof(shape));
    shape[d] = 0;
    for (size_t i = 0; i < n; i++)
        shape[d] += ts[i]->shape[d];
    sr_tensor *out = sr__tensor_new("sr_cat", ts[0]->dtype, ts[0]->ndim, shape);
    int64_t at = 0;
    for (size_t i = 0; out && i < n; i++) {
        int64_t sh[SR_MAX_DIMS];
        memcpy(sh, out->shape, sizeof(sh));
        sh[d] = ts[i]->shape[d];
        sr_tensor *slot = sr__tensor_alias(out, out->ndim, sh, out->strides, at * out->strides[d]);
        if (!slot) {
            sr_tensor_unref(out);
            return NULL;
        }
        sr__copy_raw(slot, ts[i]);
        sr_tensor_unref(slot);
        at += ts[i]->shape[d];
    }
    return record_cat(out, ts, n, d);
}

SR_API sr_tensor *sr_stack(sr_tensor *const *ts, size_t n, int dim)
{
    SR_OP_SPAN("stack");
    if (check_list("sr_stack", ts, n))
        return NULL;
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    for (size_t i = 1; i < n; i++) {
        if (!sr__same_shape(ts[i], ts[0])) {
            sr__fail(-EINVAL, "sr_stack", "stack expects each tensor to be equal size, but got %s at entry 0 and %s "
                     "at entry %zu", sr__shape_str(ts[0]->ndim, ts[0]->shape, b1),
                     sr__shape_str(ts[i]->ndim, ts[i]->shape, b2), i);
            return NULL;
        }
    }
    int d = sr__wrap_dim("sr_stack", dim, ts[0]->ndim + 1);
    if (d < 0)
        return NULL;
    sr_tensor **u = calloc(n, sizeof(*u));
    if (!u) {
        sr__fail(-ENOMEM, "sr_stack", "out of memory for %zu tensors", n);
        return NULL;
    }
    sr_tensor *out = NULL;
    size_t made = 0;
    while (made < n && (u[made] = sr_unsqueeze(ts[made], d)))
        made++;
    if (made == n)
        out = sr_cat(u, n, d);
    for (size_t i = 0; i < made; i++)
        sr_tensor_unref(u[i]);
    free(u);
    return out;
}

struct split_node {
    sr_node base;
    int nd, dim;
    int64_t shape[SR_MAX_DIMS]; /* the input's */
    int64_t split_size;
};

/* Gradients of the pieces laid side by side; missing ones are zero. */
static int split_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct split_node *n = (struct split_node *)node;
    sr_tensor *any = NULL;
    for (uint32_t i = 0; i < node->num_inputs && !any; i++)
        any = in[i];
    sr_tensor *g = sr_zeros(any->dtype, n->nd, n->shape, 0);
    for (uint32_t i = 0; g && i < node->num_inputs; i++) {
        if (!in[i])
            continue;
        int64_t start = (int64_t)i * n->split_size;
        sr_tensor *slot = sr_narrow(g, n->dim, start, in[i]->shape[n->dim]);
        if (!slot) {
            sr_tensor_unref(g);
            return -EINVAL;
        }
        sr__copy_raw(slot, in[i]);
        sr_tensor_unref(slot);
    }
    out[0] = g;
    return g ? 0 : -ENOMEM;
}

static const sr_node_ops split_ops = {.name = "SplitBackward0", .apply = split_apply};

static int record_split(sr_tensor *a, sr_tensor **out, int count, int dim, int64_t split_size)
{
    if (!sr__any_requires_grad(&a, 1))
        return count;
    struct split_node *n = (struct split_node *)sr__node_for_inputs(&split_ops, sizeof(*n), &a, 1, (uint32_t)count, 0);
    if (!n) {
        for (int i = 0; i < count; i++)
            sr_tensor_unref(out[i]);
        return -ENOMEM;
    }
    n->nd = a->ndim;
    n->dim = dim;
    memcpy(n->shape, a->shape, sizeof(n->shape));
    n->split_size = split_size;
    for (int i = 0; i < count; i++)
        sr__tensor_set_history(out[i], &n->base, (uint32_t)i);
    sr__node_unref(&n->base);
    return count;
}

SR_API int sr_split(sr_tensor *a, int64_t split_size, int dim, sr_tensor **out)
{
    if (!a)
        return sr__fail(-EINVAL, "sr_split", "tensor is NULL");
    if (a->ndim == 0)
        return sr__fail(-EINVAL, "sr_split", "split expects at least a 1-dimensional tensor");
    int d = sr__wrap_dim("sr_split", dim, a->ndim);
    if (d < 0)
        return d;
    int64_t size = a->shape[d];
    if (split_size <= 0 && !(split_size == 0 && size == 0))
        return sr__fail(-EINVAL, "sr_split", "split_size %lld must be positive", (long long)split_size);
    /* ceil(size / split_size) without size + split_size - 1, which overflows for a huge split_size */
    int64_t count = split_size ? size / split_size + (size % split_size != 0) : 1;
    if (count == 0)
        count = 1;
    if (count > (1 << 20))
        return sr__fail(-EINVAL, "sr_split", "%lld pieces are too many", (long long)count);
    if (!out)
        return (int)count;
    for (int64_t i = 0; i < count; i++) {
        int64_t start = i * split_size, len = size - start < split_size ? size - start : split_size;
        int64_t sh[SR_MAX_DIMS];
        memcpy(sh, a->shape, sizeof(sh));
        sh[d] = len;
        out[i] = sr__tensor_alias(a, a->ndim, sh, a->strides, a->offset + start * a->strides[d]);
        if (!out[i]) {
            while (i-- > 0)
                sr_tensor_unref(out[i]);
            return -ENOMEM;
        }
    }
    return record_split(a, out, (int)count, d, split_size);
}

SR_API int sr_chunk(sr_tensor *a, int chunks, int dim, sr_tensor **out)
{
    if (chunks <= 0)
        return sr__fail(-EINVAL, "sr_chunk", "chunk expects `chunks` to be greater than 0, got: %d", chunks);
    if (!a || a->ndim == 0)
        return sr_split(a, 1, dim, out);
    int d = sr__wrap_dim("sr_chunk", dim, a->ndim);
    if (d < 0)
        return d;
    int64_t size = a->shape[d], split_size = (size + chunks - 1) / chunks;
    return sr_split(a, split_size ? split_size : 1, d, out);
}
