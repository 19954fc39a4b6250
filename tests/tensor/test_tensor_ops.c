/* Forward kernels against naive references, at sizes and layouts the golden
 * cases do not reach: matmul across block boundaries (BLAS and the blocked
 * loop), strided broadcasting, reductions of non-contiguous tensors, and
 * numerically hard softmax inputs. */
#include <stdlib.h>

#include "gemm.h"
#include "tensor_util.h"
#include "common.h"

LEAK_CHECKED_SUITE(elementwise);
LEAK_CHECKED_SUITE(matmul);
LEAK_CHECKED_SUITE(nn);
LEAK_CHECKED_SUITE(reduce);

static double *values(sr_tensor *t)
{
    size_t n = sr_tensor_numel(t);
    double *v = malloc((n + 1) * sizeof(double));
    cr_assert_eq(sr_tensor_to_f64(t, v, n), 0);
    return v;
}

/* c = a b for a [m, k], b [k, n] given row-major as doubles. */
static void naive_mm(const double *a, const double *b, double *c, int64_t m, int64_t k, int64_t n)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t p = 0; p < k; p++)
                s += a[i * k + p] * b[p * n + j];
            c[i * n + j] = s;
        }
}

static void check_mm(sr_dtype dt, int64_t m, int64_t k, int64_t n, bool ta, bool tb, int mode)
{
    sr_manual_seed((uint64_t)(m * 1000 + k * 10 + n));
    /* stored transposed when ta/tb, then viewed back: the kernel sees column-major operands */
    sr_tensor *as = sr_randn(dt, 2, ta ? SHAPE(k, m) : SHAPE(m, k), 0);
    sr_tensor *bs = sr_randn(dt, 2, tb ? SHAPE(n, k) : SHAPE(k, n), 0);
    sr_tensor *a = ta ? sr_t(as) : sr_tensor_ref(as), *b = tb ? sr_t(bs) : sr_tensor_ref(bs);
    sr__gemm_set_mode((enum sr_gemm_mode)mode);
    sr_tensor *c = sr_mm(a, b);
    sr__gemm_set_mode(SR_GEMM_AUTO);
    cr_assert(c, "%s", sr_last_error());
    double *av = values(a), *bv = values(b), *cv = values(c), *ref = malloc((size_t)(m * n + 1) * sizeof(double));
    naive_mm(av, bv, ref, m, k, n);
    double tol = dt == SR_F32 ? 1e-4 * (double)k : 1e-12 * (double)k;
    for (int64_t i = 0; i < m * n; i++)
        if (!(fabs(cv[i] - ref[i]) <= tol * (1 + fabs(ref[i])))) /* see tu_expect */
            cr_assert_fail("%s mm %lldx%lldx%lld ta=%d tb=%d mode=%d: [%lld] %g vs %g", sr_dtype_name(dt),
                           (long long)m, (long long)k, (long long)n, ta, tb, mode, (long long)i, cv[i], ref[i]);
    free(av), free(bv), free(cv), free(ref);
    sr_tensor *ts[] = {as, bs, a, b, c};
    for (int i = 0; i < 5; i++)
        sr_tensor_unref(ts[i]);
}

/* Every kernel (BLAS, blocked with the CPU's micro-kernel, blocked portable)
 * at sizes around the block and tile edges, with both operand layouts. */
Test(matmul, every_kernel_agrees_with_a_naive_loop)
{
    int64_t sizes[][3] = {{1, 1, 1}, {3, 5, 2}, {4, 7, 16}, {67, 130, 29}, {130, 300, 140}, {5, 0, 4}};
    for (int mode = SR_GEMM_AUTO; mode <= SR_GEMM_PORTABLE; mode++)
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
            for (int tr = 0; tr < 4; tr++) {
                check_mm(SR_F64, sizes[s][0], sizes[s][1], sizes[s][2], tr & 1, tr & 2, mode);
                check_mm(SR_F32, sizes[s][0], sizes[s][1], sizes[s][2], tr & 1, tr & 2, mode);
            }
    const char *b = sr_matmul_backend();
    cr_assert(!strcmp(b, "openblas") || !strcmp(b, "blocked"), "backend %s", b);
}

Test(matmul, batched_with_broadcast_and_strided_operands)
{
    sr_manual_seed(5);
    sr_tensor *a = sr_randn(SR_F64, 3, SHAPE(2, 4, 3), 0), *bs = sr_randn(SR_F64, 2, SHAPE(5, 3), 0);
    sr_tensor *b = sr_t(bs); /* [3, 5], column-major */
    sr_tensor *c = sr_matmul(a, b);
    tu_expect_shape(c, 3, SHAPE(2, 4, 5), "batched matmul");
    double *av = values(a), *bv = values(b), *cv = values(c), ref[20];
    for (int i = 0; i < 2; i++) {
        naive_mm(av + i * 12, bv, ref, 4, 3, 5);
        for (int j = 0; j < 20; j++)
            cr_assert_float_eq(cv[i * 20 + j], ref[j], 1e-12);
    }
    free(av), free(bv), free(cv);
    sr_tensor *ts[] = {a, bs, b, c};
    for (int i = 0; i < 4; i++)
        sr_tensor_unref(ts[i]);
}

Test(elementwise, strided_broadcast_matches_index_arithmetic)
{
    sr_tensor *base = sr_arange(SR_F64, 0, 24, 1, 0);
    sr_tensor *a3 = sr_view(base, 3, SHAPE(2, 3, 4)), *a = sr_permute(a3, (const int[]){2, 0, 1}); /* [4, 2, 3] */
    sr_tensor *b0 = sr_arange(SR_F64, 0, 6, 1, 0), *b1 = sr_view(b0, 2, SHAPE(2, 3)), *b = sr_t(b1); /* [3, 2] */
    sr_tensor *bb = sr_narrow(b, 1, 1, 1); /* [3, 1], column 1 of b = b1[1, :] = 3, 4, 5 */
    sr_tensor *bt = sr_t(bb);              /* [1, 3] */
    sr_tensor *c = sr_mul(a, bt);          /* [4, 2, 3] * [1, 3] */
    double *cv = values(c);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++) {
                double av = j * 12 + k * 4 + i, bv = 3 + k;
                cr_assert_eq(cv[(i * 2 + j) * 3 + k], av * bv, "c[%d,%d,%d]", i, j, k);
            }
    free(cv);
    sr_tensor *ts[] = {base, a3, a, b0, b1, b, bb, bt, c};
    for (int i = 0; i < 9; i++)
        sr_tensor_unref(ts[i]);
}

Test(reduce, sums_of_a_transposed_tensor)
{
    sr_tensor *x = sr_arange(SR_F32, 0, 12, 1, 0), *v = sr_view(x, 2, SHAPE(3, 4)), *t = sr_t(v); /* [4, 3] */
    sr_tensor *s0 = sr_sum_dim(t, 0, false), *s1 = sr_sum_dim(t, 1, true), *m = sr_mean(t), *all = sr_sum(t);
    tu_expect(s0, VALS(6, 22, 38), 3, 0, 0, "sum dim 0");
    tu_expect_shape(s1, 2, SHAPE(4, 1), "keepdim");
    tu_expect(s1, VALS(12, 15, 18, 21), 4, 0, 0, "sum dim 1");
    tu_expect(m, VALS(5.5), 1, 0, 0, "mean");
    tu_expect(all, VALS(66), 1, 0, 0, "sum");
    sr_tensor *big = sr_full(SR_F32, 1, SHAPE(1 << 20), 0.1, 0), *bs = sr_sum(big);
    tu_expect(bs, VALS(0.1f * (1 << 20)), 1, 0, 1e-6, "f32 sums accumulate in double");
    sr_tensor *ts[] = {x, v, t, s0, s1, m, all, big, bs};
    for (int i = 0; i < 9; i++)
        sr_tensor_unref(ts[i]);
}

Test(nn, softmax_is_stable_and_nll_ignores_targets)
{
    sr_tensor *x = tu_tensor(SR_F64, 2, SHAPE(2, 3), VALS(1000, 1001, 1002, -1000, -1000, -1000), 0);
    sr_tensor *l = sr_log_softmax(x, 1), *p = sr_softmax(x, 1);
    double e = log(1 + exp(-1) + exp(-2));
    tu_expect(l, VALS(-2 - e, -1 - e, -e, -log(3), -log(3), -log(3)), 6, 1e-12, 1e-12, "log_softmax");
    tu_expect(p, VALS(exp(-2 - e), exp(-1 - e), exp(-e), 1 / 3., 1 / 3., 1 / 3.), 6, 1e-12, 1e-12, "softmax");
    sr_tensor *tg = tu_tensor(SR_I64, 1, SHAPE(2), VALS(2, -100), 0), *loss = sr_nll_loss(l, tg);
    tu_expect(loss, VALS(e), 1, 1e-12, 0, "nll over the kept target only");
    sr_tensor *bad = tu_tensor(SR_I64, 1, SHAPE(2), VALS(3, 0), 0);
    cr_assert_null(sr_nll_loss(l, bad));
    tu_expect_error("range", "sr_nll_loss", "Target 3 is out of bounds");
    sr_tensor *f = tu_tensor(SR_F64, 1, SHAPE(2), VALS(0, 0), 0);
    cr_assert_null(sr_nll_loss(l, f));
    tu_expect_error("dtype", "sr_nll_loss", "target dtype must be i64");
    sr_tensor *ts[] = {x, l, p, tg, loss, bad, f};
    for (int i = 0; i < 7; i++)
        sr_tensor_unref(ts[i]);
}
