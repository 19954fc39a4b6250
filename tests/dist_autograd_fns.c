/* SPDX-License-Identifier: MIT */
/* Functions and helpers shared by the distributed autograd suites
 * (test_dist_autograd*.c), declared in dist_autograd_fns.h: the user
 * functions every worker registers (ports of the helpers of PyTorch's
 * dist_autograd_test.py), calls in each of PyTorch's execution modes, notes
 * passed between workers, and checks of gradients and of a context's
 * send/recv functions. */
#include "dist_autograd_fns.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "waiter.h" /* sr__now_ns */

/* ---- state shared by the job's processes (mapped before sr_spawn) ---- */
struct da_shared *dash;

/* gate_add(a, b): a + b once the caller opened this worker's gate (bounded). */
static int fn_gate_add(sr_call *c)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += (time_t)WAIT_S;
    int rc;
    while ((rc = sem_timedwait(&dash->gate[sr_rank()], &dl)) && errno == EINTR)
        ;
    if (rc)
        return sr_call_fail(c, -ETIMEDOUT, "gate_add: the gate of worker%d was not opened", sr_rank());
    sr_tensor *r = sr_add(sr_value_tensor(sr_call_arg(c, 0)), sr_value_tensor(sr_call_arg(c, 1)));
    if (!r)
        return sr_call_fail(c, -EINVAL, "gate_add: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(r);
    sr_tensor_unref(r);
    return sr_call_return(c, v);
}

bool reordering(void)
{
    const char *s = getenv("SHMRPC_REORDER_SEED");
    return s && *s;
}

/* ---- small tensor helpers ---- */

sr_tensor *t_full(int64_t r, int64_t c, double v, bool rg)
{
    return sr_full(SR_F64, 2, DSHAPE(r, c), v, rg ? SR_REQUIRES_GRAD : 0);
}

sr_tensor *t_rand(int64_t r, int64_t c, bool rg)
{
    return sr_rand(SR_F64, 2, DSHAPE(r, c), rg ? SR_REQUIRES_GRAD : 0);
}

/* A fresh leaf with t's values (no history), requiring grad if rg. */
sr_tensor *leaf_copy(sr_tensor *t, bool rg)
{
    sr_tensor *d = sr_detach(t), *c = d ? sr_clone(d) : NULL;
    sr_tensor_unref(d);
    if (c && rg && sr_tensor_set_requires_grad(c, true)) {
        sr_tensor_unref(c);
        return NULL;
    }
    return c;
}

/* got (may be NULL) equals want[0..n) within tol (relative to max(1,|want|)). */
int expect_vals(const sr_tensor *got, const double *want, size_t n, double tol, const char *what)
{
    WCHECK(got, "%s: no tensor (%s)", what, sr_last_error());
    WCHECK(sr_tensor_numel(got) == n, "%s: %zu elements, want %zu", what, sr_tensor_numel(got), n);
    double *g = malloc(n * sizeof(*g));
    WCHECK(g && sr_tensor_to_f64(got, g, n) == 0, "%s: to_f64: %s", what, sr_last_error());
    for (size_t i = 0; i < n; i++) {
        double w = want[i], scale = fabs(w) > 1 ? fabs(w) : 1;
        if (!(fabs(g[i] - w) <= tol * scale)) {
            fprintf(stderr, "worker check failed: %s: element %zu is %.17g, want %.17g\n", what, i, g[i], w);
            free(g);
            return 1;
        }
    }
    free(g);
    return 0;
}

/* got equals the tensor want (same shape and dtype, values within tol). */
int expect_same(const sr_tensor *got, const sr_tensor *want, double tol, const char *what)
{
    WCHECK(got && want, "%s: missing tensor (got %p, want %p)", what, (const void *)got, (const void *)want);
    WCHECK(sr_tensor_dtype(got) == sr_tensor_dtype(want), "%s: dtype %s, want %s", what,
           sr_dtype_name(sr_tensor_dtype(got)), sr_dtype_name(sr_tensor_dtype(want)));
    WCHECK(sr_tensor_ndim(got) == sr_tensor_ndim(want), "%s: ndim %d, want %d", what, sr_tensor_ndim(got),
           sr_tensor_ndim(want));
    for (int i = 0; i < sr_tensor_ndim(got); i++)
        WCHECK(sr_tensor_shape(got)[i] == sr_tensor_shape(want)[i], "%s: dim %d is %lld, want %lld", what, i,
               (long long)sr_tensor_shape(got)[i], (long long)sr_tensor_shape(want)[i]);
    size_t n = sr_tensor_numel(want);
    double *w = malloc(n * sizeof(*w));
    WCHECK(w && sr_tensor_to_f64(want, w, n) == 0, "%s: to_f64", what);
    int rc = expect_vals(got, w, n, tol, what);
    free(w);
    return rc;
}

/* Every element of got is v. */
int expect_all(const sr_tensor *got, double v, const char *what)
{
    WCHECK(got, "%s: no tensor (%s)", what, sr_last_error());
    size_t n = sr_tensor_numel(got);
    double *w = malloc(n * sizeof(*w));
    for (size_t i = 0; i < n; i++)
        w[i] = v;
    int rc = expect_vals(got, w, n, 0, what);
    free(w);
    return rc;
}

/* The context's gradient for leaf is all v. */
int expect_grad_all(int64_t ctx, const sr_tensor *leaf, double v, const char *what)
{
    sr_tensor *g = NULL;
    int rc = sr_dist_autograd_get_gradient(ctx, leaf, &g);
    WCHECK(rc == 0, "%s: get_gradient: %d: %s", what, rc, sr_last_error());
    WCHECK(sr_tensor_dtype(g) == sr_tensor_dtype(leaf), "%s: gradient dtype %s, leaf %s", what,
           sr_dtype_name(sr_tensor_dtype(g)), sr_dtype_name(sr_tensor_dtype(leaf)));
    rc = expect_all(g, v, what);
    sr_tensor_unref(g);
    return rc;
}

/* The context holds exactly n gradients on this worker. */
int expect_num_grads(int64_t ctx, size_t want, const char *what)
{
    size_t n = 0;
    sr_tensor **ts = NULL, **gs = NULL;
    int rc = sr_dist_autograd_get_gradients(ctx, &n, &ts, &gs);
    WCHECK(rc == 0, "%s: get_gradients: %s", what, sr_last_error());
    sr_dist_autograd_gradients_free(n, ts, gs);
    WCHECK(n == want, "%s: %zu gradients in the context, want %zu", what, n, want);
    return 0;
}

/* ---- values ---- */

sr_value *tv(sr_tensor *t) { return sr_value_from_tensor(t); }

void unref_values(sr_value **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sr_value_unref(v[i]);
}

void unref_tensors(sr_tensor **t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sr_tensor_unref(t[i]);
}

/* The tensor in v (a new reference), consuming v; NULL if v holds none. */
sr_tensor *take_tensor(sr_value *v)
{
    sr_tensor *t = v ? sr_value_tensor(v) : NULL;
    if (t)
        sr_tensor_ref(t);
    else if (v)
        sr_errorf(-EINVAL, "expected a tensor, got %s", sr_kind_name(sr_value_type(v)));
    sr_value_unref(v);
    return t;
}

/* ---- the operations, computed locally (LOCAL mode and the UDFs) ---- */

static inline sr_value *local_op(const char *fn, size_t n, sr_value *const *a)
{
    sr_tensor *x = n > 0 ? sr_value_tensor(a[0]) : NULL, *y = n > 1 ? sr_value_tensor(a[1]) : NULL, *r = NULL;
    if (!strcmp(fn, "add"))
        r = sr_add(x, y);
    else if (!strcmp(fn, "sub"))
        r = sr_sub(x, y);
    else if (!strcmp(fn, "mul"))
        r = sr_mul(x, y);
    else if (!strcmp(fn, "div"))
        r = sr_div(x, y);
    else if (!strcmp(fn, "matmul"))
        r = sr_matmul(x, y);
    else if (!strcmp(fn, "bmm"))
        r = sr_bmm(x, y);
    else if (!strcmp(fn, "cos"))
        r = sr_cos(x);
    else if (!strcmp(fn, "sum"))
        r = sr_sum(x);
    else if (!strcmp(fn, "stack")) {
        sr_tensor *ts[16];
        for (size_t i = 0; i < n && i < 16; i++)
            ts[i] = sr_value_tensor(a[i]);
        r = sr_stack(ts, n, 0);
    } else if (!strcmp(fn, "narrow"))
        r = sr_narrow(x, (int)sr_value_int(a[1]), sr_value_int(a[2]), sr_value_int(a[3]));
    else if (!strcmp(fn, "mixed_op")) /* PyTorch's _mixed_requires_grad_operaton */
        r = sr_tensor_requires_grad(y) ? sr_sub(x, y) : sr_mul(x, y);
    else if (!strcmp(fn, "chunk")) {
        sr_tensor *out[16];
        int k = sr_chunk(x, (int)sr_value_int(a[1]), (int)sr_value_int(a[2]), out);
        if (k < 0)
            return NULL;
        sr_value *items[16];
        for (int i = 0; i < k; i++) {
            items[i] = tv(out[i]);
            sr_tensor_unref(out[i]);
        }
        sr_value *l = sr_list((size_t)k, items);
        unref_values(items, (size_t)k);
        return l;
    } else {
        sr_errorf(-EINVAL, "local_op: unknown op %s", fn);
        return NULL;
    }
    if (!r)
        return NULL;
    sr_value *v = tv(r);
    sr_tensor_unref(r);
    return v;
}

static int udf_local_op(sr_call *c, const char *fn)
{
    sr_value *a[16];
    size_t n = sr_call_nargs(c);
    for (size_t i = 0; i < n && i < 16; i++)
        a[i] = sr_call_arg(c, i);
    sr_value *v = local_op(fn, n, a);
    if (!v)
        return sr_call_fail(c, -EINVAL, "%s: %s", fn, sr_last_error());
    return sr_call_return(c, v);
}

static int fn_stack(sr_call *c) { return udf_local_op(c, "stack"); }
static int fn_narrow(sr_call *c) { return udf_local_op(c, "narrow"); }
static int fn_chunk(sr_call *c) { return udf_local_op(c, "chunk"); }
static int fn_mixed_op(sr_call *c) { return udf_local_op(c, "mixed_op"); }
/* my_py_add: torch.add as a user function. */
static int fn_py_add(sr_call *c) { return udf_local_op(c, "add"); }

/* ---- execution modes (PyTorch's ExecMode) ---- */

const char *const mode_name[] = {"local", "rpc_sync", "rpc_async", "remote"};

/* fn(args) on dst in mode m: the result value, or NULL with the error. */
sr_value *call_mode(enum mode m, int dst, const char *fn, sr_args args)
{
    sr_value *out = NULL;
    int rc = 0;
    switch (m) {
    case LOCAL:
        return local_op(fn, args.n, args.v);
    case RPC_SYNC:
        rc = sr_rpc_sync(dst, fn, args, WAIT_S, &out);
        break;
    case RPC_ASYNC: {
        sr_future *f = NULL;
        rc = sr_rpc_async(dst, fn, args, WAIT_S, &f);
        if (!rc)
            rc = sr_future_wait(f, &out);
        sr_future_unref(f);
        break;
    }
    case REMOTE: {
        sr_rref *r = NULL;
        rc = sr_remote(dst, fn, args, WAIT_S, &r);
        if (!rc)
            rc = sr_rref_to_here(r, WAIT_S, &out);
        sr_rref_unref(r);
        break;
    }
    }
    return rc ? NULL : out;
}

/* The tensor fn(a[, b]) on dst in mode m (a new reference) or NULL. */
sr_tensor *op_mode(enum mode m, int dst, const char *fn, sr_tensor *a, sr_tensor *b)
{
    sr_value *va = tv(a), *vb = b ? tv(b) : NULL;
    sr_value *r = b ? call_mode(m, dst, fn, SR_ARGS(va, vb)) : call_mode(m, dst, fn, SR_ARGS(va));
    sr_value_unref(va);
    sr_value_unref(vb);
    return take_tensor(r);
}

/* The other ranks in turn (PyTorch's _next_rank), per thread. */
static _Thread_local int next_dst_state = -1;
int next_dst(void)
{
    int me = sr_rank(), w = sr_world_size();
    if (next_dst_state < 0)
        next_dst_state = me;
    do
        next_dst_state = (next_dst_state + 1) % w;
    while (next_dst_state == me);
    return next_dst_state;
}

/* ---- calls from a thread with no current context ---- */

struct noctx_call {
    int to;
    const char *fn;
    sr_args args;
    sr_value *out;
    int rc;
    char err[512];
};

static void *noctx_main(void *p)
{
    struct noctx_call *c = p;
    c->rc = sr_rpc_sync(c->to, c->fn, c->args, WAIT_S, &c->out);
    if (c->rc)
        snprintf(c->err, sizeof(c->err), "%s", sr_last_error());
    return NULL;
}

/* sr_rpc_sync(to, fn, args) made by a fresh thread, which has no context. */
int noctx_rpc(int to, const char *fn, sr_args args, sr_value **out)
{
    struct noctx_call c = {.to = to, .fn = fn, .args = args};
    pthread_t th;
    if (pthread_create(&th, NULL, noctx_main, &c))
        return sr_errorf(-EAGAIN, "noctx_rpc: pthread_create failed");
    pthread_join(th, NULL);
    if (c.rc)
        return sr_errorf(c.rc, "%s", c.err);
    if (out)
        *out = c.out;
    else
        sr_value_unref(c.out);
    return 0;
}

int da_barrier(void)
{
    int rc = noctx_rpc(0, "arrive", SR_NOARGS, NULL);
    WCHECK(rc == 0, "barrier: %s", sr_last_error());
    return 0;
}

/* ---- notes: "context id x of origin o, for slot s", passed between workers ---- */

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int64_t id[NOTE_SLOTS][WORLD];
    bool set[NOTE_SLOTS][WORLD];
} notes = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

/* note(slot, origin, id) */
static int fn_note(sr_call *c)
{
    int64_t s = sr_value_int(sr_call_arg(c, 0)), o = sr_value_int(sr_call_arg(c, 1));
    if (s < 0 || s >= NOTE_SLOTS || o < 0 || o >= WORLD)
        return sr_call_fail(c, -EINVAL, "note: bad slot %lld or origin %lld", (long long)s, (long long)o);
    pthread_mutex_lock(&notes.lock);
    notes.id[s][o] = sr_value_int(sr_call_arg(c, 2));
    notes.set[s][o] = true;
    pthread_cond_broadcast(&notes.cond);
    pthread_mutex_unlock(&notes.lock);
    return sr_call_return(c, NULL);
}

int send_note(int to, int slot, int64_t id)
{
    sr_value *s = sr_int(slot), *o = sr_int(sr_rank()), *i = sr_int(id);
    int rc = noctx_rpc(to, "note", SR_ARGS(s, o, i), NULL);
    sr_value_unref(s);
    sr_value_unref(o);
    sr_value_unref(i);
    WCHECK(rc == 0, "note to worker%d: %s", to, sr_last_error());
    return 0;
}

/* Wait (bounded) for the note of origin in slot. */
int wait_note(int slot, int origin, int64_t *id)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += (time_t)WAIT_S;
    pthread_mutex_lock(&notes.lock);
    int rc = 0;
    while (!notes.set[slot][origin] && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&notes.cond, &notes.lock, &dl);
    bool ok = notes.set[slot][origin];
    *id = notes.id[slot][origin];
    pthread_mutex_unlock(&notes.lock);
    WCHECK(ok, "worker%d: no note from worker%d in slot %d within %.0f s", sr_rank(), origin, slot, WAIT_S);
    return 0;
}

/* ---- inspection ---- */

/* ctx_valid(id): is_valid_context here. */
static int fn_ctx_valid(sr_call *c)
{
    return sr_call_return(c, sr_bool(sr_dist_autograd_is_valid_context(sr_value_int(sr_call_arg(c, 0)))));
}

/* da_debug(): [num_current_backward_passes, num_autograd_contexts]. */
static int fn_da_debug(sr_call *c)
{
    sr_dist_autograd_debug_info d;
    if (sr_dist_autograd_debug_info_get(&d))
        return sr_call_fail(c, -EINVAL, "debug_info: %s", sr_last_error());
    sr_value *a = sr_int((int64_t)d.num_current_backward_passes), *b = sr_int((int64_t)d.num_autograd_contexts);
    sr_value *l = sr_list(2, (sr_value *[]){a, b});
    sr_value_unref(a);
    sr_value_unref(b);
    return sr_call_return(c, l);
}

/* Poll worker w (by RPC, each try paced by its answer) until context id is
 * gone there; bounded by 10 s, like PyTorch's _all_contexts_cleaned_up. */
int expect_gone_on(int w, int64_t id, const char *what)
{
    int64_t deadline = sr__now_ns() + INT64_C(10000000000);
    sr_value *iv = sr_int(id);
    bool valid = true;
    long tries = 0;
    while (valid && sr__now_ns() < deadline) {
        sr_value *v = NULL;
        int rc = noctx_rpc(w, "ctx_valid", SR_ARGS(iv), &v);
        if (rc) {
            sr_value_unref(iv);
            WCHECK(0, "%s: ctx_valid on worker%d: %s", what, w, sr_last_error());
        }
        valid = sr_value_bool(v);
        sr_value_unref(v);
        tries++;
    }
    sr_value_unref(iv);
    WCHECK(!valid, "%s: context %#llx still exists on worker%d after 10 s (%ld polls)", what, (unsigned long long)id,
           w, tries);
    return 0;
}

/* Poll every worker until it holds no context (and runs no pass). */
int expect_no_contexts_anywhere(const char *what)
{
    for (int w = 0; w < sr_world_size(); w++) {
        int64_t deadline = sr__now_ns() + INT64_C(10000000000);
        int64_t passes = -1, ctxs = -1;
        do {
            sr_value *v = NULL;
            WCHECK(noctx_rpc(w, "da_debug", SR_NOARGS, &v) == 0, "%s: da_debug: %s", what, sr_last_error());
            passes = sr_value_int(sr_value_list_at(v, 0));
            ctxs = sr_value_int(sr_value_list_at(v, 1));
            sr_value_unref(v);
        } while ((passes || ctxs) && sr__now_ns() < deadline);
        WCHECK(passes == 0 && ctxs == 0, "%s: worker%d still has %lld passes and %lld contexts after 10 s", what, w,
               (long long)passes, (long long)ctxs);
    }
    return 0;
}

/* The context's send (or recv) functions; fails unless there are exactly want. */
int get_fns(int64_t ctx, bool send, sr_dist_fn_info *out, size_t want, const char *what)
{
    size_t n = 0;
    int rc = sr_dist_autograd_functions(ctx, send, out, 8, &n);
    WCHECK(rc == 0, "%s: functions: %s", what, sr_last_error());
    WCHECK(n == want, "%s: %zu %s functions, want %zu", what, n, send ? "send" : "recv", want);
    return 0;
}

bool name_is(const char *got, const char *want)
{
    return got && strstr(got, want);
}

/* Send function f has the given next functions (by name). */
int expect_next(const sr_dist_fn_info *f, uint32_t n, const char *const *names, const char *what)
{
    WCHECK(f->num_next == n, "%s: %u next edges, want %u", what, f->num_next, n);
    for (uint32_t i = 0; i < n && i < 8; i++)
        WCHECK(name_is(f->next_names[i], names[i]), "%s: next %u is %s, want %s", what, i,
               f->next_names[i] ? f->next_names[i] : "(null)", names[i]);
    return 0;
}

int expect_known(int64_t ctx, const int *want, size_t n, const char *what)
{
    int got[16];
    size_t k = 0;
    WCHECK(sr_dist_autograd_known_workers(ctx, got, 16, &k) == 0, "%s: known_workers: %s", what, sr_last_error());
    WCHECK(k == n, "%s: %zu known workers, want %zu", what, k, n);
    for (size_t i = 0; i < n; i++)
        WCHECK(got[i] == want[i], "%s: known worker %zu is %d, want %d", what, i, got[i], want[i]);
    return 0;
}

/* ---- user functions of PyTorch's test ---- */

/* nested_call(t1, t2, dst, world, hops): my_py_nested_call. */
static int fn_nested_call(sr_call *c)
{
    int64_t dst = sr_value_int(sr_call_arg(c, 2)), world = sr_value_int(sr_call_arg(c, 3));
    int64_t hops = sr_value_int(sr_call_arg(c, 4));
    int next = (int)((dst + 1) % world);
    sr_value *v = NULL;
    int rc;
    if (hops > 0) {
        sr_value *nd = sr_int(next), *h = sr_int(hops - 1);
        rc = sr_rpc_sync(next, "nested_call", SR_ARGS(sr_call_arg(c, 0), sr_call_arg(c, 1), nd, sr_call_arg(c, 3), h),
                         WAIT_S, &v);
        sr_value_unref(nd);
        sr_value_unref(h);
    } else {
        rc = sr_rpc_sync(next, "py_add", SR_ARGS(sr_call_arg(c, 0), sr_call_arg(c, 1)), WAIT_S, &v);
    }
    if (rc)
        return sr_call_fail(c, rc, "nested_call: %s", sr_last_error());
    return sr_call_return(c, v);
}

/* scalar_add(a, b): my_scalar_add. */
static int fn_scalar_add(sr_call *c)
{
    return sr_call_return(c, sr_int(sr_value_int(sr_call_arg(c, 0)) + sr_value_int(sr_call_arg(c, 1))));
}

/* ones_rg(rows, cols): torch.ones(rows, cols, requires_grad=True) (create_tensor). */
static int fn_ones_rg(sr_call *c)
{
    sr_tensor *t = t_full(sr_value_int(sr_call_arg(c, 0)), sr_value_int(sr_call_arg(c, 1)), 1, true);
    if (!t)
        return sr_call_fail(c, -ENOMEM, "ones_rg: %s", sr_last_error());
    sr_value *v = tv(t);
    sr_tensor_unref(t);
    return sr_call_return(c, v);
}

sr_tensor *rref_tensor(sr_value *rv, sr_value **hold)
{
    sr_rref *r = sr_value_rref(rv);
    *hold = NULL;
    if (!r || sr_rref_local_value(r, hold))
        return NULL;
    return sr_value_tensor(*hold);
}

/* rref_add(rref_t1, t2): my_rref_add, on the owner. */
static int fn_rref_add(sr_call *c)
{
    sr_value *hold;
    sr_tensor *t1 = rref_tensor(sr_call_arg(c, 0), &hold);
    sr_tensor *r = t1 ? sr_add(t1, sr_value_tensor(sr_call_arg(c, 1))) : NULL;
    sr_value_unref(hold);
    if (!r)
        return sr_call_fail(c, -EINVAL, "rref_add: %s", sr_last_error());
    sr_value *v = tv(r);
    sr_tensor_unref(r);
    return sr_call_return(c, v);
}

/* nested_rref_add(owner, rref_t1, t2): my_nested_rref_add. */
static int fn_nested_rref_add(sr_call *c)
{
    sr_value *v = NULL;
    int rc = sr_rpc_sync((int)sr_value_int(sr_call_arg(c, 0)), "rref_add", SR_ARGS(sr_call_arg(c, 1), sr_call_arg(c, 2)),
                         WAIT_S, &v);
    if (rc)
        return sr_call_fail(c, rc, "nested_rref_add: %s", sr_last_error());
    return sr_call_return(c, v);
}

/* owner_grad(ctx, rref): the gradient of the RRef's value in ctx, on its
 * owner (PyTorch's _compare_owner_value, returning the gradient). */
static int fn_owner_grad(sr_call *c)
{
    sr_value *hold;
    sr_tensor *t = rref_tensor(sr_call_arg(c, 1), &hold), *g = NULL;
    int rc = t ? sr_dist_autograd_get_gradient(sr_value_int(sr_call_arg(c, 0)), t, &g) : -EINVAL;
    sr_value_unref(hold);
    if (rc)
        return sr_call_fail(c, rc, "owner_grad: %s", sr_last_error());
    sr_value *v = tv(g);
    sr_tensor_unref(g);
    return sr_call_return(c, v);
}

/* The worker's global tensor (PyTorch's requires_grad_tensor), made at first use. */
static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static sr_tensor *global_rg;
static void make_global(void) { global_rg = t_full(3, 3, 1, true); }

/* The global tensor lives in the job's segment: drop it before sr_shutdown
 * (every worker is past its last call then). */
static void drop_global(void)
{
    static const pthread_once_t once_init = PTHREAD_ONCE_INIT;
    sr_tensor_unref(global_rg);
    global_rg = NULL;
    global_once = once_init;
}

/* ret_rg(): requires_grad_tensor itself. */
static int fn_ret_rg(sr_call *c)
{
    pthread_once(&global_once, make_global);
    return sr_call_return(c, tv(global_rg));
}

/* global_grads(ctx): [number of gradients in ctx here, gradient of the global
 * tensor or none]. */
static int fn_global_grads(sr_call *c)
{
    pthread_once(&global_once, make_global);
    int64_t ctx = sr_value_int(sr_call_arg(c, 0));
    size_t n = 0;
    sr_tensor **ts = NULL, **gs = NULL;
    if (sr_dist_autograd_get_gradients(ctx, &n, &ts, &gs))
        return sr_call_fail(c, -EINVAL, "global_grads: %s", sr_last_error());
    sr_dist_autograd_gradients_free(n, ts, gs);
    sr_tensor *g = NULL;
    sr_dist_autograd_get_gradient(ctx, global_rg, &g);
    sr_value *a = sr_int((int64_t)n), *b = g ? tv(g) : sr_none();
    sr_tensor_unref(g);
    sr_value *l = sr_list(2, (sr_value *[]){a, b});
    sr_value_unref(a);
    sr_value_unref(b);
    return sr_call_return(c, l);
}

/* nested_udf(t1, t2, dst): PyTorch's _nested_python_udf:
 * t3 = t1*t2, t4 = t1+t2, res = rpc_sync(dst, add, (t3, t4)), t1*t2*t3*t4*res. */
sr_tensor *nested_udf_body(sr_tensor *t1, sr_tensor *t2, int dst, bool local)
{
    sr_tensor *t3 = sr_mul(t1, t2), *t4 = sr_add(t1, t2), *res = NULL;
    if (local) {
        res = sr_add(t3, t4);
    } else if (t3 && t4) {
        sr_value *a = tv(t3), *b = tv(t4), *v = NULL;
        if (sr_rpc_sync(dst, "add", SR_ARGS(a, b), WAIT_S, &v) == 0)
            res = take_tensor(v);
        sr_value_unref(a);
        sr_value_unref(b);
    }
    sr_tensor *p1 = sr_mul(t1, t2), *p2 = sr_mul(p1, t3), *p3 = sr_mul(p2, t4), *r = sr_mul(p3, res);
    sr_tensor *all[] = {t3, t4, res, p1, p2, p3};
    unref_tensors(all, 6);
    return r;
}

static int fn_nested_udf(sr_call *c)
{
    sr_tensor *r = nested_udf_body(sr_value_tensor(sr_call_arg(c, 0)), sr_value_tensor(sr_call_arg(c, 1)),
                                   (int)sr_value_int(sr_call_arg(c, 2)), false);
    if (!r)
        return sr_call_fail(c, -EINVAL, "nested_udf: %s", sr_last_error());
    sr_value *v = tv(r);
    sr_tensor_unref(r);
    return sr_call_return(c, v);
}

/* ---- hooks that fail or kill, and a chain that installs them ---- */

/* Fails while *arg (a flag in the shared page) is set: SimulateBackwardError. */
int failing_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    (void)grad;
    (void)replace;
    _Atomic int *flag = arg;
    if (atomic_load(flag))
        return sr_errorf(-EIO, "Simulate error on backward pass");
    return 0;
}

static int exit_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    (void)grad;
    (void)replace;
    (void)arg;
    if (atomic_load(&dash->exit_in_hook))
        _exit(0); /* leaves without detaching: peers see a death */
    return 0;
}

/* Waits (bounded) until this worker's gate is opened: a slow backward node. */
static int gate_hook(sr_tensor *grad, sr_tensor **replace, void *arg)
{
    (void)grad;
    (void)replace;
    (void)arg;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 10;
    int rc;
    while ((rc = sem_timedwait(&dash->gate[sr_rank()], &dl)) && errno == EINTR)
        ;
    return rc ? sr_errorf(-ETIMEDOUT, "gate_hook: worker%d's gate stayed shut for 10 s", sr_rank()) : 0;
}

/* hop_scale(t, hops, flags, origin): t*2 passed on to the next worker while
 * hops > 0; the last worker returns t*3 (summed with CHAIN_SUM), with a hook
 * on it that fails while dash->fail[origin] is set (CHAIN_FAIL) or kills the
 * worker (CHAIN_EXIT). The gradient of t is 2^hops * 3 per element. */
static int fn_hop_scale(sr_call *c)
{
    sr_tensor *t = sr_value_tensor(sr_call_arg(c, 0));
    int64_t hops = sr_value_int(sr_call_arg(c, 1)), flags = sr_value_int(sr_call_arg(c, 2));
    int64_t origin = sr_value_int(sr_call_arg(c, 3));
    if (!t || origin < 0 || origin >= WORLD)
        return sr_call_fail(c, -EINVAL, "hop_scale: bad arguments");
    if (hops > 0) {
        sr_tensor *t2 = sr_mul_scalar(t, 2);
        sr_value *a = tv(t2), *h = sr_int(hops - 1), *v = NULL;
        sr_tensor_unref(t2);
        int rc = sr_rpc_sync((sr_rank() + 1) % sr_world_size(), "hop_scale",
                             SR_ARGS(a, h, sr_call_arg(c, 2), sr_call_arg(c, 3)), WAIT_S, &v);
        sr_value_unref(a);
        sr_value_unref(h);
        if (rc)
            return sr_call_fail(c, rc, "hop_scale: %s", sr_last_error());
        return sr_call_return(c, v);
    }
    sr_tensor *y = sr_mul_scalar(t, 3);
    if (!y)
        return sr_call_fail(c, -EINVAL, "hop_scale: %s", sr_last_error());
    int rc = 0;
    if (flags & CHAIN_FAIL)
        rc = sr_tensor_register_hook(y, failing_hook, &dash->fail[origin]);
    if (!rc && (flags & CHAIN_EXIT))
        rc = sr_tensor_register_hook(y, exit_hook, NULL);
    if (!rc && (flags & CHAIN_GATE))
        rc = sr_tensor_register_hook(y, gate_hook, NULL);
    if (rc) {
        sr_tensor_unref(y);
        return sr_call_fail(c, rc, "hop_scale: register_hook: %s", sr_last_error());
    }
    if (flags & CHAIN_SUM) {
        sr_tensor *s = sr_sum(y);
        sr_tensor_unref(y);
        y = s;
    }
    sr_value *v = tv(y);
    sr_tensor_unref(y);
    return sr_call_return(c, v);
}

/* hop_scale(t, hops, flags) on dst, from this worker (the origin). */
sr_tensor *chain(enum mode m, int dst, sr_tensor *t, int hops, int flags)
{
    sr_value *a = tv(t), *h = sr_int(hops), *f = sr_int(flags), *o = sr_int(sr_rank());
    sr_value *v = call_mode(m, dst, "hop_scale", SR_ARGS(a, h, f, o));
    sr_value *all[] = {a, h, f, o};
    unref_values(all, 4);
    return take_tensor(v);
}

void register_da_fns(void)
{
    /* Each job starts with no note: a process that runs several jobs (the
     * suites under mpirun, tests/mpi) must not read a previous job's. */
    pthread_mutex_lock(&notes.lock);
    memset(notes.set, 0, sizeof(notes.set));
    pthread_mutex_unlock(&notes.lock);
    register_rref_fns(); /* arrive (the barrier), hold, ... */
    sr_register("py_add", fn_py_add);
    sr_register("stack", fn_stack);
    sr_register("narrow", fn_narrow);
    sr_register("chunk", fn_chunk);
    sr_register("mixed_op", fn_mixed_op);
    sr_register("note", fn_note);
    sr_register("ctx_valid", fn_ctx_valid);
    sr_register("da_debug", fn_da_debug);
    sr_register("nested_call", fn_nested_call);
    sr_register("scalar_add", fn_scalar_add);
    sr_register("ones_rg", fn_ones_rg);
    sr_register("rref_add", fn_rref_add);
    sr_register("nested_rref_add", fn_nested_rref_add);
    sr_register("owner_grad", fn_owner_grad);
    sr_register("ret_rg", fn_ret_rg);
    sr_register("global_grads", fn_global_grads);
    sr_register("nested_udf", fn_nested_udf);
    sr_register("hop_scale", fn_hop_scale);
    sr_register("gate_add", fn_gate_add);
}

/* No call of this worker is awaiting an answer and no request is being
 * served: a pass must leave nothing in flight ("returns when every worker
 * involved has finished"). Call after a barrier that follows every pass;
 * polls the local counters, bounded by 10 s. */
static int expect_quiet(const char *what)
{
    int64_t deadline = sr__now_ns() + INT64_C(10000000000);
    sr_debug_info d;
    do {
        WCHECK(sr_debug_info_get(&d) == 0, "debug_info: %s", sr_last_error());
        if (!d.client_active_calls && !d.server_active_calls)
            return 0;
        sched_yield();
    } while (sr__now_ns() < deadline);
    WCHECK(0, "%s: worker%d still has %llu calls awaiting an answer and %llu requests being served (%llu async) "
           "10 s after every pass ended",
           what, sr_rank(), (unsigned long long)d.client_active_calls, (unsigned long long)d.server_active_calls,
           (unsigned long long)d.server_async_calls);
    return 1;
}

/* The scenario of a DA_JOB, then a barrier and expect_quiet on every worker. */
scenario_fn da_scenario;
int da_then_quiet(int rank, int world)
{
    if (da_scenario(rank, world) || da_barrier())
        return 1;
    drop_global();
    return expect_quiet("at the end of the test");
}

/* Distributed backward from n roots, failing the worker with a message. */
int da_backward(int64_t ctx, sr_tensor *const *roots, size_t n, bool retain, const char *what)
{
    int rc = sr_dist_autograd_backward(ctx, roots, n, retain);
    WCHECK(rc == 0, "%s: backward: %d: %s", what, rc, sr_last_error());
    return 0;
}
