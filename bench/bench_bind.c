/* SPDX-License-Identifier: MIT */
/* What CPU binding does to the hot no-op round trip, under the real shmrun.
 *
 *   shmrun -n 2 [--bind-to none|core] build-release/bench/bench_bind [--json] [hot]
 *
 * Rank 0 times rpc_sync("noop") to rank 1, which serves from sr_shutdown
 * (the callee idle in sr_shutdown, as bench_rpc udf): a warm-up, then 7
 * rounds of 20000 calls, each call timed; the line reports the medians over
 * rounds of each round's p50 and p99, and the CPUs each rank may run on.
 * Run it with and without --bind-to core, alternately, to compare: the two
 * configurations cannot share one run, since binding is fixed at launch.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "shmrpc/shmrpc.h"

#define ROUNDS 7
#define CALLS 20000

static int64_t samples[CALLS];

/* "0-1" */
static void my_cpus(char *buf, size_t len)
{
    cpu_set_t s;
    size_t at = 0;
    buf[0] = 0;
    if (sched_getaffinity(0, sizeof(s), &s))
        return;
    for (int c = 0; c < CPU_SETSIZE && at + 8 < len; c++)
        if (CPU_ISSET(c, &s))
            at += (size_t)snprintf(buf + at, len - at, "%s%d", at ? "," : "", c);
}

static int cpus_of(sr_call *c)
{
    char buf[256];
    my_cpus(buf, sizeof(buf));
    return sr_call_return(c, sr_str(buf));
}

static int timed_round(bench_lat *out)
{
    for (int i = 0; i < CALLS; i++) {
        int64_t t0 = bench_now_ns();
        if (sr_rpc_sync(1, "noop", SR_NOARGS, 0, NULL))
            return -1;
        samples[i] = bench_now_ns() - t0;
    }
    *out = bench_lat_of(samples, CALLS);
    return 0;
}

static int drive(void)
{
    bench_lat l;
    double p50[ROUNDS], p99[ROUNDS];
    if (timed_round(&l)) /* warm-up */
        return 1;
    for (int r = 0; r < ROUNDS; r++) {
        if (timed_round(&l))
            return 1;
        p50[r] = (double)l.p50, p99[r] = (double)l.p99;
    }
    sr_value *peer = NULL;
    if (sr_rpc_sync(1, "cpus_of", SR_NOARGS, 0, &peer))
        return 1;
    char mine[256], config[600];
    my_cpus(mine, sizeof(mine));
    snprintf(config, sizeof(config), "rank 0 cpus %s, rank 1 cpus %s", mine, sr_value_str(peer));
    double m50 = bench_median(p50, ROUNDS), m99 = bench_median(p99, ROUNDS);
    printf("rpc_sync noop under shmrun | %s | p50 %8.0f ns p99 %8.0f ns | %d rounds of %d\n", config, m50, m99,
           ROUNDS, CALLS);
    bench_rec r;
    bench_rec_begin(&r, "rpc_sync noop under shmrun");
    bench_rec_str(&r, "config", config);
    bench_rec_num(&r, "p50_ns", m50);
    bench_rec_num(&r, "p99_ns", m99);
    bench_rec_emit(&r);
    sr_value_unref(peer);
    return 0;
}

int main(int argc, char **argv)
{
    bench_cli cli = {.prog = "bench_bind", .names = {"hot"}};
    bench_cli_parse(&cli, argc, argv); /* every rank: each refuses a bad argument alike */
    sr_register("cpus_of", cpus_of);
    if (sr_init(NULL)) {
        fprintf(stderr, "bench_bind: sr_init: %s\n", sr_last_error());
        return 1;
    }
    int rc = sr_rank() == 0 ? drive() : 0;
    if (rc)
        fprintf(stderr, "bench_bind: %s\n", sr_last_error());
    if (sr_shutdown(true, 60)) {
        fprintf(stderr, "bench_bind: sr_shutdown: %s\n", sr_last_error());
        return 1;
    }
    return rc;
}
