/* SPDX-License-Identifier: MIT */
/* Distributed autograd failures: a node that fails in backward 2, 3 and 4
 * hops away, and one on the caller behind 4 round trips (the caller gets
 * "Error on Node N: ..." and the same context then runs successful passes);
 * FAST mode's unused send function (-EDEADLK naming the call, never a
 * hang); a pass past the RPC timeout; a second pass in a running context
 * (-EBUSY); a context ended inside its own pass; running out of context ids
 * (-EOVERFLOW); calls before sr_init; contexts open at shutdown; a worker
 * that dies in the middle of a pass (-EPIPE, never a hang). The 4-worker
 * jobs also run under the reordering mode (tests/meson.build). */
#include "dist_autograd_fns.h"
#include "waiter.h" /* sr__now_ns */

LEAK_CHECKED_SUITE(dist_autograd_errors);

/* Test hook of lib/modules/dist_autograd: the counter of the next context id. */
extern void sr__dist_autograd_set_next_counter(uint64_t counter);

/* ---- errors in backward (test_backward_python_udf_error, test_multiple_backward_with_errors) ---- */

/* A chain t -> (hops forwards) -> t*3 with a failing hook at its end,
 * (1 + hops) workers away: every pass fails while our flag is set, then
 * passes succeed in the same context. */
static int error_chain(int hops)
{
    int rank = sr_rank(), world = sr_world_size(), failing = (rank + 1 + hops) % world;
    int64_t ctx;
    char want[64], what[64];
    snprintf(want, sizeof(want), "Error on Node %d: ", failing);
    snprintf(what, sizeof(what), "error %d hops away", hops + 1);
    atomic_store(&dash->fail[rank], 1);
    sr_tensor *t = t_rand(3, 3, true);
    CTX_BEGIN(ctx);
    sr_tensor *y = chain(RPC_SYNC, (rank + 1) % world, t, hops, CHAIN_FAIL), *loss = y ? sr_sum(y) : NULL;
    WCHECK(y, "%s: chain: %s", what, sr_last_error());
    for (int i = 0; i < 3; i++) {
        int rc = sr_dist_autograd_backward(ctx, &loss, 1, true);
        WEXPECT_ERR(rc, -SR_EREMOTE, want);
        WCHECK(strstr(sr_last_error(), "Simulate error on backward pass"), "%s: pass %d: %s", what, i, sr_last_error());
    }
    atomic_store(&dash->fail[rank], 0);
    double per_pass = 3.0 * (1 << hops);
    for (int i = 1; i <= 3; i++) {
        if (da_backward(ctx, &loss, 1, i < 3, what) ||
            expect_grad_all(ctx, t, per_pass * i, "the successful passes alone accumulate"))
            return 1;
    }
    CTX_END(ctx);
    sr_tensor *all[] = {t, y, loss};
    unref_tensors(all, 3);
    return 0;
}

static int sc_backward_errors(int rank, int world)
{
    (void)rank;
    (void)world;
    /* 2 and 3 hops away; 4 hops away is the caller itself, serving its own chain's last hop */
    if (error_chain(1) || da_barrier() || error_chain(2) || da_barrier() || error_chain(3) || da_barrier())
        return 1;
    return rank == 0 ? expect_no_contexts_anywhere("after the failed passes") : 0;
}

Test(dist_autograd_errors, error_two_three_and_four_hops_away_then_success, .timeout = 120)
{
    DA_JOB("daerrhops", sc_backward_errors);
}

/* test_backward_autograd_engine_error: the failing node is on the caller,
 * behind 4 round trips through the other workers. */
static int sc_engine_error(int rank, int world)
{
    (void)world;
    atomic_store(&dash->fail[rank], 1);
    int64_t ctx;
    sr_tensor *t1 = t_rand(3, 3, true), *r = t_rand(3, 3, false), *t2 = sr_add_scalar(r, 1);
    CTX_BEGIN(ctx);
    sr_tensor *s = sr_add(t1, t2), *tmp = sr_mul(s, s), *t3 = sr_mul_scalar(tmp, 1);
    WCHECK(sr_tensor_register_hook(t3, failing_hook, &dash->fail[rank]) == 0, "hook: %s", sr_last_error());
    sr_tensor *v1 = op_mode(RPC_SYNC, next_dst(), "add", t2, t3);
    sr_tensor *v2 = v1 ? op_mode(RPC_SYNC, next_dst(), "mul", v1, t2) : NULL;
    sr_tensor *v3 = v2 ? op_mode(RPC_SYNC, next_dst(), "matmul", v2, t2) : NULL;
    sr_tensor *v4 = v3 ? op_mode(RPC_SYNC, next_dst(), "div", v3, t2) : NULL, *loss = v4 ? sr_sum(v4) : NULL;
    WCHECK(loss, "round trips: %s", sr_last_error());
    int rc = sr_dist_autograd_backward(ctx, &loss, 1, true);
    WCHECK(rc < 0 && strstr(sr_last_error(), "Simulate error on backward pass"),
           "backward with a failing node here gave %d: %s", rc, sr_last_error());
    atomic_store(&dash->fail[rank], 0);
    if (da_backward(ctx, &loss, 1, false, "after the error") || expect_num_grads(ctx, 1, "after the error"))
        return 1;
    CTX_END(ctx);
    sr_tensor *all[] = {t1, r, t2, s, tmp, t3, v1, v2, v3, v4, loss};
    unref_tensors(all, 11);
    return 0;
}

Test(dist_autograd_errors, error_on_the_caller_behind_four_round_trips, .timeout = 120)
{
    DA_JOB("daerrlocal", sc_engine_error);
}

/* ---- test_backward_unused_send_function: -EDEADLK instead of a hang ---- */

static int sc_unused_send(int rank, int world)
{
    int next = (rank + 1) % world;
    int64_t ctx;
    sr_tensor *t1 = t_rand(3, 3, true), *t2 = t_rand(3, 3, true);
    CTX_BEGIN(ctx);
    sr_tensor *unused = op_mode(RPC_SYNC, next, "add", t1, t2);
    WCHECK(unused, "add: %s", sr_last_error());
    sr_tensor_unref(unused); /* the RPC's output is dropped */
    sr_tensor *p = sr_mul(t1, t2), *loss = sr_sum(p);
    int rc = sr_dist_autograd_backward(ctx, &loss, 1, false);
    char dst[32];
    snprintf(dst, sizeof(dst), "worker%d", next);
    WCHECK(rc == -EDEADLK && strstr(sr_last_error(), "add") && strstr(sr_last_error(), dst),
           "backward with an unused send function gave %d: %s", rc, sr_last_error());
    CTX_END(ctx);
    /* The next context works normally. */
    CTX_BEGIN(ctx);
    sr_tensor *used = op_mode(RPC_SYNC, next, "add", t1, t2), *l2 = used ? sr_sum(used) : NULL;
    if (da_backward(ctx, &l2, 1, false, "a used send function") || expect_grad_all(ctx, t1, 1, "used"))
        return 1;
    CTX_END(ctx);
    sr_tensor *all[] = {t1, t2, p, loss, used, l2};
    unref_tensors(all, 6);
    if (da_barrier())
        return 1;
    return rank == 0 ? expect_no_contexts_anywhere("after the unused send functions") : 0;
}

Test(dist_autograd_errors, unused_send_function_is_edeadlk_not_a_hang, .timeout = 120)
{
    DA_JOB("daunused", sc_unused_send, .opts = {.rpc_timeout_s = 20});
}

/* ---- running out of context ids ---- */

static int sc_overflow(int rank, int world)
{
    (void)world;
    if (rank != 1)
        return 0;
    int64_t max = sr_dist_autograd_max_id(), a, b = -5;
    sr__dist_autograd_set_next_counter((UINT64_C(1) << 48) - 2);
    CTX_BEGIN(a);
    WCHECK(a == max - 1, "context id %#llx, want %#llx", (unsigned long long)a, (unsigned long long)(max - 1));
    CTX_END(a);
    CTX_BEGIN(a);
    WCHECK(a == max, "the last context id is %#llx, want max_id %#llx", (unsigned long long)a,
           (unsigned long long)max);
    CTX_END(a);
    int rc = sr_dist_autograd_context_begin(&b);
    WCHECK(rc == -EOVERFLOW, "a context past max_id gave %d (id %#llx): %s", rc, (unsigned long long)b,
           sr_last_error());
    WCHECK(sr_dist_autograd_current_context() == SR_NO_CONTEXT, "a refused begin made a context current");
    WCHECK(sr_dist_autograd_context_begin(&b) == -EOVERFLOW, "ids wrapped around after the overflow");
    return 0;
}

Test(dist_autograd_errors, out_of_context_ids_is_eoverflow, .timeout = 60)
{
    DA_JOB("daoverflow", sc_overflow);
}

/* ---- before sr_init ---- */

Test(dist_autograd_errors, calls_before_init_fail_clearly)
{
    int64_t id = 0;
    cr_assert_eq(sr_dist_autograd_context_begin(&id), -SR_ESHUTDOWN, "%s", sr_last_error());
    cr_assert_eq(sr_dist_autograd_current_context(), SR_NO_CONTEXT);
    cr_assert(!sr_dist_autograd_is_valid_context(0));
    cr_assert(sr_dist_autograd_max_id() >= 0);
    /* Debug info is statistics: zeros before init, or the not-initialised error. */
    sr_dist_autograd_debug_info d = {7, 7};
    int rc = sr_dist_autograd_debug_info_get(&d);
    cr_assert(rc == -SR_ESHUTDOWN || (rc == 0 && d.num_autograd_contexts == 0 && d.num_current_backward_passes == 0),
              "debug info before init: %d (%s), %llu contexts", rc, sr_last_error(),
              (unsigned long long)d.num_autograd_contexts);
}

/* ---- a worker dies in the middle of a pass (test_backward_node_failure) ---- */

/* dying = 1: the callee dies in a hook of its part of the graph; dying = 2:
 * the worker the callee called does, one hop further. Worker 0 runs the
 * pass, which must fail, not hang. */
static int dying_worker(int rank, int world, void *arg)
{
    int dying = (int)(intptr_t)arg;
    register_da_fns();
    sr_init_opts o = {.rpc_timeout_s = 20};
    WCHECK(sr_init(&o) == 0, "init: %s", sr_last_error());
    if (rank != 0) { /* serve until the pass is over (or the hook ends this process) */
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 60;
        int rc;
        while ((rc = sem_timedwait(&dash->pass_over, &dl)) && errno == EINTR)
            ;
        WCHECK(rc == 0, "worker%d: worker0's pass did not end within 60 s", rank);
        WCHECK(rank != dying, "worker%d was to die in its hook but is alive after the pass", rank);
        sr_shutdown(false, 0);
        return 0;
    }
    atomic_store(&dash->exit_in_hook, 1);
    int64_t ctx;
    sr_tensor *t = t_rand(3, 3, true);
    CTX_BEGIN(ctx);
    sr_tensor *y = chain(RPC_SYNC, 1, t, dying - 1, CHAIN_EXIT), *loss = y ? sr_sum(y) : NULL;
    WCHECK(y, "chain: %s", sr_last_error());
    int rc = sr_dist_autograd_backward(ctx, &loss, 1, false);
    /* -EPIPE "a worker involved in the pass died", naming it, even when it
     * is not the one worker0 called */
    char dead[32];
    snprintf(dead, sizeof(dead), "worker%d", dying);
    WCHECK(rc == -EPIPE && strstr(sr_last_error(), dead), "a pass in which %s died gave %d: %s", dead, rc,
           sr_last_error());
    sr_dist_autograd_debug_info d;
    WCHECK(sr_dist_autograd_debug_info_get(&d) == 0 && d.num_current_backward_passes == 0,
           "the failed pass is still counted as running");
    sr_dist_autograd_context_end(ctx); /* cleanup to a dead worker must not block either */
    sr_tensor *all[] = {t, y, loss};
    unref_tensors(all, 3);
    for (int w = 1; w < world; w++) /* the survivors may leave */
        sem_post(&dash->pass_over);
    sr_shutdown(false, 0);
    return 0;
}

static void dying_setup(void)
{
    dash = shared_page(sizeof(*dash));
    cr_assert_eq(sem_init(&dash->pass_over, 1, 0), 0);
}

Test(dist_autograd_errors, callee_dies_during_backward, .timeout = 90)
{
    dying_setup();
    sr_spawn_opts o = {.name_prefix = test_ns("dadie1"), .shm_size = 128 << 20};
    cr_assert_eq(sr_spawn(2, dying_worker, (void *)(intptr_t)1, &o), 0, "%s", sr_last_error());
}

Test(dist_autograd_errors, worker_two_hops_away_dies_during_backward, .timeout = 90)
{
    dying_setup();
    sr_spawn_opts o = {.name_prefix = test_ns("dadie2"), .shm_size = 192 << 20};
    cr_assert_eq(sr_spawn(3, dying_worker, (void *)(intptr_t)2, &o), 0, "%s", sr_last_error());
}

/* ---- a leaf hook that changes the gradient's shape: PyTorch refuses ---- */

/* Replaces the gradient by a [3] (broadcastable into the [3, 3] leaf). */
static int shrink_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    _Atomic int *calls = arg;
    atomic_fetch_add(calls, 1);
    *replace = sr_ones(sr_tensor_dtype(grad), 1, DSHAPE(3), 0);
    return *replace ? 0 : -ENOMEM;
}

/* The gradient of t comes back from the next worker and reaches t's hook,
 * which returns a [3]: the pass fails with -EINVAL naming the hook and both
 * shapes, and the context stores nothing for t (it stored the [3]). The same
 * again for a pass that stays on this worker. */
static int sc_hook_shape(int rank, int world)
{
    int next = (rank + 1) % world;
    int64_t ctx;
    _Atomic int calls = 0;
    sr_tensor *t = t_rand(3, 3, true), *c = t_rand(3, 3, false);
    WCHECK(sr_tensor_register_hook(t, shrink_hook, &calls) == 0, "hook: %s", sr_last_error());
    CTX_BEGIN(ctx);
    sr_tensor *ret = op_mode(RPC_SYNC, next, "add", t, c), *loss = ret ? sr_sum(ret) : NULL;
    WCHECK(loss, "add: %s", sr_last_error());
    int rc = sr_dist_autograd_backward(ctx, &loss, 1, false);
    /* The gradient reached t in the pass's part that the callee's gradient
     * message started: reported as that node's error (docs/DIST_AUTOGRAD.md). */
    char want[160];
    snprintf(want, sizeof(want), "Error on Node %d: worker%d: sr_backward: hook 1 on a leaf f64 [3, 3] has changed the "
             "size of value (was [3, 3], got [3])", rank, rank);
    WEXPECT_ERR(rc, -SR_EREMOTE, want);
    WCHECK(atomic_load(&calls) == 1, "the hook ran %d times", atomic_load(&calls));
    if (expect_num_grads(ctx, 0, "after the hook's failure"))
        return 1;
    WCHECK(!sr_tensor_grad(t), "a distributed pass filled .grad");
    CTX_END(ctx);
    /* Without RPC: the same refusal, from the local part of a context. */
    CTX_BEGIN(ctx);
    sr_tensor *y = sr_mul_scalar(t, 2), *l2 = sr_sum(y);
    rc = sr_dist_autograd_backward(ctx, &l2, 1, false);
    WEXPECT_ERR(rc, -EINVAL, "has changed the size of value (was [3, 3], got [3])");
    if (expect_num_grads(ctx, 0, "after the local hook's failure"))
        return 1;
    CTX_END(ctx);
    sr_tensor *all[] = {t, c, ret, loss, y, l2};
    unref_tensors(all, 6);
    if (da_barrier())
        return 1;
    return rank == 0 ? expect_no_contexts_anywhere("after the hooks' failures") : 0;
}

Test(dist_autograd_errors, a_hook_that_changes_the_gradient_shape_fails_the_pass, .timeout = 120)
{
    DA_JOB("dahookshape", sc_hook_shape, .opts = {.rpc_timeout_s = 20});
}

/* ---- test_clean_context_during_backward: the context ends inside its own pass ---- */

struct end_arg {
    int64_t ctx;
    _Atomic int calls, end_rc;
};

static int end_context_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    (void)grad;
    (void)replace;
    struct end_arg *e = arg;
    if (atomic_fetch_add(&e->calls, 1) == 0)
        atomic_store(&e->end_rc, sr_dist_autograd_context_end(e->ctx));
    return 0;
}

static int sc_end_during_backward(int rank, int world)
{
    (void)world;
    struct end_arg e = {.ctx = -1};
    CTX_BEGIN(e.ctx);
    sr_tensor *t = t_rand(3, 3, true), *cur = sr_tensor_ref(t);
    for (int i = 0; i < 12; i++) { /* a chain through every other worker, several times */
        sr_tensor *n = op_mode(RPC_SYNC, next_dst(), "add", cur, cur);
        WCHECK(n, "add %d: %s", i, sr_last_error());
        sr_tensor_unref(cur);
        cur = n;
    }
    /* The hook runs first in the pass: on the root's input. */
    sr_tensor *last = sr_mul_scalar(cur, 1), *loss = sr_sum(last);
    WCHECK(sr_tensor_register_hook(last, end_context_hook, &e) == 0, "hook: %s", sr_last_error());
    int rc = sr_dist_autograd_backward(e.ctx, &loss, 1, false);
    /* Either outcome is allowed (PyTorch raises); the process must survive,
     * the call must return, and the context must be gone everywhere. */
    WCHECK(atomic_load(&e.calls) == 1, "the hook ran %d times", atomic_load(&e.calls));
    WCHECK(atomic_load(&e.end_rc) == 0, "context_end inside the pass gave %d", atomic_load(&e.end_rc));
    fprintf(stderr, "worker%d: a pass whose context ended inside it returned %d (%s)\n", rank, rc,
            rc ? sr_last_error() : "ok");
    WCHECK(!sr_dist_autograd_is_valid_context(e.ctx), "the context survived its end");
    WCHECK(sr_dist_autograd_current_context() == SR_NO_CONTEXT, "the ended context is still current");
    sr_tensor *all[] = {t, cur, last, loss};
    unref_tensors(all, 4);
    if (da_barrier())
        return 1;
    return rank == 0 ? expect_no_contexts_anywhere("after contexts ended inside their passes") : 0;
}

Test(dist_autograd_errors, context_ended_inside_its_own_pass, .timeout = 120)
{
    DA_JOB("daendmid", sc_end_during_backward, .opts = {.rpc_timeout_s = 20});
}

/* ---- a second pass rooted in the same context while one runs: -EBUSY ---- */

/* docs/DIST_AUTOGRAD.md: "a second pass rooted in the same context on the
 * same worker while one runs is -EBUSY". A hook holds the first pass (on
 * its own thread) until the second call has returned. */
struct busy {
    int64_t ctx;
    sr_tensor *root2;
    sem_t running, second_done;
    _Atomic int armed;
    int rc2;
    char err2[512];
};

static bool sem_wait_s(sem_t *s, int seconds)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += seconds;
    int rc;
    while ((rc = sem_timedwait(s, &dl)) && errno == EINTR)
        ;
    return rc == 0;
}

static int hold_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    (void)grad;
    (void)replace;
    struct busy *b = arg;
    if (atomic_exchange(&b->armed, 0) == 0) /* once */
        return 0;
    sem_post(&b->running);
    if (!sem_wait_s(&b->second_done, 10))
        return sr_errorf(-ETIMEDOUT, "the second backward call did not return while the first pass ran");
    return 0;
}

static void *second_pass(void *arg)
{
    struct busy *b = arg;
    if (!sem_wait_s(&b->running, (int)WAIT_S)) {
        b->rc2 = -ETIMEDOUT;
        snprintf(b->err2, sizeof(b->err2), "the first pass never reached its hook");
    } else {
        b->rc2 = sr_dist_autograd_backward(b->ctx, &b->root2, 1, false);
        snprintf(b->err2, sizeof(b->err2), "%s", b->rc2 ? sr_last_error() : "");
    }
    sem_post(&b->second_done);
    return NULL;
}

static int sc_busy(int rank, int world)
{
    struct busy b = {.rc2 = 1, .armed = 1};
    sem_init(&b.running, 0, 0);
    sem_init(&b.second_done, 0, 0);
    sr_tensor *t1 = t_rand(3, 3, true), *t2 = t_rand(3, 3, true);
    CTX_BEGIN(b.ctx);
    sr_tensor *y = op_mode(RPC_SYNC, (rank + 1) % world, "add", t1, t2), *held = y ? sr_mul_scalar(y, 1) : NULL;
    WCHECK(held, "add: %s", sr_last_error());
    WCHECK(sr_tensor_register_hook(held, hold_hook, &b) == 0, "hook: %s", sr_last_error());
    sr_tensor *loss = sr_sum(held), *sq = sr_mul(t1, t1);
    b.root2 = sr_sum(sq); /* local only: adds no send function to the context */
    pthread_t th;
    WCHECK(pthread_create(&th, NULL, second_pass, &b) == 0, "pthread_create");
    int rc = sr_dist_autograd_backward(b.ctx, &loss, 1, true);
    pthread_join(th, NULL);
    WCHECK(rc == 0, "the first pass: %d: %s", rc, sr_last_error());
    WCHECK(b.rc2 == -EBUSY, "a second pass rooted in the same context while one ran gave %d: %s", b.rc2, b.err2);
    /* Once the first has ended, another runs (through the RPC too: FAST
     * mode); every pass accumulates in the context. */
    if (da_backward(b.ctx, (sr_tensor *[]){loss, b.root2}, 2, false, "a pass after the first") ||
        expect_grad_all(b.ctx, t2, 2, "t2: one from each pass"))
        return 1;
    sr_tensor *g = NULL;
    WCHECK(sr_dist_autograd_get_gradient(b.ctx, t1, &g) == 0, "t1: %s", sr_last_error());
    double v[9], w[9];
    sr_tensor_to_f64(t1, v, 9);
    for (int i = 0; i < 9; i++)
        w[i] = 2 + 2 * v[i];
    if (expect_vals(g, w, 9, 1e-12, "t1: 1 from each pass through the RPC + 2 t1 from the local root"))
        return 1;
    CTX_END(b.ctx);
    sr_tensor *all[] = {t1, t2, y, held, loss, sq, b.root2, g};
    unref_tensors(all, 8);
    sem_destroy(&b.running);
    sem_destroy(&b.second_done);
    return 0;
}

Test(dist_autograd_errors, second_pass_in_a_running_context_is_ebusy, .timeout = 120)
{
    DA_JOB("dabusy", sc_busy);
}

/* ---- a pass that runs past the RPC timeout ---- */

/* The callee's part of the graph waits for its gate; worker0's pass, with a
 * 300 ms default timeout, fails with -ETIMEDOUT instead of waiting. Then the
 * gate opens, the late answer is dropped, and nothing stays in flight. */
static int sc_pass_timeout(int rank, int world)
{
    if (rank != 0)
        return 0;
    int64_t ctx;
    sr_tensor *t = t_rand(3, 3, true);
    CTX_BEGIN(ctx);
    sr_tensor *y = chain(RPC_SYNC, 1, t, 0, CHAIN_GATE), *loss = y ? sr_sum(y) : NULL;
    WCHECK(y, "chain: %s", sr_last_error());
    sr_set_rpc_timeout(0.3);
    int64_t t0 = sr__now_ns();
    int rc = sr_dist_autograd_backward(ctx, &loss, 1, false);
    double took = (double)(sr__now_ns() - t0) / 1e9;
    sr_set_rpc_timeout(WAIT_S);
    sem_post(&dash->gate[1]);
    WCHECK(rc == -ETIMEDOUT, "a pass whose remote part outlived the timeout gave %d after %.2f s: %s", rc, took,
           sr_last_error());
    WCHECK(took < 5, "the timed-out pass took %.2f s with a 0.3 s timeout", took);
    CTX_END(ctx);
    sr_tensor *all[] = {t, y, loss};
    unref_tensors(all, 3);
    (void)world;
    return 0;
}

Test(dist_autograd_errors, pass_past_the_rpc_timeout_is_etimedout, .timeout = 120)
{
    DA_JOB("datimeout", sc_pass_timeout);
}

/* ---- contexts alive at shutdown ---- */

/* Contexts still alive at sr_shutdown() are released, everywhere, and a new
 * round (sr_init again) starts with no context current on this thread. */
static int shutdown_worker(int rank, int world, void *arg)
{
    (void)arg;
    register_da_fns();
    int dbg_rc[2];
    uint64_t dbg_ctxs[2];
    for (int round = 0; round < 2; round++) {
        WCHECK(sr_init(NULL) == 0, "init round %d: %s", round, sr_last_error());
        WCHECK(sr_dist_autograd_current_context() == SR_NO_CONTEXT, "round %d starts with context %lld current",
               round, (long long)sr_dist_autograd_current_context());
        int64_t ctx;
        CTX_BEGIN(ctx);
        sr_tensor *t = t_rand(3, 3, true), *y = op_mode(RPC_SYNC, (rank + 1) % world, "add", t, t);
        WCHECK(y, "add: %s", sr_last_error());
        sr_tensor *loss = sr_sum(y);
        if (da_backward(ctx, &loss, 1, true, "before shutdown") || da_barrier())
            return 1;
        sr_tensor *all[] = {t, y, loss}; /* tensors live in the job's heap: drop them before leaving it */
        unref_tensors(all, 3);
        /* the context is left open, here and on the callee */
        WCHECK(sr_shutdown(true, 30) == 0, "round %d: graceful shutdown with a context open: %s", round,
               sr_last_error());
        WCHECK(!sr_dist_autograd_is_valid_context(ctx), "round %d: the context survived shutdown", round);
        WCHECK(sr_dist_autograd_current_context() == SR_NO_CONTEXT, "round %d: a context is current after shutdown",
               round);
        sr_dist_autograd_debug_info d = {1, 1};
        dbg_rc[round] = sr_dist_autograd_debug_info_get(&d);
        dbg_ctxs[round] = d.num_autograd_contexts;
        WCHECK(sr_dist_autograd_context_begin(&ctx) == -SR_ESHUTDOWN, "a context began after shutdown");
    }
    /* Checked last, so that a stale count does not hide the rest. */
    for (int round = 0; round < 2; round++)
        WCHECK(dbg_rc[round] == -SR_ESHUTDOWN || (dbg_rc[round] == 0 && dbg_ctxs[round] == 0),
               "round %d: debug info after shutdown reports %llu contexts (rc %d)", round,
               (unsigned long long)dbg_ctxs[round], dbg_rc[round]);
    return 0;
}

Test(dist_autograd_errors, contexts_open_at_shutdown_are_released, .timeout = 120)
{
    dash = shared_page(sizeof(*dash));
    sr_spawn_opts o = {.name_prefix = test_ns("dashut"), .shm_size = 256 << 20};
    cr_assert_eq(sr_spawn(WORLD, shutdown_worker, NULL, &o), 0, "%s", sr_last_error());
}
