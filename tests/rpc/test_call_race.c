/* SPDX-License-Identifier: MIT */
/* A call's answer races its expiry: each call ends exactly once.
 *
 * A call ends by its answer (whoever reads it: a waiting caller, the
 * progress thread), by expiry (whoever polls once its deadline passed), by
 * its peer's failure or by shutdown; each takes the call out of the table
 * (lib/rpc/calls.c: the slot's generation, the deadline heap, the peer's
 * list, the free list). Here two threads of worker0 keep many calls in
 * flight to worker1 with timeouts short enough that the answers of some
 * arrive as their calls expire, so answer and expiry meet on the same
 * slots, from different threads. Whichever wins, each future ends once,
 * with the value or with -ETIMEDOUT (ASan: a call ended twice would unref
 * its future twice), and afterwards the table is whole: nothing in flight,
 * nothing counted in flight, every slot on the free list once. Then calls
 * without a timeout still work on the recycled slots.
 *
 * Nothing here is timed: the timeouts only make some calls lose, in any
 * proportion (both outcomes are right). Every wait is bounded by its
 * call's own timeout. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "rpc_harness.h"

LEAK_CHECKED_SUITE(call_race);

#define THREADS 2
#define ROUNDS 40
#define CALLS 256     /* in flight per thread and round */
#define TIMEOUT_S 0.001

struct tally {
    uint64_t answered, expired;
    char err[256]; /* the first wrong outcome, or empty */
};

/* One round of one thread: CALLS calls with a short timeout, then each
 * future's end; the first wrong outcome in t->err. */
static void one_round(struct tally *t)
{
    sr_future *fs[CALLS];
    int started = 0;
    for (; started < CALLS; started++)
        if (sr_rpc_async(1, "noop", SR_NOARGS, TIMEOUT_S, &fs[started])) {
            snprintf(t->err, sizeof(t->err), "sr_rpc_async %d: %s", started, sr_last_error());
            break;
        }
    for (int i = 0; i < started; i++) {
        int w = sr_future_wait(fs[i], NULL); /* bounded by the call's own timeout */
        if (w == 0)
            t->answered++;
        else if (w == -ETIMEDOUT && strstr(sr_last_error(), "RPC ran for more than set timeout"))
            t->expired++;
        else if (!t->err[0])
            snprintf(t->err, sizeof(t->err), "call %d ended with %d: %s", i, w, sr_last_error());
        sr_future_unref(fs[i]);
    }
}

static void *caller(void *arg)
{
    struct tally *t = arg;
    for (int r = 0; r < ROUNDS && !t->err[0]; r++)
        one_round(t);
    return NULL;
}

/* The table once nothing is in flight: in use (odd generations) and free
 * (the free list), under the table's lock. */
struct census {
    int32_t in_use, free, twice;
};

static int take_census(sr_agent *a, struct census *out)
{
    struct census c = {0};
    uint8_t *seen = calloc((size_t)a->nslots, 1);
    if (!seen)
        return -ENOMEM;
    sr__lock_take(&a->slots_lock);
    for (int32_t i = 0; i < a->nslots; i++)
        c.in_use += atomic_load_explicit(&a->slots[i].gen, memory_order_relaxed) & 1;
    for (int32_t i = a->free_head; i >= 0 && c.free <= a->nslots; i = a->slots[i].next_free, c.free++)
        c.twice += seen[i]++ != 0;
    sr__lock_give(&a->slots_lock);
    free(seen);
    *out = c;
    return 0;
}

static int race(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0; /* serves in sr_shutdown */
    static struct tally t[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        WCHECK(pthread_create(&th[i], NULL, caller, &t[i]) == 0, "starting caller thread %d", i);
    uint64_t answered = 0, expired = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        WCHECK(!t[i].err[0], "caller thread %d: %s", i, t[i].err);
        answered += t[i].answered;
        expired += t[i].expired;
    }
    WCHECK(answered + expired == (uint64_t)THREADS * ROUNDS * CALLS, "%llu answered + %llu expired of %d calls",
           (unsigned long long)answered, (unsigned long long)expired, THREADS * ROUNDS * CALLS);
    fprintf(stderr, "call_race: %llu calls answered, %llu expired\n", (unsigned long long)answered,
            (unsigned long long)expired);
    struct census c;
    WCHECK(take_census(sr__agent, &c) == 0, "no memory to take the call table's census");
    WCHECK(c.in_use == 0 && c.twice == 0 && c.free == sr__agent->nslots,
           "after every call ended: %d slots in use, %d free, %d listed twice, of %d", c.in_use, c.free, c.twice,
           sr__agent->nslots);
    sr_debug_info d;
    WCHECK(sr_debug_info_get(&d) == 0, "sr_debug_info_get: %s", sr_last_error());
    WCHECK(d.client_active_calls == 0, "%llu calls counted in flight after every call ended",
           (unsigned long long)d.client_active_calls);
    for (int i = 0; i < 2 * CALLS; i++)
        WCHECK(sr_rpc_sync(1, "noop", SR_NOARGS, SR_TIMEOUT_NONE, NULL) == 0, "call %d on the recycled slots: %s",
               i, sr_last_error());
    return 0;
}

Test(call_race, each_call_ends_once_when_answers_race_expiry, .timeout = 300)
{
    RUN_JOB("callrace", 2, .scenario = race);
}
