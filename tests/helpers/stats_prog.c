/* SPDX-License-Identifier: MIT */
/* The program of tests/trace/check_stats.py, under SHMRPC_STATS=1: rank 0
 * calls "noop" 200 times on every rank (itself included) and "nap", which
 * sleeps 15 ms, 3 times on the last rank, so that a latency column holds
 * values of microseconds and of milliseconds; then every worker shuts down
 * and says so on stderr ("rank R: after sr_shutdown"). Runs on any number
 * of workers, one included. */
#include <stdio.h>
#include <time.h>

#include <shmrpc/shmrpc.h>

static int noop(sr_call *c) { return sr_call_return(c, NULL); }

static int nap(sr_call *c)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 15 * 1000 * 1000};
    nanosleep(&ts, NULL); /* the workload: a slow function, not a synchronisation */
    return sr_call_return(c, NULL);
}

static int calls(void)
{
    int world = sr_world_size();
    for (int r = 0; r < world; r++)
        for (int i = 0; i < 200; i++)
            if (sr_rpc_sync(r, "noop", SR_NOARGS, 0, NULL))
                return fprintf(stderr, "noop: %s\n", sr_last_error()), 1;
    for (int i = 0; i < 3; i++)
        if (sr_rpc_sync(world - 1, "nap", SR_NOARGS, 0, NULL))
            return fprintf(stderr, "nap: %s\n", sr_last_error()), 1;
    return 0;
}

int main(void)
{
    sr_register("noop", noop);
    sr_register("nap", nap);
    if (sr_init(NULL))
        return fprintf(stderr, "%s\n", sr_last_error()), 1;
    int rank = sr_rank(), rc = rank == 0 ? calls() : 0;
    if (sr_shutdown(true, 60))
        return fprintf(stderr, "%s\n", sr_last_error()), 1;
    fprintf(stderr, "rank %d: after sr_shutdown\n", rank);
    return rc;
}
