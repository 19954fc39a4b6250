/* SPDX-License-Identifier: MIT */
/* The thin products of conv2d's Winograd path without packing (conv.h,
 * struct sr__wino_gemm): C (+)= A B with A read in place through two
 * strides, for AVX2 with FMA.
 *
 * Winograd's 16 (or 36) products per chunk are small: [T, C] [C, O] with C and O
 * of 32 to a few hundred (forward, grad input) or [C, T] [T, O] (grad
 * weight). A BLAS packs both operands on every call; at these sizes its
 * packing took a fifth of the products' time, and the forward's B (the
 * transformed weight) is the same for every chunk. Here a micro-kernel
 * computes a block of MR rows by 16 columns of C in 2 x MR registers, over
 * the whole of k: each step loads 16 floats of B's row k and broadcasts
 * MR elements of A's column k from where they lie (A[i ra + k ka]). A's
 * block and B's 16 columns stay in L1 across the k loop at these sizes.
 * The columns go 16 at a time, then a last block of up to 16 with masked
 * loads and stores, so any n works. Each element of C is one sum over k in
 * order, in f32 with fused multiply-adds. */
#include <stdbool.h>
#include <stdint.h>

#include "conv.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define WG_ATTR __attribute__((DIRECT_OPT target("avx2,fma")))
#define WG_INLINE __attribute__((DIRECT_OPT target("avx2,fma"), always_inline)) static inline

enum { WG_MR = 6, WG_NR = 16 };

/* Lanes n0 .. n0 + 7 of a block whose valid columns are [0, n): all-ones
 * lanes where the column exists. */
WG_INLINE __m256i wg_mask(int64_t n, int64_t n0)
{
    __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - n0)), lane);
}

/* C[i][0 .. 15] (+)= sum over k of A[i ra + k ka] B[k ldb + 0 .. 15], i < mr
 * (a constant at each call: the loops unroll and the sums stay in
 * registers). With `masked`, only the columns below nv are loaded and
 * stored. */
WG_INLINE void wg_block(const struct sr__wino_gemm *g, int mr, bool masked, int64_t nv, const float *a,
                        const float *b, float *c)
{
    __m256 s0[WG_MR], s1[WG_MR];
    __m256i m0 = wg_mask(nv, 0), m1 = wg_mask(nv, 8);
    int64_t ra = g->ra, ka = g->ka, ldb = g->ldb, kn = g->k;
    for (int i = 0; i < mr; i++)
        s0[i] = s1[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kn; k++, a += ka, b += ldb) {
        __m256 b0 = masked ? _mm256_maskload_ps(b, m0) : _mm256_loadu_ps(b);
        __m256 b1 = masked ? _mm256_maskload_ps(b + 8, m1) : _mm256_loadu_ps(b + 8);
        for (int i = 0; i < mr; i++) {
            __m256 av = _mm256_broadcast_ss(a + i * ra);
            s0[i] = _mm256_fmadd_ps(av, b0, s0[i]);
            s1[i] = _mm256_fmadd_ps(av, b1, s1[i]);
        }
    }
    for (int i = 0; i < mr; i++) {
        float *ci = c + i * g->ldc;
        if (g->accumulate) {
            s0[i] = _mm256_add_ps(s0[i], masked ? _mm256_maskload_ps(ci, m0) : _mm256_loadu_ps(ci));
            s1[i] = _mm256_add_ps(s1[i], masked ? _mm256_maskload_ps(ci + 8, m1) : _mm256_loadu_ps(ci + 8));
        }
        if (masked) {
            _mm256_maskstore_ps(ci, m0, s0[i]);
            _mm256_maskstore_ps(ci + 8, m1, s1[i]);
        } else {
            _mm256_storeu_ps(ci, s0[i]);
            _mm256_storeu_ps(ci + 8, s1[i]);
        }
    }
}

/* The rows i0 .. i0 + mr - 1 (mr <= WG_MR) of one block of 16 columns. */
WG_INLINE void wg_rows(const struct sr__wino_gemm *g, int64_t i0, int64_t mr, bool masked, int64_t nv,
                       const float *b, float *c)
{
    const float *a = g->a + i0 * g->ra;
    c += i0 * g->ldc;
    switch (mr) {
    case 6: wg_block(g, 6, masked, nv, a, b, c); break;
    case 5: wg_block(g, 5, masked, nv, a, b, c); break;
    case 4: wg_block(g, 4, masked, nv, a, b, c); break;
    case 3: wg_block(g, 3, masked, nv, a, b, c); break;
    case 2: wg_block(g, 2, masked, nv, a, b, c); break;
    default: wg_block(g, 1, masked, nv, a, b, c); break;
    }
}

/* A block of rows across all the columns before the next block: each row
 * of C is written whole in one go (with F(4x4, 3x3)'s tile-major M the
 * rows lie 9 KiB apart), and A's few rows are read once per column block
 * from L1. */
WG_ATTR void sr__wino_gemm_avx2(const struct sr__wino_gemm *g)
{
    for (int64_t i = 0; i < g->m; i += WG_MR) {
        int64_t mr = g->m - i < WG_MR ? g->m - i : WG_MR;
        for (int64_t j = 0; j < g->n; j += WG_NR) {
            bool masked = g->n - j < WG_NR;
            if (masked)
                wg_rows(g, i, mr, true, g->n - j, g->b + j, g->c + j);
            else
                wg_rows(g, i, mr, false, WG_NR, g->b + j, g->c + j);
        }
    }
}
#endif
