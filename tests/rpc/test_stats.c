/* SPDX-License-Identifier: MIT */
/* Per-function statistics (shmrpc/stats.h): exact counts and error counts on
 * both sides of a call, latencies ordered p50 <= p99 <= max, recording off
 * when disabled, reset. Two workers: rank 0 calls, rank 1 serves and checks
 * its own side when rank 0 asks (after every counted call was answered: the
 * callee counts a call before its answer leaves). No timing is asserted. */
#include <criterion/criterion.h>
#include <errno.h>

#include "rpc_harness.h"
#include "shmrpc/stats.h"

LEAK_CHECKED_SUITE(stats);

#define OK_N 50
#define BAD_N 7
#define NOPE_N 3
#define OFF_N 5

static sr_future *gate; /* rank 1: "block" waits for it, "release" completes it */

static int ok_fn(sr_call *c) { return sr_call_return(c, sr_value_ref(sr_call_arg(c, 0))); }
static int bad_fn(sr_call *c) { return sr_call_fail(c, -EINVAL, "bad_fn always fails"); }
static int block_fn(sr_call *c) { return sr_future_wait(gate, NULL) ? -EIO : sr_call_return(c, NULL); }
static int release_fn(sr_call *c) { sr_future_set_result(gate, NULL); return sr_call_return(c, NULL); }

/* Latency figures of n samples are consistent. */
static int lat_ok(const sr_latency *l, uint64_t n, const char *what)
{
    WCHECK(l->count == n, "%s: %llu samples, expected %llu", what, (unsigned long long)l->count, (unsigned long long)n);
    WCHECK(l->p50_ns <= l->p99_ns && l->p99_ns <= l->max_ns, "%s: p50 %llu p99 %llu max %llu are not ordered", what,
           (unsigned long long)l->p50_ns, (unsigned long long)l->p99_ns, (unsigned long long)l->max_ns);
    WCHECK(n == 0 || l->max_ns > 0, "%s: max is 0 over %llu samples", what, (unsigned long long)n);
    return 0;
}

static int served_ok(const sr_stats *s, const char *fn, uint64_t n, uint64_t errs)
{
    const sr_fn_stats *e = sr_stats_find(s, fn);
    WCHECK(e, "callee: no statistics for '%s'", fn);
    WCHECK(e->served == n && e->serve_errors == errs, "callee '%s': served %llu errors %llu, expected %llu and %llu",
           fn, (unsigned long long)e->served, (unsigned long long)e->serve_errors, (unsigned long long)n,
           (unsigned long long)errs);
    WCHECK(e->calls == 0, "callee '%s': %llu calls made, expected none", fn, (unsigned long long)e->calls);
    return lat_ok(&e->queue, n, "queue") || lat_ok(&e->run, n, "run");
}

/* rank 1, asked by rank 0 once its calls are answered */
static int check_callee(sr_call *c)
{
    sr_stats *s;
    if (sr_stats_snapshot(&s))
        return sr_call_fail(c, -EIO, "snapshot: %s", sr_last_error());
    int bad = served_ok(s, "ok_fn", OK_N + OFF_N, 0) || served_ok(s, "bad_fn", BAD_N, BAD_N);
    bad = bad || sr_stats_find(s, "nope") != NULL; /* never reached a function */
    sr_stats_free(s);
    return bad ? sr_call_fail(c, -EINVAL, "callee statistics are wrong (see stderr)") : sr_call_return(c, NULL);
}

static void register_fns(void)
{
    sr_register("ok_fn", ok_fn);
    sr_register("bad_fn", bad_fn);
    sr_register("block", block_fn);
    sr_register("release", release_fn);
    sr_register("check_callee", check_callee);
    gate = sr_future_new();
    sr_stats_enable(true); /* before sr_init: recording starts with the first call */
}

static int called_ok(const sr_stats *s, const char *fn, uint64_t n, uint64_t errs)
{
    const sr_fn_stats *e = sr_stats_find(s, fn);
    WCHECK(e, "caller: no statistics for '%s'", fn);
    WCHECK(e->calls == n && e->errors == errs, "caller '%s': calls %llu errors %llu, expected %llu and %llu", fn,
           (unsigned long long)e->calls, (unsigned long long)e->errors, (unsigned long long)n, (unsigned long long)errs);
    WCHECK(e->served == 0, "caller '%s': served %llu, expected none", fn, (unsigned long long)e->served);
    return lat_ok(&e->round_trip, n, fn);
}

static int make_calls(void)
{
    sr_value *v = sr_int(7), *out = NULL;
    for (int i = 0; i < OK_N; i++) {
        WCHECK(sr_rpc_sync(1, "ok_fn", SR_ARGS(v), 0, &out) == 0, "ok_fn: %s", sr_last_error());
        sr_value_unref(out);
    }
    WCHECK(sr_stats_enable(false), "statistics were not on");
    for (int i = 0; i < OFF_N; i++) /* not counted here; counted on the callee, where recording is on */
        WCHECK(sr_rpc_sync(1, "ok_fn", SR_ARGS(v), 0, NULL) == 0, "ok_fn: %s", sr_last_error());
    WCHECK(!sr_stats_enable(true), "statistics were not off");
    sr_value_unref(v);
    for (int i = 0; i < BAD_N; i++)
        WCHECK(sr_rpc_sync(1, "bad_fn", SR_NOARGS, 0, NULL) == -SR_EREMOTE, "bad_fn: %s", sr_last_error());
    for (int i = 0; i < NOPE_N; i++)
        WCHECK(sr_rpc_sync(1, "nope", SR_NOARGS, 0, NULL) == -ENOENT, "nope: %s", sr_last_error());
    /* expiry counts as an error: block waits until release, long after its 20 ms */
    WCHECK(sr_rpc_sync(1, "block", SR_NOARGS, 0.02, NULL) == -ETIMEDOUT, "block: %s", sr_last_error());
    WCHECK(sr_rpc_sync(1, "release", SR_NOARGS, 0, NULL) == 0, "release: %s", sr_last_error());
    return 0;
}

static int scenario(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    if (make_calls())
        return 1;
    sr_stats *s;
    WCHECK(sr_stats_snapshot(&s) == 0, "snapshot: %s", sr_last_error());
    int bad = called_ok(s, "ok_fn", OK_N, 0) || called_ok(s, "bad_fn", BAD_N, BAD_N) ||
              called_ok(s, "nope", NOPE_N, NOPE_N) || called_ok(s, "block", 1, 1) || called_ok(s, "release", 1, 0);
    WCHECK(!bad && sr_stats_print(s, "worker0", stderr) == 0, "caller statistics are wrong (above)");
    sr_stats_free(s);
    WCHECK(sr_rpc_sync(1, "check_callee", SR_NOARGS, 0, NULL) == 0, "%s", sr_last_error());
    sr_stats_reset();
    WCHECK(sr_stats_snapshot(&s) == 0 && sr_stats_len(s) == 0, "after a reset: %zu functions", sr_stats_len(s));
    sr_stats_free(s);
    sr_value *one = sr_int(1);
    WCHECK(sr_rpc_sync(1, "ok_fn", SR_ARGS(one), 0, NULL) == 0, "ok_fn: %s", sr_last_error());
    sr_value_unref(one);
    WCHECK(sr_stats_snapshot(&s) == 0, "snapshot: %s", sr_last_error());
    bad = called_ok(s, "ok_fn", 1, 0) || sr_stats_len(s) != 1;
    sr_stats_free(s);
    WCHECK(!bad, "after a reset and one call: wrong statistics");
    return 0;
}

Test(stats, counts_errors_and_latencies_on_both_sides, .timeout = 120)
{
    RUN_JOB("stats", 2, .scenario = scenario, .register_fns = register_fns);
}

Test(stats, api_refuses_bad_arguments)
{
    cr_assert_eq(sr_stats_snapshot(NULL), -EINVAL);
    cr_assert_eq(sr_stats_len(NULL), 0);
    cr_assert_null(sr_stats_at(NULL, 0));
    cr_assert_null(sr_stats_find(NULL, "x"));
    cr_assert_eq(sr_stats_print(NULL, "w", stderr), -EINVAL);
}
