/* SPDX-License-Identifier: MIT */
/* Event words that a test's processes share (on a MAP_SHARED page made
 * before sr_spawn or fork): one side bumps a counter and wakes every
 * waiter, the other waits until it reaches n, with a bound. The futex is a
 * shared one (not FUTEX_PRIVATE), so the word may be on a page another
 * process maps.
 *
 * Test helper, header-only: each test program has its own copy.
 */
#ifndef SR_TESTS_SHARED_WORD_H
#define SR_TESTS_SHARED_WORD_H

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static inline int64_t shared_word_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Wait until *w >= n or wait_s seconds pass; returns *w (the caller's
 * assertion names what did not happen). */
static inline uint32_t shared_word_wait(_Atomic uint32_t *w, uint32_t n, int wait_s)
{
    int64_t until = shared_word_now_ns() + (int64_t)wait_s * 1000000000;
    uint32_t v;
    while ((v = atomic_load(w)) < n && shared_word_now_ns() < until) {
        int64_t left = until - shared_word_now_ns();
        struct timespec ts = {left / 1000000000, left % 1000000000};
        syscall(SYS_futex, w, FUTEX_WAIT, v, &ts, NULL, 0);
    }
    return v;
}

/* Add one to *w and wake every waiter on it. */
static inline void shared_word_bump(_Atomic uint32_t *w)
{
    atomic_fetch_add(w, 1);
    syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

#endif
