/* SPDX-License-Identifier: MIT */
/* futex_waitv (Linux 5.16+) and its probe, shared by the transport's holder
 * sleep (a segment word and a private word at once) and the agent's idle
 * waiters (private words only).
 */
#ifndef SR_SHM_FUTEX_H
#define SR_SHM_FUTEX_H

#if !defined(SR__SEES_SHM)
#error "futex.h is the seam of the substrate (shm) layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "atomics.h"

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449 /* the generic syscall table's number (Linux 5.16) */
#endif

/* Does the kernel have futex_waitv (5.16+)? Probed once per file: an empty
 * vector is -EINVAL where the call exists; threads probing at once store the same answer. */
/* Wake every waiter on a word of the segment (a shared futex: the waiters
 * are other processes). */
static inline void sr__futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline bool sr__futex_waitv_supported(void)
{
    static _Atomic int known = -1;
    /* relaxed (both): threads probing at once store the same answer, and nothing is published with it */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k < 0) {
        k = syscall(SYS_futex_waitv, NULL, 0, 0, NULL, CLOCK_MONOTONIC) < 0 && errno == ENOSYS ? 0 : 1;
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k;
}

/* Sleep until one of the n words changes from its value and is woken, or
 * the deadline (CLOCK_MONOTONIC, < 0: none). 0 when woken, else -errno
 * (-EAGAIN: a word had already changed; -ETIMEDOUT). */
static inline int sr__futex_waitv(struct futex_waitv *v, unsigned n, int64_t deadline)
{
    struct timespec ts = {.tv_sec = deadline / 1000000000, .tv_nsec = deadline % 1000000000};
    return syscall(SYS_futex_waitv, v, n, 0, deadline >= 0 ? &ts : NULL, CLOCK_MONOTONIC) < 0 ? -errno : 0;
}

static inline struct futex_waitv sr__futex_private_word(_Atomic uint32_t *w, uint32_t val)
{
    return (struct futex_waitv){.val = val, .uaddr = (uint64_t)(uintptr_t)w, .flags = FUTEX_32 | FUTEX_PRIVATE_FLAG};
}

#endif
