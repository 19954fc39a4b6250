/* SPDX-License-Identifier: MIT */
/* Distributed autograd graphs on 4 workers, seen through the context's send
 * and recv functions (PyTorch's ctx._send_functions() / _recv_functions()):
 * one call (built-in or user function, rpc_sync or remote), three nested
 * hops, a loop back to the caller, no graph without tensors that require
 * grad (while the callee's context still exists), known workers, short
 * buffers and counts, cleanup reaching every worker (also for a context
 * ended while its calls run), debug info, and 20 threads on each of 3
 * workers (also with one executor thread). Also run under the reordering
 * mode (tests/meson.build). */
#include "dist_autograd_fns.h"

LEAK_CHECKED_SUITE(dist_autograd_graph);

static const char *const ACC2[] = {"AccumulateGrad", "AccumulateGrad"};
static const char *const RECV2[] = {"RecvRpcBackward", "RecvRpcBackward"};
static const char *const ADD1[] = {"AddBackward0"};

/* ---- test_graph_for_builtin_call / _python_call / _builtin_remote_call / _python_remote_call ---- */

/* The caller's side of one call of add(t1, t2) to dst: one send function
 * whose next are t1's and t2's AccumulateGrad, one recv function that made
 * the result. */
static int expect_first_call(int64_t ctx, int dst, const sr_tensor *ret, const char *what)
{
    sr_dist_fn_info s[8], r[8];
    if (get_fns(ctx, true, s, 1, what) || get_fns(ctx, false, r, 1, what) || expect_next(&s[0], 2, ACC2, what))
        return 1;
    WCHECK(s[0].peer == dst && r[0].peer == dst, "%s: send to %d and recv from %d, want %d", what, s[0].peer,
           r[0].peer, dst);
    WCHECK(s[0].message_id >> 48 == sr_rank(), "%s: the send's message id %#llx is not ours", what,
           (unsigned long long)s[0].message_id);
    WCHECK(name_is(sr_tensor_grad_fn_name(ret), "RecvRpcBackward"), "%s: the result's grad_fn is %s", what,
           sr_tensor_grad_fn_name(ret) ? sr_tensor_grad_fn_name(ret) : "(null)");
    return 0;
}

/* The callee's side: one recv (the arguments), one send (the result) whose
 * only next is AddBackward0. */
static int expect_exec(int64_t ctx, int caller, const char *what)
{
    sr_dist_fn_info s[8], r[8];
    if (get_fns(ctx, true, s, 1, what) || get_fns(ctx, false, r, 1, what) || expect_next(&s[0], 1, ADD1, what))
        return 1;
    WCHECK(s[0].peer == caller && r[0].peer == caller, "%s: peers %d and %d, want %d", what, s[0].peer, r[0].peer,
           caller);
    WCHECK(r[0].message_id >> 48 == caller, "%s: the recv's message id %#llx was not made by worker%d", what,
           (unsigned long long)r[0].message_id, caller);
    return 0;
}

static int sc_graph_one_call(int rank, int world)
{
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    static const char *const fns[] = {"add", "py_add"};
    for (int v = 0; v < 4; v++) {
        enum mode m = v < 2 ? RPC_SYNC : REMOTE;
        const char *fn = fns[v % 2];
        char what[64];
        snprintf(what, sizeof(what), "%s %s", mode_name[m], fn);
        int64_t ctx, pctx;
        CTX_BEGIN(ctx);
        sr_tensor *t1 = t_full(3, 3, 1, true), *t2 = t_full(3, 3, 0, true);
        sr_tensor *ret = op_mode(m, next, fn, t1, t2);
        WCHECK(ret, "%s: %s", what, sr_last_error());
        if (send_note(next, v, ctx) || expect_first_call(ctx, next, ret, what) ||
            expect_known(ctx, (int[]){next}, 1, what) || wait_note(v, prev, &pctx))
            return 1;
        WCHECK(sr_dist_autograd_is_valid_context(pctx), "%s: worker%d's context is not here", what, prev);
        char w2[96];
        snprintf(w2, sizeof(w2), "%s, callee side", what);
        if (expect_exec(pctx, prev, w2) || expect_known(pctx, (int[]){prev}, 1, w2) || da_barrier())
            return 1;
        CTX_END(ctx);
        WCHECK(!sr_dist_autograd_is_valid_context(ctx), "%s: the context is valid after its end", what);
        WCHECK(sr_dist_autograd_current_context() == SR_NO_CONTEXT, "%s: a context is current after the end", what);
        sr_tensor *all[] = {t1, t2, ret};
        unref_tensors(all, 3);
    }
    return 0;
}

Test(dist_autograd_graph, one_call_builtin_and_udf_sync_and_remote, .timeout = 120)
{
    DA_JOB("dagraph1", sc_graph_one_call);
}

/* ---- test_graph_for_py_nested_call (rpc_sync and remote) ---- */

/* An intermediate hop: send 0 forwards the two received tensors (both
 * edges to the same recv), send 1 returns the received result. */
static int expect_nested(int64_t ctx, const char *what)
{
    sr_dist_fn_info s[8], r[8];
    char w[96];
    snprintf(w, sizeof(w), "%s, forwarding send", what);
    if (get_fns(ctx, true, s, 2, what) || get_fns(ctx, false, r, 2, what) || expect_next(&s[0], 2, RECV2, w))
        return 1;
    snprintf(w, sizeof(w), "%s, returning send", what);
    return expect_next(&s[1], 1, RECV2, w);
}

static int sc_graph_nested(int rank, int world)
{
    for (int m = RPC_SYNC; m <= REMOTE; m += REMOTE - RPC_SYNC) {
        int next = (rank + 1) % world, slot = m;
        int64_t ctx, ids[WORLD];
        CTX_BEGIN(ctx);
        sr_tensor *t1 = t_full(3, 3, 1, true), *t2 = t_full(3, 3, 0, true);
        sr_value *a = tv(t1), *b = tv(t2), *d = sr_int(next), *w = sr_int(world), *h = sr_int(1);
        sr_tensor *ret = take_tensor(call_mode((enum mode)m, next, "nested_call", SR_ARGS(a, b, d, w, h)));
        WCHECK(ret, "%s nested_call: %s", mode_name[m], sr_last_error());
        if (expect_first_call(ctx, next, ret, "nested: the caller"))
            return 1;
        for (int dist = 1; dist < world; dist++)
            if (send_note((rank + dist) % world, slot, ctx))
                return 1;
        for (int dist = 1; dist < world; dist++)
            if (wait_note(slot, (rank + world - dist) % world, &ids[dist]))
                return 1;
        if (expect_nested(ids[1], "nested: first hop") || expect_nested(ids[2], "nested: second hop") ||
            expect_exec(ids[3], (rank + world - 1) % world, "nested: the add, third hop") || da_barrier())
            return 1;
        CTX_END(ctx);
        sr_value *vs[] = {a, b, d, w, h};
        unref_values(vs, 5);
        sr_tensor *all[] = {t1, t2, ret};
        unref_tensors(all, 3);
    }
    return 0;
}

Test(dist_autograd_graph, three_nested_hops, .timeout = 120)
{
    DA_JOB("dagraphnest", sc_graph_nested);
}

/* ---- test_graph_for_py_nested_call_itself: rank -> rank+1 -> rank ---- */

static int sc_graph_loop(int rank, int world)
{
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    for (int m = RPC_SYNC; m <= REMOTE; m += REMOTE - RPC_SYNC) {
        int64_t ctx, pctx;
        CTX_BEGIN(ctx);
        sr_tensor *t1 = t_full(3, 3, 1, true), *t2 = t_full(3, 3, 0, true);
        sr_value *a = tv(t1), *b = tv(t2), *d = sr_int(prev), *w = sr_int(world), *h = sr_int(0);
        sr_tensor *ret = take_tensor(call_mode((enum mode)m, next, "nested_call", SR_ARGS(a, b, d, w, h)));
        WCHECK(ret, "%s loop: %s", mode_name[m], sr_last_error());
        /* Here: our call (send 0, recv 1 made ret) and the add we ran for
         * worker next (recv 0, send 1). */
        sr_dist_fn_info s[8], r[8];
        if (get_fns(ctx, true, s, 2, "loop") || get_fns(ctx, false, r, 2, "loop") ||
            expect_next(&s[0], 2, ACC2, "loop: our send") || expect_next(&s[1], 1, ADD1, "loop: the add's send"))
            return 1;
        WCHECK(r[0].peer == next && r[1].peer == next && s[0].peer == next && s[1].peer == next,
               "loop: every function's peer is worker%d", next);
        WCHECK(name_is(sr_tensor_grad_fn_name(ret), "RecvRpcBackward"), "loop: ret's grad_fn is %s",
               sr_tensor_grad_fn_name(ret) ? sr_tensor_grad_fn_name(ret) : "(null)");
        if (expect_known(ctx, (int[]){next}, 1, "loop") || send_note(next, m, ctx) || wait_note(m, prev, &pctx) ||
            expect_nested(pctx, "loop: the middle hop") || da_barrier())
            return 1;
        CTX_END(ctx);
        sr_value *vs[] = {a, b, d, w, h};
        unref_values(vs, 5);
        sr_tensor *all[] = {t1, t2, ret};
        unref_tensors(all, 3);
    }
    return 0;
}

Test(dist_autograd_graph, loop_back_to_self, .timeout = 120)
{
    DA_JOB("dagraphloop", sc_graph_loop);
}

/* ---- test_no_graph_with_tensors_not_require_grad(_remote) ---- */

static int sc_no_graph(int rank, int world)
{
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    for (int m = RPC_SYNC; m <= REMOTE; m += REMOTE - RPC_SYNC) {
        int64_t ctx, pctx;
        CTX_BEGIN(ctx);
        sr_tensor *t1 = t_full(3, 3, 1, false), *t2 = t_full(3, 3, 0, false);
        sr_tensor *ret = op_mode((enum mode)m, next, "add", t1, t2);
        WCHECK(ret && !sr_tensor_requires_grad(ret), "%s add: %s", mode_name[m], sr_last_error());
        /* A user function call carries the context (note runs in it there). */
        sr_value *s = sr_int(m), *o = sr_int(rank), *i = sr_int(ctx);
        WCHECK(sr_rpc_sync(next, "note", SR_ARGS(s, o, i), WAIT_S, NULL) == 0, "note: %s", sr_last_error());
        sr_dist_fn_info f[8];
        if (get_fns(ctx, true, f, 0, "no graph") || get_fns(ctx, false, f, 0, "no graph") ||
            expect_known(ctx, (int[]){next}, 1, "no graph") || wait_note(m, prev, &pctx))
            return 1;
        WCHECK(sr_dist_autograd_is_valid_context(pctx), "%s: worker%d's context %#llx does not exist here",
               mode_name[m], prev, (unsigned long long)pctx);
        if (get_fns(pctx, true, f, 0, "no graph, callee") || get_fns(pctx, false, f, 0, "no graph, callee") ||
            da_barrier())
            return 1;
        CTX_END(ctx);
        sr_value *vs[] = {s, o, i};
        unref_values(vs, 3);
        sr_tensor *all[] = {t1, t2, ret};
        unref_tensors(all, 3);
    }
    return 0;
}

Test(dist_autograd_graph, no_graph_without_grad_yet_the_callee_context_exists, .timeout = 120)
{
    DA_JOB("danograph", sc_no_graph);
}

/* ---- test_worker_ids_recorded ---- */

static int sc_worker_ids(int rank, int world)
{
    int others[WORLD - 1], k = 0;
    for (int w = 0; w < world; w++)
        if (w != rank)
            others[k++] = w;
    int64_t ctx;
    CTX_BEGIN(ctx);
    if (expect_known(ctx, NULL, 0, "a fresh context"))
        return 1;
    for (int rg = 0; rg < 2; rg++) {
        sr_tensor *t1 = t_full(3, 3, 1, rg), *t2 = t_full(3, 3, 0, rg);
        for (int i = 0; i < k; i++) {
            sr_tensor *r = op_mode(RPC_SYNC, others[i], "add", t1, t2);
            WCHECK(r, "add: %s", sr_last_error());
            sr_tensor_unref(r);
        }
        if (expect_known(ctx, others, (size_t)k, rg ? "built-ins with grad" : "built-ins without grad"))
            return 1;
        sr_tensor_unref(t1);
        sr_tensor_unref(t2);
    }
    CTX_END(ctx);
    return 0;
}

Test(dist_autograd_graph, known_worker_ids, .timeout = 120)
{
    DA_JOB("daknown", sc_worker_ids);
}

/* ---- context cleanup (test_context_cleanup_*) ---- */

enum cleanup_kind { CL_GRAD, CL_NOGRAD, CL_NOTENSORS, CL_NESTED };
static const char *const cleanup_name[] = {"tensors with grad", "tensors without grad", "no tensors", "nested"};

static int cleanup_round(enum cleanup_kind kind)
{
    int rank = sr_rank(), world = sr_world_size(), next = (rank + 1) % world;
    int64_t ctx;
    const char *what = cleanup_name[kind];
    CTX_BEGIN(ctx);
    sr_tensor *t1 = t_full(3, 3, 1, kind != CL_NOGRAD), *t2 = t_full(3, 3, 0, kind != CL_NOGRAD);
    sr_value *a = tv(t1), *b = tv(t2), *one = sr_int(1), *d = sr_int(next), *w = sr_int(world), *h = sr_int(0);
    for (int dst = 0; dst < world; dst++) {
        if (dst == rank || (kind == CL_NESTED && dst != next))
            continue;
        int rc;
        sr_value *v = NULL;
        if (kind == CL_NOTENSORS)
            rc = sr_rpc_sync(dst, "scalar_add", SR_ARGS(one, one), WAIT_S, &v);
        else if (kind == CL_NESTED)
            rc = sr_rpc_sync(dst, "nested_call", SR_ARGS(a, b, d, w, h), WAIT_S, &v);
        else
            rc = sr_rpc_sync(dst, "add", SR_ARGS(a, b), WAIT_S, &v);
        WCHECK(rc == 0, "%s: call to worker%d: %s", what, dst, sr_last_error());
        sr_value_unref(v);
    }
    CTX_END(ctx);
    WCHECK(!sr_dist_autograd_is_valid_context(ctx), "%s: the context is valid right after its end", what);
    for (int dst = 0; dst < world; dst++) {
        if (dst == rank || (kind == CL_NESTED && dst == (rank + 3) % world))
            continue;
        /* CL_NESTED: next and its nested callee next + 1 (which we never called) */
        if (expect_gone_on(dst, ctx, what))
            return 1;
    }
    sr_value *vs[] = {a, b, one, d, w, h};
    unref_values(vs, 6);
    sr_tensor_unref(t1);
    sr_tensor_unref(t2);
    return 0;
}

static int sc_cleanup(int rank, int world)
{
    (void)rank;
    (void)world;
    for (int k = CL_GRAD; k <= CL_NESTED; k++)
        if (cleanup_round((enum cleanup_kind)k) || da_barrier())
            return 1;
    return rank == 0 ? expect_no_contexts_anywhere("after the cleanup rounds") : 0;
}

Test(dist_autograd_graph, cleanup_reaches_every_worker, .timeout = 120)
{
    DA_JOB("dacleanup", sc_cleanup);
}

/* ---- test_async_dist_autograd: 20 threads on each of workers 1-3 ---- */

#define THREADS 20

struct workload {
    int failed;
    char err[512];
};

static void *workload_thread(void *arg)
{
    struct workload *wl = arg;
    sr_tensor *t1 = t_rand(3, 3, true), *t2 = t_rand(3, 3, true);
    int64_t ctx = -1;
    int rc = sr_dist_autograd_context_begin(&ctx);
    sr_tensor *t3 = NULL, *t4 = NULL, *t5 = NULL, *t6 = NULL, *loss = NULL, *g1 = NULL, *g2 = NULL;
    if (!rc) {
        t3 = op_mode(RPC_SYNC, 0, "add", t1, t2);
        t4 = t3 ? op_mode(RPC_SYNC, 0, "mul", t2, t3) : NULL;
        t5 = t4 ? op_mode(RPC_SYNC, 0, "matmul", t3, t4) : NULL;
        t6 = t5 ? op_mode(RPC_SYNC, 0, "add", t4, t5) : NULL;
        loss = t6 ? sr_sum(t6) : NULL;
        rc = loss ? sr_dist_autograd_backward(ctx, &loss, 1, false) : -EINVAL;
    }
    if (!rc)
        rc = sr_dist_autograd_get_gradient(ctx, t1, &g1);
    if (!rc)
        rc = sr_dist_autograd_get_gradient(ctx, t2, &g2);
    if (rc)
        snprintf(wl->err, sizeof(wl->err), "thread: %d: %s", rc, sr_last_error());
    else {
        /* The same, locally. */
        sr_tensor *l1 = leaf_copy(t1, true), *l2 = leaf_copy(t2, true);
        sr_tensor *a = sr_add(l1, l2), *b = sr_mul(l2, a), *c = sr_matmul(a, b), *d = sr_add(b, c), *s = sr_sum(d);
        if (sr_backward(s, false))
            snprintf(wl->err, sizeof(wl->err), "local: %s", sr_last_error());
        else if (expect_same(g1, sr_tensor_grad(l1), 1e-12, "thread: grad t1") ||
                 expect_same(g2, sr_tensor_grad(l2), 1e-12, "thread: grad t2"))
            snprintf(wl->err, sizeof(wl->err), "gradients differ from the local ones (above)");
        sr_tensor *ls[] = {l1, l2, a, b, c, d, s};
        unref_tensors(ls, 7);
    }
    if (ctx >= 0 && !rc && sr_dist_autograd_context_end(ctx))
        snprintf(wl->err, sizeof(wl->err), "context_end: %s", sr_last_error());
    else if (ctx >= 0 && rc)
        sr_dist_autograd_context_end(ctx);
    wl->failed = wl->err[0] != 0;
    sr_tensor *all[] = {t1, t2, t3, t4, t5, t6, loss, g1, g2};
    unref_tensors(all, 9);
    return NULL;
}

static int sc_threads(int rank, int world)
{
    (void)world;
    sr_manual_seed(1000 + (uint64_t)rank);
    if (rank != 0) {
        pthread_t th[THREADS];
        struct workload wl[THREADS];
        memset(wl, 0, sizeof(wl));
        for (int i = 0; i < THREADS; i++)
            WCHECK(pthread_create(&th[i], NULL, workload_thread, &wl[i]) == 0, "pthread_create");
        for (int i = 0; i < THREADS; i++)
            pthread_join(th[i], NULL);
        for (int i = 0; i < THREADS; i++)
            WCHECK(!wl[i].failed, "worker%d thread %d: %s", rank, i, wl[i].err);
        sr_dist_autograd_debug_info d;
        WCHECK(sr_dist_autograd_debug_info_get(&d) == 0 && d.num_current_backward_passes == 0,
               "%llu passes still running after every thread finished",
               (unsigned long long)d.num_current_backward_passes);
    }
    if (da_barrier())
        return 1;
    return rank == 0 ? expect_no_contexts_anywhere("after 60 threads") : 0;
}

Test(dist_autograd_graph, twenty_threads_on_three_workers, .timeout = 180)
{
    DA_JOB("dathreads", sc_threads);
}

/* ---- test_debug_info ---- */

static int passes_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    (void)grad;
    (void)replace;
    sr_dist_autograd_debug_info d;
    atomic_store((_Atomic int64_t *)arg,
                 sr_dist_autograd_debug_info_get(&d) ? -1 : (int64_t)d.num_current_backward_passes);
    return 0;
}

static int sc_debug_info(int rank, int world)
{
    _Atomic int64_t seen = -2;
    sr_tensor *t1 = t_rand(3, 3, true), *t2 = t_rand(3, 3, true), *cur = sr_tensor_ref(t1);
    int64_t ctx;
    CTX_BEGIN(ctx);
    for (int half = 0; half < 2; half++) {
        for (int w = 0; w < world; w++) {
            if (w == rank)
                continue;
            sr_tensor *n = op_mode(RPC_SYNC, w, "add", cur, t2);
            WCHECK(n, "add: %s", sr_last_error());
            sr_tensor_unref(cur);
            cur = n;
        }
        if (half == 0) { /* a node in the middle of the pass looks at the count */
            sr_tensor *n = sr_mul_scalar(cur, 1);
            WCHECK(sr_tensor_register_hook(n, passes_hook, &seen) == 0, "hook: %s", sr_last_error());
            sr_tensor_unref(cur);
            cur = n;
        }
    }
    sr_tensor *loss = sr_sum(cur);
    if (da_backward(ctx, &loss, 1, false, "debug info"))
        return 1;
    WCHECK(atomic_load(&seen) >= 1 && atomic_load(&seen) <= 4, "%lld backward passes counted during a pass, want 1-4",
           (long long)atomic_load(&seen));
    sr_dist_autograd_debug_info d;
    WCHECK(sr_dist_autograd_debug_info_get(&d) == 0 && d.num_autograd_contexts >= 1 && d.num_autograd_contexts <= 4,
           "%llu contexts here during the test, want 1-4", (unsigned long long)d.num_autograd_contexts);
    if (expect_grad_all(ctx, t1, 1, "debug info: t1") || expect_grad_all(ctx, t2, 2 * (world - 1), "t2"))
        return 1;
    CTX_END(ctx);
    sr_tensor *all[] = {t1, t2, cur, loss};
    unref_tensors(all, 4);
    if (da_barrier())
        return 1;
    WCHECK(sr_dist_autograd_debug_info_get(&d) == 0 && d.num_current_backward_passes == 0,
           "%llu passes after every pass ended", (unsigned long long)d.num_current_backward_passes);
    return rank == 0 ? expect_no_contexts_anywhere("after the debug info passes") : 0;
}

Test(dist_autograd_graph, debug_info_counts_passes_and_contexts, .timeout = 120)
{
    DA_JOB("dadebug", sc_debug_info);
}

/* ---- functions() and known_workers() with a small buffer ---- */

/* "by message id ascending; *n gets the count even if it exceeds cap": a
 * short buffer gets the first functions in that order, not any of them. */
static int sc_short_buffers(int rank, int world)
{
    enum { CALLS = 6 };
    int64_t ctx;
    CTX_BEGIN(ctx);
    sr_tensor *t = t_full(2, 2, 1, true), *rs[CALLS];
    for (int i = 0; i < CALLS; i++) {
        rs[i] = op_mode(RPC_SYNC, (rank + 1 + i % (world - 1)) % world, "add", t, t);
        WCHECK(rs[i], "add: %s", sr_last_error());
    }
    sr_dist_fn_info all[8], few[2];
    for (int send = 0; send < 2; send++) {
        size_t n = 0, m = 0;
        WCHECK(sr_dist_autograd_functions(ctx, send, all, 8, &n) == 0 && n == CALLS, "%zu %s functions, want %d", n,
               send ? "send" : "recv", CALLS);
        for (size_t i = 1; i < n; i++)
            WCHECK(all[i - 1].message_id < all[i].message_id, "functions not in message id order at %zu", i);
        WCHECK(sr_dist_autograd_functions(ctx, send, few, 2, &m) == 0 && m == CALLS,
               "with a buffer of 2: count %zu, want %d", m, CALLS);
        for (size_t i = 0; i < 2; i++)
            WCHECK(few[i].message_id == all[i].message_id,
                   "%s function %zu of a buffer of 2 has message id %#llx, want the %zu-th smallest %#llx",
                   send ? "send" : "recv", i, (unsigned long long)few[i].message_id, i,
                   (unsigned long long)all[i].message_id);
    }
    int ranks[1];
    size_t k = 0;
    WCHECK(sr_dist_autograd_known_workers(ctx, ranks, 1, &k) == 0 && k == (size_t)world - 1,
           "known workers with a buffer of 1: count %zu, want %d", k, world - 1);
    WCHECK(ranks[0] == (rank == 0 ? 1 : 0), "the smallest known worker is %d", ranks[0]);
    for (int i = 0; i < CALLS; i++) /* the outputs are dropped: no backward in this context */
        sr_tensor_unref(rs[i]);
    CTX_END(ctx);
    sr_tensor_unref(t);
    return 0;
}

Test(dist_autograd_graph, short_buffers_get_the_first_functions_in_order, .timeout = 60)
{
    DA_JOB("dashort", sc_short_buffers);
}

/* ---- counting without a buffer ---- */

/* cap 0 and no buffer: only the counts ("*n gets the count even if it
 * exceeds cap"), for an empty context and for one with functions. */
static int sc_count_only(int rank, int world)
{
    int64_t ctx;
    size_t n = 99;
    CTX_BEGIN(ctx);
    WCHECK(sr_dist_autograd_functions(ctx, true, NULL, 0, &n) == 0 && n == 0, "empty context: %zu send functions: %s",
           n, sr_last_error());
    WCHECK(sr_dist_autograd_known_workers(ctx, NULL, 0, &n) == 0 && n == 0, "empty context: %zu known workers", n);
    sr_tensor *t = t_full(2, 2, 1, true), *r = op_mode(RPC_SYNC, (rank + 1) % world, "add", t, t);
    WCHECK(r, "add: %s", sr_last_error());
    WCHECK(sr_dist_autograd_functions(ctx, true, NULL, 0, &n) == 0 && n == 1, "%zu send functions, want 1: %s", n,
           sr_last_error());
    WCHECK(sr_dist_autograd_functions(ctx, false, NULL, 0, &n) == 0 && n == 1, "%zu recv functions, want 1", n);
    WCHECK(sr_dist_autograd_known_workers(ctx, NULL, 0, &n) == 0 && n == 1, "%zu known workers, want 1", n);
    sr_tensor *loss = sr_sum(r);
    if (da_backward(ctx, &loss, 1, false, "count only"))
        return 1;
    CTX_END(ctx);
    sr_tensor *all[] = {t, r, loss};
    unref_tensors(all, 3);
    return 0;
}

Test(dist_autograd_graph, counts_without_a_buffer, .timeout = 60)
{
    DA_JOB("dacount", sc_count_only);
}

/* ---- a context ended while its calls are still running ---- */

/* The callee's part is still running (gate_add waits for its gate) when the
 * caller ends the context: the cleanup may reach the callee before, during
 * or after the call (under the reordering mode it may overtake the request
 * itself). The call still answers, and no context is left anywhere. */
static int sc_end_in_flight(int rank, int world)
{
    int next = (rank + 1) % world;
    for (int i = 0; i < 10; i++) {
        int64_t ctx;
        sr_tensor *t1 = t_rand(3, 3, true), *t2 = t_rand(3, 3, true);
        sr_value *a = tv(t1), *b = tv(t2), *out = NULL;
        sr_future *f = NULL;
        CTX_BEGIN(ctx);
        WCHECK(sr_rpc_async(next, "gate_add", SR_ARGS(a, b), WAIT_S, &f) == 0, "rpc_async: %s", sr_last_error());
        CTX_END(ctx);
        sem_post(&dash->gate[next]);
        WCHECK(sr_future_wait(f, &out) == 0, "a call of an ended context: %s", sr_last_error());
        WCHECK(sr_value_tensor(out), "the call answered %s", sr_kind_name(sr_value_type(out)));
        if (expect_gone_on(next, ctx, "a context ended during its call"))
            return 1;
        sr_future_unref(f);
        sr_value *vs[] = {a, b, out};
        unref_values(vs, 3);
        sr_tensor_unref(t1);
        sr_tensor_unref(t2);
    }
    if (da_barrier())
        return 1;
    return rank == 0 ? expect_no_contexts_anywhere("after contexts ended during their calls") : 0;
}

Test(dist_autograd_graph, context_ended_while_its_calls_run, .timeout = 120)
{
    DA_JOB("daendfly", sc_end_in_flight);
}

Test(dist_autograd_graph, twenty_threads_on_three_workers_one_executor_thread, .timeout = 180)
{
    DA_JOB("dathreads1", sc_threads, .opts = {.num_worker_threads = 1});
}

/* ---- test_rpc_complex_args / test_remote_complex_args ---- */

/* stack of 10 tensors, every other one requiring grad: the send function has
 * one next edge per tensor that requires grad, each its AccumulateGrad. */
static int sc_complex_args(int rank, int world)
{
    int dst = (rank + 1) % world;
    for (int m = RPC_SYNC; m <= REMOTE; m += REMOTE - RPC_SYNC) {
        enum { N = 10 };
        sr_tensor *ts[N];
        sr_value *vs[N];
        for (int i = 0; i < N; i++) {
            ts[i] = t_full(3, 3, 1, i % 2 == 0);
            vs[i] = tv(ts[i]);
        }
        int64_t ctx;
        CTX_BEGIN(ctx);
        sr_tensor *ret = take_tensor(call_mode((enum mode)m, dst, "stack", (sr_args){N, vs}));
        WCHECK(ret, "%s stack: %s", mode_name[m], sr_last_error());
        sr_tensor *local = sr_stack(ts, N, 0);
        if (expect_same(ret, local, 0, "the stacked result"))
            return 1;
        sr_dist_fn_info s[8];
        static const char *const acc5[] = {"AccumulateGrad", "AccumulateGrad", "AccumulateGrad", "AccumulateGrad",
                                           "AccumulateGrad"};
        if (get_fns(ctx, true, s, 1, mode_name[m]) || expect_next(&s[0], 5, acc5, mode_name[m]) ||
            expect_known(ctx, (int[]){dst}, 1, mode_name[m]))
            return 1;
        sr_tensor *loss = sr_sum(ret);
        if (da_backward(ctx, &loss, 1, false, "complex args") || expect_num_grads(ctx, 5, "complex args"))
            return 1;
        for (int i = 0; i < N; i += 2)
            if (expect_grad_all(ctx, ts[i], 1, "a stacked tensor"))
                return 1;
        CTX_END(ctx);
        unref_values(vs, N);
        unref_tensors(ts, N);
        sr_tensor_unref(ret);
        sr_tensor_unref(local);
        sr_tensor_unref(loss);
    }
    return 0;
}

Test(dist_autograd_graph, complex_args_only_tensors_that_require_grad_are_edges, .timeout = 60)
{
    DA_JOB("dacomplex", sc_complex_args);
}
