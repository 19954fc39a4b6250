/* SPDX-License-Identifier: MIT */
/* The lock's slow paths (lock.h). */
#include "lock.h"
#include "atomics.h" /* sr__cpu_relax */
#include "clock.h"   /* sr__now_ns */

#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

/* How long a thread that found the lock held looks for it to be freed
 * before it sleeps (lock.h). Sleeping at once, the caller of pipelined
 * calls and its progress thread, which ends them, could fall into meeting
 * on the call slots' lock about once a call: 87,000-180,000 futex calls
 * for 200,000 rpc_async calls in such runs (perf stat), and 300-920 ns a
 * call instead of 150-170; with the look, 1,300-1,600 futex calls and
 * 150-450 ns (the upper end while the host was busy; bench_rpc pipeline,
 * interleaved pairs, docs/PERFORMANCE.md). */
#define SR_LOCK_SPIN_NS 1000

void sr__lock_wait(sr__lock *l)
{
    int64_t until = 0; /* the clock is read only once 8 looks failed: most holders are done by then */
    for (unsigned i = 1;; i++) {
        sr__cpu_relax();
        /* relaxed: a look; the CAS below takes it (L1) */
        if (atomic_load_explicit(&l->word, memory_order_relaxed) == 0) {
            uint32_t z = 0;
            /* L1 acquire: pairs with U1 of the holder that freed it */
            if (atomic_compare_exchange_strong_explicit(&l->word, &z, 1, memory_order_acquire, memory_order_relaxed))
                return;
        }
        if (i % 8 == 0) { /* the clock now and then: a pause lasts from a few cycles to 140, by CPU */
            int64_t now = sr__now_ns();
            if (!until)
                until = now + SR_LOCK_SPIN_NS;
            else if (now >= until)
                break;
        }
    }
    /* Mark the lock contended (2) and take it if it was freed meanwhile;
     * else sleep while it stays 2. A spurious or early wake only loops.
     * L1 acquire: pairs with U1 of the holder that freed it. */
    uint32_t c = atomic_exchange_explicit(&l->word, 2, memory_order_acquire);
    while (c != 0) {
        syscall(SYS_futex, &l->word, FUTEX_WAIT | FUTEX_PRIVATE_FLAG, 2, NULL, NULL, 0);
        c = atomic_exchange_explicit(&l->word, 2, memory_order_acquire); /* L1, as above */
    }
}

void sr__lock_wake(sr__lock *l)
{
    syscall(SYS_futex, &l->word, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, 1, NULL, NULL, 0);
}
