/* SPDX-License-Identifier: MIT */
/* A process-private lock for short critical sections on hot paths.
 *
 * One word: 0 free, 1 held, 2 held and someone may sleep on it. Taking a
 * free lock is one CAS and giving it back one exchange, in line: a
 * pthread mutex costs a call into libc and some 25 instructions for each
 * (bench/icount.h measured the RPC layer's call slots: about 80
 * instructions a call more than this). A thread that finds it held looks
 * again for up to SR_LOCK_SPIN_NS (lock.c: a microsecond, about what one
 * futex wait and wake cost here), then sleeps on the word (a private
 * futex). The sections are short, so a holder that runs frees the lock
 * within that; one that was preempted costs the waiter that microsecond
 * and then its sleep, however many threads share the cores. No recursion,
 * no owner check, no timeout: a lock held for a bounded section only,
 * never across a wait.
 *
 * Ordering: L1 the taking CAS or exchange (acquire) pairs with U1 the
 * giving exchange (release): everything the holder did is visible to the
 * next one. ThreadSanitizer sees these atomics, so it needs no annotation.
 */
#ifndef SR_BASE_LOCK_H
#define SR_BASE_LOCK_H

#if !defined(SR__SEES_BASE)
#error "lock.h is the seam of the base layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdatomic.h>
#include <stdint.h>

typedef struct sr__lock {
    _Atomic uint32_t word; /* 0 free, 1 held, 2 held and contended */
} sr__lock;

#define SR__LOCK_INIT {0}

static inline void sr__lock_init(sr__lock *l) { atomic_init(&l->word, 0); }

/* Look for the lock to be freed for a while, then sleep until it is ours
 * (lock.c). */
void sr__lock_wait(sr__lock *l);
/* Wake one sleeper (lock.c). */
void sr__lock_wake(sr__lock *l);

static inline void sr__lock_take(sr__lock *l)
{
    uint32_t c = 0;
    /* L1 acquire: pairs with U1 of the previous holder */
    if (__builtin_expect(!atomic_compare_exchange_strong_explicit(&l->word, &c, 1, memory_order_acquire,
                                                                 memory_order_relaxed), 0))
        sr__lock_wait(l);
}

static inline void sr__lock_give(sr__lock *l)
{
    /* U1 release: pairs with L1 of the next holder */
    if (__builtin_expect(atomic_exchange_explicit(&l->word, 0, memory_order_release) == 2, 0))
        sr__lock_wake(l);
}

#endif
