/* SPDX-License-Identifier: MIT */
/* RRef benchmarks, each printed next to the no-op rpc_sync measured in the
 * same run (the ratio is the median of per-round ratios, so that a round's
 * two figures share its noise) and next to PyTorch's figure.
 *
 *   bench_rref [remote] [big] [fork] [relay] [proxy] [pair] [noop2]   (default: all)
 *
 *   remote+to_here   sr_remote(noop) + sr_rref_to_here + drop, one owner (the
 *                    None result rides along with REMOTE_RET: no fetch)
 *   ... 64 B         remote(echo, 64 bytes) + to_here, next to rpc_sync(echo, 64 bytes):
 *                    arguments and result travel in heap blocks
 *   fork user->user  rpc_sync to a second user with a UserRRef argument: the
 *                    callee's function runs at once and lets the RRef go, so
 *                    the owner never hears of the fork; the callee releases
 *                    the parent (CHILD_ACCEPT, read with the answer)
 *                    (docs/RREF.md, flow 4); next to the no-op (target <= 3x)
 *                    and to:
 *   relay via owner  the fork's message path as plain calls, without RRefs:
 *                    rpc_sync to the second user, whose async function makes
 *                    a no-op rpc_async to the owner and answers when it
 *                    completes (driver -> user 2 -> owner -> user 2 -> driver)
 *   proxy rpc_sync   sr_rref_rpc_sync(rref, noop) from a user to the owner
 *   2 pipelined noop two rpc_async no-ops in flight at once (what remote+to_here
 *                    is on the wire, without the RRef bookkeeping)
 *   noop to user 2   rpc_sync no-op to the second user (the fork's callee)
 *
 * Three workers: rank 0 measures, rank 1 owns, rank 2 is the second user;
 * the callees serve while waiting on a future that rank 0 completes at the
 * end. `noop` is a built-in and runs inline on the polling thread; `take` is
 * an async function (inline too), so every figure is the runtime's own cost.
 * Results are checked after timing. Each line ends with the driver's
 * doorbell sleeps and wake syscalls per call (sr_debug_info): a lost or
 * spurious ring shows there even where the ratio hides it. PyTorch's
 * figures (noop, remote+to_here, fork, proxy) are measured in the same run:
 * bench/compare/torch_rref.py runs first (--no-torch or BENCH_NO_TORCH=1 skips it; BENCH_TORCH_QUICK=1: fewer
 * iterations), and without python3-torch each line says "torch not
 * installed". --json: bench_util.h.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_util.h"
#include "shmrpc/shmrpc.h"

#ifndef BENCH_COMPARE_DIR
#define BENCH_COMPARE_DIR "bench/compare"
#endif

#define ROUNDS 7
#define N 3000
#define WARM 500
/* The counts, or --smoke's (main): a smoke run's figures are not measurements. */
static int rounds = ROUNDS, n_calls = N, warm = WARM;

enum { NOOP, REMOTE, ECHO_BIG, REMOTE_BIG, FORK, RELAY, PROXY, PAIR, NOOP2, NWORK };
static const char *names[NWORK] = {"rpc_sync noop",   "remote+to_here",  "rpc_sync echo 64 B", "remote+to_here 64 B",
                                   "fork user->user", "relay via owner", "proxy rpc_sync",     "2 pipelined noop",
                                   "noop to user 2"};

struct result {
    double p50[ROUNDS], p99[ROUNDS];
    uint64_t sleeps, wakes; /* the driver's, over every timed round (sr_debug_info) */
};

struct shared {
    struct result r[NWORK];
    int errors;
};

static struct shared *sh;
static bool wanted[NWORK] = {true, true, true, true, true, true, true, true, true}; /* set from argv before the workers fork */
static sr_future *done_fut; /* ranks 1, 2: completed by rank 0's "done" */
static bench_torch pt;      /* PyTorch's figures, measured before ours */
/* torch_rref.py's key for each workload ("" when it has none) */
static const char *pt_keys[NWORK] = {"noop", "remote", "", "", "fork", "", "proxy", "", ""};

static int fn_done(sr_call *c)
{
    sr_future_set_result(done_fut, NULL);
    return sr_call_return(c, NULL);
}

/* take(rref): a user function that received an RRef (async: runs inline, at
 * once) and lets it go. */
static int fn_take(sr_call *c, sr_future **out)
{
    if (!sr_value_rref(sr_call_arg(c, 0)))
        return sr_call_fail(c, -EINVAL, "take wants an RRef");
    sr_future *f = sr_future_new();
    if (!f)
        return -ENOMEM;
    sr_future_set_result(f, NULL);
    *out = f;
    return 0;
}

static int relay_done(sr_future *parent, void *arg, sr_value **result)
{
    (void)arg;
    return sr_future_value(parent, result);
}

/* relay(): a no-op rpc_async to the owner (rank 1); answers when it completes
 * (async: runs inline on the polling thread, as take does). */
static int fn_relay(sr_call *c, sr_future **out)
{
    (void)c;
    sr_future *f = NULL;
    int rc = sr_rpc_async(1, "noop", SR_NOARGS, 0, &f);
    if (!rc)
        rc = sr_future_then(f, relay_done, NULL, out);
    sr_future_unref(f);
    return rc;
}

static sr_value *big; /* 64 bytes: too big to ride along with REMOTE_RET, so to_here fetches */

/* One timed iteration of workload w; the result is checked. */
static int once(int w, sr_rref *r, sr_value *rv)
{
    sr_value *v = NULL;
    sr_rref *made = NULL;
    int rc;
    switch (w) {
    case NOOP: return sr_rpc_sync(1, "noop", SR_NOARGS, 0, NULL);
    case REMOTE:
        rc = sr_remote(1, "noop", SR_NOARGS, 0, &made);
        if (!rc)
            rc = sr_rref_to_here(made, 0, &v);
        rc = rc ? rc : sr_value_type(v) != SR_KIND_NONE;
        sr_value_unref(v);
        sr_rref_unref(made);
        return rc;
    case ECHO_BIG:
        rc = sr_rpc_sync(1, "echo", SR_ARGS(big), 0, &v);
        rc = rc ? rc : !sr_value_equal(v, big);
        sr_value_unref(v);
        return rc;
    case REMOTE_BIG:
        rc = sr_remote(1, "echo", SR_ARGS(big), 0, &made);
        if (!rc)
            rc = sr_rref_to_here(made, 0, &v);
        rc = rc ? rc : !sr_value_equal(v, big);
        sr_value_unref(v);
        sr_rref_unref(made);
        return rc;
    case FORK: return sr_rpc_sync(2, "take", SR_ARGS(rv), 0, NULL);
    case RELAY: return sr_rpc_sync(2, "relay", SR_NOARGS, 0, NULL);
    case PROXY: return sr_rref_rpc_sync(r, "noop", SR_NOARGS, 0, NULL);
    case PAIR: { /* what remote+to_here does on the wire: two requests in flight at once */
        sr_future *a = NULL, *b = NULL;
        rc = sr_rpc_async(1, "noop", SR_NOARGS, 0, &a) || sr_rpc_async(1, "noop", SR_NOARGS, 0, &b);
        rc = rc || sr_future_wait(b, NULL) || sr_future_wait(a, NULL);
        sr_future_unref(a);
        sr_future_unref(b);
        return rc;
    }
    case NOOP2: return sr_rpc_sync(2, "noop", SR_NOARGS, 0, NULL);
    }
    return -EINVAL;
}

/* The driver's doorbell sleeps and wake syscalls so far (sr_debug_info): a
 * lost or spurious ring shows in them before it shows in a ratio. */
static void count_wakes(uint64_t *sleeps, uint64_t *wakes)
{
    sr_debug_info d;
    if (sr_debug_info_get(&d))
        d.sleeps_taken = d.wakes_issued = 0;
    *sleeps = d.sleeps_taken;
    *wakes = d.wakes_issued;
}

static void measure(int round, sr_rref *r, sr_value *rv)
{
    static int64_t lat[N];
    for (int w = 0; w < NWORK; w++) {
        if (!wanted[w])
            continue;
        uint64_t s0, w0, s1, w1;
        count_wakes(&s0, &w0);
        for (int i = 0; i < n_calls; i++) {
            int64_t t0 = bench_now_ns();
            if (once(w, r, rv))
                sh->errors++;
            lat[i] = bench_now_ns() - t0;
        }
        count_wakes(&s1, &w1);
        sh->r[w].sleeps += s1 - s0;
        sh->r[w].wakes += w1 - w0;
        bench_lat l = bench_lat_of(lat, n_calls);
        sh->r[w].p50[round] = (double)l.p50;
        sh->r[w].p99[round] = (double)l.p99;
    }
}

static int driver(void)
{
    sr_value *n = sr_int(1), *v = NULL;
    sr_rref *r = NULL;
    if (sr_remote(1, "echo", SR_ARGS(n), 0, &r) || sr_rref_to_here(r, 0, &v) || sr_value_int(v) != 1)
        return 1;
    sr_value_unref(v);
    sr_value *rv = sr_value_from_rref(r);
    big = sr_bytes("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", 64);
    for (int w = 0; w < NWORK; w++)
        for (int i = 0; wanted[w] && i < warm; i++)
            once(w, r, rv);
    for (int round = 0; round < rounds; round++)
        measure(round, r, rv);
    sr_value_unref(rv);
    sr_value_unref(big);
    sr_value_unref(n);
    sr_rref_unref(r);
    sr_rref_debug_info d;
    if (sr_rref_wait_idle(60) || sr_rref_debug_info_get(&d) || d.num_pending_children || d.num_pending_users)
        sh->errors++;
    sr_rpc_sync(1, "done", SR_NOARGS, 0, NULL);
    sr_rpc_sync(2, "done", SR_NOARGS, 0, NULL);
    return 0;
}

static int worker(int rank, int world, void *arg)
{
    (void)world;
    (void)arg;
    sr_register("done", fn_done);
    sr_register_async("take", fn_take);
    sr_register_async("relay", fn_relay);
    done_fut = sr_future_new();
    if (sr_init(NULL))
        return 1;
    int rc = rank == 0 ? driver() : sr_future_wait(done_fut, NULL);
    sr_future_unref(done_fut);
    if (sr_shutdown(true, 60)) {
        fprintf(stderr, "rank %d: shutdown: %s\n", rank, sr_last_error());
        return 1;
    }
    return rc ? 1 : 0;
}

/* The driver's sleeps and wakes per call of workload w, on its line and in its record. */
static void report_wakes(int w, bench_rec *rec)
{
    double calls = (double)rounds * n_calls, sleeps = sh->r[w].sleeps / calls, wakes = sh->r[w].wakes / calls;
    printf(" | driver per call: %.3f sleeps, %.3f wakes", sleeps, wakes);
    bench_rec_num(rec, "driver_sleeps_per_call", sleeps);
    bench_rec_num(rec, "driver_wakes_per_call", wakes);
}

/* Returns 1 if a target (remote()+to_here(), fork) was missed. */
static int report(void)
{
    int missed = 0;
    double noop50[ROUNDS], noop99[ROUNDS];
    memcpy(noop50, sh->r[NOOP].p50, sizeof(noop50));
    memcpy(noop99, sh->r[NOOP].p99, sizeof(noop99));
    double base = bench_median(noop50, rounds);
    printf("# bench_rref: 3 workers (driver, owner, second user), %d rounds x %d calls, median over rounds\n",
           rounds, n_calls);
    char vs[320];
    printf("%-19s | p50 %8.0f ns p99 %8.0f ns | %s", names[NOOP], base, bench_median(noop99, rounds),
           bench_torch_vs(&pt, "noop", base, vs, sizeof(vs)));
    bench_rec rec;
    bench_rec_begin(&rec, names[NOOP]);
    bench_rec_num(&rec, "p50_ns", base);
    bench_rec_num(&rec, "p99_ns", bench_median(noop99, rounds));
    bench_rec_torch(&rec, &pt, "noop");
    report_wakes(NOOP, &rec);
    printf("\n");
    bench_rec_emit(&rec);
    for (int w = 1; w < NWORK; w++) {
        double ratio[ROUNDS], p50[ROUNDS], p99[ROUNDS];
        int ref = w == REMOTE_BIG ? ECHO_BIG : NOOP; /* the same payload through rpc_sync */
        bool target = w == REMOTE || w == FORK;
        double limit = w == REMOTE ? 2.0 : 3.0;
        if (!wanted[w])
            continue;
        for (int i = 0; i < rounds; i++)
            ratio[i] = sh->r[w].p50[i] / sh->r[ref].p50[i];
        memcpy(p50, sh->r[w].p50, sizeof(p50));
        memcpy(p99, sh->r[w].p99, sizeof(p99));
        double m = bench_median(p50, rounds), q = bench_median(ratio, rounds);
        printf("%-19s | p50 %8.0f ns p99 %8.0f ns | %.2fx %s", names[w], m, bench_median(p99, rounds), q, names[ref]);
        bench_rec_begin(&rec, names[w]);
        bench_rec_num(&rec, "p50_ns", m);
        bench_rec_num(&rec, "p99_ns", bench_median(p99, rounds));
        bench_rec_str(&rec, "ref", names[ref]);
        bench_rec_num(&rec, "ratio_p50", q);
        missed |= target && q > limit;
        if (target) {
            printf(" (target <= %.0f: %s)", limit, bench_verdict(q <= limit));
            bench_rec_num(&rec, "target_ratio_p50", limit);
            bench_rec_bool(&rec, "target_met", q <= limit);
        }
        if (w == FORK && wanted[RELAY]) {
            for (int i = 0; i < rounds; i++)
                ratio[i] = sh->r[FORK].p50[i] / sh->r[RELAY].p50[i];
            printf(" | %.2fx relay via owner", bench_median(ratio, rounds));
            bench_rec_num(&rec, "ratio_p50_relay", bench_median(ratio, rounds));
        }
        if (pt_keys[w][0]) {
            printf(" | %s", bench_torch_vs(&pt, pt_keys[w], m, vs, sizeof(vs)));
            bench_rec_torch(&rec, &pt, pt_keys[w]);
        }
        report_wakes(w, &rec);
        printf("\n");
        bench_rec_emit(&rec);
    }
    return missed;
}

/* bench_rref [--json] [--no-torch] [remote] [big] [fork] [relay] [proxy] [pair] [noop2]: the workloads
 * to run (default all; fork brings relay, its reference). */
int main(int argc, char **argv)
{
    static const char *keys[NWORK] = {"noop", "remote", "big", "big", "fork", "relay", "proxy", "pair", "noop2"};
    bench_cli cli = {.prog = "bench_rref",
                     .names = {"remote", "big", "fork", "relay", "proxy", "pair", "noop2"},
                     .flags = {"--no-torch"},
                     .usage = "  --no-torch  skip PyTorch (bench/compare/torch_rref.py, run first otherwise)",
                     .smoke_what = "1 round of 100 calls per workload"};
    bench_cli_parse(&cli, argc, argv);
    if (cli.smoke)
        rounds = 1, n_calls = 100, warm = 20;
    for (int w = 1; w < NWORK; w++)
        wanted[w] = bench_cli_wants(&cli, keys[w]);
    wanted[RELAY] |= wanted[FORK];
    if (!(sh = bench_shared_alloc(sizeof(*sh))))
        return 1;
    bench_torch_run(&pt, BENCH_COMPARE_DIR "/torch_rref.py", getenv("BENCH_TORCH_QUICK") ? "--quick" : "",
                    cli.flag[0] ? "--no-torch" : getenv("BENCH_NO_TORCH") ? "BENCH_NO_TORCH set" : NULL);
    sr_spawn_opts o = {.name_prefix = "bench-rref", .shm_size = 3ull << 28};
    if (sr_spawn(3, worker, NULL, &o)) {
        fprintf(stderr, "bench_rref: %s\n", sr_last_error());
        return 1;
    }
    if (sh->errors) {
        fprintf(stderr, "bench_rref: %d calls failed\n", sh->errors);
        return 1;
    }
    int missed = report();
    return missed && getenv("BENCH_STRICT") && !cli.smoke ? 1 : 0; /* as bench_ring: a miss fails only when asked */
}
