/* SPDX-License-Identifier: MIT */
/* See gradcheck.h. */
#include "gradcheck.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static sr_tensor *make_input(const struct gc_input *s, int i)
{
    sr_manual_seed(1000 + (uint64_t)i);
    sr_tensor *r = sr_rand(SR_F64, s->ndim, s->shape, 0);
    cr_assert(r, "%s", sr_last_error());
    sr_tensor *t = sr_mul_scalar(r, s->hi - s->lo), *u = sr_add_scalar(t, s->lo);
    sr_tensor_unref(r);
    sr_tensor_unref(t);
    if (s->is_target) {
        sr_tensor *c = sr_empty(SR_I64, s->ndim, s->shape, 0);
        int64_t *p = sr_tensor_mutable_data(c);
        double v[64];
        size_t n = sr_tensor_numel(u);
        cr_assert(n <= 64 && sr_tensor_to_f64(u, v, n) == 0);
        for (size_t k = 0; k < n; k++)
            p[k] = (int64_t)floor(v[k]);
        sr_tensor_unref(u);
        return c;
    }
    if (!s->no_grad)
        cr_assert_eq(sr_tensor_set_requires_grad(u, true), 0);
    return u;
}

/* y = f(x) as doubles, with grad mode off. */
static size_t eval(gc_fn f, const void *arg, sr_tensor *const *x, double *y, size_t cap, const char *name)
{
    bool prev = sr_no_grad_enter();
    sr_tensor *out = f(x, arg);
    sr_no_grad_exit(prev);
    cr_assert(out, "%s: forward failed: %s", name, sr_last_error());
    size_t n = sr_tensor_numel(out);
    cr_assert(n <= cap, "%s: output too large for the check", name);
    cr_assert_eq(sr_tensor_to_f64(out, y, n), 0);
    sr_tensor_unref(out);
    return n;
}

/* Column k of the numerical Jacobian of input i. */
static void numeric_column(gc_fn f, const void *arg, sr_tensor *const *x, int i, size_t k, double *col,
                           size_t ny, const char *name)
{
    bool prev = sr_no_grad_enter(); /* perturbing a leaf that requires grad */
    double *p = sr_tensor_mutable_data(x[i]), plus[512], minus[512];
    sr_no_grad_exit(prev);
    cr_assert(p, "%s", sr_last_error());
    double keep = p[k];
    p[k] = keep + GC_EPS;
    eval(f, arg, x, plus, 512, name);
    p[k] = keep - GC_EPS;
    eval(f, arg, x, minus, 512, name);
    p[k] = keep;
    for (size_t j = 0; j < ny; j++)
        col[j] = (plus[j] - minus[j]) / (2 * GC_EPS);
}

/* Row j of the analytic Jacobian, for every input: backward of e_j. */
static void analytic_row(sr_tensor *out, sr_tensor *const *x, int nin, size_t j, double **rows, const char *name)
{
    sr_tensor *g = sr_zeros(SR_F64, sr_tensor_ndim(out), sr_tensor_shape(out), 0);
    ((double *)sr_tensor_mutable_data(g))[j] = 1.0;
    int rc = sr_backward_multi(&out, &g, 1, true);
    cr_assert_eq(rc, 0, "%s: backward failed: %s", name, sr_last_error());
    for (int i = 0; i < nin; i++) {
        if (!sr_tensor_requires_grad(x[i]))
            continue;
        size_t n = sr_tensor_numel(x[i]);
        sr_tensor *gi = sr_tensor_grad(x[i]);
        if (gi)
            cr_assert_eq(sr_tensor_to_f64(gi, rows[i] + j * n, n), 0);
        else
            memset(rows[i] + j * n, 0, n * sizeof(double));
        sr_tensor_set_grad(x[i], NULL);
    }
    sr_tensor_unref(g);
}

static void compare(const char *name, int i, size_t nx, size_t ny, const double *an, gc_fn f, const void *arg,
                    sr_tensor *const *x)
{
    double col[512];
    for (size_t k = 0; k < nx; k++) {
        numeric_column(f, arg, x, i, k, col, ny, name);
        for (size_t j = 0; j < ny; j++) {
            double a = an[j * nx + k], n = col[j];
            if (!(fabs(a - n) <= GC_ATOL + GC_RTOL * fabs(n))) /* see tests/tensor_util.h */
                cr_assert_fail("%s: d out[%zu] / d in%d[%zu]: analytic %.10g, numerical %.10g", name, j, i, k, a, n);
        }
    }
}

void gradcheck(const char *name, gc_fn f, const void *arg, int nin, const struct gc_input *spec)
{
    sr_tensor *x[8];
    double *rows[8] = {0};
    cr_assert(nin <= 8);
    for (int i = 0; i < nin; i++)
        x[i] = make_input(&spec[i], i);
    sr_tensor *out = f(x, arg);
    cr_assert(out, "%s: forward failed: %s", name, sr_last_error());
    cr_assert(sr_tensor_requires_grad(out), "%s: the output does not require grad", name);
    size_t ny = sr_tensor_numel(out);
    cr_assert(ny <= 512);
    for (int i = 0; i < nin; i++)
        rows[i] = calloc(ny * sr_tensor_numel(x[i]) + 1, sizeof(double));
    for (size_t j = 0; j < ny; j++)
        analytic_row(out, x, nin, j, rows, name);
    sr_tensor_unref(out);
    for (int i = 0; i < nin; i++)
        if (sr_tensor_requires_grad(x[i]))
            compare(name, i, sr_tensor_numel(x[i]), ny, rows[i], f, arg, x);
    for (int i = 0; i < nin; i++) {
        free(rows[i]);
        sr_tensor_unref(x[i]);
    }
}
