/* SPDX-License-Identifier: MIT */
/* The hot paths' lock (shm/base/lock.h): mutual exclusion with more
 * threads than cores, and a taker that finds it held sleeps until it is
 * given back. Also a ThreadSanitizer suite (tests/tsan): the plain counter
 * below is a data race unless the lock orders its writers. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "clock.h"
#include "lock.h"

#define THREADS 6
#define ROUNDS 20000

static sr__lock lock = SR__LOCK_INIT;
static uint64_t counter; /* under lock */

static void *add_many(void *arg)
{
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        sr__lock_take(&lock);
        uint64_t v = counter;
        if (i % 64 == 0) /* give the core away inside the section: others then find it held, and sleep */
            sched_yield();
        counter = v + 1;
        sr__lock_give(&lock);
    }
    return NULL;
}

Test(lock, excludes_with_more_threads_than_cores)
{
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, add_many, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(counter, (uint64_t)THREADS * ROUNDS, "lost updates: %llu of %d", (unsigned long long)counter,
                 THREADS * ROUNDS);
    cr_assert_eq(atomic_load(&lock.word), 0, "the lock is not free after every thread gave it back");
}

static _Atomic int taken; /* set by the second taker once the lock is its */

static void *take_once(void *arg)
{
    (void)arg;
    sr__lock_take(&lock);
    atomic_store(&taken, 1);
    sr__lock_give(&lock);
    return NULL;
}

Test(lock, a_taker_sleeps_until_the_holder_gives_it_back)
{
    sr__lock_take(&lock);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, take_once, NULL), 0);
    /* The event: the taker marked the lock contended (2) on its way to sleep. */
    int64_t give_up = sr__now_ns() + 10 * 1000000000ll;
    while (atomic_load(&lock.word) != 2 && sr__now_ns() < give_up)
        sched_yield();
    cr_assert_eq(atomic_load(&lock.word), 2, "the second taker did not mark the lock contended within 10 s");
    cr_assert_eq(atomic_load(&taken), 0, "the second taker took a held lock");
    sr__lock_give(&lock);
    pthread_join(t, NULL);
    cr_assert_eq(atomic_load(&taken), 1);
    cr_assert_eq(atomic_load(&lock.word), 0);
}
