/* SPDX-License-Identifier: MIT */
/* User-defined autograd functions (shmrpc/autograd_function.h): ports of the
 * custom Function cases of PyTorch's test_autograd.py (saved tensors,
 * needs_input_grad, mark_non_differentiable, materialize_grads, an input
 * returned as an output, once-differentiable misuse, the checks of what
 * backward returns) and the errors that name the function. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "shmrpc/autograd_function.h"
#include "tensor_util.h"
#include "common.h"

LEAK_CHECKED_SUITE(function);

/* What the callbacks saw, through the definition's user pointer. */
struct log {
    int forwards, backwards;
    bool needs[3];      /* needs_input_grad, as backward saw it */
    bool fwd_needs[3];  /* as forward saw it */
    bool gout_null[3];  /* grad_outputs[i] was NULL */
    double gout_sum[3]; /* sum of grad_outputs[i] */
    int mode;           /* what a test's function does (per function) */
    sr_tensor *extra;   /* a tensor a function uses (borrowed) */
};

static double sum_of(sr_tensor *t)
{
    sr_tensor *s = sr_sum(t);
    double v = sr_tensor_item(s);
    sr_tensor_unref(s);
    return v;
}

static void log_backward(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, size_t n)
{
    struct log *l = sr_function_ctx_user(ctx);
    l->backwards++;
    for (size_t i = 0; i < n && i < 3; i++)
        l->needs[i] = sr_function_ctx_needs_input_grad(ctx, i);
    for (size_t i = 0; i < nout && i < 3; i++) {
        l->gout_null[i] = gout[i] == NULL;
        l->gout_sum[i] = gout[i] ? sum_of(gout[i]) : 0;
    }
}

/* ---- MyMul: x * y, saving both ---- */

static int mul_fwd(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout)
{
    (void)n;
    (void)nout;
    struct log *l = sr_function_ctx_user(ctx);
    l->forwards++;
    for (int i = 0; i < 2; i++)
        l->fwd_needs[i] = sr_function_ctx_needs_input_grad(ctx, (size_t)i);
    int rc = sr_function_ctx_save_for_backward(ctx, in, 2);
    if (rc)
        return rc;
    out[0] = sr_mul(in[0], in[1]);
    return out[0] ? 0 : -EINVAL;
}

static int mul_bwd(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, sr_tensor **gin, size_t n)
{
    log_backward(ctx, gout, nout, n);
    sr_tensor *x = NULL, *y = NULL;
    int rc = sr_function_ctx_saved(ctx, 0, &x);
    if (!rc)
        rc = sr_function_ctx_saved(ctx, 1, &y);
    if (!rc && sr_function_ctx_needs_input_grad(ctx, 0))
        gin[0] = sr_mul(gout[0], y);
    if (!rc && sr_function_ctx_needs_input_grad(ctx, 1))
        gin[1] = sr_mul(gout[0], x);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    return rc;
}

Test(function, saved_tensors_and_needs_input_grad)
{
    struct log l = {0};
    const sr_autograd_function my_mul = {"MyMul", mul_fwd, mul_bwd, &l};
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(3), VALS(1, 2, 3), SR_REQUIRES_GRAD);
    sr_tensor *y = tu_tensor(SR_F64, 1, SHAPE(3), VALS(4, 5, 6), 0);
    sr_tensor *z, *in[2] = {x, y};
    cr_assert_eq(sr_function_apply(&my_mul, in, 2, &z, 1), 0, "%s", sr_last_error());
    cr_assert_str_eq(sr_tensor_grad_fn_name(z), "MyMulBackward");
    cr_assert(sr_tensor_requires_grad(z) && !sr_tensor_is_leaf(z));
    cr_assert(l.fwd_needs[0] && !l.fwd_needs[1], "forward's needs_input_grad");
    tu_expect(z, VALS(4, 10, 18), 3, 0, 0, "x * y");
    sr_tensor *loss = sr_sum(z);
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    cr_assert_eq(l.backwards, 1);
    cr_assert(l.needs[0] && !l.needs[1], "backward's needs_input_grad");
    tu_expect(sr_tensor_grad(x), VALS(4, 5, 6), 3, 0, 0, "dx = y");
    cr_assert_null(sr_tensor_grad(y));
    sr_tensor_unref(loss);
    sr_tensor_unref(z);

    /* both inputs require grad: both gradients */
    cr_assert_eq(sr_tensor_set_requires_grad(y, true), 0);
    cr_assert_eq(sr_tensor_set_grad(x, NULL), 0);
    cr_assert_eq(sr_function_apply(&my_mul, in, 2, &z, 1), 0, "%s", sr_last_error());
    loss = sr_sum(z);
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    cr_assert(l.needs[0] && l.needs[1]);
    tu_expect(sr_tensor_grad(x), VALS(4, 5, 6), 3, 0, 0, "dx = y");
    tu_expect(sr_tensor_grad(y), VALS(1, 2, 3), 3, 0, 0, "dy = x");
    sr_tensor_unref(loss);
    sr_tensor_unref(z);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
}

/* The tree's rule for saved tensors (docs/TENSORS.md): a saved tensor
 * written in place before backward keeps the forward's values, where
 * PyTorch fails with "modified by an inplace operation". */
Test(function, saved_tensor_written_in_place_keeps_forward_values)
{
    struct log l = {0};
    const sr_autograd_function my_mul = {"MyMul", mul_fwd, mul_bwd, &l};
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD);
    sr_tensor *y = tu_tensor(SR_F64, 1, SHAPE(2), VALS(3, 4), 0);
    sr_tensor *z, *in[2] = {x, y};
    cr_assert_eq(sr_function_apply(&my_mul, in, 2, &z, 1), 0, "%s", sr_last_error());
    cr_assert_eq(sr_fill_(y, 100), 0, "%s", sr_last_error());
    sr_tensor *loss = sr_sum(z);
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(3, 4), 2, 0, 0, "dx = y as the forward saw it");
    sr_tensor_unref(loss);
    sr_tensor_unref(z);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
}

Test(function, second_backward_without_retain_graph_names_the_function)
{
    struct log l = {0};
    const sr_autograd_function my_mul = {"MyMul", mul_fwd, mul_bwd, &l};
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD);
    sr_tensor *z, *in[2] = {x, x};
    cr_assert_eq(sr_function_apply(&my_mul, in, 2, &z, 1), 0, "%s", sr_last_error());
    sr_tensor *loss = sr_sum(z);
    cr_assert_eq(sr_backward(loss, true), 0, "%s", sr_last_error());
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(4, 8), 2, 0, 0, "two passes of 2x");
    cr_assert_eq(sr_backward(loss, false), -EPERM);
    tu_expect_error("third pass", "backward through the graph a second time", "MyMulBackward");
    cr_assert_eq(l.backwards, 2);
    const char *name = sr_tensor_grad_fn_name(z);
    sr_tensor_unref(loss);
    sr_tensor_unref(z);
    sr_tensor_unref(x);
    /* a static string, as built-in nodes' names (ASan sees a use after free otherwise) */
    cr_assert_str_eq(name, "MyMulBackward");
}

/* ---- Scale: x * k with k kept in the context's state ---- */

static int scale_fwd(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout)
{
    (void)n;
    (void)nout;
    const struct log *l = sr_function_ctx_user(ctx);
    double *k = sr_function_ctx_state(ctx, sizeof(double));
    if (!k)
        return -ENOMEM;
    *k = l->mode;
    out[0] = sr_mul_scalar(in[0], *k);
    return out[0] ? 0 : -EINVAL;
}

static int scale_bwd(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, sr_tensor **gin, size_t n)
{
    log_backward(ctx, gout, nout, n);
    const double *k = sr_function_ctx_state(ctx, 0);
    gin[0] = sr_mul_scalar(gout[0], *k);
    return gin[0] ? 0 : -EINVAL;
}

Test(function, values_saved_in_the_context)
{
    struct log l = {.mode = 3};
    const sr_autograd_function scale = {"Scale", scale_fwd, scale_bwd, &l};
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD), *y;
    cr_assert_eq(sr_function_apply(&scale, &x, 1, &y, 1), 0, "%s", sr_last_error());
    l.mode = 7; /* what forward stored counts, not the definition's state now */
    sr_tensor *loss = sr_sum(y);
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(3, 3), 2, 0, 0, "dx = k");
    sr_tensor_unref(loss);
    sr_tensor_unref(y);
    sr_tensor_unref(x);
}

Test(function, nothing_recorded_without_grad)
{
    struct log l = {.mode = 2};
    const sr_autograd_function scale = {"Scale", scale_fwd, scale_bwd, &l};
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD), *y;
    bool prev = sr_no_grad_enter();
    cr_assert_eq(sr_function_apply(&scale, &x, 1, &y, 1), 0, "%s", sr_last_error());
    sr_no_grad_exit(prev);
    cr_assert(sr_tensor_is_leaf(y) && !sr_tensor_requires_grad(y) && !sr_tensor_grad_fn_name(y));
    tu_expect(y, VALS(2, 4), 2, 0, 0, "forward ran");
    sr_tensor_unref(y);
    sr_tensor *c = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), 0);
    cr_assert_eq(sr_function_apply(&scale, &c, 1, &y, 1), 0, "%s", sr_last_error());
    cr_assert(!sr_tensor_requires_grad(y), "no input requires grad");
    sr_tensor_unref(y);
    sr_tensor_unref(c);
    sr_tensor_unref(x);
}

/* ---- Split: (2x, a copy of x marked non-differentiable, an i64 count) ---- */

static int split_fwd(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout)
{
    (void)n;
    (void)nout;
    const struct log *l = sr_function_ctx_user(ctx);
    if (l->mode == 1)
        sr_function_ctx_set_materialize_grads(ctx, false);
    out[0] = sr_mul_scalar(in[0], 2);
    out[1] = sr_clone(in[0]);
    out[2] = sr_arange(SR_I64, 0, 2, 1, 0);
    if (!out[0] || !out[1] || !out[2])
        return -ENOMEM;
    return sr_function_ctx_mark_non_differentiable(ctx, 1);
}

static int split_bwd(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, sr_tensor **gin, size_t n)
{
    log_backward(ctx, gout, nout, n);
    gin[0] = sr_mul_scalar(gout[0], 2);
    return gin[0] ? 0 : -EINVAL;
}

static void check_split(int mode)
{
    struct log l = {.mode = mode};
    const sr_autograd_function split = {"Split", split_fwd, split_bwd, &l};
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD), *out[3];
    cr_assert_eq(sr_function_apply(&split, &x, 1, out, 3), 0, "%s", sr_last_error());
    cr_assert_str_eq(sr_tensor_grad_fn_name(out[0]), "SplitBackward");
    for (int i = 1; i < 3; i++)
        cr_assert(!sr_tensor_requires_grad(out[i]) && sr_tensor_is_leaf(out[i]), "output %d is differentiable", i);
    sr_tensor *bad = sr_sum(out[1]);
    cr_assert_eq(sr_backward(bad, false), -EINVAL);
    tu_expect_error("non-differentiable", "does not require grad", NULL);
    sr_tensor *loss = sr_sum(out[0]);
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(2, 2), 2, 0, 0, "dx = 2");
    cr_assert_eq(l.gout_null[1], mode == 1, "grad_outputs[1] NULL: %d, materialize %d", l.gout_null[1], mode != 1);
    cr_assert_eq(l.gout_null[2], mode == 1);
    cr_assert(!l.gout_null[0] && l.gout_sum[0] == 2 && l.gout_sum[1] == 0);
    sr_tensor_unref(loss);
    sr_tensor_unref(bad);
    for (int i = 0; i < 3; i++)
        sr_tensor_unref(out[i]);
    sr_tensor_unref(x);
}

Test(function, mark_non_differentiable_and_materialized_zeros) { check_split(0); }
Test(function, set_materialize_grads_false_passes_null) { check_split(1); }

/* ---- Identity: returns its input ---- */

static int id_fwd(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout)
{
    (void)ctx;
    (void)n;
    out[0] = sr_tensor_ref(in[0]);
    if (nout > 1)
        out[1] = sr_tensor_ref(in[0]);
    return 0;
}

static int id_bwd(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, sr_tensor **gin, size_t n)
{
    (void)ctx;
    (void)n;
    gin[0] = nout > 1 ? sr_add(gout[0], gout[1]) : sr_tensor_ref(gout[0]);
    return gin[0] ? 0 : -EINVAL;
}

Test(function, input_returned_as_output_becomes_a_view)
{
    const sr_autograd_function id = {"Identity", id_fwd, id_bwd, NULL};
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD), *y[2];
    cr_assert_eq(sr_function_apply(&id, &x, 1, y, 2), 0, "%s", sr_last_error());
    cr_assert(y[0] != x && y[1] != x && y[0] != y[1], "outputs are new tensors");
    cr_assert(sr_tensor_shares_storage(y[0], x) && sr_tensor_shares_storage(y[1], x));
    cr_assert(sr_tensor_is_leaf(x) && sr_tensor_requires_grad(x), "the input is still a leaf");
    cr_assert_str_eq(sr_tensor_grad_fn_name(y[1]), "IdentityBackward");
    sr_tensor *s = sr_add(y[0], y[1]), *loss = sr_sum(s);
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(2, 2), 2, 0, 0, "two identities");
    sr_tensor_unref(loss);
    sr_tensor_unref(s);
    sr_tensor_unref(y[0]);
    sr_tensor_unref(y[1]);
    sr_tensor_unref(x);
}

/* ---- Bad: a backward that returns what its mode says ---- */

enum bad_mode { BAD_SHAPE = 1, BAD_DTYPE, BAD_NON_TENSOR, UNNEEDED, FAILS, HISTORY };

static int bad_fwd(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout)
{
    (void)ctx;
    (void)n;
    (void)nout;
    out[0] = sr_mul_scalar(in[0], 2);
    return out[0] ? 0 : -EINVAL;
}

static int bad_bwd(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, sr_tensor **gin, size_t n)
{
    struct log *l = sr_function_ctx_user(ctx);
    log_backward(ctx, gout, nout, n);
    gin[0] = sr_mul_scalar(gout[0], 2);
    switch ((enum bad_mode)l->mode) {
    case BAD_SHAPE:
        gin[1] = sr_zeros(SR_F64, 1, SHAPE(3), 0);
        break;
    case BAD_DTYPE:
        gin[1] = sr_zeros(SR_F32, 1, SHAPE(2), 0);
        break;
    case BAD_NON_TENSOR:
    case UNNEEDED:
        gin[1] = sr_zeros(SR_F64, 1, SHAPE(2), 0);
        break;
    case FAILS: {
        sr_tensor *wrong = sr_zeros(SR_F64, 1, SHAPE(5), 0), *r = sr_add(gout[0], wrong); /* fails: [2] + [5] */
        sr_tensor_unref(wrong);
        return r ? 0 : -EDOM;
    }
    case HISTORY:
        sr_set_grad_enabled(true); /* what a twice-differentiable backward would do */
        sr_tensor_unref(gin[0]);
        gin[0] = sr_mul(gout[0], l->extra);
        break;
    }
    return 0;
}

/* Backward of 2 * in[0] with the given second input; returns sr_backward's
 * code, x's gradient checked when it succeeded. */
static int run_bad(enum bad_mode mode, sr_tensor *second, sr_tensor *extra)
{
    struct log l = {.mode = mode, .extra = extra};
    const sr_autograd_function bad = {"Bad", bad_fwd, bad_bwd, &l};
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD), *y, *in[2] = {x, second};
    cr_assert_eq(sr_function_apply(&bad, in, 2, &y, 1), 0, "%s", sr_last_error());
    sr_tensor *loss = sr_sum(y);
    int rc = sr_backward(loss, false);
    cr_assert_eq(l.backwards, 1);
    if (!rc)
        tu_expect(sr_tensor_grad(x), VALS(2, 2), 2, 0, 0, "dx = 2");
    else
        cr_assert_null(sr_tensor_grad(x), "nothing accumulated from a failed node");
    sr_tensor_unref(loss);
    sr_tensor_unref(y);
    sr_tensor_unref(x);
    return rc;
}

Test(function, gradients_backward_returns_are_checked)
{
    sr_tensor *w = tu_tensor(SR_F64, 1, SHAPE(2), VALS(5, 6), SR_REQUIRES_GRAD);
    cr_assert_eq(run_bad(BAD_SHAPE, w, NULL), -EINVAL);
    tu_expect_error("shape", "Function BadBackward returned an invalid gradient at index 1",
                    "got [3] but expected shape compatible with [2]");
    cr_assert_eq(run_bad(BAD_DTYPE, w, NULL), -EINVAL);
    tu_expect_error("dtype", "BadBackward returned an invalid gradient at index 1", "expected dtype f64 but got f32");
    cr_assert_eq(run_bad(BAD_NON_TENSOR, NULL, NULL), -EINVAL);
    tu_expect_error("non-tensor", "BadBackward returned a gradient different than None at index 1",
                    "was not a tensor");
    cr_assert_null(sr_tensor_grad(w));
    sr_tensor_unref(w);
    /* a gradient for a tensor input that needs none is dropped, as PyTorch */
    sr_tensor *c = tu_tensor(SR_F64, 1, SHAPE(2), VALS(5, 6), 0);
    cr_assert_eq(run_bad(UNNEEDED, c, NULL), 0, "%s", sr_last_error());
    cr_assert_null(sr_tensor_grad(c));
    sr_tensor_unref(c);
}

Test(function, backward_error_names_the_function_and_keeps_the_detail)
{
    cr_assert_eq(run_bad(FAILS, NULL, NULL), -EDOM);
    tu_expect_error("failing backward", "BadBackward: backward failed", "sr_add: shapes [2] and [5]");
}

/* A successful apply and pass leave the thread's last error as it was
 * (docs/API.md): clearing it for the callbacks is undone. */
Test(function, success_keeps_the_last_error)
{
    struct log l = {.mode = 2};
    const sr_autograd_function scale = {"Scale", scale_fwd, scale_bwd, &l};
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD), *y;
    sr_tensor *z3 = sr_zeros(SR_F64, 1, SHAPE(3), 0);
    cr_assert_null(sr_mul(x, z3));
    sr_tensor_unref(z3);
    char before[512];
    snprintf(before, sizeof(before), "%s", sr_last_error());
    cr_assert(strstr(before, "sr_mul"), "a failed sr_mul left its error: %s", before);
    cr_assert_eq(sr_function_apply(&scale, &x, 1, &y, 1), 0, "%s", sr_last_error());
    cr_assert_str_eq(sr_last_error(), before, "after apply");
    sr_tensor *loss = sr_sum(y);
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    cr_assert_str_eq(sr_last_error(), before, "after backward");
    sr_tensor_unref(loss);
    sr_tensor_unref(y);
    sr_tensor_unref(x);
}

Test(function, double_backward_is_refused)
{
    sr_tensor *w = tu_tensor(SR_F64, 1, SHAPE(2), VALS(2, 2), SR_REQUIRES_GRAD);
    cr_assert_eq(run_bad(HISTORY, NULL, w), -EPERM);
    tu_expect_error("history", "BadBackward returned a gradient with history at index 0",
                    "once_differentiable");
    cr_assert(sr_is_grad_enabled(), "grad mode is the caller's again");
    cr_assert_null(sr_tensor_grad(w));
    sr_tensor_unref(w);
}

/* ---- errors of apply and forward ---- */

static int null_fwd(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout)
{
    (void)ctx;
    (void)n;
    (void)nout;
    out[0] = sr_tensor_ref(in[0]); /* output 1 left NULL */
    return 0;
}

static int failing_fwd(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout)
{
    (void)n;
    (void)nout;
    int rc = sr_function_ctx_save_for_backward(ctx, in, 1);
    out[0] = sr_clone(in[0]); /* stored before failing: apply releases it */
    sr_tensor *wrong = sr_zeros(SR_F64, 1, SHAPE(5), 0);
    out[1] = rc ? NULL : sr_mul(in[0], wrong);
    sr_tensor_unref(wrong);
    return out[1] ? 0 : -EDOM;
}

static int backward_in_forward(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, sr_tensor **gin, size_t n)
{
    (void)gout;
    (void)nout;
    (void)gin;
    (void)n;
    return sr_function_ctx_mark_non_differentiable(ctx, 0); /* -EPERM: backward may not */
}

Test(function, forward_errors_name_the_function)
{
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD), *out[2] = {x, x};
    const sr_autograd_function failing = {"Failing", failing_fwd, id_bwd, NULL};
    cr_assert_eq(sr_function_apply(&failing, &x, 1, out, 2), -EDOM);
    tu_expect_error("forward", "Failing: forward failed", "sr_mul: shapes [2] and [5]");
    cr_assert(!out[0] && !out[1], "outputs are NULL after a failure");
    const sr_autograd_function half = {"Half", null_fwd, id_bwd, NULL};
    cr_assert_eq(sr_function_apply(&half, &x, 1, out, 2), -EINVAL);
    tu_expect_error("NULL output", "Half: forward returned no tensor for output 1 of 2", NULL);

    sr_autograd_function bad = {"", null_fwd, id_bwd, NULL};
    cr_assert_eq(sr_function_apply(&bad, &x, 1, out, 1), -EINVAL);
    tu_expect_error("empty name", "has 0 characters", NULL);
    char longname[SR_FUNCTION_NAME_MAX + 2];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = 0;
    bad.name = longname;
    cr_assert_eq(sr_function_apply(&bad, &x, 1, out, 1), -EINVAL);
    bad.name = "NoBackward";
    bad.backward = NULL;
    cr_assert_eq(sr_function_apply(&bad, &x, 1, out, 1), -EINVAL);
    tu_expect_error("no backward", "needs a name, a forward and a backward", NULL);
    cr_assert_eq(sr_function_apply(NULL, &x, 1, out, 1), -EINVAL);
    cr_assert_eq(sr_function_apply(&half, &x, 1, out, 0), -EINVAL);
    tu_expect_error("no output", "at least one output", NULL);

    /* the forward-only calls of the context, from backward */
    const sr_autograd_function marks = {"Marks", id_fwd, backward_in_forward, NULL};
    cr_assert_eq(sr_function_apply(&marks, &x, 1, out, 1), 0, "%s", sr_last_error());
    sr_tensor *loss = sr_sum(out[0]);
    cr_assert_eq(sr_backward(loss, false), -EPERM);
    tu_expect_error("mark in backward", "MarksBackward: backward failed", "Marks: only forward may call this");
    sr_tensor_unref(loss);
    sr_tensor_unref(out[0]);
    sr_tensor_unref(x);
}

/* ---- NoGrad: saves NULL beside x, and returns no gradient (PyTorch's
 * test_save_none_for_backward and test_function_returns_undefined_tensor) ---- */

static int nograd_fwd(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout)
{
    (void)n;
    (void)nout;
    sr_tensor *save[2] = {NULL, in[0]};
    int rc = sr_function_ctx_save_for_backward(ctx, save, 2);
    out[0] = rc ? NULL : sr_mul_scalar(in[0], 2);
    return out[0] ? 0 : -EINVAL;
}

static int nograd_bwd(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, sr_tensor **gin, size_t n)
{
    log_backward(ctx, gout, nout, n);
    sr_tensor *a = (sr_tensor *)1, *b = NULL;
    int rc = sr_function_ctx_saved(ctx, 0, &a);
    if (!rc)
        rc = sr_function_ctx_saved(ctx, 1, &b);
    if (!rc && (a || !b || sr_function_ctx_num_saved(ctx) != 2))
        rc = -EINVAL; /* NULL saved, then x */
    if (!rc && sr_function_ctx_saved(ctx, 2, &a) != -EINVAL)
        rc = -EINVAL; /* out of range */
    sr_tensor_unref(b);
    (void)gin; /* gin[0] stays NULL: no gradient */
    return rc;
}

static int count_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    (void)replace;
    *(double *)arg += sum_of(grad);
    return 0;
}

Test(function, saved_null_no_gradient_returned_and_hooks)
{
    struct log l = {0};
    const sr_autograd_function nograd = {"NoGrad", nograd_fwd, nograd_bwd, &l};
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(3), VALS(1, 2, 3), SR_REQUIRES_GRAD), *y;
    cr_assert_eq(sr_function_apply(&nograd, &x, 1, &y, 1), 0, "%s", sr_last_error());
    double seen = 0;
    cr_assert_eq(sr_tensor_register_hook(y, count_hook, &seen), 0, "%s", sr_last_error());
    sr_tensor *loss = sr_sum(y);
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    cr_assert_eq(l.backwards, 1);
    cr_assert_eq(seen, 3, "the hook on the output saw the gradient (sum %g)", seen);
    cr_assert_null(sr_tensor_grad(x), "backward returned no gradient");
    sr_tensor_unref(loss);
    sr_tensor_unref(y);
    sr_tensor_unref(x);
}

/* ---- two threads' passes through one retained custom node at once: its
 * backward only reads the context ---- */

static _Atomic int shared_backwards; /* relaxed: a count read after the joins */

static int shared_bwd(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, sr_tensor **gin, size_t n)
{
    (void)nout;
    (void)n;
    atomic_fetch_add_explicit(&shared_backwards, 1, memory_order_relaxed);
    sr_tensor *y = NULL;
    int rc = sr_function_ctx_saved(ctx, 1, &y);
    if (!rc && sr_function_ctx_needs_input_grad(ctx, 0))
        gin[0] = sr_mul(gout[0], y);
    sr_tensor_unref(y);
    return rc ? rc : gin[0] ? 0 : -EINVAL;
}

#define SHARED_PASSES 50

static void *shared_passes(void *loss)
{
    for (int i = 0; i < SHARED_PASSES; i++)
        if (sr_backward(loss, true))
            return loss; /* non-NULL: failed (the detail is this thread's) */
    return NULL;
}

Test(function, concurrent_passes_through_one_node)
{
    struct log l = {0};
    const sr_autograd_function shared = {"Shared", mul_fwd, shared_bwd, &l};
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD);
    sr_tensor *w = tu_tensor(SR_F64, 1, SHAPE(2), VALS(3, -4), 0), *y, *in[2] = {x, w};
    cr_assert_eq(sr_function_apply(&shared, in, 2, &y, 1), 0, "%s", sr_last_error());
    sr_tensor *loss = sr_sum(y);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, shared_passes, loss), 0);
    for (int i = 0; i < 2; i++) {
        void *failed;
        pthread_join(t[i], &failed);
        cr_assert_null(failed, "thread %d: a pass failed", i);
    }
    cr_assert_eq(atomic_load_explicit(&shared_backwards, memory_order_relaxed), 2 * SHARED_PASSES);
    tu_expect(sr_tensor_grad(x), VALS(300, -400), 2, 0, 0, "100 passes of dx = w");
    sr_tensor_unref(loss);
    sr_tensor_unref(y);
    sr_tensor_unref(w);
    sr_tensor_unref(x);
}
