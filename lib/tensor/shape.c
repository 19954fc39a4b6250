/* SPDX-License-Identifier: MIT */
/* Shape checks, broadcasting, and the shape text used in error messages. */
#include <errno.h>
#include <stdio.h>

#include "error.h"
#include "tensor_impl.h"

/* Element counts stay below 2^62 so that byte sizes and offsets cannot overflow. */
#define MAX_NUMEL ((int64_t)1 << 50)

const char *sr__shape_str(int ndim, const int64_t *shape, char *buf)
{
    size_t at = 0;
    buf[at++] = '[';
    for (int i = 0; i < ndim && at < SR_SHAPE_STR - 24; i++)
        at += (size_t)snprintf(buf + at, SR_SHAPE_STR - at, i ? ", %lld" : "%lld", (long long)shape[i]);
    snprintf(buf + at, SR_SHAPE_STR - at, "]");
    return buf;
}

const char *sr__tensor_shape_str(const sr_tensor *t, char *buf) { return sr__shape_str(t->ndim, t->shape, buf); }

int sr__check_dtype(const char *fn, sr_dtype dt)
{
    if (dt != SR_F32 && dt != SR_F64 && dt != SR_I64)
        return sr__fail(-EINVAL, fn, "unknown dtype %d", (int)dt);
    return 0;
}

int sr__check_shape(const char *fn, int ndim, const int64_t *shape)
{
    if (ndim < 0 || ndim > SR_MAX_DIMS)
        return sr__fail(-EINVAL, fn, "ndim %d is out of range [0, %d]", ndim, SR_MAX_DIMS);
    if (ndim > 0 && !shape)
        return sr__fail(-EINVAL, fn, "shape is NULL for ndim %d", ndim);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return sr__fail(-EINVAL, fn, "dimension %d has negative size %lld", i, (long long)shape[i]);
        if (shape[i] > 0 && n > MAX_NUMEL / shape[i])
            return sr__fail(-EINVAL, fn, "too many elements (dimension %d of size %lld)", i,
                            (long long)shape[i]);
        n *= shape[i];
    }
    return 0;
}

int sr__check_same_dtype(const char *fn, const sr_tensor *a, const sr_tensor *b)
{
    if (a->dtype != b->dtype)
        return sr__fail(-EINVAL, fn, "dtypes %s and %s do not match", sr_dtype_name(a->dtype),
                        sr_dtype_name(b->dtype));
    return 0;
}

int sr__check_float(const char *fn, const sr_tensor *a)
{
    if (a->dtype == SR_I64)
        return sr__fail(-EINVAL, fn, "dtype i64 is not supported (f32 or f64 needed)");
    return 0;
}

int sr__wrap_dim(const char *fn, int dim, int ndim)
{
    int n = ndim > 0 ? ndim : 1; /* a 0-d tensor accepts dim 0 and -1, as in PyTorch */
    if (dim < -n || dim >= n)
        return sr__fail(-EINVAL, fn, "dimension %d is out of range for a %d-d tensor", dim, ndim);
    return dim < 0 ? dim + n : dim;
}

int sr__broadcast_shapes(const char *fn, int na, const int64_t *sa, int nb, const int64_t *sb, int *out_ndim,
                         int64_t *out)
{
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = na - n + i, ib = nb - n + i;
        int64_t da = ia >= 0 ? sa[ia] : 1, db = ib >= 0 ? sb[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
            return sr__fail(-EINVAL, fn, "shapes %s and %s cannot be broadcast", sr__shape_str(na, sa, b1),
                            sr__shape_str(nb, sb, b2));
        }
        out[i] = da == 1 ? db : da;
    }
    *out_ndim = n;
    return 0;
}

void sr__broadcast_strides(const sr_tensor *t, int ndim, const int64_t *shape, int64_t *strides)
{
    for (int i = 0; i < ndim; i++) {
        int it = t->ndim - ndim + i;
        strides[i] = (it < 0 || (t->shape[it] == 1 && shape[i] != 1)) ? 0 : t->strides[it];
    }
}

bool sr__same_shape(const sr_tensor *a, const sr_tensor *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}
