/* SPDX-License-Identifier: MIT */
/* The machine's floor, measured in the same run as the thing compared to it
 * (the design notes' floor.c, made reusable):
 *   - cache-line ping-pong round trip between two processes, both spinning:
 *     the cheapest possible cross-core message (one line each way);
 *   - the same with two lines, one written by each side: what any pair of
 *     one-way queues (a request ring and a reply ring) must pay at least;
 *   - futex sleep/wake ping-pong round trip between two processes: the
 *     cheapest possible message to a process that is asleep;
 *   - single-core memcpy bandwidth.
 *
 * The ping-pongs run between two processes that share a bench_floor_area
 * (bench_shared_alloc before fork, or any shared mapping). One process calls
 * with BENCH_INITIATOR and times every round trip; the other calls the same
 * function with BENCH_ECHO and the same n. Consecutive calls continue where
 * the previous ones stopped, so no reset or barrier is needed between calls,
 * as long as both processes make the same sequence of calls.
 *
 * Everything here is plain C11 atomics and raw futex(2): it shares no code
 * with shmrpc, so a change to shmrpc cannot move the floor.
 */
#ifndef SR_BENCH_FLOOR_H
#define SR_BENCH_FLOOR_H

#include <stddef.h>
#include <stdint.h>

#include "bench_util.h"

enum bench_role { BENCH_INITIATOR = 0, BENCH_ECHO = 1 };

typedef struct bench_floor_area {
    /* The ping-pong line: the initiator writes odd values, the echo even. */
    _Atomic uint32_t line __attribute__((aligned(BENCH_LINE)));
    /* Two-line ping-pong: the initiator writes `req`, the echo `rep`; each
     * in its own 128-byte pair of lines, so the adjacent-line prefetcher
     * cannot merge them. At rest req == rep. */
    _Atomic uint32_t req __attribute__((aligned(2 * BENCH_LINE)));
    _Atomic uint32_t rep __attribute__((aligned(2 * BENCH_LINE)));
    /* futex ping-pong: the initiator writes `ping`, the echo writes `pong`;
     * at rest ping == pong. Each word has its own line, as in floor.c. */
    _Atomic uint32_t ping __attribute__((aligned(BENCH_LINE)));
    _Atomic uint32_t pong __attribute__((aligned(BENCH_LINE)));
} bench_floor_area;

/* n round trips of the cache-line ping-pong. The initiator stores each round
 * trip's duration in rtt_ns[0..n) (unused by the echo, may be NULL). 0, or
 * -ETIMEDOUT when the peer stops answering for 10 s. */
int bench_floor_cacheline(bench_floor_area *a, enum bench_role role, uint32_t n, int64_t *rtt_ns);

/* n round trips of the two-line ping-pong (both sides spinning). Same
 * contract as bench_floor_cacheline. */
int bench_floor_twoline(bench_floor_area *a, enum bench_role role, uint32_t n, int64_t *rtt_ns);

/* n round trips of futex wake / futex wait, no spinning on either side.
 * Same contract as bench_floor_cacheline. */
int bench_floor_futex(bench_floor_area *a, enum bench_role role, uint32_t n, int64_t *rtt_ns);

/* The CPU a sleeping round trip costs: fork a child and ping-pong n times
 * through futex wake / futex wait (after a warm-up); *cpu_ns_per_rtt is
 * both processes' CPU time over the n round trips, per round trip. What
 * any message to a sleeping process and its sleeping answer cost the
 * machine, whatever carries them. 0 or -errno. */
int bench_floor_futex_cpu(uint32_t n, double *cpu_ns_per_rtt);

/* What one hand-over of a core by sched_yield costs: fork a child, pin
 * both processes to one CPU (the first of ours) and ping-pong n times
 * through a shared word, each side yielding until it is its turn (after a
 * warm-up). *ns_per_switch is the wall time per switch (two a round trip):
 * what a waiter that polls by yielding (docs/SUBSTRATE.md, section 5) pays
 * per answer on a core it shares. 0, or -errno (-ETIMEDOUT: no turn for
 * 10 s). */
int bench_floor_yield_switch(uint32_t n, double *ns_per_switch);

/* Best of reps copies of a bytes-sized buffer on one core, in GiB/s; < 0 on
 * allocation failure. */
double bench_floor_memcpy_gibs(size_t bytes, int reps);

/* Standalone: fork a child and measure both ping-pongs between it and the
 * caller (warm-up, then n_cacheline and n_futex round trips). 0 or -errno. */
typedef struct bench_floor_result {
    bench_lat cacheline, futex;
} bench_floor_result;
int bench_floor_measure(uint32_t n_cacheline, uint32_t n_futex, bench_floor_result *out);

#endif
