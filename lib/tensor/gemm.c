/* SPDX-License-Identifier: MIT */
/* C = op(A) op(B) for f32/f64: cblas_?gemm when built with OpenBLAS
 * (SR_HAVE_CBLAS), a packed cache-blocked loop otherwise (or when forced,
 * for tests and the benchmark).
 *
 * OpenBLAS threads are a choice made once, before the first BLAS call, by
 * SHMRPC_BLAS_THREADS (docs/TENSORS.md, "matmul"):
 *   unset   one thread: every worker process is already one compute thread of
 *           the job. Unless OPENBLAS_NUM_THREADS is set: then that setting
 *           stands (the user asked OpenBLAS for it).
 *   n >= 1  n threads.
 *   keep    shmrpc never sets the count: a host application's own
 *           openblas_set_num_threads() or OPENBLAS_NUM_THREADS stands.
 * Anything else is reported on stderr (naming the value) and treated as
 * unset. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gemm.h"
#include "log.h"

/* Relaxed: a test/bench switch, flipped while no gemm runs. */
static _Atomic int gemm_mode = SR_GEMM_AUTO;

void sr__gemm_set_mode(enum sr_gemm_mode mode) { atomic_store_explicit(&gemm_mode, mode, memory_order_relaxed); }

#ifdef SR_HAVE_CBLAS
#include <cblas.h>

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

/* The thread count SHMRPC_BLAS_THREADS asks for: n >= 1, 0 for "keep", -1
 * when unset or unreadable (then the default applies). */
static int blas_threads_wanted(void)
{
    const char *env = getenv("SHMRPC_BLAS_THREADS");
    if (!env)
        return -1;
    if (!strcmp(env, "keep"))
        return 0;
    char *end;
    errno = 0;
    long n = strtol(env, &end, 10);
    if (end != env && !*end && !errno && n >= 1 && n <= 4096)
        return (int)n;
    sr_logf(SR_LOG_WARN, "matmul: SHMRPC_BLAS_THREADS='%s' is neither a thread count (1..4096) nor 'keep'; "
                         "using the default", env);
    return -1;
}

static void blas_init(void)
{
    int n = blas_threads_wanted();
    if (n < 0) /* the default: one thread, unless OpenBLAS's own variable says otherwise */
        n = getenv("OPENBLAS_NUM_THREADS") ? 0 : 1;
    if (n > 0)
        openblas_set_num_threads(n);
}

static void blas_init_once(void) { pthread_once(&blas_once, blas_init); }

/* The choice is made in a process before it forks, too (sr_spawn's
 * workers, a test's jobs), so that a forked child inherits it made.
 * OpenBLAS shuts its thread pool down before a fork (its own prepare
 * handler, which runs after ours: registered earlier) and rebuilds it in
 * the child at the next openblas_set_num_threads: a child that made the
 * choice itself got a pool thread that never works, spinning on
 * sched_yield for about 0.1 s of CPU (90,000-200,000 yields in each
 * bench_train worker), on the cores the job computes on. */
__attribute__((constructor)) static void blas_choose_before_fork(void)
{
    pthread_atfork(blas_init_once, NULL, NULL);
}
#endif


SR_API const char *sr_matmul_backend(void)
{
#ifdef SR_HAVE_CBLAS
    if (atomic_load_explicit(&gemm_mode, memory_order_relaxed) == SR_GEMM_AUTO)
        return "openblas";
#endif
    return "blocked";
}

/* Block sizes: a KC x NC panel of B (256 KiB in f64) stays in L2 while MC
 * rows of A stream past it. */
enum { MC = 64, KC = 256, NC = 128 };

/* Copy op(X)[r0:r0+rows, c0:c0+cols] into dst (row-major, cols wide). */
static void pack_f64(double *dst, const double *x, int64_t ld, bool trans, int64_t r0, int64_t c0, int64_t rows,
                     int64_t cols)
{
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            dst[i * cols + j] = trans ? x[(c0 + j) * ld + r0 + i] : x[(r0 + i) * ld + c0 + j];
}

static void pack_f32(float *dst, const float *x, int64_t ld, bool trans, int64_t r0, int64_t c0, int64_t rows,
                     int64_t cols)
{
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            dst[i * cols + j] = trans ? x[(c0 + j) * ld + r0 + i] : x[(r0 + i) * ld + c0 + j];
}

/* C[mc x nc] += Ap[mc x kc] Bp[kc x nc] (packed panels). Two kernels:
 * - a portable one, compiled at -O3 so the j loops vectorise, four rows of C
 *   at a time so each loaded row of B feeds four rows;
 * - on x86-64 CPUs with AVX2 (checked at run time), one that keeps a 4 x 8
 *   (f64) or 4 x 16 (f32) tile of C in vector registers over all of kc. */
#if defined(__GNUC__) && !defined(__clang__)
#define PORTABLE __attribute__((optimize("O3")))
#define AVX2 __attribute__((target("avx2"), optimize("O3")))
#else
#define PORTABLE
#define AVX2 __attribute__((target("avx2")))
#endif

PORTABLE static void portable_f64(double *c, int64_t ldc, const double *ap, const double *bp, int64_t mc, int64_t nc,
                                  int64_t kc)
{
    int64_t i = 0;
    for (; i + 4 <= mc; i += 4) {
        double *c0 = c + i * ldc, *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc;
        for (int64_t k = 0; k < kc; k++) {
            double a0 = ap[i * kc + k], a1 = ap[(i + 1) * kc + k], a2 = ap[(i + 2) * kc + k],
                   a3 = ap[(i + 3) * kc + k];
            const double *b = bp + k * nc;
            for (int64_t j = 0; j < nc; j++) {
                c0[j] += a0 * b[j];
                c1[j] += a1 * b[j];
                c2[j] += a2 * b[j];
                c3[j] += a3 * b[j];
            }
        }
    }
    for (; i < mc; i++)
        for (int64_t k = 0; k < kc; k++) {
            double a = ap[i * kc + k];
            for (int64_t j = 0; j < nc; j++)
                c[i * ldc + j] += a * bp[k * nc + j];
        }
}

PORTABLE static void portable_f32(float *c, int64_t ldc, const float *ap, const float *bp, int64_t mc, int64_t nc,
                                  int64_t kc)
{
    int64_t i = 0;
    for (; i + 4 <= mc; i += 4) {
        float *c0 = c + i * ldc, *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc;
        for (int64_t k = 0; k < kc; k++) {
            float a0 = ap[i * kc + k], a1 = ap[(i + 1) * kc + k], a2 = ap[(i + 2) * kc + k],
                  a3 = ap[(i + 3) * kc + k];
            const float *b = bp + k * nc;
            for (int64_t j = 0; j < nc; j++) {
                c0[j] += a0 * b[j];
                c1[j] += a1 * b[j];
                c2[j] += a2 * b[j];
                c3[j] += a3 * b[j];
            }
        }
    }
    for (; i < mc; i++)
        for (int64_t k = 0; k < kc; k++) {
            float a = ap[i * kc + k];
            for (int64_t j = 0; j < nc; j++)
                c[i * ldc + j] += a * bp[k * nc + j];
        }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX2_KERNEL 1
typedef double v4d __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));

AVX2 static void avx2_f64(double *c, int64_t ldc, const double *ap, const double *bp, int64_t mc, int64_t nc,
                          int64_t kc)
{
    int64_t mt = mc - mc % 4, nt = nc - nc % 8;
    for (int64_t i = 0; i < mt; i += 4) {
        for (int64_t j = 0; j < nt; j += 8) {
            v4d acc[4][2] = {{{0}}};
            for (int64_t k = 0; k < kc; k++) {
                v4d b0, b1;
                memcpy(&b0, bp + k * nc + j, sizeof(b0));
                memcpy(&b1, bp + k * nc + j + 4, sizeof(b1));
                for (int r = 0; r < 4; r++) {
                    double x = ap[(i + r) * kc + k];
                    v4d a = {x, x, x, x};
                    acc[r][0] += a * b0;
                    acc[r][1] += a * b1;
                }
            }
            for (int r = 0; r < 4; r++)
                for (int q = 0; q < 8; q++)
                    c[(i + r) * ldc + j + q] += acc[r][q / 4][q % 4];
        }
        for (int64_t r = i; r < i + 4; r++) /* columns past the last full tile */
            for (int64_t k = 0; k < kc; k++)
                for (int64_t j = nt; j < nc; j++)
                    c[r * ldc + j] += ap[r * kc + k] * bp[k * nc + j];
    }
    for (int64_t r = mt; r < mc; r++) /* rows past the last full tile */
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < nc; j++)
                c[r * ldc + j] += ap[r * kc + k] * bp[k * nc + j];
}

AVX2 static void avx2_f32(float *c, int64_t ldc, const float *ap, const float *bp, int64_t mc, int64_t nc,
                          int64_t kc)
{
    int64_t mt = mc - mc % 4, nt = nc - nc % 16;
    for (int64_t i = 0; i < mt; i += 4) {
        for (int64_t j = 0; j < nt; j += 16) {
            v8f acc[4][2] = {{{0}}};
            for (int64_t k = 0; k < kc; k++) {
                v8f b0, b1;
                memcpy(&b0, bp + k * nc + j, sizeof(b0));
                memcpy(&b1, bp + k * nc + j + 8, sizeof(b1));
                for (int r = 0; r < 4; r++) {
                    float x = ap[(i + r) * kc + k];
                    v8f a = {x, x, x, x, x, x, x, x};
                    acc[r][0] += a * b0;
                    acc[r][1] += a * b1;
                }
            }
            for (int r = 0; r < 4; r++)
                for (int q = 0; q < 16; q++)
                    c[(i + r) * ldc + j + q] += acc[r][q / 8][q % 8];
        }
        for (int64_t r = i; r < i + 4; r++)
            for (int64_t k = 0; k < kc; k++)
                for (int64_t j = nt; j < nc; j++)
                    c[r * ldc + j] += ap[r * kc + k] * bp[k * nc + j];
    }
    for (int64_t r = mt; r < mc; r++)
        for (int64_t k = 0; k < kc; k++)
            for (int64_t j = 0; j < nc; j++)
                c[r * ldc + j] += ap[r * kc + k] * bp[k * nc + j];
}

/* This CPU's AVX2 (bit 0) and FMA (bit 1), probed once for every kernel
 * that picks a build at run time (gemm.h). */
static int cpu_features(void)
{
    /* relaxed: every thread computes the same answer; a race only repeats the probe */
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        v = (__builtin_cpu_supports("avx2") ? 1 : 0) | (__builtin_cpu_supports("fma") ? 2 : 0);
        atomic_store_explicit(&cached, v, memory_order_relaxed); /* relaxed: as the load */
    }
    return v;
}

bool sr__cpu_avx2(void) { return cpu_features() & 1; }
bool sr__cpu_avx2_fma(void) { return (cpu_features() & 3) == 3; }

static bool have_avx2(void) { return sr__cpu_avx2(); }
#endif

const char *sr__gemm_kernel_name(void)
{
#ifdef HAVE_AVX2_KERNEL
    if (have_avx2())
        return "avx2";
#endif
    return "portable";
}

static void kernel_f64(double *c, int64_t ldc, const double *ap, const double *bp, int64_t mc, int64_t nc, int64_t kc)
{
#ifdef HAVE_AVX2_KERNEL
    if (atomic_load_explicit(&gemm_mode, memory_order_relaxed) != SR_GEMM_PORTABLE && have_avx2()) {
        avx2_f64(c, ldc, ap, bp, mc, nc, kc);
        return;
    }
#endif
    portable_f64(c, ldc, ap, bp, mc, nc, kc);
}

static void kernel_f32(float *c, int64_t ldc, const float *ap, const float *bp, int64_t mc, int64_t nc, int64_t kc)
{
#ifdef HAVE_AVX2_KERNEL
    if (atomic_load_explicit(&gemm_mode, memory_order_relaxed) != SR_GEMM_PORTABLE && have_avx2()) {
        avx2_f32(c, ldc, ap, bp, mc, nc, kc);
        return;
    }
#endif
    portable_f32(c, ldc, ap, bp, mc, nc, kc);
}

/* The blocked driver is the same loop nest for both dtypes; only the element
 * size and the pack/kernel routines differ. */
struct blocked_ops {
    size_t elem;
    void (*pack)(void *dst, const void *x, int64_t ld, bool trans, int64_t r0, int64_t c0, int64_t rows,
                 int64_t cols);
    void (*kernel)(void *c, int64_t ldc, const void *ap, const void *bp, int64_t mc, int64_t nc, int64_t kc);
};

static void pack64(void *d, const void *x, int64_t ld, bool t, int64_t r0, int64_t c0, int64_t r, int64_t c)
{
    pack_f64(d, x, ld, t, r0, c0, r, c);
}
static void pack32(void *d, const void *x, int64_t ld, bool t, int64_t r0, int64_t c0, int64_t r, int64_t c)
{
    pack_f32(d, x, ld, t, r0, c0, r, c);
}
static void kern64(void *c, int64_t ldc, const void *a, const void *b, int64_t mc, int64_t nc, int64_t kc)
{
    kernel_f64(c, ldc, a, b, mc, nc, kc);
}
static void kern32(void *c, int64_t ldc, const void *a, const void *b, int64_t mc, int64_t nc, int64_t kc)
{
    kernel_f32(c, ldc, a, b, mc, nc, kc);
}

static int blocked(const struct sr_gemm *g, const struct blocked_ops *o)
{
    char *ap = malloc(MC * KC * o->elem), *bp = malloc(KC * NC * o->elem);
    if (!ap || !bp) {
        free(ap);
        free(bp);
        return -1;
    }
    char *c = g->c;
    for (int64_t i = 0; !g->accumulate && i < g->m; i++)
        memset(c + (size_t)(i * g->ldc) * o->elem, 0, (size_t)g->n * o->elem);
    for (int64_t jc = 0; jc < g->n; jc += NC) {
        int64_t nc = g->n - jc < NC ? g->n - jc : NC;
        for (int64_t pc = 0; pc < g->k; pc += KC) {
            int64_t kc = g->k - pc < KC ? g->k - pc : KC;
            o->pack(bp, g->b, g->ldb, g->tb, pc, jc, kc, nc);
            for (int64_t ic = 0; ic < g->m; ic += MC) {
                int64_t mc = g->m - ic < MC ? g->m - ic : MC;
                o->pack(ap, g->a, g->lda, g->ta, ic, pc, mc, kc);
                o->kernel(c + (size_t)(ic * g->ldc + jc) * o->elem, g->ldc, ap, bp, mc, nc, kc);
            }
        }
    }
    free(ap);
    free(bp);
    return 0;
}

static const struct blocked_ops ops64 = {sizeof(double), pack64, kern64};
static const struct blocked_ops ops32 = {sizeof(float), pack32, kern32};

#ifdef SR_HAVE_CBLAS
static bool blas_fits(const struct sr_gemm *g)
{
    return g->m <= INT_MAX && g->n <= INT_MAX && g->k <= INT_MAX && g->lda <= INT_MAX && g->ldb <= INT_MAX &&
           g->ldc <= INT_MAX && g->m > 0 && g->n > 0 && g->k > 0;
}

static void blas(const struct sr_gemm *g)
{
    blas_init_once();
    enum CBLAS_TRANSPOSE ta = g->ta ? CblasTrans : CblasNoTrans, tb = g->tb ? CblasTrans : CblasNoTrans;
    if (g->dt == SR_F64)
        cblas_dgemm(CblasRowMajor, ta, tb, (int)g->m, (int)g->n, (int)g->k, 1.0, g->a, (int)g->lda, g->b,
                    (int)g->ldb, g->accumulate ? 1.0 : 0.0, g->c, (int)g->ldc);
    else
        cblas_sgemm(CblasRowMajor, ta, tb, (int)g->m, (int)g->n, (int)g->k, 1.0f, g->a, (int)g->lda, g->b,
                    (int)g->ldb, g->accumulate ? 1.0f : 0.0f, g->c, (int)g->ldc);
}
#endif

int sr__gemm(const struct sr_gemm *g)
{
#ifdef SR_HAVE_CBLAS
    if (atomic_load_explicit(&gemm_mode, memory_order_relaxed) == SR_GEMM_AUTO && blas_fits(g)) {
        blas(g);
        return 0;
    }
#endif
    return blocked(g, g->dt == SR_F64 ? &ops64 : &ops32);
}
