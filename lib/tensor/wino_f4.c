/* SPDX-License-Identifier: MIT */
/* conv2d's Winograd F(4x4, 3x3) transforms (wino_impl.h, struct
 * wino_transforms): each tile is 4 x 4 outputs from a 6 x 6 input patch,
 *   Y = A^T [ sum_c (G g_oc G^T) .* (B^T d_c B) ] A,
 * 36 products per tile (2.25 per output, where F(2x2, 3x3) has 4 and the
 * direct convolution 9), with the interpolation points 0, 1, -1, 2, -2 and
 * infinity:
 *   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1]
 *   G   = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]
 *   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
 * The weight gradient uses dW = G^T [ sum over tiles (B^T d B) .* (A dY A^T) ] G.
 * Element xi = 6 i + j of a transform is its row i, column j.
 *
 * Channels go 8 at a time in 32-byte vectors (GCC's vector extension: AVX2
 * in the build for it, two SSE halves in the plain one), the last 8
 * overlapping the ones before when the count is not a multiple of 8 (at
 * least 32 channels: sr__wino_applies): the overlap is computed and stored
 * twice, with the same values. A 2D transform is a 1D one on each row of
 * the patch into a small array, then on each of its columns. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "wino_impl.h"

typedef float wv __attribute__((vector_size(32)));

/* Unaligned whole-vector loads and stores (memcpy into an array element
 * became two 16-byte halves, then a 32-byte load of them: a stalled store
 * forward); a vector of floats may alias floats. */
typedef float wvu __attribute__((vector_size(32), aligned(4)));
#define WLD(v, p) ((v) = *(const wvu *)(p))
#define WST(p, v) (*(wvu *)(p) = (v))

/* y = B^T x (6 -> 6) */
#define WINO4_B(x, y)                                                                                          \
    do {                                                                                                       \
        wv a_ = x[4] - 4.0f * x[2], b_ = 4.0f * x[1] - x[3], c_ = x[4] - x[2], e_ = 2.0f * (x[3] - x[1]);      \
        y[0] = 4.0f * x[0] - 5.0f * x[2] + x[4];                                                               \
        y[1] = a_ - b_;                                                                                        \
        y[2] = a_ + b_;                                                                                        \
        y[3] = c_ + e_;                                                                                        \
        y[4] = c_ - e_;                                                                                        \
        y[5] = 4.0f * x[1] - 5.0f * x[3] + x[5];                                                               \
    } while (0)
/* y = A^T x (6 -> 4) */
#define WINO4_AT(x, y)                                                                                         \
    do {                                                                                                       \
        wv s_ = x[1] + x[2], d_ = x[1] - x[2], s2_ = x[3] + x[4], d2_ = x[3] - x[4];                           \
        y[0] = x[0] + s_ + s2_;                                                                                \
        y[1] = d_ + 2.0f * d2_;                                                                                \
        y[2] = s_ + 4.0f * s2_;                                                                                \
        y[3] = d_ + 8.0f * d2_ + x[5];                                                                         \
    } while (0)
/* y = A x (4 -> 6) */
#define WINO4_A(x, y)                                                                                          \
    do {                                                                                                       \
        wv e_ = x[0] + x[2], o_ = x[1] + x[3], e2_ = x[0] + 4.0f * x[2], o2_ = 2.0f * x[1] + 8.0f * x[3];      \
        y[0] = x[0];                                                                                           \
        y[1] = e_ + o_;                                                                                        \
        y[2] = e_ - o_;                                                                                        \
        y[3] = e2_ + o2_;                                                                                      \
        y[4] = e2_ - o2_;                                                                                      \
        y[5] = x[3];                                                                                           \
    } while (0)

/* p[k l + 0 .. n - 1] = lane k of a, b, c, d (columns 0-3) for the 8
 * channels k: the 8 x 4 block transposed in registers, each channel's row
 * stored 16 bytes at a time (n < 4 at the plane's right edge). */
#define DEFINE_WINO4_STORE(SUFFIX, ATTR)                                                                       \
    __attribute__((DIRECT_OPT ATTR)) static inline void store4_##SUFFIX(float *p, int64_t l, const wv *y,      \
                                                                         int64_t n)                            \
    {                                                                                                          \
        wv t0 = WINO_SHUF(y[0], y[1], 0, 8, 1, 9, 4, 12, 5, 13);                                               \
        wv t1 = WINO_SHUF(y[0], y[1], 2, 10, 3, 11, 6, 14, 7, 15);                                             \
        wv t2 = WINO_SHUF(y[2], y[3], 0, 8, 1, 9, 4, 12, 5, 13);                                               \
        wv t3 = WINO_SHUF(y[2], y[3], 2, 10, 3, 11, 6, 14, 7, 15);                                             \
        wv u[4] = {WINO_SHUF(t0, t2, 0, 1, 8, 9, 4, 5, 12, 13), WINO_SHUF(t0, t2, 2, 3, 10, 11, 6, 7, 14, 15), \
                   WINO_SHUF(t1, t3, 0, 1, 8, 9, 4, 5, 12, 13), WINO_SHUF(t1, t3, 2, 3, 10, 11, 6, 7, 14, 15)}; \
        for (int k = 0; k < 4; k++) {                                                                          \
            const float *f = (const float *)&u[k];                                                             \
            switch (n) { /* sizes the compiler knows: no call */                                               \
            case 4: memcpy(p + k * l, f, 16), memcpy(p + (k + 4) * l, f + 4, 16); break;                       \
            case 3: memcpy(p + k * l, f, 12), memcpy(p + (k + 4) * l, f + 4, 12); break;                       \
            case 2: memcpy(p + k * l, f, 8), memcpy(p + (k + 4) * l, f + 4, 8); break;                         \
            default: p[k * l] = f[0], p[(k + 4) * l] = f[4]; break;                                            \
            }                                                                                                  \
        }                                                                                                      \
    }

#define DEFINE_WINO4(SUFFIX, ATTR)                                                                             \
    DEFINE_WINO4_STORE(SUFFIX, ATTR)                                                                           \
    __attribute__((DIRECT_OPT ATTR)) static void in4_##SUFFIX(const struct wino *wn, int64_t nbc, int64_t ty0, \
                                                               int64_t nr)                                     \
    {                                                                                                          \
        int64_t cn = wn->g->c, tc = nbc * nr * wn->tw, xs = wn->vx, rs = wn->wp * cn;                          \
        for (int64_t t = 0; t < tc; t++) {                                                                     \
            int64_t s, ty, tx;                                                                                 \
            sr__wino_tile(wn, t, nr, ty0, &s, &ty, &tx);                                                       \
            const float *d = wn->xp + ((s * wn->hp + 4 * ty) * wn->wp + 4 * tx) * cn;                          \
            for (int64_t c0 = 0; c0 < cn; c0 += 8) {                                                           \
                int64_t c = c0 + 8 <= cn ? c0 : cn - 8;                                                        \
                wv x[6], y[6], rows[6][6];                                                                     \
                for (int i = 0; i < 6; i++) {                                                                  \
                    for (int k = 0; k < 6; k++)                                                                \
                        WLD(x[k], d + i * rs + k * cn + c);                                                    \
                    WINO4_B(x, rows[i]);                                                                       \
                }                                                                                              \
                float *v = wn->v + t * wn->vt + c;                                                             \
                for (int j = 0; j < 6; j++) {                                                                  \
                    for (int i = 0; i < 6; i++)                                                                \
                        x[i] = rows[i][j];                                                                     \
                    WINO4_B(x, y);                                                                             \
                    for (int i = 0; i < 6; i++)                                                                \
                        WST(v + (6 * i + j) * xs, y[i]);                                                       \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
    __attribute__((DIRECT_OPT ATTR)) static void out4_##SUFFIX(const struct wino *wn, int64_t n0, int64_t nbc, \
                                                                int64_t ty0, int64_t nr, const float *b,       \
                                                                float *out)                                    \
    {                                                                                                          \
        const struct conv_geom *g = wn->g;                                                                     \
        int64_t on = g->o, tc = nbc * nr * wn->tw, ms = wn->mx, l = geom_l(g), w = g->ow;                      \
        for (int64_t t = 0; t < tc; t++) {                                                                     \
            int64_t s, ty, tx;                                                                                 \
            sr__wino_tile(wn, t, nr, ty0, &s, &ty, &tx);                                                       \
            int64_t oy = 4 * ty, ox = 4 * tx, nw = w - ox < 4 ? w - ox : 4, nh = g->oh - oy < 4 ? g->oh - oy : 4; \
            float *d = out + (n0 + s) * on * l + oy * w + ox;                                                  \
            for (int64_t o0 = 0; o0 < on; o0 += 8) {                                                           \
                int64_t o = o0 + 8 <= on ? o0 : on - 8;                                                        \
                const float *mo = wn->m + t * wn->mt + o;                                                      \
                wv x[6], y[4], rows[6][4], bias = {0};                                                         \
                if (b)                                                                                         \
                    WLD(bias, b + o);                                                                          \
                for (int i = 0; i < 6; i++) {                                                                  \
                    for (int j = 0; j < 6; j++)                                                                \
                        WLD(x[j], mo + (6 * i + j) * ms);                                                      \
                    WINO4_AT(x, rows[i]);                                                                      \
                }                                                                                              \
                wv cols[4][4]; /* cols[q][p]: output row p, column q */                                        \
                for (int q = 0; q < 4; q++) {                                                                  \
                    for (int i = 0; i < 6; i++)                                                                \
                        x[i] = rows[i][q];                                                                     \
                    WINO4_AT(x, cols[q]);                                                                      \
                }                                                                                              \
                for (int p = 0; p < nh; p++) {                                                                 \
                    for (int q = 0; q < 4; q++)                                                                \
                        y[q] = cols[q][p] + bias;                                                              \
                    store4_##SUFFIX(d + o * l + p * w, l, y, nw);                                              \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
    __attribute__((DIRECT_OPT ATTR)) static void dy4_##SUFFIX(const struct wino *wn, const float *yp,          \
                                                               int64_t nbc, int64_t ty0, int64_t nr)           \
    {                                                                                                          \
        int64_t on = wn->g->o, tc = nbc * nr * wn->tw, ms = wn->mx, rs = 4 * wn->tw * on;                      \
        for (int64_t t = 0; t < tc; t++) {                                                                     \
            int64_t s, ty, tx;                                                                                 \
            sr__wino_tile(wn, t, nr, ty0, &s, &ty, &tx);                                                       \
            const float *d = yp + ((s * 4 * wn->th + 4 * ty) * 4 * wn->tw + 4 * tx) * on;                      \
            for (int64_t o0 = 0; o0 < on; o0 += 8) {                                                           \
                int64_t o = o0 + 8 <= on ? o0 : on - 8;                                                        \
                wv x[6], y[6], rows[4][6];                                                                     \
                for (int r = 0; r < 4; r++) {                                                                  \
                    for (int q = 0; q < 4; q++)                                                                \
                        WLD(x[q], d + r * rs + q * on + o);                                                    \
                    WINO4_A(x, rows[r]);                                                                       \
                }                                                                                              \
                float *m = wn->m + t * wn->mt + o;                                                             \
                for (int j = 0; j < 6; j++) {                                                                  \
                    for (int r = 0; r < 4; r++)                                                                \
                        x[r] = rows[r][j];                                                                     \
                    WINO4_A(x, y);                                                                             \
                    for (int i = 0; i < 6; i++)                                                                \
                        WST(m + (6 * i + j) * ms, y[i]);                                                       \
                }                                                                                              \
            }                                                                                                  \
        }                                                                                                      \
    }

DEFINE_WINO4(plain, )
#if defined(__x86_64__) && defined(__GNUC__)
DEFINE_WINO4(avx2, target("avx2,fma"))
#endif

/* G's and G^T's entries as products by reciprocals (a division costs
 * several times a multiplication, and the weight is transformed for every
 * micro-batch's forward and grad input): they round within an ulp of the
 * quotients. */
#define W4_4 0.25f
#define W4_6 (1.0f / 6.0f)
#define W4_12 (1.0f / 12.0f)
#define W4_24 (1.0f / 24.0f)
/* y = G x (3 -> 6), T a float or a vector of them */
#define WINO4_G(T, x, y)                                                                                       \
    do {                                                                                                       \
        T p_ = x[0] + x[2], q_ = x[0] * W4_24 + x[2] * W4_6;                                                   \
        y[0] = x[0] * W4_4;                                                                                    \
        y[1] = -(p_ + x[1]) * W4_6;                                                                            \
        y[2] = -(p_ - x[1]) * W4_6;                                                                            \
        y[3] = q_ + x[1] * W4_12;                                                                              \
        y[4] = q_ - x[1] * W4_12;                                                                              \
        y[5] = x[2];                                                                                           \
    } while (0)
/* y = G^T x (6 -> 3) */
#define WINO4_GT(T, x, y)                                                                                      \
    do {                                                                                                       \
        T s12_ = x[1] + x[2], s34_ = x[3] + x[4];                                                              \
        y[0] = x[0] * W4_4 - s12_ * W4_6 + s34_ * W4_24;                                                       \
        y[1] = (x[2] - x[1]) * W4_6 + (x[3] - x[4]) * W4_12;                                                   \
        y[2] = (s34_ - s12_) * W4_6 + x[5];                                                                    \
    } while (0)

/* U[6 i + j][c][o] = (G g G^T)[i][j] for the 3 x 3 kernel k (9 of T, row-major); store(xi, value). */
#define WINO4_WEIGHT(T, k, store)                                                                              \
    do {                                                                                                       \
        T x_[3], c_[6], r_[6][3], y_[6];                                                                       \
        for (int col = 0; col < 3; col++) { /* G g: each column of g */                                        \
            for (int a = 0; a < 3; a++)                                                                        \
                x_[a] = k[3 * a + col];                                                                        \
            WINO4_G(T, x_, c_);                                                                                \
            for (int i = 0; i < 6; i++)                                                                        \
                r_[i][col] = c_[i];                                                                            \
        }                                                                                                      \
        for (int i = 0; i < 6; i++) { /* then each row times G^T */                                            \
            WINO4_G(T, r_[i], y_);                                                                             \
            for (int j = 0; j < 6; j++)                                                                        \
                store(6 * i + j, y_[j]);                                                                       \
        }                                                                                                      \
    } while (0)

/* dW[o][c] = G^T dU[.][c][o] G: eight output channels at a time, as weight4. */
#define WINO4_GRAD(T, load, store)                                                                             \
    do {                                                                                                       \
        T x_[6], z_[3], t_[3][6], y_[3];                                                                       \
        for (int j = 0; j < 6; j++) { /* G^T dU: each column */                                                \
            for (int i = 0; i < 6; i++)                                                                        \
                load(x_[i], 6 * i + j);                                                                        \
            WINO4_GT(T, x_, z_);                                                                               \
            for (int a = 0; a < 3; a++)                                                                        \
                t_[a][j] = z_[a];                                                                              \
        }                                                                                                      \
        for (int a = 0; a < 3; a++) { /* then each row times G */                                              \
            WINO4_GT(T, t_[a], y_);                                                                            \
            for (int b = 0; b < 3; b++)                                                                        \
                store(3 * a + b, y_[b]);                                                                       \
        }                                                                                                      \
    } while (0)

/* The loads and stores of weight4 and grad4 (their locals: uc, oc (U's plane stride), o, c, g, dw). */
#define W4_STORE_VEC(xi, val) WST(uc + (xi) * oc + o, val)
#define W4_STORE_ONE(xi, val) (uc[(xi) * oc + o] = (val))
#define W4_LOAD_VEC(dst, xi) WLD(dst, uc + (xi) * oc + o)
#define W4_LOAD_ONE(dst, xi) ((dst) = uc[(xi) * oc + o])
#define W4_STORE_DW_VEC(e, val)                                                                                \
    do {                                                                                                       \
        wv v_ = (val);                                                                                         \
        for (int l = 0; l < 8; l++)                                                                            \
            dw[((o + l) * g->c + c) * 9 + (e)] = v_[l];                                                        \
    } while (0)
#define W4_STORE_DW_ONE(e, val) (dw[(o * g->c + c) * 9 + (e)] = (val))

#define DEFINE_WINO4_WEIGHTS(SUFFIX, ATTR)                                                                     \
/* U, eight output channels at a time (U's rows are contiguous in o), the last o < 8 one at a time. */         \
__attribute__((DIRECT_OPT ATTR)) static void weight4_##SUFFIX(const struct conv_geom *g, const float *w, float *u, \
                                                              int64_t oc)                                      \
{                                                                                                              \
    int64_t o8 = g->o - g->o % 8;                                                                              \
    for (int64_t c = 0; c < g->c; c++) {                                                                       \
        float *uc = u + c * g->o;                                                                              \
        for (int64_t o = 0; o < o8; o += 8) {                                                                  \
            wv k[9];                                                                                           \
            for (int e = 0; e < 9; e++)                                                                        \
                for (int l = 0; l < 8; l++)                                                                    \
                    k[e][l] = w[((o + l) * g->c + c) * 9 + e];                                                 \
            WINO4_WEIGHT(wv, k, W4_STORE_VEC);                                                                 \
        }                                                                                                      \
        for (int64_t o = o8; o < g->o; o++) {                                                                  \
            const float *k = w + (o * g->c + c) * 9;                                                           \
            WINO4_WEIGHT(float, k, W4_STORE_ONE);                                                              \
        }                                                                                                      \
    }                                                                                                          \
}                                                                                                              \
/* dW, eight output channels at a time, as weight4 */                                                          \
__attribute__((DIRECT_OPT ATTR)) static void grad4_##SUFFIX(const struct conv_geom *g, const float *du, float *dw, \
                                                            int64_t oc)                                        \
{                                                                                                              \
    int64_t o8 = g->o - g->o % 8;                                                                              \
    for (int64_t c = 0; c < g->c; c++) {                                                                       \
        const float *uc = du + c * g->o;                                                                       \
        for (int64_t o = 0; o < o8; o += 8)                                                                    \
            WINO4_GRAD(wv, W4_LOAD_VEC, W4_STORE_DW_VEC);                                                      \
        for (int64_t o = o8; o < g->o; o++)                                                                    \
            WINO4_GRAD(float, W4_LOAD_ONE, W4_STORE_DW_ONE);                                                   \
    }                                                                                                          \
}                                                                                                              \

DEFINE_WINO4_WEIGHTS(plain, )
#if defined(__x86_64__) && defined(__GNUC__)
DEFINE_WINO4_WEIGHTS(avx2, target("avx2,fma"))
#endif

const struct wino_transforms sr__wino_f4_plain = {in4_plain, out4_plain, dy4_plain, weight4_plain, grad4_plain};
#if defined(__x86_64__) && defined(__GNUC__)
const struct wino_transforms sr__wino_f4_avx2 = {in4_avx2, out4_avx2, dy4_avx2, weight4_avx2, grad4_avx2};
#endif
