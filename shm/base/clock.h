/* SPDX-License-Identifier: MIT */
/* Clocks: CLOCK_MONOTONIC in nanoseconds, for deadlines and durations.
 *
 * Any thread. Deadlines everywhere in shmrpc are absolute sr__now_ns()
 * values; -1 means none. */
#ifndef SR_BASE_CLOCK_H
#define SR_BASE_CLOCK_H

#if !defined(SR__SEES_BASE)
#error "clock.h is the seam of the base layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdint.h>

int64_t sr__now_ns(void);
/* A cheaper clock for deadlines: CLOCK_MONOTONIC_COARSE plus one tick of its
 * resolution, so it is never behind sr__now_ns() (a deadline computed from it
 * fires late by at most one tick, never early). */
int64_t sr__now_coarse_ns(void);

#endif
