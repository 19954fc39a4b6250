/* SPDX-License-Identifier: MIT */
/* Matrix multiply kernel (internal): C[m x n] = op(A)[m x k] op(B)[k x n],
 * row-major, op = transpose when ta/tb. C is overwritten, or added to when
 * `accumulate` (BLAS's beta = 1: a convolution's weight gradient summed over
 * the samples of a batch). */
#ifndef SR_LIB_TENSOR_GEMM_H
#define SR_LIB_TENSOR_GEMM_H

#if !defined(SR__IN_TENSOR)
#error "gemm.h is private to the tensor layer (docs/ARCHITECTURE.md)"
#endif
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "shmrpc/tensor.h"

struct sr_gemm {
    sr_dtype dt; /* SR_F32 or SR_F64 */
    bool ta, tb;
    int64_t m, n, k;
    const void *a;
    int64_t lda; /* row stride of A as stored (k if !ta, m if ta, at least) */
    const void *b;
    int64_t ldb;
    void *c;
    int64_t ldc;
    bool accumulate; /* C += op(A) op(B) */
};

/* 0, or -1 when the blocked path could not allocate its panels. */
int sr__gemm(const struct sr_gemm *g);
/* Which kernel runs (tests, benchmark): AUTO is BLAS when built with it,
 * else the blocked loop with the best micro-kernel for the CPU; BLOCKED skips
 * BLAS; PORTABLE also skips the AVX2 micro-kernel. */
enum sr_gemm_mode { SR_GEMM_AUTO, SR_GEMM_BLOCKED, SR_GEMM_PORTABLE };
void sr__gemm_set_mode(enum sr_gemm_mode mode);
/* "avx2" or "portable": the blocked loop's micro-kernel on this CPU. */
const char *sr__gemm_kernel_name(void);
/* conv2d's Winograd path (winograd.c, for tests): whether it may be taken (AUTO,
 * the default: with its AVX2 transforms where the CPU has them; PORTABLE:
 * with the plain ones; OFF: those shapes take the im2col paths), and how
 * many times it has run (forwards, grad inputs, grad weights) in this process. */
enum sr_wino_mode { SR_WINO_OFF, SR_WINO_AUTO, SR_WINO_PORTABLE };
void sr__conv_set_winograd(enum sr_wino_mode mode);
/* The Winograd tile for tests: 0 (the default) takes F(2x2, 3x3) or
 * F(4x4, 3x3) by the count of products over the plane; 2 or 4 forces one. */
void sr__conv_set_winograd_tile(int r);
uint64_t sr__conv_winograd_runs(void);
#if defined(__x86_64__) && defined(__GNUC__)
/* Whether this CPU runs AVX2 (and FMA) code, probed once (gemm.c): for the
 * kernels that pick a build at run time. */
bool sr__cpu_avx2(void);
bool sr__cpu_avx2_fma(void);
#endif

#endif
