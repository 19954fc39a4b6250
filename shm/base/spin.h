/* SPDX-License-Identifier: MIT */
/* Spinning that gives way.
 *
 * A thread that spins for a message holds its core. If the scheduler has
 * queued another thread on that core, that thread waits until the spinner
 * is preempted or gives up its spin: tens of microseconds. And it is often
 * the very thread the spinner waits for: a wake-up lands on the waker's
 * core when no other core looks idle to the kernel (on a VM a halted vCPU
 * looks preempted, not idle), so the peer a caller has just woken queues
 * behind the caller's own spin for the answer that peer is to send.
 *
 * So a spin loop, which reads the clock every round anyway, calls
 * sched_yield() every SR_SPIN_YIELD_NS: a thread queued here runs at once,
 * and with none queued the call returns at once. The first yield comes
 * only SR_SPIN_YIELD_NS into the spin, so a spin that ends sooner (a hot
 * round trip) makes no system call.
 *
 *     int64_t now = sr__now_ns(), until = now + budget, give = now + SR_SPIN_YIELD_NS;
 *     while (!ready() && (now = sr__now_ns()) < until)
 *         give = sr__spin_give_way(now, give);
 *
 * Any thread; no state but the caller's `give`. */
#ifndef SR_BASE_SPIN_H
#define SR_BASE_SPIN_H

#if !defined(SR__SEES_BASE)
#error "spin.h is the seam of the base layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <sched.h>
#include <stdint.h>

#define SR_SPIN_YIELD_NS 2000

/* now: the spin loop's clock reading; due: when the next yield is due.
 * Yields if it is due; returns when the next one is. */
static inline int64_t sr__spin_give_way(int64_t now, int64_t due)
{
    if (now < due)
        return due;
    sched_yield();
    return now + SR_SPIN_YIELD_NS;
}

#endif
