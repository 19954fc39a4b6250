/* SPDX-License-Identifier: MIT */
/* A program run with no launcher at all (tests/job/check_solo.py): sr_init
 * makes a one-worker job, a call to itself works, a call to a rank that
 * does not exist fails naming it, and the exit status is sr_shutdown's. */
#include <stdio.h>

#include <shmrpc/shmrpc.h>

static int square(sr_call *c)
{
    int64_t x = sr_value_int(sr_call_arg(c, 0));
    return sr_call_return(c, sr_int(x * x));
}

int main(void)
{
    sr_register("square", square);
    if (sr_init(NULL))
        return fprintf(stderr, "%s\n", sr_last_error()), 1;
    printf("rank %d of %d\n", sr_rank(), sr_world_size());
    sr_value *x = sr_int(7), *y = NULL;
    int rc = sr_rpc_sync(0, "square", SR_ARGS(x), 0, &y);
    if (rc == 0)
        printf("square(7) on %s = %lld\n", sr_worker_name(0), (long long)sr_value_int(y));
    int bad = sr_rpc_sync(1, "square", SR_ARGS(x), 0, NULL);
    printf("a call to rank 1: %s\n", bad == -EINVAL ? "-EINVAL" : "not refused");
    sr_value_unref(x);
    sr_value_unref(y);
    if (sr_shutdown(true, 0))
        return fprintf(stderr, "%s\n", sr_last_error()), 1;
    return rc || bad != -EINVAL;
}
