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
#include <stdbool.h>
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

/* Polling by yielding, and when not to.
 *
 * With more runnable threads than cores nobody may spin, and a waiter that
 * sleeps pays a sleep and a wake-up per message (10-20 us on a VM). Polling
 * by sched_yield() instead hands the core at once to whoever is queued
 * there, often the thread whose answer it waits for: fan-in's callers were
 * 2-3x faster so. But a yield also hands the core to another job's thread,
 * which then runs a whole slice (milliseconds) before the waiter polls
 * again, where a sleeper would be woken, and scheduled, at once: with three
 * busy loops on two cores, fan-in fell from tens of thousands of calls a
 * second to a few hundred or thousand (each call about 4 ms).
 *
 * So each thread keeps a gate: a yield that took longer than
 * SR_YIELD_SLOW_NS (something else ran a slice) closes it for a back-off
 * that starts at SR_YIELD_BACKOFF_MIN_NS and doubles up to
 * SR_YIELD_BACKOFF_MAX_NS while slow yields recur; the waiter sleeps
 * meanwhile. A poll whose yields were all quick opens it fully again. On a
 * machine that other jobs load, a thread then loses at most one slice per
 * back-off (under 1% once it reaches its cap); on one that only its own job
 * oversubscribes, its yields stay quick and it never sleeps for an answer
 * that comes within the budget. Pure functions of the times given, so the
 * policy is tested without timing (tests/base/test_spin.c). One thread's
 * own state (thread-local in its user). */
#define SR_YIELD_SLOW_NS 1000000              /* our own threads' turns take microseconds */
#define SR_YIELD_BACKOFF_MIN_NS 50000000ll    /* 50 ms */
#define SR_YIELD_BACKOFF_MAX_NS 3200000000ll  /* 3.2 s */

struct sr_yield_gate {
    int64_t closed_until; /* no yield polling before this time (ns) */
    int64_t backoff;      /* the last back-off; 0 after a quick poll */
};

/* May this thread poll by yielding now? */
static inline bool sr__yield_gate_open(const struct sr_yield_gate *g, int64_t now) { return now >= g->closed_until; }

/* One yield took took_ns, ending at now: false (and the gate closed) if it
 * was slow. */
static inline bool sr__yield_gate_note(struct sr_yield_gate *g, int64_t took_ns, int64_t now)
{
    if (took_ns <= SR_YIELD_SLOW_NS)
        return true;
    g->backoff = g->backoff ? 2 * g->backoff : SR_YIELD_BACKOFF_MIN_NS;
    if (g->backoff > SR_YIELD_BACKOFF_MAX_NS)
        g->backoff = SR_YIELD_BACKOFF_MAX_NS;
    g->closed_until = now + g->backoff;
    return false;
}

/* A poll ended with every yield quick: the next slow one starts over. */
static inline void sr__yield_gate_quick(struct sr_yield_gate *g) { g->backoff = 0; }

#endif
