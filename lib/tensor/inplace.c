/* SPDX-License-Identifier: MIT */
/* In-place writes. Each one checks its operands and allocates what it needs,
 * pins the operands it reads from other storages, then holds the storage's
 * write lock from the copy-on-write check to the end of the write
 * (sr__tensor_write_begin_from / _end_from, tensor_impl.h), so that a
 * concurrent encoder, snapshot or reader of the storage sees all of the
 * write or none of it, and the operands read keep the values they had when
 * the write began. */
#include <errno.h>
#include <string.h>

#include "error.h"
#include "kernels.h"
#include "tensor_impl.h"

/* other must broadcast to t's shape without changing it, in t's dtype. */
static int check_operand(const char *fn, const sr_tensor *t, const sr_tensor *other)
{
    if (!other)
        return sr__fail(-EINVAL, fn, "operand is NULL");
    if (sr__check_same_dtype(fn, t, other))
        return -EINVAL;
    int nd;
    int64_t shape[SR_MAX_DIMS];
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    if (sr__broadcast_shapes(fn, t->ndim, t->shape, other->ndim, other->shape, &nd, shape) || nd != t->ndim ||
        memcmp(shape, t->shape, (size_t)nd * sizeof(int64_t)))
        return sr__fail(-EINVAL, fn, "shape %s cannot be broadcast to %s", sr__shape_str(other->ndim, other->shape, b1),
                        sr__shape_str(t->ndim, t->shape, b2));
    return 0;
}

/* Begins the write of t reading src[0..n): on 0 the caller writes, then
 * calls sr__tensor_write_end_from(t, src, n). */
static int start(const char *fn, sr_tensor *t, const sr_tensor *const *src, int n)
{
    if (!t)
        return sr__fail(-EINVAL, fn, "tensor is NULL");
    return sr__tensor_write_begin_from(t, fn, src, n);
}

SR_API int sr_fill_(sr_tensor *t, double value)
{
    SR_OP_SPAN("fill_");
    if (!t)
        return start("sr_fill_", t, NULL, 0);
    int rc = sr__check_scalar("sr_fill_", t, value);
    if (rc)
        return rc;
    sr_tensor *v = sr_scalar_tensor(t->dtype, value, 0);
    if (!v)
        return -ENOMEM;
    const sr_tensor *src[1] = {v};
    if (!(rc = start("sr_fill_", t, src, 1))) {
        sr__copy_raw(t, v);
        sr__tensor_write_end_from(t, src, 1);
    }
    sr_tensor_unref(v);
    return rc;
}

SR_API int sr_zero_(sr_tensor *t)
{
    SR_OP_SPAN("zero_");
    return sr_fill_(t, 0.0);
}

SR_API int sr_copy_(sr_tensor *dst, const sr_tensor *src)
{
    SR_OP_SPAN("copy_");
    int nd;
    int64_t shape[SR_MAX_DIMS];
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    if (!dst || !src)
        return sr__fail(-EINVAL, "sr_copy_", "tensor is NULL");
    if (sr__broadcast_shapes("sr_copy_", dst->ndim, dst->shape, src->ndim, src->shape, &nd, shape) ||
        nd != dst->ndim || memcmp(shape, dst->shape, (size_t)nd * sizeof(int64_t)))
        return sr__fail(-EINVAL, "sr_copy_", "shape %s cannot be broadcast to %s", sr__shape_str(src->ndim, src->shape, b1),
                        sr__shape_str(dst->ndim, dst->shape, b2));
    const sr_tensor *srcs[1] = {src};
    int rc = start("sr_copy_", dst, srcs, 1);
    if (!rc) {
        sr__copy_raw(dst, src);
        sr__tensor_write_end_from(dst, srcs, 1);
    }
    return rc;
}

static int binary_(const char *fn, sr_tensor *t, const sr_tensor *other, enum sr_binop op, double alpha)
{
    int rc = t ? check_operand(fn, t, other) : 0;
    if (!rc && t && op == SR_BIN_ADD)
        rc = sr__check_scalar(fn, t, alpha);
    const sr_tensor *src[1] = {other};
    if (rc || (rc = start(fn, t, src, 1)))
        return rc;
    sr__binary_into(t, t, other, op, alpha);
    sr__tensor_write_end_from(t, src, 1);
    return 0;
}

SR_API int sr_add_(sr_tensor *t, const sr_tensor *other, double alpha)
{
    SR_OP_SPAN("add_");
    return binary_("sr_add_", t, other, SR_BIN_ADD, alpha);
}

SR_API int sr_mul_(sr_tensor *t, const sr_tensor *other)
{
    SR_OP_SPAN("mul_");
    return binary_("sr_mul_", t, other, SR_BIN_MUL, 1.0);
}

static int scalar_(const char *fn, sr_tensor *t, double s, enum sr_binop op)
{
    if (!t)
        return sr__fail(-EINVAL, fn, "tensor is NULL");
    int rc = sr__check_scalar(fn, t, s);
    sr_tensor *v = rc ? NULL : sr_scalar_tensor(t->dtype, s, 0);
    if (!rc && !v)
        rc = -ENOMEM;
    if (!rc)
        rc = binary_(fn, t, v, op, 1.0);
    sr_tensor_unref(v);
    return rc;
}

SR_API int sr_add_scalar_(sr_tensor *t, double s)
{
    SR_OP_SPAN("add_scalar_");
    return scalar_("sr_add_scalar_", t, s, SR_BIN_ADD);
}
SR_API int sr_mul_scalar_(sr_tensor *t, double s)
{
    SR_OP_SPAN("mul_scalar_");
    return scalar_("sr_mul_scalar_", t, s, SR_BIN_MUL);
}

static double addcmul_fn(const double *x, const void *arg) { return x[0] + *(const double *)arg * x[1] * x[2]; }
static double addcdiv_fn(const double *x, const void *arg) { return x[0] + *(const double *)arg * x[1] / x[2]; }

static int ternary_(const char *fn, sr_tensor *t, const sr_tensor *a, const sr_tensor *b, sr_map_fn f, double value)
{
    int rc = t ? sr__check_float(fn, t) : 0;
    if (!rc && t)
        rc = check_operand(fn, t, a);
    if (!rc && t)
        rc = check_operand(fn, t, b);
    const sr_tensor *src[2] = {a, b};
    if (rc || (rc = start(fn, t, src, 2)))
        return rc;
    sr__map_into(t, (sr_tensor *[]){t, (sr_tensor *)a, (sr_tensor *)b}, 3, f, &value);
    sr__tensor_write_end_from(t, src, 2);
    return 0;
}

SR_API int sr_addcmul_(sr_tensor *t, const sr_tensor *a, const sr_tensor *b, double value)
{
    SR_OP_SPAN("addcmul_");
    return ternary_("sr_addcmul_", t, a, b, addcmul_fn, value);
}

SR_API int sr_addcdiv_(sr_tensor *t, const sr_tensor *a, const sr_tensor *b, double value)
{
    SR_OP_SPAN("addcdiv_");
    return ternary_("sr_addcdiv_", t, a, b, addcdiv_fn, value);
}
