/* SPDX-License-Identifier: MIT */
/* Tensors through RPC, between the four workers of a job and to self:
 * built-in arithmetic on tensors, zero-copy (the callee views the caller's
 * very block), copy-on-write isolation in both directions, 64 MiB tensors,
 * built-in errors and wrong argument kinds, and the tensor built-ins against
 * the same ops run locally. */
#include <math.h>
#include <pthread.h>

#include "heap.h"
#include "module.h" /* the RPC seam: sr__rpc_shares_heap */
#include "rpc_harness.h"
#include "shmrpc/tensor.h"
#include "tensor_impl.h"

LEAK_CHECKED_SUITE(rpc_tensor);

#define WORLD 4
#define MiB (UINT64_C(1) << 20)

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t block_off(const sr_tensor *t) { return sr__block_to_off(t->storage->block); }

/* A tensor of dt and shape holding base, base + 1, ... */
static sr_tensor *counting(sr_dtype dt, int nd, const int64_t *shape, double base)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    sr_tensor *flat = sr_arange(dt, base, base + (double)n, 1, 0);
    sr_tensor *t = flat ? sr_reshape(flat, nd, shape) : NULL;
    sr_tensor_unref(flat);
    return t;
}

/* A value holding t (the value takes its own reference; t's is dropped). */
static sr_value *tv(sr_tensor *t)
{
    sr_value *v = t ? sr_value_from_tensor(t) : NULL;
    sr_tensor_unref(t);
    return v;
}

/* Every element of t, row-major, into a new array of doubles. */
static double *elements(const sr_tensor *t)
{
    size_t n = sr_tensor_numel(t);
    double *d = malloc((n ? n : 1) * sizeof(double));
    if (d && sr_tensor_to_f64(t, d, n)) {
        free(d);
        return NULL;
    }
    return d;
}

/* v is a tensor with the dtype, shape and elements of want. */
static int expect_tensor(sr_value *v, const sr_tensor *want, const char *what)
{
    char shape[SR_SHAPE_STR];
    WCHECK(want, "%s: the local reference failed: %s", what, sr_last_error());
    sr_tensor *got = sr_value_tensor(v);
    WCHECK(got, "%s: got a %s, not a tensor", what, sr_kind_name(sr_value_type(v)));
    WCHECK(sr_tensor_dtype(got) == sr_tensor_dtype(want), "%s: dtype %s, want %s", what,
           sr_dtype_name(sr_tensor_dtype(got)), sr_dtype_name(sr_tensor_dtype(want)));
    WCHECK(sr_tensor_ndim(got) == sr_tensor_ndim(want) &&
               !memcmp(sr_tensor_shape(got), sr_tensor_shape(want), (size_t)sr_tensor_ndim(got) * 8),
           "%s: shape %s", what, sr__shape_str(sr_tensor_ndim(got), sr_tensor_shape(got), shape));
    double *g = elements(got), *w = elements(want);
    size_t n = sr_tensor_numel(got), bad = n;
    for (size_t i = 0; g && w && i < n && bad == n; i++)
        if (g[i] != w[i] && !(isnan(g[i]) && isnan(w[i])))
            bad = i;
    double gb = g && bad < n ? g[bad] : 0, wb = w && bad < n ? w[bad] : 0;
    free(g);
    free(w);
    WCHECK(bad == n, "%s: element %zu is %.17g, want %.17g", what, bad, gb, wb);
    return 0;
}

/* As expect_tensor, dropping want (a fresh local result). */
static int expect_tensor_drop(sr_value *v, sr_tensor *want, const char *what)
{
    int rc = expect_tensor(v, want, what);
    sr_tensor_unref(want);
    return rc;
}

/* ---- functions the callee runs ------------------------------------------------------ */

/* [block offset, element offset] of the tensor the callee received. */
static int fn_where(sr_call *c)
{
    sr_tensor *t = sr_value_tensor(sr_call_arg(c, 0));
    if (!t)
        return sr_call_fail(c, -EINVAL, "where() takes a tensor");
    sr_value *items[] = {sr_int((int64_t)block_off(t)), sr_int(t->offset)};
    sr_value *l = sr_list(2, items);
    sr_value_unref(items[0]);
    sr_value_unref(items[1]);
    return sr_call_return(c, l);
}

/* Write -1 over the received tensor in place; return its sum afterwards. */
static int fn_scribble(sr_call *c)
{
    sr_tensor *t = sr_value_tensor(sr_call_arg(c, 0));
    if (!t || sr_fill_(t, -1.0))
        return sr_call_fail(c, -EINVAL, "scribble: %s", t ? sr_last_error() : "takes a tensor");
    sr_tensor *s = sr_sum(t);
    double total = s ? sr_tensor_item(s) : NAN;
    sr_tensor_unref(s);
    return sr_call_return(c, sr_double(total));
}

/* keep(t) holds on to t; kept() returns it; drop() lets it go. One caller per
 * callee (rank r - 1), but the executors may run them on any thread. */
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static sr_tensor *kept;

static int fn_keep(sr_call *c)
{
    sr_tensor *t = sr_value_tensor(sr_call_arg(c, 0));
    if (!t)
        return sr_call_fail(c, -EINVAL, "keep() takes a tensor");
    pthread_mutex_lock(&kept_lock);
    sr_tensor_unref(kept);
    kept = sr_tensor_ref(t);
    pthread_mutex_unlock(&kept_lock);
    return sr_call_return(c, NULL);
}

static int fn_kept(sr_call *c)
{
    pthread_mutex_lock(&kept_lock);
    sr_value *v = kept ? sr_value_from_tensor(kept) : sr_none();
    pthread_mutex_unlock(&kept_lock);
    return sr_call_return(c, v);
}

static int fn_drop(sr_call *c)
{
    pthread_mutex_lock(&kept_lock);
    sr_tensor_unref(kept);
    kept = NULL;
    pthread_mutex_unlock(&kept_lock);
    return sr_call_return(c, NULL);
}

static int fn_exit_now(sr_call *c)
{
    (void)c;
    _exit(0); /* leaves without detaching: the caller sees a death */
}

static int fn_requires_grad(sr_call *c)
{
    sr_tensor *t = sr_value_tensor(sr_call_arg(c, 0));
    return sr_call_return(c, sr_bool(t && sr_tensor_requires_grad(t)));
}

/* Made in register_fns, before sr_init attaches the heap: a private block. */
static sr_tensor *made_before_init;

static void register_fns(void)
{
    sr_register("where", fn_where);
    sr_register("scribble", fn_scribble);
    sr_register("keep", fn_keep);
    sr_register("kept", fn_kept);
    sr_register("drop", fn_drop);
    sr_register("requires_grad", fn_requires_grad);
    sr_register("exit_now", fn_exit_now);
    made_before_init = sr_ones(SR_F32, 1, (int64_t[]){3}, 0);
}

/* The harness calls no teardown hook: every scenario drops it when done. */
static void drop_private(void)
{
    sr_tensor_unref(made_before_init);
    made_before_init = NULL;
}

/* ---- arithmetic ------------------------------------------------------------------- */

/* fn(a, b) on worker `to` equals local(a, b). */
static int remote_matches(int to, const char *fn, sr_value *a, sr_value *b, sr_tensor *local, const char *what)
{
    sr_value *v = NULL;
    int rc = b ? sr_rpc_sync(to, fn, SR_ARGS(a, b), 0, &v) : sr_rpc_sync(to, fn, SR_ARGS(a), 0, &v);
    if (rc) {
        sr_tensor_unref(local);
        WCHECK(0, "%s on worker %d failed: %s", what, to, sr_last_error());
    }
    rc = expect_tensor_drop(v, local, what);
    sr_value_unref(v);
    return rc;
}

static int sc_add(int rank, int world)
{
    drop_private();
    sr_tensor *a = counting(SR_F32, 2, (int64_t[]){2, 3}, rank), *b = counting(SR_F32, 1, (int64_t[]){3}, 10);
    sr_value *va = tv(sr_tensor_ref(a)), *vb = tv(sr_tensor_ref(b)), *two = sr_double(2), *three = sr_int(3);
    sr_tensor *neg_a = sr_neg(a);
    int to = (rank + 1) % world, rc = 0;
    for (int self = 0; self < 2 && !rc; self++) {
        int dst = self ? rank : to;
        rc = remote_matches(dst, "add", va, vb, sr_add(a, b), self ? "add to self" : "add (broadcast)") ||
             remote_matches(dst, "sub", va, vb, sr_sub(a, b), "sub") ||
             remote_matches(dst, "mul", va, two, sr_mul_scalar(a, 2), "tensor * scalar") ||
             remote_matches(dst, "sub", three, va, sr_add_scalar(neg_a, 3), "scalar - tensor") ||
             remote_matches(dst, "div", va, vb, sr_div(a, b), "div") ||
             remote_matches(dst, "neg", va, NULL, sr_neg(a), "neg");
    }
    sr_value *args[] = {va, vb, two, three};
    for (int i = 0; i < 4; i++)
        sr_value_unref(args[i]);
    sr_tensor_unref(neg_a);
    sr_tensor_unref(a);
    sr_tensor_unref(b);
    return rc;
}

Test(rpc_tensor, add_of_two_tensors_to_another_worker_and_to_self, .timeout = 120)
{
    RUN_JOB("tadd", WORLD, .scenario = sc_add, .register_fns = register_fns);
}

/* ---- zero-copy ----------------------------------------------------------------------- */

/* `to` shares our heap: our tensors reach it by reference. Across hosts
 * (under mpirun, SHMRPC_HOSTS) they reach it as copies of the same values. */
static bool shares_heap(int to) { return sr__rpc_shares_heap(to); }

static int expect_where(int to, sr_value *v, const sr_tensor *t, const char *what)
{
    if (!shares_heap(to)) { /* a copy: the same values come back */
        sr_value *back = NULL;
        WCHECK(sr_rpc_sync(to, "echo", SR_ARGS(v), 0, &back) == 0, "%s: %s", what, sr_last_error());
        int rc = expect_tensor(back, t, what);
        sr_value_unref(back);
        return rc;
    }
    sr_value *w = NULL;
    WCHECK(sr_rpc_sync(to, "where", SR_ARGS(v), 0, &w) == 0, "%s: %s", what, sr_last_error());
    int64_t blk = sr_value_int(sr_value_list_at(w, 0)), off = sr_value_int(sr_value_list_at(w, 1));
    sr_value_unref(w);
    WCHECK((uint64_t)blk == block_off(t) && off == t->offset,
           "%s: the callee sees block %lld element %lld, the caller sent block %llu element %lld (a copy)", what,
           (long long)blk, (long long)off, (unsigned long long)block_off(t), (long long)t->offset);
    return 0;
}

static int sc_zero_copy(int rank, int world)
{
    drop_private();
    int to = (rank + 1) % world;
    sr_tensor *a = counting(SR_F64, 2, (int64_t[]){4, 5}, 0), *view = sr_narrow(a, 1, 2, 3);
    sr_value *va = tv(sr_tensor_ref(a)), *vv = tv(sr_tensor_ref(view)), *back = NULL;
    if (expect_where(to, va, a, "tensor to a peer") || expect_where(rank, va, a, "tensor to self") ||
        expect_where(to, vv, view, "narrowed view to a peer"))
        return 1;
    /* echo hands the callee's tensor back: the caller gets its own bytes. */
    WCHECK(sr_rpc_sync(to, "echo", SR_ARGS(va), 0, &back) == 0, "echo: %s", sr_last_error());
    sr_tensor *b = sr_value_tensor(back);
    bool local = shares_heap(to);
    WCHECK(b && (local ? sr_tensor_data(b) == sr_tensor_data(a) && block_off(b) == block_off(a)
                       : !memcmp(sr_tensor_data(b), sr_tensor_data(a), 20 * sizeof(double))),
           "echo returned other bytes than it was sent");
    sr_value_unref(back);
    /* A view computed remotely (t) still views the caller's block (across
     * hosts: a view of the storage that came back with it). */
    WCHECK(sr_rpc_sync(to, "t", SR_ARGS(va), 0, &back) == 0, "t: %s", sr_last_error());
    b = sr_value_tensor(back);
    WCHECK(b && (!local || block_off(b) == block_off(a)) && sr_tensor_strides(b)[0] == 1 &&
               sr_tensor_shape(b)[0] == 5,
           "t() through RPC did not come back as a view of the sent block");
    sr_value_unref(back);
    sr_value_unref(va);
    sr_value_unref(vv);
    sr_tensor_unref(view);
    sr_tensor_unref(a);
    return 0;
}

Test(rpc_tensor, callee_sees_the_callers_bytes_not_a_copy, .timeout = 120)
{
    RUN_JOB("tzero", WORLD, .scenario = sc_zero_copy, .register_fns = register_fns);
}

/* ---- copy-on-write -------------------------------------------------------------------- */

/* The callee's in-place write never reaches the caller's tensor. */
static int scribble_leaves_mine_alone(int dst, sr_tensor *a, sr_value *va, const char *what)
{
    sr_tensor *before = sr_clone(a);
    const void *data = sr_tensor_data(a);
    sr_value *v = NULL;
    WCHECK(sr_rpc_sync(dst, "scribble", SR_ARGS(va), 0, &v) == 0, "%s: %s", what, sr_last_error());
    double total = sr_value_double(v);
    sr_value_unref(v);
    WCHECK(total == -(double)sr_tensor_numel(a), "%s: the callee's write did not happen (sum %g)", what, total);
    WCHECK(sr_tensor_data(a) == data, "%s: the caller's tensor moved", what);
    int rc = expect_tensor(va, before, what);
    sr_tensor_unref(before);
    return rc;
}

static int sc_cow(int rank, int world)
{
    drop_private();
    int to = (rank + 1) % world;
    sr_tensor *a = counting(SR_F32, 1, (int64_t[]){6}, 100 * rank);
    sr_value *va = tv(sr_tensor_ref(a)), *v = NULL;
    if (scribble_leaves_mine_alone(to, a, va, "callee writes (peer)") ||
        scribble_leaves_mine_alone(rank, a, va, "callee writes (self)"))
        return 1;

    /* The peer keeps the tensor; the caller's later write is not seen there. */
    sr_tensor *sent = sr_clone(a);
    WCHECK(sr_rpc_sync(to, "keep", SR_ARGS(va), 0, NULL) == 0, "keep: %s", sr_last_error());
    WCHECK(sr_fill_(a, 42.0) == 0, "fill: %s", sr_last_error());
    WCHECK(sr_rpc_sync(to, "kept", SR_NOARGS, 0, &v) == 0, "kept: %s", sr_last_error());
    int rc = expect_tensor(v, sent, "the kept tensor after the caller's write");
    sr_value_unref(v);
    sr_tensor *fortytwo = sr_full(SR_F32, 1, (int64_t[]){6}, 42.0, 0);
    if (!rc)
        rc = expect_tensor(va, fortytwo, "the caller's own write");
    WCHECK(sr_rpc_sync(to, "drop", SR_NOARGS, 0, NULL) == 0, "drop: %s", sr_last_error());
    sr_tensor_unref(fortytwo);
    sr_tensor_unref(sent);
    sr_value_unref(va);
    sr_tensor_unref(a);
    return rc;
}

Test(rpc_tensor, copy_on_write_isolates_caller_and_callee, .timeout = 120)
{
    RUN_JOB("tcow", WORLD, .scenario = sc_cow, .register_fns = register_fns);
}

/* ---- large tensors ----------------------------------------------------------------------- */

/* 2^24 f32 elements: 64 MiB, and every value of arange + 1 is exact. */
#define BIG (INT64_C(1) << 24)

static int sc_large(int rank, int world)
{
    drop_private();
    if (rank != 0)
        return 0;
    (void)world;
    sr_tensor *a = sr_arange(SR_F32, 0, (double)BIG, 1, 0), *one = sr_ones(SR_F32, 1, (int64_t[]){BIG}, 0);
    WCHECK(a && one, "64 MiB tensors: %s", sr_last_error());
    sr_value *va = tv(sr_tensor_ref(a)), *vo = tv(one), *v = NULL;
    WCHECK(sr_rpc_sync(1, "add", SR_ARGS(va, vo), 0, &v) == 0, "add of 64 MiB tensors: %s", sr_last_error());
    sr_tensor *r = sr_value_tensor(v);
    WCHECK(r && sr_tensor_numel(r) == (size_t)BIG && sr_tensor_dtype(r) == SR_F32, "64 MiB add: wrong result");
    const float *p = sr_tensor_data(r);
    int64_t bad = -1;
    for (int64_t i = 0; i < BIG && bad < 0; i++)
        if (p[i] != (float)(i + 1))
            bad = i;
    WCHECK(bad < 0, "64 MiB add: element %lld is %g", (long long)bad, bad < 0 ? 0.0 : (double)p[bad]);
    sr_value_unref(v);
    if (expect_where(1, va, a, "64 MiB tensor"))
        return 1;
    sr_value_unref(va);
    sr_value_unref(vo);
    sr_tensor_unref(a);
    return 0;
}

Test(rpc_tensor, sixty_four_mib_tensors, .timeout = 240)
{
    RUN_JOB("tlarge", WORLD, .scenario = sc_large, .register_fns = register_fns, .shm_size = WORLD * 512 * MiB);
}

/* ---- errors -------------------------------------------------------------------------------- */

static int sc_errors(int rank, int world)
{
    sr_tensor *p = made_before_init;
    made_before_init = NULL;
    if (rank != 0) {
        sr_tensor_unref(p);
        return 0;
    }
    (void)world;
    sr_value *a = tv(sr_ones(SR_F32, 2, (int64_t[]){2, 3}, 0)), *b = tv(sr_ones(SR_F32, 1, (int64_t[]){4}, 0));
    sr_value *d = tv(sr_ones(SR_F64, 2, (int64_t[]){2, 3}, 0)), *i = tv(sr_ones(SR_I64, 1, (int64_t[]){2}, 0));
    sr_value *s = sr_str("x"), *n = sr_int(2), *v = NULL, *priv = tv(p);
    WEXPECT_ERR(sr_rpc_sync(1, "add", SR_ARGS(a, b), 0, &v), -SR_EREMOTE,
                "Error on Node 1: in 'add': sr_add: shapes [2, 3] and [4] cannot be broadcast");
    WEXPECT_ERR(sr_rpc_sync(1, "mul", SR_ARGS(a, d), 0, &v), -SR_EREMOTE,
                "Error on Node 1: in 'mul': sr_mul: dtypes f32 and f64 do not match");
    WEXPECT_ERR(sr_rpc_sync(1, "matmul", SR_ARGS(a, a), 0, &v), -SR_EREMOTE,
                "Error on Node 1: in 'matmul': sr_matmul: shapes [2, 3] and [2, 3] cannot be multiplied");
    WEXPECT_ERR(sr_rpc_sync(0, "exp", SR_ARGS(i), 0, &v), -SR_EREMOTE, "Error on Node 0: in 'exp': sr_exp:");
    WEXPECT_ERR(sr_rpc_sync(1, "add", SR_ARGS(a, s), 0, &v), -SR_EREMOTE,
                "Error on Node 1: in 'add': add() argument 2 must be a number or a tensor, not str");
    WEXPECT_ERR(sr_rpc_sync(1, "matmul", SR_ARGS(a, n), 0, &v), -SR_EREMOTE,
                "matmul() argument 2 must be a tensor, not int");
    WEXPECT_ERR(sr_rpc_sync(1, "exp", SR_ARGS(a, a), 0, &v), -SR_EREMOTE, "exp() expects 1 argument, got 2");
    WEXPECT_ERR(sr_rpc_sync(1, "sum", SR_ARGS(a, s), 0, &v), -SR_EREMOTE,
                "sum() argument 2 must be an int (a dim), not str");
    sr_value *five = sr_int(5);
    WEXPECT_ERR(sr_rpc_sync(1, "sum", SR_ARGS(a, five), 0, &v), -SR_EREMOTE,
                "Error on Node 1: in 'sum': sr_sum_dim: dimension 5 is out of range for a 2-d tensor");
    sr_value_unref(five);
    WEXPECT_ERR(sr_rpc_sync(1, "transpose", SR_ARGS(a, n), 0, &v), -SR_EREMOTE,
                "transpose() expects 3 arguments, got 2");
    WEXPECT_ERR(sr_rpc_sync(1, "reshape", SR_ARGS(a, s), 0, &v), -SR_EREMOTE,
                "reshape() shape entry 0 must be an int, not str");
    WEXPECT_ERR(sr_rpc_sync(1, "neg", SR_ARGS(s), 0, &v), -SR_EREMOTE,
                "neg() argument 1 must be a number or a tensor, not str");
    WEXPECT_ERR(sr_rpc_sync(1, "echo", SR_ARGS(priv), 0, &v), -EINVAL,
                "tensor f32[3] cannot be sent: its storage is a private block");
    sr_value *all[] = {a, b, d, i, s, n, priv};
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        sr_value_unref(all[k]);
    return 0;
}

Test(rpc_tensor, builtin_errors_and_wrong_kinds_reach_the_caller, .timeout = 120)
{
    RUN_JOB("terr", WORLD, .scenario = sc_errors, .register_fns = register_fns);
}

/* ---- tensor built-ins against local ops ------------------------------------------------------- */

static int sc_builtins(int rank, int world)
{
    drop_private();
    int to = (rank + 1) % world;
    sr_manual_seed(1000 + (uint64_t)rank);
    sr_tensor *x = sr_randn(SR_F64, 2, (int64_t[]){5, 7}, 0), *y = sr_randn(SR_F64, 2, (int64_t[]){7, 3}, 0);
    sr_tensor *bx = sr_randn(SR_F32, 3, (int64_t[]){2, 4, 6}, 0), *by = sr_randn(SR_F32, 3, (int64_t[]){2, 6, 3}, 0);
    sr_tensor *pos = sr_rand(SR_F64, 2, (int64_t[]){5, 7}, 0);
    WCHECK(x && y && bx && by && pos, "randn: %s", sr_last_error());
    sr_value *vx = tv(sr_tensor_ref(x)), *vy = tv(sr_tensor_ref(y)), *vbx = tv(sr_tensor_ref(bx));
    sr_value *vby = tv(sr_tensor_ref(by)), *vpos = tv(sr_tensor_ref(pos));
    sr_value *one = sr_int(1), *yes = sr_bool(true), *zero = sr_int(0), *shape = NULL;
    sr_value *dims[] = {sr_int(7), sr_int(-1)};
    shape = sr_list(2, dims);
    int rc = remote_matches(to, "matmul", vx, vy, sr_matmul(x, y), "matmul") ||
             remote_matches(to, "mm", vx, vy, sr_mm(x, y), "mm") ||
             remote_matches(to, "bmm", vbx, vby, sr_bmm(bx, by), "bmm") ||
             remote_matches(to, "matmul", vbx, vby, sr_matmul(bx, by), "batched matmul") ||
             remote_matches(to, "sum", vx, NULL, sr_sum(x), "sum") ||
             remote_matches(to, "mean", vx, NULL, sr_mean(x), "mean") ||
             remote_matches(to, "sum", vx, one, sr_sum_dim(x, 1, false), "sum along dim 1") ||
             remote_matches(to, "exp", vx, NULL, sr_exp(x), "exp") ||
             remote_matches(to, "log", vpos, NULL, sr_log(pos), "log") ||
             remote_matches(to, "sqrt", vpos, NULL, sr_sqrt(pos), "sqrt") ||
             remote_matches(to, "sin", vx, NULL, sr_sin(x), "sin") ||
             remote_matches(to, "cos", vx, NULL, sr_cos(x), "cos") ||
             remote_matches(to, "tanh", vx, NULL, sr_tanh(x), "tanh") ||
             remote_matches(to, "relu", vx, NULL, sr_relu(x), "relu") ||
             remote_matches(to, "sigmoid", vx, NULL, sr_sigmoid(x), "sigmoid") ||
             remote_matches(to, "pow", vpos, vx, sr_pow(pos, x), "pow") ||
             remote_matches(to, "t", vx, NULL, sr_t(x), "t") ||
             remote_matches(to, "reshape", vx, shape, sr_reshape(x, 2, (int64_t[]){7, -1}), "reshape");
    if (!rc) {
        sr_value *v = NULL;
        WCHECK(sr_rpc_sync(to, "sum", SR_ARGS(vx, zero, yes), 0, &v) == 0, "sum keepdim: %s", sr_last_error());
        rc = expect_tensor_drop(v, sr_sum_dim(x, 0, true), "sum along dim 0, keepdim");
        sr_value_unref(v);
        WCHECK(sr_rpc_sync(to, "transpose", SR_ARGS(vbx, zero, one), 0, &v) == 0, "%s", sr_last_error());
        rc |= expect_tensor_drop(v, sr_transpose(bx, 0, 1), "transpose 0 1");
        sr_value_unref(v);
    }
    sr_value *all[] = {vx, vy, vbx, vby, vpos, one, yes, zero, shape, dims[0], dims[1]};
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        sr_value_unref(all[k]);
    sr_tensor *ts[] = {x, y, bx, by, pos};
    for (size_t k = 0; k < 5; k++)
        sr_tensor_unref(ts[k]);
    return rc;
}

Test(rpc_tensor, builtins_match_the_local_ops, .timeout = 120)
{
    RUN_JOB("tbuiltin", WORLD, .scenario = sc_builtins, .register_fns = register_fns);
}

static int sc_grad_flag(int rank, int world)
{
    drop_private();
    sr_tensor *w = sr_ones(SR_F32, 1, (int64_t[]){3}, SR_REQUIRES_GRAD), *c = sr_ones(SR_F32, 1, (int64_t[]){3}, 0);
    sr_value *vw = tv(w), *vc = tv(c), *v = NULL;
    int to = (rank + 1) % world;
    WCHECK(sr_rpc_sync(to, "requires_grad", SR_ARGS(vw), 0, &v) == 0 && sr_value_bool(v),
           "requires_grad did not travel: %s", sr_last_error());
    sr_value_unref(v);
    WCHECK(sr_rpc_sync(to, "requires_grad", SR_ARGS(vc), 0, &v) == 0 && !sr_value_bool(v),
           "a plain tensor arrived requiring grad");
    sr_value_unref(v);
    /* Two descriptors in one message: a list of the same tensor twice. */
    sr_value *pair[] = {vc, vc};
    sr_value *l = sr_list(2, pair);
    WCHECK(sr_rpc_sync(to, "echo", SR_ARGS(l), 0, &v) == 0, "echo list: %s", sr_last_error());
    WCHECK(sr_value_equal(v, l), "a list of tensors came back different");
    sr_value_unref(v);
    sr_value_unref(l);
    sr_value_unref(vw);
    sr_value_unref(vc);
    return 0;
}

Test(rpc_tensor, requires_grad_and_lists_of_tensors_travel, .timeout = 120)
{
    RUN_JOB("tgrad", WORLD, .scenario = sc_grad_flag, .register_fns = register_fns);
}

/* A request that cannot be sent gives back the block references its
 * descriptors took: the tensor's block is again ours alone. */
static int dead_peer_worker(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    register_fns();
    drop_private();
    WCHECK(sr_init(NULL) == 0, "init: %s", sr_last_error());
    if (rank == 1) { /* serve until exit_now ends the process */
        sr_shutdown(true, 60);
        return 1;
    }
    WEXPECT_ERR(sr_rpc_sync(1, "exit_now", SR_NOARGS, 30, NULL), -EPIPE, "the worker exited with status 0");
    sr_tensor *t = sr_ones(SR_F32, 1, (int64_t[]){1000}, 0);
    sr_value *v = tv(sr_tensor_ref(t));
    WEXPECT_ERR(sr_rpc_sync(1, "echo", SR_ARGS(v, v), 30, NULL), -EPIPE,
                "sr_rpc_sync: destination rank 1 is gone: worker1 exited with status 0");
    WCHECK(sr__block_refcount(t->storage->block) == 1, "the unsent request still holds %u references",
           sr__block_refcount(t->storage->block) - 1);
    sr_value_unref(v);
    sr_tensor_unref(t);
    sr_shutdown(false, 0);
    return 0;
}

Test(rpc_tensor, unsent_request_gives_its_tensor_references_back, .timeout = 60)
{
    sr_spawn_opts o = {.name_prefix = test_ns("tdead"), .shm_size = 128 << 20};
    cr_assert_eq(sr_spawn(2, dead_peer_worker, NULL, &o), 0, "%s", sr_last_error());
}
