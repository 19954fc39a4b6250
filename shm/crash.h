/* SPDX-License-Identifier: MIT */
/* Crash reports: which call a worker was serving when it died of a fatal
 * signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT).
 *
 * The thread that runs a call marks it in a thread-local slot
 * (sr__serving_enter / sr__serving_exit: two plain stores, no syscall, no
 * shared cache line). At attach the transport installs a handler for those
 * signals (sr__crash_install); it copies the crashing thread's mark into the
 * worker's table slot in the segment (segment.h, crash line), then puts back
 * the handler it replaced (the default, or one the program or a sanitizer
 * had) and raises the signal again, so the process ends as it would have.
 * The supervisor prints the mark with its exit report (sr__seg_crash_text):
 *   "rank 1 (pid 42) was killed by signal SIGSEGV while serving 'train_step' from worker0"
 * Only the first crashing thread writes the slot. A handler the program
 * installs after sr_init replaces ours (no report then); ours is removed at
 * detach unless it was replaced meanwhile. A crash on a thread serving no
 * call (the progress thread, the user's own threads) leaves no mark. A stack
 * overflow is not reported (the handler has no alternate stack).
 */
#ifndef SR_SHM_CRASH_H
#define SR_SHM_CRASH_H

#if !defined(SR__SEES_SHM)
#error "crash.h is the seam of the substrate (shm) layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdatomic.h>

#include "segment.h"

struct sr__serving {
    const char *fn; /* the function's name; outlives the call (the registry is append-only) */
    int caller;
};

extern _Thread_local struct sr__serving sr__serving_now;

/* Mark a call as running on this thread; returns the previous mark (calls
 * nest: a thread waiting on a nested call may serve another inline). */
static inline struct sr__serving sr__serving_enter(const char *fn, int caller)
{
    struct sr__serving prev = sr__serving_now;
    sr__serving_now = (struct sr__serving){fn, caller};
    /* the handler runs on this thread: a compiler barrier orders the mark before the call */
    atomic_signal_fence(memory_order_seq_cst);
    return prev;
}

static inline void sr__serving_exit(struct sr__serving prev)
{
    atomic_signal_fence(memory_order_seq_cst); /* as above: the call is over before the mark goes */
    sr__serving_now = prev;
}

/* Install the handlers; crashes are reported into slot (this worker's). */
void sr__crash_install(struct sr_worker_info *slot);
/* Remove them (before the segment is unmapped). */
void sr__crash_uninstall(void);

#endif
