/* SPDX-License-Identifier: MIT */
/* sr_mm throughput: square n x n products for n = 64, 256, 1024 in f32 and
 * f64, with OpenBLAS (one thread, when built with it) and the cache-blocked
 * fallback (with the CPU's micro-kernel, and the portable one), side by side.
 * One line per configuration, e.g.
 *   matmul f64 n=256 backend=openblas threads=1: p50 0.49 ms p99 0.51 ms 68.2 GFLOP/s (x2.0 blocked)
 * Each configuration is warmed up, then timed for a fixed number of runs
 * (at least 3, about 0.3 s of work); the result is checked against a naive
 * dot product at sampled entries after timing. */
#include "bench_util.h"
#ifdef SR_HAVE_CBLAS
#include <cblas.h>
#endif
#include "bench_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shmrpc/tensor.h"
#include "gemm.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sampled entries of c against naive dot products; 0 if all agree. */
static int verify(sr_tensor *a, sr_tensor *b, sr_tensor *c, int64_t n, sr_dtype dt)
{
    double *av = malloc((size_t)(n * n) * sizeof(double)), *bv = malloc((size_t)(n * n) * sizeof(double));
    double *cv = malloc((size_t)(n * n) * sizeof(double));
    sr_tensor_to_f64(a, av, (size_t)(n * n));
    sr_tensor_to_f64(b, bv, (size_t)(n * n));
    sr_tensor_to_f64(c, cv, (size_t)(n * n));
    int bad = 0;
    for (int s = 0; s < 64; s++) {
        int64_t i = (s * 7919) % n, j = (s * 104729) % n;
        double ref = 0;
        for (int64_t k = 0; k < n; k++)
            ref += av[i * n + k] * bv[k * n + j];
        double tol = (dt == SR_F32 ? 1e-4 : 1e-11) * sqrt((double)n) * (1 + fabs(ref));
        bad |= fabs(cv[i * n + j] - ref) > tol;
    }
    free(av), free(bv), free(cv);
    return bad;
}

/* p50 seconds of one n x n product; p99 in *p99. */
static double run(sr_dtype dt, int64_t n, enum sr_gemm_mode mode, double *p99, int *bad)
{
    int64_t shape[2] = {n, n};
    sr_manual_seed((uint64_t)n);
    sr_tensor *a = sr_randn(dt, 2, shape, 0), *b = sr_randn(dt, 2, shape, 0), *c = NULL;
    double flops = 2.0 * (double)n * (double)n * (double)n;
    int reps = (int)((bench_smoke_on() ? 3e6 : 3e8) / flops);
    reps = reps < 3 ? 3 : reps > 2000 ? 2000 : reps;
    double *t = malloc((size_t)reps * sizeof(double));
    sr__gemm_set_mode(mode);
    sr_tensor_unref(sr_mm(a, b)); /* warm-up: caches, BLAS thread setup */
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        sr_tensor_unref(c);
        c = sr_mm(a, b);
        t[r] = now() - t0;
    }
    sr__gemm_set_mode(SR_GEMM_AUTO);
    qsort(t, (size_t)reps, sizeof(double), cmp);
    double p50 = t[reps / 2];
    *p99 = t[(reps * 99) / 100 < reps ? (reps * 99) / 100 : reps - 1];
    *bad = !c || verify(a, b, c, n, dt);
    free(t);
    sr_tensor_unref(a);
    sr_tensor_unref(b);
    sr_tensor_unref(c);
    return p50;
}

/* OpenBLAS's thread count as shmrpc left it (SHMRPC_BLAS_THREADS, docs/TENSORS.md). */
static int blas_threads(void)
{
#ifdef SR_HAVE_CBLAS
    return openblas_get_num_threads();
#else
    return 0;
#endif
}

/* One JSON object per line printed (--json). */
static void rec(sr_dtype dt, int64_t n, const char *backend, const char *kernel, double p50, double p99, double flops)
{
    bench_rec r;
    bench_rec_begin(&r, "matmul");
    bench_rec_str(&r, "dtype", sr_dtype_name(dt));
    bench_rec_num(&r, "n", (double)n);
    bench_rec_str(&r, "backend", backend);
    bench_rec_str(&r, "kernel", kernel);
    bench_rec_num(&r, "p50_ns", p50 * 1e9);
    bench_rec_num(&r, "p99_ns", p99 * 1e9);
    bench_rec_num(&r, "gflops", flops / p50 * 1e-9);
    bench_rec_emit(&r);
}

int main(int argc, char **argv)
{
    bench_cli cli = {.prog = "bench_matmul", .smoke_what = "n = 33, 64, 128, 3 runs each"};
    bench_cli_parse(&cli, argc, argv);
    static const int64_t full[] = {64, 256, 1024}, smoke[] = {33, 64, 128};
    const int64_t *sizes = cli.smoke ? smoke : full;
    static const sr_dtype dts[] = {SR_F32, SR_F64};
    bool have_blas = !strcmp(sr_matmul_backend(), "openblas");
    int failed = 0;
    for (size_t d = 0; d < 2; d++) {
        for (size_t s = 0; s < 3; s++) {
            int64_t n = sizes[s];
            double flops = 2.0 * (double)n * (double)n * (double)n, p99b, p99, blocked_p50 = 0;
            int bad;
            double portable_p50 = run(dts[d], n, SR_GEMM_PORTABLE, &p99b, &bad);
            failed |= bad;
            printf("matmul %s n=%lld backend=blocked kernel=portable: p50 %.3f ms p99 %.3f ms %.2f GFLOP/s%s\n",
                   sr_dtype_name(dts[d]), (long long)n, portable_p50 * 1e3, p99b * 1e3, flops / portable_p50 * 1e-9,
                   bad ? " WRONG RESULT" : "");
            rec(dts[d], n, "blocked", "portable", portable_p50, p99b, flops);
            blocked_p50 = run(dts[d], n, SR_GEMM_BLOCKED, &p99b, &bad);
            failed |= bad;
            printf("matmul %s n=%lld backend=blocked kernel=%s: p50 %.3f ms p99 %.3f ms %.2f GFLOP/s%s\n",
                   sr_dtype_name(dts[d]), (long long)n, sr__gemm_kernel_name(), blocked_p50 * 1e3, p99b * 1e3,
                   flops / blocked_p50 * 1e-9, bad ? " WRONG RESULT" : "");
            rec(dts[d], n, "blocked", sr__gemm_kernel_name(), blocked_p50, p99b, flops);
            if (!have_blas)
                continue;
            double p50 = run(dts[d], n, SR_GEMM_AUTO, &p99, &bad);
            failed |= bad;
            printf("matmul %s n=%lld backend=openblas threads=%d: p50 %.3f ms p99 %.3f ms %.2f GFLOP/s "
                   "(x%.1f blocked)%s\n",
                   sr_dtype_name(dts[d]), (long long)n, blas_threads(), p50 * 1e3, p99 * 1e3, flops / p50 * 1e-9, blocked_p50 / p50,
                   bad ? " WRONG RESULT" : "");
            fflush(stdout);
            rec(dts[d], n, "openblas", "openblas", p50, p99, flops);
        }
    }
    return failed;
}
