/* SPDX-License-Identifier: MIT */
/* The lock's slow paths (lock.h). */
#include "lock.h"

#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

void sr__lock_wait(sr__lock *l, uint32_t c)
{
    /* Mark the lock contended (2) and take it if it was freed meanwhile;
     * else sleep while it stays 2. A spurious or early wake only loops.
     * L1 acquire: pairs with U1 of the holder that freed it. */
    if (c != 2)
        c = atomic_exchange_explicit(&l->word, 2, memory_order_acquire);
    while (c != 0) {
        syscall(SYS_futex, &l->word, FUTEX_WAIT | FUTEX_PRIVATE_FLAG, 2, NULL, NULL, 0);
        c = atomic_exchange_explicit(&l->word, 2, memory_order_acquire); /* L1, as above */
    }
}

void sr__lock_wake(sr__lock *l)
{
    syscall(SYS_futex, &l->word, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, 1, NULL, NULL, 0);
}
