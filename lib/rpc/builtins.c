/* SPDX-License-Identifier: MIT */
/* Built-in functions: callable by name on every worker without registration,
 * like torch.add through RPC. Arithmetic works on ints and doubles, and on
 * tensors through the tensor library (the table is in docs/API.md).
 *
 * Scalar calls run inline on the polling thread (they never block); a call
 * with a tensor argument computes, so the dispatcher sends it to the
 * executors like a plain function (serve.c). A tensor op that fails
 * returns NULL with sr_last_error() naming the op and both shapes; that text
 * becomes the caller's "Error on Node N: ...". */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "log.h"
#include "registry.h"
#include "shmrpc/tensor.h"

/* ---- argument checks ------------------------------------------------------- */

static bool is_number(const sr_value *v)
{
    sr_kind k = sr_value_type(v);
    return k == SR_KIND_INT || k == SR_KIND_DOUBLE;
}

static bool is_tensor(const sr_value *v) { return sr_value_type(v) == SR_KIND_TENSOR; }

static int want_count(sr_call *c, const char *op, size_t lo, size_t hi)
{
    size_t n = sr_call_nargs(c);
    if (n >= lo && n <= hi)
        return 0;
    if (lo == hi)
        return sr_call_fail(c, -EINVAL, "%s() expects %zu argument%s, got %zu", op, lo, lo == 1 ? "" : "s", n);
    return sr_call_fail(c, -EINVAL, "%s() expects %zu to %zu arguments, got %zu", op, lo, hi, n);
}

/* Argument i (0-based) must pass ok(); what names the kinds it may be. */
static int want_kind(sr_call *c, const char *op, size_t i, bool (*ok)(const sr_value *), const char *what)
{
    sr_value *v = sr_call_arg(c, i);
    if (ok(v))
        return 0;
    return sr_call_fail(c, -EINVAL, "%s() argument %zu must be %s, not %s", op, i + 1, what,
                        sr_kind_name(sr_value_type(v)));
}

static bool is_operand(const sr_value *v) { return is_number(v) || is_tensor(v); }
static bool is_int(const sr_value *v) { return sr_value_type(v) == SR_KIND_INT; }
static bool is_bool(const sr_value *v) { return sr_value_type(v) == SR_KIND_BOOL; }

/* n arguments, each a number or a tensor. */
static int want_operands(sr_call *c, const char *op, size_t n)
{
    int rc = want_count(c, op, n, n);
    for (size_t i = 0; i < n && !rc; i++)
        rc = want_kind(c, op, i, is_operand, "a number or a tensor");
    return rc;
}

/* n arguments, each a tensor. */
static int want_tensors(sr_call *c, const char *op, size_t n)
{
    int rc = want_count(c, op, n, n);
    for (size_t i = 0; i < n && !rc; i++)
        rc = want_kind(c, op, i, is_tensor, "a tensor");
    return rc;
}

static sr_tensor *tensor_arg(sr_call *c, size_t i) { return sr_value_tensor(sr_call_arg(c, i)); }

/* ---- results ------------------------------------------------------------------ */

/* The message of a tensor error without its "worker<R>: " prefix: the caller
 * sees it after "Error on Node R: ", which names the worker already. */
static const char *error_detail(void)
{
    const char *msg = sr_last_error(), *p = msg;
    if (strncmp(p, "worker", 6) != 0)
        return msg;
    for (p += 6; *p >= '0' && *p <= '9'; p++)
        ;
    return p[0] == ':' && p[1] == ' ' ? p + 2 : msg;
}

/* Return a tensor op's result (adopting its reference), or forward its error. */
static int return_tensor(sr_call *c, sr_tensor *t)
{
    if (!t)
        return sr_call_fail(c, -EINVAL, "%s", error_detail());
    sr_value *v = sr_value_from_tensor(t);
    sr_tensor_unref(t);
    if (!v)
        return sr_call_fail(c, -ENOMEM, "%s", error_detail());
    return sr_call_return(c, v);
}

static int return_number(sr_call *c, sr_value *v)
{
    if (!v)
        return sr_call_fail(c, -ENOMEM, "%s", error_detail());
    return sr_call_return(c, v);
}

/* ---- arithmetic ---------------------------------------------------------------- */

enum binop { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_POW };

static const char *const binop_name[] = {"add", "sub", "mul", "div", "pow"};

static sr_tensor *(*const tensor_tensor[])(sr_tensor *, sr_tensor *) = {sr_add, sr_sub, sr_mul, sr_div, sr_pow};
static sr_tensor *(*const tensor_scalar[])(sr_tensor *, double) = {
    sr_add_scalar, sr_sub_scalar, sr_mul_scalar, sr_div_scalar, sr_pow_scalar};

/* s op t. Where the op commutes the scalar form is exact; s - t is (-t) + s,
 * which rounds once, like s - t. div and pow broadcast a 0-d tensor of t's
 * dtype. */
static sr_tensor *scalar_tensor(enum binop op, double s, sr_tensor *t)
{
    switch (op) {
    case OP_ADD: return sr_add_scalar(t, s);
    case OP_MUL: return sr_mul_scalar(t, s);
    case OP_SUB: {
        sr_tensor *n = sr_neg(t), *r = n ? sr_add_scalar(n, s) : NULL;
        sr_tensor_unref(n);
        return r;
    }
    default: {
        sr_tensor *st = sr_scalar_tensor(sr_tensor_dtype(t), s, 0);
        sr_tensor *r = st ? tensor_tensor[op](st, t) : NULL;
        sr_tensor_unref(st);
        return r;
    }
    }
}

static int tensor_binop(sr_call *c, enum binop op, sr_value *a, sr_value *b)
{
    sr_tensor *ta = sr_value_tensor(a), *tb = sr_value_tensor(b);
    if (ta && tb)
        return return_tensor(c, tensor_tensor[op](ta, tb));
    if (ta)
        return return_tensor(c, tensor_scalar[op](ta, sr_value_double(b)));
    return return_tensor(c, scalar_tensor(op, sr_value_double(a), tb));
}

/* Two numbers: ints stay ints for add, sub and mul (wrapping, like int64
 * tensors); div and pow give a double. */
static sr_value *number_binop(enum binop op, sr_value *a, sr_value *b)
{
    if (is_int(a) && is_int(b) && op <= OP_MUL) {
        uint64_t x = (uint64_t)sr_value_int(a), y = (uint64_t)sr_value_int(b);
        return sr_int((int64_t)(op == OP_ADD ? x + y : op == OP_SUB ? x - y : x * y));
    }
    double x = sr_value_double(a), y = sr_value_double(b);
    switch (op) {
    case OP_ADD: return sr_double(x + y);
    case OP_SUB: return sr_double(x - y);
    case OP_MUL: return sr_double(x * y);
    case OP_DIV: return sr_double(x / y);
    default: return sr_double(pow(x, y));
    }
}

static int binop(sr_call *c, enum binop op)
{
    int rc = want_operands(c, binop_name[op], 2);
    if (rc)
        return rc;
    sr_value *a = sr_call_arg(c, 0), *b = sr_call_arg(c, 1);
    if (is_tensor(a) || is_tensor(b))
        return tensor_binop(c, op, a, b);
    return return_number(c, number_binop(op, a, b));
}

static int builtin_add(sr_call *c) { return binop(c, OP_ADD); }
static int builtin_sub(sr_call *c) { return binop(c, OP_SUB); }
static int builtin_mul(sr_call *c) { return binop(c, OP_MUL); }
static int builtin_div(sr_call *c) { return binop(c, OP_DIV); }
static int builtin_pow(sr_call *c) { return binop(c, OP_POW); }

static int builtin_neg(sr_call *c)
{
    int rc = want_operands(c, "neg", 1);
    if (rc)
        return rc;
    sr_value *a = sr_call_arg(c, 0);
    if (is_tensor(a))
        return return_tensor(c, sr_neg(sr_value_tensor(a)));
    if (is_int(a))
        return return_number(c, sr_int((int64_t)(0 - (uint64_t)sr_value_int(a))));
    return return_number(c, sr_double(-sr_value_double(a)));
}

/* ---- tensor-only ops -------------------------------------------------------------- */

#define UNARY(name)                                                                 \
    static int builtin_##name(sr_call *c)                                           \
    {                                                                               \
        int rc = want_tensors(c, #name, 1);                                         \
        return rc ? rc : return_tensor(c, sr_##name(tensor_arg(c, 0)));            \
    }
UNARY(exp)
UNARY(log)
UNARY(sin)
UNARY(cos)
UNARY(tanh)
UNARY(relu)
UNARY(sigmoid)
UNARY(sqrt)
UNARY(t)
UNARY(clone)

#define MATRIX(name)                                                                \
    static int builtin_##name(sr_call *c)                                           \
    {                                                                               \
        int rc = want_tensors(c, #name, 2);                                         \
        return rc ? rc : return_tensor(c, sr_##name(tensor_arg(c, 0), tensor_arg(c, 1))); \
    }
MATRIX(matmul)
MATRIX(mm)
MATRIX(bmm)

/* A dim argument as a C int; the tensor op checks it against the tensor's
 * ndim (and names both). */
static int dim_arg(sr_call *c, const char *op, size_t i, int *dim)
{
    int rc = want_kind(c, op, i, is_int, "an int (a dim)");
    if (rc)
        return rc;
    int64_t d = sr_value_int(sr_call_arg(c, i));
    if (d < INT_MIN || d > INT_MAX)
        return sr_call_fail(c, -EINVAL, "%s() argument %zu: dim %lld is out of range", op, i + 1, (long long)d);
    *dim = (int)d;
    return 0;
}

/* sum(x) / mean(x): every element; sum(x, dim[, keepdim]) along one dim. */
static int reduce(sr_call *c, const char *op, sr_tensor *(*all)(sr_tensor *),
                  sr_tensor *(*along)(sr_tensor *, int, bool))
{
    int dim = 0, rc = want_count(c, op, 1, 3);
    if (!rc)
        rc = want_kind(c, op, 0, is_tensor, "a tensor");
    if (rc)
        return rc;
    if (sr_call_nargs(c) == 1)
        return return_tensor(c, all(tensor_arg(c, 0)));
    if ((rc = dim_arg(c, op, 1, &dim)))
        return rc;
    if (sr_call_nargs(c) == 3 && (rc = want_kind(c, op, 2, is_bool, "a bool (keepdim)")))
        return rc;
    bool keepdim = sr_call_nargs(c) == 3 && sr_value_bool(sr_call_arg(c, 2));
    return return_tensor(c, along(tensor_arg(c, 0), dim, keepdim));
}

static int builtin_sum(sr_call *c) { return reduce(c, "sum", sr_sum, sr_sum_dim); }
static int builtin_mean(sr_call *c) { return reduce(c, "mean", sr_mean, sr_mean_dim); }

static int builtin_transpose(sr_call *c)
{
    int d0, d1, rc = want_count(c, "transpose", 3, 3);
    if (!rc)
        rc = want_kind(c, "transpose", 0, is_tensor, "a tensor");
    if (rc || (rc = dim_arg(c, "transpose", 1, &d0)) || (rc = dim_arg(c, "transpose", 2, &d1)))
        return rc;
    return return_tensor(c, sr_transpose(tensor_arg(c, 0), d0, d1));
}

/* reshape(x, [d0, d1, ...]) or reshape(x, d0, d1, ...); one entry may be -1. */
static int builtin_reshape(sr_call *c)
{
    int rc = want_count(c, "reshape", 2, 1 + SR_MAX_DIMS);
    if (!rc)
        rc = want_kind(c, "reshape", 0, is_tensor, "a tensor");
    if (rc)
        return rc;
    sr_value *first = sr_call_arg(c, 1);
    bool listed = sr_value_type(first) == SR_KIND_LIST;
    size_t n = listed ? sr_value_list_len(first) : sr_call_nargs(c) - 1;
    if (listed && sr_call_nargs(c) != 2)
        return sr_call_fail(c, -EINVAL, "reshape() takes the shape as one list or as ints, not both");
    if (n > SR_MAX_DIMS)
        return sr_call_fail(c, -EINVAL, "reshape() shape has %zu dims; at most %d", n, SR_MAX_DIMS);
    int64_t shape[SR_MAX_DIMS];
    for (size_t i = 0; i < n; i++) {
        sr_value *d = listed ? sr_value_list_at(first, i) : sr_call_arg(c, i + 1);
        if (!is_int(d))
            return sr_call_fail(c, -EINVAL, "reshape() shape entry %zu must be an int, not %s", i,
                                sr_kind_name(sr_value_type(d)));
        shape[i] = sr_value_int(d);
    }
    return return_tensor(c, sr_reshape(tensor_arg(c, 0), (int)n, shape));
}

/* ---- utilities ------------------------------------------------------------------- */

/* The no-op: returns None. Useful to measure the runtime itself. */
static int builtin_noop(sr_call *c)
{
    return sr_call_return(c, NULL);
}

/* Returns its arguments as a list (identity for one argument). */
static int builtin_echo(sr_call *c)
{
    if (sr_call_nargs(c) == 1)
        return sr_call_return(c, sr_value_ref(sr_call_arg(c, 0)));
    sr_value *items[64];
    size_t n = sr_call_nargs(c);
    if (n > 64)
        return sr_call_fail(c, -EINVAL, "echo() takes at most 64 arguments, got %zu", n);
    for (size_t i = 0; i < n; i++)
        items[i] = sr_call_arg(c, i);
    return sr_call_return(c, sr_list(n, items));
}

const struct sr_builtin *sr__builtin_table(size_t *n)
{
    static const struct sr_builtin table[] = {
        {"add", builtin_add, false},         {"sub", builtin_sub, false},       {"mul", builtin_mul, false},
        {"div", builtin_div, false},         {"pow", builtin_pow, false},       {"neg", builtin_neg, false},
        {"exp", builtin_exp, false},         {"log", builtin_log, false},       {"sin", builtin_sin, false},
        {"cos", builtin_cos, false},         {"tanh", builtin_tanh, false},     {"relu", builtin_relu, false},
        {"sigmoid", builtin_sigmoid, false}, {"sqrt", builtin_sqrt, false},     {"t", builtin_t, true},
        {"clone", builtin_clone, false},     {"matmul", builtin_matmul, false}, {"mm", builtin_mm, false},
        {"bmm", builtin_bmm, false},         {"sum", builtin_sum, false},       {"mean", builtin_mean, false},
        {"transpose", builtin_transpose, true}, {"reshape", builtin_reshape, true},
        {"noop", builtin_noop, true},        {"echo", builtin_echo, true},
    };
    *n = sizeof(table) / sizeof(table[0]);
    return table;
}
