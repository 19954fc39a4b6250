/* SPDX-License-Identifier: MIT */
/* The barrier vocabulary of shm/.
 *
 * All synchronisation is C11 <stdatomic.h>; `volatile` is never used for it.
 * Every non-relaxed access in shm/ names the operation it pairs with, and
 * every relaxed access says why relaxed is enough.
 */
#ifndef SR_SHM_ATOMICS_H
#define SR_SHM_ATOMICS_H

#if !defined(SR__SEES_BASE)
#error "atomics.h is the seam of the base layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdatomic.h>
#include <stdint.h>

#define SR_CACHELINE 64
#define SR_ALIGNED_LINE __attribute__((aligned(SR_CACHELINE)))

/* Politely burn a few cycles in a spin loop. */
static inline void sr__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

#define sr_likely(x) __builtin_expect(!!(x), 1)
#define sr_unlikely(x) __builtin_expect(!!(x), 0)

#endif
