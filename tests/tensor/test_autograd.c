/* SPDX-License-Identifier: MIT */
/* The local autograd engine: accumulation, retain_graph, hooks, grad mode,
 * PyTorch's error texts, and the extension points distributed autograd uses
 * (pluggable nodes, gradient sinks, extra roots fed later). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "autograd/engine.h"
#include "tensor_util.h"
#include "common.h"

LEAK_CHECKED_SUITE(autograd);
LEAK_CHECKED_SUITE(engine);

static void unref_all(sr_tensor **ts, int n)
{
    for (int i = 0; i < n; i++)
        sr_tensor_unref(ts[i]);
}

struct hook_log {
    int calls;
    double first;
    double scale; /* replace the gradient by grad * scale when != 0 */
    int fail;     /* return this error */
};

static int log_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    struct hook_log *h = arg;
    double v[16];
    sr_tensor_to_f64(grad, v, 16);
    if (h->calls++ == 0)
        h->first = v[0];
    if (h->fail)
        return h->fail;
    if (h->scale != 0)
        *replace = sr_mul_scalar(grad, h->scale);
    return 0;
}

Test(autograd, leaf_used_twice_accumulates_and_passes_add_up)
{
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(3), VALS(1, 2, 3), SR_REQUIRES_GRAD);
    sr_tensor *sq = sr_mul(x, x), *y = sr_add(sq, x), *loss = sr_sum(y);
    cr_assert_str_eq(sr_tensor_grad_fn_name(sq), "MulBackward0");
    cr_assert_null(sr_tensor_grad_fn_name(x));
    cr_assert(sr_tensor_is_leaf(x) && !sr_tensor_is_leaf(y));
    cr_assert_eq(sr_backward(loss, true), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(3, 5, 7), 3, 0, 0, "2x + 1");
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(6, 10, 14), 3, 0, 0, "a second pass accumulates");
    cr_assert_eq(sr_tensor_set_grad(x, NULL), 0);
    cr_assert_null(sr_tensor_grad(x));
    sr_tensor *ts[] = {x, sq, y, loss};
    unref_all(ts, 4);
}

Test(autograd, errors_mirror_pytorch)
{
    sr_tensor *x = sr_ones(SR_F64, 1, SHAPE(3), SR_REQUIRES_GRAD), *c = sr_ones(SR_F64, 1, SHAPE(3), 0);
    sr_tensor *y = sr_mul(x, x), *loss = sr_sum(y), *cs = sr_sum(c);
    cr_assert_eq(sr_backward(y, false), -EINVAL);
    tu_expect_error("non-scalar", "grad can be implicitly created only for scalar outputs", NULL);
    cr_assert_eq(sr_backward(cs, false), -EINVAL);
    tu_expect_error("no grad", "element 0 of tensors does not require grad and does not have a grad_fn", NULL);
    cr_assert_eq(sr_backward_multi((sr_tensor *[]){loss, cs}, NULL, 2, true), -EINVAL);
    tu_expect_error("second root", "element 1 of tensors does not require grad", NULL);
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    cr_assert_eq(sr_backward(loss, false), -EPERM);
    tu_expect_error("twice", "Trying to backward through the graph a second time", "retain_graph");
    cr_assert_eq(sr_tensor_set_requires_grad(y, false), -EINVAL);
    tu_expect_error("non-leaf", "you can only change requires_grad flags of leaf variables", NULL);
    cr_assert_eq(sr_tensor_register_hook(c, log_hook, NULL), -EINVAL);
    tu_expect_error("hook", "cannot register a hook on a tensor that doesn't require gradient", NULL);
    sr_tensor *ts[] = {x, c, y, loss, cs};
    unref_all(ts, 5);
}

Test(autograd, a_graph_without_saved_tensors_can_run_twice)
{
    sr_tensor *x = sr_ones(SR_F32, 1, SHAPE(2), SR_REQUIRES_GRAD), *y = sr_add_scalar(x, 1), *l = sr_sum(y);
    cr_assert_eq(sr_backward(l, false), 0);
    cr_assert_eq(sr_backward(l, false), 0, "as in PyTorch, nothing was freed: %s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(2, 2), 2, 0, 0, "two passes");
    sr_tensor *ts[] = {x, y, l};
    unref_all(ts, 3);
}

Test(autograd, explicit_root_gradients)
{
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD), *y = sr_mul_scalar(x, 3);
    sr_tensor *g = tu_tensor(SR_F64, 1, SHAPE(2), VALS(10, -1), 0), *bad = sr_ones(SR_F64, 1, SHAPE(3), 0);
    cr_assert_eq(sr_backward_multi(&y, &bad, 1, true), -EINVAL);
    tu_expect_error("shape", "Mismatch in shape: grad_output[0]", "[3]");
    cr_assert_eq(sr_backward_multi(&y, &g, 1, false), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(30, -3), 2, 0, 0, "vector-Jacobian product");
    sr_tensor *ts[] = {x, y, g, bad};
    unref_all(ts, 4);
}

Test(autograd, gradients_of_two_leaves_do_not_alias)
{
    /* AddBackward hands the same tensor to both inputs; each .grad must own its storage */
    sr_tensor *a = sr_zeros(SR_F64, 1, SHAPE(2), SR_REQUIRES_GRAD), *b = sr_zeros(SR_F64, 1, SHAPE(2), SR_REQUIRES_GRAD);
    sr_tensor *y = sr_add(a, b), *g = sr_ones(SR_F64, 1, SHAPE(2), 0);
    cr_assert_eq(sr_backward_multi(&y, &g, 1, false), 0);
    cr_assert(!sr_tensor_shares_storage(sr_tensor_grad(a), sr_tensor_grad(b)));
    cr_assert_eq(sr_fill_(sr_tensor_grad(a), 5), 0);
    tu_expect(sr_tensor_grad(b), VALS(1, 1), 2, 0, 0, "b's grad");
    tu_expect(g, VALS(1, 1), 2, 0, 0, "the caller's gradient");
    sr_tensor *ts[] = {a, b, y, g};
    unref_all(ts, 4);
}

/* Not PyTorch's "modified by an inplace operation" error: a saved tensor is a
 * snapshot, so backward uses the forward's values (docs/TENSORS.md, "In-place
 * writes and saved tensors"; more in tests/tensor/test_snapshot.c). */
Test(autograd, in_place_change_of_a_saved_tensor_keeps_the_forward_values)
{
    sr_tensor *x = sr_ones(SR_F64, 1, SHAPE(2), SR_REQUIRES_GRAD), *w = sr_ones(SR_F64, 1, SHAPE(2), 0);
    sr_tensor *y = sr_mul(x, w), *l = sr_sum(y);
    bool prev = sr_no_grad_enter();
    cr_assert_eq(sr_mul_scalar_(w, 2), 0);
    sr_no_grad_exit(prev);
    cr_assert_eq(sr_backward(l, false), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(1, 1), 2, 0, 0, "the gradient of the forward's w, not of 2w");
    tu_expect(w, VALS(2, 2), 2, 0, 0, "w has its update");
    sr_tensor *ts[] = {x, w, y, l};
    unref_all(ts, 4);
}

Test(autograd, leaf_hooks_see_the_total_and_may_replace_it)
{
    sr_tensor *x = sr_ones(SR_F64, 1, SHAPE(2), SR_REQUIRES_GRAD);
    struct hook_log h1 = {.scale = 10}, h2 = {0};
    cr_assert_eq(sr_tensor_register_hook(x, log_hook, &h1), 0);
    cr_assert_eq(sr_tensor_register_hook(x, log_hook, &h2), 0);
    sr_tensor *a = sr_mul_scalar(x, 2), *b = sr_mul_scalar(x, 3), *s = sr_add(a, b), *l = sr_sum(s);
    cr_assert_eq(sr_backward(l, false), 0, "%s", sr_last_error());
    cr_assert_eq(h1.calls, 1, "once, on the total of both uses");
    cr_assert_eq(h1.first, 5);
    cr_assert_eq(h2.first, 50, "hooks run in order, each seeing the previous replacement");
    tu_expect(sr_tensor_grad(x), VALS(50, 50), 2, 0, 0, "replaced gradient accumulated");
    sr_tensor *ts[] = {x, a, b, s, l};
    unref_all(ts, 5);
}

static int layout_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    (void)replace;
    *(bool *)arg = sr_tensor_is_contiguous(grad);
    return 0;
}

/* x W^T with W multiplied as a transposed view (as sr_linear does): W's
 * gradient reaches its leaf dense, in W's own layout, so that accumulation
 * keeps it as it is (as PyTorch's mm backward does for a column-major
 * operand), and a column-major x gets its gradient in its layout too. */
Test(autograd, a_transposed_operand_of_mm_gets_its_gradient_in_its_layout)
{
    sr_tensor *xt = tu_tensor(SR_F64, 2, SHAPE(4, 3), VALS(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12),
                              SR_REQUIRES_GRAD);
    sr_tensor *w = tu_tensor(SR_F64, 2, SHAPE(2, 4), VALS(1, -1, 2, 0, 3, 1, -2, 1), SR_REQUIRES_GRAD);
    sr_tensor *g = tu_tensor(SR_F64, 2, SHAPE(3, 2), VALS(1, 2, 3, 4, 5, 6), 0);
    bool w_dense = false, x_dense = false;
    cr_assert_eq(sr_tensor_register_hook(w, layout_hook, &w_dense), 0);
    cr_assert_eq(sr_tensor_register_hook(xt, layout_hook, &x_dense), 0);
    sr_tensor *x = sr_t(xt), *wt = sr_t(w), *y = sr_mm(x, wt), *yg = sr_mul(y, g), *loss = sr_sum(yg); /* x [3, 4] */
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    cr_assert(w_dense, "W's gradient reached its leaf as a strided view");
    cr_assert(x_dense, "x's gradient reached its (transposed) leaf as a strided view");
    /* dW = g^T x: [2, 4]; dx = g W [3, 4], and xt's gradient its transpose */
    tu_expect(sr_tensor_grad(w), VALS(22, 49, 76, 103, 28, 64, 100, 136), 8, 0, 0, "dW");
    tu_expect(sr_tensor_grad(xt), VALS(7, 15, 23, 1, 1, 1, -2, -2, -2, 2, 4, 6), 12, 0, 0, "d(x^T)");
    sr_tensor *ts[] = {xt, w, g, x, wt, y, yg, loss};
    unref_all(ts, 8);
}

Test(autograd, hooks_on_intermediates_and_failing_hooks)
{
    sr_tensor *x = sr_ones(SR_F64, 1, SHAPE(2), SR_REQUIRES_GRAD), *y = sr_mul_scalar(x, 2);
    struct hook_log h = {.scale = -1};
    cr_assert_eq(sr_tensor_register_hook(y, log_hook, &h), 0);
    sr_tensor *r1 = sr_sum(y), *y3 = sr_mul_scalar(y, 3), *r2 = sr_sum(y3);
    cr_assert_eq(sr_backward_multi((sr_tensor *[]){r1, r2}, NULL, 2, true), 0, "%s", sr_last_error());
    cr_assert_eq(h.calls, 1, "y's node runs once, after both roots' gradients arrived");
    cr_assert_eq(h.first, 4);
    tu_expect(sr_tensor_grad(x), VALS(-8, -8), 2, 0, 0, "replaced upstream");
    h.fail = -ECANCELED;
    cr_assert_eq(sr_backward(r1, true), -ECANCELED, "a hook's error aborts the pass");
    sr_tensor *ts[] = {x, y, r1, y3, r2};
    unref_all(ts, 5);
}

/* A hook that returns a tensor of another shape or dtype (PyTorch: "hook
 * 'h' has changed the size of value"). */
struct reshape_hook {
    int calls;
    int ndim;
    int64_t shape[2];
    sr_dtype dtype;
};

static int reshape_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    (void)grad;
    struct reshape_hook *h = arg;
    h->calls++;
    *replace = sr_ones(h->dtype, h->ndim, h->shape, 0);
    return *replace ? 0 : -ENOMEM;
}

Test(autograd, a_leaf_hook_may_not_change_the_shape_or_dtype)
{
    sr_tensor *x = sr_ones(SR_F64, 2, SHAPE(3, 3), SR_REQUIRES_GRAD), *y = sr_mul_scalar(x, 2), *l = sr_sum(y);
    struct hook_log first = {0};
    struct reshape_hook h = {.ndim = 1, .shape = {2}, .dtype = SR_F64};
    cr_assert_eq(sr_tensor_register_hook(x, log_hook, &first), 0);
    cr_assert_eq(sr_tensor_register_hook(x, reshape_hook, &h), 0);
    cr_assert_eq(sr_backward(l, true), -EINVAL, "a [3, 3] leaf given a [2] gradient by its hook");
    tu_expect_error("size", "hook 2 on a leaf f64 [3, 3] has changed the size of value", "was [3, 3], got [2]");
    cr_assert_eq(h.calls, 1);
    cr_assert_null(sr_tensor_grad(x), "nothing accumulated after the failure");

    /* With a .grad already there, a broadcastable [3] would have been added
     * into every row. */
    cr_assert_eq(sr_tensor_set_grad(x, NULL), 0);
    h.shape[0] = 3;
    sr_tensor *old = sr_zeros(SR_F64, 2, SHAPE(3, 3), 0);
    cr_assert_eq(sr_tensor_set_grad(x, old), 0);
    cr_assert_eq(sr_backward(l, true), -EINVAL, "a broadcastable [3]");
    tu_expect_error("broadcastable", "has changed the size of value", "was [3, 3], got [3]");
    tu_expect(sr_tensor_grad(x), VALS(0, 0, 0, 0, 0, 0, 0, 0, 0), 9, 0, 0, ".grad untouched");

    h.ndim = 2;
    h.shape[1] = 3;
    h.dtype = SR_F32;
    cr_assert_eq(sr_backward(l, false), -EINVAL, "an f32 gradient for an f64 leaf");
    tu_expect_error("dtype", "hook 2 on a leaf f64 [3, 3] has changed the type of value", "was f64, got f32");
    tu_expect(sr_tensor_grad(x), VALS(0, 0, 0, 0, 0, 0, 0, 0, 0), 9, 0, 0, ".grad untouched");
    sr_tensor *ts[] = {x, y, l, old};
    unref_all(ts, 4);
}

Test(autograd, a_hook_on_an_intermediate_may_not_change_the_shape)
{
    sr_tensor *x = sr_ones(SR_F64, 2, SHAPE(3, 3), SR_REQUIRES_GRAD), *y = sr_mul_scalar(x, 2);
    sr_tensor *z = sr_mul_scalar(y, 3), *l = sr_sum(z);
    struct reshape_hook h = {.ndim = 1, .shape = {3}, .dtype = SR_F64};
    cr_assert_eq(sr_tensor_register_hook(y, reshape_hook, &h), 0);
    cr_assert_eq(sr_backward(l, false), -EINVAL, "y's [3, 3] gradient replaced by a [3]");
    tu_expect_error("intermediate", "hook 1 on input 0 of MulBackward1 has changed the size of value",
                    "was [3, 3], got [3]");
    cr_assert_eq(h.calls, 1);
    cr_assert_null(sr_tensor_grad(x), "nothing accumulated after the failure");
    sr_tensor *ts[] = {x, y, z, l};
    unref_all(ts, 4);
}

Test(autograd, detach_and_no_grad_record_nothing)
{
    sr_tensor *x = sr_ones(SR_F64, 1, SHAPE(2), SR_REQUIRES_GRAD), *d = sr_detach(x);
    cr_assert(!sr_tensor_requires_grad(d) && sr_tensor_shares_storage(d, x));
    bool prev = sr_no_grad_enter();
    cr_assert(!sr_is_grad_enabled());
    sr_tensor *y = sr_mul(x, x);
    sr_no_grad_exit(prev);
    cr_assert(!sr_tensor_requires_grad(y) && !sr_tensor_grad_fn_name(y));
    cr_assert(sr_set_grad_enabled(true));
    sr_tensor *ts[] = {x, d, y};
    unref_all(ts, 3);
}

static void *grad_mode_of_new_thread(void *arg)
{
    *(bool *)arg = sr_is_grad_enabled();
    return NULL;
}

Test(autograd, grad_mode_is_per_thread)
{
    bool prev = sr_no_grad_enter(), other = false;
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, grad_mode_of_new_thread, &other), 0);
    pthread_join(th, NULL);
    sr_no_grad_exit(prev);
    cr_assert(other, "another thread keeps grad mode on");
}

Test(autograd, a_long_chain_backpropagates_and_frees_without_recursion)
{
    enum { N = 100000 };
    sr_tensor *x = sr_ones(SR_F32, 0, NULL, SR_REQUIRES_GRAD), *y = sr_tensor_ref(x);
    for (int i = 0; i < N; i++) {
        sr_tensor *next = sr_add_scalar(y, 1);
        sr_tensor_unref(y);
        y = next;
    }
    cr_assert_float_eq(sr_tensor_item(y), N + 1, 0.5);
    cr_assert_eq(sr_backward(y, false), 0, "%s", sr_last_error());
    cr_assert_eq(sr_tensor_item(sr_tensor_grad(x)), 1);
    sr_tensor_unref(y); /* drops N nodes */
    sr_tensor_unref(x);
}

struct train {
    sr_tensor *w;
    double k;
};

static void *train_thread(void *arg)
{
    struct train *t = arg;
    for (int i = 0; i < 200; i++) {
        sr_tensor *y = sr_mul_scalar(t->w, t->k), *l = sr_sum(y);
        if (sr_backward(l, false))
            return (void *)1;
        sr_tensor_unref(y);
        sr_tensor_unref(l);
    }
    return NULL;
}

Test(autograd, concurrent_passes_accumulate_into_one_leaf)
{
    sr_tensor *w = sr_ones(SR_F64, 1, SHAPE(4), SR_REQUIRES_GRAD);
    struct train a = {w, 1}, b = {w, 2};
    pthread_t ta, tb;
    void *ra, *rb;
    pthread_create(&ta, NULL, train_thread, &a);
    pthread_create(&tb, NULL, train_thread, &b);
    pthread_join(ta, &ra);
    pthread_join(tb, &rb);
    cr_assert(!ra && !rb);
    tu_expect(sr_tensor_grad(w), VALS(600, 600, 600, 600), 4, 0, 0, "200 * (1 + 2)");
    sr_tensor_unref(w);
}

/* A barrier for `parties` threads whose wait is bounded: false when the
 * others did not arrive within 30 s (a hung pass). */
struct tbarrier {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int parties, arrived;
    unsigned gen;
};

static void tbarrier_init(struct tbarrier *b, int parties)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, &a);
    pthread_condattr_destroy(&a);
    b->parties = parties;
    b->arrived = 0;
    b->gen = 0;
}

static bool tbarrier_wait(struct tbarrier *b)
{
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += 30;
    pthread_mutex_lock(&b->lock);
    unsigned gen = b->gen;
    bool ok = true;
    if (++b->arrived == b->parties) {
        b->arrived = 0;
        b->gen++;
        pthread_cond_broadcast(&b->cond);
    }
    while (ok && gen == b->gen)
        ok = pthread_cond_timedwait(&b->cond, &b->lock, &dl) != ETIMEDOUT || gen != b->gen;
    pthread_mutex_unlock(&b->lock);
    return ok;
}

static void tbarrier_destroy(struct tbarrier *b)
{
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->cond);
}

/* Two passes without retain_graph over one shared MulBackward (y = x * w):
 * sum(y) and sum(2y), started together. */
struct racer {
    struct tbarrier *start, *end;
    sr_tensor *volatile root; /* set by the main thread before start; NULL: stop */
    int rc;
    char err[512];
    bool lost; /* a barrier timed out */
};

static void *racer_thread(void *arg)
{
    struct racer *r = arg;
    for (;;) {
        if (!tbarrier_wait(r->start)) {
            r->lost = true;
            return NULL;
        }
        if (!r->root)
            return NULL;
        r->rc = sr_backward(r->root, false);
        snprintf(r->err, sizeof(r->err), "%s", r->rc ? sr_last_error() : "");
        if (!tbarrier_wait(r->end)) {
            r->lost = true;
            return NULL;
        }
    }
}

enum { RN = 2048 }; /* elements: long enough applies for the passes to overlap */

/* x.grad and w.grad after the pass from sum(k * x * w) alone: k w and k x. */
static void expect_one_pass(sr_tensor *x, sr_tensor *w, double k, int iter)
{
    static double xv[RN], wv[RN], kx[RN], kw[RN];
    sr_tensor_to_f64(x, xv, RN);
    sr_tensor_to_f64(w, wv, RN);
    for (int i = 0; i < RN; i++) {
        kx[i] = k * xv[i];
        kw[i] = k * wv[i];
    }
    char what[64];
    snprintf(what, sizeof(what), "iteration %d: x.grad = %g w", iter, k);
    tu_expect(sr_tensor_grad(x), kw, RN, 0, 0, what);
    snprintf(what, sizeof(what), "iteration %d: w.grad = %g x", iter, k);
    tu_expect(sr_tensor_grad(w), kx, RN, 0, 0, what);
}

/* A leaf of RN small integers (exact sums) starting at `first`. */
static sr_tensor *ramp(int first)
{
    static double v[RN];
    for (int i = 0; i < RN; i++)
        v[i] = (first + i) % 17 - 8;
    return tu_tensor(SR_F64, 1, SHAPE(RN), v, SR_REQUIRES_GRAD);
}

Test(autograd, two_passes_racing_over_a_shared_graph_one_fails_cleanly, .timeout = 120)
{
    enum { ITERS = 2000 };
    struct tbarrier start, end;
    tbarrier_init(&start, 3);
    tbarrier_init(&end, 3);
    struct racer r[2] = {{.start = &start, .end = &end}, {.start = &start, .end = &end}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, racer_thread, &r[i]), 0);
    for (int it = 0; it < ITERS; it++) {
        sr_tensor *x = ramp(it), *w = ramp(3 * it + 5);
        sr_tensor *y = sr_mul(x, w), *y2 = sr_mul_scalar(y, 2);
        r[0].root = sr_sum(y);
        r[1].root = sr_sum(y2);
        cr_assert(tbarrier_wait(&start), "iteration %d: a racer never started", it);
        cr_assert(tbarrier_wait(&end), "iteration %d: a backward pass hung (30 s)", it);
        int won = r[0].rc == 0 ? 0 : 1, lost = 1 - won;
        cr_assert(r[won].rc == 0 && r[lost].rc == -EPERM,
                  "iteration %d: exactly one pass must succeed and the other fail with -EPERM; got %d (%s) and %d "
                  "(%s)", it, r[0].rc, r[0].err, r[1].rc, r[1].err);
        cr_assert(strstr(r[lost].err, "Trying to backward through the graph a second time") &&
                      strstr(r[lost].err, "retain_graph"),
                  "iteration %d: the losing pass's error: %s", it, r[lost].err);
        expect_one_pass(x, w, won == 0 ? 1 : 2, it);
        sr_tensor *ts[] = {x, w, y, y2, r[0].root, r[1].root};
        unref_all(ts, 6);
    }
    r[0].root = r[1].root = NULL;
    cr_assert(tbarrier_wait(&start), "a racer never stopped");
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    cr_assert(!r[0].lost && !r[1].lost, "a racer timed out at a barrier");
    tbarrier_destroy(&start);
    tbarrier_destroy(&end);
}

/* The training situation: every thread builds its own graph from the shared
 * parameters w and b (MulBackward nodes saving them, one AccumulateGrad
 * node each shared by all passes) and runs backward on it. */
enum { PTHREADS = 4, PITERS = 300 };

struct param_worker {
    struct tbarrier *start;
    sr_tensor *w, *b;
    double k; /* this thread's input: x = [k, 2k, -k] */
    int failed_at;
    char err[512];
};

static void *param_thread(void *arg)
{
    struct param_worker *p = arg;
    p->failed_at = -1;
    if (!tbarrier_wait(p->start)) {
        p->failed_at = 0;
        snprintf(p->err, sizeof(p->err), "the start barrier timed out");
        return NULL;
    }
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(3), VALS(p->k, 2 * p->k, -p->k), 0);
    for (int i = 0; i < PITERS && p->failed_at < 0; i++) {
        /* loss = sum((w * x) * b + b): dw = x b, db = w x + 1 */
        sr_tensor *wx = sr_mul(p->w, x), *wxb = wx ? sr_mul(wx, p->b) : NULL;
        sr_tensor *z = wxb ? sr_add(wxb, p->b) : NULL, *l = z ? sr_sum(z) : NULL;
        if (!l || sr_backward(l, false)) {
            p->failed_at = i;
            snprintf(p->err, sizeof(p->err), "%s", sr_last_error());
        }
        sr_tensor *ts[] = {wx, wxb, z, l};
        unref_all(ts, 4);
    }
    sr_tensor_unref(x);
    return NULL;
}

Test(autograd, threads_training_shared_parameters_sum_their_gradients_exactly, .timeout = 120)
{
    static const double wv[3] = {1, -2, 3}, bv[3] = {2, 1, -1};
    sr_tensor *w = tu_tensor(SR_F64, 1, SHAPE(3), wv, SR_REQUIRES_GRAD);
    sr_tensor *b = tu_tensor(SR_F64, 1, SHAPE(3), bv, SR_REQUIRES_GRAD);
    struct tbarrier start;
    tbarrier_init(&start, PTHREADS);
    struct param_worker p[PTHREADS];
    pthread_t th[PTHREADS];
    double ksum = 0;
    for (int t = 0; t < PTHREADS; t++) {
        p[t] = (struct param_worker){.start = &start, .w = w, .b = b, .k = t + 1};
        ksum += t + 1;
        cr_assert_eq(pthread_create(&th[t], NULL, param_thread, &p[t]), 0);
    }
    for (int t = 0; t < PTHREADS; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < PTHREADS; t++)
        cr_assert(p[t].failed_at < 0, "thread %d failed at iteration %d: %s", t, p[t].failed_at, p[t].err);
    /* x = k [1, 2, -1]: sum over threads and iterations, exact in f64 */
    double dw[3], db[3], sign[3] = {1, 2, -1};
    for (int i = 0; i < 3; i++) {
        dw[i] = PITERS * ksum * sign[i] * bv[i];
        db[i] = PITERS * (ksum * sign[i] * wv[i] + PTHREADS);
    }
    tu_expect(sr_tensor_grad(w), dw, 3, 0, 0, "w.grad = sum of x b");
    tu_expect(sr_tensor_grad(b), db, 3, 0, 0, "b.grad = sum of (w x + 1)");
    tbarrier_destroy(&start);
    sr_tensor_unref(w);
    sr_tensor_unref(b);
}

/* Holds, step by step (engine.h, "Concurrent passes"): a pass keeps the
 * saved tensors it reached until it ran them, even while a pass without
 * retain_graph runs through them; and a pass that fails before running a
 * node hands it back intact. */
Test(engine, a_pass_holds_saved_state_until_it_ran_the_node)
{
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD);
    sr_tensor *w = tu_tensor(SR_F64, 1, SHAPE(2), VALS(3, 4), SR_REQUIRES_GRAD);
    sr_tensor *y = sr_mul(x, w), *l = sr_sum(y), *one = sr_scalar_tensor(SR_F64, 1, 0);
    sr_edge root = sr__tensor_gradient_edge(l);
    sr_graph_task *held;
    cr_assert_eq(sr__graph_task_create(true, NULL, &held), 0);
    cr_assert_eq(sr__graph_task_add_root(held, root), 0, "%s", sr_last_error());
    cr_assert_eq(sr_backward(l, false), 0, "a releasing pass may run while another holds: %s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(3, 4), 2, 0, 0, "x.grad after the releasing pass");
    cr_assert_eq(sr__graph_task_feed(held, root, one), 0);
    cr_assert_eq(sr__graph_task_run(held), 0, "the holder still reads MulBackward0's saved tensors: %s",
                 sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(6, 8), 2, 0, 0, "x.grad after the holding pass too");
    sr__graph_task_destroy(held);
    cr_assert_eq(sr_backward(l, true), -EPERM, "the last holder freed them");
    tu_expect_error("third pass", "Trying to backward through the graph a second time", "MulBackward0");

    /* A pass without retain_graph that never ran the node gives it back. */
    sr_tensor *y2 = sr_mul(x, w), *l2 = sr_sum(y2);
    sr_edge root2 = sr__tensor_gradient_edge(l2);
    sr_graph_task *abandoned;
    cr_assert_eq(sr__graph_task_create(false, NULL, &abandoned), 0);
    cr_assert_eq(sr__graph_task_add_root(abandoned, root2), 0, "%s", sr_last_error());
    cr_assert_eq(sr_backward(l2, true), -EPERM, "held by a pass that will free it");
    tu_expect_error("held", "Trying to backward through the graph a second time", NULL);
    sr__graph_task_destroy(abandoned);
    cr_assert_eq(sr_backward(l2, false), 0, "handed back intact: %s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(9, 12), 2, 0, 0, "x.grad after the pass that ran");
    sr__node_unref(root.fn);
    sr__node_unref(root2.fn);
    sr_tensor *ts[] = {x, w, y, l, one, y2, l2};
    unref_all(ts, 7);
}

/* ---- extension points (engine.h) ---- */

struct triple_node {
    sr_node base;
    int *released, *destroyed;
};

static int triple_apply(sr_node *n, sr_tensor *const *in, sr_tensor **out)
{
    (void)n;
    out[0] = sr_mul_scalar(in[0], 3);
    return out[0] ? 0 : -EINVAL;
}

static void triple_release(sr_node *n) { (*((struct triple_node *)n)->released)++; }
static void triple_destroy(sr_node *n) { (*((struct triple_node *)n)->destroyed)++; }

static const sr_node_ops triple_ops = {
    .name = "TripleBackward", .apply = triple_apply, .release = triple_release, .destroy = triple_destroy};

/* An op defined outside lib/tensor: y = 3x, with its own node type. */
static sr_tensor *triple(sr_tensor *x, int *released, int *destroyed)
{
    bool prev = sr_no_grad_enter();
    sr_tensor *y = sr_mul_scalar(x, 3);
    sr_no_grad_exit(prev);
    struct triple_node *n = (struct triple_node *)sr__node_for_inputs(&triple_ops, sizeof(*n), &x, 1, 1, 0);
    n->released = released;
    n->destroyed = destroyed;
    return sr__attach(y, &n->base);
}

Test(engine, node_types_plug_in_from_outside)
{
    int released = 0, destroyed = 0;
    sr_tensor *x = sr_ones(SR_F64, 1, SHAPE(2), SR_REQUIRES_GRAD), *y = triple(x, &released, &destroyed);
    sr_tensor *l = sr_sum(y);
    cr_assert_str_eq(sr_tensor_grad_fn_name(y), "TripleBackward");
    cr_assert_eq(sr_backward(l, false), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(3, 3), 2, 0, 0, "custom node's gradient");
    cr_assert_eq(released, 1, "released after running without retain_graph");
    sr_tensor_unref(l);
    sr_tensor_unref(y);
    cr_assert_eq(destroyed, 1, "destroyed with its last reference");
    sr_tensor_unref(x);
}

struct capture_sink {
    sr_grad_sink sink;
    sr_tensor *leaf[4], *grad[4];
    int n;
};

static int capture(sr_grad_sink *s, sr_tensor *leaf, sr_tensor *grad)
{
    struct capture_sink *c = (struct capture_sink *)s;
    c->leaf[c->n] = leaf;
    c->grad[c->n++] = sr_clone(grad);
    return 0;
}

/* A stand-in for SendRpcBackward: its gradient arrives later, by "RPC". */
static int pass_apply(sr_node *n, sr_tensor *const *in, sr_tensor **out)
{
    (void)n;
    out[0] = sr_tensor_ref(in[0]);
    return 0;
}

static const sr_node_ops send_ops = {.name = "SendRpcBackward", .apply = pass_apply};

Test(engine, fast_mode_send_function_as_extra_root_with_a_sink)
{
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD);
    struct hook_log h = {0};
    cr_assert_eq(sr_tensor_register_hook(x, log_hook, &h), 0);
    sr_tensor *y = sr_mul(x, x), *loss = sr_sum(y);
    /* the send function: x went to another worker, which will return its gradient */
    sr_node *send = sr__node_create(&send_ops, sizeof(sr_node), 1, 1, 0);
    sr_edge xe = sr__tensor_gradient_edge(x);
    sr__node_set_edge(send, 0, xe);
    sr__node_unref(xe.fn);

    struct capture_sink cs = {.sink.accumulate = capture};
    sr_graph_task *g;
    cr_assert_eq(sr__graph_task_create(false, &cs.sink, &g), 0);
    sr_edge root = sr__tensor_gradient_edge(loss);
    cr_assert_eq(sr__graph_task_add_root(g, root), 0);
    cr_assert_eq(sr__graph_task_add_root(g, (sr_edge){send, 0}), 0);
    sr_tensor *one = sr_scalar_tensor(SR_F64, 1, 0);
    cr_assert_eq(sr__graph_task_feed(g, root, one), 0);
    cr_assert_eq(sr__graph_task_run(g), 0, "%s", sr_last_error());
    cr_assert_eq(cs.n, 0, "x's accumulator waits for the send function");
    cr_assert_eq(sr__graph_task_pending(g), 2, "send and AccumulateGrad are pending");
    sr_tensor *remote = tu_tensor(SR_F64, 1, SHAPE(2), VALS(100, 200), 0);
    cr_assert_eq(sr__graph_task_feed_node(g, send, &remote), 0);
    cr_assert_eq(sr__graph_task_feed_node(g, send, &remote), -EINVAL, "one RPC per send function");
    sr__graph_task_destroy(g);

    cr_assert_eq(sr__graph_task_create(false, &cs.sink, &g), 0);
    cr_assert_eq(sr__graph_task_add_root(g, (sr_edge){send, 0}), 0);
    cr_assert_eq(sr__graph_task_feed(g, root, one), -EINVAL, "a node outside the pass");
    sr__graph_task_destroy(g);
    sr__node_unref(root.fn);
    sr__node_unref(send);
    sr_tensor *ts[] = {x, y, loss, one, remote};
    unref_all(ts, 5);
}

Test(engine, sink_receives_the_total_after_hooks)
{
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), SR_REQUIRES_GRAD);
    struct hook_log h = {.scale = 2};
    cr_assert_eq(sr_tensor_register_hook(x, log_hook, &h), 0);
    sr_tensor *y = sr_mul(x, x), *loss = sr_sum(y);
    sr_node *send = sr__node_create(&send_ops, sizeof(sr_node), 1, 1, 0);
    sr_edge xe = sr__tensor_gradient_edge(x);
    sr__node_set_edge(send, 0, xe);
    sr__node_unref(xe.fn);
    struct capture_sink cs = {.sink.accumulate = capture};
    sr_graph_task *g;
    sr_edge root = sr__tensor_gradient_edge(loss);
    sr_tensor *one = sr_scalar_tensor(SR_F64, 1, 0), *remote = tu_tensor(SR_F64, 1, SHAPE(2), VALS(100, 200), 0);
    cr_assert_eq(sr__graph_task_create(false, &cs.sink, &g), 0);
    cr_assert_eq(sr__graph_task_add_root(g, root), 0);
    cr_assert_eq(sr__graph_task_add_root(g, (sr_edge){send, 0}), 0);
    cr_assert_eq(sr__graph_task_feed(g, root, one), 0);
    cr_assert_eq(sr__graph_task_run(g), 0);
    cr_assert_eq(sr__graph_task_feed_node(g, send, &remote), 0); /* the RPC arrives */
    cr_assert_eq(sr__graph_task_run(g), 0, "%s", sr_last_error());
    cr_assert_eq(sr__graph_task_pending(g), 0);
    cr_assert_eq(cs.n, 1, "one leaf, one delivery");
    cr_assert_eq(cs.leaf[0], x);
    tu_expect(cs.grad[0], VALS(2 * (2 + 100), 2 * (4 + 200)), 2, 0, 0, "2x + remote, doubled by the hook");
    cr_assert_null(sr_tensor_grad(x), ".grad is untouched with a sink");
    cr_assert_eq(h.calls, 1);
    sr__graph_task_destroy(g);
    sr__node_unref(root.fn);
    sr__node_unref(send);
    sr_tensor_unref(cs.grad[0]);
    sr_tensor *ts[] = {x, y, loss, one, remote};
    unref_all(ts, 5);
}
