/* SPDX-License-Identifier: MIT */
/* Distributed autograd when a worker dies and its rank is replaced
 * (sr_spawn's SR_RESTART_RANK; docs/DIST_AUTOGRAD.md, "A worker dies and
 * is replaced").
 *
 * Three workers: rank 0 drives, rank 1 is the victim, rank 2 a bystander
 * that serves from sr_shutdown. Rank 0 holds contexts that involve rank 1
 * (A, K), one that involves rank 2 only (B), and rank 1's generation 0
 * makes one (V) that reaches ranks 0 and 2. A backward pass in K kills rank
 * 1 in the middle of the pass; once its replacement said hello:
 *   - K's pass failed with -EPIPE naming worker1 and its generation;
 *   - a pass in A fails at once with the death ("worker1 (generation 0) was
 *     killed by signal SIGKILL"), where it reached the new generation;
 *   - B's passes succeed, before and after;
 *   - a distributed optimizer (its parameter on rank 2) steps with B, and
 *     fails with the death when it steps with A;
 *   - V is gone from ranks 0 and 2 (nothing would ever release it);
 *   - generation 1 makes a context whose id differs from V's, runs a pass
 *     in it with ranks 0 and 2, and its release reaches them;
 *   - A forgot worker1: its release reaches rank 2 and sends nothing to
 *     generation 1, which receives no cleanup at all (checked after its
 *     graceful shutdown, which waits for every cleanup to be read);
 *   - no context is left on ranks 0 and 2.
 * Every wait is on an event (a call's answer, the hello) or a bounded poll
 * paced by an RPC's answer; the job also runs under the reordering mode
 * (meson.build). Survivors hold no tensor block of the victim past its death
 * (results are reduced to the caller's own tensors at once): the dead
 * generation's heap area is re-attached by its replacement.
 *
 * Workers are forked copies of this test process: no Criterion call in them.
 */
#include <criterion/criterion.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "error.h"
#include "helpers/replace_events.h"
#include "rpc_harness.h"
#include "shmrpc/dist_autograd.h"
#include "shmrpc/dist_optim.h"
#include "shmrpc/rpc.h"
#include "shmrpc/spawn.h"
#include "shmrpc/tensor.h"

LEAK_CHECKED_SUITE(dist_autograd_replace);

#define WAIT_S 20
#define NW 3

/* Test hook of lib/modules/dist_autograd (cleanup.c): cleanups that found no context. */
extern _Atomic uint64_t sr__dist_cleanups_unknown;

/* ---- tensors ---- */
static sr_tensor *ones(bool rg) { return sr_full(SR_F64, 2, (const int64_t[]){2, 2}, 1.0, rg ? SR_REQUIRES_GRAD : 0); }

static sr_value *tval(sr_tensor *t) { return sr_value_from_tensor(t); }

/* sum(fn(a, a) on `to`): the result is reduced here at once, so this worker
 * keeps no block of `to`'s; NULL with the error. */
static sr_tensor *remote_sum(int to, const char *fn, sr_tensor *a, bool twice)
{
    sr_value *va = tval(a), *r = NULL;
    int rc = twice ? sr_rpc_sync(to, fn, SR_ARGS(va, va), WAIT_S, &r) : sr_rpc_sync(to, fn, SR_ARGS(va), WAIT_S, &r);
    sr_value_unref(va);
    sr_tensor *t = rc ? NULL : sr_value_tensor(r), *s = t ? sr_sum(t) : NULL;
    sr_value_unref(r);
    return s;
}

/* The gradient of leaf in ctx is all v here. */
static int expect_grad(int64_t ctx, const sr_tensor *leaf, double v, const char *what)
{
    sr_tensor *g = NULL;
    int rc = sr_dist_autograd_get_gradient(ctx, leaf, &g);
    WCHECK(rc == 0, "%s: get_gradient: %d: %s", what, rc, sr_last_error());
    const double *d = sr_tensor_data(g);
    bool ok = sr_tensor_numel(g) == 4;
    for (int i = 0; ok && i < 4; i++)
        ok = d[i] == v;
    sr_tensor_unref(g);
    WCHECK(ok, "%s: the gradient is not all %g", what, v);
    return 0;
}

/* ---- functions every rank registers ---- */
static int fn_add(sr_call *c)
{
    sr_tensor *s = sr_add(sr_value_tensor(sr_call_arg(c, 0)), sr_value_tensor(sr_call_arg(c, 1)));
    if (!s)
        return sr_call_fail(c, -EINVAL, "add: %s", sr_last_error());
    sr_value *v = tval(s);
    sr_tensor_unref(s);
    return sr_call_return(c, v);
}

static int kill_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    (void)grad, (void)replace, (void)arg;
    raise(SIGKILL); /* in the middle of the pass: the driver waits for this worker's gradients */
    return 0;
}

/* a * 2, whose gradient kills this worker. */
static int fn_kill_on_grad(sr_call *c)
{
    sr_tensor *y = sr_mul_scalar(sr_value_tensor(sr_call_arg(c, 0)), 2);
    if (!y || sr_tensor_register_hook(y, kill_hook, NULL)) {
        sr_tensor_unref(y);
        return sr_call_fail(c, -EINVAL, "kill_on_grad: %s", sr_last_error());
    }
    sr_value *v = tval(y);
    sr_tensor_unref(y);
    return sr_call_return(c, v);
}

/* make_ctx, on a thread of its own (its current context ends with it): a
 * context that reaches ranks 0 and 2, left open. Generation 1 also runs a
 * pass in it. */
struct made {
    int64_t id;
    char err[512];
};

static void *make_ctx_thread(void *arg)
{
    struct made *m = arg;
    sr_tensor *t = ones(true), *a = NULL, *b = NULL, *loss = NULL;
    if (sr_dist_autograd_context_begin(&m->id)) {
        snprintf(m->err, sizeof(m->err), "context_begin: %s", sr_last_error());
        goto out;
    }
    a = remote_sum(0, "add", t, true);
    b = a ? remote_sum(2, "add", t, true) : NULL;
    loss = b ? sr_add(a, b) : NULL;
    if (!loss) {
        snprintf(m->err, sizeof(m->err), "the calls in context %lld: %s", (long long)m->id, sr_last_error());
        goto out;
    }
    if (replace_my_gen() > 0) {
        int rc = sr_dist_autograd_backward(m->id, &loss, 1, false);
        sr_tensor *g = NULL;
        if (rc || sr_dist_autograd_get_gradient(m->id, t, &g) || ((const double *)sr_tensor_data(g))[0] != 4.0)
            snprintf(m->err, sizeof(m->err), "generation %u's pass in context %lld: %d: %s", replace_my_gen(),
                     (long long)m->id, rc, rc ? sr_last_error() : "a wrong gradient");
        sr_tensor_unref(g);
    }
out:;
    sr_tensor *all[] = {t, a, b, loss};
    for (int i = 0; i < 4; i++)
        sr_tensor_unref(all[i]);
    return NULL;
}

static int fn_make_ctx(sr_call *c)
{
    struct made m = {.id = SR_NO_CONTEXT};
    pthread_t th;
    if (pthread_create(&th, NULL, make_ctx_thread, &m))
        return sr_call_fail(c, -EAGAIN, "make_ctx: pthread_create");
    pthread_join(th, NULL);
    if (m.err[0])
        return sr_call_fail(c, -EINVAL, "rank %d generation %u: %s", sr_rank(), replace_my_gen(), m.err);
    return sr_call_return(c, sr_int(m.id));
}

/* A parameter (a leaf of all ones) for the distributed optimizer. */
static int fn_param(sr_call *c)
{
    sr_tensor *p = ones(true);
    sr_value *v = p ? tval(p) : NULL;
    sr_tensor_unref(p);
    return v ? sr_call_return(c, v) : sr_call_fail(c, -ENOMEM, "param: out of memory");
}

static int fn_end_ctx(sr_call *c)
{
    int rc = sr_dist_autograd_context_end(sr_value_int(sr_call_arg(c, 0)));
    return rc ? sr_call_fail(c, rc, "end_ctx: %s", sr_last_error()) : sr_call_return(c, NULL);
}

static int fn_has_ctx(sr_call *c)
{
    return sr_call_return(c, sr_bool(sr_dist_autograd_is_valid_context(sr_value_int(sr_call_arg(c, 0)))));
}

static int fn_nctx(sr_call *c)
{
    sr_dist_autograd_debug_info d = {0};
    sr_dist_autograd_debug_info_get(&d);
    return sr_call_return(c, sr_int((int64_t)(d.num_autograd_contexts + d.num_current_backward_passes)));
}

static void register_fns(void)
{
    sr_register("hello", replace_fn_hello);
    sr_register("add", fn_add);
    sr_register("kill_on_grad", fn_kill_on_grad);
    sr_register("make_ctx", fn_make_ctx);
    sr_register("end_ctx", fn_end_ctx);
    sr_register("param", fn_param);
    sr_register("has_ctx", fn_has_ctx);
    sr_register("nctx", fn_nctx);
}

/* fn(arg) on `to`, from the driver's thread, which never has a current
 * context (build() makes each context on a thread of its own): these calls
 * record nothing. */
static int call_i64(int to, const char *fn, int64_t arg, bool with_arg, int64_t *out)
{
    sr_value *a = sr_int(arg), *v = NULL;
    int rc = with_arg ? sr_rpc_sync(to, fn, SR_ARGS(a), WAIT_S, &v) : sr_rpc_sync(to, fn, SR_ARGS(), WAIT_S, &v);
    sr_value_unref(a);
    if (!rc && out)
        *out = sr_value_type(v) == SR_KIND_BOOL ? sr_value_bool(v) : sr_value_int(v);
    sr_value_unref(v);
    return rc;
}

/* Poll `fn(arg)` on `to` (each try paced by its answer) until it gives want; bounded. */
static int poll_until(int to, const char *fn, int64_t arg, bool with_arg, int64_t want, const char *what)
{
    int64_t end = time(NULL) + WAIT_S, got = -1;
    do {
        int rc = call_i64(to, fn, arg, with_arg, &got);
        WCHECK(rc == 0, "%s: %s on rank %d: %s", what, fn, to, sr_last_error());
    } while (got != want && time(NULL) < end);
    WCHECK(got == want, "%s: %s on rank %d gave %lld, not %lld, for %d s", what, fn, to, (long long)got,
           (long long)want, WAIT_S);
    return 0;
}

/* A context of the driver's, made on a thread of its own (so that the
 * driver's thread never has a current context): its leaf (all ones) and
 * its loss, of the calls `kind` says. */
enum kind { ONLY_2, WITH_1_AND_2, KILLS_1 };

struct build {
    enum kind kind;
    int64_t id;
    sr_tensor *leaf, *loss;
    char err[512];
};

static void *build_thread(void *arg)
{
    struct build *x = arg;
    x->leaf = ones(true);
    if (sr_dist_autograd_context_begin(&x->id)) {
        snprintf(x->err, sizeof(x->err), "context_begin: %s", sr_last_error());
        return NULL;
    }
    if (x->kind == ONLY_2) {
        x->loss = remote_sum(2, "add", x->leaf, true);
    } else if (x->kind == KILLS_1) {
        x->loss = remote_sum(1, "kill_on_grad", x->leaf, false);
    } else {
        sr_tensor *a = remote_sum(1, "add", x->leaf, true), *b = a ? remote_sum(2, "add", x->leaf, true) : NULL;
        x->loss = b ? sr_add(a, b) : NULL;
        sr_tensor_unref(a);
        sr_tensor_unref(b);
    }
    if (!x->loss)
        snprintf(x->err, sizeof(x->err), "the calls of context %lld: %s", (long long)x->id, sr_last_error());
    return NULL;
}

static int build(struct build *x, enum kind kind)
{
    *x = (struct build){.kind = kind, .id = SR_NO_CONTEXT};
    pthread_t th;
    WCHECK(pthread_create(&th, NULL, build_thread, x) == 0, "pthread_create");
    pthread_join(th, NULL);
    WCHECK(!x->err[0], "context of kind %d: %s", kind, x->err);
    return 0;
}

static void unbuild(struct build *x)
{
    sr_tensor_unref(x->leaf);
    sr_tensor_unref(x->loss);
}

/* The one line that says how rank 1 died (lib/transport: gone_text). */
#define DEATH "worker1 (generation 0) was killed by signal SIGKILL"

static int driver(void)
{
    struct build a, b, k;
    int64_t v = -1, v2 = -1, yes = -1;
    /* B: rank 2 only; its pass succeeds before the death */
    if (build(&b, ONLY_2))
        return 1;
    WCHECK(sr_dist_autograd_backward(b.id, &b.loss, 1, true) == 0, "B before the death: %s", sr_last_error());
    if (expect_grad(b.id, b.leaf, 2, "B before the death") || build(&a, WITH_1_AND_2) || build(&k, KILLS_1))
        return 1;
    /* V: rank 1 generation 0's, reaching ranks 0 and 2 */
    WCHECK(call_i64(1, "make_ctx", 0, false, &v) == 0, "make_ctx on generation 0: %s", sr_last_error());
    WCHECK(sr_dist_autograd_is_valid_context(v), "V (%#llx) is not here after its call", (unsigned long long)v);
    WCHECK(call_i64(2, "has_ctx", v, true, &yes) == 0 && yes == 1, "V is not on rank 2: %s", sr_last_error());

    /* K: rank 1 dies in the middle of the pass, which waits for its gradients */
    int rc = sr_dist_autograd_backward(k.id, &k.loss, 1, false);
    WCHECK(rc == -EPIPE && strstr(sr_last_error(), "worker1") && strstr(sr_last_error(), "generation 0"),
           "the pass rank 1 died in gave %d: %s", rc, sr_last_error());
    WCHECK(replace_wait_hello(1) == 0, "rank 1's replacement never said hello within %d s", WAIT_S);
    /* Its death was handled here before its return was (lib/rpc/exits.c). */

    /* A involved rank 1: it fails at once, naming the dead generation, not the new one */
    rc = sr_dist_autograd_backward(a.id, &a.loss, 1, false);
    WCHECK(rc == -EPIPE && strstr(sr_last_error(), DEATH), "a pass in A after the replacement gave %d: %s", rc,
           sr_last_error());
    sr_tensor *g = NULL;
    rc = sr_dist_autograd_get_gradient(a.id, a.leaf, &g);
    WCHECK(rc == -EPIPE && strstr(sr_last_error(), DEATH), "A's gradients after the death: %d: %s", rc, sr_last_error());
    /* B is untouched */
    WCHECK(sr_dist_autograd_backward(b.id, &b.loss, 1, false) == 0, "B after the replacement: %s", sr_last_error());
    if (expect_grad(b.id, b.leaf, 4, "B after the replacement"))
        return 1;
    /* the distributed optimizer: A's step fails with the death, B's works */
    sr_rref *p = NULL;
    sr_dist_optim *d = NULL;
    WCHECK(sr_remote(2, "param", SR_ARGS(), WAIT_S, &p) == 0, "remote param: %s", sr_last_error());
    WCHECK(sr_dist_optim_create(SR_OPTIM_SGD, &(sr_optim_opts){.lr = 0.1}, &p, 1, &d) == 0, "optimizer: %s",
           sr_last_error());
    rc = sr_dist_optim_step(d, a.id);
    WCHECK(rc == -EPIPE && strstr(sr_last_error(), DEATH), "a step with A gave %d: %s", rc, sr_last_error());
    WCHECK(sr_dist_optim_step(d, b.id) == 0, "a step with B: %s", sr_last_error());
    sr_dist_optim_destroy(d);
    sr_rref_unref(p);
    /* V is gone: nothing would ever release it */
    WCHECK(!sr_dist_autograd_is_valid_context(v), "V (%#llx), rank 1 generation 0's, is still here",
           (unsigned long long)v);
    if (poll_until(2, "has_ctx", v, true, 0, "V on rank 2"))
        return 1;

    /* generation 1: a context whose id is not V's, a pass in it, its release reaches us */
    WCHECK(call_i64(1, "make_ctx", 0, false, &v2) == 0, "make_ctx on generation 1: %s", sr_last_error());
    WCHECK(v2 != v, "generation 1 made context %#llx, the id of generation 0's V", (unsigned long long)v2);
    WCHECK(sr_dist_autograd_is_valid_context(v2), "generation 1's context is not here");
    WCHECK(call_i64(1, "end_ctx", v2, true, NULL) == 0, "end_ctx: %s", sr_last_error());
    if (poll_until(2, "has_ctx", v2, true, 0, "generation 1's context on rank 2"))
        return 1;

    /* A's release: rank 2 only (A forgot rank 1) */
    int ranks[NW];
    size_t n = 0;
    WCHECK(sr_dist_autograd_known_workers(a.id, ranks, NW, &n) == 0 && n == 1 && ranks[0] == 2,
           "A knows %zu workers (the first: %d), not rank 2 alone", n, n ? ranks[0] : -1);
    WCHECK(sr_dist_autograd_context_end(a.id) == 0, "end A: %s", sr_last_error());
    WCHECK(sr_dist_autograd_context_end(b.id) == 0, "end B: %s", sr_last_error());
    WCHECK(sr_dist_autograd_context_end(k.id) == 0, "end K: %s", sr_last_error());
    if (poll_until(2, "nctx", 0, false, 0, "contexts left on rank 2") ||
        poll_until(0, "nctx", 0, false, 0, "contexts left on rank 0"))
        return 1;
    unbuild(&a);
    unbuild(&b);
    unbuild(&k);
    return 0;
}

static int worker(int rank, int world, void *arg)
{
    (void)world, (void)arg;
    register_fns();
    WCHECK(sr_init(NULL) == 0, "rank %d generation %u: sr_init: %s", rank, replace_my_gen(), sr_last_error());
    if (rank == 1 && replace_my_gen() == 0) { /* serve until the pass in K kills this process */
        poll(NULL, 0, 3 * WAIT_S * 1000); /* a bound, not a synchronisation */
        return 99;
    }
    if (rank == 1)
        WCHECK(sr_rpc_sync(0, "hello", SR_ARGS(), WAIT_S, NULL) == 0, "hello: %s", sr_last_error());
    if (rank == 0 && driver())
        return 1;
    int sd = sr_shutdown(true, 3 * WAIT_S);
    WCHECK(sd == 0, "rank %d generation %u: graceful shutdown: %s", rank, replace_my_gen(), sr_last_error());
    /* relaxed: this process's own counter, every cleanup read before the shutdown's end */
    uint64_t stray = atomic_load_explicit(&sr__dist_cleanups_unknown, memory_order_relaxed);
    WCHECK(rank != 1 || stray == 0, "rank 1 generation %u received %llu cleanups for contexts it never had",
           replace_my_gen(), (unsigned long long)stray);
    return 0;
}

Test(dist_autograd_replace, contexts_of_a_dead_generation, .timeout = 120)
{
    sr_spawn_opts o = {.name_prefix = test_ns("dareplace"), .shm_size = NW * (64u << 20),
                       .restart = SR_RESTART_RANK, .max_restarts = 1};
    int rc = sr_spawn(NW, worker, NULL, &o);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
}
