/* SPDX-License-Identifier: MIT */
/* Distributed autograd: the seed-002 step and a 4-worker chain, checked
 * against the same computation done with local autograd. The full port of
 * PyTorch's dist_autograd_test.py is in test_dist_autograd*.c. */
#include <math.h>
#include <pthread.h>
#include <sched.h>

#include "rpc_harness.h"
#include "shmrpc/autograd_function.h"
#include "shmrpc/dist_autograd.h"
#include "shmrpc/tensor.h"
#include "waiter.h" /* sr__now_ns */

#define EVENT_WAIT_S 60
#include "shared_event.h"

LEAK_CHECKED_SUITE(dist_autograd_core);

static sr_tensor *vec(const double *v, int n, bool grad)
{
    int64_t shape[1] = {n};
    return sr_from_data(SR_F64, 1, shape, v, grad ? SR_REQUIRES_GRAD : 0);
}

static bool close_to(sr_tensor *t, const double *want, int n)
{
    double got[16];
    if (!t || sr_tensor_to_f64(t, got, (size_t)n))
        return false;
    for (int i = 0; i < n; i++)
        if (fabs(got[i] - want[i]) > 1e-12)
            return false;
    return true;
}

/* Called just before each backward (a test of this file sets it). */
static void (*before_backward)(void);

/* loss = sum((t1 + t2 on worker1) * t1): dt1 = 2 t1 + t2, dt2 = t1. */
static int seed_step(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    const double a[3] = {1, 2, 3}, b[3] = {0.5, -1, 4};
    for (int round = 0; round < 3; round++) {
        int64_t ctx;
        WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "begin: %s", sr_last_error());
        sr_tensor *t1 = vec(a, 3, true), *t2 = vec(b, 3, true);
        sr_value *args[2] = {sr_value_from_tensor(t1), sr_value_from_tensor(t2)}, *out = NULL;
        WCHECK(sr_rpc_sync(1, "add", SR_ARGS(args[0], args[1]), 0, &out) == 0, "rpc: %s", sr_last_error());
        sr_tensor *t3 = sr_value_tensor(out);
        WCHECK(t3 && !strcmp(sr_tensor_grad_fn_name(t3), "RecvRpcBackward"), "t3's grad_fn is %s",
               t3 ? sr_tensor_grad_fn_name(t3) : "none");
        sr_tensor *t4 = sr_mul(t3, t1), *loss = sr_sum(t4);
        if (before_backward)
            before_backward();
        WCHECK(sr_dist_autograd_backward(ctx, &loss, 1, false) == 0, "backward: %s", sr_last_error());
        sr_tensor *g1 = NULL, *g2 = NULL;
        WCHECK(sr_dist_autograd_get_gradient(ctx, t1, &g1) == 0, "grad t1: %s", sr_last_error());
        WCHECK(sr_dist_autograd_get_gradient(ctx, t2, &g2) == 0, "grad t2: %s", sr_last_error());
        const double w1[3] = {2 * a[0] + b[0], 2 * a[1] + b[1], 2 * a[2] + b[2]};
        WCHECK(close_to(g1, w1, 3) && close_to(g2, a, 3), "wrong gradients");
        WCHECK(!sr_tensor_grad(t1) && !sr_tensor_grad(t2), ".grad was written");
        size_t n;
        WCHECK(sr_dist_autograd_known_workers(ctx, NULL, 0, &n) == 0 && n == 1, "known workers %zu", n);
        WCHECK(sr_dist_autograd_context_end(ctx) == 0, "end: %s", sr_last_error());
        sr_tensor_unref(g1);
        sr_tensor_unref(g2);
        sr_tensor_unref(t4);
        sr_tensor_unref(loss);
        sr_value_unref(out);
        sr_value_unref(args[0]);
        sr_value_unref(args[1]);
        sr_tensor_unref(t1);
        sr_tensor_unref(t2);
    }
    return 0;
}

Test(dist_autograd_core, seed_step, .timeout = 120)
{
    RUN_JOB("dacore", 2, .scenario = seed_step, .shutdown_timeout = 30);
}

/* chain(x, w, k), called on worker k: x * w, then on to worker k + 1, the last
 * worker returning. */
static int chain(sr_call *c)
{
    sr_tensor *x = sr_value_tensor(sr_call_arg(c, 0)), *w = sr_value_tensor(sr_call_arg(c, 1));
    int64_t next = sr_value_int(sr_call_arg(c, 2)) + 1;
    sr_tensor *y = sr_mul(x, w);
    if (!y)
        return -EINVAL;
    if (next >= sr_world_size()) {
        sr_value *v = sr_value_from_tensor(y);
        sr_tensor_unref(y);
        return sr_call_return(c, v);
    }
    sr_value *args[3] = {sr_value_from_tensor(y), sr_call_arg(c, 1), sr_int(next)}, *out = NULL;
    int rc = sr_rpc_sync((int)next, "chain", SR_ARGS(args[0], args[1], args[2]), 0, &out);
    sr_value_unref(args[0]);
    sr_value_unref(args[2]);
    sr_tensor_unref(y);
    return rc ? rc : sr_call_return(c, out);
}

static void register_chain(void) { sr_register("chain", chain); }

/* loss = sum(x * w^3), one multiplication on each of workers 1, 2, 3:
 * dx = w^3, dw = 3 x w^2. */
static int chain_step(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    const double xv[2] = {1.5, -2}, wv[2] = {0.5, 3};
    int64_t ctx;
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "begin: %s", sr_last_error());
    sr_tensor *x = vec(xv, 2, true), *w = vec(wv, 2, true);
    sr_value *args[3] = {sr_value_from_tensor(x), sr_value_from_tensor(w), sr_int(1)}, *out = NULL;
    WCHECK(sr_rpc_sync(1, "chain", SR_ARGS(args[0], args[1], args[2]), 0, &out) == 0, "rpc: %s", sr_last_error());
    sr_tensor *loss = sr_sum(sr_value_tensor(out));
    WCHECK(sr_dist_autograd_backward(ctx, &loss, 1, false) == 0, "backward: %s", sr_last_error());
    sr_tensor *gx = NULL, *gw = NULL;
    WCHECK(sr_dist_autograd_get_gradient(ctx, x, &gx) == 0 && sr_dist_autograd_get_gradient(ctx, w, &gw) == 0,
           "grads: %s", sr_last_error());
    double wx[2], ww[2];
    for (int i = 0; i < 2; i++) {
        wx[i] = pow(wv[i], 3);
        ww[i] = 3 * xv[i] * pow(wv[i], 2);
    }
    WCHECK(close_to(gx, wx, 2) && close_to(gw, ww, 2), "wrong chain gradients");
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "end: %s", sr_last_error());
    sr_tensor_unref(gx);
    sr_tensor_unref(gw);
    sr_tensor_unref(loss);
    sr_value_unref(out);
    for (int i = 0; i < 3; i++)
        sr_value_unref(args[i]);
    sr_tensor_unref(x);
    sr_tensor_unref(w);
    return 0;
}

Test(dist_autograd_core, chain_of_four, .timeout = 120)
{
    RUN_JOB("dachain", 4, .scenario = chain_step, .register_fns = register_chain, .shutdown_timeout = 30);
}

/* Regression: the root's own PROPAGATE comes back to the root (a gradient
 * for the root's send function) and is served before the root starts to
 * wait. A served request must never wait for the root's RPC (whose answer
 * waits for it): it used to take every RPC outstanding in the context, and
 * the job then never reached quiescence. The hook holds the root between
 * its run and its wait until the request coming back has been served. */
extern _Atomic uint64_t sr__dist_propagates_served;
extern void (*sr__dist_root_hook)(void);

/* The served count when this worker's backward began: the root's pass
 * brings exactly one gradient request back here (for t1 and t2). */
static uint64_t served_at_start;

static void wait_for_served_propagate(void)
{
    int64_t deadline = sr__now_ns() + 10 * INT64_C(1000000000);
    while (atomic_load_explicit(&sr__dist_propagates_served, memory_order_acquire) == served_at_start &&
           sr__now_ns() < deadline)
        sched_yield(); /* an event (the counter moves), bounded by the deadline */
}

static void note_served(void)
{
    served_at_start = atomic_load_explicit(&sr__dist_propagates_served, memory_order_acquire);
}

static int propagate_served_before_root_waits(int rank, int world)
{
    if (rank == 0) {
        sr__dist_root_hook = wait_for_served_propagate;
        before_backward = note_served;
    }
    return seed_step(rank, world);
}

Test(dist_autograd_core, root_waits_only_for_its_own_rpcs, .timeout = 120)
{
    RUN_JOB("daroot", 2, .scenario = propagate_served_before_root_waits, .shutdown_timeout = 30);
}

/* A worker that is idle but for the gradients it owes the worker that
 * engaged it sends them with the answer that ends its part of the pass
 * (backward.c, "Up"): one message instead of a request, its answer and that
 * answer. In the seed step, worker 1's run owes the root the gradients of
 * t1 and t2: each of the three passes brings them to the root that way. */
extern _Atomic uint64_t sr__dist_gradients_carried;

static int gradients_ride_the_answer(int rank, int world)
{
    uint64_t before = atomic_load_explicit(&sr__dist_gradients_carried, memory_order_relaxed);
    int rc = seed_step(rank, world);
    uint64_t carried = atomic_load_explicit(&sr__dist_gradients_carried, memory_order_relaxed) - before;
    WCHECK(rc || rank != 0 || carried == 3,
           "worker0: %llu of the 3 passes' gradients from worker1 came with its answer (the others came as requests "
           "of their own)", (unsigned long long)carried);
    return rc;
}

Test(dist_autograd_core, an_idle_worker_sends_its_gradients_with_its_answer, .timeout = 120)
{
    RUN_JOB("daup", 2, .scenario = gradients_ride_the_answer, .shutdown_timeout = 30);
}

/* More gradient requests in one run than calls can be in flight at once
 * (65,536 per worker): the root's run reaches FAN_OUT RecvRpcBackward
 * nodes, whose requests must be paced, not refused with -EBUSY.
 * loss = sum_i add(x, x) computed on worker 1: dx = 2 FAN_OUT, exact. The
 * forward goes in batches of async calls, so that it stays short when the
 * reordering mode delays every message. */
enum { FAN_OUT = 70000, BATCH = 1000 };

/* *loss += the results of n calls add(x, x) to worker 1, made at once. */
static int add_batch(sr_tensor **loss, sr_value *xv, int n)
{
    sr_future *f[BATCH];
    for (int i = 0; i < n; i++)
        WCHECK(sr_rpc_async(1, "add", SR_ARGS(xv, xv), 0, &f[i]) == 0, "rpc_async: %s", sr_last_error());
    for (int i = 0; i < n; i++) {
        sr_value *out = NULL;
        int rc = sr_future_wait(f[i], &out);
        sr_tensor *y = rc ? NULL : sr_value_tensor(out), *sum = !y ? NULL : *loss ? sr_add(*loss, y) : sr_sum(y);
        WCHECK(sum, "call %d of a batch: %s", i, sr_last_error());
        sr_tensor_unref(*loss);
        sr_value_unref(out);
        sr_future_unref(f[i]);
        *loss = sum;
    }
    return 0;
}

static int many_rpcs_step(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    int64_t ctx;
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "begin: %s", sr_last_error());
    const double one = 1;
    sr_tensor *x = vec(&one, 1, true), *loss = NULL;
    sr_value *xv = sr_value_from_tensor(x);
    for (int i = 0; i < FAN_OUT; i += BATCH)
        if (add_batch(&loss, xv, FAN_OUT - i < BATCH ? FAN_OUT - i : BATCH))
            return 1;
    size_t nsend = 0;
    WCHECK(sr_dist_autograd_functions(ctx, true, NULL, 0, &nsend) == 0 && nsend == FAN_OUT,
           "%zu send functions recorded, want %d: %s", nsend, FAN_OUT, sr_last_error());
    int rc = sr_dist_autograd_backward(ctx, &loss, 1, false);
    WCHECK(rc == 0, "backward over %d RPCs in one context: %d: %s", FAN_OUT, rc, sr_last_error());
    sr_tensor *gx = NULL;
    WCHECK(sr_dist_autograd_get_gradient(ctx, x, &gx) == 0, "grad: %s", sr_last_error());
    const double want = 2.0 * FAN_OUT;
    WCHECK(close_to(gx, &want, 1), "grad of x is %g, want %g", sr_tensor_item(gx), want);
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "end: %s", sr_last_error());
    sr_tensor_unref(gx);
    sr_tensor_unref(loss);
    sr_value_unref(xv);
    sr_tensor_unref(x);
    return 0;
}

/* Under the reordering mode (SHMRPC_REORDER_SEED): each message is delayed. */
static bool reordering_mode(void)
{
    const char *s = getenv("SHMRPC_REORDER_SEED");
    return s && *s;
}

Test(dist_autograd_core, more_gradient_requests_than_calls_in_flight, .timeout = 100)
{
#if defined(SR_TEST_MPI) && defined(__SANITIZE_ADDRESS__)
    cr_skip_test("70,000 calls across pretend hosts over TCP take over 100 s under ASan; the plain MPI build and "
                 "every shmrun build run it");
#endif
    if (reordering_mode()) /* the table's limit does not depend on the order of messages */
        cr_skip_test("the calls in flight are the test of the runs without reordering");
    RUN_JOB("dafan", 2, .scenario = many_rpcs_step, .shutdown_timeout = 180);
}

/* A chain of hops: x = add(x, 1) on worker 1, chain_len times, then loss =
 * sum(x * w) here; dx = w, exactly, and x ends at x0 + hops. Each hop's
 * gradient request used to be awaited by the run that sent it, so the pass
 * held one call per hop on each worker (a hop sends one gradient request
 * each way) until it ended, and failed once the call table (65,536 calls in
 * flight) was full. */
static int chain_len; /* set by the test before its job: the workers inherit it */

static int long_chain_step(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    const int hops = chain_len;
    const double x0[2] = {0.5, -3}, wv[2] = {2, -0.25}, onev[2] = {1, 1};
    int64_t ctx;
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "begin: %s", sr_last_error());
    sr_tensor *x = vec(x0, 2, true), *w = vec(wv, 2, false), *one = vec(onev, 2, false);
    sr_value *onevv = sr_value_from_tensor(one), *cur = sr_value_from_tensor(x);
    int64_t t0 = sr__now_ns();
    for (int i = 0; i < hops; i++) {
        sr_value *out = NULL;
        int rc = sr_rpc_sync(1, "add", SR_ARGS(cur, onevv), 0, &out);
        WCHECK(rc == 0, "hop %d of the chain: %d: %s", i, rc, sr_last_error());
        sr_value_unref(cur);
        cur = out;
    }
    int64_t t1 = sr__now_ns();
    sr_tensor *y = sr_value_tensor(cur), *yw = sr_mul(y, w), *loss = yw ? sr_sum(yw) : NULL;
    const double want_y[2] = {x0[0] + hops, x0[1] + hops};
    WCHECK(close_to(y, want_y, 2), "the chain's forward is wrong");
    WCHECK(loss, "loss: %s", sr_last_error());
    int rc = sr_dist_autograd_backward(ctx, &loss, 1, false);
    WCHECK(rc == 0, "backward through a chain of %d hops: %d: %s", hops, rc, sr_last_error());
    int64_t t2 = sr__now_ns();
    sr_tensor *gx = NULL;
    WCHECK(sr_dist_autograd_get_gradient(ctx, x, &gx) == 0, "grad: %s", sr_last_error());
    WCHECK(close_to(gx, wv, 2), "grad of x is wrong after %d hops", hops);
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "end: %s", sr_last_error());
    fprintf(stderr, "chain of %d hops: forward %.2f s, backward %.2f s\n", hops, (double)(t1 - t0) / 1e9,
            (double)(t2 - t1) / 1e9);
    sr_tensor_unref(gx);
    sr_tensor_unref(loss);
    sr_tensor_unref(yw);
    sr_value_unref(cur);
    sr_value_unref(onevv);
    sr_tensor_unref(one);
    sr_tensor_unref(w);
    sr_tensor_unref(x);
    return 0;
}

/* Far deeper than the call table: 200,000 hops in the plain build, 80,000
 * under ASan (not run under TSan), where a hop costs several times more (the old nested
 * answers held one call per hop on each worker, so more than 65,536 hops
 * filled the table). The depth is what this test is for, and it does not depend on
 * the order of messages or on the transport; the protocol under reordering
 * and across pretend hosts is the next test's, whose chain is short enough
 * for their delays (a hop is four messages in sequence, each delayed up to
 * 2 ms under reordering; 200,000 hops took 200 s under the MPI runner). */
Test(dist_autograd_core, chain_deeper_than_the_call_table, .timeout = 300)
{
#ifdef SR_TEST_MPI
    cr_skip_test("the depth is the shmrun configuration's to test: a chain this deep takes minutes over TCP");
#endif
#ifdef SR_TEST_TSAN
    cr_skip_test("the depth is the plain and ASan builds' to test: its threads do what the next test's do, "
                 "80,000 times over (about 80 s under ThreadSanitizer)");
#endif
    if (reordering_mode())
        cr_skip_test("the depth is the test of the runs without reordering; the next test reorders a chain");
    chain_len = 200000;
#if defined(__SANITIZE_ADDRESS__)
    chain_len = 80000;
#endif
    RUN_JOB("dalong", 2, .scenario = long_chain_step, .shutdown_timeout = 600); /* worker1 waits there for it all */
}

/* The same chain in every configuration: under reordering its requests and
 * answers overtake each other, across pretend hosts they go through MPI.
 * 2,000 hops where messages go straight through; 500 where each is delayed
 * (reordering: up to 2 ms each, four in sequence per hop) or crosses TCP
 * under a sanitizer: 2,000 reordered messages in a row exercise every order
 * the protocol can see, and the longer chain only cost 37 s per seed under
 * ASan. */
Test(dist_autograd_core, chain_of_hops_in_any_order_and_transport, .timeout = 200)
{
    chain_len = 2000;
#if defined(SR_TEST_MPI) && (defined(__SANITIZE_ADDRESS__) || defined(SR_TEST_TSAN))
    chain_len = 500;
#endif
    if (reordering_mode())
        chain_len = 500;
    RUN_JOB("dachain", 2, .scenario = long_chain_step, .shutdown_timeout = 180);
}

/* A user-defined autograd function (shmrpc/autograd_function.h), Cube(x) =
 * x^3 saving x, crossing RPC in both directions:
 *   on the caller: y = Cube(x) on worker 0, z = y * y on worker 1 (the
 *     builtin "mul"), loss = sum(z) back on worker 0: dx = 6 x^5, and the
 *     pass ran CubeBackward on worker 0 exactly once;
 *   on the callee: worker 1's "cube" applies it to the tensor it received
 *     (whose grad_fn is RecvRpcBackward) and returns y, loss = sum(y) on
 *     worker 0: dx = 3 x^2, which only worker 1's CubeBackward computes. */
static int cube_backwards; /* in this process */

static int cube_fwd(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout)
{
    (void)n;
    (void)nout;
    int rc = sr_function_ctx_save_for_backward(ctx, in, 1);
    out[0] = rc ? NULL : sr_pow_scalar(in[0], 3);
    return out[0] ? 0 : -EINVAL;
}

static int cube_bwd(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, sr_tensor **gin, size_t n)
{
    (void)nout;
    (void)n;
    sr_tensor *x;
    int rc = sr_function_ctx_saved(ctx, 0, &x);
    if (rc)
        return rc;
    cube_backwards++;
    sr_tensor *x2 = sr_pow_scalar(x, 2), *d = sr_mul_scalar(x2, 3);
    gin[0] = sr_mul(gout[0], d);
    sr_tensor_unref(x);
    sr_tensor_unref(x2);
    sr_tensor_unref(d);
    return gin[0] ? 0 : -EINVAL;
}

static const sr_autograd_function cube_fn = {"Cube", cube_fwd, cube_bwd, NULL};

static int cube_remote(sr_call *c)
{
    sr_tensor *x = sr_value_tensor(sr_call_arg(c, 0)), *y;
    if (!x || strcmp(sr_tensor_grad_fn_name(x) ? sr_tensor_grad_fn_name(x) : "", "RecvRpcBackward"))
        return -EINVAL; /* not a received tensor that requires grad */
    int rc = sr_function_apply(&cube_fn, &x, 1, &y, 1);
    if (rc)
        return rc;
    if (strcmp(sr_tensor_grad_fn_name(y), "CubeBackward")) {
        sr_tensor_unref(y);
        return -EINVAL;
    }
    sr_value *v = sr_value_from_tensor(y);
    sr_tensor_unref(y);
    return sr_call_return(c, v);
}

static void register_cube(void) { sr_register("cube", cube_remote); }

/* One distributed pass from sum(out of `fn` on worker 1 with args); dx
 * checked against want. */
static int cube_pass(sr_tensor *x, const char *fn, sr_value **args, size_t nargs, const double *want)
{
    int64_t ctx;
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "begin: %s", sr_last_error());
    sr_value *out = NULL;
    WCHECK(sr_rpc_sync(1, fn, (sr_args){nargs, args}, 0, &out) == 0, "rpc %s: %s", fn, sr_last_error());
    sr_tensor *loss = sr_sum(sr_value_tensor(out)), *gx = NULL;
    WCHECK(sr_dist_autograd_backward(ctx, &loss, 1, false) == 0, "backward: %s", sr_last_error());
    WCHECK(sr_dist_autograd_get_gradient(ctx, x, &gx) == 0, "grad x: %s", sr_last_error());
    WCHECK(close_to(gx, want, 2), "wrong gradient through %s", fn);
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "end: %s", sr_last_error());
    sr_tensor_unref(gx);
    sr_tensor_unref(loss);
    sr_value_unref(out);
    return 0;
}

static int custom_function_step(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    const double xv[2] = {1.5, -2};
    double d6[2], d3[2];
    for (int i = 0; i < 2; i++) {
        d6[i] = 6 * pow(xv[i], 5);
        d3[i] = 3 * pow(xv[i], 2);
    }
    sr_tensor *x = vec(xv, 2, true), *y;
    int64_t ctx;
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "begin: %s", sr_last_error());
    WCHECK(sr_function_apply(&cube_fn, &x, 1, &y, 1) == 0, "apply: %s", sr_last_error());
    WCHECK(!strcmp(sr_tensor_grad_fn_name(y), "CubeBackward"), "y's grad_fn is %s", sr_tensor_grad_fn_name(y));
    sr_value *yy[2] = {sr_value_from_tensor(y), sr_value_from_tensor(y)}, *out = NULL;
    WCHECK(sr_rpc_sync(1, "mul", SR_ARGS(yy[0], yy[1]), 0, &out) == 0, "rpc mul: %s", sr_last_error());
    sr_dist_fn_info send[2];
    size_t nsend;
    WCHECK(sr_dist_autograd_functions(ctx, true, send, 2, &nsend) == 0 && nsend == 1, "send functions: %zu",
           nsend);
    WCHECK(send[0].num_next == 2 && !strcmp(send[0].next_names[0], "CubeBackward") &&
               !strcmp(send[0].next_names[1], "CubeBackward"),
           "the send function's edges lead to %s", send[0].next_names[0] ? send[0].next_names[0] : "nothing");
    sr_tensor *loss = sr_sum(sr_value_tensor(out)), *gx = NULL;
    WCHECK(sr_dist_autograd_backward(ctx, &loss, 1, false) == 0, "backward: %s", sr_last_error());
    WCHECK(cube_backwards == 1, "CubeBackward ran %d times on worker 0", cube_backwards);
    WCHECK(sr_dist_autograd_get_gradient(ctx, x, &gx) == 0, "grad x: %s", sr_last_error());
    WCHECK(close_to(gx, d6, 2), "wrong gradient through Cube then mul");
    WCHECK(!sr_tensor_grad(x), ".grad was written");
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "end: %s", sr_last_error());
    sr_tensor_unref(gx);
    sr_tensor_unref(loss);
    sr_value_unref(out);
    sr_value_unref(yy[0]);
    sr_value_unref(yy[1]);
    sr_tensor_unref(y);

    sr_value *xa = sr_value_from_tensor(x);
    int rc = cube_pass(x, "cube", &xa, 1, d3);
    WCHECK(cube_backwards == 1, "CubeBackward ran on worker 0 for worker 1's Cube");
    sr_value_unref(xa);
    sr_tensor_unref(x);
    return rc;
}

Test(dist_autograd_core, custom_function_on_either_side_of_an_rpc, .timeout = 120)
{
    RUN_JOB("dacube", 2, .scenario = custom_function_step, .register_fns = register_cube, .shutdown_timeout = 30);
}

/* A pipeline's backward on one worker: while a gradient request of a pass
 * runs there, the requests of the same pass that arrive meanwhile join that
 * run's thread (the pass's runner, backward.c), which serves them one after
 * the other as soon as its run ends, instead of each taking an executor that
 * blocks on the engine's task lock until the run ends and is then woken in
 * turn (one thread hand-off per micro-batch and stage). Worker 0 makes
 * GATED calls to worker 1's "gated" (a custom function), so its backward
 * sends worker 1 GATED gradient requests at once. The first GatedBackward to
 * run holds its run until the other GATED - 1 requests have joined (bounded
 * wait), and every GatedBackward notes its thread: all must run on one.
 * Worker 1's main thread waits outside the runtime meanwhile, so it is not
 * the one that reads the requests (a waiter in sr_shutdown would keep them
 * all and run them itself anyway). */
enum { GATED = 8 };
extern _Atomic uint64_t sr__dist_propagates_joined;

static struct gated_state { /* worker 1's, in its own process */
    pthread_mutex_t mu;
    int calls;
    bool all_joined; /* the first run saw the others join */
    uint64_t joined_at_start;
    pthread_t threads[GATED];
} gst = {.mu = PTHREAD_MUTEX_INITIALIZER};
static _Atomic uint32_t *gated_done; /* shared: worker 0 is done with worker 1 */

static int gated_fwd(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout)
{
    (void)ctx, (void)n, (void)nout;
    out[0] = sr_clone(in[0]);
    return out[0] ? 0 : -ENOMEM;
}

static int gated_bwd(sr_function_ctx *ctx, sr_tensor *const *gout, size_t nout, sr_tensor **gin, size_t n)
{
    (void)ctx, (void)nout, (void)n;
    pthread_mutex_lock(&gst.mu);
    int call = gst.calls++;
    if (call < GATED)
        gst.threads[call] = pthread_self();
    uint64_t want = gst.joined_at_start + GATED - 1;
    pthread_mutex_unlock(&gst.mu);
    int64_t deadline = sr__now_ns() + 10 * INT64_C(1000000000);
    /* acquire: pairs with the release increment of a request that joined */
    while (call == 0 && atomic_load_explicit(&sr__dist_propagates_joined, memory_order_acquire) < want &&
           sr__now_ns() < deadline)
        sched_yield(); /* an event (the counter moves), bounded by the deadline */
    if (call == 0)
        gst.all_joined = atomic_load_explicit(&sr__dist_propagates_joined, memory_order_acquire) >= want;
    gin[0] = sr_tensor_ref(gout[0]);
    return 0;
}

static const sr_autograd_function gated_fn = {"Gated", gated_fwd, gated_bwd, NULL};

/* gated(x) -> Gated(x), recorded in the caller's context. */
static int gated(sr_call *c)
{
    sr_tensor *x = sr_value_tensor(sr_call_arg(c, 0)), *y = NULL;
    pthread_mutex_lock(&gst.mu); /* every forward comes before the backward */
    gst.joined_at_start = atomic_load_explicit(&sr__dist_propagates_joined, memory_order_acquire);
    pthread_mutex_unlock(&gst.mu);
    int rc = x ? sr_function_apply(&gated_fn, &x, 1, &y, 1) : -EINVAL;
    sr_value *v = rc ? NULL : sr_value_from_tensor(y);
    sr_tensor_unref(y);
    return v ? sr_call_return(c, v) : sr_call_fail(c, rc ? rc : -ENOMEM, "gated: %s", sr_last_error());
}

/* gated_report() -> [calls, all joined, threads that ran GatedBackward]. */
static int gated_report(sr_call *c)
{
    pthread_mutex_lock(&gst.mu);
    int distinct = 0;
    for (int i = 0; i < gst.calls && i < GATED; i++) {
        bool seen = false;
        for (int k = 0; k < i; k++)
            seen = seen || pthread_equal(gst.threads[k], gst.threads[i]);
        distinct += !seen;
    }
    sr_value *v[3] = {sr_int(gst.calls), sr_bool(gst.all_joined), sr_int(distinct)};
    pthread_mutex_unlock(&gst.mu);
    sr_value *list = sr_list(3, v);
    for (int i = 0; i < 3; i++)
        sr_value_unref(v[i]);
    return sr_call_return(c, list);
}

static void register_gated(void)
{
    sr_register("gated", gated);
    sr_register("gated_report", gated_report);
}

static int gated_calls(void)
{
    const double xv[2] = {1, -2}, want[2] = {GATED, GATED};
    int64_t ctx;
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "begin: %s", sr_last_error());
    sr_tensor *x = vec(xv, 2, true), *loss = NULL;
    sr_value *xa = sr_value_from_tensor(x);
    sr_future *f[GATED];
    for (int i = 0; i < GATED; i++)
        WCHECK(sr_rpc_async(1, "gated", SR_ARGS(xa), 0, &f[i]) == 0, "rpc_async: %s", sr_last_error());
    for (int i = 0; i < GATED; i++) {
        sr_value *out = NULL;
        int rc = sr_future_wait(f[i], &out);
        sr_tensor *s = rc ? NULL : sr_sum(sr_value_tensor(out)), *sum = s && loss ? sr_add(loss, s) : s;
        WCHECK(sum, "gated call %d: %s", i, sr_last_error());
        if (sum != s)
            sr_tensor_unref(s);
        sr_tensor_unref(loss);
        loss = sum;
        sr_value_unref(out);
        sr_future_unref(f[i]);
    }
    WCHECK(sr_dist_autograd_backward(ctx, &loss, 1, false) == 0, "backward: %s", sr_last_error());
    sr_tensor *gx = NULL;
    WCHECK(sr_dist_autograd_get_gradient(ctx, x, &gx) == 0, "grad: %s", sr_last_error());
    WCHECK(close_to(gx, want, 2), "wrong gradient through %d gated calls", GATED);
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "end: %s", sr_last_error());
    sr_tensor_unref(gx);
    sr_tensor_unref(loss);
    sr_value_unref(xa);
    sr_tensor_unref(x);
    return 0;
}

static int requests_join_step(int rank, int world)
{
    (void)world;
    if (rank == 1) { /* wait outside the runtime until worker 0 is done: the progress thread reads the requests */
        WCHECK(wait_for(gated_done, 1), "worker 0 never finished its gated calls");
        return 0;
    }
    int rc = gated_calls();
    sr_value *r = NULL;
    if (!rc)
        WCHECK(sr_rpc_sync(1, "gated_report", SR_NOARGS, 0, &r) == 0, "gated_report: %s", sr_last_error());
    set_and_wake(gated_done, 1);
    if (rc)
        return rc;
    int64_t calls = sr_value_int(sr_value_list_at(r, 0)), threads = sr_value_int(sr_value_list_at(r, 2));
    bool joined = sr_value_bool(sr_value_list_at(r, 1));
    sr_value_unref(r);
    WCHECK(calls == GATED, "GatedBackward ran %lld times on worker 1, want %d", (long long)calls, GATED);
    WCHECK(joined, "the other %d gradient requests did not join the run in progress within 10 s", GATED - 1);
    WCHECK(threads == 1, "the %d gradient requests of one pass ran on %lld threads of worker 1, want 1 (its runner)",
           GATED, (long long)threads);
    return 0;
}

Test(dist_autograd_core, requests_of_a_running_pass_join_its_runner, .timeout = 120)
{
    gated_done = shared_page(4096);
    RUN_JOB("dajoin", 2, .scenario = requests_join_step, .register_fns = register_gated, .shutdown_timeout = 30);
}
