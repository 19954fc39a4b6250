/* SPDX-License-Identifier: MIT */
/* Strided N-d loops over up to four operands, and typed loads and stores.
 * Elementwise kernels work on the innermost dimension a row at a time; the
 * loop walks the outer dimensions with an odometer. Dims of size 1 are
 * dropped and dims that are contiguous for every operand are merged first,
 * so contiguous operands become a single row. */
#include <string.h>

#include "tensor_impl.h"

static void coalesce(struct sr_loop *L)
{
    int nd = 0;
    for (int d = 0; d < L->ndim; d++) {
        if (L->shape[d] == 1)
            continue;
        bool merge = nd > 0;
        for (int i = 0; i < L->nops && merge; i++)
            merge = L->stride[i][nd - 1] == L->stride[i][d] * L->shape[d];
        if (merge) {
            L->shape[nd - 1] *= L->shape[d];
            for (int i = 0; i < L->nops; i++)
                L->stride[i][nd - 1] = L->stride[i][d];
            continue;
        }
        L->shape[nd] = L->shape[d];
        for (int i = 0; i < L->nops; i++)
            L->stride[i][nd] = L->stride[i][d];
        nd++;
    }
    L->ndim = nd;
}

/* The (checked) data of the block operand i is read from: the thread's explicit pin of its storage
 * (an in-place op pinned its sources before its write lock), the current one
 * for a written operand (the caller owns it or holds its write lock), else a
 * reference the loop takes now (once per storage) and drops in
 * sr__loop_done. */
static char *operand_data(struct sr_loop *L, const sr_tensor *const *ts, int i, int nout)
{
    const struct sr_storage *s = ts[i]->storage;
    for (int j = 0; j < nout; j++)
        if (j == i || ts[j]->storage == s)
            return s->data;
    char *data;
    if (sr__storage_pinned(s, &data))
        return data;
    for (int j = 0; j < L->nheld; j++)
        if (L->held_storage[j] == s)
            return L->held_data[j];
    L->held_storage[L->nheld] = s;
    L->held[L->nheld] = sr__storage_block_ref(ts[i]->storage, &L->held_data[L->nheld]);
    return L->held_data[L->nheld++];
}

void sr__loop_init(struct sr_loop *L, int ndim, const int64_t *shape, int nops, int nout,
                   const sr_tensor *const *ts)
{
    memset(L, 0, sizeof(*L));
    L->ndim = ndim;
    L->nops = nops;
    for (int d = 0; d < ndim; d++)
        L->shape[d] = shape[d];
    for (int i = 0; i < nops; i++) {
        int64_t st[SR_MAX_DIMS];
        sr__broadcast_strides(ts[i], ndim, shape, st);
        int64_t es = (int64_t)sr_dtype_size(ts[i]->dtype);
        for (int d = 0; d < ndim; d++)
            L->stride[i][d] = st[d] * es;
        L->base[i] = operand_data(L, ts, i, nout) + ts[i]->offset * es;
    }
    coalesce(L);
}

void sr__loop_done(struct sr_loop *L)
{
    for (int j = 0; j < L->nheld; j++)
        sr__block_unref(L->held[j]);
    L->nheld = 0;
}

void sr__loop_run(struct sr_loop *L, sr_inner_fn fn, void *ctx)
{
    char *p[SR_LOOP_MAX_OPS], *q[SR_LOOP_MAX_OPS];
    int64_t inner_stride[SR_LOOP_MAX_OPS] = {0};
    if (sr__numel(L->ndim, L->shape) == 0)
        return;
    memcpy(p, L->base, sizeof(p));
    if (L->ndim == 0) {
        fn(p, inner_stride, 1, ctx);
        return;
    }
    int last = L->ndim - 1;
    for (int i = 0; i < L->nops; i++)
        inner_stride[i] = L->stride[i][last];
    int64_t idx[SR_MAX_DIMS] = {0};
    for (;;) {
        memcpy(q, p, sizeof(q));
        fn(q, inner_stride, L->shape[last], ctx);
        int d = last - 1;
        for (; d >= 0; d--) {
            for (int i = 0; i < L->nops; i++)
                p[i] += L->stride[i][d];
            if (++idx[d] < L->shape[d])
                break;
            for (int i = 0; i < L->nops; i++)
                p[i] -= L->stride[i][d] * L->shape[d];
            idx[d] = 0;
        }
        if (d < 0)
            return;
    }
}

void sr__load_f64(double *dst, const char *src, int64_t stride, int64_t n, sr_dtype dt)
{
    switch (dt) {
    case SR_F32:
        if (stride == (int64_t)sizeof(float)) /* dense: a loop the compiler vectorises */
            for (int64_t k = 0; k < n; k++)
                dst[k] = ((const float *)src)[k];
        else
            for (int64_t k = 0; k < n; k++)
                dst[k] = *(const float *)(src + k * stride);
        break;
    case SR_F64:
        for (int64_t k = 0; k < n; k++)
            dst[k] = *(const double *)(src + k * stride);
        break;
    case SR_I64:
        for (int64_t k = 0; k < n; k++)
            dst[k] = (double)*(const int64_t *)(src + k * stride);
        break;
    }
}

void sr__store_f64(char *dst, int64_t stride, const double *src, int64_t n, sr_dtype dt)
{
    switch (dt) {
    case SR_F32:
        if (stride == (int64_t)sizeof(float)) /* dense: a loop the compiler vectorises */
            for (int64_t k = 0; k < n; k++)
                ((float *)dst)[k] = (float)src[k];
        else
            for (int64_t k = 0; k < n; k++)
                *(float *)(dst + k * stride) = (float)src[k];
        break;
    case SR_F64:
        for (int64_t k = 0; k < n; k++)
            *(double *)(dst + k * stride) = src[k];
        break;
    case SR_I64: /* out of range (and NaN) becomes INT64_MIN, as on x86, without UB */
        for (int64_t k = 0; k < n; k++)
            *(int64_t *)(dst + k * stride) = src[k] >= -0x1p63 && src[k] < 0x1p63 ? (int64_t)src[k] : INT64_MIN;
        break;
    }
}

void sr__load_i64(int64_t *dst, const char *src, int64_t stride, int64_t n, sr_dtype dt)
{
    if (dt != SR_I64) {
        double buf[256];
        for (int64_t k = 0; k < n; k += 256) {
            int64_t m = n - k < 256 ? n - k : 256;
            sr__load_f64(buf, src + k * stride, stride, m, dt);
            for (int64_t j = 0; j < m; j++)
                dst[k + j] = buf[j] >= -0x1p63 && buf[j] < 0x1p63 ? (int64_t)buf[j] : INT64_MIN;
        }
        return;
    }
    for (int64_t k = 0; k < n; k++)
        dst[k] = *(const int64_t *)(src + k * stride);
}

void sr__store_i64(char *dst, int64_t stride, const int64_t *src, int64_t n, sr_dtype dt)
{
    if (dt != SR_I64) {
        for (int64_t k = 0; k < n; k++) {
            double v = (double)src[k];
            sr__store_f64(dst + k * stride, stride, &v, 1, dt);
        }
        return;
    }
    for (int64_t k = 0; k < n; k++)
        *(int64_t *)(dst + k * stride) = src[k];
}

struct copy_ctx {
    sr_dtype dst, src;
};

/* n elements of `es` bytes (4 or 8), strided: each a copy of a constant
 * size, which the compiler turns into one load and one store (a copy of
 * `es` bytes, a variable, was a call to memmove per element: a transposed
 * gradient made dense spent most of its time in those calls). */
static void copy_strided(char *dst, int64_t sd, const char *src, int64_t ss, int64_t n, size_t es)
{
    if (es == 4)
        for (int64_t k = 0; k < n; k++)
            memcpy(dst + k * sd, src + k * ss, 4);
    else
        for (int64_t k = 0; k < n; k++)
            memcpy(dst + k * sd, src + k * ss, 8);
}

static void copy_row(char **p, const int64_t *s, int64_t n, void *vctx)
{
    struct copy_ctx *c = vctx;
    size_t es = sr_dtype_size(c->src);
    if (c->dst == c->src && s[0] == (int64_t)es && s[1] == (int64_t)es) {
        memcpy(p[0], p[1], (size_t)n * es);
    } else if (c->dst == c->src) {
        copy_strided(p[0], s[0], p[1], s[1], n, es);
    } else if (c->dst == SR_I64 || c->src == SR_I64) {
        for (int64_t k = 0; k < n; k++) {
            int64_t v;
            sr__load_i64(&v, p[1] + k * s[1], 0, 1, c->src);
            sr__store_i64(p[0] + k * s[0], 0, &v, 1, c->dst);
        }
    } else {
        for (int64_t k = 0; k < n; k++) {
            double v;
            sr__load_f64(&v, p[1] + k * s[1], 0, 1, c->src);
            sr__store_f64(p[0] + k * s[0], 0, &v, 1, c->dst);
        }
    }
}

void sr__copy_raw(sr_tensor *dst, const sr_tensor *src)
{
    struct sr_loop L;
    const sr_tensor *ops[2] = {dst, src};
    sr__loop_init(&L, dst->ndim, dst->shape, 2, 1, ops);
    struct copy_ctx c = {dst->dtype, src->dtype};
    sr__loop_run(&L, copy_row, &c);
    sr__loop_done(&L);
}
