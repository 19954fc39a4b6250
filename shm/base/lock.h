/* SPDX-License-Identifier: MIT */
/* A process-private lock for short critical sections on hot paths.
 *
 * One word: 0 free, 1 held, 2 held and someone may sleep on it. Taking a
 * free lock is one CAS and giving it back one exchange, in line: a
 * pthread mutex costs a call into libc and some 25 instructions for each
 * (bench/icount.h measured the RPC layer's call slots: about 80
 * instructions a call more than this). A thread that finds it held sleeps
 * on the word (a private futex) at once: no spin, so no core is taken from
 * the holder when threads outnumber cores. No recursion, no owner check,
 * no timeout: a lock held for a bounded section only, never across a wait.
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

/* Sleep until the lock is ours (lock.c); c: the word the failed CAS saw. */
void sr__lock_wait(sr__lock *l, uint32_t c);
/* Wake one sleeper (lock.c). */
void sr__lock_wake(sr__lock *l);

static inline void sr__lock_take(sr__lock *l)
{
    uint32_t c = 0;
    /* L1 acquire: pairs with U1 of the previous holder */
    if (__builtin_expect(!atomic_compare_exchange_strong_explicit(&l->word, &c, 1, memory_order_acquire,
                                                                 memory_order_relaxed), 0))
        sr__lock_wait(l, c);
}

static inline void sr__lock_give(sr__lock *l)
{
    /* U1 release: pairs with L1 of the next holder */
    if (__builtin_expect(atomic_exchange_explicit(&l->word, 0, memory_order_release) == 2, 0))
        sr__lock_wake(l);
}

#endif
