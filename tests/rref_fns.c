/* SPDX-License-Identifier: MIT */
/* Functions and helpers shared by the RRef suites (test_rref*.c) and the
 * distributed autograd ones (dist_autograd_fns.c): the remote functions every
 * worker registers, a barrier over RPC, and checks of an owner's fork set at
 * the protocol's stable points (declared in rref_fns.h). */
#include "rref_fns.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "future_internal.h"
#include "waiter.h"

void sleep_ms(int64_t ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* ---- RRefs a worker keeps between calls ("hold") ---- */

static struct {
    pthread_mutex_t lock;
    sr_rref **v;
    size_t n, cap;
} held = {.lock = PTHREAD_MUTEX_INITIALIZER};

int held_add(sr_rref *r)
{
    pthread_mutex_lock(&held.lock);
    if (held.n == held.cap) {
        size_t cap = held.cap ? 2 * held.cap : 64;
        sr_rref **v = realloc(held.v, cap * sizeof(*v));
        if (!v) {
            pthread_mutex_unlock(&held.lock);
            return -1;
        }
        held.v = v;
        held.cap = cap;
    }
    held.v[held.n++] = sr_rref_ref(r);
    pthread_mutex_unlock(&held.lock);
    return 0;
}

/* Drop every held RRef, in an order shuffled by seed; returns how many. */
size_t held_drop_all(unsigned seed)
{
    pthread_mutex_lock(&held.lock);
    sr_rref **v = held.v;
    size_t n = held.n;
    held.v = NULL;
    held.n = held.cap = 0;
    pthread_mutex_unlock(&held.lock);
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rand_r(&seed) % i;
        sr_rref *t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
    for (size_t i = 0; i < n; i++)
        sr_rref_unref(v[i]);
    free(v);
    return n;
}

sr_rref *held_at(size_t i)
{
    pthread_mutex_lock(&held.lock);
    sr_rref *r = i < held.n ? sr_rref_ref(held.v[i]) : NULL;
    pthread_mutex_unlock(&held.lock);
    return r;
}

/* ---- remote functions ---- */

/* make_list(n): [n, n + 1] */
static int fn_make_list(sr_call *c)
{
    int64_t n = sr_value_int(sr_call_arg(c, 0));
    sr_value *a = sr_int(n), *b = sr_int(n + 1);
    sr_value *l = sr_list(2, (sr_value *[]){a, b});
    sr_value_unref(a);
    sr_value_unref(b);
    return sr_call_return(c, l);
}

static int fn_sleep_ms(sr_call *c)
{
    sleep_ms(sr_value_int(sr_call_arg(c, 0)));
    return sr_call_return(c, sr_int(sr_value_int(sr_call_arg(c, 0))));
}

static int fn_fail(sr_call *c)
{
    return sr_call_fail(c, -EINVAL, "intentional failure %lld", (long long)sr_value_int(sr_call_arg(c, 0)));
}

/* A UserRRef received from another user may be used before its owner
 * confirms it (its function runs at once); the functions below that report
 * or keep one first wait for the confirmation, so that "the call returned"
 * is a stable point of the owner's fork set. Plain functions: they run on
 * an executor and may block. */
static int wait_confirmed_in_call(sr_call *c, sr_rref *r)
{
    sr_future *f = NULL;
    if (sr_rref_is_owner(r))
        return 0;
    int rc = sr_rref_confirmation(r, &f);
    if (!rc)
        rc = sr__future_wait_until(f, sr__now_ns() + (int64_t)(WAIT_S * 1e9));
    if (!rc)
        rc = sr_future_value(f, NULL);
    sr_future_unref(f);
    if (rc)
        return sr_call_fail(c, rc, "waiting for the owner to confirm the RRef: %s", sr_last_error());
    return sr_rref_confirmed_by_owner(r) ? 0 : sr_call_fail(c, -EINVAL, "confirmed, but confirmed_by_owner() is false");
}

/* rref_info(rref): [is_owner, confirmed_by_owner, fork id (-1 for an owner),
 * first item of its local value (owner) or -1], once a user is confirmed. */
static int fn_rref_info(sr_call *c)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    if (!r)
        return sr_call_fail(c, -EINVAL, "rref_info wants an RRef, got %s",
                            sr_kind_name(sr_value_type(sr_call_arg(c, 0))));
    if (wait_confirmed_in_call(c, r))
        return -EINVAL;
    int64_t first = -1;
    if (sr_rref_is_owner(r)) {
        sr_value *v = NULL;
        if (sr_rref_local_value(r, &v))
            return sr_call_fail(c, -EINVAL, "local_value on the owner: %s", sr_last_error());
        first = sr_value_int(sr_value_list_at(v, 0));
        sr_value_unref(v);
    }
    sr_value *items[4] = {sr_int(sr_rref_is_owner(r)), sr_int(sr_rref_confirmed_by_owner(r)),
                          sr_int(sr_rref_is_owner(r) ? -1 : (int64_t)sr_rref_fork_id(r)), sr_int(first)};
    sr_value *l = sr_list(4, items);
    for (int i = 0; i < 4; i++)
        sr_value_unref(items[i]);
    return sr_call_return(c, l);
}

/* hold(rref): keep it; returns its fork id (-1 on its owner), once a user
 * is confirmed. */
static int fn_hold(sr_call *c)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    if (!r || held_add(r))
        return sr_call_fail(c, -EINVAL, "hold: not an RRef, or no memory");
    if (wait_confirmed_in_call(c, r))
        return -EINVAL;
    return sr_call_return(c, sr_int(sr_rref_is_owner(r) ? -1 : (int64_t)sr_rref_fork_id(r)));
}

/* held_to_here(i): to_here of held RRef i. */
static int fn_held_to_here(sr_call *c)
{
    sr_rref *r = held_at((size_t)sr_value_int(sr_call_arg(c, 0)));
    sr_value *v = NULL;
    int rc = r ? sr_rref_to_here(r, WAIT_S, &v) : -EINVAL;
    sr_rref_unref(r);
    if (rc)
        return sr_call_fail(c, rc, "held_to_here: %s", r ? sr_last_error() : "no such RRef");
    return sr_call_return(c, v);
}

/* drop_held(seed): drop every held RRef in a shuffled order, then wait
 * until the deletes were applied by their owners; returns how many. */
static int fn_drop_held(sr_call *c)
{
    size_t n = held_drop_all((unsigned)sr_value_int(sr_call_arg(c, 0)));
    if (sr_rref_wait_idle(WAIT_S))
        return sr_call_fail(c, -ETIMEDOUT, "drop_held: %s", sr_last_error());
    return sr_call_return(c, sr_int((int64_t)n));
}

/* forks_of(rref id): the owner's fork set, ascending. */
static int fn_forks_of(sr_call *c)
{
    uint64_t f[64];
    int n = sr_rref_debug_forks((uint64_t)sr_value_int(sr_call_arg(c, 0)), f, 64);
    if (n < 0 || n > 64)
        return sr_call_fail(c, -EINVAL, "forks_of: %d: %s", n, sr_last_error());
    sr_value *items[64];
    for (int i = 0; i < n; i++)
        items[i] = sr_int((int64_t)f[i]);
    sr_value *l = sr_list((size_t)n, items);
    for (int i = 0; i < n; i++)
        sr_value_unref(items[i]);
    return sr_call_return(c, l);
}

/* counters(): [owners, pending owners, forks, pending users, users,
 * children, unacknowledged, tombstones, deferred, retries sent, control
 * messages sent] on this worker. The first nine must come back to zero. */
static int fn_counters(sr_call *c)
{
    sr_rref_debug_info d;
    if (sr_rref_debug_info_get(&d))
        return sr_call_fail(c, -EINVAL, "%s", sr_last_error());
    uint64_t x[11] = {d.num_owner_rrefs, d.num_pending_owners, d.num_forks, d.num_pending_users,
                      d.num_confirmed_users, d.num_pending_children, d.num_pending_futures, d.num_tombstones,
                      d.num_deferred_calls, d.num_retries, d.num_ctrl_sent};
    sr_value *items[11];
    for (int i = 0; i < 11; i++)
        items[i] = sr_int((int64_t)x[i]);
    sr_value *l = sr_list(11, items);
    for (int i = 0; i < 11; i++)
        sr_value_unref(items[i]);
    return sr_call_return(c, l);
}

/* Control messages sent again, summed over every worker. */
int64_t retries_everywhere(void)
{
    int64_t sum = 0;
    for (int w = 0; w < sr_world_size(); w++) {
        sr_value *v = NULL;
        if (sr_rpc_sync(w, "counters", SR_NOARGS, WAIT_S, &v))
            return -1;
        sum += sr_value_int(sr_value_list_at(v, 9));
        sr_value_unref(v);
    }
    return sum;
}

/* forward(rref, hops): pass the RRef on to the next worker until hops is 0,
 * then return its value (to_here at the end of the chain). */
static int fn_forward(sr_call *c)
{
    int64_t hops = sr_value_int(sr_call_arg(c, 1));
    sr_value *v = NULL;
    int rc;
    if (hops == 0) {
        rc = sr_rref_to_here(sr_value_rref(sr_call_arg(c, 0)), WAIT_S, &v);
    } else {
        sr_value *h = sr_int(hops - 1);
        rc = sr_rpc_sync((sr_rank() + 1) % sr_world_size(), "forward", SR_ARGS(sr_call_arg(c, 0), h), WAIT_S, &v);
        sr_value_unref(h);
    }
    if (rc)
        return sr_call_fail(c, rc, "forward at %lld hops: %s", (long long)hops, sr_last_error());
    return sr_call_return(c, v);
}

/* remote_of(owner, n): an RRef, made here by remote(), to make_list(n) on owner. */
static int fn_remote_of(sr_call *c)
{
    sr_rref *r = NULL;
    sr_value *n = sr_call_arg(c, 1);
    int rc = sr_remote((int)sr_value_int(sr_call_arg(c, 0)), "make_list", SR_ARGS(n), WAIT_S, &r);
    if (rc)
        return sr_call_fail(c, rc, "remote_of: %s", sr_last_error());
    sr_value *v = sr_value_from_rref(r);
    sr_rref_unref(r);
    return sr_call_return(c, v);
}

/* rref_list(n): a list of n RRefs to make_list(i) on worker i % world. */
static int fn_rref_list(sr_call *c)
{
    int64_t n = sr_value_int(sr_call_arg(c, 0));
    sr_value *items[16];
    if (n < 0 || n > 16)
        return sr_call_fail(c, -EINVAL, "rref_list: n = %lld", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        sr_rref *r = NULL;
        sr_value *x = sr_int(100 + i);
        int rc = sr_remote((int)(i % sr_world_size()), "make_list", SR_ARGS(x), WAIT_S, &r);
        sr_value_unref(x);
        if (rc) {
            while (i-- > 0)
                sr_value_unref(items[i]);
            return sr_call_fail(c, rc, "rref_list: %s", sr_last_error());
        }
        items[i] = sr_value_from_rref(r);
        sr_rref_unref(r);
    }
    sr_value *l = sr_list((size_t)n, items);
    for (int64_t i = 0; i < n; i++)
        sr_value_unref(items[i]);
    return sr_call_return(c, l);
}

/* ---- a barrier over RPC: arrive() on rank 0 completes when all did ---- */

static struct {
    pthread_mutex_t lock;
    int count;
    sr_future *f;
} bar = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int fn_arrive(sr_call *c, sr_future **out)
{
    (void)c;
    pthread_mutex_lock(&bar.lock);
    if (!bar.f)
        bar.f = sr_future_new();
    sr_future *f = bar.f, *done = NULL;
    *out = sr_future_ref(f);
    if (++bar.count == sr_world_size()) {
        done = f;
        bar.f = NULL;
        bar.count = 0;
    }
    pthread_mutex_unlock(&bar.lock);
    if (done) {
        sr_future_set_result(done, NULL);
        sr_future_unref(done);
    }
    return 0;
}

int barrier(void)
{
    int rc = sr_rpc_sync(0, "arrive", SR_NOARGS, WAIT_S, NULL);
    WCHECK(rc == 0, "barrier: %s", sr_last_error());
    return 0;
}

void register_rref_fns(void)
{
    sr_register("make_list", fn_make_list);
    sr_register("sleep_ms", fn_sleep_ms);
    sr_register("fail", fn_fail);
    sr_register("rref_info", fn_rref_info);
    sr_register("hold", fn_hold);
    sr_register("held_to_here", fn_held_to_here);
    sr_register("drop_held", fn_drop_held);
    sr_register("forks_of", fn_forks_of);
    sr_register("counters", fn_counters);
    sr_register("forward", fn_forward);
    sr_register("remote_of", fn_remote_of);
    sr_register("rref_list", fn_rref_list);
    sr_register_async("arrive", fn_arrive);
}

/* ---- running a job ---- */

/* A failing worker leaves at once: the job ends with its report instead of
 * its peers waiting out their barriers and shutdown bounds. */
scenario_fn rref_scenario; /* set by the test before sr_spawn forks */

int fail_fast(int rank, int world)
{
    int rc = rref_scenario(rank, world);
    if (rc) {
        fflush(stderr);
        _exit(rc);
    }
    return 0;
}

/* ---- checks ---- */

/* The owner's fork set of r, as seen by asking the owner. */
static inline int forks_on_owner(sr_rref *r, uint64_t *out, size_t cap, size_t *n)
{
    sr_value *id = sr_int((int64_t)sr_rref_id(r)), *v = NULL;
    int rc = sr_rpc_sync(sr_rref_owner(r), "forks_of", SR_ARGS(id), WAIT_S, &v);
    sr_value_unref(id);
    WCHECK(rc == 0, "forks_of: %s", sr_last_error());
    *n = sr_value_list_len(v);
    for (size_t i = 0; i < *n && i < cap; i++)
        out[i] = (uint64_t)sr_value_int(sr_value_list_at(v, i));
    sr_value_unref(v);
    return 0;
}

static inline int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The owner's fork set of r is exactly want[0..n). */
int expect_forks(sr_rref *r, const uint64_t *want, size_t n, const char *when)
{
    uint64_t got[64], w[64];
    size_t k;
    if (forks_on_owner(r, got, 64, &k))
        return 1;
    for (size_t i = 0; i < n; i++)
        w[i] = want[i];
    qsort(w, n, sizeof(w[0]), cmp_u64);
    char s[96];
    WCHECK(k == n, "%s: %s has %zu forks on its owner, want %zu", when, sr_rref_str(r, s, sizeof(s)), k, n);
    for (size_t i = 0; i < n; i++)
        WCHECK(got[i] == w[i], "%s: fork %zu is %#llx, want %#llx", when, i, (unsigned long long)got[i],
               (unsigned long long)w[i]);
    return 0;
}

int wait_confirmed(sr_rref *r)
{
    sr_future *f;
    WCHECK(sr_rref_confirmation(r, &f) == 0, "confirmation: %s", sr_last_error());
    int rc = sr__future_wait_until(f, sr__now_ns() + (int64_t)(WAIT_S * 1e9));
    if (!rc)
        rc = sr_future_wait(f, NULL);
    sr_future_unref(f);
    WCHECK(rc == 0, "waiting for confirmation: %s", sr_last_error());
    WCHECK(sr_rref_confirmed_by_owner(r), "confirmed future done but confirmed_by_owner() is false");
    return 0;
}

/* to_here(r) is the list [a, a + 1]. */
int expect_pair(sr_rref *r, int64_t a)
{
    sr_value *v = NULL;
    int rc = sr_rref_to_here(r, WAIT_S, &v);
    WCHECK(rc == 0, "to_here: %s", sr_last_error());
    WCHECK(sr_value_list_len(v) == 2 && sr_value_int(sr_value_list_at(v, 0)) == a &&
               sr_value_int(sr_value_list_at(v, 1)) == a + 1,
           "to_here gave %s, want [%lld, %lld]", sr_kind_name(sr_value_type(v)), (long long)a, (long long)a + 1);
    sr_value_unref(v);
    return 0;
}

/* Every RRef counter of every worker is zero (call after a barrier that
 * follows each worker's sr_rref_wait_idle). */
int expect_all_counters_zero(const char *when)
{
    static const char *names[9] = {"owners", "pending owners", "forks", "pending users", "users",
                                   "pending children", "unacknowledged", "tombstones", "deferred calls"};
    for (int w = 0; w < sr_world_size(); w++) {
        sr_value *v = NULL;
        WCHECK(sr_rpc_sync(w, "counters", SR_NOARGS, WAIT_S, &v) == 0, "counters: %s", sr_last_error());
        for (size_t i = 0; i < 9; i++)
            WCHECK(sr_value_int(sr_value_list_at(v, i)) == 0, "%s: worker%d has %lld %s", when, w,
                   (long long)sr_value_int(sr_value_list_at(v, i)), names[i]);
        sr_value_unref(v);
    }
    return 0;
}
