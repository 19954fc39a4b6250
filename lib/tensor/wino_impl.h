/* SPDX-License-Identifier: MIT */
/* conv2d's Winograd path, shared by its driver (winograd.c: plans, buffers,
 * products, the F(2x2, 3x3) transforms) and the F(4x4, 3x3) transforms
 * (wino_f4.c); internal to the tensor layer. */
#ifndef SR_LIB_TENSOR_WINO_IMPL_H
#define SR_LIB_TENSOR_WINO_IMPL_H

#if !defined(SR__IN_TENSOR)
#error "wino_impl.h is private to the tensor layer (docs/ARCHITECTURE.md)"
#endif
#include <stdint.h>
#include <string.h>

#include "conv.h"

/* One call's plan and scratch, owned by that call (on its stack). */
struct wino {
    const struct conv_geom *g;
    int r;          /* outputs per tile side: 2 (F(2x2, 3x3)) or 4 (F(4x4, 3x3)) */
    int nx;         /* transform elements per tile: (r + 2)^2, 16 or 36 */
    int64_t th, tw; /* tiles down and across an output plane */
    int64_t hp, wp; /* the bordered input planes: r th + 2, r tw + 2 */
    int64_t nb;     /* a chunk: nb samples' whole planes (rows = th), or */
    int64_t rows;   /* `rows` tile rows of one sample (nb = 1) */
    int64_t vt, vx; /* V's element (t, xi, c) at v[t vt + xi vx + c] (wino_layout) */
    int64_t mt, mx; /* M's element (t, xi, o) at m[t mt + xi mx + o] */
    int64_t us;     /* U's (and dU's) planes [C, O]: us floats apart, C O and a skew */
    float *u, *v, *m, *xp; /* U [nx, C, O]; V [T, nx, C] and M [T, nx, O] (each tile's run vt, mt
                            * floats: its transform elements side by side); xp [nb, hp, wp, C] */
};

/* One tile size's transforms (all f32, channels last in the scratches; V
 * and M laid out as struct wino says):
 *   in      V(t, xi, c) = (B^T d B)[xi] for the chunk's tiles (nbc samples,
 *           tile rows [ty0, ty0 + nr)), from wn->xp;
 *   out     out[n0 + s][o] = A^T M A (+ b) for those tiles; a row or column
 *           past the plane is not stored;
 *   dy      M(t, xi, o) = (A dY A^T)[xi] from dY channels last in yp
 *           ([nbc, r th, r tw, O], zero past the plane);
 *   weight  U[xi][c][o] = (G g_oc G^T)[xi] of w [O, C, 3, 3], U's planes
 *           [C, O] us floats apart;
 *   grad    dw [O, C, 3, 3] = G^T dU[.][c][o] G, from dU's planes, us apart. */
struct wino_transforms {
    void (*in)(const struct wino *wn, int64_t nbc, int64_t ty0, int64_t nr);
    void (*out)(const struct wino *wn, int64_t n0, int64_t nbc, int64_t ty0, int64_t nr, const float *b,
                float *out);
    void (*dy)(const struct wino *wn, const float *yp, int64_t nbc, int64_t ty0, int64_t nr);
    void (*weight)(const struct conv_geom *g, const float *w, float *u, int64_t us);
    void (*grad)(const struct conv_geom *g, const float *du, float *dw, int64_t us);
};

/* F(4x4, 3x3) (wino_f4.c): in plain C, and built for AVX2 (use where
 * sr__cpu_avx2). */
extern const struct wino_transforms sr__wino_f4_plain;
#if defined(__x86_64__) && defined(__GNUC__)
extern const struct wino_transforms sr__wino_f4_avx2;
#endif

/* Lane i of the result: lane k of a (k < 8) or k - 8 of b (32-byte
 * vectors of 8 lanes), for the i-th index (GCC's __builtin_shuffle; clang
 * spells it __builtin_shufflevector). */
typedef int sr__wino_lanes __attribute__((vector_size(32)));
#if defined(__clang__)
#define WINO_SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define WINO_SHUF(a, b, ...) __builtin_shuffle(a, b, (sr__wino_lanes){__VA_ARGS__})
#endif

/* The tile's sample, tile row and tile column of chunk tile t (tiles in
 * order: samples, then rows from ty0, then columns). */
static inline void sr__wino_tile(const struct wino *wn, int64_t t, int64_t nr, int64_t ty0, int64_t *s, int64_t *ty,
                                 int64_t *tx)
{
    *s = t / (nr * wn->tw);
    *ty = ty0 + t / wn->tw % nr;
    *tx = t % wn->tw;
}

#endif
