/* SPDX-License-Identifier: MIT */
/* Many threads hammering one worker (the ThreadSanitizer suite's stress
 * program, and an integration test of the plain and sanitizer builds):
 *
 *     shmrun -n N ./hammer [--threads T] [--iters I]
 *
 * Worker 0 is the target. Every other worker starts T threads (default 16),
 * released together by a barrier; each runs I rounds (default 20) of
 *   1. rpc_sync add(i, t), checked;
 *   2. rpc_async add, a then-callback adding 1, wait, checked;
 *   3. remote(make_ones(n)), to_here, sum checked, the RRef dropped, and the
 *      RRef passed back to its owner in a call (a fork to the owner);
 *   4. a distributed autograd context: y = scale(x) on the target, where
 *      scale multiplies by the target's one shared parameter w (every
 *      thread's graph meets at w's accumulation node), then loss = sum(y)
 *      backward; x's gradient must be w and w's x, in that context only;
 *   5. a local forward and backward on a tensor shared by all the threads
 *      of this worker (a shared leaf: the accumulation into its .grad).
 * At the end the shared leaf's gradient is checked against the exact count
 * of backward passes. Any wrong value or error: the program says which
 * worker, thread, round and step, and exits 1. Every wait is bounded (the
 * calls' timeouts, the graceful shutdown's). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <shmrpc/shmrpc.h>

#define LEN 4
#define CALL_TIMEOUT_S 120.0
#define W_VALUE 3.0

static int nthreads = 16, iters = 20;
static pthread_barrier_t start;
static sr_tensor *shared_leaf; /* this worker's, used by all its threads */

/* ---- the target's functions ---- */

static sr_tensor *w_param; /* the target's shared parameter, made before sr_init */

static int fn_add(sr_call *c)
{
    return sr_call_return(c, sr_int(sr_value_int(sr_call_arg(c, 0)) + sr_value_int(sr_call_arg(c, 1))));
}

static int fn_make_ones(sr_call *c)
{
    int64_t n = sr_value_int(sr_call_arg(c, 0));
    sr_tensor *t = sr_ones(SR_F32, 1, &n, 0);
    if (!t)
        return sr_call_fail(c, -EINVAL, "make_ones: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(t);
    sr_tensor_unref(t);
    return sr_call_return(c, v);
}

/* is_mine(rref): true when the RRef passed back to its owner is the owner's. */
static int fn_is_mine(sr_call *c)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    return sr_call_return(c, sr_bool(r && sr_rref_is_owner(r)));
}

static int fn_scale(sr_call *c)
{
    sr_tensor *y = sr_mul(sr_value_tensor(sr_call_arg(c, 0)), w_param);
    if (!y)
        return sr_call_fail(c, -EINVAL, "scale: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(y);
    sr_tensor_unref(y);
    return sr_call_return(c, v);
}

/* ---- the hammering threads ---- */

struct who {
    int rank, thread, round;
};

#define FAIL(w, step, ...)                                                                                     \
    (fprintf(stderr, "hammer: worker%d thread %d round %d, %s: ", (w)->rank, (w)->thread, (w)->round, step), \
     fprintf(stderr, __VA_ARGS__), fputc('\n', stderr), 1)

static int step_sync(struct who *w)
{
    sr_value *a = sr_int(w->round), *b = sr_int(w->thread), *out = NULL;
    int rc = sr_rpc_sync(0, "h_add", SR_ARGS(a, b), CALL_TIMEOUT_S, &out);
    int bad = rc ? FAIL(w, "rpc_sync add", "%s", sr_last_error())
                 : sr_value_int(out) != w->round + w->thread
                       ? FAIL(w, "rpc_sync add", "got %lld", (long long)sr_value_int(out))
                       : 0;
    sr_value_unref(a), sr_value_unref(b), sr_value_unref(out);
    return bad;
}

static int plus_one(sr_future *parent, void *arg, sr_value **result)
{
    (void)arg;
    sr_value *v = NULL;
    int rc = sr_future_wait(parent, &v);
    if (rc)
        return rc;
    *result = sr_int(sr_value_int(v) + 1);
    sr_value_unref(v);
    return 0;
}

static int step_async(struct who *w)
{
    sr_value *a = sr_int(w->round), *b = sr_int(w->thread), *out = NULL;
    sr_future *f = NULL, *g = NULL;
    int rc = sr_rpc_async(0, "h_add", SR_ARGS(a, b), CALL_TIMEOUT_S, &f);
    if (!rc)
        rc = sr_future_then(f, plus_one, NULL, &g);
    if (!rc)
        rc = sr_future_wait(g, &out);
    int bad = rc ? FAIL(w, "rpc_async add then +1", "%s", sr_last_error())
                 : sr_value_int(out) != w->round + w->thread + 1
                       ? FAIL(w, "rpc_async add then +1", "got %lld", (long long)sr_value_int(out))
                       : 0;
    sr_future_unref(f), sr_future_unref(g);
    sr_value_unref(a), sr_value_unref(b), sr_value_unref(out);
    return bad;
}

static double sum_of(sr_tensor *t)
{
    sr_tensor *s = sr_sum(t);
    double v = s ? sr_tensor_item(s) : -1;
    sr_tensor_unref(s);
    return v;
}

static int step_rref(struct who *w)
{
    int64_t n = 1 + (w->thread + w->round) % 7;
    sr_value *nv = sr_int(n), *got = NULL, *mine = NULL, *rv = NULL;
    sr_rref *r = NULL;
    int bad = 0;
    if (sr_remote(0, "h_make_ones", SR_ARGS(nv), CALL_TIMEOUT_S, &r) || sr_rref_to_here(r, CALL_TIMEOUT_S, &got))
        bad = FAIL(w, "remote make_ones, to_here", "%s", sr_last_error());
    else if (sum_of(sr_value_tensor(got)) != (double)n)
        bad = FAIL(w, "remote make_ones, to_here", "sum %g, expected %lld", sum_of(sr_value_tensor(got)),
                   (long long)n);
    else if (!(rv = sr_value_from_rref(r)) || sr_rpc_sync(0, "h_is_mine", SR_ARGS(rv), CALL_TIMEOUT_S, &mine))
        bad = FAIL(w, "the RRef passed back to its owner", "%s", sr_last_error());
    else if (!sr_value_bool(mine))
        bad = FAIL(w, "the RRef passed back to its owner", "the owner does not see its own RRef");
    sr_value_unref(nv), sr_value_unref(got), sr_value_unref(mine), sr_value_unref(rv);
    sr_rref_unref(r);
    return bad;
}

/* Every element of t equals v. */
static bool all_equal(const sr_tensor *t, double v)
{
    double got[LEN];
    if (!t || sr_tensor_to_f64(t, got, LEN))
        return false;
    for (int i = 0; i < LEN; i++)
        if (got[i] != v)
            return false;
    return true;
}

static int step_dist_autograd(struct who *w)
{
    int64_t shape = LEN, ctx = -1;
    float xv[LEN];
    for (int i = 0; i < LEN; i++)
        xv[i] = (float)(w->thread + 1);
    sr_tensor *x = sr_from_data(SR_F32, 1, &shape, xv, SR_REQUIRES_GRAD), *loss = NULL, *gx = NULL;
    sr_value *xv_ = x ? sr_value_from_tensor(x) : NULL, *y = NULL;
    int bad = 0;
    if (!x || sr_dist_autograd_context_begin(&ctx))
        bad = FAIL(w, "dist autograd context", "%s", sr_last_error());
    else if (sr_rpc_sync(0, "h_scale", SR_ARGS(xv_), CALL_TIMEOUT_S, &y) ||
             !(loss = sr_sum(sr_value_tensor(y))) || sr_dist_autograd_backward(ctx, &loss, 1, false) ||
             sr_dist_autograd_get_gradient(ctx, x, &gx))
        bad = FAIL(w, "dist autograd scale, backward", "%s", sr_last_error());
    else if (!all_equal(gx, W_VALUE))
        bad = FAIL(w, "dist autograd scale, backward", "x's gradient is not w (%g)", W_VALUE);
    else if (sr_tensor_grad(x))
        bad = FAIL(w, "dist autograd scale, backward", "x's .grad was written (it must stay in the context)");
    if (ctx >= 0 && sr_dist_autograd_context_end(ctx) && !bad)
        bad = FAIL(w, "dist autograd context end", "%s", sr_last_error());
    sr_tensor_unref(gx), sr_tensor_unref(loss), sr_tensor_unref(x);
    sr_value_unref(y), sr_value_unref(xv_);
    return bad;
}

/* loss = sum(shared_leaf * 2): each pass adds 2 to every element of its .grad. */
static int step_local_backward(struct who *w)
{
    sr_tensor *y = sr_mul_scalar(shared_leaf, 2.0), *loss = y ? sr_sum(y) : NULL;
    int bad = !loss || sr_backward(loss, false) ? FAIL(w, "local backward on the shared leaf", "%s",
                                                             sr_last_error())
                                                      : 0;
    sr_tensor_unref(loss), sr_tensor_unref(y);
    return bad;
}

static int (*const steps[])(struct who *) = {step_sync, step_async, step_rref, step_dist_autograd,
                                             step_local_backward};

static void *hammer(void *arg)
{
    struct who w = {sr_rank(), (int)(intptr_t)arg, 0};
    pthread_barrier_wait(&start);
    intptr_t bad = 0;
    for (; w.round < iters && !bad; w.round++)
        for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]) && !bad; s++)
            bad = steps[s](&w);
    return (void *)bad;
}

static int trainer(void)
{
    int64_t shape = LEN;
    shared_leaf = sr_zeros(SR_F64, 1, &shape, SR_REQUIRES_GRAD);
    pthread_t *t = calloc((size_t)nthreads, sizeof(*t));
    if (!shared_leaf || !t || pthread_barrier_init(&start, NULL, (unsigned)nthreads))
        return fprintf(stderr, "hammer: worker%d: setup failed\n", sr_rank()), 1;
    int started = 0, bad = 0;
    for (; started < nthreads; started++)
        if (pthread_create(&t[started], NULL, hammer, (void *)(intptr_t)started))
            break;
    if (started < nthreads) { /* the barrier would never open: say so and stop */
        fprintf(stderr, "hammer: worker%d: could only start %d of %d threads\n", sr_rank(), started, nthreads);
        exit(1);
    }
    for (int i = 0; i < nthreads; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad |= r != NULL;
    }
    /* Every thread that finished made `iters` local passes of 2 each. */
    if (!bad && !all_equal(sr_tensor_grad(shared_leaf), 2.0 * nthreads * iters)) {
        fprintf(stderr, "hammer: worker%d: the shared leaf's gradient is not %g (lost accumulations)\n", sr_rank(),
                2.0 * nthreads * iters);
        bad = 1;
    }
    pthread_barrier_destroy(&start);
    free(t);
    sr_tensor_unref(shared_leaf);
    return bad;
}

static int parse(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
        bool ok = end && *end == '\0' && v > 0 && v <= 256;
        if (!strcmp(argv[i], "--threads") && ok)
            nthreads = (int)v, i++;
        else if (!strcmp(argv[i], "--iters") && ok)
            iters = (int)v, i++;
        else
            return fprintf(stderr, "usage: shmrun -n N hammer [--threads 1..256] [--iters 1..256]\n"), 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int rc = parse(argc, argv);
    if (rc)
        return rc;
    int64_t shape = LEN;
    w_param = sr_full(SR_F32, 1, &shape, W_VALUE, SR_REQUIRES_GRAD);
    if (!w_param || sr_register("h_add", fn_add) || sr_register("h_make_ones", fn_make_ones) ||
        sr_register("h_is_mine", fn_is_mine) || sr_register("h_scale", fn_scale) || sr_init(NULL))
        return fprintf(stderr, "hammer: setup: %s\n", sr_last_error()), 1;
    rc = sr_rank() == 0 ? 0 : trainer();
    if (sr_shutdown(true, 600)) {
        fprintf(stderr, "hammer: worker%d: graceful shutdown: %s\n", sr_rank(), sr_last_error());
        rc = 1;
    }
    sr_tensor_unref(w_param);
    return rc;
}
