/* SPDX-License-Identifier: MIT */
/* Tutorial, step 1: a first RPC (docs/TUTORIAL.md).
 *
 *     shmrun -n 2 ./tutorial_01_rpc
 *
 * Two workers run this same program. Worker 1 offers a function, "square";
 * worker 0 calls it twice: with sr_rpc_sync (wait for the answer) and with
 * sr_rpc_async (get a future now, wait for it later). */
#include <stdio.h>

#include <shmrpc/shmrpc.h>

/* A plain function: its arguments are borrowed, its result is handed over. */
static int square(sr_call *c)
{
    int64_t x = sr_value_int(sr_call_arg(c, 0));
    return sr_call_return(c, sr_int(x * x));
}

static int caller(void)
{
    sr_value *x = sr_int(7), *y = NULL, *z = NULL;
    /* rpc_sync: blocks until worker 1 has answered. 0: the default timeout. */
    if (sr_rpc_sync(1, "square", SR_ARGS(x), 0, &y))
        return fprintf(stderr, "rpc_sync: %s\n", sr_last_error()), 1;
    printf("square(7) on %s = %lld\n", sr_worker_name(1), (long long)sr_value_int(y));

    /* rpc_async: the call is on its way; the future holds its result. */
    sr_future *f = NULL;
    if (sr_rpc_async(1, "square", SR_ARGS(y), 0, &f) || sr_future_wait(f, &z))
        return fprintf(stderr, "rpc_async: %s\n", sr_last_error()), 1;
    printf("square(49) = %lld\n", (long long)sr_value_int(z));

    /* An error on the callee comes back as an error here, with its text. */
    if (sr_rpc_sync(1, "no_such_function", SR_NOARGS, 0, NULL) == 0)
        return fprintf(stderr, "an unknown function did not fail\n"), 1;
    printf("unknown function: %s\n", sr_last_error());

    int ok = sr_value_int(y) == 49 && sr_value_int(z) == 2401;
    sr_future_unref(f);
    sr_value_unref(x); /* every value we made or received is ours to release */
    sr_value_unref(y);
    sr_value_unref(z);
    return ok ? 0 : 1;
}

int main(void)
{
    sr_register("square", square); /* every worker registers, before sr_init */
    if (sr_init(NULL))
        return fprintf(stderr, "sr_init: %s\n", sr_last_error()), 1;
    int rc = sr_rank() == 0 ? caller() : 0;
    /* Graceful shutdown waits for every worker: worker 1 serves calls until
     * worker 0 has finished too. */
    if (sr_shutdown(true, 0))
        rc = 1;
    return rc;
}
