/* SPDX-License-Identifier: MIT */
/* Elementwise kernels with broadcasting.
 *
 * Floating-point arithmetic is carried out in double a row chunk at a time
 * (loads and stores convert); results of +, -, *, / on f32 are therefore the
 * correctly rounded f32 values. f32 rows of dense or repeated operands for
 * +, -, *, / are computed in f32 directly, with the same bits (bin_row_f32).
 * i64 add/sub/mul stay in 64-bit integers. */
#include <errno.h>
#include <math.h>

#include "error.h"
#include "kernels.h"
#include "tensor_impl.h"

#define CHUNK 256

struct map_ctx {
    int nin;
    sr_dtype out_dt, in_dt[SR_LOOP_MAX_OPS - 1];
    sr_map_fn f;
    const void *arg;
};

static void map_row(char **p, const int64_t *s, int64_t n, void *vctx)
{
    struct map_ctx *c = vctx;
    double x[SR_LOOP_MAX_OPS - 1][CHUNK], y[CHUNK], args[SR_LOOP_MAX_OPS - 1];
    for (int64_t k0 = 0; k0 < n; k0 += CHUNK) {
        int64_t m = n - k0 < CHUNK ? n - k0 : CHUNK;
        for (int j = 0; j < c->nin; j++)
            sr__load_f64(x[j], p[j + 1] + k0 * s[j + 1], s[j + 1], m, c->in_dt[j]);
        for (int64_t k = 0; k < m; k++) {
            for (int j = 0; j < c->nin; j++)
                args[j] = x[j][k];
            y[k] = c->f(args, c->arg);
        }
        sr__store_f64(p[0] + k0 * s[0], s[0], y, m, c->out_dt);
    }
}

void sr__map_into(sr_tensor *out, sr_tensor *const *in, int nin, sr_map_fn f, const void *arg)
{
    const sr_tensor *ops[SR_LOOP_MAX_OPS] = {out};
    struct map_ctx c = {.nin = nin, .out_dt = out->dtype, .f = f, .arg = arg};
    for (int j = 0; j < nin; j++) {
        ops[j + 1] = in[j];
        c.in_dt[j] = in[j]->dtype;
    }
    struct sr_loop L;
    sr__loop_init(&L, out->ndim, out->shape, nin + 1, 1, ops);
    sr__loop_run(&L, map_row, &c);
    sr__loop_done(&L);
}

sr_tensor *sr__map(const char *fn, sr_tensor *const *in, int nin, sr_map_fn f, const void *arg)
{
    int nd = in[0]->ndim;
    int64_t shape[SR_MAX_DIMS];
    for (int d = 0; d < nd; d++)
        shape[d] = in[0]->shape[d];
    for (int j = 1; j < nin; j++)
        if (sr__broadcast_shapes(fn, nd, shape, in[j]->ndim, in[j]->shape, &nd, shape))
            return NULL;
    sr_tensor *out = sr__tensor_new(fn, in[0]->dtype, nd, shape);
    if (out)
        sr__map_into(out, in, nin, f, arg);
    return out;
}

struct bin_ctx {
    enum sr_binop op;
    sr_dtype dt;
    double alpha;
};

static void bin_f64(double *y, const double *a, const double *b, int64_t m, const struct bin_ctx *c)
{
    switch (c->op) {
    case SR_BIN_ADD:
        if (c->alpha == 1.0) {
            for (int64_t k = 0; k < m; k++)
                y[k] = a[k] + b[k];
        } else {
            for (int64_t k = 0; k < m; k++)
                y[k] = a[k] + c->alpha * b[k];
        }
        break;
    case SR_BIN_MUL:
        for (int64_t k = 0; k < m; k++)
            y[k] = a[k] * b[k];
        break;
    case SR_BIN_DIV:
        for (int64_t k = 0; k < m; k++)
            y[k] = a[k] / b[k];
        break;
    }
}

static void bin_i64(int64_t *y, const int64_t *a, const int64_t *b, int64_t m, const struct bin_ctx *c)
{
    int64_t alpha = (int64_t)c->alpha;
    for (int64_t k = 0; k < m; k++) /* unsigned: wrap-around like PyTorch, without UB */
        y[k] = c->op == SR_BIN_MUL ? (int64_t)((uint64_t)a[k] * (uint64_t)b[k])
                                   : (int64_t)((uint64_t)a[k] + (uint64_t)alpha * (uint64_t)b[k]);
}

/* y = a op b on f32 rows, y dense, computed in f32: for +, -, * and /
 * the correctly rounded result, so the same bits as the double path (which
 * rounds the exact double result once; a double's 53 bits hold the exact
 * sum or product of two f32, and division rounded twice this way is
 * innocuous). The hot cases: gradients of the same shape added up, dense
 * (stride 4, vector loops) or both transposed alike (the weight gradient
 * of a linear layer, a transposed view: its rows have a stride of the
 * layer's outputs), and one element repeated (stride 0). a + alpha b with
 * another alpha (SGD's step) is bin_f64's expression, in double, read and
 * rounded here without the staging buffers. An operand that
 * overlaps the output's row other than element for element (an in-place op
 * with a shifted or repeated view of itself) takes the double path, which
 * reads it a chunk at a time. */
/* Operand x (stride sx, a multiple of 4, any sign) reads nothing of the
 * output row y that an earlier element writes: the same elements (x == y,
 * dense), or no overlap. */
static bool apart(const char *x, int64_t sx, const char *y, int64_t n)
{
    const char *lo = sx < 0 ? x + (n - 1) * sx : x, *end = (sx > 0 ? x + (n - 1) * sx : x) + 4;
    return (x == y && sx == 4) || end <= y || lo >= y + n * 4;
}

static bool bin_f32_direct(const struct bin_ctx *c, char *const *p, const int64_t *s, int64_t n)
{
    return c->dt == SR_F32 && s[0] == 4 && s[1] % 4 == 0 && s[2] % 4 == 0 && apart(p[1], s[1], p[0], n) &&
           apart(p[2], s[2], p[0], n);
}

/* The loops of bin_row_f32 with a's and b's element strides SA and SB:
 * written once, instantiated dense (1, 1: vector loops) and strided. */
#define BIN_F32_LOOPS(SA, SB)                                                                                  \
    do {                                                                                                       \
        double alpha = c->alpha;                                                                               \
        if (c->op == SR_BIN_ADD && alpha == 1.0)                                                               \
            for (int64_t k = 0; k < n; k++)                                                                    \
                y[k] = a[k * (SA)] + b[k * (SB)];                                                              \
        else if (c->op == SR_BIN_ADD && alpha == -1.0)                                                         \
            for (int64_t k = 0; k < n; k++)                                                                    \
                y[k] = a[k * (SA)] - b[k * (SB)];                                                              \
        else if (c->op == SR_BIN_ADD) /* bin_f64's double expression, rounded once at the end */              \
            for (int64_t k = 0; k < n; k++)                                                                    \
                y[k] = (float)((double)a[k * (SA)] + alpha * (double)b[k * (SB)]);                             \
        else if (c->op == SR_BIN_MUL)                                                                          \
            for (int64_t k = 0; k < n; k++)                                                                    \
                y[k] = a[k * (SA)] * b[k * (SB)];                                                              \
        else                                                                                                   \
            for (int64_t k = 0; k < n; k++)                                                                    \
                y[k] = a[k * (SA)] / b[k * (SB)];                                                              \
    } while (0)

static void bin_row_f32(float *y, const float *a, const float *b, const int64_t *s, int64_t n,
                        const struct bin_ctx *c)
{
    int64_t sa = s[1] / 4, sb = s[2] / 4; /* in elements */
    if (sa == 1 && sb == 1)
        BIN_F32_LOOPS(1, 1);
    else
        BIN_F32_LOOPS(sa, sb);
}

static void bin_row(char **p, const int64_t *s, int64_t n, void *vctx)
{
    const struct bin_ctx *c = vctx;
    if (bin_f32_direct(c, p, s, n)) {
        bin_row_f32((float *)p[0], (const float *)p[1], (const float *)p[2], s, n, c);
        return;
    }
    for (int64_t k0 = 0; k0 < n; k0 += CHUNK) {
        int64_t m = n - k0 < CHUNK ? n - k0 : CHUNK;
        if (c->dt == SR_I64) {
            int64_t a[CHUNK], b[CHUNK], y[CHUNK];
            sr__load_i64(a, p[1] + k0 * s[1], s[1], m, SR_I64);
            sr__load_i64(b, p[2] + k0 * s[2], s[2], m, SR_I64);
            bin_i64(y, a, b, m, c);
            sr__store_i64(p[0] + k0 * s[0], s[0], y, m, SR_I64);
        } else {
            double a[CHUNK], b[CHUNK], y[CHUNK];
            sr__load_f64(a, p[1] + k0 * s[1], s[1], m, c->dt);
            sr__load_f64(b, p[2] + k0 * s[2], s[2], m, c->dt);
            bin_f64(y, a, b, m, c);
            sr__store_f64(p[0] + k0 * s[0], s[0], y, m, c->dt);
        }
    }
}

void sr__binary_into(sr_tensor *out, const sr_tensor *a, const sr_tensor *b, enum sr_binop op, double alpha)
{
    const sr_tensor *ops[3] = {out, a, b};
    struct bin_ctx c = {op, out->dtype, alpha};
    struct sr_loop L;
    sr__loop_init(&L, out->ndim, out->shape, 3, 1, ops);
    sr__loop_run(&L, bin_row, &c);
    sr__loop_done(&L);
}

int sr__check_scalar(const char *fn, const sr_tensor *t, double s)
{
    if (t->dtype == SR_I64 && !(s >= -9.2e18 && s <= 9.2e18 && s == floor(s)))
        return sr__fail(-EINVAL, fn, "scalar %g is not an integer, and the tensor's dtype is i64", s);
    return 0;
}
