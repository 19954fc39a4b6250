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
    /* *s1 += sum over n (<= LN_BLOCK) of x[j] - shift, *s2 += that of its square: one pass */              \
    static inline void block_sums_##SUFFIX(const T *x, T shift, int64_t n, double *s1, double *s2)            \
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
    /* A row's mean and rstd in one pass: the sums of x - k and of its square, k the row's first block's   \
     * mean (so that k is near the mean and the variance, s2 / d - (s1 / d)^2, loses little to the          \
     * subtraction). */                                                                                        \
    static void row_stats_##SUFFIX(const T *x, int64_t d, double eps, double *mean, double *rstd)             \
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
    /* One row's output: (x - m) s w + b (without w or b where NULL), relu'd when relu, in vectors: the      \
     * same operations in the same order as element by element. */                                           \
    static inline void ln_out_##SUFFIX(const T *x, const T *w, const T *b, T *y, T m, T s, bool relu,         \
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
    /* y = xhat * w + b per row (relu'd when relu); stats[2 i] = mean, stats[2 i + 1] = rstd. */              \
    static void ln_fwd_##SUFFIX(struct ln_rows r, double eps, const T *x, const T *restrict w,                 \
                                const T *restrict b, T *restrict y, double *stats, bool relu)                  \
    {                                                                                                          \
        for (int64_t i = 0; i < r.m; i++, x += r.d, y += r.d) {                                                \
            double mean, rstd;                                                                                 \
            row_stats_##SUFFIX(x, r.d, eps, &mean, &rstd);                                                     \
            stats[2 * i] = mean;                                                                               \
            stats[2 * i + 1] = rstd;                                                                           \
            T m = (T)mean, s = (T)rstd;                                                                        \
            if (w && b) /* constant flags at each call: one specialised loop each */                           \
                relu ? ln_out_##SUFFIX(x, w, b, y, m, s, true, r.d) : ln_out_##SUFFIX(x, w, b, y, m, s, false, r.d); \
            else if (w)                                                                                        \
                relu ? ln_out_##SUFFIX(x, w, NULL, y, m, s, true, r.d)                                         \
                     : ln_out_##SUFFIX(x, w, NULL, y, m, s, false, r.d);                                       \
            else if (b)                                                                                        \
                relu ? ln_out_##SUFFIX(x, NULL, b, y, m, s, true, r.d)                                         \
                     : ln_out_##SUFFIX(x, NULL, b, y, m, s, false, r.d);                                       \
            else                                                                                               \
                relu ? ln_out_##SUFFIX(x, NULL, NULL, y, m, s, true, r.d)                                      \
                     : ln_out_##SUFFIX(x, NULL, NULL, y, m, s, false, r.d);                                    \
        }                                                                                                      \
    }                                                                                                          \
    /* One block (n <= LN_BLOCK) of a row: dw += dy xhat, db += dy; returns the block's sum of dxhat,          \
     * *c its sum of dxhat xhat. With y (the fused relu's output; else NULL), dy is first masked where        \
     * y <= 0. has_w and relu are constants at each call. */                                                  \
    static inline double ln_bwd_block_##SUFFIX(const T *x, const T *w, const T *dy, const T *y, bool has_w,   \
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
            T d = relu && !(y[j] > 0) ? (T)0 : dy[j], xh = (x[j] - m) * s, g = has_w ? d * w[j] : d;          \
            dw[j] += d * xh;                                                                                   \
            db[j] += d;                                                                                        \
            a += g;                                                                                            \
            cc += (double)g * xh;                                                                              \
        }                                                                                                      \
        *c = cc;                                                                                               \
        return a;                                                                                              \
    }                                                                                                          \
    /* dx = rstd (dxhat - a - xhat c) for one row (dy masked by y > 0 with the fused relu's y). */             \
    static void ln_dx_##SUFFIX(const T *restrict x, const T *restrict w, const T *restrict dy,                 \
                               const T *restrict y, struct ln_coef k, T *restrict dx, int64_t n)               \
    {                                                                                                          \
        T m = (T)k.mean, s = (T)k.rstd, a = (T)k.a, c = (T)k.c;                                                \
        if (y) { /* in vectors: the compiler makes a branch of the select */                                 \
            vec_##SUFFIX vm = splat_##SUFFIX(m), vs = splat_##SUFFIX(s), va = splat_##SUFFIX(a),              \
                         vc = splat_##SUFFIX(c), one = splat_##SUFFIX(1);                                      \
            int64_t j = 0;                                                                                     \
            for (; j + VL_##SUFFIX <= n; j += VL_##SUFFIX) {                                                   \
                vec_##SUFFIX d = relu_mask_##SUFFIX(ld_##SUFFIX(dy + j), ld_##SUFFIX(y + j));                  \
                vec_##SUFFIX r = vs * (d * (w ? ld_##SUFFIX(w + j) : one) - va -                               \
                                       (ld_##SUFFIX(x + j) - vm) * vs * vc);                                   \
                memcpy(dx + j, &r, sizeof(r));                                                                 \
            }                                                                                                  \
            for (; j < n; j++) {                                                                               \
                T d = y[j] > 0 ? dy[j] : (T)0;                                                                 \
                dx[j] = s * (d * (w ? w[j] : (T)1) - a - (x[j] - m) * s * c);                                  \
            }                                                                                                  \
        } else if (w)                                                                                          \
            for (int64_t j = 0; j < n; j++)                                                                    \
                dx[j] = s * (dy[j] * w[j] - a - (x[j] - m) * s * c);                                           \
        else                                                                                                   \
            for (int64_t j = 0; j < n; j++)                                                                    \
                dx[j] = s * (dy[j] - a - (x[j] - m) * s * c);                                                  \
    }                                                                                                          \
    /* One row's a and c (struct ln_coef), adding its dy xhat and dy into dwr and dbr. */                      \
    static void ln_row_sums_##SUFFIX(struct ln_rows r, const T *x, const T *w, const T *dy, const T *y,       \
                                     struct ln_coef *k, T *dwr, T *dbr)                                        \
    {                                                                                                          \
        T m = (T)k->mean, s = (T)k->rstd;                                                                      \
        for (int64_t j = 0; j < r.d; j += LN_BLOCK) {                                                          \
            int64_t n = r.d - j < LN_BLOCK ? r.d - j : LN_BLOCK;                                               \
            const T *yj = y ? y + j : NULL, *wj = w ? w + j : NULL;                                            \
            double c;                                                                                          \
            if (w && y)                                                                                        \
                k->a += ln_bwd_block_##SUFFIX(x + j, wj, dy + j, yj, true, true, m, s, dwr + j, dbr + j, n, &c); \
            else if (y)                                                                                        \
                k->a += ln_bwd_block_##SUFFIX(x + j, NULL, dy + j, yj, false, true, m, s, dwr + j, dbr + j, n,  \
                                              &c);                                                             \
            else if (w)                                                                                        \
                k->a += ln_bwd_block_##SUFFIX(x + j, wj, dy + j, NULL, true, false, m, s, dwr + j, dbr + j, n, \
                                              &c);                                                             \
            else                                                                                               \
                k->a += ln_bwd_block_##SUFFIX(x + j, NULL, dy + j, NULL, false, false, m, s, dwr + j, dbr + j,  \
                                              n, &c);                                                          \
            k->c += c;                                                                                         \
        }                                                                                                      \
        k->a /= (double)r.d;                                                                                   \
        k->c /= (double)r.d;                                                                                   \
    }                                                                                                          \
    /* dx (if not NULL) per row; dw, db (zeroed) the double sums over rows, with rows added LN_ROWS at         \
     * a time into dwr, dbr (d elements each, zeroed); y: the fused relu's output, or NULL. */                 \
    static void ln_bwd_##SUFFIX(struct ln_rows r, const T *x, const T *w, const T *dy, const T *y,             \
                                const double *stats, T *dx, double *dw, double *db, T *dwr, T *dbr)            \
    {                                                                                                          \
        for (int64_t i = 0; i < r.m; i++, x += r.d, dy += r.d, y = y ? y + r.d : NULL) {                       \
            struct ln_coef k = {.mean = stats[2 * i], .rstd = stats[2 * i + 1]};                               \
            ln_row_sums_##SUFFIX(r, x, w, dy, y, &k, dwr, dbr);                                                \
            if (dx)                                                                                            \
                ln_dx_##SUFFIX(x, w, dy, y, k, dx + i * r.d, r.d);                                             \
            if ((i + 1) % LN_ROWS && i + 1 < r.m)                                                              \
                continue;                                                                                      \
            for (int64_t j = 0; j < r.d; j++) {                                                                \
                dw[j] += dwr[j], db[j] += dbr[j];                                                              \
                dwr[j] = dbr[j] = 0;                                                                           \
            }                                                                                                  \
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

/* Contiguous tensors to read (new references, pinned); NULL entries stay NULL. */
static int open_inputs(sr_tensor *const *in, sr_tensor **c, const char **p, int n)
{
    int rc = 0;
    for (int i = 0; i < n; i++) {
        c[i] = in[i] && !rc ? sr_contiguous(in[i]) : NULL;
        p[i] = c[i] ? sr__tensor_pin(c[i]) : NULL;
        rc = in[i] && !c[i] ? -ENOMEM : rc;
    }
    return rc;
}

static void close_inputs(sr_tensor **c, int n)
{
    for (int i = 0; i < n; i++)
        if (c[i]) {
            sr__tensor_unpin(c[i]);
            sr_tensor_unref(c[i]);
        }
}

/* A new tensor of the normalized shape from the double sums. */
static sr_tensor *param_grad(const struct ln_node *n, sr_dtype dt, const double *acc)
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
 * private block; ln_grads owns it for the call and drops it at the end. */
static sr_block *ln_scratch(int64_t d, size_t elem, double **dw, double **db, char **dwr, char **dbr)
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

static int ln_grads(struct ln_node *n, sr_tensor *const *saved, const char *const *p, sr_tensor **out)
{
    struct ln_rows r = n->r;
    bool need[3] = {sr__node_needs_grad(&n->base, 0), sr__node_needs_grad(&n->base, 1),
                    sr__node_needs_grad(&n->base, 2)};
    sr_dtype dt = saved[0]->dtype;
    double *dw, *db;
    char *dwr, *dbr;
    sr_block *blk = ln_scratch(r.d, sr_dtype_size(dt), &dw, &db, &dwr, &dbr);
    sr_tensor *dx = need[0] ? sr__tensor_new("sr_layer_norm", dt, saved[0]->ndim, saved[0]->shape) : NULL;
    if (!blk || (need[0] && !dx)) {
        if (blk)
            sr__block_unref(blk);
        sr_tensor_unref(dx);
        return -ENOMEM;
    }
    const double *stats = (const double *)p[2];
    if (dt == SR_F64)
        ln_bwd_f64(r, (const double *)p[0], (const double *)p[1], (const double *)p[3], (const double *)p[4],
                   stats, dx ? (double *)sr__tensor_new_data(dx) : NULL, dw, db, (double *)dwr, (double *)dbr);
    else
        ln_bwd_f32(r, (const float *)p[0], (const float *)p[1], (const float *)p[3], (const float *)p[4], stats,
                   dx ? (float *)sr__tensor_new_data(dx) : NULL, dw, db, (float *)dwr, (float *)dbr);
    out[0] = dx;
    out[1] = need[1] ? param_grad(n, dt, dw) : NULL;
    out[2] = need[2] ? param_grad(n, dt, db) : NULL;
    sr__block_unref(blk);
    return (need[1] && !out[1]) || (need[2] && !out[2]) ? -ENOMEM : 0;
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
    rc = open_inputs(src, c, p, 5);
    if (!rc)
        rc = ln_grads((struct ln_node *)node, saved, p, out);
    close_inputs(c, 5);
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
    if (!*stats || open_inputs(src, c, p, 3)) {
        close_inputs(c, 3);
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
    close_inputs(c, 3);
    return out;
}

static sr_tensor *layer_norm(sr_tensor *x, int ndim, const int64_t *normalized_shape, sr_tensor *weight,
                             sr_tensor *bias, double eps, bool relu)
{
    if (!x || check_norm(x, ndim, normalized_shape, weight, bias))
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
