/* SPDX-License-Identifier: MIT */
/* Distributed autograd on 4 workers: context ids and their errors, simple
 * backward passes (without RPC, to another worker, to self, through
 * remote()), invalid roots, .grad left alone, gradients on returned tensors
 * only, RRef.backward, the context across then-callbacks, a pass that
 * reaches workers several times, parameters behind RRefs with a relaying
 * trainer (dist_optimizer_test's forward), a parameter server shared by
 * three trainers' contexts, the comparison with local autograd of PyTorch's
 * dist_autograd_test.py (round trips, tensor dims, unused tensors, chunks,
 * several roots, two dtypes; also with one executor thread per worker), the
 * nested UDF's numbers (3096, 2256), 1,000 retain_graph passes and leaf
 * hooks. Every job ends with nothing in flight anywhere. Also run under the
 * reordering mode (tests/meson.build). */
#include "dist_autograd_fns.h"

LEAK_CHECKED_SUITE(dist_autograd);

/* ---- context ids (test_autograd_context, test_nested_context) ---- */

static void *begin_in_thread(void *arg)
{
    int64_t *id = arg;
    if (sr_dist_autograd_context_begin(id))
        *id = -2;
    return NULL;
}

static int sc_context_ids(int rank, int world)
{
    (void)world;
    int64_t max = sr_dist_autograd_max_id();
    WCHECK(max == INT64_C(281474976710655) + ((int64_t)rank << 48), "max_id is %#llx", (unsigned long long)max);
    WCHECK(sr_dist_autograd_current_context() == SR_NO_CONTEXT, "a context is current before any began");
    enum { N = 200 };
    int64_t ids[N];
    for (int i = 0; i < N; i++) {
        CTX_BEGIN(ids[i]);
        WCHECK(ids[i] >> 48 == rank, "context id %#llx does not carry rank %d", (unsigned long long)ids[i], rank);
        WCHECK(i == 0 || ids[i] == ids[i - 1] + 1, "ids %#llx then %#llx are not consecutive",
               (unsigned long long)ids[i - 1], (unsigned long long)ids[i]);
        WCHECK(sr_dist_autograd_current_context() == ids[i], "current_context is not the new context");
        WCHECK(sr_dist_autograd_is_valid_context(ids[i]), "the new context is not valid");
        size_t n = 9;
        sr_dist_fn_info fi[2];
        WCHECK(sr_dist_autograd_functions(ids[i], true, fi, 2, &n) == 0 && n == 0,
               "a fresh context has %zu send functions: %s", n, sr_last_error());
        CTX_END(ids[i]);
        WCHECK(sr_dist_autograd_current_context() == SR_NO_CONTEXT, "the context stays current after its end");
    }
    char want[96];
    for (int i = 0; i < N; i++) {
        WCHECK(!sr_dist_autograd_is_valid_context(ids[i]), "context %d is still valid after its end", i);
        snprintf(want, sizeof(want), "Could not find autograd context with id: %lld", (long long)ids[i]);
        WEXPECT_ERR(sr_dist_autograd_context_end(ids[i]), -EINVAL, want);
    }
    snprintf(want, sizeof(want), "Could not find autograd context with id: %lld", (long long)ids[0]);
    size_t n = 0;
    sr_tensor **ts = NULL, **gs = NULL;
    WEXPECT_ERR(sr_dist_autograd_get_gradients(ids[0], &n, &ts, &gs), -EINVAL, want);
    WEXPECT_ERR(sr_dist_autograd_functions(ids[0], false, NULL, 0, &n), -EINVAL, want);
    WEXPECT_ERR(sr_dist_autograd_known_workers(ids[0], NULL, 0, &n), -EINVAL, want);

    /* Nested contexts are refused; the first stays current. */
    int64_t a, b = -7;
    CTX_BEGIN(a);
    WEXPECT_ERR(sr_dist_autograd_context_begin(&b), -EINVAL, "Already have an autograd context id for this thread");
    WCHECK(sr_dist_autograd_current_context() == a, "the refused nested begin changed the current context");

    /* The current context is per thread: another thread may begin its own. */
    int64_t other = -1;
    pthread_t th;
    WCHECK(pthread_create(&th, NULL, begin_in_thread, &other) == 0, "pthread_create");
    pthread_join(th, NULL);
    WCHECK(other >= 0 && other != a && other >> 48 == rank, "a second thread could not begin a context: %lld",
           (long long)other);
    WCHECK(sr_dist_autograd_current_context() == a, "another thread's context became current here");
    WCHECK(sr_dist_autograd_is_valid_context(other), "another thread's context is not valid here");
    CTX_END(other); /* any thread may end it; ours stays current */
    WCHECK(sr_dist_autograd_current_context() == a, "ending another thread's context changed ours");
    CTX_END(a);
    sr_dist_autograd_debug_info d;
    WCHECK(sr_dist_autograd_debug_info_get(&d) == 0 && d.num_autograd_contexts == 0 &&
               d.num_current_backward_passes == 0,
           "debug info after every context ended: %llu contexts, %llu passes",
           (unsigned long long)d.num_autograd_contexts, (unsigned long long)d.num_current_backward_passes);
    return 0;
}

Test(dist_autograd, context_ids_and_nesting, .timeout = 120)
{
    DA_JOB("dactx", sc_context_ids);
}

/* ---- simple backward (test_backward_simple, _self, _without_rpc, _python_udf) ---- */

static int simple_pass(enum mode m, int dst, const char *fn)
{
    char what[96];
    snprintf(what, sizeof(what), "%s %s to worker%d", mode_name[m], fn, dst);
    int64_t ctx;
    sr_tensor *t1 = t_rand(3, 3, true), *t2 = t_rand(3, 3, true);
    CTX_BEGIN(ctx);
    sr_tensor *ret = op_mode(m, dst, fn, t1, t2);
    WCHECK(ret, "%s: %s", what, sr_last_error());
    WCHECK(sr_tensor_requires_grad(ret), "%s: the result does not require grad", what);
    sr_tensor *loss = sr_sum(ret);
    if (da_backward(ctx, &loss, 1, false, what) || expect_num_grads(ctx, 2, what) ||
        expect_grad_all(ctx, t1, 1, what) || expect_grad_all(ctx, t2, 1, what))
        return 1;
    WCHECK(!sr_tensor_grad(t1) && !sr_tensor_grad(t2), "%s: distributed backward filled .grad", what);
    /* get_gradients: exactly the two leaves themselves, each with its gradient. */
    size_t n = 0;
    sr_tensor **ts = NULL, **gs = NULL;
    WCHECK(sr_dist_autograd_get_gradients(ctx, &n, &ts, &gs) == 0 && n == 2, "%s: get_gradients: %zu: %s", what, n,
           sr_last_error());
    WCHECK((ts[0] == t1 && ts[1] == t2) || (ts[0] == t2 && ts[1] == t1), "%s: the map's keys are not t1 and t2", what);
    if (expect_all(gs[0], 1, what) || expect_all(gs[1], 1, what))
        return 1;
    CTX_END(ctx);
    /* The gradients handed out outlive the context. */
    if (expect_all(gs[0], 1, "a gradient after its context ended"))
        return 1;
    sr_dist_autograd_gradients_free(n, ts, gs);
    sr_tensor *all[] = {t1, t2, ret, loss};
    unref_tensors(all, 4);
    return 0;
}

static int sc_backward_simple(int rank, int world)
{
    sr_manual_seed(100 + (uint64_t)rank);
    if (simple_pass(LOCAL, rank, "add"))
        return 1;
    for (int m = RPC_SYNC; m <= REMOTE; m++)
        if (simple_pass((enum mode)m, (rank + 1) % world, "add") ||
            simple_pass((enum mode)m, (rank + 1) % world, "py_add"))
            return 1;
    return 0;
}

Test(dist_autograd, backward_simple_without_rpc_and_to_another_worker, .timeout = 120)
{
    DA_JOB("dasimple", sc_backward_simple);
}

/* test_backward_simple_self: the caller's and the callee's functions are in
 * one context, on one worker. */
static int sc_backward_self(int rank, int world)
{
    (void)world;
    sr_manual_seed(200 + (uint64_t)rank);
    for (int m = RPC_SYNC; m <= REMOTE; m++)
        if (simple_pass((enum mode)m, rank, "add") || simple_pass((enum mode)m, rank, "py_add"))
            return 1;
    return 0;
}

Test(dist_autograd, backward_simple_through_a_call_to_self, .timeout = 120)
{
    DA_JOB("daself", sc_backward_self);
}

/* ---- invalid roots (test_backward_invalid_args) and .grad (test_backward_no_grad_on_tensor) ---- */

static int sc_invalid_roots(int rank, int world)
{
    int64_t ctx;
    CTX_BEGIN(ctx);
    WEXPECT_ERR(sr_dist_autograd_backward(ctx, NULL, 0, false), -EINVAL, "No tensors provided for gradient computation");
    sr_tensor *nograd = t_rand(3, 3, false), *s = sr_sum(nograd);
    WEXPECT_ERR(sr_dist_autograd_backward(ctx, &s, 1, false), -EINVAL, "requires_grad not set on");
    sr_tensor *matrix = t_rand(3, 3, true);
    sr_tensor *sq = sr_mul(matrix, matrix);
    WEXPECT_ERR(sr_dist_autograd_backward(ctx, &sq, 1, false), -EINVAL, "is not a scalar, all roots need to be scalar");
    sr_tensor *leaf = sr_rand(SR_F64, 1, DSHAPE(1), SR_REQUIRES_GRAD);
    WEXPECT_ERR(sr_dist_autograd_backward(ctx, &leaf, 1, false), -EINVAL, "does not have a valid gradient function");
    sr_tensor *ok = sr_sum(sq);
    WEXPECT_ERR(sr_dist_autograd_backward(100, &ok, 1, false), -EINVAL, "Could not find autograd context with id: 100");
    /* A valid root after the refusals still works. */
    if (da_backward(ctx, &ok, 1, false, "after invalid roots") ||
        expect_num_grads(ctx, 1, "after invalid roots"))
        return 1;
    CTX_END(ctx);
    sr_tensor *all[] = {nograd, s, matrix, sq, leaf, ok};
    unref_tensors(all, 6);

    /* .grad is never touched by a distributed pass, before or after a local one. */
    sr_tensor *t1 = t_rand(3, 3, true), *t2 = t_rand(3, 3, true);
    CTX_BEGIN(ctx);
    sr_tensor *ret = op_mode(RPC_SYNC, (rank + 1) % world, "add", t1, t2), *loss = sr_sum(ret);
    WCHECK(ret, "add: %s", sr_last_error());
    if (da_backward(ctx, &loss, 1, true, "first pass"))
        return 1;
    WCHECK(!sr_tensor_grad(t1) && !sr_tensor_grad(t2), "a distributed pass filled .grad");
    sr_tensor *local = sr_add(t1, t2), *local_loss = sr_sum(local);
    WCHECK(sr_backward(local_loss, false) == 0, "local backward: %s", sr_last_error());
    sr_tensor *g1 = sr_tensor_ref(sr_tensor_grad(t1)), *g2 = sr_tensor_ref(sr_tensor_grad(t2));
    if (expect_all(g1, 1, "local t1.grad") || expect_all(g2, 1, "local t2.grad") ||
        da_backward(ctx, &loss, 1, false, "second pass"))
        return 1;
    WCHECK(sr_tensor_grad(t1) == g1 && sr_tensor_grad(t2) == g2, "the distributed pass replaced .grad");
    if (expect_all(sr_tensor_grad(t1), 1, "t1.grad after the distributed pass") ||
        expect_grad_all(ctx, t1, 2, "two distributed passes accumulate in the context"))
        return 1;
    CTX_END(ctx);
    sr_tensor *more[] = {t1, t2, ret, loss, local, local_loss, g1, g2};
    unref_tensors(more, 8);
    return 0;
}

Test(dist_autograd, invalid_roots_and_grad_untouched, .timeout = 120)
{
    DA_JOB("dainval", sc_invalid_roots);
}

/* ---- test_grad_only_on_return_value and test_mixed_requires_grad ---- */

static int sc_return_value_and_mixed(int rank, int world)
{
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    for (int m = RPC_SYNC; m <= REMOTE; m++) {
        int64_t ctx, prev_ctx;
        CTX_BEGIN(ctx);
        sr_value *v = call_mode((enum mode)m, next, "ret_rg", SR_NOARGS);
        sr_tensor *ret = take_tensor(v), *loss = ret ? sr_sum(ret) : NULL;
        WCHECK(ret && sr_tensor_requires_grad(ret), "%s ret_rg: %s", mode_name[m], sr_last_error());
        if (da_backward(ctx, &loss, 1, false, mode_name[m]) || expect_num_grads(ctx, 0, "the caller has no leaf") ||
            send_note(next, m, ctx) || wait_note(m, prev, &prev_ctx))
            return 1;
        /* In the previous worker's context, here: exactly our global tensor, ones. */
        sr_value *iv = sr_int(prev_ctx), *gg = NULL;
        WCHECK(noctx_rpc(rank, "global_grads", SR_ARGS(iv), &gg) == 0, "global_grads: %s", sr_last_error());
        WCHECK(sr_value_int(sr_value_list_at(gg, 0)) == 1, "%s: %lld gradients in worker%d's context here, want 1",
               mode_name[m], (long long)sr_value_int(sr_value_list_at(gg, 0)), prev);
        if (expect_all(sr_value_tensor(sr_value_list_at(gg, 1)), 1, "the returned tensor's gradient"))
            return 1;
        sr_value_unref(iv);
        sr_value_unref(gg);
        if (da_barrier()) /* no context ends before every worker has looked at it */
            return 1;
        CTX_END(ctx);
        sr_tensor_unref(ret);
        sr_tensor_unref(loss);
    }
    for (int m = LOCAL; m <= REMOTE; m++) {
        int64_t ctx;
        sr_tensor *t1 = t_rand(3, 3, true), *t2 = t_rand(3, 3, false), *g = NULL;
        CTX_BEGIN(ctx);
        sr_tensor *ret = op_mode((enum mode)m, next, "mixed_op", t1, t2), *loss = ret ? sr_sum(ret) : NULL;
        WCHECK(ret, "%s mixed_op: %s", mode_name[m], sr_last_error());
        if (da_backward(ctx, &loss, 1, false, "mixed requires_grad") || expect_num_grads(ctx, 1, "mixed"))
            return 1;
        WCHECK(sr_dist_autograd_get_gradient(ctx, t1, &g) == 0, "no gradient for t1: %s", sr_last_error());
        if (expect_same(g, t2, 0, "grad t1 == t2"))
            return 1;
        sr_tensor_unref(g);
        g = NULL;
        WCHECK(sr_dist_autograd_get_gradient(ctx, t2, &g) == -ENOENT && !g, "t2 (no requires_grad) has a gradient");
        CTX_END(ctx);
        sr_tensor *all[] = {t1, t2, ret, loss};
        unref_tensors(all, 4);
    }
    return 0;
}

Test(dist_autograd, gradient_only_on_return_value_and_mixed_requires_grad, .timeout = 120)
{
    DA_JOB("daretval", sc_return_value_and_mixed);
}

/* ---- RRef.backward (test_owner_rref_backward, test_user_rref_backward) ---- */

static int sc_rref_backward(int rank, int world)
{
    int next = (rank + 1) % world;
    /* Owner, local: into .grad. */
    sr_tensor *t1 = t_full(10, 10, 1, true), *s1 = sr_sum(t1), *s2 = sr_sum(t1), *s = sr_add(s1, s2);
    sr_value *sv = tv(s);
    sr_rref *own = NULL;
    WCHECK(sr_rref_create(sv, &own) == 0, "rref_create: %s", sr_last_error());
    WCHECK(sr_rref_backward(own, SR_NO_CONTEXT, false) == 0, "owner local backward: %s", sr_last_error());
    if (expect_all(sr_tensor_grad(t1), 2, "owner local backward: t1.grad"))
        return 1;
    WEXPECT_ERR(sr_rref_backward(own, 100, false), -EINVAL, "Could not find autograd context with id: 100");
    sr_rref_unref(own);
    sr_value_unref(sv);

    /* Values that cannot be backward roots. */
    sr_value *three = sr_int(3), *mv = tv(t1);
    WCHECK(sr_rref_create(three, &own) == 0, "rref_create: %s", sr_last_error());
    WEXPECT_ERR(sr_rref_backward(own, SR_NO_CONTEXT, false), -EINVAL, "RRef should contain a tensor for .backward()");
    sr_rref_unref(own);
    WCHECK(sr_rref_create(mv, &own) == 0, "rref_create: %s", sr_last_error());
    WEXPECT_ERR(sr_rref_backward(own, SR_NO_CONTEXT, false), -EINVAL,
                "grad can be implicitly created only for scalar outputs");
    sr_rref_unref(own);
    sr_tensor *plain = sr_scalar_tensor(SR_F64, 1, 0);
    sr_value *pv = tv(plain);
    WCHECK(sr_rref_create(pv, &own) == 0, "rref_create: %s", sr_last_error());
    WEXPECT_ERR(sr_rref_backward(own, SR_NO_CONTEXT, false), -EINVAL,
                "does not require grad and does not have a grad_fn");
    sr_rref_unref(own);
    sr_value *vs[] = {three, mv, pv};
    unref_values(vs, 3);

    /* Owner, distributed: t2 = add(t1, t1) elsewhere; two passes with retain_graph. */
    int64_t ctx;
    CTX_BEGIN(ctx);
    sr_tensor *t2 = op_mode(RPC_SYNC, next, "add", t1, t1), *st2 = t2 ? sr_sum(t2) : NULL;
    WCHECK(t2, "add: %s", sr_last_error());
    sr_value *st2v = tv(st2);
    WCHECK(sr_rref_create(st2v, &own) == 0, "rref_create: %s", sr_last_error());
    WCHECK(sr_rref_backward(own, ctx, true) == 0, "owner distributed backward: %s", sr_last_error());
    if (expect_grad_all(ctx, t1, 2, "owner distributed backward"))
        return 1;
    WCHECK(sr_rref_backward(own, ctx, true) == 0, "second owner backward: %s", sr_last_error());
    if (expect_grad_all(ctx, t1, 4, "two owner distributed passes") ||
        expect_all(sr_tensor_grad(t1), 2, "t1.grad is left as the local pass made it"))
        return 1;
    sr_rref_unref(own);
    sr_value_unref(st2v);
    CTX_END(ctx);

    /* User: remote(next, sum, t); two passes on the owner, in our context. */
    sr_tensor *t = sr_rand(SR_F64, 1, DSHAPE(10), SR_REQUIRES_GRAD);
    sr_value *tvv = tv(t);
    sr_rref *user = NULL;
    CTX_BEGIN(ctx);
    WCHECK(sr_remote(next, "sum", SR_ARGS(tvv), WAIT_S, &user) == 0, "remote sum: %s", sr_last_error());
    WEXPECT_ERR(sr_rref_backward(user, SR_NO_CONTEXT, false), -EINVAL,
                "User RRefs require 'dist_autograd_ctx_id' to be specified");
    WCHECK(sr_rref_backward(user, ctx, true) == 0, "user backward: %s", sr_last_error());
    WCHECK(sr_rref_backward(user, ctx, false) == 0, "second user backward: %s", sr_last_error());
    if (expect_grad_all(ctx, t, 2, "two user passes") || expect_num_grads(ctx, 1, "user passes"))
        return 1;
    WCHECK(!sr_tensor_grad(t), "a user RRef's backward filled .grad");
    sr_rref_unref(user);
    CTX_END(ctx);

    /* User, nested: the value was made two workers away (t*2 then *3, summed). */
    CTX_BEGIN(ctx);
    sr_value *h = sr_int(1), *f = sr_int(CHAIN_SUM), *o = sr_int(rank);
    WCHECK(sr_remote(next, "hop_scale", SR_ARGS(tvv, h, f, o), WAIT_S, &user) == 0, "remote: %s", sr_last_error());
    WCHECK(sr_rref_backward(user, ctx, false) == 0, "nested user backward: %s", sr_last_error());
    if (expect_grad_all(ctx, t, 6, "nested user backward"))
        return 1;
    sr_rref_unref(user);
    CTX_END(ctx);

    /* A user RRef made outside the context, whose owner never saw it: the
     * owner cannot find the context (PyTorch raises the same). */
    sr_tensor *one = sr_scalar_tensor(SR_F64, 2, SR_REQUIRES_GRAD);
    sr_value *onev = tv(one);
    WCHECK(sr_remote(next, "sum", SR_ARGS(onev), WAIT_S, &user) == 0, "remote: %s", sr_last_error());
    WCHECK(wait_confirmed(user) == 0, "the user RRef was not confirmed");
    CTX_BEGIN(ctx);
    char want[96];
    snprintf(want, sizeof(want), "Could not find autograd context with id: %lld", (long long)ctx);
    int brc = sr_rref_backward(user, ctx, false);
    WCHECK(brc < 0 && strstr(sr_last_error(), want), "RRef.backward in a context its owner never saw gave %d: %s",
           brc, sr_last_error());
    CTX_END(ctx);
    sr_rref_unref(user);
    sr_value_unref(onev);
    sr_tensor_unref(one);

    /* Several users at once: workers 1-3 each run RRef.backward on worker0. */
    if (da_barrier())
        return 1;
    if (rank != 0) {
        sr_value *h0 = sr_int(0);
        CTX_BEGIN(ctx);
        WCHECK(sr_remote(0, "hop_scale", SR_ARGS(tvv, h0, f, o), WAIT_S, &user) == 0, "remote: %s", sr_last_error());
        WCHECK(sr_rref_backward(user, ctx, true) == 0 && sr_rref_backward(user, ctx, false) == 0,
               "RRef.backward on worker0 from worker%d: %s", rank, sr_last_error());
        if (expect_grad_all(ctx, t, 6, "two passes of t*3 summed, on worker0"))
            return 1;
        sr_rref_unref(user);
        CTX_END(ctx);
        sr_value_unref(h0);
    }
    sr_value *more[] = {tvv, h, f, o};
    unref_values(more, 4);
    sr_tensor *all[] = {t1, s1, s2, s, plain, t2, st2, t};
    unref_tensors(all, 8);
    return 0;
}

Test(dist_autograd, rref_backward_owner_user_and_errors, .timeout = 120)
{
    DA_JOB("darrefbw", sc_rref_backward);
}

/* ---- test_backward_rref, _nested, _multi ---- */

static int rref_pass(int callee, int owner, const char *what)
{
    int64_t ctx;
    CTX_BEGIN(ctx);
    sr_value *three = sr_int(3), *ov = sr_int(owner), *v = NULL;
    sr_rref *rt1 = NULL, *res = NULL;
    WCHECK(sr_remote(owner, "ones_rg", SR_ARGS(three, three), WAIT_S, &rt1) == 0, "%s: remote: %s", what,
           sr_last_error());
    sr_tensor *t2 = t_full(3, 3, 0, true);
    sr_value *rv = sr_value_from_rref(rt1), *t2v = tv(t2);
    int rc = callee == owner ? sr_remote(callee, "rref_add", SR_ARGS(rv, t2v), WAIT_S, &res)
                             : sr_remote(callee, "nested_rref_add", SR_ARGS(ov, rv, t2v), WAIT_S, &res);
    WCHECK(rc == 0, "%s: remote: %s", what, sr_last_error());
    WCHECK(sr_rref_to_here(res, WAIT_S, &v) == 0, "%s: to_here: %s", what, sr_last_error());
    sr_tensor *ret = take_tensor(v), *loss = ret ? sr_sum(ret) : NULL;
    if (da_backward(ctx, &loss, 1, false, what) || expect_grad_all(ctx, t2, 1, what))
        return 1;
    sr_value *cv = sr_int(ctx), *g = NULL;
    WCHECK(noctx_rpc(owner, "owner_grad", SR_ARGS(cv, rv), &g) == 0, "%s: owner_grad: %s", what, sr_last_error());
    if (expect_all(sr_value_tensor(g), 1, "the owner's gradient of the RRef's value"))
        return 1;
    CTX_END(ctx);
    sr_value *vs[] = {three, ov, rv, t2v, cv, g};
    unref_values(vs, 6);
    sr_rref_unref(rt1);
    sr_rref_unref(res);
    sr_tensor *all[] = {t2, ret, loss};
    unref_tensors(all, 3);
    return 0;
}

static int sc_backward_rref(int rank, int world)
{
    int next = (rank + 1) % world;
    if (rref_pass(next, next, "callee is the owner") ||
        rref_pass(next, (rank + 2) % world, "nested: the callee calls the owner") || da_barrier())
        return 1;
    if (rank != 0 && rref_pass(0, 0, "ranks 1-3 at once on worker0"))
        return 1;
    return 0;
}

Test(dist_autograd, backward_through_rrefs, .timeout = 120)
{
    DA_JOB("darref", sc_backward_rref);
}

/* ---- the context follows continuations (test_thread_local_context_id) ---- */

struct cont {
    int64_t seen; /* current_context inside the callback */
};

static int sum_in_callback(sr_future *parent, void *arg, sr_value **result)
{
    struct cont *k = arg;
    k->seen = sr_dist_autograd_current_context();
    sr_value *v = NULL;
    int rc = sr_future_value(parent, &v);
    if (rc)
        return rc;
    sr_tensor *s = sr_sum(sr_value_tensor(v));
    sr_value_unref(v);
    if (!s)
        return sr_errorf(-EINVAL, "sum in callback: %s", sr_last_error());
    *result = tv(s);
    sr_tensor_unref(s);
    return 0;
}

static int sc_continuations(int rank, int world)
{
    int next = (rank + 1) % world;
    /* A then-callback of an rpc_async made in a context runs with that
     * context current, on whatever thread completes the future, and what it
     * computes is part of the graph. */
    for (int i = 0; i < 20; i++) {
        int64_t ctx;
        struct cont k = {.seen = -7};
        sr_tensor *t1 = t_rand(3, 3, true), *t2 = t_rand(3, 3, true);
        sr_value *a = tv(t1), *b = tv(t2), *out = NULL;
        sr_future *f = NULL, *child = NULL;
        CTX_BEGIN(ctx);
        WCHECK(sr_rpc_async(next, "gate_add", SR_ARGS(a, b), WAIT_S, &f) == 0, "rpc_async: %s", sr_last_error());
        WCHECK(sr_future_then(f, sum_in_callback, &k, &child) == 0, "then: %s", sr_last_error());
        WCHECK(!sr_future_done(f), "the gated call finished before its gate opened");
        sem_post(&dash->gate[next]); /* the callback runs when the answer arrives, not here */
        WCHECK(sr_future_wait(child, &out) == 0, "the callback failed: %s", sr_last_error());
        WCHECK(k.seen == ctx, "round %d: current_context in the callback is %lld, want %lld", i, (long long)k.seen,
               (long long)ctx);
        sr_tensor *loss = sr_value_tensor(out);
        if (da_backward(ctx, &loss, 1, false, "through a callback") || expect_grad_all(ctx, t1, 1, "callback t1") ||
            expect_grad_all(ctx, t2, 1, "callback t2"))
            return 1;
        CTX_END(ctx);
        sr_future_unref(f);
        sr_future_unref(child);
        sr_value *vs[] = {a, b, out};
        unref_values(vs, 3);
        sr_tensor_unref(t1);
        sr_tensor_unref(t2);
    }
    /* An RRef made outside any context, fetched inside one: the owner's
     * value (a leaf there) gets its gradient in that context on the owner. */
    sr_value *three = sr_int(3), *v = NULL, *g = NULL;
    sr_rref *r = NULL;
    WCHECK(sr_remote(next, "ones_rg", SR_ARGS(three, three), WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    int64_t ctx;
    CTX_BEGIN(ctx);
    WCHECK(sr_rref_to_here(r, WAIT_S, &v) == 0, "to_here: %s", sr_last_error());
    sr_tensor *loss = sr_sum(sr_value_tensor(v));
    if (da_backward(ctx, &loss, 1, false, "an RRef made outside the context"))
        return 1;
    sr_value *cv = sr_int(ctx), *rv = sr_value_from_rref(r);
    WCHECK(noctx_rpc(next, "owner_grad", SR_ARGS(cv, rv), &g) == 0, "owner_grad: %s", sr_last_error());
    if (expect_all(sr_value_tensor(g), 1, "the owner's leaf, in our context"))
        return 1;
    CTX_END(ctx);
    sr_value *vs[] = {three, v, g, cv, rv};
    unref_values(vs, 5);
    sr_tensor_unref(loss);
    sr_rref_unref(r);
    return 0;
}

Test(dist_autograd, context_follows_callbacks_and_rrefs_made_outside_it, .timeout = 120)
{
    DA_JOB("dacont", sc_continuations);
}

/* A backward pass run inside a then-callback on the progress thread: the
 * pass's incoming requests are read by that thread's nested wait, and the
 * module jobs they make must reach an executor. Before the fix the waiting
 * progress thread kept them for itself (sr__module_wait asks the waiter to
 * run them) and never ran them: the pass hung until its RPCs timed out. */
struct bw_cb {
    int64_t ctx;
    int rc;
    char err[256];
    sem_t done; /* posted by the callback: the main thread waits without polling */
};

static int backward_in_callback(sr_future *parent, void *arg, sr_value **result)
{
    struct bw_cb *k = arg;
    sr_value *v = NULL;
    k->rc = sr_future_value(parent, &v);
    sr_tensor *loss = k->rc ? NULL : sr_sum(sr_value_tensor(v));
    if (!k->rc)
        k->rc = loss ? sr_dist_autograd_backward(k->ctx, &loss, 1, false) : -ENOMEM;
    snprintf(k->err, sizeof(k->err), "%s", k->rc ? sr_last_error() : "");
    sr_tensor_unref(loss);
    sr_value_unref(v);
    sem_post(&k->done);
    *result = NULL;
    return k->rc;
}

static int sc_backward_on_progress(int rank, int world)
{
    if (rank != 0)
        return 0;
    int next = (rank + 1) % world;
    struct bw_cb k = {0};
    WCHECK(sem_init(&k.done, 0, 0) == 0, "sem_init");
    sr_tensor *t1 = t_rand(3, 3, true), *t2 = t_rand(3, 3, true);
    sr_value *a = tv(t1), *b = tv(t2);
    sr_future *f = NULL, *child = NULL;
    CTX_BEGIN(k.ctx);
    WCHECK(sr_rpc_async(next, "gate_add", SR_ARGS(a, b), WAIT_S, &f) == 0, "rpc_async: %s", sr_last_error());
    WCHECK(sr_future_then(f, backward_in_callback, &k, &child) == 0, "then: %s", sr_last_error());
    sem_post(&dash->gate[next]); /* the answer arrives while this thread does not poll */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += (time_t)WAIT_S;
    int rc;
    while ((rc = sem_timedwait(&k.done, &dl)) && errno == EINTR)
        ;
    WCHECK(rc == 0, "the backward pass in a callback on the progress thread did not end within %g s", (double)WAIT_S);
    WCHECK(k.rc == 0, "backward in a callback: %d: %s", k.rc, k.err);
    if (expect_grad_all(k.ctx, t1, 1, "backward in a callback, t1") ||
        expect_grad_all(k.ctx, t2, 1, "backward in a callback, t2"))
        return 1;
    WCHECK(sr_future_wait(child, NULL) == 0, "the callback's future: %s", sr_last_error());
    CTX_END(k.ctx);
    sr_future_unref(f);
    sr_future_unref(child);
    sr_value *vs[] = {a, b};
    unref_values(vs, 2);
    sr_tensor_unref(t1);
    sr_tensor_unref(t2);
    sem_destroy(&k.done);
    return 0;
}

Test(dist_autograd, backward_inside_a_callback_on_the_progress_thread, .timeout = 120)
{
    DA_JOB("daprog", sc_backward_on_progress);
}

/* ---- a pass that reaches the same workers several times ---- */

/* bounce(t, hops, other): t*2 sent back and forth between this worker and
 * other while hops > 0; the last returns t*3. */
static int fn_bounce(sr_call *c)
{
    int64_t hops = sr_value_int(sr_call_arg(c, 1));
    sr_tensor *t = sr_value_tensor(sr_call_arg(c, 0)), *r = NULL;
    if (hops == 0) {
        r = sr_mul_scalar(t, 3);
    } else {
        sr_tensor *t2 = sr_mul_scalar(t, 2);
        sr_value *a = tv(t2), *h = sr_int(hops - 1), *me = sr_int(sr_rank()), *v = NULL;
        int rc = sr_rpc_sync((int)sr_value_int(sr_call_arg(c, 2)), "bounce", SR_ARGS(a, h, me), WAIT_S, &v);
        sr_value *vs[] = {a, h, me};
        unref_values(vs, 3);
        sr_tensor_unref(t2);
        if (rc)
            return sr_call_fail(c, rc, "bounce: %s", sr_last_error());
        r = take_tensor(v);
    }
    if (!r)
        return sr_call_fail(c, -EINVAL, "bounce: %s", sr_last_error());
    sr_value *v = tv(r);
    sr_tensor_unref(r);
    return sr_call_return(c, v);
}

static int sc_revisits(int rank, int world)
{
    int a = (rank + 1) % world, b = (rank + 2) % world;
    for (int hops = 1; hops <= 6; hops++) {
        char what[96];
        int64_t ctx;
        sr_tensor *t = t_rand(3, 3, true);
        sr_value *tvv = tv(t), *h = sr_int(hops), *bv = sr_int(b), *v = NULL;
        CTX_BEGIN(ctx);
        /* between two other workers, then around the ring through ourselves */
        snprintf(what, sizeof(what), "bounce %d times between worker%d and worker%d", hops, a, b);
        WCHECK(sr_rpc_sync(a, "bounce", SR_ARGS(tvv, h, bv), WAIT_S, &v) == 0, "%s: %s", what, sr_last_error());
        sr_tensor *y = take_tensor(v), *ring = chain(RPC_SYNC, a, t, hops + 2, 0);
        WCHECK(ring, "ring of %d hops: %s", hops + 2, sr_last_error());
        sr_tensor *l1 = sr_sum(y), *l2 = sr_sum(ring);
        if (da_backward(ctx, (sr_tensor *[]){l1, l2}, 2, false, what) ||
            expect_grad_all(ctx, t, 3.0 * (1 << hops) + 3.0 * (1 << (hops + 2)), what))
            return 1;
        CTX_END(ctx);
        sr_value *vs[] = {tvv, h, bv};
        unref_values(vs, 3);
        sr_tensor *all[] = {t, y, ring, l1, l2};
        unref_tensors(all, 5);
    }
    return 0;
}

static void register_revisit_fns(void)
{
    register_da_fns();
    sr_register("bounce", fn_bounce);
}

Test(dist_autograd, pass_reaching_workers_several_times, .timeout = 120)
{
    DA_JOB_FNS("darevisit", sc_revisits, register_revisit_fns);
}

/* ---- dist_optimizer_test's forward: parameters behind RRefs, the trainer relays ---- */

static sr_tensor *param_matrix(int64_t seed, bool rg)
{
    double v[9];
    for (int i = 0; i < 9; i++)
        v[i] = (double)((i * 7 + seed * 3) % 5) - 2;
    return sr_from_data(SR_F64, 2, DSHAPE(3, 3), v, rg ? SR_REQUIRES_GRAD : 0);
}

/* param(seed): a 3x3 parameter (a leaf that requires grad), kept by remote(). */
static int fn_param(sr_call *c)
{
    sr_tensor *w = param_matrix(sr_value_int(sr_call_arg(c, 0)), true);
    sr_value *v = tv(w);
    sr_tensor_unref(w);
    return sr_call_return(c, v);
}

/* forward(rref_w, x): w @ x on w's owner (MyModule.forward). */
static int fn_forward_mm(sr_call *c)
{
    sr_value *hold;
    sr_tensor *w = rref_tensor(sr_call_arg(c, 0), &hold);
    sr_tensor *r = w ? sr_matmul(w, sr_value_tensor(sr_call_arg(c, 1))) : NULL;
    sr_value_unref(hold);
    if (!r)
        return sr_call_fail(c, -EINVAL, "forward: %s", sr_last_error());
    sr_value *v = tv(r);
    sr_tensor_unref(r);
    return sr_call_return(c, v);
}

static int sc_relay(int rank, int world)
{
    int o1 = (rank + 1) % world, o2 = (rank + 2) % world;
    sr_value *s1 = sr_int(10 + rank), *s2 = sr_int(20 + rank), *out1 = NULL, *out2 = NULL;
    sr_rref *p1 = NULL, *p2 = NULL;
    WCHECK(sr_remote(o1, "param", SR_ARGS(s1), WAIT_S, &p1) == 0 && sr_remote(o2, "param", SR_ARGS(s2), WAIT_S, &p2) == 0,
           "remote param: %s", sr_last_error());
    sr_value *r1 = sr_value_from_rref(p1), *r2 = sr_value_from_rref(p2);
    sr_tensor *t1 = t_rand(3, 3, true), *t2 = t_rand(3, 3, true);
    /* The same, locally. */
    sr_tensor *w1 = param_matrix(10 + rank, true), *w2 = param_matrix(20 + rank, true);
    sr_tensor *l1 = leaf_copy(t1, true), *l2 = leaf_copy(t2, true);
    sr_tensor *a = sr_matmul(w1, l2), *b = sr_matmul(w2, a), *c = sr_add(b, l1), *ls = sr_sum(c);
    WCHECK(sr_backward(ls, false) == 0, "local: %s", sr_last_error());
    int64_t ctx;
    CTX_BEGIN(ctx);
    sr_value *t2v = tv(t2);
    sr_future *f = NULL;
    WCHECK(sr_rpc_async(o1, "forward_mm", SR_ARGS(r1, t2v), WAIT_S, &f) == 0 && sr_future_wait(f, &out1) == 0,
           "forward 1: %s", sr_last_error());
    sr_future_unref(f);
    WCHECK(sr_rpc_async(o2, "forward_mm", SR_ARGS(r2, out1), WAIT_S, &f) == 0 && sr_future_wait(f, &out2) == 0,
           "forward 2: %s", sr_last_error());
    sr_future_unref(f);
    sr_tensor *sum = sr_add(sr_value_tensor(out2), t1), *loss = sr_sum(sum);
    if (da_backward(ctx, &loss, 1, false, "the trainer relays"))
        return 1;
    sr_tensor *g = NULL;
    WCHECK(sr_dist_autograd_get_gradient(ctx, t1, &g) == 0, "t1: %s", sr_last_error());
    if (expect_same(g, sr_tensor_grad(l1), 1e-12, "grad t1"))
        return 1;
    sr_tensor_unref(g);
    WCHECK(sr_dist_autograd_get_gradient(ctx, t2, &g) == 0, "t2: %s", sr_last_error());
    if (expect_same(g, sr_tensor_grad(l2), 1e-12, "grad t2"))
        return 1;
    sr_tensor_unref(g);
    sr_value *cv = sr_int(ctx), *gv = NULL;
    WCHECK(noctx_rpc(o1, "owner_grad", SR_ARGS(cv, r1), &gv) == 0, "owner_grad 1: %s", sr_last_error());
    if (expect_same(sr_value_tensor(gv), sr_tensor_grad(w1), 1e-12, "G1 = W2^T J t2^T on its owner"))
        return 1;
    sr_value_unref(gv);
    WCHECK(noctx_rpc(o2, "owner_grad", SR_ARGS(cv, r2), &gv) == 0, "owner_grad 2: %s", sr_last_error());
    if (expect_same(sr_value_tensor(gv), sr_tensor_grad(w2), 1e-12, "G2 = J (W1 t2)^T on its owner"))
        return 1;
    sr_value_unref(gv);
    CTX_END(ctx);
    sr_value *vs[] = {s1, s2, out1, out2, r1, r2, t2v, cv};
    unref_values(vs, 8);
    sr_rref_unref(p1);
    sr_rref_unref(p2);
    sr_tensor *all[] = {t1, t2, w1, w2, l1, l2, a, b, c, ls, sum, loss};
    unref_tensors(all, 12);
    return 0;
}

static void register_relay_fns(void)
{
    register_da_fns();
    sr_register("param", fn_param);
    sr_register("forward_mm", fn_forward_mm);
}

Test(dist_autograd, parameters_behind_rrefs_and_a_relaying_trainer, .timeout = 120)
{
    DA_JOB_FNS("darelay", sc_relay, register_relay_fns);
}

/* ---- test_trainer_ps: three trainers' contexts share one leaf on the PS ---- */

/* run_trainer(rref_t1, ps): one context, one pass; the PS's gradient for it
 * is ones (no accumulation across contexts); returns the context id. */
static int fn_run_trainer(sr_call *c)
{
    sr_value *rv = sr_call_arg(c, 0);
    int ps = (int)sr_value_int(sr_call_arg(c, 1));
    int64_t ctx;
    int rc = sr_dist_autograd_context_begin(&ctx);
    if (rc)
        return sr_call_fail(c, rc, "trainer: begin: %s", sr_last_error());
    sr_tensor *t2 = t_full(3, 3, 0, false);
    sr_value *t2v = tv(t2), *v = NULL, *cv = sr_int(ctx), *g = NULL;
    rc = sr_rpc_sync(ps, "rref_add", SR_ARGS(rv, t2v), WAIT_S, &v);
    sr_tensor *ret = rc ? NULL : take_tensor(v), *loss = ret ? sr_sum(ret) : NULL;
    if (!rc)
        rc = sr_dist_autograd_backward(ctx, &loss, 1, false);
    if (!rc)
        rc = noctx_rpc(ps, "owner_grad", SR_ARGS(cv, rv), &g);
    char err[256] = "";
    if (rc)
        snprintf(err, sizeof(err), "%s", sr_last_error());
    bool ones = !rc && !expect_all(sr_value_tensor(g), 1, "trainer's gradient on the PS");
    sr_dist_autograd_context_end(ctx);
    sr_value *vs[] = {t2v, cv, g};
    unref_values(vs, 3);
    sr_tensor *all[] = {t2, ret, loss};
    unref_tensors(all, 3);
    if (rc)
        return sr_call_fail(c, rc, "trainer: %s", err);
    if (!ones)
        return sr_call_fail(c, -EINVAL, "trainer: the PS's gradient in my context is not ones");
    return sr_call_return(c, sr_int(ctx));
}

static int sc_trainer_ps(int rank, int world)
{
    for (int ps = 0; ps < world; ps++) {
        if (rank == ps) {
            sr_rref *rt1 = NULL;
            sr_value *three = sr_int(3), *psv = sr_int(ps), *out = NULL;
            WCHECK(sr_remote(ps, "ones_rg", SR_ARGS(three, three), WAIT_S, &rt1) == 0, "remote: %s", sr_last_error());
            sr_value *rv = sr_value_from_rref(rt1);
            sr_future *fs[WORLD - 1];
            for (int i = 0, tr = 0; tr < world; tr++)
                if (tr != ps)
                    WCHECK(sr_rpc_async(tr, "run_trainer", SR_ARGS(rv, psv), WAIT_S, &fs[i++]) == 0, "run_trainer: %s",
                           sr_last_error());
            WCHECK(sr_future_wait_all(fs, WORLD - 1, &out) == 0, "trainers: %s", sr_last_error());
            int64_t ids[WORLD - 1];
            for (int i = 0; i < WORLD - 1; i++) {
                ids[i] = sr_value_int(sr_value_list_at(out, (size_t)i));
                for (int j = 0; j < i; j++)
                    WCHECK(ids[i] != ids[j], "two trainers shared context %#llx", (unsigned long long)ids[i]);
                sr_future_unref(fs[i]);
            }
            sr_value *hold = NULL;
            WCHECK(sr_rref_local_value(rt1, &hold) == 0, "local_value: %s", sr_last_error());
            WCHECK(!sr_tensor_grad(sr_value_tensor(hold)), "the PS's leaf has a .grad");
            sr_value *vs[] = {three, psv, out, rv, hold};
            unref_values(vs, 5);
            sr_rref_unref(rt1);
        }
        if (da_barrier())
            return 1;
    }
    return 0;
}

static void register_trainer_fns(void)
{
    register_da_fns();
    sr_register("run_trainer", fn_run_trainer);
}

Test(dist_autograd, trainers_and_parameter_server, .timeout = 120)
{
    DA_JOB_FNS("datrainer", sc_trainer_ps, register_trainer_fns);
}

/* ---- comparison with local autograd ---- */

/* An expression of PyTorch's tests: computes roots from leaves in a mode. */
struct expr {
    const char *name;
    int nleaves;
    void (*make)(sr_tensor **leaves);
    int (*run)(enum mode m, sr_tensor **l, sr_tensor **roots, size_t *nroots);
};

/* test_backward_multiple_round_trips */
static void make_round_trips(sr_tensor **l)
{
    for (int i = 0; i < 5; i++)
        l[i] = t_rand(3, 3, i % 2 == 0); /* t1, t3, t5 require grad */
}

static int run_round_trips(enum mode m, sr_tensor **l, sr_tensor **roots, size_t *nroots)
{
    sr_tensor *v1 = op_mode(m, next_dst(), "add", l[0], l[1]);
    sr_tensor *v2 = v1 ? op_mode(m, next_dst(), "mul", l[2], v1) : NULL;
    sr_value *a = tv(l[3]), *b = v2 ? tv(v2) : NULL, *c = tv(l[4]);
    sr_tensor *s1 = b ? take_tensor(call_mode(m, next_dst(), "stack", SR_ARGS(a, b))) : NULL;
    sr_tensor *s2 = b ? take_tensor(call_mode(m, next_dst(), "stack", SR_ARGS(c, b))) : NULL;
    sr_tensor *v3 = s1 && s2 ? op_mode(m, next_dst(), "bmm", s1, s2) : NULL;
    sr_tensor *v4 = v3 ? op_mode(m, next_dst(), "matmul", v3, v3) : NULL;
    WCHECK(v4, "round trips: %s", sr_last_error());
    roots[0] = sr_sum(v4);
    *nroots = 1;
    sr_value *vs[] = {a, b, c};
    unref_values(vs, 3);
    sr_tensor *ts[] = {v1, v2, s1, s2, v3, v4};
    unref_tensors(ts, 6);
    return 0;
}

/* test_backward_different_tensor_dims */
static void make_dims(sr_tensor **l)
{
    l[0] = t_rand(4, 6, true);
    l[1] = t_rand(6, 5, false);
    l[2] = t_rand(5, 7, true);
    l[3] = t_rand(7, 9, false);
}

static int run_dims(enum mode m, sr_tensor **l, sr_tensor **roots, size_t *nroots)
{
    sr_tensor *v = op_mode(m, next_dst(), "matmul", l[0], l[1]);
    sr_tensor *w = v ? op_mode(m, next_dst(), "matmul", v, l[2]) : NULL;
    sr_tensor *x = w ? op_mode(m, next_dst(), "matmul", w, l[3]) : NULL;
    WCHECK(x, "dims: %s", sr_last_error());
    roots[0] = sr_sum(x);
    *nroots = 1;
    sr_tensor *ts[] = {v, w, x};
    unref_tensors(ts, 3);
    return 0;
}

/* test_backward_unused_tensors: t2's gradient is zeros, and reported. */
static void make_unused(sr_tensor **l)
{
    for (int i = 0; i < 3; i++)
        l[i] = t_rand(3, 3, true);
}

static int run_unused(enum mode m, sr_tensor **l, sr_tensor **roots, size_t *nroots)
{
    sr_value *a = tv(l[0]), *b = tv(l[1]), *c = tv(l[2]);
    sr_tensor *s = take_tensor(call_mode(m, next_dst(), "stack", SR_ARGS(a, b, c)));
    sr_tensor *n0 = s ? sr_narrow(s, 0, 0, 1) : NULL, *n2 = s ? sr_narrow(s, 0, 2, 1) : NULL;
    sr_tensor *v = n0 && n2 ? op_mode(m, next_dst(), "matmul", n0, n2) : NULL;
    WCHECK(v, "unused tensors: %s", sr_last_error());
    roots[0] = sr_sum(v);
    *nroots = 1;
    sr_value *vs[] = {a, b, c};
    unref_values(vs, 3);
    sr_tensor *ts[] = {s, n0, n2, v};
    unref_tensors(ts, 4);
    return 0;
}

/* test_backward_multiple_output_tensors: chunks 0, 2 and 4 of 5. */
static void make_chunks(sr_tensor **l) { l[0] = t_rand(10, 2, true); }

static int run_chunks(enum mode m, sr_tensor **l, sr_tensor **roots, size_t *nroots)
{
    sr_value *a = tv(l[0]), *five = sr_int(5), *zero = sr_int(0);
    sr_value *list = call_mode(m, next_dst(), "chunk", SR_ARGS(a, five, zero));
    WCHECK(list && sr_value_list_len(list) == 5, "chunk: %s", list ? "not 5 pieces" : sr_last_error());
    sr_tensor *c0 = sr_value_tensor(sr_value_list_at(list, 0)), *c2 = sr_value_tensor(sr_value_list_at(list, 2));
    sr_tensor *c4 = sr_value_tensor(sr_value_list_at(list, 4));
    sr_tensor *v = op_mode(m, next_dst(), "matmul", c0, c2), *w = v ? op_mode(m, next_dst(), "matmul", v, c4) : NULL;
    WCHECK(w, "chunks: %s", sr_last_error());
    roots[0] = sr_sum(w);
    *nroots = 1;
    sr_value *vs[] = {a, five, zero, list};
    unref_values(vs, 4);
    sr_tensor_unref(v);
    sr_tensor_unref(w);
    return 0;
}

/* test_backward_multiple_roots */
static void make_roots(sr_tensor **l)
{
    l[0] = t_rand(3, 3, true);
    sr_tensor *r = t_rand(3, 3, false), *p = sr_add_scalar(r, 1); /* away from 0: it divides */
    l[1] = leaf_copy(p, true);
    sr_tensor_unref(r);
    sr_tensor_unref(p);
}

static int run_roots(enum mode m, sr_tensor **l, sr_tensor **roots, size_t *nroots)
{
    static const char *const ops[] = {"add", "mul", "cos", "div"};
    for (int i = 0; i < 4; i++) {
        sr_tensor *v = op_mode(m, next_dst(), ops[i], l[0], i == 2 ? NULL : l[1]);
        WCHECK(v, "roots %s: %s", ops[i], sr_last_error());
        roots[i] = sr_sum(v);
        sr_tensor_unref(v);
    }
    *nroots = 4;
    return 0;
}

/* test_backward_different_dtypes (no implicit promotion here: one root per dtype) */
static void make_dtypes(sr_tensor **l)
{
    l[0] = sr_rand(SR_F32, 2, DSHAPE(3, 3), SR_REQUIRES_GRAD);
    l[1] = sr_rand(SR_F64, 2, DSHAPE(3, 3), SR_REQUIRES_GRAD);
}

static int run_dtypes(enum mode m, sr_tensor **l, sr_tensor **roots, size_t *nroots)
{
    for (int i = 0; i < 2; i++) {
        sr_tensor *v = op_mode(m, next_dst(), "add", l[i], l[i]);
        WCHECK(v, "dtypes: %s", sr_last_error());
        roots[i] = sr_sum(v);
        sr_tensor_unref(v);
    }
    *nroots = 2;
    return 0;
}

static const struct expr exprs[] = {
    {"multiple round trips", 5, make_round_trips, run_round_trips},
    {"different tensor dims", 4, make_dims, run_dims},
    {"unused tensors", 3, make_unused, run_unused},
    {"multiple output tensors", 1, make_chunks, run_chunks},
    {"multiple roots", 2, make_roots, run_roots},
    {"different dtypes", 2, make_dtypes, run_dtypes},
};

static int compare_with_local(const struct expr *e)
{
    sr_tensor *base[8], *ref[8], *refgrad[8], *roots[8];
    size_t nroots = 0;
    e->make(base);
    for (int i = 0; i < e->nleaves; i++)
        ref[i] = leaf_copy(base[i], sr_tensor_requires_grad(base[i]));
    if (e->run(LOCAL, ref, roots, &nroots))
        return 1;
    WCHECK(sr_backward_multi(roots, NULL, nroots, false) == 0, "%s: local backward: %s", e->name, sr_last_error());
    unref_tensors(roots, nroots);
    for (int i = 0; i < e->nleaves; i++)
        refgrad[i] = sr_tensor_grad(ref[i]) ? sr_tensor_ref(sr_tensor_grad(ref[i])) : NULL;
    for (int m = LOCAL; m <= REMOTE; m++) {
        char what[128];
        sr_tensor *l[8];
        for (int i = 0; i < e->nleaves; i++)
            l[i] = leaf_copy(base[i], sr_tensor_requires_grad(base[i]));
        int64_t ctx;
        CTX_BEGIN(ctx);
        if (e->run((enum mode)m, l, roots, &nroots))
            return 1;
        snprintf(what, sizeof(what), "%s, %s", e->name, mode_name[m]);
        if (da_backward(ctx, roots, nroots, false, what))
            return 1;
        for (int i = 0; i < e->nleaves; i++) {
            sr_tensor *g = NULL;
            int rc = sr_dist_autograd_get_gradient(ctx, l[i], &g);
            snprintf(what, sizeof(what), "%s, %s: leaf %d", e->name, mode_name[m], i);
            if (!refgrad[i]) {
                WCHECK(rc == -ENOENT, "%s has a gradient, but none locally", what);
                continue;
            }
            WCHECK(rc == 0, "%s: no gradient (%s), local has one", what, sr_last_error());
            if (expect_same(g, refgrad[i], sr_tensor_dtype(g) == SR_F32 ? 1e-5 : 1e-12, what))
                return 1;
            sr_tensor_unref(g);
            WCHECK(!sr_tensor_grad(l[i]), "%s: .grad was filled", what);
        }
        CTX_END(ctx);
        unref_tensors(roots, nroots);
        unref_tensors(l, (size_t)e->nleaves);
    }
    unref_tensors(base, (size_t)e->nleaves);
    unref_tensors(ref, (size_t)e->nleaves);
    for (int i = 0; i < e->nleaves; i++)
        sr_tensor_unref(refgrad[i]);
    return 0;
}

static int sc_compare(int rank, int world)
{
    (void)world;
    sr_manual_seed(7 + (uint64_t)rank);
    for (size_t i = 0; i < sizeof(exprs) / sizeof(exprs[0]); i++)
        if (compare_with_local(&exprs[i]))
            return 1;
    return 0;
}

Test(dist_autograd, same_gradients_as_local_autograd, .timeout = 180)
{
    DA_JOB("dacompare", sc_compare);
}

/* The expected values themselves, for two of the expressions. */
static int sc_known_values(int rank, int world)
{
    (void)world;
    sr_manual_seed(11 + (uint64_t)rank);
    /* multiple roots: grad t1 = 1 + t2 - sin t1 + 1/t2; grad t2 = 1 + t1 - t1/t2^2 */
    sr_tensor *l[2], *roots[4];
    size_t nr;
    make_roots(l);
    int64_t ctx;
    CTX_BEGIN(ctx);
    if (run_roots(RPC_SYNC, l, roots, &nr) || da_backward(ctx, roots, nr, false, "multiple roots"))
        return 1;
    double a[9], b[9], w1[9], w2[9];
    sr_tensor_to_f64(l[0], a, 9);
    sr_tensor_to_f64(l[1], b, 9);
    for (int i = 0; i < 9; i++) {
        w1[i] = 1 + b[i] - sin(a[i]) + 1 / b[i];
        w2[i] = 1 + a[i] - a[i] / (b[i] * b[i]);
    }
    sr_tensor *g1 = NULL, *g2 = NULL;
    WCHECK(sr_dist_autograd_get_gradient(ctx, l[0], &g1) == 0 && sr_dist_autograd_get_gradient(ctx, l[1], &g2) == 0,
           "multiple roots: %s", sr_last_error());
    if (expect_vals(g1, w1, 9, 1e-12, "grad t1 = 1 + t2 - sin t1 + 1/t2") ||
        expect_vals(g2, w2, 9, 1e-12, "grad t2 = 1 + t1 - t1/t2^2"))
        return 1;
    CTX_END(ctx);
    sr_tensor *all[] = {l[0], l[1], g1, g2};
    unref_tensors(all, 4);
    unref_tensors(roots, 4);

    /* chunks: rows 2-3 and 6-7 (chunks 1 and 3, unused) get zeros */
    sr_tensor *t;
    make_chunks(&t);
    CTX_BEGIN(ctx);
    if (run_chunks(REMOTE, &t, roots, &nr) || da_backward(ctx, roots, nr, false, "chunks"))
        return 1;
    sr_tensor *g = NULL;
    WCHECK(sr_dist_autograd_get_gradient(ctx, t, &g) == 0, "chunks: %s", sr_last_error());
    double gv[20];
    sr_tensor_to_f64(g, gv, 20);
    for (int row = 0; row < 10; row++)
        if (row == 2 || row == 3 || row == 6 || row == 7)
            WCHECK(gv[2 * row] == 0 && gv[2 * row + 1] == 0, "chunks: unused row %d has gradient %g, %g", row,
                   gv[2 * row], gv[2 * row + 1]);
        else
            WCHECK(gv[2 * row] != 0 || gv[2 * row + 1] != 0, "chunks: used row %d has no gradient", row);
    CTX_END(ctx);
    sr_tensor_unref(g);
    sr_tensor_unref(t);
    sr_tensor_unref(roots[0]);

    /* dtypes: ones x 2, each in its own dtype */
    make_dtypes(l);
    CTX_BEGIN(ctx);
    if (run_dtypes(REMOTE, l, roots, &nr) || da_backward(ctx, roots, nr, false, "dtypes") ||
        expect_grad_all(ctx, l[0], 2, "f32 leaf") || expect_grad_all(ctx, l[1], 2, "f64 leaf"))
        return 1;
    CTX_END(ctx);
    unref_tensors(l, 2);
    unref_tensors(roots, 2);
    return 0;
}

Test(dist_autograd, known_gradient_values, .timeout = 120)
{
    DA_JOB("davalues", sc_known_values);
}

/* ---- test_backwards_nested_python_udf: da = 3096, db = 2256 at a = 2, b = 3 ---- */

static int nested_udf_pass(sr_tensor *t1, sr_tensor *t2, const double *w1, const double *w2)
{
    int rank = sr_rank(), world = sr_world_size();
    int64_t ctx;
    CTX_BEGIN(ctx);
    sr_value *a = tv(t1), *b = tv(t2), *d = sr_int((rank + 2) % world);
    sr_tensor *r = take_tensor(call_mode(RPC_SYNC, (rank + 1) % world, "nested_udf", SR_ARGS(a, b, d)));
    WCHECK(r, "nested_udf: %s", sr_last_error());
    sr_tensor *loss = sr_sum(r), *g1 = NULL, *g2 = NULL;
    if (da_backward(ctx, &loss, 1, false, "nested udf"))
        return 1;
    WCHECK(sr_dist_autograd_get_gradient(ctx, t1, &g1) == 0 && sr_dist_autograd_get_gradient(ctx, t2, &g2) == 0,
           "nested udf: %s", sr_last_error());
    if (expect_vals(g1, w1, 9, 1e-12, "nested udf: grad t1") || expect_vals(g2, w2, 9, 1e-12, "nested udf: grad t2"))
        return 1;
    CTX_END(ctx);
    sr_value *vs[] = {a, b, d};
    unref_values(vs, 3);
    sr_tensor *ts[] = {r, loss, g1, g2};
    unref_tensors(ts, 4);
    return 0;
}

static int sc_nested_udf(int rank, int world)
{
    (void)world;
    sr_manual_seed(31 + (uint64_t)rank);
    double w1[9], w2[9];
    for (int i = 0; i < 9; i++) {
        w1[i] = 3096;
        w2[i] = 2256;
    }
    sr_tensor *a = t_full(3, 3, 2, true), *b = t_full(3, 3, 3, true);
    if (nested_udf_pass(a, b, w1, w2))
        return 1;
    /* Random inputs: the same gradients as the local computation. */
    sr_tensor *r1 = t_rand(3, 3, true), *r2 = t_rand(3, 3, true);
    sr_tensor *l1 = leaf_copy(r1, true), *l2 = leaf_copy(r2, true);
    sr_tensor *lr = nested_udf_body(l1, l2, 0, true), *ll = sr_sum(lr);
    WCHECK(sr_backward(ll, false) == 0, "local: %s", sr_last_error());
    sr_tensor_to_f64(sr_tensor_grad(l1), w1, 9);
    sr_tensor_to_f64(sr_tensor_grad(l2), w2, 9);
    if (nested_udf_pass(r1, r2, w1, w2))
        return 1;
    sr_tensor *all[] = {a, b, r1, r2, l1, l2, lr, ll};
    unref_tensors(all, 8);
    return 0;
}

Test(dist_autograd, nested_udf_gradients, .timeout = 120)
{
    DA_JOB("danested", sc_nested_udf);
}

/* ---- retain_graph: 2 passes, then 1,000 (test_backward_accumulate_grads, test_multiple_backward) ---- */

static int sc_retain_graph(int rank, int world)
{
    int passes = reordering() ? 100 : 1000;
    /* Integer-valued f64 tensors: every sum is exact, so 1000 passes are exactly 1000x. */
    double v1[9], v2[9];
    for (int i = 0; i < 9; i++) {
        v1[i] = (i * 7 + rank) % 5 - 2;
        v2[i] = (i * 3 + rank) % 4 + 1;
    }
    sr_tensor *t1 = sr_from_data(SR_F64, 2, DSHAPE(3, 3), v1, SR_REQUIRES_GRAD);
    sr_tensor *t2 = sr_from_data(SR_F64, 2, DSHAPE(3, 3), v2, SR_REQUIRES_GRAD);
    sr_tensor *lp = sr_matmul(t1, t2), *ls = sr_sum(lp);
    WCHECK(sr_backward(ls, false) == 0, "local: %s", sr_last_error());
    double g1[9], g2[9], w1[9], w2[9];
    sr_tensor_to_f64(sr_tensor_grad(t1), g1, 9);
    sr_tensor_to_f64(sr_tensor_grad(t2), g2, 9);
    int64_t ctx;
    CTX_BEGIN(ctx);
    sr_tensor *t3 = op_mode(RPC_SYNC, (rank + 1) % world, "matmul", t1, t2), *loss = t3 ? sr_sum(t3) : NULL;
    WCHECK(t3, "matmul: %s", sr_last_error());
    sr_tensor *d1 = NULL, *d2 = NULL;
    for (int p = 1; p <= passes; p++) {
        int rc = sr_dist_autograd_backward(ctx, &loss, 1, p < passes);
        WCHECK(rc == 0, "pass %d of %d: %s", p, passes, sr_last_error());
        if (p == 2) {
            for (int i = 0; i < 9; i++) {
                w1[i] = 2 * g1[i];
                w2[i] = 2 * g2[i];
            }
            WCHECK(sr_dist_autograd_get_gradient(ctx, t1, &d1) == 0 && sr_dist_autograd_get_gradient(ctx, t2, &d2) == 0,
                   "after 2 passes: %s", sr_last_error());
            if (expect_vals(d1, w1, 9, 0, "2 passes: grad t1 = 2 J t2^T") ||
                expect_vals(d2, w2, 9, 0, "2 passes: grad t2 = 2 t1^T J"))
                return 1;
            sr_tensor_unref(d1);
            sr_tensor_unref(d2);
        }
    }
    for (int i = 0; i < 9; i++) {
        w1[i] = passes * g1[i];
        w2[i] = passes * g2[i];
    }
    WCHECK(sr_dist_autograd_get_gradient(ctx, t1, &d1) == 0 && sr_dist_autograd_get_gradient(ctx, t2, &d2) == 0,
           "after %d passes: %s", passes, sr_last_error());
    if (expect_vals(d1, w1, 9, 0, "grad t1 after every pass") || expect_vals(d2, w2, 9, 0, "grad t2 after every pass"))
        return 1;
    /* Without retain_graph the graph is gone: a next pass fails like a local one. */
    int rc = sr_dist_autograd_backward(ctx, &loss, 1, false);
    WCHECK(rc < 0 && strstr(sr_last_error(), "Trying to backward through the graph a second time"),
           "a pass after the graph was freed gave %d: %s", rc, sr_last_error());
    CTX_END(ctx);
    sr_tensor *all[] = {t1, t2, lp, ls, t3, loss, d1, d2};
    unref_tensors(all, 8);
    return 0;
}

Test(dist_autograd, retain_graph_passes_accumulate, .timeout = 180)
{
    DA_JOB("daretain", sc_retain_graph);
}

/* ---- test_backward_verify_hooks: a leaf's hook applies to the context's gradient ---- */

static int double_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    atomic_fetch_add((_Atomic int *)arg, 1);
    *replace = sr_mul_scalar(grad, 2);
    return *replace ? 0 : -ENOMEM;
}

static int sc_hooks(int rank, int world)
{
    (void)world;
    for (int m = LOCAL; m <= REMOTE; m++) {
        _Atomic int calls = 0;
        sr_tensor *t1 = t_full(3, 3, 1, true), *t2 = t_full(3, 3, 1, true);
        WCHECK(sr_tensor_register_hook(t1, double_hook, &calls) == 0, "register_hook: %s", sr_last_error());
        int64_t ctx;
        CTX_BEGIN(ctx);
        sr_tensor *r = op_mode((enum mode)m, next_dst(), "matmul", t1, t2), *loss = r ? sr_sum(r) : NULL;
        WCHECK(r, "%s matmul: %s", mode_name[m], sr_last_error());
        if (da_backward(ctx, &loss, 1, false, "hooks") || expect_grad_all(ctx, t1, 6, "hooked t1: 2 x 3") ||
            expect_grad_all(ctx, t2, 3, "t2"))
            return 1;
        WCHECK(atomic_load(&calls) == 1, "%s: the hook ran %d times", mode_name[m], atomic_load(&calls));
        WCHECK(!sr_tensor_grad(t1), "%s: .grad filled", mode_name[m]);
        CTX_END(ctx);
        sr_tensor *all[] = {t1, t2, r, loss};
        unref_tensors(all, 4);
    }
    (void)rank;
    return 0;
}

Test(dist_autograd, leaf_hooks_apply_to_the_context_gradient, .timeout = 120)
{
    DA_JOB("dahooks", sc_hooks);
}

/* A pass holds no thread while gradients travel: with one executor thread
 * per worker, four workers' passes crossing each other all complete. */
Test(dist_autograd, passes_with_one_executor_thread_per_worker, .timeout = 180)
{
    DA_JOB("dacompare1", sc_compare, .opts = {.num_worker_threads = 1});
}
