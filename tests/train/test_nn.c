/* SPDX-License-Identifier: MIT */
/* nn.h: the seeded generator, Linear/MLP modules (initialisation, forward,
 * backward), argmax, accuracy, and cross_entropy's reduction; a forward
 * running while another thread steps the weight in place. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "gradcheck.h"
#include "shmrpc/nn.h"
#include "tensor_util.h"
#include "common.h"

LEAK_CHECKED_SUITE(generator);
LEAK_CHECKED_SUITE(linear);
LEAK_CHECKED_SUITE(mlp);
LEAK_CHECKED_SUITE(metrics);

/* ---- generator ---- */

Test(generator, stream_is_pinned_to_the_seed)
{
    /* From an independent Python implementation of splitmix64 seeding and
     * xoshiro256**: the stream must not change across machines or releases. */
    sr_generator g;
    sr_generator_init(&g, 42);
    cr_assert_eq(sr_generator_next(&g), 0x15780b2e0c2ec716ull);
    cr_assert_eq(sr_generator_next(&g), 0x6104d9866d113a7eull);
    cr_assert_eq(sr_generator_next(&g), 0xae17533239e499a1ull);
    sr_generator_init(&g, 0);
    cr_assert_eq(sr_generator_next(&g), 0x99ec5f36cb75f2b4ull);
    sr_generator_init(&g, 42);
    cr_assert_eq(sr_generator_uniform(&g), 0.08386297105988216);
    cr_assert_eq(sr_generator_uniform(&g), 0.3789802506626686);
}

Test(generator, same_seed_same_stream_other_seed_other_stream)
{
    sr_generator a, b, c;
    sr_generator_init(&a, 7);
    sr_generator_init(&b, 7);
    sr_generator_init(&c, 8);
    int differ = 0;
    for (int i = 0; i < 1000; i++) {
        double x = sr_generator_uniform(&a), y = sr_generator_uniform(&b), z = sr_generator_uniform(&c);
        if (x != y || x < 0 || x >= 1)
            cr_assert_fail("draw %d: %.17g vs %.17g", i, x, y);
        differ += x != z;
    }
    cr_assert_gt(differ, 990, "seeds 7 and 8 gave %d equal draws of 1000", 1000 - differ);
}

Test(generator, below_is_in_range_and_covers_it)
{
    sr_generator g;
    sr_generator_init(&g, 3);
    int seen[7] = {0};
    for (int i = 0; i < 7000; i++) {
        uint64_t v = sr_generator_below(&g, 7);
        if (v >= 7)
            cr_assert_fail("below(7) gave %llu", (unsigned long long)v);
        seen[v]++;
    }
    for (int i = 0; i < 7; i++)
        cr_assert(seen[i] > 800 && seen[i] < 1200, "value %d drawn %d times of 7000", i, seen[i]);
    cr_assert_eq(sr_generator_below(&g, 0), 0);
    cr_assert_eq(sr_generator_below(&g, 1), 0);
}

Test(generator, permutation_is_valid_and_deterministic)
{
    enum { N = 1000 };
    static int64_t p[N], q[N], r[N];
    sr_generator g;
    sr_generator_init(&g, 42);
    int64_t small[10];
    cr_assert_eq(sr_generator_permutation(&g, 10, small), 0);
    int64_t want[10] = {7, 3, 8, 9, 5, 6, 4, 1, 0, 2}; /* the Python reference again */
    cr_assert_arr_eq(small, want, sizeof(want));

    sr_generator_init(&g, 5);
    cr_assert_eq(sr_generator_permutation(&g, N, p), 0);
    sr_generator_init(&g, 5);
    cr_assert_eq(sr_generator_permutation(&g, N, q), 0);
    cr_assert_eq(sr_generator_permutation(&g, N, r), 0);
    cr_assert_arr_eq(p, q, sizeof(p), "same seed, same order");
    cr_assert(memcmp(q, r, sizeof(q)), "the next epoch is shuffled differently");
    static bool seen[N];
    int fixed = 0;
    for (int i = 0; i < N; i++) {
        if (p[i] < 0 || p[i] >= N || seen[p[i]])
            cr_assert_fail("p[%d] = %lld is out of range or repeated", i, (long long)p[i]);
        seen[p[i]] = true;
        fixed += p[i] == i;
    }
    cr_assert_lt(fixed, 10, "%d fixed points: not shuffled", fixed);
    cr_assert_eq(sr_generator_permutation(&g, 0, NULL), 0);
    cr_assert_eq(sr_generator_permutation(&g, 1, small), 0);
    cr_assert_eq(small[0], 0);
    cr_assert_eq(sr_generator_permutation(&g, -1, small), -EINVAL);
    tu_expect_error("n < 0", "sr_generator_permutation", "n -1");
}

Test(generator, uniform_tensor_range_and_dtype)
{
    sr_generator g;
    sr_generator_init(&g, 9);
    sr_tensor *t = sr_generator_uniform_tensor(&g, SR_F32, 2, SHAPE(20, 50), -0.5, 0.25, SR_REQUIRES_GRAD);
    cr_assert(t, "%s", sr_last_error());
    cr_assert_eq(sr_tensor_dtype(t), SR_F32);
    cr_assert(sr_tensor_requires_grad(t) && sr_tensor_is_leaf(t));
    static double v[1000];
    sr_tensor_to_f64(t, v, 1000);
    double lo = 1, hi = -1;
    for (int i = 0; i < 1000; i++) {
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
    }
    cr_assert(lo >= -0.5 && hi <= 0.25 && lo < -0.45 && hi > 0.2, "range [%g, %g]", lo, hi);
    cr_assert_null(sr_generator_uniform_tensor(&g, SR_I64, 1, SHAPE(2), 0, 1, 0));
    tu_expect_error("i64", "sr_generator_uniform_tensor", "i64");
    sr_tensor_unref(t);
}

/* ---- Linear and MLP ---- */

/* Every element of t within [-bound, bound], and close to both ends. */
static void expect_spread(sr_tensor *t, double bound, const char *what)
{
    size_t n = sr_tensor_numel(t);
    double *v = malloc(n * sizeof(double)), lo = 0, hi = 0;
    cr_assert_eq(sr_tensor_to_f64(t, v, n), 0);
    for (size_t i = 0; i < n; i++) {
        if (fabs(v[i]) > bound)
            cr_assert_fail("%s[%zu] = %g is outside +-%g", what, i, v[i], bound);
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
    }
    free(v);
    if (n >= 100)
        cr_assert(lo < -0.9 * bound && hi > 0.9 * bound, "%s spans only [%g, %g] of +-%g", what, lo, hi, bound);
}

Test(linear, init_like_torch_nn_linear)
{
    sr_generator g;
    sr_generator_init(&g, 1);
    sr_module *m;
    cr_assert_eq(sr_linear_create(50, 20, true, SR_F32, &g, &m), 0, "%s", sr_last_error());
    size_t n;
    sr_tensor *const *p;
    const char *const *names;
    sr_module_params(m, &n, &p, &names);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(names[0], "weight");
    cr_assert_str_eq(names[1], "bias");
    tu_expect_shape(p[0], 2, SHAPE(20, 50), "weight");
    tu_expect_shape(p[1], 1, SHAPE(20), "bias");
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(sr_tensor_dtype(p[i]), SR_F32);
        cr_assert(sr_tensor_requires_grad(p[i]) && sr_tensor_is_leaf(p[i]));
    }
    expect_spread(p[0], 1 / sqrt(50.0), "weight");
    expect_spread(p[1], 1 / sqrt(50.0), "bias");

    /* Weight first, then bias, each -b + 2b u from the generator, in f32. */
    sr_generator_init(&g, 1);
    double w[1000], b[20], want[1000], bound = 1 / sqrt(50.0);
    sr_tensor_to_f64(p[0], w, 1000);
    sr_tensor_to_f64(p[1], b, 20);
    for (int i = 0; i < 1000; i++)
        want[i] = (float)(-bound + 2 * bound * sr_generator_uniform(&g));
    cr_assert_arr_eq(w, want, sizeof(w));
    for (int i = 0; i < 20; i++)
        cr_assert_eq(b[i], (float)(-bound + 2 * bound * sr_generator_uniform(&g)));
    sr_module_destroy(m);
}

Test(linear, same_seed_same_weights_and_no_bias_option)
{
    sr_generator g1, g2, g3;
    sr_generator_init(&g1, 11);
    sr_generator_init(&g2, 11);
    sr_generator_init(&g3, 12);
    sr_module *a, *b, *c;
    cr_assert_eq(sr_linear_create(4, 3, false, SR_F64, &g1, &a), 0);
    cr_assert_eq(sr_linear_create(4, 3, false, SR_F64, &g2, &b), 0);
    cr_assert_eq(sr_linear_create(4, 3, false, SR_F64, &g3, &c), 0);
    size_t n;
    sr_module_params(a, &n, NULL, NULL);
    cr_assert_eq(n, 1, "bias false: only the weight");
    double x[12], y[12], z[12];
    sr_tensor_to_f64(sr_module_param(a, "weight"), x, 12);
    sr_tensor_to_f64(sr_module_param(b, "weight"), y, 12);
    sr_tensor_to_f64(sr_module_param(c, "weight"), z, 12);
    cr_assert_arr_eq(x, y, sizeof(x));
    cr_assert(memcmp(x, z, sizeof(x)));
    cr_assert_null(sr_module_param(a, "bias"));
    tu_expect_error("missing", "sr_module_param", "\"bias\"");
    sr_module_destroy(a);
    sr_module_destroy(b);
    sr_module_destroy(c);
}

Test(linear, bad_arguments)
{
    sr_generator g;
    sr_generator_init(&g, 1);
    sr_module *m = NULL;
    cr_assert_eq(sr_linear_create(0, 3, true, SR_F32, &g, &m), -EINVAL);
    tu_expect_error("in 0", "sr_linear_create", "0 -> 3");
    cr_assert_eq(sr_linear_create(2, 3, true, SR_I64, &g, &m), -EINVAL);
    tu_expect_error("i64", "sr_linear_create", "i64");
    cr_assert_eq(sr_linear_create(2, 3, true, SR_F32, NULL, &m), -EINVAL);
    cr_assert_eq(sr_mlp_create(SHAPE(4, 0, 2), 2, &g, SR_F32, &m), -EINVAL);
    tu_expect_error("mlp 0", "sr_mlp_create", "4 -> 0");
    cr_assert_eq(sr_mlp_create(SHAPE(4), 0, &g, SR_F32, &m), -EINVAL);
    cr_assert_null(m);
    sr_module_destroy(NULL);
}

/* Sets a module's parameter from values (grad mode off: it is a leaf). */
static void set_param(sr_module *m, const char *name, const double *vals)
{
    sr_tensor *p = sr_module_param(m, name);
    sr_tensor *v = tu_tensor(SR_F64, sr_tensor_ndim(p), sr_tensor_shape(p), vals, 0);
    cr_assert_eq(sr_copy_(p, v), -EPERM, "in-place on a parameter needs no_grad");
    bool prev = sr_no_grad_enter();
    cr_assert_eq(sr_copy_(p, v), 0, "%s", sr_last_error());
    sr_no_grad_exit(prev);
    sr_tensor_unref(v);
}

Test(linear, forward_is_x_wt_plus_b)
{
    sr_generator g;
    sr_generator_init(&g, 1);
    sr_module *m;
    cr_assert_eq(sr_linear_create(3, 2, true, SR_F64, &g, &m), 0);
    set_param(m, "weight", VALS(1, 2, 3, -1, 0, 0.5));
    set_param(m, "bias", VALS(0.25, -2));
    sr_tensor *x = tu_tensor(SR_F64, 2, SHAPE(2, 3), VALS(1, 1, 1, 2, -1, 4), 0);
    sr_tensor *y = sr_module_forward(m, x);
    /* row 0: 1+2+3+0.25, -1+0+0.5-2; row 1: 2-2+12+0.25, -2+0+2-2 */
    tu_expect_shape(y, 2, SHAPE(2, 2), "y");
    tu_expect(y, VALS(6.25, -2.5, 12.25, -2), 4, 1e-12, 0, "linear forward");
    cr_assert(sr_tensor_requires_grad(y));
    sr_tensor *v = tu_tensor(SR_F64, 1, SHAPE(3), VALS(1, 1, 1), 0), *yv = sr_module_forward(m, v);
    tu_expect_shape(yv, 1, SHAPE(2), "1-D input");
    tu_expect(yv, VALS(6.25, -2.5), 2, 1e-12, 0, "1-D input");
    sr_tensor *x3 = sr_reshape(x, 3, SHAPE(2, 1, 3)), *y3 = sr_module_forward(m, x3);
    tu_expect_shape(y3, 3, SHAPE(2, 1, 2), "leading batch dims are kept");
    tu_expect(y3, VALS(6.25, -2.5, 12.25, -2), 4, 1e-12, 0, "3-D input");
    sr_tensor *bad = sr_zeros(SR_F64, 2, SHAPE(2, 4), 0);
    cr_assert_null(sr_module_forward(m, bad));
    tu_expect_error("features", "sr_linear", "[2, 4]");
    sr_tensor *f32 = sr_zeros(SR_F32, 2, SHAPE(2, 3), 0);
    cr_assert_null(sr_module_forward(m, f32));
    tu_expect_error("dtype", "sr_linear", "f32");
    sr_tensor *ts[] = {x, y, v, yv, x3, y3, bad, f32};
    for (int i = 0; i < 8; i++)
        sr_tensor_unref(ts[i]);
    sr_module_destroy(m);
}

static sr_tensor *linear_fn(sr_tensor *const *in, const void *arg)
{
    (void)arg;
    return sr_linear(in[0], in[1], in[2]);
}

Test(linear, functional_gradcheck)
{
    struct gc_input in[3] = {
        {.ndim = 2, .shape = {3, 4}, .lo = -1, .hi = 1},
        {.ndim = 2, .shape = {2, 4}, .lo = -1, .hi = 1},
        {.ndim = 1, .shape = {2}, .lo = -1, .hi = 1},
    };
    gradcheck("linear", linear_fn, NULL, 3, in);
}

/* ---- a forward while another thread steps the weight in place ----
 * The parameter server's case: forwards on executor threads, another
 * trainer's optimizer step writing the weight in place. One thread fills a
 * large weight with k = 1, 2, ... (an in-place step, grad mode off); the
 * other runs sr_linear(ones, W) and requires every output to come from one
 * whole version of W: all equal, and a multiple of IN. The rounds are
 * handshaken as in test_snapshot's torn suite, so that forwards overlap each
 * fill. Reading W directly (sr_linear before param_view) fails this in
 * every run (checked by hand: 16 of 16 forwards mixed two versions, 4 runs);
 * through a snapshot it cannot, whatever the interleaving. */
enum { LT_IN = 1 << 16, LT_OUT = 64, LT_ROUNDS = 16 };

struct linear_torn {
    sr_tensor *w, *x;
    _Atomic int started, acked;
    int torn, forwards;
};

static void *linear_reader(void *arg)
{
    struct linear_torn *s = arg;
    static double y[LT_OUT];
    for (int k = 1; k <= LT_ROUNDS; k++) {
        /* acquire: pairs with the writer's release store of started */
        while (atomic_load_explicit(&s->started, memory_order_acquire) < k)
            sched_yield();
        for (bool done = false; !done;) { /* until a forward shows the whole of fill k */
            sr_tensor *out = sr_linear(s->x, s->w, NULL);
            cr_assert(out, "%s", sr_last_error());
            cr_assert(sr_tensor_requires_grad(out));
            cr_assert_eq(sr_tensor_to_f64(out, y, LT_OUT), 0);
            s->forwards++;
            bool uniform = y[0] == (double)LT_IN * (double)(int64_t)(y[0] / LT_IN);
            for (int j = 1; j < LT_OUT; j++)
                uniform &= y[j] == y[0];
            s->torn += !uniform;
            done = !uniform || y[0] == (double)LT_IN * k;
            sr_tensor_unref(out);
        }
        /* release: the writer's next fill starts after our references went */
        atomic_store_explicit(&s->acked, k, memory_order_release);
    }
    return NULL;
}

Test(linear, a_forward_never_sees_half_of_an_in_place_step, .timeout = 120)
{
    struct linear_torn s = {.w = sr_zeros(SR_F32, 2, SHAPE(LT_OUT, LT_IN), SR_REQUIRES_GRAD),
                            .x = sr_ones(SR_F32, 2, SHAPE(1, LT_IN), 0)};
    cr_assert(s.w && s.x, "%s", sr_last_error());
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, linear_reader, &s), 0);
    bool prev = sr_no_grad_enter(); /* the optimizer's mode; grad mode is per thread */
    for (int k = 1; k <= LT_ROUNDS; k++) {
        /* acquire: pairs with the reader's release of acked */
        while (atomic_load_explicit(&s.acked, memory_order_acquire) < k - 1)
            sched_yield();
        /* release: pairs with the reader's acquire load of started */
        atomic_store_explicit(&s.started, k, memory_order_release);
        cr_assert_eq(sr_fill_(s.w, k), 0, "%s", sr_last_error());
    }
    sr_no_grad_exit(prev);
    pthread_join(th, NULL);
    cr_assert_eq(s.torn, 0, "%d of %d forwards mixed two versions of the weight", s.torn, s.forwards);
    cr_assert_geq(s.forwards, LT_ROUNDS);
    sr_tensor_unref(s.w);
    sr_tensor_unref(s.x);
}

Test(mlp, names_sizes_and_params_like_nn_sequential)
{
    sr_generator g;
    sr_generator_init(&g, 0);
    sr_module *m;
    cr_assert_eq(sr_mlp_create(SHAPE(784, 128, 10), 2, &g, SR_F32, &m), 0, "%s", sr_last_error());
    size_t n;
    sr_tensor *const *p;
    const char *const *names;
    sr_module_params(m, &n, &p, &names);
    cr_assert_eq(n, 4);
    const char *want[] = {"0.weight", "0.bias", "2.weight", "2.bias"};
    for (int i = 0; i < 4; i++) {
        cr_assert_str_eq(names[i], want[i]);
        cr_assert_eq(sr_module_param(m, want[i]), p[i]);
    }
    tu_expect_shape(p[0], 2, SHAPE(128, 784), "0.weight");
    tu_expect_shape(p[3], 1, SHAPE(10), "2.bias");
    cr_assert_eq(sr_module_numel(m), 784 * 128 + 128 + 128 * 10 + 10);
    expect_spread(p[0], 1 / sqrt(784.0), "0.weight");
    expect_spread(p[2], 1 / sqrt(128.0), "2.weight");

    /* A parameter outlives the module when referenced (e.g. by an RRef). */
    sr_tensor *keep = sr_tensor_ref(p[3]);
    sr_module_destroy(m);
    cr_assert_eq(sr_tensor_numel(keep), 10);
    sr_tensor_unref(keep);
}

Test(mlp, forward_is_linear_relu_linear)
{
    sr_generator g;
    sr_generator_init(&g, 2);
    sr_module *m;
    cr_assert_eq(sr_mlp_create(SHAPE(2, 2, 1), 2, &g, SR_F64, &m), 0);
    set_param(m, "0.weight", VALS(1, 0, 0, -1));
    set_param(m, "0.bias", VALS(0, 0.5));
    set_param(m, "2.weight", VALS(2, 3));
    set_param(m, "2.bias", VALS(-1));
    sr_tensor *x = tu_tensor(SR_F64, 2, SHAPE(2, 2), VALS(1, 2, -1, -3), 0), *y = sr_module_forward(m, x);
    /* h = relu([1, -1.5], [-1, 3.5]) = [1, 0], [0, 3.5]; y = 2 h0 + 3 h1 - 1 */
    tu_expect(y, VALS(1, 9.5), 2, 1e-12, 0, "mlp forward");
    sr_tensor *const *p;
    sr_module_params(m, NULL, &p, NULL);
    sr_tensor *z = sr_mlp_apply(x, p, 2);
    tu_expect(z, VALS(1, 9.5), 2, 1e-12, 0, "sr_mlp_apply with the same parameters");
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    sr_tensor_unref(z);
    sr_module_destroy(m);
}

/* loss(params) of a small f64 MLP with cross_entropy, for finite differences. */
static double mlp_loss(sr_module *m, sr_tensor *x, sr_tensor *tg)
{
    bool prev = sr_no_grad_enter();
    sr_tensor *y = sr_module_forward(m, x), *l = sr_cross_entropy(y, tg);
    sr_no_grad_exit(prev);
    cr_assert(l, "%s", sr_last_error());
    double v = sr_tensor_item(l);
    sr_tensor_unref(y);
    sr_tensor_unref(l);
    return v;
}

/* Every parameter element's gradient against a central difference. */
static void check_param_grads(sr_module *m, sr_tensor *x, sr_tensor *tg)
{
    size_t n;
    sr_tensor *const *p;
    const char *const *names;
    sr_module_params(m, &n, &p, &names);
    for (size_t i = 0; i < n; i++) {
        size_t k = sr_tensor_numel(p[i]);
        double an[64];
        cr_assert(k <= 64 && sr_tensor_grad(p[i]), "%s has no gradient", names[i]);
        sr_tensor_to_f64(sr_tensor_grad(p[i]), an, k);
        bool prev = sr_no_grad_enter();
        double *v = sr_tensor_mutable_data(p[i]);
        sr_no_grad_exit(prev);
        for (size_t j = 0; j < k; j++) {
            double keep = v[j];
            v[j] = keep + GC_EPS;
            double up = mlp_loss(m, x, tg);
            v[j] = keep - GC_EPS;
            double num = (up - mlp_loss(m, x, tg)) / (2 * GC_EPS);
            v[j] = keep;
            if (!(fabs(an[j] - num) <= GC_ATOL + GC_RTOL * fabs(num)))
                cr_assert_fail("d loss / d %s[%zu]: analytic %.10g, numerical %.10g", names[i], j, an[j], num);
        }
    }
}

Test(mlp, backward_through_cross_entropy_matches_finite_differences)
{
    sr_generator g;
    sr_generator_init(&g, 4);
    sr_module *m;
    cr_assert_eq(sr_mlp_create(SHAPE(5, 6, 4, 3), 3, &g, SR_F64, &m), 0);
    sr_tensor *x = sr_generator_uniform_tensor(&g, SR_F64, 2, SHAPE(4, 5), -2, 2, 0);
    sr_tensor *tg = tu_tensor(SR_I64, 1, SHAPE(4), VALS(0, 2, 1, 2), 0);
    sr_tensor *y = sr_module_forward(m, x), *loss = sr_cross_entropy(y, tg);
    cr_assert(loss, "%s", sr_last_error());
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    check_param_grads(m, x, tg);
    sr_module_zero_grad(m);
    sr_tensor *const *p;
    sr_module_params(m, NULL, &p, NULL);
    cr_assert_null(sr_tensor_grad(p[0]), "zero_grad clears .grad");
    sr_tensor_unref(x);
    sr_tensor_unref(tg);
    sr_tensor_unref(y);
    sr_tensor_unref(loss);
    sr_module_destroy(m);
}

/* ---- metrics and the loss ---- */

Test(metrics, cross_entropy_is_the_batch_mean)
{
    sr_tensor *x = tu_tensor(SR_F32, 2, SHAPE(2, 3), VALS(1, 2, 3, 1, 1, 1), 0);
    sr_tensor *tg = tu_tensor(SR_I64, 1, SHAPE(2), VALS(2, 0), 0), *l = sr_cross_entropy(x, tg);
    /* (log(e + e^2 + e^3) - 3 + log 3) / 2, by hand (as torch's default
     * reduction='mean' gives: 0.7531091...) */
    double want = (log(exp(1) + exp(2) + exp(3)) - 3 + log(3)) / 2;
    tu_expect_shape(l, 0, NULL, "a 0-d loss");
    tu_expect(l, &want, 1, 1e-6, 1e-6, "mean cross entropy");
    cr_assert(fabs(want - 0.75310912655624) < 1e-12);
    sr_tensor_unref(x);
    sr_tensor_unref(tg);
    sr_tensor_unref(l);
}

Test(metrics, argmax_along_each_dim_first_on_ties)
{
    sr_tensor *t = tu_tensor(SR_F32, 2, SHAPE(2, 3), VALS(1, 5, 5, 7, -1, 2), 0);
    sr_tensor *a1 = sr_argmax(t, 1), *a0 = sr_argmax(t, 0), *am = sr_argmax(t, -1);
    tu_expect_shape(a1, 1, SHAPE(2), "dim 1");
    cr_assert_eq(sr_tensor_dtype(a1), SR_I64);
    cr_assert(!sr_tensor_requires_grad(a1));
    tu_expect(a1, VALS(1, 0), 2, 0, 0, "dim 1: the first of two 5s");
    tu_expect(a0, VALS(1, 0, 0), 3, 0, 0, "dim 0");
    tu_expect(am, VALS(1, 0), 2, 0, 0, "dim -1");
    sr_tensor *c = tu_tensor(SR_F64, 3, SHAPE(2, 2, 2), VALS(0, 9, 1, 8, 4, 4, 3, 5), 0), *ac = sr_argmax(c, 1);
    tu_expect(ac, VALS(1, 0, 0, 1), 4, 0, 0, "the middle dim of a 3-D tensor");
    sr_tensor *tt = sr_t(t), *at = sr_argmax(tt, 0);
    tu_expect(at, VALS(1, 0), 2, 0, 0, "a transposed view");
    sr_tensor *n = tu_tensor(SR_F64, 1, SHAPE(3), VALS(1, NAN, 2), 0), *an = sr_argmax(n, 0);
    tu_expect(an, VALS(1), 1, 0, 0, "NaN is the largest");
    sr_tensor *i = tu_tensor(SR_I64, 1, SHAPE(3), VALS(-5, 9007199254740993.0, 2), 0), *ai = sr_argmax(i, 0);
    tu_expect(ai, VALS(1), 1, 0, 0, "i64");
    sr_tensor *s = sr_scalar_tensor(SR_F32, 3, SR_REQUIRES_GRAD), *as = sr_argmax(s, 0);
    tu_expect_shape(as, 0, NULL, "0-d");
    cr_assert_eq(sr_tensor_item(as), 0);
    sr_tensor *e = sr_zeros(SR_F32, 2, SHAPE(2, 0), 0);
    cr_assert_null(sr_argmax(e, 1));
    tu_expect_error("empty", "sr_argmax", "size 0");
    cr_assert_null(sr_argmax(t, 2));
    tu_expect_error("dim", "sr_argmax", "out of range");
    sr_tensor *ts[] = {t, a1, a0, am, c, ac, tt, at, n, an, i, ai, s, as, e};
    for (size_t k = 0; k < sizeof(ts) / sizeof(ts[0]); k++)
        sr_tensor_unref(ts[k]);
}

Test(metrics, accuracy_is_the_fraction_correct)
{
    sr_tensor *l = tu_tensor(SR_F32, 2, SHAPE(4, 3), VALS(1, 2, 0, 5, 1, 1, 0, 0, 3, 2, 2, 1), 0);
    sr_tensor *y = tu_tensor(SR_I64, 1, SHAPE(4), VALS(1, 0, 2, 1), 0); /* predictions 1, 0, 2, 0 */
    cr_assert_eq(sr_accuracy(l, y), 0.75);
    sr_tensor *f = tu_tensor(SR_F32, 1, SHAPE(4), VALS(1, 0, 2, 1), 0);
    cr_assert(isnan(sr_accuracy(l, f)));
    tu_expect_error("dtype", "sr_accuracy", "i64");
    sr_tensor *short_y = tu_tensor(SR_I64, 1, SHAPE(3), VALS(1, 0, 2), 0);
    cr_assert(isnan(sr_accuracy(l, short_y)));
    tu_expect_error("shape", "sr_accuracy", "[4, 3]");
    sr_tensor *ts[] = {l, y, f, short_y};
    for (int i = 0; i < 4; i++)
        sr_tensor_unref(ts[i]);
}
