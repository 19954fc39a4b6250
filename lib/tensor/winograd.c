/* SPDX-License-Identifier: MIT */
/* conv2d's Winograd path: F(2x2, 3x3) for f32 (conv.h, sr__wino_applies),
 * the forward and, through the flipped weight, the gradient of the input
 * (conv.c). */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "conv.h"
#include "error.h"
#include "gemm.h"
#include "tensor_impl.h"
#include "wino_impl.h"

/* ---- Winograd F(2x2, 3x3) and F(4x4, 3x3) ----
 *
 * For f32, 3 x 3 kernels, stride 1, no dilation, groups 1, padding at most
 * 2 and at least SR_WINO_MIN_CH channels in and out (the CNN's second
 * layer: its forward, and its grad input as the convolution of dY with the
 * flipped weight, conv_backward_by_conv). Each 2 x 2 block of outputs (a
 * tile) of output channel o is
 *   Y = A^T [ sum_c (G g_oc G^T) .* (B^T d_c B) ] A
 * with d_c the 4 x 4 input patch under the tile and g_oc the kernel. The
 * sums over c of the 16 element-wise products are 16 gemms,
 * M[xi] [T, O] = V[xi] [T, C] U[xi] [C, O], over a chunk of T tiles: 16 C O
 * multiplications per tile where im2col has 36 C O. The weight is
 * transformed once per call (U); the batch goes in chunks of about
 * SR_WINO_TILES tiles (whole samples, or bands of tile rows of one sample),
 * so that V and M stay in L2. A chunk's input planes are first copied,
 * channels last, into a zero-bordered scratch [2 tH + 2, 2 tW + 2, C] (tH,
 * tW: tiles down and across a plane; with an odd output size the last tile
 * sticks out of the plane and its outside outputs are not stored), so that
 * both transforms are loops over the channels in vectors, with no bounds
 * checks (an AVX2 build of them is chosen at run time where the CPU has
 * it); the output transform stores each channel's outputs into its plane.
 *
 * F(4x4, 3x3) (wino_f4.c) is the same with 4 x 4 tiles from 6 x 6 patches:
 * 36 products per 16 outputs instead of 16 per 4, for transforms of more
 * arithmetic per element but fewer elements. A call takes the one whose
 * tiles need fewer products over the plane (wino_tile): 4 x 4 tiles stick
 * out of a plane more often (14 x 14 outputs: 16 tiles of 16, 256 outputs
 * computed; 49 of 4, 196 computed), which counts against them. */
/* At 16 channels in or out the transforms and the 16 thin gemms cost as
 * much as im2col saves; from 32 they win (docs/PERFORMANCE.md). */
#define SR_WINO_MIN_CH 32
/* A chunk: about this many outputs per plane (196 tiles of 2 x 2). */
#define SR_WINO_OUTPUTS 784
/* Floats added to a tile's run in V and in M where tiles go one after the
 * other (wino_layout): at a power of two such as 16 x 64 floats, 4 KiB, the
 * rows a micro-kernel of the products writes at once would all fall in the
 * same L1 sets. */
#define SR_WINO_SKEW 16

/* Set by tests only (sr__conv_set_winograd, sr__conv_set_winograd_tile);
 * relaxed: switches, they order nothing; their loads are in
 * sr__wino_applies, wino_kernels and wino_tile. */
static _Atomic int wino_mode = SR_WINO_AUTO;
static _Atomic int wino_tile_forced; /* 0: by the count of products; 2 or 4 */
/* Convolutions run by sr__wino_conv; relaxed: a count for tests, incremented in
 * sr__wino_conv and read by sr__conv_winograd_runs. */
static atomic_uint_least64_t wino_runs;

void sr__conv_set_winograd(enum sr_wino_mode mode) { atomic_store_explicit(&wino_mode, mode, memory_order_relaxed); }
void sr__conv_set_winograd_tile(int r) { atomic_store_explicit(&wino_tile_forced, r, memory_order_relaxed); }
uint64_t sr__conv_winograd_runs(void) { return atomic_load_explicit(&wino_runs, memory_order_relaxed); }

bool sr__wino_applies(const struct conv_geom *g, sr_dtype dt)
{
    return dt == SR_F32 && g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 &&
           g->groups == 1 && g->ph <= 2 && g->pw <= 2 && g->c >= SR_WINO_MIN_CH && g->o >= SR_WINO_MIN_CH &&
           atomic_load_explicit(&wino_mode, memory_order_relaxed) != SR_WINO_OFF; /* relaxed: see wino_mode */
}

/* The tile side, 2 or 4, whose tiles need fewer products over g's output
 * plane ((r + 2)^2 per tile), 2 on a tie; or the one a test forced. */
static int wino_tile(const struct conv_geom *g)
{
    int forced = atomic_load_explicit(&wino_tile_forced, memory_order_relaxed); /* relaxed: see wino_mode */
    if (forced == 2 || forced == 4)
        return forced;
    int64_t p2 = (g->oh + 1) / 2 * ((g->ow + 1) / 2) * 16, p4 = (g->oh + 3) / 4 * ((g->ow + 3) / 4) * 36;
    return p4 < p2 ? 4 : 2;
}

static struct wino wino_plan(const struct conv_geom *g)
{
    int r = wino_tile(g);
    struct wino wn = {.g = g, .r = r, .nx = (r + 2) * (r + 2), .th = (g->oh + r - 1) / r, .tw = (g->ow + r - 1) / r};
    wn.hp = r * wn.th + 2;
    wn.wp = r * wn.tw + 2;
    int64_t per = wn.th * wn.tw, tiles = SR_WINO_OUTPUTS / (r * r);
    wn.nb = per >= tiles ? 1 : tiles / per;
    wn.nb = wn.nb < g->n ? wn.nb : g->n;
    wn.rows = per <= tiles ? wn.th : (tiles + wn.tw - 1) / wn.tw;
    return wn;
}

/* U[xi = 4 i + j][c][o] = (G g_oc G^T)[i][j]; w [O, C, 3, 3]. Eight output
 * channels at a time, in vectors (GCC's vector extension): each kernel
 * element is gathered for the 8 channels, and U's rows, contiguous in o,
 * take whole vectors; the last o < 8 go one channel at a time. */
typedef float wvec __attribute__((vector_size(32)));
#define WINO_WEIGHT_BODY(V, k, store)                                                                          \
    do {                                                                                                       \
        V t[4][3];                                                                                             \
        for (int j = 0; j < 3; j++) {                                                                          \
            t[0][j] = k[j];                                                                                    \
            t[1][j] = 0.5f * (k[j] + k[3 + j] + k[6 + j]);                                                     \
            t[2][j] = 0.5f * (k[j] - k[3 + j] + k[6 + j]);                                                     \
            t[3][j] = k[6 + j];                                                                                \
        }                                                                                                      \
        for (int i = 0; i < 4; i++) {                                                                          \
            store(4 * i, t[i][0]);                                                                             \
            store(4 * i + 1, 0.5f * (t[i][0] + t[i][1] + t[i][2]));                                            \
            store(4 * i + 2, 0.5f * (t[i][0] - t[i][1] + t[i][2]));                                            \
            store(4 * i + 3, t[i][2]);                                                                         \
        }                                                                                                      \
    } while (0)
static void wino_weight(const struct conv_geom *g, const float *w, float *u, int64_t oc)
{
    int64_t o8 = g->o - g->o % 8;
    for (int64_t c = 0; c < g->c; c++) {
        float *uc = u + c * g->o;
        for (int64_t o = 0; o < o8; o += 8) {
            wvec k[9];
            for (int e = 0; e < 9; e++)
                for (int l = 0; l < 8; l++)
                    k[e][l] = w[((o + l) * g->c + c) * 9 + e];
#define WINO_STORE_VEC(xi, val)                                                                                \
    do {                                                                                                       \
        wvec v_ = (val);                                                                                       \
        memcpy(uc + (xi) * oc + o, &v_, sizeof(v_));                                                           \
    } while (0)
            WINO_WEIGHT_BODY(wvec, k, WINO_STORE_VEC);
#undef WINO_STORE_VEC
        }
        for (int64_t o = o8; o < g->o; o++) {
            const float *k = w + (o * g->c + c) * 9;
#define WINO_STORE_ONE(xi, val) (uc[(xi) * oc + o] = (val))
            WINO_WEIGHT_BODY(float, k, WINO_STORE_ONE);
#undef WINO_STORE_ONE
        }
    }
}

/* dW[o][c] = G^T dU[.][c][o] G, from dU [16, C, O]; G^T u = (u0 + (u1 + u2) / 2, (u1 - u2) / 2,
 * (u1 + u2) / 2 + u3). */
static void wino_weight_grad_out(const struct conv_geom *g, const float *du, float *dw, int64_t oc)
{
    for (int64_t o = 0; o < g->o; o++)
        for (int64_t c = 0; c < g->c; c++) {
            float t[3][4], *k = dw + (o * g->c + c) * 9;
            for (int j = 0; j < 4; j++) { /* T = G^T S, column j */
                const float *u = du + j * oc + c * g->o + o;
                float u0 = u[0], u1 = u[4 * oc], u2 = u[8 * oc], u3 = u[12 * oc];
                t[0][j] = u0 + 0.5f * (u1 + u2);
                t[1][j] = 0.5f * (u1 - u2);
                t[2][j] = 0.5f * (u1 + u2) + u3;
            }
            for (int a = 0; a < 3; a++) { /* row a of T G */
                k[3 * a] = t[a][0] + 0.5f * (t[a][1] + t[a][2]);
                k[3 * a + 1] = 0.5f * (t[a][1] - t[a][2]);
                k[3 * a + 2] = 0.5f * (t[a][1] + t[a][2]) + t[a][3];
            }
        }
}

/* The transforms go over the channels 8 at a time in 32-byte vectors (GCC's
 * vector extension; two SSE halves on a CPU without AVX2), the last 8
 * overlapping the one before when C is not a multiple of 8 (C >= 32): the
 * overlap is computed twice and stored twice, with the same values. In the
 * transforms each vector is a named variable (no arrays), so that they stay
 * in registers. */
#define WLD(v, p) memcpy(&(v), (p), sizeof(v))
#define WST(p, v) memcpy((p), &(v), sizeof(v))
/* nbc samples' planes x [nbc, C, h, w], channels last, into the insides of
 * wn->xp (whose borders stay zero): per input row, 8 channels by 8 columns
 * at a time, transposed in registers (the last 8 of each overlapping the
 * ones before, stored twice with the same values); a row narrower than 8
 * goes element by element. */
#define DEFINE_WINO_PAD(SUFFIX, ATTR)                                                                          \
    __attribute__((DIRECT_OPT ATTR)) static void wino_pad_##SUFFIX(const struct wino *wn, const float *x,      \
                                                                    int64_t nbc)                               \
    {                                                                                                          \
        typedef float vec __attribute__((vector_size(32)));                                                    \
        typedef float vecu __attribute__((vector_size(32), aligned(4)));                                       \
        const struct conv_geom *g = wn->g;                                                                     \
        int64_t cn = g->c, hw = g->h * g->w;                                                                   \
        for (int64_t s = 0; s < nbc; s++)                                                                      \
            for (int64_t c0 = 0; c0 < cn; c0 += 8) /* 8 planes read in order */                                \
                for (int64_t y = 0; y < g->h; y++) {                                                           \
                    int64_t c = c0 + 8 <= cn ? c0 : cn - 8;                                                    \
                    float *row = wn->xp + ((s * wn->hp + y + g->ph) * wn->wp + g->pw) * cn;                    \
                    const float *src = x + s * cn * hw + y * g->w;                                             \
                    for (int k = 0; k < 8; k++) /* the next 8 planes' row: too short a run for the prefetcher */ \
                        __builtin_prefetch(src + (c0 + 8 + k) * hw, 0, 3);                                     \
                    for (int64_t i = 0; g->w < 8 && i < g->w; i++)                                             \
                        for (int64_t k = c; k < c + 8; k++)                                                    \
                            row[i * cn + k] = src[k * hw + i];                                                 \
                    for (int64_t i0 = 0; g->w >= 8 && i0 < g->w; i0 += 8) {                                    \
                        int64_t i = i0 + 8 <= g->w ? i0 : g->w - 8;                                            \
                        vec r[8], t[8], u[8];                                                                  \
                        for (int k = 0; k < 8; k++)                                                            \
                            r[k] = *(const vecu *)(src + (c + k) * hw + i);                                    \
                        for (int k = 0; k < 8; k += 2) {                                                       \
                            t[k] = WINO_SHUF(r[k], r[k + 1], 0, 8, 1, 9, 4, 12, 5, 13);                        \
                            t[k + 1] = WINO_SHUF(r[k], r[k + 1], 2, 10, 3, 11, 6, 14, 7, 15);                  \
                        }                                                                                      \
                        for (int k = 0; k < 8; k += 4) {                                                       \
                            u[k] = WINO_SHUF(t[k], t[k + 2], 0, 1, 8, 9, 4, 5, 12, 13);                        \
                            u[k + 1] = WINO_SHUF(t[k], t[k + 2], 2, 3, 10, 11, 6, 7, 14, 15);                  \
                            u[k + 2] = WINO_SHUF(t[k + 1], t[k + 3], 0, 1, 8, 9, 4, 5, 12, 13);                \
                            u[k + 3] = WINO_SHUF(t[k + 1], t[k + 3], 2, 3, 10, 11, 6, 7, 14, 15);              \
                        }                                                                                      \
                        for (int k = 0; k < 4; k++) {                                                          \
                            r[k] = WINO_SHUF(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);                        \
                            r[k + 4] = WINO_SHUF(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);                  \
                        }                                                                                      \
                        for (int k = 0; k < 8; k++)                                                            \
                            *(vecu *)(row + (i + k) * cn + c) = r[k];                                          \
                    }                                                                                          \
                }                                                                                              \
    }

/* one row of a patch times B: (d0 - d2, d1 + d2, d2 - d1, d1 - d3) */
#define WINO_ROW(d, p, x0, x1, x2, x3)                                                                         \
    do {                                                                                                       \
        vec e0, e1, e2, e3;                                                                                    \
        WLD(e0, (p));                                                                                          \
        WLD(e1, (p) + cn);                                                                                     \
        WLD(e2, (p) + 2 * cn);                                                                                 \
        WLD(e3, (p) + 3 * cn);                                                                                 \
        x0 = e0 - e2, x1 = e1 + e2, x2 = e2 - e1, x3 = e1 - e3;                                                \
    } while (0)
/* the 4 outputs of column j of B^T (rows a, b, c, d) into V[j], V[4 + j], ... */
#define WINO_COL(j, a, b, c, d)                                                                                \
    do {                                                                                                       \
        vec y0 = a - c, y1 = b + c, y2 = c - b, y3 = b - d;                                                    \
        WST(v + (j) * xs, y0);                                                                                 \
        WST(v + (4 + (j)) * xs, y1);                                                                           \
        WST(v + (8 + (j)) * xs, y2);                                                                           \
        WST(v + (12 + (j)) * xs, y3);                                                                          \
    } while (0)
/* s0 = m0 + m1 + m2, s1 = m1 - m2 - m3 of column j of M (rows 0-3: xi = j, 4 + j, 8 + j, 12 + j) */
#define WINO_OUT_COL(j, s0, s1)                                                                                \
    do {                                                                                                       \
        vec a0, a1, a2, a3;                                                                                    \
        WLD(a0, mo + (j) * ms);                                                                                \
        WLD(a1, mo + (4 + (j)) * ms);                                                                          \
        WLD(a2, mo + (8 + (j)) * ms);                                                                          \
        WLD(a3, mo + (12 + (j)) * ms);                                                                         \
        s0 = a0 + a1 + a2, s1 = a1 - a2 - a3;                                                                  \
    } while (0)
#define DEFINE_WINO_TRANSFORMS(SUFFIX, ATTR)                                                                   \
    /* p[k l], p[k l + 1] = a[k], b[k] for the 8 channels k (only a[k] unless two): the pairs are              \
     * interleaved in registers and stored 8 bytes at a time */                                                \
    __attribute__((DIRECT_OPT ATTR)) static inline void wino_store_##SUFFIX(float *p, int64_t l,               \
                                                                             const void *av, const void *bv,   \
                                                                             bool two)                         \
    {                                                                                                          \
        typedef float vec __attribute__((vector_size(32)));                                                    \
        vec a, b;                                                                                              \
        WLD(a, av);                                                                                            \
        WLD(b, bv);                                                                                            \
        if (!two) {                                                                                            \
            for (int k = 0; k < 8; k++)                                                                        \
                p[k * l] = a[k];                                                                               \
            return;                                                                                            \
        }                                                                                                      \
        vec lo = WINO_SHUF(a, b, 0, 8, 1, 9, 4, 12, 5, 13), hi = WINO_SHUF(a, b, 2, 10, 3, 11, 6, 14, 7, 15);  \
        const float *fl = (const float *)&lo, *fh = (const float *)&hi;                                        \
        for (int k = 0; k < 8; k += 4) {                                                                       \
            memcpy(p + k * l, fl + k, 8);                                                                      \
            memcpy(p + (k + 1) * l, fl + k + 2, 8);                                                            \
            memcpy(p + (k + 2) * l, fh + k, 8);                                                                \
            memcpy(p + (k + 3) * l, fh + k + 2, 8);                                                            \
        }                                                                                                      \
    }                                                                                                          \
    /* V(t, xi, c) = (B^T d B)[xi] of the chunk's tiles t (nbc samples, tile rows [ty0, ty0 + nr)) */          \
    __attribute__((DIRECT_OPT ATTR)) static void wino_in_##SUFFIX(const struct wino *wn, int64_t nbc,          \
                                                                   int64_t ty0, int64_t nr)                    \
    {                                                                                                          \
        typedef float vec __attribute__((vector_size(32)));                                                    \
        int64_t cn = wn->g->c, tc = nbc * nr * wn->tw, xs = wn->vx, rs = wn->wp * cn;                          \
        for (int64_t t = 0; t < tc; t++) {                                                                     \
            int64_t s, ty, tx;                                                                                 \
            sr__wino_tile(wn, t, nr, ty0, &s, &ty, &tx);                                                       \
            const float *d = wn->xp + ((s * wn->hp + 2 * ty) * wn->wp + 2 * tx) * cn;                          \
            for (int64_t c0 = 0; c0 < cn; c0 += 8) {                                                           \
                int64_t c = c0 + 8 <= cn ? c0 : cn - 8;                                                        \
                vec p0, p1, p2, p3, q0, q1, q2, q3, r0, r1, r2, r3, u0, u1, u2, u3;                            \
                float *v = wn->v + t * wn->vt + c;                                                             \
                WINO_ROW(d, d + c, p0, p1, p2, p3);                                                            \
                WINO_ROW(d, d + rs + c, q0, q1, q2, q3);                                                       \
                WINO_ROW(d, d + 2 * rs + c, r0, r1, r2, r3);                                                   \
                WINO_ROW(d, d + 3 * rs + c, u0, u1, u2, u3);                                                   \
                WINO_COL(0, p0, q0, r0, u0);                                                                   \
                WINO_COL(1, p1, q1, r1, u1);                                                                   \
                WINO_COL(2, p2, q2, r2, u2);                                                                   \
                WINO_COL(3, p3, q3, r3, u3);                                                                   \
            }                                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
    /* out[n0 + s][o] = A^T M A (+ bias) of the chunk's tiles; a row or column past the plane is not stored */ \
    __attribute__((DIRECT_OPT ATTR)) static void wino_out_##SUFFIX(const struct wino *wn, int64_t n0,          \
                                                                    int64_t nbc, int64_t ty0, int64_t nr,      \
                                                                    const float *b, float *out)                \
    {                                                                                                          \
        typedef float vec __attribute__((vector_size(32)));                                                    \
        const struct conv_geom *g = wn->g;                                                                     \
        int64_t on = g->o, tc = nbc * nr * wn->tw, ms = wn->mx, l = geom_l(g), w = g->ow;                      \
        for (int64_t t = 0; t < tc; t++) {                                                                     \
            int64_t s, ty, tx;                                                                                 \
            sr__wino_tile(wn, t, nr, ty0, &s, &ty, &tx);                                                       \
            int64_t oy = 2 * ty, ox = 2 * tx;                                                                  \
            float *d = out + (n0 + s) * on * l + oy * w + ox;                                                  \
            bool right = ox + 1 < w, down = oy + 1 < g->oh;                                                    \
            for (int64_t o0 = 0; o0 < on; o0 += 8) {                                                           \
                int64_t o = o0 + 8 <= on ? o0 : on - 8;                                                        \
                const float *mo = wn->m + t * wn->mt + o;                                                      \
                vec s00, s01, s02, s03, s10, s11, s12, s13, bias = {0};                                        \
                if (b)                                                                                         \
                    WLD(bias, b + o);                                                                          \
                WINO_OUT_COL(0, s00, s10);                                                                     \
                WINO_OUT_COL(1, s01, s11);                                                                     \
                WINO_OUT_COL(2, s02, s12);                                                                     \
                WINO_OUT_COL(3, s03, s13);                                                                     \
                vec y00 = s00 + s01 + s02 + bias, y01 = s01 - s02 - s03 + bias;                                \
                vec y10 = s10 + s11 + s12 + bias, y11 = s11 - s12 - s13 + bias;                                \
                wino_store_##SUFFIX(d + o * l, l, &y00, &y01, right);                                          \
                if (down)                                                                                      \
                    wino_store_##SUFFIX(d + o * l + w, l, &y10, &y11, right);                                  \
            }                                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
    /* M(t, xi, o) = (A dY A^T)[xi] of the chunk's tiles, from dY channels last in yp ([nbc, 2 th, 2 tw, O],   \
     * zero past the plane): each row (p, q) of A dY gives (p, p + q, p - q, -q) */                            \
    __attribute__((DIRECT_OPT ATTR)) static void wino_dy_##SUFFIX(const struct wino *wn, const float *yp,      \
                                                                   int64_t nbc, int64_t ty0, int64_t nr)       \
    {                                                                                                          \
        typedef float vec __attribute__((vector_size(32)));                                                    \
        int64_t on = wn->g->o, tc = nbc * nr * wn->tw, ms = wn->mx, rs = 2 * wn->tw * on;                      \
        for (int64_t t = 0; t < tc; t++) {                                                                     \
            int64_t s, ty, tx;                                                                                 \
            sr__wino_tile(wn, t, nr, ty0, &s, &ty, &tx);                                                       \
            const float *d = yp + ((s * 2 * wn->th + 2 * ty) * 2 * wn->tw + 2 * tx) * on;                      \
            for (int64_t o0 = 0; o0 < on; o0 += 8) {                                                           \
                int64_t o = o0 + 8 <= on ? o0 : on - 8;                                                        \
                vec y00, y01, y10, y11;                                                                        \
                WLD(y00, d + o);                                                                               \
                WLD(y01, d + on + o);                                                                          \
                WLD(y10, d + rs + o);                                                                          \
                WLD(y11, d + rs + on + o);                                                                     \
                vec p[4] = {y00, y00 + y10, y00 - y10, -y10}, q[4] = {y01, y01 + y11, y01 - y11, -y11};        \
                float *m = wn->m + t * wn->mt + o;                                                             \
                for (int i = 0; i < 4; i++) {                                                                  \
                    vec m0 = p[i], m1 = p[i] + q[i], m2 = p[i] - q[i], m3 = -q[i];                             \
                    WST(m + (4 * i) * ms, m0);                                                                 \
                    WST(m + (4 * i + 1) * ms, m1);                                                             \
                    WST(m + (4 * i + 2) * ms, m2);                                                             \
                    WST(m + (4 * i + 3) * ms, m3);                                                             \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }
DEFINE_WINO_TRANSFORMS(plain, )
DEFINE_WINO_PAD(plain, )
#if defined(__x86_64__) && defined(__GNUC__)
DEFINE_WINO_TRANSFORMS(avx2, target("avx2,fma"))
DEFINE_WINO_PAD(avx2, target("avx2,fma"))
#endif

/* A product through sr__gemm (BLAS where built with it): A as stored, or
 * transposed when its rows are its columns' neighbours (ra == 1). */
static int gemm_blas(const struct sr__wino_gemm *w)
{
    bool ta = w->ka != 1;
    struct sr_gemm mm = {.dt = SR_F32, .m = w->m, .n = w->n, .k = w->k, .a = w->a, .ta = ta,
                         .lda = ta ? w->ka : w->ra, .b = w->b, .ldb = w->ldb, .c = w->c, .ldc = w->ldc,
                         .accumulate = w->accumulate};
    return sr__gemm(&mm) ? sr__fail(-ENOMEM, "sr_conv2d", "out of memory for the blocked matmul") : 0;
}

#if defined(__x86_64__) && defined(__GNUC__)
static int gemm_avx2(const struct sr__wino_gemm *w)
{
    sr__wino_gemm_avx2(w);
    return 0;
}
#endif

/* One build of the transforms and products: plain (the products by
 * sr__gemm), or AVX2 where the CPU has it (the products by wino_gemm.c's
 * kernel where it also has FMA); f2 and f4: each tile size's transforms. */
struct wino_kernels {
    void (*pad)(const struct wino *wn, const float *x, int64_t nbc);
    int (*gemm)(const struct sr__wino_gemm *w);
    const struct wino_transforms *f2, *f4;
};

static const struct wino_transforms wino_f2_plain = {wino_in_plain, wino_out_plain, wino_dy_plain, wino_weight,
                                                     wino_weight_grad_out};
static const struct wino_kernels wino_plain = {wino_pad_plain, gemm_blas, &wino_f2_plain, &sr__wino_f4_plain};

/* The AVX2 build on a CPU with AVX2, unless a test asks for the plain one. */
static const struct wino_kernels *wino_kernels(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    static const struct wino_transforms f2 = {wino_in_avx2, wino_out_avx2, wino_dy_avx2, wino_weight,
                                              wino_weight_grad_out};
    static const struct wino_kernels avx2 = {wino_pad_avx2, gemm_blas, &f2, &sr__wino_f4_avx2};
    static const struct wino_kernels avx2_fma = {wino_pad_avx2, gemm_avx2, &f2, &sr__wino_f4_avx2};
    if (atomic_load_explicit(&wino_mode, memory_order_relaxed) != SR_WINO_PORTABLE && sr__cpu_avx2())
        return sr__cpu_avx2_fma() ? &avx2_fma : &avx2; /* relaxed: see wino_mode */
#endif
    return &wino_plain;
}

static const struct wino_transforms *wino_transforms(const struct wino_kernels *k, const struct wino *wn)
{
    return wn->r == 4 ? k->f4 : k->f2;
}

/* M[xi] = V[xi] U[xi] for the chunk's tc tiles: [T, C] [C, O]. */
static int wino_products(const struct wino_kernels *k, const struct wino *wn, int64_t tc)
{
    int64_t o = wn->g->o, c = wn->g->c;
    int rc = 0;
    for (int xi = 0; !rc && xi < wn->nx; xi++) {
        struct sr__wino_gemm mm = {.m = tc, .n = o, .k = c, .a = wn->v + xi * wn->vx, .ra = wn->vt, .ka = 1,
                                   .b = wn->u + xi * wn->us, .ldb = o, .c = wn->m + xi * wn->mx, .ldc = wn->mt};
        rc = k->gemm(&mm);
    }
    return rc;
}

/* Where V's and M's elements lie (struct wino): F(2x2, 3x3)'s transform
 * elements one after the other, each [T, C] (or [T, O]); F(4x4, 3x3)'s
 * tiles one after the other, each [nx, C] and a skew. Its transforms write
 * (or read) 36 elements per tile: 36 streams 32 bytes at a time took its
 * input transform 3 times as long as one run per tile, which outweighs the
 * products' slower strided rows; with 16 elements per tile, F(2x2, 3x3)
 * is the other way round (15 % slower tile by tile). */
static void wino_layout(struct wino *wn, int64_t t)
{
    int64_t c = wn->g->c, o = wn->g->o;
    if (wn->r == 4) {
        wn->vt = wn->nx * c + SR_WINO_SKEW, wn->vx = c;
        wn->mt = wn->nx * o + SR_WINO_SKEW, wn->mx = o;
    } else {
        wn->vt = c, wn->vx = t * c;
        wn->mt = o, wn->mx = t * o;
    }
}

/* Zero what lies outside rows [top, top + h) and columns [left, left + w)
 * of nb channels-last planes [hp, wp, cn]: a scratch's border, which the
 * pad never writes, so once per call is enough. */
static void zero_border(float *p, int64_t nb, int64_t hp, int64_t wp, int64_t cn, int64_t top, int64_t h,
                        int64_t left, int64_t w)
{
    size_t row = (size_t)(wp * cn) * sizeof(float), lb = (size_t)(left * cn) * sizeof(float);
    size_t rb = (size_t)((wp - left - w) * cn) * sizeof(float);
    for (int64_t y = 0; y < nb * hp; y++, p += wp * cn) {
        int64_t py = y % hp;
        if (py < top || py >= top + h) {
            memset(p, 0, row);
            continue;
        }
        memset(p, 0, lb);
        memset(p + (left + w) * cn, 0, rb);
    }
}

/* One allocation for a call: U, or dU (returned; nx planes [C, O], us apart), wn's V, M and
 * xp for its chunks, then `extra` floats (NULL and an error naming `when`
 * on -ENOMEM). xp's border is zeroed; the rest is the caller's to fill or
 * zero. Freed with free(). */
static float *wino_buffers(struct wino *wn, int64_t extra, const char *when)
{
    const struct conv_geom *g = wn->g;
    int64_t t = wn->nb * wn->rows * wn->tw, pad = wn->nb * g->c * wn->hp * wn->wp, nx = wn->nx;
    wino_layout(wn, t);
    int64_t vlen = (t - 1) * wn->vt + (nx - 1) * wn->vx + g->c, mlen = (t - 1) * wn->mt + (nx - 1) * wn->mx + g->o;
    wn->us = g->c * g->o + SR_WINO_SKEW;
    float *buf = malloc((size_t)(nx * wn->us + vlen + mlen + pad + extra) * sizeof(float));
    if (!buf) {
        sr__fail(-ENOMEM, "sr_conv2d", "%sout of memory for the Winograd buffers of %lld tiles", when, (long long)t);
        return NULL;
    }
    wn->v = buf + nx * wn->us;
    wn->m = wn->v + vlen;
    wn->xp = wn->m + mlen;
    zero_border(wn->xp, wn->nb, wn->hp, wn->wp, g->c, g->ph, g->h, g->pw, g->w);
    return buf;
}

/* dU[xi] += V[xi]^T M[xi] for the chunk's tc tiles: [C, T] [T, O] (dU = that, for the first chunk: no
 * zeroing pass over dU first). */
static int wino_weight_products(const struct wino_kernels *k, const struct wino *wn, float *du, int64_t tc,
                                bool first)
{
    int64_t o = wn->g->o, c = wn->g->c;
    int rc = 0;
    for (int xi = 0; !rc && xi < wn->nx; xi++) {
        struct sr__wino_gemm mm = {.m = c, .n = o, .k = tc, .a = wn->v + xi * wn->vx, .ra = 1, .ka = wn->vt,
                                   .b = wn->m + xi * wn->mx, .ldb = wn->mt, .c = du + xi * wn->us, .ldc = o,
                                   .accumulate = !first};
        rc = k->gemm(&mm);
    }
    return rc;
}

/* dw [o, c, 3, 3] = the gradient of sr__wino_applies's convolution g for
 * x and dy [n, o, oh, ow] (contiguous), written whole. With the forward's
 * tiles: dU[xi] = sum over tiles of V[xi] .* (A dY A^T)[xi] (V = B^T d B as
 * in the forward; an output past the plane has no gradient, so dY's
 * scratch yp is zero there), then dW = G^T dU G: nx C O multiplications
 * per tile (16 per 4 outputs, or 36 per 16) where the unfolded gemm has 9 C O
 * per output. */
int sr__wino_grad_weight(const struct conv_geom *g, const float *x, const float *dy, float *dw)
{
    struct wino wn = wino_plan(g);
    struct conv_geom gy = {.n = g->n, .c = g->o, .h = g->oh, .w = g->ow, .o = g->o, .groups = 1};
    struct wino wy = {.g = &gy, .r = wn.r, .th = wn.th, .tw = wn.tw, .hp = wn.r * wn.th, .wp = wn.r * wn.tw,
                      .nb = wn.nb};
    float *du = wino_buffers(&wn, wn.nb * g->o * wy.hp * wy.wp, "backward: "); /* then dY's scratch */
    if (!du)
        return -ENOMEM;
    wy.xp = wn.xp + wn.nb * g->c * wn.hp * wn.wp;
    zero_border(wy.xp, wy.nb, wy.hp, wy.wp, g->o, 0, g->oh, 0, g->ow);
    const struct wino_kernels *k = wino_kernels();
    const struct wino_transforms *tf = wino_transforms(k, &wn);
    int rc = 0;
    for (int64_t n0 = 0; !rc && n0 < g->n; n0 += wn.nb) {
        int64_t nbc = g->n - n0 < wn.nb ? g->n - n0 : wn.nb;
        k->pad(&wn, x + n0 * g->c * g->h * g->w, nbc);
        k->pad(&wy, dy + n0 * g->o * g->oh * g->ow, nbc);
        for (int64_t ty0 = 0; !rc && ty0 < wn.th; ty0 += wn.rows) {
            int64_t nr = wn.th - ty0 < wn.rows ? wn.th - ty0 : wn.rows;
            tf->in(&wn, nbc, ty0, nr);
            tf->dy(&wn, wy.xp, nbc, ty0, nr);
            rc = wino_weight_products(k, &wn, du, nbc * nr * wn.tw, n0 == 0 && ty0 == 0);
        }
    }
    if (!rc)
        tf->grad(g, du, dw, wn.us);
    free(du);
    atomic_fetch_add_explicit(&wino_runs, 1, memory_order_relaxed); /* relaxed: see wino_runs */
    return rc;
}

/* out [n, o, oh, ow] = conv(x, w) (+ bias) for sr__wino_applies's g: x, w, b contiguous. */
int sr__wino_conv(const struct conv_geom *g, const float *x, const float *w, const float *b, float *out)
{
    struct wino wn = wino_plan(g);
    if (!(wn.u = wino_buffers(&wn, 0, "")))
        return -ENOMEM;
    const struct wino_kernels *k = wino_kernels();
    const struct wino_transforms *tf = wino_transforms(k, &wn);
    tf->weight(g, w, wn.u, wn.us);
    int rc = 0;
    for (int64_t n0 = 0; !rc && n0 < g->n; n0 += wn.nb) {
        int64_t nbc = g->n - n0 < wn.nb ? g->n - n0 : wn.nb;
        k->pad(&wn, x + n0 * g->c * g->h * g->w, nbc);
        for (int64_t ty0 = 0; !rc && ty0 < wn.th; ty0 += wn.rows) {
            int64_t nr = wn.th - ty0 < wn.rows ? wn.th - ty0 : wn.rows;
            tf->in(&wn, nbc, ty0, nr);
            rc = wino_products(k, &wn, nbc * nr * wn.tw);
            if (!rc)
                tf->out(&wn, n0, nbc, ty0, nr, b, out);
        }
    }
    free(wn.u);
    atomic_fetch_add_explicit(&wino_runs, 1, memory_order_relaxed); /* relaxed: see wino_runs */
    return rc;
}
