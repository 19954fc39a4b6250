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
#include <stdlib.h>
#include <string.h>

#include "autograd/engine.h"
#include "error.h"
#include "gemm.h"
#include "tensor_impl.h"

struct conv_geom {
    int64_t n, c, h, w;     /* input */
    int64_t o, kh, kw;      /* weight [o, c / groups, kh, kw] */
    int64_t oh, ow;         /* output plane */
    int64_t sh, sw, ph, pw, dh, dw, groups;
};

static int64_t geom_cg(const struct conv_geom *g) { return g->c / g->groups; }
static int64_t geom_og(const struct conv_geom *g) { return g->o / g->groups; }
static int64_t geom_k(const struct conv_geom *g) { return geom_cg(g) * g->kh * g->kw; }
static int64_t geom_l(const struct conv_geom *g) { return g->oh * g->ow; }

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

static void unfold(const struct conv_geom *g, sr_dtype dt, const void *x, void *col)
{
    if (dt == SR_F64)
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

/* Adds b[o] to each of the og rows of l elements of one sample's group. */
static void add_bias(sr_dtype dt, char *out, const char *b, int64_t og, int64_t l)
{
    for (int64_t o = 0; o < og; o++)
        if (dt == SR_F64)
            for (int64_t i = 0; i < l; i++)
                ((double *)out)[o * l + i] += ((const double *)b)[o];
        else
            for (int64_t i = 0; i < l; i++)
                ((float *)out)[o * l + i] += ((const float *)b)[o];
}

/* out [n, o, oh, ow] = conv(x, w) (+ bias): x, w, b contiguous and readable.
 * cols: NULL, or room for every sample's and group's columns, [n, groups,
 * K, L], which it fills and the backward reuses for the weight gradient;
 * else one sample's buffer is reused. The bias is added to each sample's
 * output while the gemm has just left it in cache. */
static int conv_forward(const struct conv_geom *g, sr_dtype dt, const char *x, const char *w, const char *b,
                        char *out, char *cols)
{
    size_t es = sr_dtype_size(dt);
    int64_t k = geom_k(g), l = geom_l(g), og = geom_og(g), cg = geom_cg(g);
    char *col = cols ? NULL : malloc((size_t)(k * l) * es);
    if (!cols && !col)
        return sr__fail(-ENOMEM, "sr_conv2d", "out of memory for a %lld x %lld column buffer", (long long)k,
                        (long long)l);
    int rc = 0;
    for (int64_t n = 0; !rc && n < g->n; n++)
        for (int64_t gi = 0; !rc && gi < g->groups; gi++) {
            char *c = cols ? cols + (n * g->groups + gi) * k * l * (int64_t)es : col;
            char *o = out + (n * g->o + gi * og) * l * (int64_t)es;
            unfold(g, dt, x + ((n * g->c + gi * cg) * g->h * g->w) * (int64_t)es, c);
            struct sr_gemm mm = {.dt = dt, .m = og, .n = l, .k = k, .a = w + gi * og * k * (int64_t)es,
                                 .lda = k, .b = c, .ldb = l, .c = o, .ldc = l};
            if (sr__gemm(&mm))
                rc = sr__fail(-ENOMEM, "sr_conv2d", "out of memory for the blocked matmul");
            else if (b)
                add_bias(dt, o, b + gi * og * (int64_t)es, og, l);
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
    char *col = (cols && !dx) || (!dw && !dx) ? NULL : malloc((size_t)(k * l) * es);
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
                    unfold(g, dt, x + xoff, col);
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
        rc = conv_backward_data(&cn->g, x->dtype, px, pw, py, cn->cols, dx ? sr__tensor_ptr(dx) : NULL,
                                dw ? sr__tensor_ptr(dw) : NULL, sums);
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
static char *cols_to_keep(const struct conv_geom *g, const sr_tensor *w, bool record)
{
    size_t bytes = (size_t)(g->n * g->groups * geom_k(g) * geom_l(g)) * sr_dtype_size(w->dtype);
    return record && w->requires_grad && bytes <= SR_CONV_KEEP_COLS_MAX ? malloc(bytes) : NULL;
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
    char *cols = cols_to_keep(&g, weight, record);
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
