/* SPDX-License-Identifier: MIT */
/* relu(layer_norm(x)) and then max_pool2d with a 2 x 2 window, stride 2 and
 * no padding, in one op (sr__layer_norm_relu_pool, tensor_seam.h): a CNN's
 * norm, activation and pooling, as sequential models chain them.
 *
 * Apart, the three ops write the norm's output (the batch's size), read it
 * back to pool it, keep an int64 index per pooled value, and in backward
 * zero and scatter a gradient of the batch's size, which relu's mask and
 * the norm then read again. Here each row (a sample: the normalized
 * shape's d elements, whole planes) is normalised into a scratch row that
 * stays in cache and pooled from there; only the pooled values go out,
 * with one byte per window saying which of its four elements won (WIN_*)
 * or that its maximum is 0, so that relu passes no gradient (WIN_NONE).
 * Backward spreads a row's pooled gradient over a scratch row (each window's
 * winner gets it, its other elements 0) and runs layer_norm's two passes on
 * it (norm_impl.h).
 *
 * The results are the three ops', bit for bit: the forward computes each
 * element as layer_norm with the fused relu does and takes the first
 * maximum of each window in max_pool2d's order; in backward, the scratch
 * row holds, element for element, what relu's backward of max_pool2d's
 * gradient is (0 + dy at the winner where its value is > 0, +0 elsewhere),
 * and layer_norm's passes do the same operations on it in the same order.
 * A relu'd value is never NaN (relu's select makes a NaN 0), so the window
 * needs no NaN rule.
 *
 * Shapes other than [N, C, H, W] with the norm over [C, H, W] or [H, W] and
 * H, W >= 2 run the ops apart. */
#include <errno.h>
#include <string.h>

#include "autograd/engine.h"
#include "error.h"
#include "norm_impl.h"
#include "tensor_impl.h"

enum { WIN_NONE = 4 }; /* 0 top left, 1 top right, 2 bottom left, 3 bottom right */

struct lnp_geom {
    int64_t planes, h, w, oh, ow; /* per row: planes of h x w, pooled to oh x ow */
};

#define DEFINE_LNP(T, IT, SUFFIX, VL, EVEN, ODD, LO, HI)                                                       \
    typedef T lv_##SUFFIX __attribute__((vector_size(VL * sizeof(T))));                                        \
    typedef IT lm_##SUFFIX __attribute__((vector_size(VL * sizeof(T))));                                       \
    static inline lv_##SUFFIX lld_##SUFFIX(const T *p)                                                         \
    {                                                                                                          \
        lv_##SUFFIX v;                                                                                         \
        memcpy(&v, p, sizeof(v));                                                                              \
        return v;                                                                                              \
    }                                                                                                          \
    /* candidate v (code c) replaces (*m, *k) where it is greater */                                           \
    static inline void ltake_##SUFFIX(lv_##SUFFIX v, IT c, lv_##SUFFIX *m, lm_##SUFFIX *k)                     \
    {                                                                                                          \
        lm_##SUFFIX t = v > *m;                                                                                \
        *m = (lv_##SUFFIX)(((lm_##SUFFIX)v & t) | ((lm_##SUFFIX)*m & ~t));                                     \
        *k = (*k & ~t) | (c & t);                                                                              \
    }                                                                                                          \
    /* outputs ox .. ox + VL - 1 of a plane's output row from its input rows r0, r1 */                         \
    static inline void lnp_vec_##SUFFIX(const T *r0, const T *r1, int64_t ox, T *out, uint8_t *code)           \
    {                                                                                                          \
        lv_##SUFFIX t0 = lld_##SUFFIX(r0 + 2 * ox), t1 = lld_##SUFFIX(r0 + 2 * ox + VL);                       \
        lv_##SUFFIX b0 = lld_##SUFFIX(r1 + 2 * ox), b1 = lld_##SUFFIX(r1 + 2 * ox + VL);                       \
        lv_##SUFFIX m = __builtin_shufflevector(t0, t1, SR__LNP_UNPAREN EVEN);                                 \
        lm_##SUFFIX k = {0};                                                                                   \
        ltake_##SUFFIX(__builtin_shufflevector(t0, t1, SR__LNP_UNPAREN ODD), 1, &m, &k);                       \
        ltake_##SUFFIX(__builtin_shufflevector(b0, b1, SR__LNP_UNPAREN EVEN), 2, &m, &k);                      \
        ltake_##SUFFIX(__builtin_shufflevector(b0, b1, SR__LNP_UNPAREN ODD), 3, &m, &k);                       \
        memcpy(out + ox, &m, sizeof(m));                                                                       \
        for (int l = 0; l < VL; l++)                                                                           \
            code[ox + l] = m[l] > 0 ? (uint8_t)k[l] : WIN_NONE;                                                \
    }                                                                                                          \
    /* one output of a plane row narrower than VL, in lane 0 */                                                \
    static inline void lnp_one_##SUFFIX(const T *r0, const T *r1, int64_t ox, T *out, uint8_t *code)           \
    {                                                                                                          \
        lv_##SUFFIX m = {r0[2 * ox]};                                                                          \
        lm_##SUFFIX k = {0};                                                                                   \
        ltake_##SUFFIX((lv_##SUFFIX){r0[2 * ox + 1]}, 1, &m, &k);                                              \
        ltake_##SUFFIX((lv_##SUFFIX){r1[2 * ox]}, 2, &m, &k);                                                  \
        ltake_##SUFFIX((lv_##SUFFIX){r1[2 * ox + 1]}, 3, &m, &k);                                              \
        out[ox] = m[0];                                                                                        \
        code[ox] = m[0] > 0 ? (uint8_t)k[0] : WIN_NONE;                                                        \
    }                                                                                                          \
    /* One row's planes, relu'd and normalised in y, pooled into out and code. A plane row's last              \
     * outputs, when not a whole vector, are its last VL (some computed twice, the same way). */               \
    static void lnp_pool_##SUFFIX(const struct lnp_geom *g, const T *y, T *out, uint8_t *code)                 \
    {                                                                                                          \
        for (int64_t p = 0; p < g->planes; p++, y += g->h * g->w)                                              \
            for (int64_t oy = 0; oy < g->oh; oy++, out += g->ow, code += g->ow) {                              \
                const T *r0 = y + 2 * oy * g->w, *r1 = r0 + g->w;                                              \
                int64_t ox = 0;                                                                                \
                for (; ox + VL <= g->ow; ox += VL)                                                             \
                    lnp_vec_##SUFFIX(r0, r1, ox, out, code);                                                   \
                if (ox < g->ow && g->ow >= VL)                                                                 \
                    lnp_vec_##SUFFIX(r0, r1, g->ow - VL, out, code);                                           \
                for (; g->ow < VL && ox < g->ow; ox++)                                                         \
                    lnp_one_##SUFFIX(r0, r1, ox, out, code);                                                   \
            }                                                                                                  \
    }                                                                                                          \
    /* VL windows from ox on: their winners get 0 + dp (max_pool2d's backward adds dp into a zeroed dx),       \
     * the other elements +0, written as two runs of 2 VL, one per input row. */                               \
    static inline void lnp_spread_vec_##SUFFIX(const T *dp, const uint8_t *code, int64_t ox, T *r0, T *r1)     \
    {                                                                                                          \
        lm_##SUFFIX c;                                                                                         \
        for (int l = 0; l < VL; l++)                                                                           \
            c[l] = code[ox + l];                                                                               \
        lv_##SUFFIX z = {0}, v = z + lld_##SUFFIX(dp + ox);                                                    \
        lm_##SUFFIX bits = (lm_##SUFFIX)v;                                                                     \
        lv_##SUFFIX tl = (lv_##SUFFIX)(bits & (c == 0)), tr = (lv_##SUFFIX)(bits & (c == 1));                  \
        lv_##SUFFIX bl = (lv_##SUFFIX)(bits & (c == 2)), br = (lv_##SUFFIX)(bits & (c == 3));                  \
        lv_##SUFFIX t0 = __builtin_shufflevector(tl, tr, SR__LNP_UNPAREN LO),                                  \
                    t1 = __builtin_shufflevector(tl, tr, SR__LNP_UNPAREN HI);                                  \
        lv_##SUFFIX b0 = __builtin_shufflevector(bl, br, SR__LNP_UNPAREN LO),                                  \
                    b1 = __builtin_shufflevector(bl, br, SR__LNP_UNPAREN HI);                                  \
        memcpy(r0 + 2 * ox, &t0, sizeof(t0));                                                                  \
        memcpy(r0 + 2 * ox + VL, &t1, sizeof(t1));                                                             \
        memcpy(r1 + 2 * ox, &b0, sizeof(b0));                                                                  \
        memcpy(r1 + 2 * ox + VL, &b1, sizeof(b1));                                                             \
    }                                                                                                          \
    /* The pooled gradient dp of one row spread over its scratch row gy, every pooled element written          \
     * (what a window does not cover, an odd last row or column, stays the +0 it was zeroed to). A             \
     * plane row's last windows, when not a whole vector, are its last VL (written twice, the same). */        \
    static void lnp_spread_##SUFFIX(const struct lnp_geom *g, const T *dp, const uint8_t *code, T *gy)         \
    {                                                                                                          \
        for (int64_t p = 0; p < g->planes; p++, gy += g->h * g->w)                                             \
            for (int64_t oy = 0; oy < g->oh; oy++, dp += g->ow, code += g->ow) {                               \
                T *r0 = gy + 2 * oy * g->w, *r1 = r0 + g->w;                                                   \
                int64_t ox = 0;                                                                                \
                for (; ox + VL <= g->ow; ox += VL)                                                             \
                    lnp_spread_vec_##SUFFIX(dp, code, ox, r0, r1);                                             \
                if (ox < g->ow && g->ow >= VL)                                                                 \
                    lnp_spread_vec_##SUFFIX(dp, code, g->ow - VL, r0, r1);                                     \
                for (; g->ow < VL && ox < g->ow; ox++)                                                         \
                    for (int c = 0; c < 4; c++)                                                                \
                        (c < 2 ? r0 : r1)[2 * ox + c % 2] = code[ox] == c ? (T)0 + dp[ox] : (T)0;              \
            }                                                                                                  \
    }                                                                                                          \
    static void lnp_fwd_##SUFFIX(const struct lnp_geom *g, struct ln_rows r, double eps, const T *x,           \
                                 const T *w, const T *b, T *yrow, T *out, uint8_t *code, double *stats)        \
    {                                                                                                          \
        int64_t per = g->planes * g->oh * g->ow;                                                               \
        for (int64_t i = 0; i < r.m; i++, x += r.d, out += per, code += per) {                                 \
            ln_row_fwd_##SUFFIX(x, r.d, eps, w, b, yrow, stats + 2 * i, true);                                 \
            lnp_pool_##SUFFIX(g, yrow, out, code);                                                             \
        }                                                                                                      \
    }                                                                                                          \
    static void lnp_bwd_##SUFFIX(const struct lnp_geom *g, struct ln_rows r, const T *x, const T *w,           \
                                 const T *dp, const uint8_t *code, const double *stats, T *gy, T *dx,          \
                                 double *dw, double *db, T *dwr, T *dbr)                                       \
    {                                                                                                          \
        int64_t per = g->planes * g->oh * g->ow;                                                               \
        for (int64_t i = 0; i < r.m; i++, x += r.d, dp += per, code += per) {                                  \
            struct ln_coef k = {.mean = stats[2 * i], .rstd = stats[2 * i + 1]};                               \
            lnp_spread_##SUFFIX(g, dp, code, gy);                                                              \
            ln_row_sums_##SUFFIX(r, x, w, gy, NULL, &k, dwr, dbr);                                             \
            if (dx)                                                                                            \
                ln_dx_##SUFFIX(x, w, gy, NULL, k, dx + i * r.d, r.d);                                          \
            ln_rows_flush_##SUFFIX(r, i, dwr, dbr, dw, db);                                                    \
        }                                                                                                      \
    }
#define SR__LNP_UNPAREN(...) __VA_ARGS__
DEFINE_LNP(float, int32_t, f32, 4, (0, 2, 4, 6), (1, 3, 5, 7), (0, 4, 1, 5), (2, 6, 3, 7))
DEFINE_LNP(double, int64_t, f64, 2, (0, 2), (1, 3), (0, 2), (1, 3))

/* The layer norm's node (ln: rows, normalized shape) and the planes' geometry.
 * saved: 0 x, 1 weight (or none), 2 stats [M, 2] f64, 3 the window codes
 * (bytes, in an int64 tensor). */
struct lnp_node {
    struct ln_node ln;
    struct lnp_geom g;
};

/* A scratch row of d elements of size elem (a shared-heap block in a worker), zeroed if zero. */
static sr_block *scratch_row(int64_t d, size_t elem, bool zero)
{
    size_t bytes = (size_t)d * elem;
    sr_block *blk = sr__block_alloc(bytes ? bytes : 1);
    if (blk && zero)
        memset(sr__block_data(blk), 0, bytes);
    return blk;
}

/* The fused op's kernel for sr__ln_grads; arg: lnp_args. */
struct lnp_args {
    const struct lnp_node *n;
    const char *const *p; /* 0 x, 1 weight, 2 stats, 3 codes, 4 the pooled gradient */
    sr_dtype dt;
};

static int lnp_bwd(const struct ln_bufs *b, void *arg)
{
    const struct lnp_args *a = arg;
    const char *const *p = a->p;
    struct ln_rows r = a->n->ln.r;
    sr_block *row = scratch_row(r.d, sr_dtype_size(a->dt), true);
    if (!row)
        return -ENOMEM;
    const double *stats = (const double *)p[2];
    const uint8_t *code = (const uint8_t *)p[3];
    char *gy = sr__block_data(row);
    if (a->dt == SR_F64)
        lnp_bwd_f64(&a->n->g, r, (const double *)p[0], (const double *)p[1], (const double *)p[4], code, stats,
                    (double *)gy, (double *)b->dx, b->dw, b->db, (double *)b->dwr, (double *)b->dbr);
    else
        lnp_bwd_f32(&a->n->g, r, (const float *)p[0], (const float *)p[1], (const float *)p[4], code, stats,
                    (float *)gy, (float *)b->dx, b->dw, b->db, (float *)b->dwr, (float *)b->dbr);
    sr__block_unref(row);
    return 0;
}

static int lnp_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    sr_tensor *saved[4] = {NULL};
    int rc = 0;
    for (uint32_t i = 0; !rc && i < 4; i++)
        rc = sr__node_saved(node, i, &saved[i]);
    if (rc)
        return rc;
    sr_tensor *c[5] = {NULL}, *src[5] = {saved[0], saved[1], saved[2], saved[3], in[0]};
    const char *p[5];
    rc = sr__ln_open_inputs(src, c, p, 5);
    struct lnp_args a = {(struct lnp_node *)node, p, saved[0]->dtype};
    if (!rc)
        rc = sr__ln_grads(&a.n->ln, saved[0], lnp_bwd, &a, out);
    sr__ln_close_inputs(c, 5);
    return rc;
}

static const sr_node_ops lnp_ops = {.name = "LayerNormReluMaxPool2DBackward0", .apply = lnp_apply};

/* The pooled output, the rows' stats and the windows' codes; NULL on -ENOMEM. */
static sr_tensor *lnp_forward(sr_tensor *x, const struct lnp_geom *g, struct ln_rows r, sr_tensor *w, sr_tensor *b,
                              double eps, sr_tensor **stats, sr_tensor **codes)
{
    int64_t shape[4] = {x->shape[0], x->shape[1], x->shape[2] / 2, x->shape[3] / 2};
    int64_t nout = r.m * g->planes * g->oh * g->ow;
    size_t elem = sr_dtype_size(x->dtype);
    sr_tensor *out = sr__tensor_new("sr_layer_norm", x->dtype, 4, shape);
    *stats = out ? sr__tensor_new("sr_layer_norm", SR_F64, 2, (const int64_t[]){r.m, 2}) : NULL;
    *codes = *stats ? sr__tensor_new("sr_layer_norm", SR_I64, 1, (const int64_t[]){(nout + 7) / 8}) : NULL;
    sr_block *row = *codes ? scratch_row(r.d, elem, false) : NULL;
    sr_tensor *c[3] = {NULL}, *src[3] = {x, w, b};
    const char *p[3];
    if (!row || sr__ln_open_inputs(src, c, p, 3)) {
        sr__ln_close_inputs(c, 3);
        if (row)
            sr__block_unref(row);
        sr_tensor_unref(out);
        sr_tensor_unref(*stats);
        sr_tensor_unref(*codes);
        *codes = NULL;
        return *stats = NULL;
    }
    double *st = (double *)sr__tensor_new_data(*stats);
    uint8_t *code = (uint8_t *)sr__tensor_new_data(*codes);
    if (nout % 8) /* the last word's bytes past the codes */
        memset(code + (nout & ~(int64_t)7), 0, 8);
    char *y = sr__block_data(row);
    if (x->dtype == SR_F64)
        lnp_fwd_f64(g, r, eps, (const double *)p[0], (const double *)p[1], (const double *)p[2], (double *)y,
                    (double *)sr__tensor_new_data(out), code, st);
    else
        lnp_fwd_f32(g, r, eps, (const float *)p[0], (const float *)p[1], (const float *)p[2], (float *)y,
                    (float *)sr__tensor_new_data(out), code, st);
    sr__ln_close_inputs(c, 3);
    sr__block_unref(row);
    return out;
}

/* x [N, C, H, W], the norm over [C, H, W] or [H, W], planes at least 2 x 2. */
static bool fits(const sr_tensor *x, int ndim)
{
    return x->ndim == 4 && (ndim == 2 || ndim == 3) && x->shape[2] >= 2 && x->shape[3] >= 2;
}

sr_tensor *sr__layer_norm_relu_pool(sr_tensor *x, int ndim, const int64_t *normalized_shape, sr_tensor *weight,
                                    sr_tensor *bias, double eps)
{
    SR_OP_SPAN("layer_norm_relu_max_pool2d");
    if (!x || sr__ln_check(x, ndim, normalized_shape, weight, bias))
        return NULL;
    if (!fits(x, ndim)) { /* the ops apart */
        sr_tensor *y = sr__layer_norm_relu(x, ndim, normalized_shape, weight, bias, eps), *pooled;
        pooled = y ? sr_max_pool2d(y, (const int64_t[]){2, 2}, (const int64_t[]){2, 2}, (const int64_t[]){0, 0})
                   : NULL;
        sr_tensor_unref(y);
        return pooled;
    }
    struct ln_rows r = {.d = sr__numel(ndim, normalized_shape)};
    r.m = r.d ? sr__numel(x->ndim, x->shape) / r.d : 0;
    struct lnp_geom g = {.h = x->shape[2], .w = x->shape[3], .oh = x->shape[2] / 2, .ow = x->shape[3] / 2};
    g.planes = r.d / (g.h * g.w);
    sr_tensor *in[3] = {x, weight, bias}, *stats, *codes;
    bool pinned = sr__pin_saved(in, 3); /* saves what it reads */
    sr_tensor *out = lnp_forward(x, &g, r, weight, bias, eps, &stats, &codes);
    if (out && sr__any_requires_grad(in, 3)) {
        struct lnp_node *n = (struct lnp_node *)sr__node_for_inputs(&lnp_ops, sizeof(*n), in, 3, 1, 4);
        if (n) {
            n->ln.r = r;
            n->ln.relu = true;
            n->ln.nd = ndim;
            memcpy(n->ln.shape, normalized_shape, (size_t)ndim * sizeof(int64_t));
            n->g = g;
            sr__node_save(&n->ln.base, 0, x);
            sr__node_save(&n->ln.base, 1, weight);
            sr__node_save(&n->ln.base, 2, stats);
            sr__node_save(&n->ln.base, 3, codes);
        }
        out = sr__attach(out, (sr_node *)n);
    }
    sr_tensor_unref(stats);
    sr_tensor_unref(codes);
    sr__unpin_saved(pinned, in, 3);
    return out;
}
