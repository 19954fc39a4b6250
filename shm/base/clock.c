/* SPDX-License-Identifier: MIT */
/* Clocks (clock.h). */
#include "clock.h"

#include <stdatomic.h>
#include <time.h>

int64_t sr__now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int64_t sr__now_coarse_ns(void)
{
    /* Set by the first callers, any thread. Relaxed (both): every thread
     * computes the same value from the kernel, so a thread that reads -1
     * only computes it again; no other data is published with it. */
    static _Atomic int64_t res_cache = -1;
    int64_t res_ns = atomic_load_explicit(&res_cache, memory_order_relaxed);
    if (res_ns < 0) {
        struct timespec r;
        res_ns = clock_getres(CLOCK_MONOTONIC_COARSE, &r) == 0 ? (int64_t)r.tv_sec * 1000000000 + r.tv_nsec : 0;
        atomic_store_explicit(&res_cache, res_ns, memory_order_relaxed);
    }
    struct timespec t;
    if (res_ns == 0 || clock_gettime(CLOCK_MONOTONIC_COARSE, &t))
        return sr__now_ns();
    /* Round up by one tick, so a deadline computed from it never fires early. */
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec + res_ns;
}
