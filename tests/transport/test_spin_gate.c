/* SPDX-License-Identifier: MIT */
/* The spin policy's decision (sr__spin_gate_next, lib/transport/shm/xport.h)
 * fed sequences of runnable-thread counts, as /proc/loadavg would give them:
 * no clock, no threads. On 2 CPUs a count of 3 says oversubscribed. */
#include <criterion/criterion.h>
#include <limits.h>

#include "common.h"
#include "shm/xport.h"

LEAK_CHECKED_SUITE(spin_gate);

#define NCPU 2
#define QUIET 2 /* the sampling thread and the peer it waits for */
#define BUSY 3

/* Feeds counts[0..n) to a gate that starts as g; returns the last gate. */
static uint32_t feed(uint32_t g, const int *counts, int n)
{
    for (int i = 0; i < n; i++)
        g = sr__spin_gate_next(g, counts[i], NCPU);
    return g;
}

static bool over(uint32_t g) { return sr__spin_gate_oversubscribed(g); }

Test(spin_gate, the_first_sample_decides_at_once)
{
    cr_assert(!over(0), "before any sample the gate must allow spinning");
    cr_assert(over(sr__spin_gate_next(0, BUSY, NCPU)), "a first sample of %d runnable on %d CPUs must stop spinning", BUSY, NCPU);
    cr_assert(!over(sr__spin_gate_next(0, QUIET, NCPU)), "a first sample of %d runnable on %d CPUs must allow spinning", QUIET, NCPU);
}

Test(spin_gate, as_many_runnable_threads_as_cpus_is_not_oversubscribed)
{
    cr_assert(!over(sr__spin_gate_next(0, NCPU, NCPU)), "runnable == ncpu must allow spinning");
    cr_assert(over(sr__spin_gate_next(0, NCPU + 1, NCPU)), "runnable == ncpu + 1 must stop spinning");
    cr_assert(over(sr__spin_gate_next(0, INT_MAX, NCPU)), "an unreadable count (INT_MAX) must stop spinning");
}

/* The regression: one transient runnable thread (a kernel worker, one of
 * ours woken for a job) turned spinning off for a whole sample period. */
Test(spin_gate, one_busy_sample_between_quiet_ones_leaves_spinning_on)
{
    static const int counts[] = {QUIET, BUSY, QUIET, BUSY, QUIET, QUIET, BUSY};
    uint32_t g = 0;
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
        g = sr__spin_gate_next(g, counts[i], NCPU);
        cr_assert(!over(g), "sample %zu (%d runnable on %d CPUs, after quiet ones) stopped spinning", i, counts[i], NCPU);
    }
}

/* Fewer than SR_SPIN_GATE_SAMPLES busy samples in a row, however often,
 * leave spinning on. */
Test(spin_gate, busy_samples_short_of_a_full_row_leave_spinning_on)
{
    uint32_t g = sr__spin_gate_next(0, QUIET, NCPU);
    for (int round = 0; round < 100; round++) {
        for (unsigned i = 0; i + 1 < SR_SPIN_GATE_SAMPLES; i++) {
            g = sr__spin_gate_next(g, BUSY, NCPU);
            cr_assert(!over(g), "round %d: %u busy sample(s) in a row stopped spinning (needs %u)", round, i + 1,
                      SR_SPIN_GATE_SAMPLES);
        }
        g = sr__spin_gate_next(g, QUIET, NCPU); /* breaks the row */
        cr_assert(!over(g), "round %d: a quiet sample stopped spinning", round);
    }
}

/* The rule still holds: a machine that stays oversubscribed stops spinning
 * after exactly SR_SPIN_GATE_SAMPLES samples, and stays stopped. */
Test(spin_gate, a_full_row_of_busy_samples_stops_spinning_and_it_stays_stopped)
{
    uint32_t g = sr__spin_gate_next(0, QUIET, NCPU);
    for (unsigned i = 1; i <= SR_SPIN_GATE_SAMPLES; i++) {
        g = sr__spin_gate_next(g, BUSY + (int)i, NCPU);
        cr_assert_eq(over(g), i == SR_SPIN_GATE_SAMPLES, "after %u busy sample(s) in a row: oversubscribed %d", i,
                     over(g));
    }
    for (int i = 0; i < 1000; i++) {
        g = sr__spin_gate_next(g, BUSY, NCPU);
        cr_assert(over(g), "busy sample %d after the switch allowed spinning again", i);
    }
}

/* The same the other way: a quiet moment on a busy machine does not turn
 * spinning back on, a full row of quiet samples does. */
Test(spin_gate, spinning_resumes_only_after_a_full_row_of_quiet_samples)
{
    static const int busy_dips[] = {BUSY, QUIET, BUSY, QUIET, QUIET, BUSY, 1, BUSY};
    uint32_t g = feed(sr__spin_gate_next(0, BUSY, NCPU), busy_dips, (int)(sizeof(busy_dips) / sizeof(busy_dips[0])));
    cr_assert(over(g), "quiet dips shorter than %u samples turned spinning back on", SR_SPIN_GATE_SAMPLES);
    for (unsigned i = 1; i <= SR_SPIN_GATE_SAMPLES; i++) {
        g = sr__spin_gate_next(g, QUIET, NCPU);
        cr_assert_eq(over(g), i < SR_SPIN_GATE_SAMPLES, "after %u quiet sample(s) in a row: oversubscribed %d", i,
                     over(g));
    }
}

/* A row is counted from the last sample that agreed with the state: two
 * short rows do not add up to a full one. */
Test(spin_gate, an_agreeing_sample_restarts_the_row)
{
    uint32_t g = sr__spin_gate_next(0, QUIET, NCPU);
    for (unsigned i = 0; i + 1 < SR_SPIN_GATE_SAMPLES; i++)
        g = sr__spin_gate_next(g, BUSY, NCPU);
    g = sr__spin_gate_next(g, QUIET, NCPU);
    for (unsigned i = 0; i + 1 < SR_SPIN_GATE_SAMPLES; i++)
        g = sr__spin_gate_next(g, BUSY, NCPU);
    cr_assert(!over(g), "two rows of %u busy samples split by a quiet one stopped spinning", SR_SPIN_GATE_SAMPLES - 1);
    g = sr__spin_gate_next(g, BUSY, NCPU);
    cr_assert(over(g), "the row's last busy sample did not stop spinning");
}

/* The adaptive budget (sr__spin_adapt_next) fed sleep lengths, in us. */
#define US 1000ll
#define MAX (50 * US)

LEAK_CHECKED_SUITE(spin_adapt);

Test(spin_adapt, a_sleep_longer_than_a_wake_up_but_within_the_cap_raises_the_budget_from_zero)
{
    /* a 30 us sleep: a 20 us wake-up and a 10 us gap, which a 50 us spin
     * would have caught; the old rule (max / 2) halved 0 to 0 for ever */
    int64_t spin = 0;
    for (int i = 0; i < 3; i++)
        spin = sr__spin_adapt_next(spin, 30 * US, MAX);
    cr_assert_eq(spin, MAX, "after 30 us sleeps the budget must reach the cap (%lld ns), got %lld ns", MAX,
                 (long long)spin);
}

Test(spin_adapt, a_short_sleep_raises_to_twice_it_and_a_long_one_halves)
{
    cr_assert_eq(sr__spin_adapt_next(0, 5 * US, MAX), 10 * US, "a 5 us sleep must allow a 10 us spin");
    cr_assert_eq(sr__spin_adapt_next(40 * US, 5 * US, MAX), 40 * US, "a short sleep must not lower the budget");
    cr_assert_eq(sr__spin_adapt_next(40 * US, 200 * US, MAX), 20 * US, "a sleep past the cap must halve the budget");
    int64_t spin = MAX;
    for (int i = 0; i < 20; i++)
        spin = sr__spin_adapt_next(spin, 1000 * US, MAX);
    cr_assert_eq(spin, 0, "long sleeps in a row must bring the budget to 0, got %lld ns", (long long)spin);
}
