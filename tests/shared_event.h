/* SPDX-License-Identifier: MIT */
/* Events between the processes of a test job: 32-bit words in MAP_SHARED
 * memory (tests/rpc_harness.h's shared_page), set by one process and waited
 * for by another with a shared futex, always with a bound. A test that
 * includes this defines EVENT_WAIT_S, the bound on every wait (no event
 * legitimately takes more than milliseconds; the bound only turns a lost
 * event into a failure instead of a hang). */
#ifndef SR_TESTS_SHARED_EVENT_H
#define SR_TESTS_SHARED_EVENT_H

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef EVENT_WAIT_S
#error "define EVENT_WAIT_S (the bound on every wait, in seconds) before including shared_event.h"
#endif

static inline int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Shared futexes: the words are in MAP_SHARED memory, woken from another process. */
static inline void set_and_wake(_Atomic uint32_t *w, uint32_t v)
{
    atomic_store_explicit(w, v, memory_order_release); /* release: pairs with wait_for's acquire load */
    syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Wait until *w == want, at most EVENT_WAIT_S; false if it never came. */
static inline bool wait_for(_Atomic uint32_t *w, uint32_t want)
{
    int64_t deadline = now_ns() + (int64_t)EVENT_WAIT_S * 1000000000;
    uint32_t v;
    while ((v = atomic_load_explicit(w, memory_order_acquire)) != want) { /* acquire: pairs with set_and_wake */
        int64_t left = deadline - now_ns();
        if (left <= 0)
            return false;
        struct timespec ts = {.tv_sec = left / 1000000000, .tv_nsec = left % 1000000000};
        syscall(SYS_futex, w, FUTEX_WAIT, v, &ts, NULL, 0);
    }
    return true;
}

/* Wait for a semaphore of this process, at most EVENT_WAIT_S: 0, or
 * -errno (-ETIMEDOUT when it never came). */
static inline int sem_wait_bounded(sem_t *s)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += EVENT_WAIT_S;
    int rc;
    while ((rc = sem_timedwait(s, &dl)) && errno == EINTR)
        ;
    return rc ? -errno : 0;
}

#endif
