/* SPDX-License-Identifier: MIT */
/* The program of tests/job/check_log.py: what SHMRPC_LOG_LEVEL=debug says
 * about a job, and how often a bad level is reported.
 *
 *   shmrun -n 2 log_prog plain
 *       rank 0 calls "stall" on rank 1 with a 50 ms timeout (it times out),
 *       then "release" (stall returns), then both shut down gracefully;
 *   shmrun -n 3 --max-workers 4 log_prog leave
 *       rank 2 leaves at once; rank 0 waits for its departure (which it
 *       logs), then ranks 0 and 1 leave;
 *   log_prog spawn
 *       the same as plain, on 3 workers of sr_spawn (no launcher reads
 *       SHMRPC_LOG_LEVEL: its rank 0 reports a bad value).
 * Every wait is bounded (WAIT_S); any unexpected result exits 1, saying why.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <shmrpc/shmrpc.h>

#define WAIT_S 20

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t released_cond = PTHREAD_COND_INITIALIZER;
static bool released;

static int stall(sr_call *c)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WAIT_S;
    pthread_mutex_lock(&lock);
    int rc = 0;
    while (!released && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&released_cond, &lock, &until);
    pthread_mutex_unlock(&lock);
    return rc ? sr_call_fail(c, -ETIMEDOUT, "stall: not released within %d s", WAIT_S) : sr_call_return(c, NULL);
}

static int release(sr_call *c)
{
    pthread_mutex_lock(&lock);
    released = true;
    pthread_cond_broadcast(&released_cond);
    pthread_mutex_unlock(&lock);
    return sr_call_return(c, NULL);
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "log_prog: %s returned %d: %s\n", what, rc, sr_last_error());
    return 1;
}

static int plain(void)
{
    int rc = 0;
    if (sr_rank() == 0) {
        int t = sr_rpc_sync(1, "stall", SR_NOARGS, 0.05, NULL);
        if (t != -ETIMEDOUT)
            rc = fail("stall, expected to time out,", t);
        if ((t = sr_rpc_sync(1, "release", SR_NOARGS, WAIT_S, NULL)))
            rc = fail("release", t);
    }
    int s = sr_shutdown(true, WAIT_S);
    return s ? fail("sr_shutdown", s) : rc;
}

static int leave(void)
{
    int rc = 0;
    if (sr_rank() == 0 && (rc = sr_wait_for_departure(2, WAIT_S)))
        rc = fail("sr_wait_for_departure(2)", rc);
    int s = sr_shutdown(true, WAIT_S);
    return s ? fail("sr_shutdown", s) : rc;
}

static int worker(int rank, int world, void *arg)
{
    (void)rank, (void)world;
    int rc = sr_init(NULL);
    if (rc)
        return fail("sr_init", rc);
    return arg ? leave() : plain();
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    sr_register("stall", stall);
    sr_register("release", release);
    if (!strcmp(mode, "spawn")) {
        int rc = sr_spawn(3, worker, NULL, NULL);
        return rc ? fail("sr_spawn", rc) : 0;
    }
    if (strcmp(mode, "plain") && strcmp(mode, "leave"))
        return fprintf(stderr, "usage: log_prog plain|leave|spawn\n"), 2;
    return worker(-1, -1, !strcmp(mode, "leave") ? (void *)mode : NULL);
}
