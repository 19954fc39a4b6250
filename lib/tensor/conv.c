/* SPDX-License-Identifier: MIT */
/* conv2d as im2col + gemm, with its backward.
 *
 * Forward, per sample n and group g: the input planes of the group are
 * unfolded into col [K, L] (K = C/groups * kH * kW rows, one per weight
 * element; L = OH * OW columns, one per output position; a position that
 * falls in the padding reads 0), then out[n, g] [O/groups, L] =
 * W_g [O/groups, K] col, one sr__gemm (BLAS when built with it).
 * Backward, per sample and group, from the saved input and weight:
 *   grad weight_g += dY_g col^T      (gemm accumulating over the batch)
 *   grad col       = W_g^T dY_g      then folded back (col2im, adding where
 *                                    windows overlap) into grad input
 *   grad bias[o]   = sum of dY over n and the output positions.
 * The column buffer is one sample's, so memory stays K * L elements whatever
 * the batch. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/engine.h"
#include "error.h"
#include "conv.h"
#include "gemm.h"
#include "tensor_impl.h"

/* The output columns ox whose input column ix = ox * stride + off falls
 * inside [0, w): [*lo, *hi). */
static void inside(int64_t off, int64_t stride, int64_t w, int64_t ow, int64_t *lo, int64_t *hi)
{
    int64_t a = off >= 0 ? 0 : (-off + stride - 1) / stride, b = w - 1 - off < 0 ? 0 : (w - 1 - off) / stride + 1;
    *lo = a < ow ? a : ow;
    *hi = b < ow ? b : ow;
    *hi = *hi > *lo ? *hi : *lo;
}

/* im2col / col2im of one group of one sample: x [cg, h, w], col [cg*kh*kw, oh*ow].
 * to_col: col = unfold(x) (zeros where a window reads the padding); else
 * x += fold(col). The valid columns [lo, hi) of each row are found once, so
 * the inner loops have no bounds checks. The rows are short (14 elements
 * in the CNN), so a call per row costs more than its copy: the copies and
 * zeros are loops in line (GCC's -O3 makes a unit-stride version of them),
 * kept from becoming calls to memcpy and memset (GCC's
 * loop-distribute-patterns), which made them 20 % of the CNN's second
 * convolution. */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_MEMCPY_CALLS __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define NO_MEMCPY_CALLS
#endif
#define DEFINE_UNFOLD(T, SUFFIX)                                                                               \
    NO_MEMCPY_CALLS static void unfold_##SUFFIX(const struct conv_geom *g, T *x, T *restrict col, bool to_col) \
    {                                                                                                          \
        int64_t cg = geom_cg(g), l = geom_l(g), ow = g->ow, sw = g->sw;                                        \
        for (int64_t c = 0; c < cg; c++)                                                                       \
            for (int64_t ki = 0; ki < g->kh; ki++)                                                             \
                for (int64_t kj = 0; kj < g->kw; kj++) {                                                       \
                    T *row = col + ((c * g->kh + ki) * g->kw + kj) * l, *plane = x + c * g->h * g->w;          \
                    int64_t off = kj * g->dw - g->pw, lo, hi;                                                  \
                    inside(off, sw, g->w, ow, &lo, &hi);                                                       \
                    for (int64_t oy = 0; oy < g->oh; oy++) {                                                   \
                        int64_t iy = oy * g->sh - g->ph + ki * g->dh;                                          \
                        T *restrict r = row + oy * ow;                                                         \
                        if (iy < 0 || iy >= g->h) {                                                            \
                            for (int64_t ox = 0; to_col && ox < ow; ox++)                                      \
                                r[ox] = 0;                                                                     \
                            continue;                                                                          \
                        }                                                                                      \
                        T *restrict src = plane + iy * g->w + off + lo * sw;                                   \
                        if (to_col) {                                                                          \
                            for (int64_t ox = 0; ox < lo; ox++)                                                \
                                r[ox] = 0;                                                                     \
                            for (int64_t ox = lo; ox < hi; ox++)                                               \
                                r[ox] = src[(ox - lo) * sw];                                                   \
                            for (int64_t ox = hi; ox < ow; ox++)                                               \
                                r[ox] = 0;                                                                     \
                        } else {                                                                               \
                            for (int64_t ox = lo; ox < hi; ox++)                                               \
                                src[(ox - lo) * sw] += r[ox];                                                  \
                        }                                                                                      \
                    }                                                                                          \
                }                                                                                              \
    }
DEFINE_UNFOLD(float, f32)
DEFINE_UNFOLD(double, f64)

/* The unfold for stride 1 along the width, which every 3 x 3 "same"
 * convolution has: the group's planes are first copied into `pad`, zero
 * bordered ([cg, h + 2 pH, w + 2 pW]), so that each row of the columns is
 * read from it without bounds checks, in whole 32-byte vectors: a row's
 * last vector may read past the row (into the next row or the slack after
 * `pad`) and write past it, into the next row of the columns, which is
 * written after it; hence the columns and `pad` have COL_SLACK bytes of
 * slack (col_alloc). Short rows (14 elements in the CNN) cost a loop
 * prologue and epilogue each in the general unfold; here they are one or
 * two vector copies. */
#define COL_SLACK 128
#define DEFINE_UNFOLD_S1(T, SUFFIX)                                                                            \
    NO_MEMCPY_CALLS static void pad_planes_##SUFFIX(const struct conv_geom *g, const T *x, T *restrict xp)    \
    {                                                                                                          \
        typedef T vec __attribute__((vector_size(32)));                                                        \
        int64_t hp = g->h + 2 * g->ph, wp = g->w + 2 * g->pw, vl = (int64_t)(sizeof(vec) / sizeof(T));         \
        for (int64_t c = 0; c < geom_cg(g); c++)                                                               \
            for (int64_t y = 0; y < g->h; y++) {                                                               \
                T *restrict r = xp + (c * hp + y + g->ph) * wp + g->pw;                                        \
                const T *restrict src = x + (c * g->h + y) * g->w;                                             \
                if (g->w < vl) {                                                                               \
                    for (int64_t i = 0; i < g->w; i++)                                                         \
                        r[i] = src[i];                                                                         \
                    continue;                                                                                  \
                }                                                                                              \
                for (int64_t i = 0;; i += vl) { /* the last vector ends at the row's end */                   \
                    vec v;                                                                                     \
                    i = i + vl > g->w ? g->w - vl : i;                                                         \
                    memcpy(&v, src + i, sizeof(v));                                                            \
                    memcpy(r + i, &v, sizeof(v));                                                              \
                    if (i + vl == g->w)                                                                        \
                        break;                                                                                 \
                }                                                                                              \
            }                                                                                                  \
    }                                                                                                          \
    NO_MEMCPY_CALLS static void unfold_s1_##SUFFIX(const struct conv_geom *g, const T *x, T *restrict col,     \
                                                   T *restrict xp)                                             \
    {                                                                                                          \
        typedef T vec __attribute__((vector_size(32)));                                                        \
        int64_t hp = g->h + 2 * g->ph, wp = g->w + 2 * g->pw, l = geom_l(g), ow = g->ow;                       \
        int64_t vl = (int64_t)(sizeof(vec) / sizeof(T));                                                       \
        pad_planes_##SUFFIX(g, x, xp);                                                                         \
        for (int64_t c = 0; c < geom_cg(g); c++)                                                               \
            for (int64_t ki = 0; ki < g->kh; ki++)                                                             \
                for (int64_t kj = 0; kj < g->kw; kj++) {                                                       \
                    T *row = col + ((c * g->kh + ki) * g->kw + kj) * l;                                        \
                    const T *plane = xp + (c * hp + ki * g->dh) * wp + kj * g->dw;                             \
                    for (int64_t oy = 0; oy < g->oh; oy++) {                                                   \
                        const T *src = plane + oy * g->sh * wp;                                                \
                        T *dst = row + oy * ow;                                                                \
                        for (int64_t ox = 0; ox < ow; ox += vl) {                                              \
                            vec v;                                                                             \
                            memcpy(&v, src + ox, sizeof(v));                                                   \
                            memcpy(dst + ox, &v, sizeof(v));                                                   \
                        }                                                                                      \
                    }                                                                                          \
                }                                                                                              \
    }
DEFINE_UNFOLD_S1(float, f32)
DEFINE_UNFOLD_S1(double, f64)

/* Bytes of `pad` after the columns for unfold's fast path: g's planes,
 * zero bordered, and the slack. */
static size_t pad_bytes(const struct conv_geom *g, size_t es)
{
    return (size_t)(geom_cg(g) * (g->h + 2 * g->ph) * (g->w + 2 * g->pw)) * es + COL_SLACK;
}

/* Room for `count` column buffers of g ([K, L] each), their slack, and the
 * padded planes behind them (*pad). NULL when out of memory. */
static char *col_alloc(const struct conv_geom *g, size_t es, int64_t count, char **pad)
{
    size_t cols = (size_t)(count * geom_k(g) * geom_l(g)) * es + COL_SLACK;
    char *p = malloc(cols + pad_bytes(g, es));
    *pad = p ? p + cols : NULL;
    if (p) /* the border and the slack; pad_planes writes only the planes' insides */
        memset(*pad, 0, pad_bytes(g, es));
    return p;
}

/* col = unfold(x) for one sample's group; pad: from col_alloc. */
static void unfold(const struct conv_geom *g, sr_dtype dt, const void *x, void *col, void *pad)
{
    if (g->sw == 1 && dt == SR_F64)
        unfold_s1_f64(g, x, col, pad);
    else if (g->sw == 1)
        unfold_s1_f32(g, x, col, pad);
    else if (dt == SR_F64)
        unfold_f64(g, (double *)x, col, true);
    else
        unfold_f32(g, (float *)x, col, true);
}

static void fold_add(const struct conv_geom *g, sr_dtype dt, void *x, void *col)
{
    if (dt == SR_F64)
        unfold_f64(g, x, col, false);
    else
        unfold_f32(g, x, col, false);
}

/* ---- checks ---- */

/* Output positions along one dim; 0 when the dilated kernel does not fit
 * (C's division rounds a small negative span towards zero, to a position). */
static int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d)
{
    int64_t span = in + 2 * p - d * (k - 1) - 1;
    return span < 0 ? 0 : span / s + 1;
}

static int check_params(const int64_t *st, const int64_t *pad, const int64_t *dil, int64_t groups)
{
    for (int i = 0; i < 2; i++) {
        if (st[i] < 1 || pad[i] < 0 || dil[i] < 1)
            return sr__fail(-EINVAL, "sr_conv2d", "stride (%lld, %lld) and dilation (%lld, %lld) must be >= 1, "
                            "padding (%lld, %lld) >= 0", (long long)st[0], (long long)st[1], (long long)dil[0],
                            (long long)dil[1], (long long)pad[0], (long long)pad[1]);
    }
    return groups < 1 ? sr__fail(-EINVAL, "sr_conv2d", "groups %lld must be >= 1", (long long)groups) : 0;
}

static int check_shapes(const sr_tensor *x, const sr_tensor *w, const sr_tensor *b, int64_t groups)
{
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    if (x->ndim != 4 || w->ndim != 4)
        return sr__fail(-EINVAL, "sr_conv2d", "input %s must be [N, C, H, W] and weight %s [O, C/groups, kH, kW]",
                        sr__shape_str(x->ndim, x->shape, b1), sr__shape_str(w->ndim, w->shape, b2));
    if (x->shape[1] != w->shape[1] * groups || w->shape[0] % groups)
        return sr__fail(-EINVAL, "sr_conv2d", "input %s and weight %s with groups %lld: expected input to have "
                        "%lld channels and %lld output channels divisible by groups",
                        sr__shape_str(4, x->shape, b1), sr__shape_str(4, w->shape, b2), (long long)groups,
                        (long long)(w->shape[1] * groups), (long long)w->shape[0]);
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return sr__fail(-EINVAL, "sr_conv2d", "bias %s must be [%lld] (the weight %s's output channels)",
                        sr__shape_str(b->ndim, b->shape, b1), (long long)w->shape[0],
                        sr__shape_str(4, w->shape, b2));
    if (sr__check_same_dtype("sr_conv2d", x, w) || (b && sr__check_same_dtype("sr_conv2d", w, b)))
        return -EINVAL;
    return sr__check_float("sr_conv2d", x);
}

static int make_geom(const sr_tensor *x, const sr_tensor *w, const int64_t *st, const int64_t *pad,
                     const int64_t *dil, int64_t groups, struct conv_geom *g)
{
    *g = (struct conv_geom){.n = x->shape[0], .c = x->shape[1], .h = x->shape[2], .w = x->shape[3],
                            .o = w->shape[0], .kh = w->shape[2], .kw = w->shape[3], .sh = st[0], .sw = st[1],
                            .ph = pad[0], .pw = pad[1], .dh = dil[0], .dw = dil[1], .groups = groups};
    g->oh = out_size(g->h, g->kh, g->sh, g->ph, g->dh);
    g->ow = out_size(g->w, g->kw, g->sw, g->pw, g->dw);
    if (g->oh < 1 || g->ow < 1 || g->kh < 1 || g->kw < 1) {
        char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
        return sr__fail(-EINVAL, "sr_conv2d", "input %s with padding (%lld, %lld) is smaller than the dilated "
                        "kernel of weight %s (dilation (%lld, %lld))", sr__shape_str(4, x->shape, b1),
                        (long long)g->ph, (long long)g->pw, sr__shape_str(4, w->shape, b2), (long long)g->dh,
                        (long long)g->dw);
    }
    return 0;
}

/* ---- forward ---- */

/* Sets each of the og rows of l elements of one sample's group to b[o]
 * (the gemm then adds to it: the pass that BLAS's beta = 0 spends zeroing
 * the output puts the bias there instead). */
static void fill_bias(sr_dtype dt, char *out, const char *b, int64_t og, int64_t l)
{
    for (int64_t o = 0; o < og; o++)
        if (dt == SR_F64)
            for (int64_t i = 0; i < l; i++)
                ((double *)out)[o * l + i] = ((const double *)b)[o];
        else
            for (int64_t i = 0; i < l; i++)
                ((float *)out)[o * l + i] = ((const float *)b)[o];
}

/* The direct forward for few input channels (the CNN's first layer: one
 * channel, K = 9, a poor shape for a gemm, whose C is as large as the
 * output): each output row is computed in up to four vectors (32-byte)
 * over the width, from the zero-bordered planes (pad_planes), every tap a
 * broadcast weight times a vector of the shifted row. No columns, no
 * gemm. Groups 1 and stride 1 along the width; a block's last vectors
 * compute past the row (reading into the next row or the slack) and only
 * the row's elements are stored. An AVX2 + FMA build of it is chosen at
 * run time where the CPU has them. */
#define SR_CONV_DIRECT_MAX_K 32
static bool fwd_direct(const struct conv_geom *g)
{
    return g->groups == 1 && g->sw == 1 && geom_k(g) <= SR_CONV_DIRECT_MAX_K;
}

#define DEFINE_DIRECT(T, NAME, ATTR)                                                                           \
    /* dst[0, min(n, NV VL)) = the block's vectors: whole vectors, then the tail */                          \
    __attribute__((DIRECT_OPT ATTR)) static inline void store_row_##NAME(T *dst, const void *acc, int64_t n)  \
    {                                                                                                          \
        enum { VL = 32 / sizeof(T), NV = 4 };                                                                  \
        const T *a = acc;                                                                                      \
        int64_t i = 0;                                                                                         \
        for (; i < NV * VL && i + VL <= n; i += VL)                                                            \
            memcpy(dst + i, a + i, 32);                                                                        \
        for (; i < NV * VL && i < n; i++)                                                                      \
            dst[i] = a[i];                                                                                     \
    }                                                                                                          \
    __attribute__((DIRECT_OPT ATTR)) static void NAME(const struct conv_geom *g, const T *xp, const T *w,     \
                                                       const T *b, T *out)                                     \
    {                                                                                                          \
        typedef T vec __attribute__((vector_size(32)));                                                        \
        enum { VL = sizeof(vec) / sizeof(T), NV = 4 };                                                         \
        int64_t hp = g->h + 2 * g->ph, wp = g->w + 2 * g->pw, k = geom_k(g);                                   \
        for (int64_t o = 0; o < g->o; o += 2) {                                                                \
            int64_t o2 = o + 1 < g->o ? o + 1 : o; /* an odd last channel: computed twice, stored once */     \
            vec b0 = (vec){0} + (b ? b[o] : 0), b1 = (vec){0} + (b ? b[o2] : 0);                               \
            for (int64_t oy = 0; oy < g->oh; oy++)                                                             \
                for (int64_t ox = 0; ox < g->ow; ox += NV * VL) {                                              \
                    vec acc0[NV], acc1[NV];                                                                    \
                    for (int j = 0; j < NV; j++) {                                                             \
                        acc0[j] = b0;                                                                          \
                        acc1[j] = b1;                                                                          \
                    }                                                                                          \
                    for (int64_t c = 0; c < g->c; c++)                                                         \
                        for (int64_t ki = 0; ki < g->kh; ki++) {                                               \
                            const T *src = xp + (c * hp + oy * g->sh + ki * g->dh) * wp + ox;                  \
                            const T *w0 = w + o * k + (c * g->kh + ki) * g->kw, *w1 = w0 + (o2 - o) * k;       \
                            for (int64_t kj = 0; kj < g->kw; kj++) {                                           \
                                T x0 = w0[kj], x1 = w1[kj];                                                    \
                                for (int j = 0; j < NV; j++) {                                                 \
                                    vec v;                                                                     \
                                    memcpy(&v, src + kj * g->dw + j * VL, sizeof(v));                          \
                                    acc0[j] += x0 * v;                                                         \
                                    acc1[j] += x1 * v;                                                         \
                                }                                                                              \
                            }                                                                                  \
                        }                                                                                      \
                    T *dst = out + (o * g->oh + oy) * g->ow + ox;                                              \
                    store_row_##NAME(dst, acc0, g->ow - ox);                                                   \
                    if (o2 > o)                                                                                \
                        store_row_##NAME(dst + geom_l(g), acc1, g->ow - ox);                                   \
                }                                                                                              \
        }                                                                                                      \
    }
DEFINE_DIRECT(float, direct_f32, )
DEFINE_DIRECT(double, direct_f64, )
#if defined(__x86_64__) && defined(__GNUC__)
DEFINE_DIRECT(float, direct_f32_avx2, target("avx2,fma"))
DEFINE_DIRECT(double, direct_f64_avx2, target("avx2,fma"))
#endif

/* out [n, o, oh, ow] of fwd_direct's convolution (+ bias); pad from col_alloc. */
static void conv_forward_direct(const struct conv_geom *g, sr_dtype dt, const char *x, const char *w,
                                const char *b, char *out, char *pad)
{
    size_t es = sr_dtype_size(dt);
    for (int64_t n = 0; n < g->n; n++) {
        const char *xn = x + n * g->c * g->h * g->w * (int64_t)es;
        char *on = out + n * g->o * geom_l(g) * (int64_t)es;
        if (dt == SR_F64)
            pad_planes_f64(g, (const double *)xn, (double *)pad);
        else
            pad_planes_f32(g, (const float *)xn, (float *)pad);
#if defined(__x86_64__) && defined(__GNUC__)
        if (sr__cpu_avx2_fma()) {
            if (dt == SR_F64)
                direct_f64_avx2(g, (const double *)pad, (const double *)w, (const double *)b, (double *)on);
            else
                direct_f32_avx2(g, (const float *)pad, (const float *)w, (const float *)b, (float *)on);
            continue;
        }
#endif
        if (dt == SR_F64)
            direct_f64(g, (const double *)pad, (const double *)w, (const double *)b, (double *)on);
        else
            direct_f32(g, (const float *)pad, (const float *)w, (const float *)b, (float *)on);
    }
}

/* out [n, o, oh, ow] = conv(x, w) (+ bias): x, w, b contiguous and readable.
 * cols: NULL, or room for every sample's and group's columns, [n, groups,
 * K, L], which it fills and the backward reuses for the weight gradient;
 * else one sample's buffer is reused. The bias is written into each
 * sample's output before the gemm adds to it (fill_bias). With few input
 * channels (fwd_direct) no columns and no gemm: the direct kernel; with
 * use_winograd's shapes (and no columns to keep), Winograd. */
static int conv_forward(const struct conv_geom *g, sr_dtype dt, const char *x, const char *w, const char *b,
                        char *out, char *cols)
{
    size_t es = sr_dtype_size(dt);
    int64_t k = geom_k(g), l = geom_l(g), og = geom_og(g), cg = geom_cg(g);
    if (!cols && sr__wino_applies(g, dt))
        return sr__wino_conv(g, (const float *)x, (const float *)w, (const float *)b, (float *)out);
    char *pad, *col = col_alloc(g, es, cols || fwd_direct(g) ? 0 : 1, &pad);
    if (!col)
        return sr__fail(-ENOMEM, "sr_conv2d", "out of memory for a %lld x %lld column buffer", (long long)k,
                        (long long)l);
    int rc = 0;
    if (fwd_direct(g)) {
        conv_forward_direct(g, dt, x, w, b, out, pad);
        free(col);
        return 0;
    }
    for (int64_t n = 0; !rc && n < g->n; n++)
        for (int64_t gi = 0; !rc && gi < g->groups; gi++) {
            char *c = cols ? cols + (n * g->groups + gi) * k * l * (int64_t)es : col;
            char *o = out + (n * g->o + gi * og) * l * (int64_t)es;
            unfold(g, dt, x + ((n * g->c + gi * cg) * g->h * g->w) * (int64_t)es, c, pad);
            if (b)
                fill_bias(dt, o, b + gi * og * (int64_t)es, og, l);
            struct sr_gemm mm = {.dt = dt, .m = og, .n = l, .k = k, .a = w + gi * og * k * (int64_t)es,
                                 .lda = k, .b = c, .ldb = l, .c = o, .ldc = l, .accumulate = b != NULL};
            if (sr__gemm(&mm))
                rc = sr__fail(-ENOMEM, "sr_conv2d", "out of memory for the blocked matmul");
        }
    free(col);
    return rc;
}

/* ---- backward ---- */

struct conv_node {
    sr_node base;
    struct conv_geom g;
    char *cols; /* the forward's columns [n, groups, K, L], or NULL: unfolded again */
};

/* The forward keeps its columns for the weight gradient up to this size;
 * beyond it the backward unfolds the input again. */
#define SR_CONV_KEEP_COLS_MAX ((size_t)4 << 20)

static void conv_release(sr_node *node)
{
    struct conv_node *cn = (struct conv_node *)node;
    free(cn->cols);
    cn->cols = NULL;
}

static void bias_grad_add(const struct conv_geom *g, sr_dtype dt, const char *dy, double *db);

/* grad input (if dx) and grad weight (if dw), both zeroed, and the bias's
 * sums (if db, zeroed), from dy; cols: the forward's columns, or NULL. The
 * samples go one by one, each sample's dY read by all three while it is in
 * cache. */
static int conv_backward_data(const struct conv_geom *g, sr_dtype dt, const char *x, const char *w,
                              const char *dy, const char *cols, char *dx, char *dw, double *db)
{
    size_t es = sr_dtype_size(dt);
    int64_t k = geom_k(g), l = geom_l(g), og = geom_og(g), cg = geom_cg(g), plane = g->h * g->w;
    char *pad = NULL, *col = (cols && !dx) || (!dw && !dx) ? NULL : col_alloc(g, es, 1, &pad);
    if (!col && !((cols && !dx) || (!dw && !dx)))
        return sr__fail(-ENOMEM, "sr_conv2d", "backward: out of memory for a %lld x %lld column buffer",
                        (long long)k, (long long)l);
    int rc = 0;
    for (int64_t n = 0; !rc && n < g->n; n++) {
        for (int64_t gi = 0; !rc && gi < g->groups; gi++) {
            int64_t xoff = (n * g->c + gi * cg) * plane * (int64_t)es;
            const char *dyg = dy + (n * g->o + gi * og) * l * (int64_t)es, *c = col;
            if (dw) { /* dW_g += dY_g col^T */
                if (cols)
                    c = cols + (n * g->groups + gi) * k * l * (int64_t)es;
                else
                    unfold(g, dt, x + xoff, col, pad);
                struct sr_gemm mm = {.dt = dt, .m = og, .n = k, .k = l, .a = dyg, .lda = l, .b = c, .tb = true,
                                     .ldb = l, .c = dw + gi * og * k * (int64_t)es, .ldc = k, .accumulate = true};
                rc = sr__gemm(&mm);
            }
            if (!rc && dx) { /* col = W_g^T dY_g, folded into dX */
                struct sr_gemm mm = {.dt = dt, .m = k, .n = l, .k = og, .a = w + gi * og * k * (int64_t)es,
                                     .ta = true, .lda = k, .b = dyg, .ldb = l, .c = col, .ldc = l};
                rc = sr__gemm(&mm);
                if (!rc)
                    fold_add(g, dt, dx + xoff, col);
            }
            if (rc)
                rc = sr__fail(-ENOMEM, "sr_conv2d", "backward: out of memory for the blocked matmul");
        }
        if (db)
            bias_grad_add(g, dt, dy + n * g->o * l * (int64_t)es, db);
    }
    free(col);
    return rc;
}

/* ---- backward as a convolution of dY (stride 1, dilation 1, groups 1) ----
 *
 * With stride 1 and no dilation, grad input is a convolution of dY with the
 * weight flipped and its channel dims swapped, padding kH - 1 - pH (and
 * kW - 1 - pW), whose output plane is the input's: one unfold of dY per
 * sample, colT [O kH kW, H W], row (o, ki', kj') at input position q
 * holding dY[o] at q + p - (k - 1 - k'), serves both gradients:
 *   grad x_n  [C, H W]     = Wt colT            Wt[c, (o, ki', kj')] = W[o, c, kH-1-ki', kW-1-kj']
 *   grad Wt   [C, O kH kW] += x_n colT^T         (flipped back into grad W at the end)
 * This replaces the old path's second unfold of x, its col2im (a
 * read-modify-write over overlapping windows) and the zeroing of a
 * [K, L] column buffer by two gemms of the same size as before. */
#define SR_CONV_BY_CONV_MIN_C 16
static bool bwd_by_conv(const struct conv_geom *g)
{
    return g->c >= SR_CONV_BY_CONV_MIN_C && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 &&
           g->groups == 1 && g->ph <= g->kh - 1 && g->pw <= g->kw - 1;
}

/* The geometry that unfolds one sample of dY into colT. */
static struct conv_geom dy_geom(const struct conv_geom *g)
{
    return (struct conv_geom){.n = g->n, .c = g->o, .h = g->oh, .w = g->ow, .o = g->c, .kh = g->kh, .kw = g->kw,
                              .oh = g->h, .ow = g->w, .sh = 1, .sw = 1, .ph = g->kh - 1 - g->ph,
                              .pw = g->kw - 1 - g->pw, .dh = 1, .dw = 1, .groups = 1};
}

/* Between W [O, C, kH, kW] and Wt [C, O kH kW] (flipped): to_t: wt = flip(w),
 * else w = flip back(wt). */
#define DEFINE_FLIP(T, SUFFIX)                                                                                 \
    static void flip_##SUFFIX(const struct conv_geom *g, T *w, T *wt, bool to_t)                               \
    {                                                                                                          \
        int64_t taps = g->kh * g->kw;                                                                          \
        for (int64_t o = 0; o < g->o; o++)                                                                     \
            for (int64_t c = 0; c < g->c; c++) {                                                               \
                T *a = w + (o * g->c + c) * taps, *b = wt + (c * g->o + o) * taps + taps - 1;                  \
                for (int64_t t = 0; t < taps; t++)                                                             \
                    if (to_t)                                                                                  \
                        b[-t] = a[t];                                                                          \
                    else                                                                                       \
                        a[t] = b[-t];                                                                          \
            }                                                                                                  \
    }
DEFINE_FLIP(float, f32)
DEFINE_FLIP(double, f64)

static void flip_weight(const struct conv_geom *g, size_t es, char *w, char *wt, bool to_t)
{
    if (es == sizeof(float))
        flip_f32(g, (float *)w, (float *)wt, to_t);
    else
        flip_f64(g, (double *)w, (double *)wt, to_t);
}

/* The backward of bwd_by_conv's convolutions: dx, dw, db (each NULL or
 * zeroed) from dy. Grad input with sr__wino_applies's shapes is
 * sr__wino_conv of dY with Wt after the loop, which then unfolds dY only for
 * grad weight (none at all when conv_grads took grad weight by Winograd). */
static int conv_backward_by_conv(const struct conv_geom *g, sr_dtype dt, const char *x, const char *w,
                                 const char *dy, char *dx, char *dw, double *db)
{
    size_t es = sr_dtype_size(dt);
    struct conv_geom gd = dy_geom(g);
    int64_t kt = geom_k(&gd), hw = g->h * g->w, l = geom_l(g), wn = g->c * kt;
    bool wino = dx && sr__wino_applies(&gd, dt); /* grad input by Winograd, after the loop */
    bool cols = dw || !wino;                     /* dY unfolded, for a gemm of either gradient */
    char *pad = NULL, *colt = cols ? col_alloc(&gd, es, 1, &pad) : NULL, *dwt = NULL;
    char *wt = malloc(2 * (size_t)wn * es);
    int rc = (colt || !cols) && wt ? 0 : sr__fail(-ENOMEM, "sr_conv2d", "backward: out of memory for a %lld x %lld "
                                                  "column buffer", (long long)kt, (long long)hw);
    if (!rc) { /* Wt, then grad Wt (zeroed) */
        dwt = wt + wn * (int64_t)es;
        memset(dwt, 0, (size_t)wn * es);
        flip_weight(g, es, (char *)w, wt, true);
    }
    for (int64_t n = 0; !rc && n < g->n; n++) {
        const char *dyn = dy + n * g->o * l * (int64_t)es;
        if (dw) {
            unfold(&gd, dt, dyn, colt, pad);
            struct sr_gemm mm = {.dt = dt, .m = g->c, .n = kt, .k = hw, .a = x + n * g->c * hw * (int64_t)es,
                                 .lda = hw, .b = colt, .tb = true, .ldb = hw, .c = dwt, .ldc = kt,
                                 .accumulate = true};
            rc = sr__gemm(&mm);
        }
        if (!rc && dx && !wino) {
            if (!dw)
                unfold(&gd, dt, dyn, colt, pad);
            /* accumulate: dx is zeroed already (grad_buffer), so BLAS need not zero it again */
            struct sr_gemm mm = {.dt = dt, .m = g->c, .n = hw, .k = kt, .a = wt, .lda = kt, .b = colt, .ldb = hw,
                                 .c = dx + n * g->c * hw * (int64_t)es, .ldc = hw, .accumulate = true};
            rc = sr__gemm(&mm);
        }
        if (rc)
            rc = sr__fail(-ENOMEM, "sr_conv2d", "backward: out of memory for the blocked matmul");
        else if (db)
            bias_grad_add(g, dt, dyn, db);
    }
    if (!rc && wino)
        rc = sr__wino_conv(&gd, (const float *)dy, (const float *)wt, NULL, (float *)dx);
    if (!rc && dw)
        flip_weight(g, es, dw, dwt, false);
    free(colt);
    free(wt);
    return rc;
}

/* Sum of a row of n elements, in 8 independent partial sums (so the
 * compiler can vectorise it), then in double. */
#define DEFINE_ROW_SUM(T, SUFFIX)                                                                              \
    static double row_sum_##SUFFIX(const T *p, int64_t n)                                                      \
    {                                                                                                          \
        T part[8] = {0};                                                                                       \
        int64_t i = 0;                                                                                         \
        for (; i + 8 <= n; i += 8)                                                                             \
            for (int j = 0; j < 8; j++)                                                                        \
                part[j] += p[i + j];                                                                           \
        double s = 0.0;                                                                                        \
        for (int j = 0; j < 8; j++)                                                                            \
            s += part[j];                                                                                      \
        for (; i < n; i++)                                                                                     \
            s += p[i];                                                                                         \
        return s;                                                                                              \
    }
DEFINE_ROW_SUM(float, f32)
DEFINE_ROW_SUM(double, f64)

/* db[o] += the sum of one sample's dY[o] (db in double, over the batch). */
static void bias_grad_add(const struct conv_geom *g, sr_dtype dt, const char *dy, double *db)
{
    int64_t l = geom_l(g);
    size_t es = sr_dtype_size(dt);
    for (int64_t o = 0; o < g->o; o++) {
        const char *p = dy + o * l * (int64_t)es;
        db[o] += dt == SR_F64 ? row_sum_f64((const double *)p, l) : row_sum_f32((const float *)p, l);
    }
}

/* A zeroed gradient buffer of t's shape if input i needs one, else NULL. */
static sr_tensor *grad_buffer(sr_node *node, uint32_t i, const sr_tensor *t, int *rc)
{
    if (*rc || !sr__node_needs_grad(node, i))
        return NULL;
    sr_tensor *z = sr__tensor_new("sr_conv2d", t->dtype, t->ndim, t->shape);
    if (z)
        memset(sr__tensor_new_data(z), 0, sr_tensor_numel(z) * sr_dtype_size(z->dtype));
    *rc = z ? 0 : -ENOMEM;
    return z;
}

/* The gradients that are not NULL (zeroed): the weight's by Winograd where
 * it applies, the rest by convolution of dY or by the unfolded gemms. */
static int conv_grads(const struct conv_node *cn, sr_dtype dt, const char *x, const char *w, const char *dy,
                      char *dx, char *dw, double *db)
{
    if (dw && sr__wino_applies(&cn->g, dt)) {
        int rc = sr__wino_grad_weight(&cn->g, (const float *)x, (const float *)dy, (float *)dw);
        if (rc)
            return rc;
        dw = NULL;
    }
    if (dx && bwd_by_conv(&cn->g))
        return conv_backward_by_conv(&cn->g, dt, x, w, dy, dx, dw, db);
    return conv_backward_data(&cn->g, dt, x, w, dy, cn->cols, dx, dw, db);
}

static int conv_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct conv_node *cn = (struct conv_node *)node;
    sr_tensor *x, *w;
    int rc = sr__node_saved(node, 0, &x);
    if (rc || (rc = sr__node_saved(node, 1, &w)))
        return rc;
    sr_tensor *dy = sr_contiguous(in[0]), *xc = dy ? sr_contiguous(x) : NULL, *wc = xc ? sr_contiguous(w) : NULL;
    rc = wc ? 0 : -ENOMEM;
    sr_tensor *dx = grad_buffer(node, 0, x, &rc), *dw = grad_buffer(node, 1, w, &rc);
    sr_tensor *db = rc || !sr__node_needs_grad(node, 2) ? NULL : sr__tensor_new("sr_conv2d", x->dtype, 1, &cn->g.o);
    if (!rc && sr__node_needs_grad(node, 2) && !db)
        rc = -ENOMEM;
    double *sums = db ? calloc((size_t)cn->g.o, sizeof(double)) : NULL;
    if (db && !sums)
        rc = sr__fail(-ENOMEM, "sr_conv2d", "backward: out of memory for the bias's sums");
    if (!rc) {
        const char *py = sr__tensor_pin(dy), *px = sr__tensor_pin(xc), *pw = sr__tensor_pin(wc);
        char *pdx = dx ? sr__tensor_ptr(dx) : NULL, *pdw = dw ? sr__tensor_ptr(dw) : NULL;
        rc = conv_grads(cn, x->dtype, px, pw, py, pdx, pdw, sums);
        if (!rc && db)
            sr__store_f64(sr__tensor_ptr(db), (int64_t)sr_dtype_size(x->dtype), sums, cn->g.o, x->dtype);
        sr__tensor_unpin(dy);
        sr__tensor_unpin(xc);
        sr__tensor_unpin(wc);
    }
    sr_tensor_unref(dy);
    sr_tensor_unref(xc);
    sr_tensor_unref(wc);
    free(sums);
    out[0] = rc ? NULL : dx;
    out[1] = rc ? NULL : dw;
    out[2] = rc ? NULL : db;
    if (rc) {
        sr_tensor_unref(dx);
        sr_tensor_unref(dw);
        sr_tensor_unref(db);
    }
    return rc;
}

static const sr_node_ops conv_ops = {.name = "ConvolutionBackward0", .apply = conv_apply, .release = conv_release,
                                     .destroy = conv_release};

/* ---- the op ---- */

static sr_tensor *conv_run(const struct conv_geom *g, sr_tensor *x, sr_tensor *w, sr_tensor *b, char *cols)
{
    int64_t shape[4] = {g->n, g->o, g->oh, g->ow};
    sr_tensor *out = sr__tensor_new("sr_conv2d", x->dtype, 4, shape);
    sr_tensor *xc = out ? sr_contiguous(x) : NULL, *wc = xc ? sr_contiguous(w) : NULL;
    sr_tensor *bc = wc && b ? sr_contiguous(b) : NULL;
    int rc = !wc || (b && !bc) ? -ENOMEM : 0;
    if (!rc) {
        const char *px = sr__tensor_pin(xc), *pw = sr__tensor_pin(wc), *pb = bc ? sr__tensor_pin(bc) : NULL;
        rc = conv_forward(g, x->dtype, px, pw, pb, sr__tensor_ptr(out), cols);
        sr__tensor_unpin(xc);
        sr__tensor_unpin(wc);
        if (bc)
            sr__tensor_unpin(bc);
    }
    sr_tensor_unref(xc);
    sr_tensor_unref(wc);
    sr_tensor_unref(bc);
    if (rc) {
        sr_tensor_unref(out);
        return NULL;
    }
    return out;
}

/* Room for the forward's columns when the weight's gradient will need them
 * and they are not too large; else NULL (the backward unfolds again). */
static char *cols_to_keep(const struct conv_geom *g, const sr_tensor *x, const sr_tensor *w, bool record)
{
    size_t bytes = (size_t)(g->n * g->groups * geom_k(g) * geom_l(g)) * sr_dtype_size(w->dtype);
    /* the backward unfolds dY instead, or the forward makes no columns */
    bool by_conv = (x->requires_grad && bwd_by_conv(g)) || fwd_direct(g) || sr__wino_applies(g, w->dtype);
    return record && w->requires_grad && !by_conv && bytes <= SR_CONV_KEEP_COLS_MAX ? malloc(bytes + COL_SLACK) : NULL;
}

SR_API sr_tensor *sr_conv2d(sr_tensor *x, sr_tensor *weight, sr_tensor *bias, const int64_t *stride,
                            const int64_t *padding, const int64_t *dilation, int64_t groups)
{
    SR_OP_SPAN("conv2d");
    static const int64_t ones[2] = {1, 1}, zeros[2] = {0, 0};
    const int64_t *st = stride ? stride : ones, *pad = padding ? padding : zeros, *dil = dilation ? dilation : ones;
    struct conv_geom g;
    if (!x || !weight || check_params(st, pad, dil, groups) || check_shapes(x, weight, bias, groups) ||
        make_geom(x, weight, st, pad, dil, groups, &g))
        return NULL;
    sr_tensor *in[3] = {x, weight, bias};
    bool pinned = sr__pin_saved(in, 3), record = sr__any_requires_grad(in, 3); /* saves what it reads */
    char *cols = cols_to_keep(&g, x, weight, record);
    sr_tensor *out = conv_run(&g, x, weight, bias, cols);
    if (out && record) {
        struct conv_node *n = (struct conv_node *)sr__node_for_inputs(&conv_ops, sizeof(*n), in, 3, 1, 2);
        if (n) {
            n->g = g;
            n->cols = cols; /* the node's now: freed with its saved tensors */
            cols = NULL;
            sr__node_save(&n->base, 0, x);
            sr__node_save(&n->base, 1, weight);
        }
        out = sr__attach(out, (sr_node *)n);
    }
    free(cols);
    sr__unpin_saved(pinned, in, 3);
    return out;
}
