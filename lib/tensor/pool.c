/* SPDX-License-Identifier: MIT */
/* max_pool2d and avg_pool2d over [N, C, H, W], with their backward.
 *
 * Windows: kernel (kH, kW), stride, zero or positive padding (at most half
 * the kernel, as in PyTorch), floor mode (ceil_mode=False), no dilation.
 * max_pool2d keeps, for every output element, the flat index (iy * W + ix)
 * of its input plane's maximum (the first one on ties; a NaN wins, as in
 * PyTorch): backward adds each output gradient at that index. avg_pool2d
 * counts the padding in the divisor (count_include_pad=True, PyTorch's
 * default), so every window divides by kH * kW.
 *
 * The 2 x 2, stride 2, unpadded max_pool2d (a CNN's) has a kernel of its
 * own, vectorised and without a branch on the data; max_pool2d's backward
 * zeroes dx a band of rows at a time, just before adding into it, instead of
 * a whole pass beforehand. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/engine.h"
#include "error.h"
#include "tensor_impl.h"

struct pool_geom {
    int64_t planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
};

struct pool_node {
    sr_node base;
    struct pool_geom g;
    int64_t shape[4]; /* the input's */
};

static int pool_geom(const char *fn, const sr_tensor *x, const int64_t *kernel, const int64_t *stride,
                     const int64_t *padding, struct pool_geom *g)
{
    char b1[SR_SHAPE_STR];
    if (sr__check_float(fn, x))
        return -EINVAL;
    if (x->ndim != 4)
        return sr__fail(-EINVAL, fn, "input %s must be [N, C, H, W]", sr__shape_str(x->ndim, x->shape, b1));
    if (!kernel)
        return sr__fail(-EINVAL, fn, "no kernel size given");
    const int64_t *st = stride ? stride : kernel, zero[2] = {0, 0}, *pad = padding ? padding : zero;
    for (int i = 0; i < 2; i++)
        if (kernel[i] < 1 || st[i] < 1 || pad[i] < 0 || pad[i] > kernel[i] / 2)
            return sr__fail(-EINVAL, fn, "kernel (%lld, %lld) and stride (%lld, %lld) must be >= 1, padding "
                            "(%lld, %lld) between 0 and half the kernel", (long long)kernel[0],
                            (long long)kernel[1], (long long)st[0], (long long)st[1], (long long)pad[0],
                            (long long)pad[1]);
    *g = (struct pool_geom){.planes = x->shape[0] * x->shape[1], .h = x->shape[2], .w = x->shape[3],
                            .kh = kernel[0], .kw = kernel[1], .sh = st[0], .sw = st[1], .ph = pad[0],
                            .pw = pad[1]};
    g->oh = (g->h + 2 * g->ph - g->kh) / g->sh + 1;
    g->ow = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
    if (g->h + 2 * g->ph < g->kh || g->w + 2 * g->pw < g->kw)
        return sr__fail(-EINVAL, fn, "input %s with padding (%lld, %lld) is smaller than the kernel (%lld, %lld)",
                        sr__shape_str(4, x->shape, b1), (long long)g->ph, (long long)g->pw, (long long)g->kh,
                        (long long)g->kw);
    return 0;
}

/* The window of output (oy, ox), clipped to the input: [y0, y1) x [x0, x1). */
static void window(const struct pool_geom *g, int64_t oy, int64_t ox, int64_t *y0, int64_t *y1, int64_t *x0,
                   int64_t *x1)
{
    *y0 = oy * g->sh - g->ph;
    *x0 = ox * g->sw - g->pw;
    *y1 = *y0 + g->kh < g->h ? *y0 + g->kh : g->h;
    *x1 = *x0 + g->kw < g->w ? *x0 + g->kw : g->w;
    *y0 = *y0 > 0 ? *y0 : 0;
    *x0 = *x0 > 0 ? *x0 : 0;
}

#define DEFINE_POOL(T, SUFFIX)                                                                                 \
    /* First NaN of the window at index *best, or false. */                                                \
    static bool first_nan_##SUFFIX(const struct pool_geom *g, const T *x, int64_t y0, int64_t y1, int64_t x0,  \
                                   int64_t x1, int64_t *best)                                                  \
    {                                                                                                          \
        for (int64_t iy = y0; iy < y1; iy++)                                                                   \
            for (int64_t ix = x0; ix < x1; ix++)                                                               \
                if (isnan(x[iy * g->w + ix])) {                                                                \
                    *best = iy * g->w + ix;                                                                    \
                    return true;                                                                               \
                }                                                                                              \
        return false;                                                                                          \
    }                                                                                                          \
    /* The window's maximum without branches on the data (a compare and two                                  \
     * selects per element); a NaN seen sends the window to first_nan. */                                     \
    static void max_fwd_##SUFFIX(const struct pool_geom *g, const T *x, T *out, int64_t *idx)                  \
    {                                                                                                          \
        for (int64_t p = 0; p < g->planes; p++, x += g->h * g->w)                                              \
            for (int64_t oy = 0; oy < g->oh; oy++)                                                             \
                for (int64_t ox = 0; ox < g->ow; ox++, out++, idx++) {                                         \
                    int64_t y0, y1, x0, x1;                                                                    \
                    window(g, oy, ox, &y0, &y1, &x0, &x1);                                                     \
                    int64_t best = y0 * g->w + x0;                                                             \
                    T m = x[best];                                                                             \
                    bool nan = false;                                                                          \
                    for (int64_t iy = y0; iy < y1; iy++)                                                       \
                        for (int64_t ix = x0; ix < x1; ix++) {                                                 \
                            T v = x[iy * g->w + ix];                                                           \
                            bool gt = v > m;                                                                   \
                            best = gt ? iy * g->w + ix : best;                                                 \
                            m = gt ? v : m;                                                                    \
                            nan |= v != v;                                                                     \
                        }                                                                                      \
                    if (nan && first_nan_##SUFFIX(g, x, y0, y1, x0, x1, &best))                                \
                        m = x[best];                                                                           \
                    *out = m;                                                                                  \
                    *idx = best;                                                                               \
                }                                                                                              \
    }                                                                                                          \
    /* dx (not zeroed) = each output gradient added at its index. The rows an output row's windows reach  \
     * are zeroed just before its gradients go in (rows past the last one zeroed so far; windows move     \
     * down with oy), so the adds hit rows in cache, not a plane zeroed a pass earlier. */               \
    static void max_bwd_##SUFFIX(const struct pool_geom *g, const T *dy, const int64_t *idx, T *dx)            \
    {                                                                                                          \
        for (int64_t p = 0; p < g->planes; p++, dx += g->h * g->w) {                                           \
            int64_t zeroed = 0;                                                                                \
            for (int64_t oy = 0; oy < g->oh; oy++, dy += g->ow, idx += g->ow) {                                \
                int64_t reach = oy * g->sh - g->ph + g->kh < g->h ? oy * g->sh - g->ph + g->kh : g->h;         \
                if (reach > zeroed) {                                                                          \
                    memset(dx + zeroed * g->w, 0, (size_t)((reach - zeroed) * g->w) * sizeof(T));              \
                    zeroed = reach;                                                                            \
                }                                                                                              \
                for (int64_t ox = 0; ox < g->ow; ox++)                                                         \
                    dx[idx[ox]] += dy[ox];                                                                     \
            }                                                                                                  \
            memset(dx + zeroed * g->w, 0, (size_t)((g->h - zeroed) * g->w) * sizeof(T));                       \
        }                                                                                                      \
    }                                                                                                          \
    static void avg_##SUFFIX(const struct pool_geom *g, T *x, T *y, bool backward)                             \
    {                                                                                                          \
        double div = (double)(g->kh * g->kw);                                                                  \
        for (int64_t p = 0; p < g->planes; p++, x += g->h * g->w)                                              \
            for (int64_t oy = 0; oy < g->oh; oy++)                                                             \
                for (int64_t ox = 0; ox < g->ow; ox++, y++) {                                                  \
                    int64_t y0, y1, x0, x1;                                                                    \
                    window(g, oy, ox, &y0, &y1, &x0, &x1);                                                     \
                    double s = 0.0, d = (double)*y / div;                                                      \
                    for (int64_t iy = y0; iy < y1; iy++)                                                       \
                        for (int64_t ix = x0; ix < x1; ix++) {                                                 \
                            if (backward)                                                                      \
                                x[iy * g->w + ix] += (T)d;                                                     \
                            else                                                                               \
                                s += x[iy * g->w + ix];                                                        \
                        }                                                                                      \
                    if (!backward)                                                                             \
                        *y = (T)(s / div);                                                                     \
                }                                                                                              \
    }
DEFINE_POOL(float, f32)
DEFINE_POOL(double, f64)

/* max_pool2d's 2 x 2, stride 2, unpadded window (both pools of a CNN) with
 * no per-window clipping or branch on the data: VL outputs at a time, from
 * two vectors of each of the two input rows split into their even (left)
 * and odd (right) columns. Each candidate, in max_fwd's order (top left,
 * top right, bottom left, bottom right), replaces the maximum so far if it
 * is greater, or if it is a NaN and the maximum is not: the first maximum
 * and the first NaN, as max_fwd. GCC (12 and later) and clang vector types. */
#define SR__UNPAREN(...) __VA_ARGS__
#define DEFINE_POOL_2X2(T, SUFFIX, IT, VL, EVEN, ODD)                                                          \
    typedef T pv_##SUFFIX __attribute__((vector_size(VL * sizeof(T))));                                       \
    typedef IT pm_##SUFFIX __attribute__((vector_size(VL * sizeof(T))));                                      \
    static inline pv_##SUFFIX pld_##SUFFIX(const T *p)                                                         \
    {                                                                                                          \
        pv_##SUFFIX v;                                                                                         \
        memcpy(&v, p, sizeof(v));                                                                              \
        return v;                                                                                              \
    }                                                                                                          \
    /* candidate v at offset off replaces (*m, *k) where it wins */                                        \
    static inline void ptake_##SUFFIX(pv_##SUFFIX v, IT off, pv_##SUFFIX *m, pm_##SUFFIX *k)                   \
    {                                                                                                          \
        pm_##SUFFIX t = (v > *m) | ((v != v) & (*m == *m));                                                    \
        *m = (pv_##SUFFIX)(((pm_##SUFFIX)v & t) | ((pm_##SUFFIX)*m & ~t));                                     \
        *k = (*k & ~t) | (off & t);                                                                            \
    }                                                                                                          \
    /* outputs ox .. ox + VL - 1 of output row oy (input rows r0, r1) */                                   \
    static inline void max_vec_2x2_##SUFFIX(const T *r0, const T *r1, int64_t w, int64_t oy, int64_t ox,       \
                                            T *out, int64_t *idx)                                              \
    {                                                                                                          \
        pv_##SUFFIX t0 = pld_##SUFFIX(r0 + 2 * ox), t1 = pld_##SUFFIX(r0 + 2 * ox + VL);                       \
        pv_##SUFFIX b0 = pld_##SUFFIX(r1 + 2 * ox), b1 = pld_##SUFFIX(r1 + 2 * ox + VL);                       \
        pv_##SUFFIX m = __builtin_shufflevector(t0, t1, SR__UNPAREN EVEN);                                     \
        pm_##SUFFIX k = {0};                                                                                   \
        ptake_##SUFFIX(__builtin_shufflevector(t0, t1, SR__UNPAREN ODD), 1, &m, &k);                           \
        ptake_##SUFFIX(__builtin_shufflevector(b0, b1, SR__UNPAREN EVEN), (IT)w, &m, &k);                      \
        ptake_##SUFFIX(__builtin_shufflevector(b0, b1, SR__UNPAREN ODD), (IT)w + 1, &m, &k);                   \
        memcpy(out + ox, &m, sizeof(m));                                                                       \
        for (int l = 0; l < VL; l++)                                                                           \
            idx[ox + l] = 2 * oy * w + 2 * (ox + l) + k[l];                                                    \
    }                                                                                                          \
    /* A row's last outputs, when not a whole vector, are the row's last VL (some computed twice, the      \
     * same way); a row narrower than VL, one output at a time in lane 0. */                                \
    static void max_fwd_2x2_##SUFFIX(const struct pool_geom *g, const T *x, T *out, int64_t *idx)              \
    {                                                                                                          \
        const int64_t w = g->w, oh = g->oh, ow = g->ow, planes = g->planes;                                    \
        for (int64_t p = 0; p < planes; p++, x += g->h * w)                                                    \
            for (int64_t oy = 0; oy < oh; oy++, out += ow, idx += ow) {                                        \
                const T *r0 = x + 2 * oy * w, *r1 = r0 + w;                                                    \
                int64_t ox = 0;                                                                                \
                for (; ox + VL <= ow; ox += VL)                                                                \
                    max_vec_2x2_##SUFFIX(r0, r1, w, oy, ox, out, idx);                                         \
                if (ox < ow && ow >= VL)                                                                       \
                    max_vec_2x2_##SUFFIX(r0, r1, w, oy, ow - VL, out, idx);                                    \
                for (; ow < VL && ox < ow; ox++) {                                                             \
                    pv_##SUFFIX m = {r0[2 * ox]};                                                              \
                    pm_##SUFFIX k = {0};                                                                       \
                    ptake_##SUFFIX((pv_##SUFFIX){r0[2 * ox + 1]}, 1, &m, &k);                                  \
                    ptake_##SUFFIX((pv_##SUFFIX){r1[2 * ox]}, (IT)w, &m, &k);                                  \
                    ptake_##SUFFIX((pv_##SUFFIX){r1[2 * ox + 1]}, (IT)w + 1, &m, &k);                          \
                    out[ox] = m[0];                                                                            \
                    idx[ox] = 2 * oy * w + 2 * ox + k[0];                                                      \
                }                                                                                              \
            }                                                                                                  \
    }
DEFINE_POOL_2X2(float, f32, int32_t, 4, (0, 2, 4, 6), (1, 3, 5, 7))
DEFINE_POOL_2X2(double, f64, int64_t, 2, (0, 2), (1, 3))

/* ---- backward ---- */

/* dy contiguous and a dx of the input's shape (both new; dx zeroed if
 * zero), or -ENOMEM with neither. */
static int pool_grad_buffer(const struct pool_node *pn, sr_tensor *dy_in, bool zero, sr_tensor **dy, sr_tensor **dx)
{
    *dy = sr_contiguous(dy_in);
    *dx = *dy ? sr__tensor_new(pn->base.ops->name, dy_in->dtype, 4, pn->shape) : NULL;
    if (!*dx) {
        sr_tensor_unref(*dy);
        return -ENOMEM;
    }
    if (zero)
        memset(sr__tensor_new_data(*dx), 0, sr_tensor_numel(*dx) * sr_dtype_size((*dx)->dtype));
    return 0;
}

static int max_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct pool_node *pn = (struct pool_node *)node;
    sr_tensor *idx, *dy, *dx;
    int rc = sr__node_saved(node, 0, &idx);
    if (rc || (rc = pool_grad_buffer(pn, in[0], false, &dy, &dx)))
        return rc;
    const char *py = sr__tensor_pin(dy);
    const int64_t *pi = (const int64_t *)sr__tensor_ptr(idx); /* a snapshot: nobody writes it */
    if (dx->dtype == SR_F64)
        max_bwd_f64(&pn->g, (const double *)py, pi, (double *)sr__tensor_ptr(dx));
    else
        max_bwd_f32(&pn->g, (const float *)py, pi, (float *)sr__tensor_ptr(dx));
    sr__tensor_unpin(dy);
    sr_tensor_unref(dy);
    out[0] = dx;
    return 0;
}

static int avg_apply(sr_node *node, sr_tensor *const *in, sr_tensor **out)
{
    struct pool_node *pn = (struct pool_node *)node;
    sr_tensor *dy, *dx;
    int rc = pool_grad_buffer(pn, in[0], true, &dy, &dx);
    if (rc)
        return rc;
    char *py = (char *)sr__tensor_pin(dy); /* only read: avg_* reads y when backward */
    if (dx->dtype == SR_F64)
        avg_f64(&pn->g, (double *)sr__tensor_ptr(dx), (double *)py, true);
    else
        avg_f32(&pn->g, (float *)sr__tensor_ptr(dx), (float *)py, true);
    sr__tensor_unpin(dy);
    sr_tensor_unref(dy);
    out[0] = dx;
    return 0;
}

static const sr_node_ops max_ops = {.name = "MaxPool2DWithIndicesBackward0", .apply = max_apply};
static const sr_node_ops avg_ops = {.name = "AvgPool2DBackward0", .apply = avg_apply};

/* ---- the ops ---- */

static sr_tensor *record(sr_tensor *x, sr_tensor *out, const sr_node_ops *ops, const struct pool_geom *g,
                         sr_tensor *idx)
{
    if (!out || !sr__any_requires_grad(&x, 1))
        return out;
    struct pool_node *n = (struct pool_node *)sr__node_for_inputs(ops, sizeof(*n), &x, 1, 1, idx ? 1 : 0);
    if (n) {
        n->g = *g;
        memcpy(n->shape, x->shape, sizeof(n->shape));
        if (idx)
            sr__node_save(&n->base, 0, idx);
    }
    return sr__attach(out, (sr_node *)n);
}

SR_API sr_tensor *sr_max_pool2d(sr_tensor *x, const int64_t *kernel, const int64_t *stride, const int64_t *padding)
{
    SR_OP_SPAN("max_pool2d");
    struct pool_geom g;
    if (!x || pool_geom("sr_max_pool2d", x, kernel, stride, padding, &g))
        return NULL;
    int64_t shape[4] = {x->shape[0], x->shape[1], g.oh, g.ow};
    sr_tensor *out = sr__tensor_new("sr_max_pool2d", x->dtype, 4, shape);
    sr_tensor *idx = out ? sr__tensor_new("sr_max_pool2d", SR_I64, 4, shape) : NULL;
    sr_tensor *xc = idx ? sr_contiguous(x) : NULL;
    if (!xc) {
        sr_tensor_unref(out);
        sr_tensor_unref(idx);
        return NULL;
    }
    const char *px = sr__tensor_pin(xc);
    bool k2 = g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0;
    int64_t *pi = (int64_t *)sr__tensor_ptr(idx);
    if (x->dtype == SR_F64)
        (k2 ? max_fwd_2x2_f64 : max_fwd_f64)(&g, (const double *)px, (double *)sr__tensor_ptr(out), pi);
    else
        (k2 ? max_fwd_2x2_f32 : max_fwd_f32)(&g, (const float *)px, (float *)sr__tensor_ptr(out), pi);
    sr__tensor_unpin(xc);
    sr_tensor_unref(xc);
    out = record(x, out, &max_ops, &g, idx);
    sr_tensor_unref(idx);
    return out;
}

SR_API sr_tensor *sr_avg_pool2d(sr_tensor *x, const int64_t *kernel, const int64_t *stride, const int64_t *padding)
{
    SR_OP_SPAN("avg_pool2d");
    struct pool_geom g;
    if (!x || pool_geom("sr_avg_pool2d", x, kernel, stride, padding, &g))
        return NULL;
    int64_t shape[4] = {x->shape[0], x->shape[1], g.oh, g.ow};
    sr_tensor *out = sr__tensor_new("sr_avg_pool2d", x->dtype, 4, shape);
    sr_tensor *xc = out ? sr_contiguous(x) : NULL;
    if (!xc) {
        sr_tensor_unref(out);
        return NULL;
    }
    char *px = (char *)sr__tensor_pin(xc); /* only read: avg_* reads x when forward */
    if (x->dtype == SR_F64)
        avg_f64(&g, (double *)px, (double *)sr__tensor_ptr(out), false);
    else
        avg_f32(&g, (float *)px, (float *)sr__tensor_ptr(out), false);
    sr__tensor_unpin(xc);
    sr_tensor_unref(xc);
    return record(x, out, &avg_ops, &g, NULL);
}

SR_API sr_tensor *sr_flatten(sr_tensor *x, int start_dim, int end_dim)
{
    if (!x)
        return NULL;
    int nd = x->ndim ? x->ndim : 1;
    int s = sr__wrap_dim("sr_flatten", start_dim, nd), e = s < 0 ? -1 : sr__wrap_dim("sr_flatten", end_dim, nd);
    if (e < 0)
        return NULL;
    if (s > e) {
        sr__fail(-EINVAL, "sr_flatten", "start_dim %d cannot come after end_dim %d", start_dim, end_dim);
        return NULL;
    }
    if (x->ndim == 0)
        return sr_reshape(x, 1, (const int64_t[]){1});
    int64_t shape[SR_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (d <= s || d > e)
            shape[n++] = x->shape[d];
        else
            shape[n - 1] *= x->shape[d];
    }
    return sr_reshape(x, n, shape);
}
