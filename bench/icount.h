/* SPDX-License-Identifier: MIT */
/* Instructions a thread executes in user mode, counted exactly: a child
 * process single-steps the calling thread with ptrace(2) from
 * bench_icount_begin to bench_icount_end. For machines without a hardware
 * counter (a VM without a PMU: `perf stat -e instructions` says "not
 * supported"), where the CPU time of a few hundred nanoseconds moves by 2x
 * from run to run with the host's load: the count does not move, so a
 * change of a few per cent to a hot path shows in one run.
 *
 * What counts: every instruction the thread retires in user mode, the
 * `syscall` instruction included (what the kernel does is not counted, nor
 * what other threads do). A `rep`-prefixed string instruction counts once
 * per iteration, as the trap flag stops it after each. Slow: about 10^5 to
 * 10^6 instructions a second, so count a few hundred calls, not millions.
 * A thread that waits for another by spinning on the clock spins fewer times
 * while stepped; a region that waits that way is not deterministic.
 *
 * Not thread-safe: one counted region at a time per process. Plain C and
 * ptrace: it shares no code with shmrpc.
 */
#ifndef SR_BENCH_ICOUNT_H
#define SR_BENCH_ICOUNT_H

#include <stdint.h>
#include <sys/types.h>

typedef struct bench_icount {
    pid_t tracer;                 /* the stepping child */
    struct bench_icount_area *sh; /* shared with it */
} bench_icount;

/* Fork the tracer and return once it steps this thread. 0, or -errno
 * (ptrace refused: -EPERM; the tracer did not attach within 10 s:
 * -ETIMEDOUT) with nothing left running. */
int bench_icount_begin(bench_icount *ic);

/* Stop counting, reap the tracer, and return the instructions since a
 * fixed point near the end of bench_icount_begin (the pair's own exit and
 * entry add a few dozen, always the same: count a region of many calls),
 * or -errno. */
int64_t bench_icount_end(bench_icount *ic);

#endif
