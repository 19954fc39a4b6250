/* SPDX-License-Identifier: MIT */
/* conv2d's geometry, shared by its im2col paths (conv.c) and its Winograd
 * path (winograd.c); internal to the tensor layer. */
#ifndef SR_LIB_TENSOR_CONV_H
#define SR_LIB_TENSOR_CONV_H

#if !defined(SR__IN_TENSOR)
#error "conv.h is private to the tensor layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stdint.h>

#include "shmrpc/tensor.h"

struct conv_geom {
    int64_t n, c, h, w;     /* input */
    int64_t o, kh, kw;      /* weight [o, c / groups, kh, kw] */
    int64_t oh, ow;         /* output plane */
    int64_t sh, sw, ph, pw, dh, dw, groups;
};

static inline int64_t geom_cg(const struct conv_geom *g) { return g->c / g->groups; }
static inline int64_t geom_og(const struct conv_geom *g) { return g->o / g->groups; }
static inline int64_t geom_k(const struct conv_geom *g) { return geom_cg(g) * g->kh * g->kw; }
static inline int64_t geom_l(const struct conv_geom *g) { return g->oh * g->ow; }

/* The kernels built with their own optimisation options (GCC): -O3, fused
 * multiply-adds, and no loops turned into memcpy/memset calls. */
#if defined(__GNUC__) && !defined(__clang__)
#define DIRECT_OPT optimize("O3", "fp-contract=fast", "no-tree-loop-distribute-patterns"),
#else
#define DIRECT_OPT
#endif

/* Winograd F(2x2, 3x3) (winograd.c): whether g takes it (f32, 3 x 3,
 * stride 1, no dilation, one group, padding at most 2, at least
 * SR_WINO_MIN_CH channels in and out, not switched off), and
 * out [n, o, oh, ow] = conv(x, w) (+ b, NULL: none) for such a g, with x, w
 * and b contiguous. 0, or -ENOMEM. */
bool sr__wino_applies(const struct conv_geom *g, sr_dtype dt);
int sr__wino_conv(const struct conv_geom *g, const float *x, const float *w, const float *b, float *out);
/* dw [o, c, 3, 3] (written whole) = the weight gradient of such a g for x
 * and dy [n, o, oh, ow], all contiguous. 0, or -ENOMEM. */
int sr__wino_grad_weight(const struct conv_geom *g, const float *x, const float *dy, float *dw);

/* One of the Winograd path's products (wino_gemm.c): C [m, n] = A B, or
 * C += A B with `accumulate`; A [m, k] read in place, element (i, k) at
 * a[i ra + k ka] (either layout, no transposed copy); B [k, n] and C
 * row-major with row strides ldb, ldc. f32; nothing allocated, nothing
 * fails. sr__wino_gemm_avx2 is for a CPU with AVX2 and FMA
 * (sr__cpu_avx2_fma). */
struct sr__wino_gemm {
    int64_t m, n, k;
    const float *a;
    int64_t ra, ka;
    const float *b;
    int64_t ldb;
    float *c;
    int64_t ldc;
    bool accumulate;
};
#if defined(__x86_64__) && defined(__GNUC__)
void sr__wino_gemm_avx2(const struct sr__wino_gemm *g);
#endif

#endif
