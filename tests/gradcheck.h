/* SPDX-License-Identifier: MIT */
/* Gradient check against central finite differences (f64).
 *
 * For an op f with inputs x (random, from a fixed seed, in [lo, hi]) and
 * output y, the full Jacobian dy/dx is computed twice:
 *   analytic:  one backward per output element j, with grad_output = e_j
 *              (retain_graph), reading every input's .grad;
 *   numerical: (f(x + eps e_k) - f(x - eps e_k)) / (2 eps) per input element k.
 * They must agree within |a - n| <= atol + rtol |n| (PyTorch's gradcheck
 * defaults: eps 1e-6, atol 1e-5, rtol 1e-3).
 */
#ifndef SR_TESTS_GRADCHECK_H
#define SR_TESTS_GRADCHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "shmrpc/tensor.h"

#define GC_EPS 1e-6
#define GC_ATOL 1e-5
#define GC_RTOL 1e-3

struct gc_input {
    int ndim;
    int64_t shape[SR_MAX_DIMS];
    double lo, hi;   /* uniform range */
    bool no_grad;    /* a constant input (e.g. an i64 target: set is_target) */
    bool is_target;  /* i64 class indices in [0, hi) */
};

/* f must return a new tensor (or NULL with sr_last_error). */
typedef sr_tensor *(*gc_fn)(sr_tensor *const *in, const void *arg);

/* Checks f; on a mismatch fails the current Criterion test with the op name,
 * input, output element and both values. */
void gradcheck(const char *name, gc_fn f, const void *arg, int nin, const struct gc_input *in);

#endif
