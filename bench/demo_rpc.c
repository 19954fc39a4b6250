/* SPDX-License-Identifier: MIT */
/* Demo: the RPC layer under shmrun.
 *
 *   shmrun -n 4 ./demo_rpc
 *
 * Every worker registers a function, then rank 0 drives:
 *   - rpc_sync of a built-in and of a user function on every worker;
 *   - a fan-out of rpc_async calls gathered with wait_all;
 *   - a timed loop of no-op round trips;
 *   - an error coming back from a remote function.
 * The other workers go straight to sr_shutdown() and serve from there, the
 * way PyTorch programs call rpc.shutdown() on non-driving ranks.
 */
#include <stdio.h>
#include <stdlib.h>

#include <time.h>

#include "shmrpc/shmrpc.h"

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int square_plus(sr_call *c)
{
    if (sr_call_nargs(c) != 1 || sr_value_type(sr_call_arg(c, 0)) != SR_KIND_INT)
        return sr_call_fail(c, -22, "square_plus takes one int");
    int64_t x = sr_value_int(sr_call_arg(c, 0));
    return sr_call_return(c, sr_int(x * x + sr_rank()));
}

static int fail_loudly(sr_call *c)
{
    return sr_call_fail(c, -22, "this function always fails (called by worker%d)", sr_call_caller(c));
}

static int check(int rc, const char *what)
{
    if (rc)
        fprintf(stderr, "demo_rpc: %s: %s\n", what, sr_last_error());
    return rc;
}

static int drive(int world)
{
    for (int r = 0; r < world; r++) {
        sr_value *a = sr_int(20), *b = sr_int(r), *x = sr_int(7), *sum = NULL, *sq = NULL;
        if (check(sr_rpc_sync(r, "add", SR_ARGS(a, b), 0, &sum), "add") ||
            check(sr_rpc_sync(r, "square_plus", SR_ARGS(x), 0, &sq), "square_plus"))
            return 1;
        printf("%-8s add(20, %d) = %lld   square_plus(7) = %lld\n", sr_worker_name(r), r,
               (long long)sr_value_int(sum), (long long)sr_value_int(sq));
        sr_value_unref(sum), sr_value_unref(sq), sr_value_unref(a), sr_value_unref(b), sr_value_unref(x);
    }
    enum { FAN = 64 };
    sr_future *fs[FAN];
    sr_value *xs[FAN], *all = NULL;
    for (int i = 0; i < FAN; i++) {
        xs[i] = sr_int(i);
        if (check(sr_rpc_async(i % world, "square_plus", SR_ARGS(xs[i]), 0, &fs[i]), "rpc_async"))
            return 1;
    }
    if (check(sr_future_wait_all(fs, FAN, &all), "wait_all"))
        return 1;
    int64_t total = 0;
    for (int i = 0; i < FAN; i++) {
        total += sr_value_int(sr_value_list_at(all, (size_t)i));
        sr_future_unref(fs[i]);
        sr_value_unref(xs[i]);
    }
    sr_value_unref(all);
    printf("fan-out: %d rpc_async calls gathered, sum of results %lld\n", FAN, (long long)total);

    enum { N = 20000 };
    double t0 = now_ns();
    for (int i = 0; i < N; i++)
        if (check(sr_rpc_sync(1 % world, "noop", SR_NOARGS, 0, NULL), "noop"))
            return 1;
    printf("no-op rpc_sync to %s: %.2f us per round trip (%d calls)\n", sr_worker_name(1 % world),
           (now_ns() - t0) / 1e3 / N, N);

    sr_value *v = NULL;
    int rc = sr_rpc_sync(world - 1, "fail_loudly", SR_NOARGS, 0, &v);
    printf("remote error (rc %d): %s\n", rc, sr_last_error());
    return rc == -SR_EREMOTE ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 1) /* it takes no arguments: say so rather than ignore them */
        return fprintf(stderr, "demo_rpc: unknown argument '%s' (usage: shmrun -n N demo_rpc)\n", argv[1]), 2;
    sr_register("square_plus", square_plus);
    sr_register("fail_loudly", fail_loudly);
    if (check(sr_init(NULL), "sr_init"))
        return 1;
    int rc = sr_rank() == 0 ? drive(sr_world_size()) : 0;
    if (check(sr_shutdown(true, 60), "sr_shutdown"))
        return 1;
    return rc;
}
