/* SPDX-License-Identifier: MIT */
/* Forward kernels against naive references, at sizes and layouts the golden
 * cases do not reach: matmul across block boundaries (BLAS and the blocked
 * loop), strided broadcasting, reductions of non-contiguous tensors, and
 * numerically hard softmax inputs. */
#include <stdlib.h>
#include <sys/resource.h>

#include "gemm.h"
#include "shmrpc/rpc.h"
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

/* f32 +, -, *, / of dense rows, and with one operand a single repeated
 * element, are computed in f32 (kernels.c, bin_row_f32): the bits must be
 * those of the exact result rounded once to f32, as the double path gives;
 * t += 0.5 other still goes through double. 301 elements: a tail that is
 * not a whole vector. */
Test(elementwise, f32_rows_round_once_like_the_double_path)
{
    enum { N = 301 };
    sr_manual_seed(5);
    sr_tensor *a = sr_randn(SR_F32, 1, SHAPE(N), 0), *b = sr_randn(SR_F32, 1, SHAPE(N), 0);
    sr_tensor *s = sr_randn(SR_F32, 1, SHAPE(1), 0);
    double *av = values(a), *bv = values(b), *sv = values(s);
    for (int op = 0; op < 4; op++)
        for (int bc = 0; bc < 2; bc++) { /* b dense, or the one element of s broadcast */
            sr_tensor *rhs = bc ? s : b;
            sr_tensor *y = op == 0 ? sr_add(a, rhs) : op == 1 ? sr_sub(a, rhs) : op == 2 ? sr_mul(a, rhs)
                                                                                       : sr_div(a, rhs);
            cr_assert(y, "op %d: %s", op, sr_last_error());
            double *yv = values(y);
            for (int i = 0; i < N; i++) {
                double x = av[i], z = bc ? sv[0] : bv[i];
                float want = (float)(op == 0 ? x + z : op == 1 ? x - z : op == 2 ? x * z : x / z);
                cr_assert_eq((float)yv[i], want, "op %d broadcast %d: [%d] %.9g, want %.9g", op, bc, i, yv[i],
                             (double)want);
            }
            free(yv);
            sr_tensor_unref(y);
        }
    sr_tensor *t = sr_clone(a);
    cr_assert_eq(sr_add_(t, b, 0.5), 0, "%s", sr_last_error());
    double *tv = values(t);
    for (int i = 0; i < N; i++)
        cr_assert_eq((float)tv[i], (float)(av[i] + 0.5 * bv[i]), "a + 0.5 b [%d]", i);
    /* Both operands transposed alike ([7, 43] viewed as [43, 7]: rows of
     * stride 43, as a linear layer's weight gradient), the sum dense. */
    sr_tensor *av2 = sr_view(a, 2, SHAPE(7, 43)), *bv2 = sr_view(b, 2, SHAPE(7, 43));
    sr_tensor *at = sr_t(av2), *bt = sr_t(bv2);
    for (int op = 0; op < 4; op++) {
        sr_tensor *y = op == 0 ? sr_add(at, bt) : op == 1 ? sr_sub(at, bt) : op == 2 ? sr_mul(at, bt) : sr_div(at, bt);
        cr_assert(y, "transposed, op %d: %s", op, sr_last_error());
        double *yv = values(y);
        for (int i = 0; i < 43; i++)
            for (int j = 0; j < 7; j++) {
                double x = av[j * 43 + i], z = bv[j * 43 + i];
                float want = (float)(op == 0 ? x + z : op == 1 ? x - z : op == 2 ? x * z : x / z);
                cr_assert_eq((float)yv[i * 7 + j], want, "transposed, op %d: [%d, %d]", op, i, j);
            }
        free(yv);
        sr_tensor_unref(y);
    }
    free(av), free(bv), free(sv), free(tv);
    sr_tensor *ts[] = {a, b, s, t, av2, bv2, at, bt};
    for (int i = 0; i < 8; i++)
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

/* ---- conv2d against a direct loop, with every gemm kernel ---- */
struct conv_ref {
    int64_t n, c, h, w, o, kh, kw, oh, ow, s, p, d, groups;
};

/* The direct convolution and, for loss = sum(out * gy), its gradients. */
static void naive_conv(const struct conv_ref *r, const double *x, const double *w, const double *b,
                       const double *gy, double *out, double *dx, double *dw, double *db)
{
    int64_t cg = r->c / r->groups, og = r->o / r->groups;
    memset(dx, 0, (size_t)(r->n * r->c * r->h * r->w) * sizeof(double));
    memset(dw, 0, (size_t)(r->o * cg * r->kh * r->kw) * sizeof(double));
    memset(db, 0, (size_t)r->o * sizeof(double));
    for (int64_t n = 0; n < r->n; n++)
        for (int64_t o = 0; o < r->o; o++)
            for (int64_t y = 0; y < r->oh; y++)
                for (int64_t xo = 0; xo < r->ow; xo++) {
                    int64_t oi = ((n * r->o + o) * r->oh + y) * r->ow + xo;
                    double s = b[o];
                    db[o] += gy[oi];
                    for (int64_t c = 0; c < cg; c++)
                        for (int64_t i = 0; i < r->kh; i++)
                            for (int64_t j = 0; j < r->kw; j++) {
                                int64_t iy = y * r->s - r->p + i * r->d, ix = xo * r->s - r->p + j * r->d;
                                if (iy < 0 || iy >= r->h || ix < 0 || ix >= r->w)
                                    continue;
                                int64_t xi = ((n * r->c + (o / og) * cg + c) * r->h + iy) * r->w + ix;
                                int64_t wi = ((o * cg + c) * r->kh + i) * r->kw + j;
                                s += w[wi] * x[xi];
                                dx[xi] += w[wi] * gy[oi];
                                dw[wi] += x[xi] * gy[oi];
                            }
                    out[oi] = s;
                }
}

static void expect_close(sr_tensor *t, const double *want, const char *what, int mode)
{
    cr_assert(t, "%s: no tensor (%s)", what, sr_last_error());
    double *v = values(t), tol = sr_tensor_dtype(t) == SR_F32 ? 1e-4 : 1e-11;
    for (size_t i = 0; i < sr_tensor_numel(t); i++)
        if (!(fabs(v[i] - want[i]) <= tol * (1 + fabs(want[i]))))
            cr_assert_fail("%s, gemm mode %d: [%zu] %g vs %g", what, mode, i, v[i], want[i]);
    free(v);
}

/* x is made [N, H, W, C] and permuted to [N, C, H, W]: a non-contiguous input. */
static void check_conv(sr_dtype dt, const struct conv_ref *r, int mode)
{
    sr_manual_seed(11);
    sr_tensor *xs = sr_randn(dt, 4, SHAPE(r->n, r->h, r->w, r->c), SR_REQUIRES_GRAD);
    sr_tensor *w = sr_randn(dt, 4, SHAPE(r->o, r->c / r->groups, r->kh, r->kw), SR_REQUIRES_GRAD);
    sr_tensor *b = sr_randn(dt, 1, SHAPE(r->o), SR_REQUIRES_GRAD);
    sr_tensor *gy = sr_randn(dt, 4, SHAPE(r->n, r->o, r->oh, r->ow), 0);
    sr_tensor *x = sr_permute(xs, (const int[]){0, 3, 1, 2});
    sr__gemm_set_mode((enum sr_gemm_mode)mode);
    sr_tensor *y = sr_conv2d(x, w, b, SHAPE(r->s, r->s), SHAPE(r->p, r->p), SHAPE(r->d, r->d), r->groups);
    cr_assert(y, "%s", sr_last_error());
    sr_tensor *yg = sr_mul(y, gy), *loss = sr_sum(yg);
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    sr__gemm_set_mode(SR_GEMM_AUTO);
    double *xv = values(x), *wv = values(w), *bv = values(b), *gv = values(gy);
    size_t nx = sr_tensor_numel(x), ny = sr_tensor_numel(y);
    double *out = malloc(ny * sizeof(double)), *dx = malloc(nx * sizeof(double));
    double *dw = malloc(sr_tensor_numel(w) * sizeof(double)), *db = malloc((size_t)r->o * sizeof(double));
    naive_conv(r, xv, wv, bv, gv, out, dx, dw, db);
    expect_close(y, out, "conv2d output", mode);
    sr_tensor *gx = sr_permute(sr_tensor_grad(xs), (const int[]){0, 3, 1, 2});
    expect_close(gx, dx, "conv2d grad input", mode);
    expect_close(sr_tensor_grad(w), dw, "conv2d grad weight", mode);
    expect_close(sr_tensor_grad(b), db, "conv2d grad bias", mode);
    free(xv), free(wv), free(bv), free(gv), free(out), free(dx), free(dw), free(db);
    sr_tensor *ts[] = {xs, x, w, b, gy, y, yg, loss, gx};
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
        sr_tensor_unref(ts[i]);
}

/* Sizes past the blocked gemm's panels (the second case's K = 8 * 5 * 5 =
 * 200 rows and L = 12 * 12 = 144 columns cross its 64-row and 128-column
 * blocks) and a batch, so the weight gradient accumulates across samples
 * through every kernel. */
Test(nn, conv2d_agrees_with_a_direct_loop_on_every_kernel)
{
    struct conv_ref cases[] = {
        {.n = 3, .c = 4, .h = 9, .w = 8, .o = 6, .kh = 3, .kw = 3, .s = 2, .p = 1, .d = 1, .groups = 2},
        {.n = 2, .c = 8, .h = 12, .w = 12, .o = 5, .kh = 5, .kw = 5, .s = 1, .p = 2, .d = 1, .groups = 1},
        {.n = 2, .c = 3, .h = 10, .w = 9, .o = 3, .kh = 3, .kw = 3, .s = 1, .p = 0, .d = 2, .groups = 3},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct conv_ref *r = &cases[i];
        r->oh = (r->h + 2 * r->p - r->d * (r->kh - 1) - 1) / r->s + 1;
        r->ow = (r->w + 2 * r->p - r->d * (r->kw - 1) - 1) / r->s + 1;
        for (int mode = SR_GEMM_AUTO; mode <= SR_GEMM_PORTABLE; mode++) {
            check_conv(SR_F64, r, mode);
            check_conv(SR_F32, r, mode);
        }
    }
}

/* ---- conv2d's Winograd path against the im2col path ---- */
struct wino_case {
    int64_t n, c, o, h, w, p;
    bool bias;
};

/* Output, grad input, grad weight and grad bias of one f32 conv2d (3 x 3,
 * stride 1) with the Winograd path in `mode`; *runs: how many times that
 * path ran (forward, grad input and grad weight). */
static void run_conv_f32(const struct wino_case *k, enum sr_wino_mode mode, double **got, uint64_t *runs)
{
    sr_manual_seed(23);
    sr_tensor *x = sr_randn(SR_F32, 4, SHAPE(k->n, k->c, k->h, k->w), SR_REQUIRES_GRAD);
    sr_tensor *w = sr_randn(SR_F32, 4, SHAPE(k->o, k->c, 3, 3), SR_REQUIRES_GRAD);
    sr_tensor *b = k->bias ? sr_randn(SR_F32, 1, SHAPE(k->o), SR_REQUIRES_GRAD) : NULL;
    sr_tensor *gy = sr_randn(SR_F32, 4, SHAPE(k->n, k->o, k->h + 2 * k->p - 2, k->w + 2 * k->p - 2), 0);
    uint64_t before = sr__conv_winograd_runs();
    sr__conv_set_winograd(mode);
    sr_tensor *y = sr_conv2d(x, w, b, NULL, SHAPE(k->p, k->p), NULL, 1);
    cr_assert(y, "%s", sr_last_error());
    sr_tensor *yg = sr_mul(y, gy), *loss = sr_sum(yg);
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    sr__conv_set_winograd(SR_WINO_AUTO);
    *runs = sr__conv_winograd_runs() - before;
    got[0] = values(y);
    got[1] = values(sr_tensor_grad(x));
    got[2] = values(sr_tensor_grad(w));
    got[3] = b ? values(sr_tensor_grad(b)) : NULL;
    sr_tensor *ts[] = {x, w, b, gy, y, yg, loss};
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
        sr_tensor_unref(ts[i]);
}

/* |got - want| <= 1e-5 of want's largest magnitude, element by element:
 * Winograd's transforms round differently from im2col's dot products. */
static void expect_near_max(const double *got, const double *want, size_t n, const char *what,
                            const struct wino_case *k, int mode)
{
    double big = 0;
    for (size_t i = 0; i < n; i++)
        big = fmax(big, fabs(want[i]));
    cr_assert_gt(big, 0.0, "%s is all zeros", what);
    for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= 1e-5 * big))
            cr_assert_fail("%s, [%lld, %lld, %lld, %lld] padding %lld, o %lld, mode %d: [%zu] %.9g vs %.9g "
                           "(largest %g)", what, (long long)k->n, (long long)k->c, (long long)k->h, (long long)k->w,
                           (long long)k->p, (long long)k->o, mode, i, got[i], want[i], big);
}

/* Even and odd planes (odd output sizes end in half tiles), padding 0 and 1
 * (grad input then pads by 2 and 1), batches of 1 and 3, channel counts at
 * the threshold (32) and above, off multiples of 8 (the transforms' last
 * vector of channels overlaps the one before), with and without bias, and a
 * plane of more tiles than one chunk holds (cut into bands of tile rows).
 * Each case must take the Winograd path for its forward, its grad input
 * and its grad weight (counted), with the AVX2 transforms (where the CPU has them) and with the
 * plain ones, and not when switched off; 31 channels stay on im2col. */
Test(nn, conv2d_winograd_agrees_with_im2col)
{
    struct wino_case cases[] = {
        {.n = 3, .c = 32, .o = 32, .h = 14, .w = 14, .p = 1, .bias = true},
        {.n = 1, .c = 40, .o = 32, .h = 7, .w = 7, .p = 1},
        {.n = 3, .c = 33, .o = 35, .h = 5, .w = 9, .p = 0, .bias = true},
        {.n = 1, .c = 32, .o = 64, .h = 5, .w = 9, .p = 1},
        {.n = 3, .c = 64, .o = 32, .h = 14, .w = 14, .p = 0},
        {.n = 1, .c = 32, .o = 40, .h = 7, .w = 7, .p = 0, .bias = true},
        {.n = 2, .c = 32, .o = 32, .h = 31, .w = 29, .p = 1, .bias = true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct wino_case *k = &cases[i];
        double *ref[4];
        uint64_t runs;
        run_conv_f32(k, SR_WINO_OFF, ref, &runs);
        cr_assert_eq(runs, 0, "case %zu: the Winograd path ran while switched off", i);
        for (int v = 0; v < 4; v++) {
            int mode = v % 2 ? SR_WINO_PORTABLE : SR_WINO_AUTO, tile = v < 2 ? 2 : 4;
            double *wino[4];
            sr__conv_set_winograd_tile(tile);
            run_conv_f32(k, (enum sr_wino_mode)mode, wino, &runs);
            sr__conv_set_winograd_tile(0);
            cr_assert_eq(runs, 3, "case %zu, mode %d, tile %d: %llu Winograd runs, expected the forward, grad "
                         "input and grad weight", i, mode, tile, (unsigned long long)runs);
            size_t oh = (size_t)(k->h + 2 * k->p - 2), ow = (size_t)(k->w + 2 * k->p - 2);
            size_t sizes[4] = {(size_t)(k->n * k->o) * oh * ow, (size_t)(k->n * k->c * k->h * k->w),
                               (size_t)(k->o * k->c * 9), (size_t)k->o};
            const char *what[4] = {"output", "grad input", "grad weight", "grad bias"};
            for (int j = 0; j < 4; j++) {
                if (wino[j])
                    expect_near_max(wino[j], ref[j], sizes[j], what[j], k, tile == 4 ? 10 + mode : mode);
                free(wino[j]);
            }
        }
        for (int j = 0; j < 4; j++)
            free(ref[j]);
    }
    struct wino_case below = {.n = 1, .c = 31, .o = 32, .h = 6, .w = 6, .p = 1};
    double *got[4];
    uint64_t runs;
    run_conv_f32(&below, SR_WINO_AUTO, got, &runs);
    cr_assert_eq(runs, 0, "31 input channels took the Winograd path");
    for (int j = 0; j < 4; j++)
        free(got[j]);
}

static void expect_error(sr_tensor *t, const char *needle)
{
    cr_assert_null(t, "expected an error containing \"%s\"", needle);
    cr_assert(strstr(sr_last_error(), needle), "error \"%s\" lacks \"%s\"", sr_last_error(), needle);
}

Test(nn, convolution_layers_name_the_op_and_the_bad_value)
{
    sr_tensor *x = sr_zeros(SR_F64, 4, SHAPE(2, 3, 5, 5), 0), *w = sr_zeros(SR_F64, 4, SHAPE(4, 2, 3, 3), 0);
    sr_tensor *w3 = sr_zeros(SR_F64, 4, SHAPE(4, 3, 3, 3), 0), *x3 = sr_zeros(SR_F64, 3, SHAPE(3, 5, 5), 0);
    sr_tensor *wf = sr_zeros(SR_F32, 4, SHAPE(4, 3, 3, 3), 0), *b5 = sr_zeros(SR_F64, 1, SHAPE(5), 0);
    sr_tensor *wbig = sr_zeros(SR_F64, 4, SHAPE(4, 3, 7, 3), 0);
    expect_error(sr_conv2d(x, w, NULL, NULL, NULL, NULL, 1), "sr_conv2d: input [2, 3, 5, 5] and weight [4, 2, 3, 3]");
    expect_error(sr_conv2d(x3, w3, NULL, NULL, NULL, NULL, 1), "sr_conv2d: input [3, 5, 5] must be [N, C, H, W]");
    expect_error(sr_conv2d(x, w3, b5, NULL, NULL, NULL, 1), "bias [5] must be [4]");
    expect_error(sr_conv2d(x, wf, NULL, NULL, NULL, NULL, 1), "sr_conv2d: dtypes f64 and f32");
    expect_error(sr_conv2d(x, w3, NULL, SHAPE(0, 1), NULL, NULL, 1), "stride (0, 1)");
    expect_error(sr_conv2d(x, w3, NULL, NULL, NULL, NULL, 0), "groups 0");
    expect_error(sr_conv2d(x, wbig, NULL, NULL, NULL, NULL, 1), "is smaller than the dilated kernel");
    /* H + 2 padding - dilated kernel = -1: with stride 2, C's division rounds that to 0 (one output row) */
    sr_tensor *w6 = sr_zeros(SR_F64, 4, SHAPE(4, 3, 6, 3), 0); /* 5 - 5 - 1 = -1 */
    expect_error(sr_conv2d(x, w6, NULL, SHAPE(2, 2), NULL, NULL, 1), "is smaller than the dilated kernel");
    sr_tensor_unref(w6);
    expect_error(sr_max_pool2d(x, SHAPE(2, 2), NULL, SHAPE(2, 0)), "sr_max_pool2d: kernel (2, 2)");
    expect_error(sr_avg_pool2d(x3, SHAPE(2, 2), NULL, NULL), "sr_avg_pool2d: input [3, 5, 5]");
    expect_error(sr_max_pool2d(x, SHAPE(6, 6), NULL, NULL), "smaller than the kernel (6, 6)");
    expect_error(sr_flatten(x, 2, 1), "sr_flatten: start_dim 2 cannot come after end_dim 1");
    expect_error(sr_layer_norm(x, 2, SHAPE(4, 5), NULL, NULL, 1e-5), "sr_layer_norm: input [2, 3, 5, 5]");
    sr_tensor *ts[] = {x, w, w3, x3, wf, b5, wbig};
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
        sr_tensor_unref(ts[i]);
}

/* A NaN in a window wins, as in PyTorch; ties go to the first maximum, and
 * backward sends the gradient there only. */
Test(nn, max_pool2d_nan_and_ties)
{
    double v[8] = {3, 1, 4, 0, 3, 2, NAN, 1}; /* windows {3, 1, 3, 2} and {4, 0, NaN, 1} */
    sr_tensor *x = tu_tensor(SR_F64, 4, SHAPE(1, 1, 2, 4), v, SR_REQUIRES_GRAD);
    sr_tensor *y = sr_max_pool2d(x, SHAPE(2, 2), NULL, NULL), *s = sr_sum(y);
    double got[2];
    sr_tensor_to_f64(y, got, 2);
    cr_assert_float_eq(got[0], 3.0, 0);
    cr_assert(isnan(got[1]));
    cr_assert_eq(sr_backward(s, false), 0, "%s", sr_last_error());
    double g[8], want[8] = {1, 0, 0, 0, 0, 0, 1, 0};
    sr_tensor_to_f64(sr_tensor_grad(x), g, 8);
    for (int i = 0; i < 8; i++)
        cr_assert_float_eq(g[i], want[i], 0, "grad[%d] = %g", i, g[i]);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    sr_tensor_unref(s);
}

/* relu's typed rows, on contiguous and transposed f32/f64 inputs: max(x, 0)
 * (a NaN gives 0, as the double path does) and the gradient where x > 0. */
Test(elementwise, relu_typed_rows_match_the_definition)
{
    for (int d = 0; d < 2; d++)
        for (int tr = 0; tr < 2; tr++) {
            sr_dtype dt = d ? SR_F64 : SR_F32;
            sr_manual_seed(21);
            sr_tensor *xs = sr_randn(dt, 2, SHAPE(5, 7), SR_REQUIRES_GRAD);
            sr_tensor *x = tr ? sr_t(xs) : sr_tensor_ref(xs), *y = sr_relu(x), *s = sr_sum(y);
            cr_assert_eq(sr_backward(s, false), 0, "%s", sr_last_error());
            double *xv = values(x), *yv = values(y), *gv = values(sr_tensor_grad(xs)), *xsv = values(xs);
            for (int i = 0; i < 35; i++) {
                cr_assert_eq(yv[i], xv[i] > 0 ? xv[i] : 0.0, "%s tr %d: relu[%d]", sr_dtype_name(dt), tr, i);
                cr_assert_eq(gv[i], xsv[i] > 0 ? 1.0 : 0.0, "%s tr %d: grad[%d]", sr_dtype_name(dt), tr, i);
            }
            free(xv), free(yv), free(gv), free(xsv);
            sr_tensor *ts[] = {xs, x, y, s};
            for (int i = 0; i < 4; i++)
                sr_tensor_unref(ts[i]);
        }
    double v[2] = {NAN, -1};
    sr_tensor *n = tu_tensor(SR_F32, 1, SHAPE(2), v, 0), *r = sr_relu(n);
    double got[2];
    sr_tensor_to_f64(r, got, 2);
    cr_assert(got[0] == 0.0 && got[1] == 0.0, "relu(NaN, -1) = (%g, %g)", got[0], got[1]);
    sr_tensor_unref(n);
    sr_tensor_unref(r);
}

/* layer_norm over x [m, d] with dy given, in double: y, dx, dweight, dbias
 * (w, b may be NULL: then 1 and 0, and dw, db are not written). */
static void naive_layer_norm(const double *x, const double *w, const double *b, const double *dy, int64_t m,
                             int64_t d, double *y, double *dx, double *dw, double *db)
{
    for (int64_t j = 0; j < d && dw; j++)
        dw[j] = db[j] = 0;
    for (int64_t i = 0; i < m; i++, x += d, dy += d, y += d, dx += d) {
        double mean = 0, var = 0, a = 0, c = 0;
        for (int64_t j = 0; j < d; j++)
            mean += x[j] / (double)d;
        for (int64_t j = 0; j < d; j++)
            var += (x[j] - mean) * (x[j] - mean) / (double)d;
        double rstd = 1 / sqrt(var + 1e-5);
        for (int64_t j = 0; j < d; j++) {
            double xh = (x[j] - mean) * rstd, g = dy[j] * (w ? w[j] : 1);
            y[j] = xh * (w ? w[j] : 1) + (b ? b[j] : 0);
            a += g / (double)d;
            c += g * xh / (double)d;
            if (dw)
                dw[j] += dy[j] * xh, db[j] += dy[j];
        }
        for (int64_t j = 0; j < d; j++)
            dx[j] = rstd * (dy[j] * (w ? w[j] : 1) - a - (x[j] - mean) * rstd * c);
    }
}

static void expect_near(sr_tensor *t, const double *want, int64_t n, double tol, const char *what, sr_dtype dt)
{
    double *got = values(t);
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i]))))
            cr_assert_fail("%s %s: [%lld] %.9g vs %.9g", sr_dtype_name(dt), what, (long long)i, got[i], want[i]);
    free(got);
}

/* Rows longer than the kernels' blocks (d = 3 x 401 = 1203: four blocks of
 * 256 and a tail that is not a whole vector) and more rows than a partial
 * sum of the weight's gradient takes at once (40 > 32), with and
 * without weight and bias, x offset from 0, against a direct loop in
 * double: f64 to 1e-10, f32 to 1e-4 relative. */
Test(nn, layer_norm_long_rows_agree_with_a_direct_loop)
{
    const int64_t m = 40, d = 1203;
    for (int affine = 0; affine < 2; affine++)
        for (int f = 0; f < 2; f++) {
            sr_dtype dt = f ? SR_F64 : SR_F32;
            sr_manual_seed(31 + (uint64_t)affine);
            sr_tensor *x0 = sr_randn(dt, 3, SHAPE(m, 3, 401), 0), *x = sr_add_scalar(x0, 3.0);
            sr_tensor *w = affine ? sr_randn(dt, 2, SHAPE(3, 401), SR_REQUIRES_GRAD) : NULL;
            sr_tensor *b = affine ? sr_randn(dt, 2, SHAPE(3, 401), SR_REQUIRES_GRAD) : NULL;
            sr_tensor *dy = sr_randn(dt, 3, SHAPE(m, 3, 401), 0);
            cr_assert(sr_tensor_set_requires_grad(x, true) == 0, "%s", sr_last_error());
            sr_tensor *y = sr_layer_norm(x, 2, SHAPE(3, 401), w, b, 1e-5), *yd = sr_mul(y, dy), *s = sr_sum(yd);
            cr_assert_eq(sr_backward(s, false), 0, "%s", sr_last_error());
            double *xv = values(x), *dyv = values(dy), *wv = w ? values(w) : NULL, *bv = b ? values(b) : NULL;
            double *ref = malloc((size_t)(2 * m * d + 2 * d) * sizeof(double));
            double *rdx = ref + m * d, *rdw = rdx + m * d, *rdb = rdw + d;
            naive_layer_norm(xv, wv, bv, dyv, m, d, ref, rdx, w ? rdw : NULL, w ? rdb : NULL);
            double tol = f ? 1e-10 : 1e-4;
            expect_near(y, ref, m * d, tol, "y", dt);
            expect_near(sr_tensor_grad(x), rdx, m * d, tol, "dx", dt);
            if (affine) {
                expect_near(sr_tensor_grad(w), rdw, d, tol, "dweight", dt);
                expect_near(sr_tensor_grad(b), rdb, d, tol, "dbias", dt);
            }
            free(xv), free(dyv), free(wv), free(bv), free(ref);
            sr_tensor *ts[] = {x0, x, w, b, dy, y, yd, s};
            for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
                sr_tensor_unref(ts[i]);
        }
}

/* The forward takes a row's mean and variance in one pass, shifted by its
 * first block's mean: rows whose first block sits far from the rest (the
 * worst case for the shift, since the variance is then large) and rows far
 * from 0 with a small spread (not so far that the mean's own rounding to
 * f32, which both passes share, exceeds the bound), against the direct loop
 * in double, f32 to 1e-4 relative. */
Test(nn, layer_norm_one_pass_statistics_hold_far_from_the_shift)
{
    const int64_t m = 4, d = 4096;
    const double offsets[2][2] = {{40.0, 0.0}, {50.0, 50.0}}, spread[2] = {1.0, 0.1};
    for (int c = 0; c < 2; c++) {
        sr_manual_seed(77 + (uint64_t)c);
        sr_tensor *x0 = sr_randn(SR_F64, 2, SHAPE(m, d), 0);
        double *xv = values(x0);
        float *xf = malloc((size_t)(m * d) * sizeof(float));
        for (int64_t i = 0; i < m * d; i++)
            xf[i] = (float)(xv[i] * spread[c] + offsets[c][i % d < 256 ? 0 : 1]);
        sr_tensor *x = sr_from_data(SR_F32, 2, SHAPE(m, d), xf, 0);
        cr_assert_not_null(x, "%s", sr_last_error());
        sr_tensor *dy = sr_randn(SR_F32, 2, SHAPE(m, d), 0);
        cr_assert(sr_tensor_set_requires_grad(x, true) == 0, "%s", sr_last_error());
        sr_tensor *y = sr_layer_norm(x, 1, SHAPE(d), NULL, NULL, 1e-5), *yd = sr_mul(y, dy), *s = sr_sum(yd);
        cr_assert_eq(sr_backward(s, false), 0, "%s", sr_last_error());
        double *xr = values(x), *dyv = values(dy), *ref = malloc((size_t)(2 * m * d) * sizeof(double));
        naive_layer_norm(xr, NULL, NULL, dyv, m, d, ref, ref + m * d, NULL, NULL);
        expect_near(y, ref, m * d, 1e-4, "y", SR_F32);
        expect_near(sr_tensor_grad(x), ref + m * d, m * d, 1e-4, "dx", SR_F32);
        free(xv), free(xf), free(xr), free(dyv), free(ref);
        sr_tensor *ts[] = {x0, x, dy, y, yd, s};
        for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
            sr_tensor_unref(ts[i]);
    }
}

/* max_pool2d of x [planes, h, w] by a direct loop: the first maximum of
 * each clipped window in row-major order, the first NaN if any; dx adds dy
 * at that element. */
static void naive_max_pool(const double *x, const double *dy, int64_t planes, int64_t h, int64_t w, int64_t k,
                           int64_t s, int64_t pad, double *y, double *dx)
{
    int64_t oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
    for (int64_t i = 0; i < planes * h * w; i++)
        dx[i] = 0;
    for (int64_t p = 0; p < planes; p++, x += h * w, dx += h * w)
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++, y++, dy++) {
                int64_t best = -1;
                for (int64_t iy = oy * s - pad; iy < oy * s - pad + k; iy++)
                    for (int64_t ix = ox * s - pad; ix < ox * s - pad + k; ix++) {
                        if (iy < 0 || iy >= h || ix < 0 || ix >= w)
                            continue;
                        int64_t at = iy * w + ix;
                        if (best < 0 || (!isnan(x[best]) && (isnan(x[at]) || x[at] > x[best])))
                            best = at;
                    }
                *y = x[best];
                dx[best] += *dy;
            }
}

/* Every geometry's kernel (the 2 x 2 stride 2 one, whose f32 vectors take 4
 * outputs and f64 2, at 7 outputs a row: a tail for both, and an unused last
 * column and row; overlapping and padded windows) on values with many ties and some
 * NaNs, forward and backward, against the direct loop, exactly. */
Test(nn, max_pool2d_kernels_agree_with_a_direct_loop)
{
    const int64_t n = 2, c = 3, h = 11, w = 15, geo[3][3] = {{2, 2, 0}, {3, 2, 1}, {2, 1, 0}};
    double *xv = malloc((size_t)(3 * n * c * h * w) * sizeof(double)), *dyv = xv + n * c * h * w;
    double *ref_dx = dyv + n * c * h * w, ref_y[2 * 3 * 12 * 15];
    uint64_t st = 12345;
    for (int64_t i = 0; i < n * c * h * w; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        xv[i] = (i % 37 == 5) ? NAN : (double)((st >> 33) % 5); /* ties everywhere, a NaN now and then */
        dyv[i] = (double)((st >> 40) % 7) + 1;
    }
    for (int f = 0; f < 2; f++)
        for (int gi = 0; gi < 3; gi++) {
            sr_dtype dt = f ? SR_F64 : SR_F32;
            int64_t k = geo[gi][0], s = geo[gi][1], pad = geo[gi][2];
            int64_t oh = (h + 2 * pad - k) / s + 1, ow = (w + 2 * pad - k) / s + 1;
            sr_tensor *x = tu_tensor(dt, 4, SHAPE(n, c, h, w), xv, SR_REQUIRES_GRAD);
            sr_tensor *dy = tu_tensor(dt, 4, SHAPE(n, c, oh, ow), dyv, 0);
            sr_tensor *y = sr_max_pool2d(x, SHAPE(k, k), SHAPE(s, s), SHAPE(pad, pad));
            cr_assert(y, "%s", sr_last_error());
            sr_tensor *yd = sr_mul(y, dy), *sum = sr_sum(yd);
            cr_assert_eq(sr_backward(sum, false), 0, "%s", sr_last_error());
            naive_max_pool(xv, dyv, n * c, h, w, k, s, pad, ref_y, ref_dx);
            double *got = values(y), *gdx = values(sr_tensor_grad(x));
            for (int64_t i = 0; i < n * c * oh * ow; i++)
                if (!(got[i] == ref_y[i] || (isnan(got[i]) && isnan(ref_y[i]))))
                    cr_assert_fail("%s k %lld s %lld p %lld: y[%lld] %g vs %g", sr_dtype_name(dt), (long long)k,
                                   (long long)s, (long long)pad, (long long)i, got[i], ref_y[i]);
            for (int64_t i = 0; i < n * c * h * w; i++)
                if (gdx[i] != ref_dx[i])
                    cr_assert_fail("%s k %lld s %lld p %lld: dx[%lld] %g vs %g", sr_dtype_name(dt), (long long)k,
                                   (long long)s, (long long)pad, (long long)i, gdx[i], ref_dx[i]);
            free(got), free(gdx);
            sr_tensor *ts[] = {x, dy, y, yd, sum};
            for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
                sr_tensor_unref(ts[i]);
        }
    free(xv);
}

static long page_faults(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt + u.ru_majflt;
}

/* In a worker (here a one-worker job), layer_norm's backward scratch comes
 * from the shared heap, which hands a freed block back to the next call: a
 * [32, 28, 28] layer's (600 KiB) faulted about 150 pages in on every call
 * when it was a calloc. Everything else here is a reused heap block too, so
 * after a warm-up the calls fault almost nothing. */
Test(nn, layer_norm_backward_reuses_its_scratch_in_a_worker, .timeout = 60)
{
    setenv("SHMRPC_WORLD_SIZE", "1", 1);
    cr_assert_eq(sr_init(NULL), 0, "%s", sr_last_error());
    sr_manual_seed(5);
    sr_tensor *x = sr_randn(SR_F32, 4, SHAPE(2, 32, 28, 28), SR_REQUIRES_GRAD);
    sr_tensor *w = sr_randn(SR_F32, 3, SHAPE(32, 28, 28), SR_REQUIRES_GRAD);
    sr_tensor *b = sr_randn(SR_F32, 3, SHAPE(32, 28, 28), SR_REQUIRES_GRAD);
    long faults = 0;
    for (int i = 0; i < 8; i++) {
        long f0 = page_faults();
        sr_tensor *ts[] = {x, w, b};
        for (int k = 0; k < 3; k++)
            sr_tensor_set_grad(ts[k], NULL);
        sr_tensor *y = sr_layer_norm(x, 3, SHAPE(32, 28, 28), w, b, 1e-5), *s = sr_sum(y);
        cr_assert_eq(sr_backward(s, false), 0, "%s", sr_last_error());
        sr_tensor_unref(y);
        sr_tensor_unref(s);
        faults += i >= 4 ? page_faults() - f0 : 0; /* the last 4 calls */
    }
    cr_assert_lt(faults, 4 * 40, "%ld page faults in 4 calls of layer_norm forward + backward", faults);
    sr_tensor *ts[] = {x, w, b};
    for (int k = 0; k < 3; k++) {
        sr_tensor_set_grad(ts[k], NULL);
        sr_tensor_unref(ts[k]);
    }
    cr_assert_eq(sr_shutdown(true, 0), 0, "%s", sr_last_error());
}
