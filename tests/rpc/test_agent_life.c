/* SPDX-License-Identifier: MIT */
/* The agent's lifetime: every entry point is safe to call
 * from any thread while another thread runs sr_shutdown. Before, the agent
 * was a plain global that sr_shutdown freed under the callers' feet (ASan:
 * heap-use-after-free; without it, a crash or garbage). Now a call either
 * completes, or fails with -SR_ESHUTDOWN naming the function.
 *
 * One worker, several rounds of sr_init / sr_shutdown(graceful=false) with
 * threads hammering the API across the shutdown; the threads start their
 * race on an event (every thread has made its calls), never on a timer. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "agent.h" /* sr__ref_slots_max, sr__ref_global_taken */
#include "rpc_harness.h"

LEAK_CHECKED_SUITE(agent_life);

#define THREADS 4
#define ROUNDS 6
#define WARMUP 20 /* calls each thread makes before the shutdown may start */

static _Atomic int warmed;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

struct outcome {
    int idx;        /* which calls this thread starts with */
    int err;        /* the error that ended the thread's loop */
    char msg[256];  /* and its message */
    long calls;
};

static int one_call(int kind, const char **fn)
{
    sr_value *v = NULL;
    sr_future *f = NULL;
    sr_debug_info d;
    int rc;
    switch (kind % 6) {
    case 0:
        *fn = "sr_rank";
        return sr_rank() < 0 ? sr_rank() : 0;
    case 1:
        *fn = "sr_worker_name";
        return sr_worker_name(0) ? 0 : -SR_ESHUTDOWN;
    case 2:
        *fn = "sr_get_rpc_timeout";
        return sr_get_rpc_timeout() < 0 ? -SR_ESHUTDOWN : 0;
    case 3:
        *fn = "sr_debug_info_get";
        return sr_debug_info_get(&d);
    case 4:
        *fn = "sr_rpc_sync";
        rc = sr_rpc_sync(0, "noop", SR_NOARGS, 0, &v);
        sr_value_unref(v);
        return rc;
    default:
        *fn = "sr_rpc_async";
        rc = sr_rpc_async(0, "noop", SR_NOARGS, 0, &f);
        if (!rc) {
            rc = sr_future_wait(f, NULL);
            sr_future_unref(f);
        }
        return rc;
    }
}

static void *hammer(void *p)
{
    struct outcome *o = p;
    const char *fn = "";
    int rc;
    for (long i = 0;; i++) {
        rc = one_call((int)i + o->idx, &fn);
        if (rc)
            break;
        if (++o->calls == WARMUP) {
            pthread_mutex_lock(&mu);
            atomic_fetch_add(&warmed, 1);
            pthread_cond_broadcast(&cv);
            pthread_mutex_unlock(&mu);
        }
    }
    o->err = rc;
    snprintf(o->msg, sizeof(o->msg), "%s | %s", fn, sr_last_error());
    if (o->calls < WARMUP) { /* never warmed: let the main thread go on */
        pthread_mutex_lock(&mu);
        atomic_fetch_add(&warmed, 1);
        pthread_cond_broadcast(&cv);
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

static int wait_warm(int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 20;
    pthread_mutex_lock(&mu);
    int rc = 0;
    while (atomic_load(&warmed) < n && rc == 0)
        rc = pthread_cond_timedwait(&cv, &mu, &ts);
    pthread_mutex_unlock(&mu);
    return atomic_load(&warmed) >= n ? 0 : -ETIMEDOUT;
}

/* arg: NULL, or the number of per-thread reference slots to hand out
 * (life.c): with 1, every round has threads past it, which count their
 * references on the process-wide word, racing the shutdown beside the
 * ones that have a slot (and the slots of exited threads are recycled). */
static int race_worker(int rank, int world, void *arg)
{
    (void)rank, (void)world;
    if (arg)
        atomic_store(&sr__ref_slots_max, *(const uint32_t *)arg);
    uint64_t global_before = 0;
    for (int round = 0; round < ROUNDS; round++) {
        WCHECK(sr_init(NULL) == 0, "round %d: sr_init: %s", round, sr_last_error());
        if (round == 0) /* sr_init's own look for an agent came before the slots existed */
            global_before = atomic_load(&sr__ref_global_taken);
        atomic_store(&warmed, 0);
        struct outcome o[THREADS];
        pthread_t t[THREADS];
        memset(o, 0, sizeof(o));
        for (int i = 0; i < THREADS; i++)
            o[i].idx = i;
        for (int i = 0; i < THREADS; i++)
            WCHECK(pthread_create(&t[i], NULL, hammer, &o[i]) == 0, "pthread_create");
        int w = wait_warm(THREADS);
        int sd = sr_shutdown(false, 0); /* races the threads' calls */
        for (int i = 0; i < THREADS; i++)
            pthread_join(t[i], NULL);
        WCHECK(w == 0, "round %d: the threads did not make %d calls each in 20 s", round, WARMUP);
        WCHECK(sd == 0, "round %d: sr_shutdown: %d %s", round, sd, sr_last_error());
        for (int i = 0; i < THREADS; i++) {
            WCHECK(o[i].calls >= WARMUP, "round %d thread %d: failed before the shutdown: %d %s", round, i, o[i].err,
                   o[i].msg);
            WCHECK(o[i].err == -SR_ESHUTDOWN, "round %d thread %d: ended with %d (%s), not -SR_ESHUTDOWN", round, i,
                   o[i].err, o[i].msg);
            /* Either the call was refused (its message names the function),
             * or it was in flight and the shutdown failed it. */
            const char *fn = o[i].msg, *bar = strstr(o[i].msg, " | ");
            bool named = bar && strstr(bar, "RPC has not been initialized") && memmem(bar, strlen(bar), fn, (size_t)(bar - fn));
            bool overtaken = bar && strstr(bar, "RPC agent shut down before the response arrived");
            WCHECK(named || overtaken, "round %d thread %d: the error does not name the function: %s", round, i, o[i].msg);
        }
    }
    uint64_t global = atomic_load(&sr__ref_global_taken) - global_before;
    WCHECK(arg ? global > 0 : global == 0,
           "%llu references were taken on the process-wide count (expected %s)", (unsigned long long)global,
           arg ? "some: the threads past the slots" : "none: every thread has a slot");
    return 0;
}

Test(agent_life, api_calls_race_sr_shutdown)
{
    sr_spawn_opts o = {.name_prefix = test_ns("life"), .shm_size = 64u << 20};
    int rc = sr_spawn(1, race_worker, NULL, &o);
    cr_assert_eq(rc, 0, "job failed: %s", sr_last_error());
}

Test(agent_life, threads_past_the_reference_slots_race_sr_shutdown)
{
    static const uint32_t one = 1;
    sr_spawn_opts o = {.name_prefix = test_ns("lifeg"), .shm_size = 64u << 20};
    int rc = sr_spawn(1, race_worker, (void *)&one, &o);
    cr_assert_eq(rc, 0, "job failed: %s", sr_last_error());
}
