/* SPDX-License-Identifier: MIT */
/* layer_norm's row kernels and node, shared by norm.c (layer_norm and its
 * fused relu) and norm_pool.c (layer_norm, relu and a 2 x 2 max pool in
 * one op); internal to lib/tensor. The arithmetic is documented at the top
 * of norm.c. Every kernel is static inline: a file instantiates what it
 * calls. */
#ifndef SR_NORM_IMPL_H
#define SR_NORM_IMPL_H

#if !defined(SR__IN_TENSOR)
#error "norm_impl.h is private to the tensor layer (docs/ARCHITECTURE.md)"
#endif
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "autograd/engine.h"
#include "tensor_impl.h"

struct ln_rows {
    int64_t m, d;
};

enum { LN_VEC = 16, LN_BLOCK = 256, LN_ROWS = 32 }; /* bytes per vector; elements; rows */

/* The per-row constants of backward. */
struct ln_coef {
    double mean, rstd, a, c; /* a = mean(dxhat), c = mean(dxhat xhat) */
};

/* The sums use GCC/clang vector types (an SSE register on plain
 * x86-64) so that they vectorise without -ffast-math; memcpy makes the
 * unaligned loads and stores. */
#define DEFINE_LN(T, IT, SUFFIX)                                                                               \
    typedef T vec_##SUFFIX __attribute__((vector_size(LN_VEC)));                                               \
    typedef IT ivec_##SUFFIX __attribute__((vector_size(LN_VEC)));                                             \
    enum { VL_##SUFFIX = LN_VEC / sizeof(T) };                                                                 \
    /* g where y > 0, else 0 (relu's gradient; a NaN y gives 0) */                                             \
    static inline vec_##SUFFIX relu_mask_##SUFFIX(vec_##SUFFIX g, vec_##SUFFIX y)                              \
    {                                                                                                          \
        vec_##SUFFIX z = {0};                                                                                  \
        return (vec_##SUFFIX)((ivec_##SUFFIX)g & (ivec_##SUFFIX)(y > z));                                      \
    }                                                                                                          \
    static inline vec_##SUFFIX ld_##SUFFIX(const T *p)                                                         \
    {                                                                                                          \
        vec_##SUFFIX v;                                                                                        \
        memcpy(&v, p, sizeof(v));                                                                              \
        return v;                                                                                              \
    }                                                                                                          \
    static inline vec_##SUFFIX splat_##SUFFIX(T s)                                                             \
    {                                                                                                          \
        vec_##SUFFIX v;                                                                                        \
        for (int k = 0; k < VL_##SUFFIX; k++)                                                                  \
            v[k] = s;                                                                                          \
        return v;                                                                                              \
    }                                                                                                          \
    static inline double hsum_##SUFFIX(vec_##SUFFIX v)                                                         \
    {                                                                                                          \
        double s = 0.0;                                                                                        \
        for (int k = 0; k < VL_##SUFFIX; k++)                                                                  \
            s += v[k];                                                                                         \
        return s;                                                                                              \
    }                                                                                                          \
    /* *s1 += sum over n (<= LN_BLOCK) of x[j] - shift, *s2 += that of its square: one pass */                 \
    static inline void block_sums_##SUFFIX(const T *x, T shift, int64_t n, double *s1, double *s2)             \
    {                                                                                                          \
        vec_##SUFFIX p0 = {0}, p1 = {0}, q0 = {0}, q1 = {0}, sh = splat_##SUFFIX(shift);                       \
        int64_t j = 0;                                                                                         \
        for (; j + 2 * VL_##SUFFIX <= n; j += 2 * VL_##SUFFIX) {                                               \
            vec_##SUFFIX v0 = ld_##SUFFIX(x + j) - sh, v1 = ld_##SUFFIX(x + j + VL_##SUFFIX) - sh;             \
            p0 += v0, p1 += v1;                                                                                \
            q0 += v0 * v0, q1 += v1 * v1;                                                                      \
        }                                                                                                      \
        double a = hsum_##SUFFIX(p0 + p1), c = hsum_##SUFFIX(q0 + q1);                                         \
        for (; j < n; j++) {                                                                                   \
            double e = (double)x[j] - shift;                                                                   \
            a += e, c += e * e;                                                                                \
        }                                                                                                      \
        *s1 += a, *s2 += c;                                                                                    \
    }                                                                                                          \
    /* A row's mean and rstd in one pass: the sums of x - k and of its square, k the row's first block's       \
     * mean (so that k is near the mean and the variance, s2 / d - (s1 / d)^2, loses little to the             \
     * subtraction). */                                                                                        \
    static inline void row_stats_##SUFFIX(const T *x, int64_t d, double eps, double *mean, double *rstd)       \
    {                                                                                                          \
        int64_t n0 = d < LN_BLOCK ? d : LN_BLOCK;                                                              \
        double s1 = 0.0, s2 = 0.0;                                                                             \
        block_sums_##SUFFIX(x, 0, n0, &s1, &s2);                                                               \
        T k = (T)(s1 / (double)n0);                                                                            \
        s1 = s2 = 0.0;                                                                                         \
        for (int64_t j = 0; j < d; j += LN_BLOCK)                                                              \
            block_sums_##SUFFIX(x + j, k, d - j < LN_BLOCK ? d - j : LN_BLOCK, &s1, &s2);                      \
        double dm = s1 / (double)d, var = s2 / (double)d - dm * dm;                                            \
        *mean = k + dm;                                                                                        \
        *rstd = 1.0 / sqrt((var > 0 ? var : 0) + eps);                                                         \
    }                                                                                                          \
    /* One row's output: (x - m) s w + b (without w or b where NULL), relu'd when relu, in vectors: the        \
     * same operations in the same order as element by element. */                                             \
    static inline void ln_out_##SUFFIX(const T *x, const T *w, const T *b, T *y, T m, T s, bool relu,          \
                                       int64_t n)                                                              \
    {                                                                                                          \
        vec_##SUFFIX vm = splat_##SUFFIX(m), vs = splat_##SUFFIX(s), z = {0};                                  \
        int64_t j = 0;                                                                                         \
        for (; j + VL_##SUFFIX <= n; j += VL_##SUFFIX) {                                                       \
            vec_##SUFFIX v = (ld_##SUFFIX(x + j) - vm) * vs;                                                   \
            v = w ? v * ld_##SUFFIX(w + j) : v;                                                                \
            v = b ? v + ld_##SUFFIX(b + j) : v;                                                                \
            v = relu ? (vec_##SUFFIX)((ivec_##SUFFIX)v & (ivec_##SUFFIX)(v > z)) : v;                          \
            memcpy(y + j, &v, sizeof(v));                                                                      \
        }                                                                                                      \
        for (; j < n; j++) {                                                                                   \
            T v = (x[j] - m) * s;                                                                              \
            v = w ? v * w[j] : v;                                                                              \
            v = b ? v + b[j] : v;                                                                              \
            y[j] = relu && !(v > 0) ? (T)0 : v;                                                                \
        }                                                                                                      \
    }                                                                                                          \
    /* y = xhat * w + b per row (relu'd when relu); stats[2 i] = mean, stats[2 i + 1] = rstd. */               \
    /* One row of y = xhat * w + b (relu'd when relu); st[0] = its mean, st[1] = its rstd. */                  \
    static inline void ln_row_fwd_##SUFFIX(const T *x, int64_t d, double eps, const T *restrict w,             \
                                           const T *restrict b, T *restrict y, double *st, bool relu)          \
    {                                                                                                          \
        double mean, rstd;                                                                                     \
        row_stats_##SUFFIX(x, d, eps, &mean, &rstd);                                                           \
        st[0] = mean;                                                                                          \
        st[1] = rstd;                                                                                          \
        T m = (T)mean, s = (T)rstd;                                                                            \
        if (w && b) /* constant flags at each call: one specialised loop each */                               \
            relu ? ln_out_##SUFFIX(x, w, b, y, m, s, true, d) : ln_out_##SUFFIX(x, w, b, y, m, s, false, d);   \
        else if (w)                                                                                            \
            relu ? ln_out_##SUFFIX(x, w, NULL, y, m, s, true, d)                                               \
                 : ln_out_##SUFFIX(x, w, NULL, y, m, s, false, d);                                             \
        else if (b)                                                                                            \
            relu ? ln_out_##SUFFIX(x, NULL, b, y, m, s, true, d)                                               \
                 : ln_out_##SUFFIX(x, NULL, b, y, m, s, false, d);                                             \
        else                                                                                                   \
            relu ? ln_out_##SUFFIX(x, NULL, NULL, y, m, s, true, d)                                            \
                 : ln_out_##SUFFIX(x, NULL, NULL, y, m, s, false, d);                                          \
    }                                                                                                          \
    /* y = xhat * w + b per row (relu'd when relu); stats[2 i] = mean, stats[2 i + 1] = rstd. */               \
    static inline void ln_fwd_##SUFFIX(struct ln_rows r, double eps, const T *x, const T *restrict w,          \
                                       const T *restrict b, T *restrict y, double *stats, bool relu)           \
    {                                                                                                          \
        for (int64_t i = 0; i < r.m; i++, x += r.d, y += r.d)                                                  \
            ln_row_fwd_##SUFFIX(x, r.d, eps, w, b, y, stats + 2 * i, relu);                                    \
    }                                                                                                          \
    /* One block (n <= LN_BLOCK) of a row: dw += dy xhat, db += dy; returns the block's sum of dxhat,          \
     * *c its sum of dxhat xhat. With y (the fused relu's output; else NULL), dy is first masked where         \
     * y <= 0. has_w and relu are constants at each call. */                                                   \
    static inline double ln_bwd_block_##SUFFIX(const T *x, const T *w, const T *dy, const T *y, bool has_w,    \
                                               bool relu, T m, T s, T *dw, T *db, int64_t n, double *c)        \
    {                                                                                                          \
        vec_##SUFFIX pa = {0}, pc = {0}, vm = splat_##SUFFIX(m), vs = splat_##SUFFIX(s);                       \
        int64_t j = 0;                                                                                         \
        for (; j + VL_##SUFFIX <= n; j += VL_##SUFFIX) {                                                       \
            vec_##SUFFIX g = ld_##SUFFIX(dy + j), xh = (ld_##SUFFIX(x + j) - vm) * vs;                         \
            g = relu ? relu_mask_##SUFFIX(g, ld_##SUFFIX(y + j)) : g;                                          \
            vec_##SUFFIX vw = ld_##SUFFIX(dw + j) + g * xh, vb = ld_##SUFFIX(db + j) + g;                      \
            memcpy(dw + j, &vw, sizeof(vw));                                                                   \
            memcpy(db + j, &vb, sizeof(vb));                                                                   \
            g = has_w ? g * ld_##SUFFIX(w + j) : g;                                                            \
            pa += g;                                                                                           \
            pc += g * xh;                                                                                      \
        }                                                                                                      \
        double a = hsum_##SUFFIX(pa), cc = hsum_##SUFFIX(pc);                                                  \
        for (; j < n; j++) {                                                                                   \
            T d = relu && !(y[j] > 0) ? (T)0 : dy[j], xh = (x[j] - m) * s, g = has_w ? d * w[j] : d;           \
            dw[j] += d * xh;                                                                                   \
            db[j] += d;                                                                                        \
            a += g;                                                                                            \
            cc += (double)g * xh;                                                                              \
        }                                                                                                      \
        *c = cc;                                                                                               \
        return a;                                                                                              \
    }                                                                                                          \
    /* dx = rstd (dxhat - a - xhat c) for one row (dy masked by y > 0 with the fused relu's y), in vectors;    \
     * has_w and relu are constants at each call. */                                                           \
    static inline __attribute__((always_inline)) void ln_dx_run_##SUFFIX(                                      \
        const T *restrict x, const T *restrict w, const T *restrict dy, const T *restrict y, bool has_w,       \
        bool relu, struct ln_coef k, T *restrict dx, int64_t n)                                                \
    {                                                                                                          \
        T m = (T)k.mean, s = (T)k.rstd, a = (T)k.a, c = (T)k.c;                                                \
        vec_##SUFFIX vm = splat_##SUFFIX(m), vs = splat_##SUFFIX(s), va = splat_##SUFFIX(a),                   \
                     vc = splat_##SUFFIX(c), one = splat_##SUFFIX(1);                                          \
        int64_t j = 0;                                                                                         \
        for (; j + VL_##SUFFIX <= n; j += VL_##SUFFIX) {                                                       \
            vec_##SUFFIX d = ld_##SUFFIX(dy + j);                                                              \
            d = relu ? relu_mask_##SUFFIX(d, ld_##SUFFIX(y + j)) : d;                                          \
            vec_##SUFFIX r =                                                                                   \
                vs * (d * (has_w ? ld_##SUFFIX(w + j) : one) - va - (ld_##SUFFIX(x + j) - vm) * vs * vc);      \
            memcpy(dx + j, &r, sizeof(r));                                                                     \
        }                                                                                                      \
        for (; j < n; j++) {                                                                                   \
            T d = relu && !(y[j] > 0) ? (T)0 : dy[j];                                                          \
            dx[j] = s * (d * (has_w ? w[j] : (T)1) - a - (x[j] - m) * s * c);                                  \
        }                                                                                                      \
    }                                                                                                          \
    static inline void ln_dx_##SUFFIX(const T *restrict x, const T *restrict w, const T *restrict dy,          \
                                      const T *restrict y, struct ln_coef k, T *restrict dx, int64_t n)        \
    {                                                                                                          \
        if (w && y)                                                                                            \
            ln_dx_run_##SUFFIX(x, w, dy, y, true, true, k, dx, n);                                             \
        else if (y)                                                                                            \
            ln_dx_run_##SUFFIX(x, NULL, dy, y, false, true, k, dx, n);                                         \
        else if (w)                                                                                            \
            ln_dx_run_##SUFFIX(x, w, dy, NULL, true, false, k, dx, n);                                         \
        else                                                                                                   \
            ln_dx_run_##SUFFIX(x, NULL, dy, NULL, false, false, k, dx, n);                                     \
    }                                                                                                          \
    /* One row's a and c (struct ln_coef), adding its dy xhat and dy into dwr and dbr. */                      \
    static inline void ln_row_sums_##SUFFIX(struct ln_rows r, const T *x, const T *w, const T *dy,            \
                                            const T *y, struct ln_coef *k, T *dwr, T *dbr)                     \
    {                                                                                                          \
        T m = (T)k->mean, s = (T)k->rstd;                                                                      \
        for (int64_t j = 0; j < r.d; j += LN_BLOCK) {                                                          \
            int64_t n = r.d - j < LN_BLOCK ? r.d - j : LN_BLOCK;                                               \
            const T *yj = y ? y + j : NULL, *wj = w ? w + j : NULL;                                            \
            double c;                                                                                          \
            if (w && y)                                                                                        \
                k->a += ln_bwd_block_##SUFFIX(x + j, wj, dy + j, yj, true, true, m, s, dwr + j, dbr + j, n, &c); \
            else if (y)                                                                                        \
                k->a += ln_bwd_block_##SUFFIX(x + j, NULL, dy + j, yj, false, true, m, s, dwr + j, dbr + j, n, \
                                              &c);                                                             \
            else if (w)                                                                                        \
                k->a += ln_bwd_block_##SUFFIX(x + j, wj, dy + j, NULL, true, false, m, s, dwr + j, dbr + j, n, \
                                              &c);                                                             \
            else                                                                                               \
                k->a += ln_bwd_block_##SUFFIX(x + j, NULL, dy + j, NULL, false, false, m, s, dwr + j, dbr + j, \
                                              n, &c);                                                          \
            k->c += c;                                                                                         \
        }                                                                                                      \
        k->a /= (double)r.d;                                                                                   \
        k->c /= (double)r.d;                                                                                   \
    }                                                                                                          \
    /* After row i of r: every LN_ROWS rows, and after the last, the partial sums dwr and dbr go into          \
     * the double sums dw and db, and are zeroed. */                                                           \
    static inline void ln_rows_flush_##SUFFIX(struct ln_rows r, int64_t i, T *dwr, T *dbr, double *dw,         \
                                              double *db)                                                      \
    {                                                                                                          \
        if ((i + 1) % LN_ROWS && i + 1 < r.m)                                                                  \
            return;                                                                                            \
        for (int64_t j = 0; j < r.d; j++) {                                                                    \
            dw[j] += dwr[j], db[j] += dbr[j];                                                                  \
            dwr[j] = dbr[j] = 0;                                                                               \
        }                                                                                                      \
    }                                                                                                          \
    /* dx (if not NULL) per row; dw, db (zeroed) the double sums over rows, with rows added LN_ROWS at         \
     * a time into dwr, dbr (d elements each, zeroed); y: the fused relu's output, or NULL. */                 \
    static inline void ln_bwd_##SUFFIX(struct ln_rows r, const T *x, const T *w, const T *dy, const T *y,      \
                                       const double *stats, T *dx, double *dw, double *db, T *dwr, T *dbr)     \
    {                                                                                                          \
        for (int64_t i = 0; i < r.m; i++, x += r.d, dy += r.d, y = y ? y + r.d : NULL) {                       \
            struct ln_coef k = {.mean = stats[2 * i], .rstd = stats[2 * i + 1]};                               \
            ln_row_sums_##SUFFIX(r, x, w, dy, y, &k, dwr, dbr);                                                \
            if (dx)                                                                                            \
                ln_dx_##SUFFIX(x, w, dy, y, k, dx + i * r.d, r.d);                                             \
            ln_rows_flush_##SUFFIX(r, i, dwr, dbr, dw, db);                                                    \
        }                                                                                                      \
    }
DEFINE_LN(float, int32_t, f32)
DEFINE_LN(double, int64_t, f64)

struct ln_node {
    sr_node base;
    struct ln_rows r;
    bool relu;                  /* relu(layer_norm): its output saved too */
    int nd;                     /* the normalized shape: weight's and bias's */
    int64_t shape[SR_MAX_DIMS];
};

/* sr_layer_norm's checks of x, the normalized shape, weight and bias:
 * 0, or -EINVAL naming what is wrong (sr__fail). */
int sr__ln_check(const sr_tensor *x, int nd, const int64_t *shape, const sr_tensor *w, const sr_tensor *b);
/* Contiguous tensors to read (new references, pinned); NULL entries stay NULL. */
int sr__ln_open_inputs(sr_tensor *const *in, sr_tensor **c, const char **p, int n);
void sr__ln_close_inputs(sr_tensor **c, int n);
/* A new tensor of the normalized shape from the double sums. */
sr_tensor *sr__ln_param_grad(const struct ln_node *n, sr_dtype dt, const double *acc);
/* Backward's scratch (norm.c, ln_scratch): dw, db (double) and their
 * LN_ROWS-row partial sums dwr, dbr in the dtype, d each, zeroed. */
sr_block *sr__ln_scratch(int64_t d, size_t elem, double **dw, double **db, char **dwr, char **dbr);
/* What a backward kernel writes: dx (NULL when x needs no gradient), the
 * double sums dw, db and their partial sums dwr, dbr (sr__ln_scratch). */
struct ln_bufs {
    char *dx, *dwr, *dbr;
    double *dw, *db;
};
typedef int (*sr__ln_bwd_fn)(const struct ln_bufs *b, void *arg);
/* A layer norm node's gradients (out[0] dx, out[1] dweight, out[2] dbias,
 * each NULL where not needed): the buffers, then bwd(b, arg) fills them
 * (0 or -errno), then the parameter gradients from the double sums. x: the
 * saved input (dtype and shape). */
int sr__ln_grads(const struct ln_node *n, const sr_tensor *x, sr__ln_bwd_fn bwd, void *arg, sr_tensor **out);

#endif
