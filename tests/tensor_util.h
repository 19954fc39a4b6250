/* SPDX-License-Identifier: MIT */
/* Helpers for the tensor and autograd suites. */
#ifndef SR_TESTS_TENSOR_UTIL_H
#define SR_TESTS_TENSOR_UTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "shmrpc/tensor.h"

#define SHAPE(...) (const int64_t[]){__VA_ARGS__}
#define VALS(...) (const double[]){__VA_ARGS__}

/* A tensor of dt holding vals (given as doubles). */
static inline sr_tensor *tu_tensor(sr_dtype dt, int nd, const int64_t *shape, const double *vals, unsigned flags)
{
    sr_tensor *t = sr_from_data(SR_F64, nd, shape, vals, 0);
    cr_assert(t, "sr_from_data: %s", sr_last_error());
    if (dt == SR_F64 && !flags)
        return t;
    sr_tensor *c = sr_empty(dt, nd, shape, 0);
    cr_assert(c && sr_copy_(c, t) == 0, "%s", sr_last_error());
    sr_tensor_unref(t);
    if (flags & SR_REQUIRES_GRAD)
        cr_assert(sr_tensor_set_requires_grad(c, true) == 0, "%s", sr_last_error());
    return c;
}

/* Element-by-element |got - want| <= atol + rtol |want|. Loops assert only on
 * failure: Criterion's --full-stats records every assertion, and millions of
 * them cost seconds. */
static inline void tu_expect(const sr_tensor *t, const double *want, size_t n, double atol, double rtol,
                             const char *what)
{
    cr_assert(t, "%s: tensor is NULL (%s)", what, sr_last_error());
    cr_assert_eq(sr_tensor_numel(t), n, "%s: %zu elements, expected %zu", what, sr_tensor_numel(t), n);
    double got[4096];
    cr_assert(n <= 4096);
    cr_assert_eq(sr_tensor_to_f64(t, got, n), 0, "%s", sr_last_error());
    for (size_t i = 0; i < n; i++) {
        bool ok = fabs(got[i] - want[i]) <= atol + rtol * fabs(want[i]) || (isnan(got[i]) && isnan(want[i]));
        if (!ok)
            cr_assert_fail("%s: element %zu is %.17g, expected %.17g", what, i, got[i], want[i]);
    }
}

static inline void tu_expect_shape(const sr_tensor *t, int nd, const int64_t *shape, const char *what)
{
    cr_assert(t, "%s: tensor is NULL (%s)", what, sr_last_error());
    cr_assert_eq(sr_tensor_ndim(t), nd, "%s: ndim %d, expected %d", what, sr_tensor_ndim(t), nd);
    for (int i = 0; i < nd; i++)
        cr_assert_eq(sr_tensor_shape(t)[i], shape[i], "%s: dim %d is %lld, expected %lld", what, i,
                     (long long)sr_tensor_shape(t)[i], (long long)shape[i]);
}

/* The last error contains every one of the given fragments. */
static inline void tu_expect_error(const char *what, const char *frag1, const char *frag2)
{
    const char *e = sr_last_error();
    cr_assert(strstr(e, frag1), "%s: error \"%s\" lacks \"%s\"", what, e, frag1);
    cr_assert(!frag2 || strstr(e, frag2), "%s: error \"%s\" lacks \"%s\"", what, e, frag2 ? frag2 : "");
}

#endif
