/* SPDX-License-Identifier: MIT */
/* RRefs in use, on 4 workers: owner-local objects mutated through the
 * proxies from several workers (the same object on every call); a parameter
 * server whose async function completes when all 3 users have reported;
 * 1,000 RRefs created, shared and dropped in random order across workers,
 * with every counter at zero at the end and no control message ever sent
 * twice. Also run under the reordering mode (tests/meson.build). */
#include "rref_fns.h"

LEAK_CHECKED_SUITE(rref_use);

/* ---- a counter object that lives on its owner only ---- */

struct counter {
    pthread_mutex_t lock;
    int64_t v;
    int64_t calls;
};

static void counter_free(void *p)
{
    struct counter *k = p;
    pthread_mutex_destroy(&k->lock);
    free(k);
}

static sr_value *counter_new(void)
{
    struct counter *k = calloc(1, sizeof(*k));
    pthread_mutex_init(&k->lock, NULL);
    return sr_object(k, counter_free, "Counter");
}

/* ctr_new(): a Counter, kept on this worker (use with remote()). */
static int fn_ctr_new(sr_call *c)
{
    return sr_call_return(c, counter_new());
}

/* ctr_add(counter, delta): adds in place; returns the new value. Proxy
 * calls give it the owner's object itself as argument 0. */
static int fn_ctr_add(sr_call *c)
{
    struct counter *k = sr_value_object(sr_call_arg(c, 0));
    if (!k || strcmp(sr_value_object_type(sr_call_arg(c, 0)), "Counter"))
        return sr_call_fail(c, -EINVAL, "ctr_add: argument 0 is not a Counter");
    pthread_mutex_lock(&k->lock);
    int64_t v = k->v += sr_value_int(sr_call_arg(c, 1));
    k->calls++;
    pthread_mutex_unlock(&k->lock);
    return sr_call_return(c, sr_int(v));
}

/* bump(rref, n): n proxy calls ctr_add(+1) from this worker, each seeing a
 * larger value than the last; returns the last value seen. */
static int fn_bump(sr_call *c)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    int64_t n = sr_value_int(sr_call_arg(c, 1)), last = 0;
    sr_value *one = sr_int(1);
    for (int64_t i = 0; i < n; i++) {
        sr_value *v = NULL;
        int rc = i % 2 ? sr_rref_rpc_sync(r, "ctr_add", SR_ARGS(one), WAIT_S, &v) : 0;
        if (!(i % 2)) { /* every other call through rpc_async */
            sr_future *f = NULL;
            rc = sr_rref_rpc_async(r, "ctr_add", SR_ARGS(one), WAIT_S, &f);
            if (!rc)
                rc = sr_future_wait(f, &v);
            sr_future_unref(f);
        }
        if (rc) {
            sr_value_unref(one);
            return sr_call_fail(c, rc, "bump: %s", sr_last_error());
        }
        if (sr_value_int(v) <= last) {
            sr_value_unref(one);
            return sr_call_fail(c, -EINVAL, "bump: value %lld after %lld: an update was lost",
                                (long long)sr_value_int(v), (long long)last);
        }
        last = sr_value_int(v);
        sr_value_unref(v);
    }
    sr_value_unref(one);
    return sr_call_return(c, sr_int(last));
}

/* ---- a parameter server ---- */

#define PS_USERS 3
#define PS_ROUNDS 20

struct ps {
    pthread_mutex_t lock;
    int64_t round_sum[PS_ROUNDS];
    int reported[PS_ROUNDS];
    sr_future *done[PS_ROUNDS]; /* completed with the round's sum when all users reported */
};

static void ps_free(void *p)
{
    struct ps *s = p;
    for (int i = 0; i < PS_ROUNDS; i++)
        sr_future_unref(s->done[i]);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* ps_report(ps, round, grad), async: the answer is the round's sum, once
 * all PS_USERS have reported it. No thread waits meanwhile. */
static int fn_ps_report(sr_call *c, sr_future **out)
{
    struct ps *s = sr_value_object(sr_call_arg(c, 0));
    int64_t round = sr_value_int(sr_call_arg(c, 1));
    if (!s || round < 0 || round >= PS_ROUNDS)
        return sr_call_fail(c, -EINVAL, "ps_report: bad server or round %lld", (long long)round);
    pthread_mutex_lock(&s->lock);
    if (!s->done[round])
        s->done[round] = sr_future_new();
    sr_future *f = sr_future_ref(s->done[round]);
    s->round_sum[round] += sr_value_int(sr_call_arg(c, 2));
    bool last = ++s->reported[round] == PS_USERS;
    int64_t sum = s->round_sum[round];
    pthread_mutex_unlock(&s->lock);
    if (last) {
        sr_value *v = sr_int(sum);
        sr_future_set_result(f, v);
        sr_value_unref(v);
    }
    *out = f;
    return 0;
}

/* ps_user(ps_rref): report PS_ROUNDS rounds, each answer the round's sum. */
static int fn_ps_user(sr_call *c)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    int me = sr_rank();
    for (int64_t round = 0; round < PS_ROUNDS; round++) {
        sr_value *rv = sr_int(round), *g = sr_int(me * 100 + round), *sum = NULL;
        int rc = sr_rref_rpc_sync(r, "ps_report", SR_ARGS(rv, g), WAIT_S, &sum);
        int64_t want = (1 + 2 + 3) * 100 + PS_USERS * round; /* users are ranks 1, 2, 3 */
        bool ok = !rc && sr_value_int(sum) == want;
        int64_t got = sr_value_int(sum);
        sr_value_unref(rv);
        sr_value_unref(g);
        sr_value_unref(sum);
        if (!ok)
            return sr_call_fail(c, rc ? rc : -EINVAL, "round %lld: got %lld, want %lld: %s", (long long)round,
                                (long long)got, (long long)want, rc ? sr_last_error() : "");
    }
    return sr_call_return(c, NULL);
}

static void register_use_fns(void)
{
    register_rref_fns();
    sr_register("ctr_new", fn_ctr_new);
    sr_register("ctr_add", fn_ctr_add);
    sr_register("bump", fn_bump);
    sr_register("ps_user", fn_ps_user);
    sr_register_async("ps_report", fn_ps_report);
}

#define USE_JOB(name, sc)                                                                        \
    do {                                                                                          \
        rref_scenario = sc;                                                                       \
        RUN_JOB(name, WORLD, .scenario = fail_fast, .register_fns = register_use_fns,              \
                .shutdown_timeout = 60);                                                          \
    } while (0)

/* Owner-local objects through the proxies: worker3 remote()s a Counter onto
 * worker1, then every worker (the owner too) bumps it concurrently through
 * rpc_sync and rpc_async proxies; remote() proxies read it; to_here of an
 * owner-local object is refused. Every update lands on the one object. */
static int sc_proxies(int rank, int world)
{
    if (rank != 3)
        return 0;
    enum { N = 25 };
    sr_rref *r = NULL;
    WCHECK(sr_remote(1, "ctr_new", SR_NOARGS, WAIT_S, &r) == 0, "remote: %s", sr_last_error());
    sr_value *rv = sr_value_from_rref(r), *n = sr_int(N), *v = NULL;
    sr_future *fs[WORLD];
    for (int w = 0; w < world; w++)
        WCHECK(sr_rpc_async(w, "bump", SR_ARGS(rv, n), WAIT_S, &fs[w]) == 0, "bump on %d: %s", w,
               sr_last_error());
    WCHECK(sr_future_wait_all(fs, WORLD, &v) == 0, "bumps: %s", sr_last_error());
    sr_value_unref(v);
    for (int w = 0; w < world; w++)
        sr_future_unref(fs[w]);
    sr_value *zero = sr_int(0);
    sr_rref *seen = NULL;
    WCHECK(sr_rref_remote(r, "ctr_add", SR_ARGS(zero), WAIT_S, &seen) == 0, "proxy remote: %s", sr_last_error());
    WCHECK(sr_rref_to_here(seen, WAIT_S, &v) == 0 && sr_value_int(v) == WORLD * N,
           "after %d bumps from %d workers the counter is %lld", N, WORLD, (long long)sr_value_int(v));
    sr_value_unref(v);
    WEXPECT_ERR(sr_rref_to_here(r, WAIT_S, &v), -SR_EREMOTE, "owner-local");
    sr_rref_unref(seen);
    sr_rref_unref(r);
    sr_value_unref(rv);
    sr_value_unref(n);
    sr_value_unref(zero);
    return 0;
}

static int sc_proxies_all(int rank, int world)
{
    if (sc_proxies(rank, world) || barrier())
        return 1;
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    if (barrier())
        return 1;
    return rank == 0 ? expect_all_counters_zero("after the proxies") : 0;
}

Test(rref_use, owner_local_object_mutated_through_proxies, .timeout = 180)
{
    USE_JOB("rrefproxy", sc_proxies_all);
}

/* The owner's own proxies: a local RRef(object) used through the proxies
 * on its owner stays the same object, and enters the context only while
 * a call holds a fork of it. */
static int sc_owner_proxies(int rank, int world)
{
    (void)world;
    if (rank != 2)
        return 0;
    sr_value *obj = counter_new(), *five = sr_int(5), *v = NULL;
    sr_rref *r = NULL;
    WCHECK(sr_rref_create(obj, &r) == 0, "create: %s", sr_last_error());
    for (int i = 1; i <= 4; i++) {
        WCHECK(sr_rref_rpc_sync(r, "ctr_add", SR_ARGS(five), WAIT_S, &v) == 0 && sr_value_int(v) == 5 * i,
               "owner proxy call %d: %s", i, sr_last_error());
        sr_value_unref(v);
    }
    WCHECK(sr_rref_local_value(r, &v) == 0 && v == obj, "local_value is not the object");
    WCHECK(((struct counter *)sr_value_object(v))->calls == 4, "the object saw %lld calls",
           (long long)((struct counter *)sr_value_object(v))->calls);
    sr_value_unref(v);
    sr_rref_debug_info d;
    WCHECK(sr_rref_debug_info_get(&d) == 0 && d.num_owner_rrefs == 0 && d.num_forks == 0,
           "the owner's proxy calls left it registered");
    sr_rref_unref(r);
    sr_value_unref(obj);
    sr_value_unref(five);
    return 0;
}

Test(rref_use, owner_proxies_keep_the_same_object, .timeout = 120)
{
    USE_JOB("rrefownprox", sc_owner_proxies);
}

/* A parameter server: worker0 owns it; workers 1-3 report PS_ROUNDS rounds
 * each through an async function that answers only when all three have
 * reported the round. With one executor thread per worker nothing may
 * block a thread while it waits. */
static int sc_param_server(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    struct ps *s = calloc(1, sizeof(*s));
    pthread_mutex_init(&s->lock, NULL);
    sr_value *obj = sr_object(s, ps_free, "ParameterServer");
    sr_rref *r = NULL;
    WCHECK(sr_rref_create(obj, &r) == 0, "create: %s", sr_last_error());
    sr_value *rv = sr_value_from_rref(r), *v = NULL;
    sr_future *fs[PS_USERS];
    for (int u = 0; u < PS_USERS; u++)
        WCHECK(sr_rpc_async(u + 1, "ps_user", SR_ARGS(rv), WAIT_S, &fs[u]) == 0, "ps_user: %s", sr_last_error());
    WCHECK(sr_future_wait_all(fs, PS_USERS, &v) == 0, "users: %s", sr_last_error());
    sr_value_unref(v);
    for (int u = 0; u < PS_USERS; u++)
        sr_future_unref(fs[u]);
    for (int i = 0; i < PS_ROUNDS; i++)
        WCHECK(s->reported[i] == PS_USERS, "round %d: %d reports", i, s->reported[i]);
    sr_rref_unref(r);
    sr_value_unref(rv);
    sr_value_unref(obj);
    return 0;
}

Test(rref_use, parameter_server_with_async_rounds, .timeout = 180)
{
    rref_scenario = sc_param_server;
    RUN_JOB("rrefps", WORLD, .scenario = fail_fast, .register_fns = register_use_fns, .shutdown_timeout = 60,
            .opts = {.num_worker_threads = 1});
}

/* 1,000 RRefs: each worker remote()s 250 onto random owners (itself too),
 * sends about half of them to random workers, who keep them; then every
 * RRef is dropped in a random order on every worker. At the end every
 * counter of every worker is zero, and graceful shutdown finds no leak. */
#define MANY 250

static int sc_many(int rank, int world)
{
    unsigned seed = 1234u + (unsigned)rank * 7919u;
    sr_rref **mine = calloc(MANY, sizeof(*mine));
    for (int i = 0; i < MANY; i++) {
        sr_value *x = sr_int(i);
        int to = rand_r(&seed) % world;
        WCHECK(sr_remote(to, "make_list", SR_ARGS(x), WAIT_S, &mine[i]) == 0, "remote %d: %s", i, sr_last_error());
        sr_value_unref(x);
    }
    sr_future *fs[MANY];
    int nf = 0;
    for (int i = 0; i < MANY; i++) {
        if (rand_r(&seed) % 2)
            continue;
        sr_value *rv = sr_value_from_rref(mine[i]);
        WCHECK(sr_rpc_async(rand_r(&seed) % world, "hold", SR_ARGS(rv), WAIT_S, &fs[nf++]) == 0, "hold: %s",
               sr_last_error());
        sr_value_unref(rv);
    }
    WCHECK(nf == 0 || sr_future_wait_all(fs, (size_t)nf, NULL) == 0, "holds: %s", sr_last_error());
    for (int i = 0; i < nf; i++)
        sr_future_unref(fs[i]);
    for (int i = 0; i < MANY; i += 50) /* a sample of values, from every kind of owner */
        if (expect_pair(mine[i], i))
            return 1;
    for (int i = MANY; i > 1; i--) { /* drop ours in a random order */
        int j = rand_r(&seed) % i;
        sr_rref *t = mine[i - 1];
        mine[i - 1] = mine[j];
        mine[j] = t;
    }
    for (int i = 0; i < MANY; i++)
        sr_rref_unref(mine[i]);
    free(mine);
    if (barrier()) /* every hold has happened everywhere */
        return 1;
    held_drop_all(seed);
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "idle: %s", sr_last_error());
    if (barrier())
        return 1;
    if (rank != 0)
        return 0;
    /* Even under the reordering mode (messages delayed by up to 10 ms),
     * nothing is ever sent twice. */
    int64_t dups = retries_everywhere();
    WCHECK(dups == 0, "%lld control messages were sent again", (long long)dups);
    return expect_all_counters_zero("after 1000 RRefs");
}

Test(rref_use, thousand_rrefs_dropped_in_random_order, .timeout = 300)
{
    USE_JOB("rrefmany", sc_many);
}
