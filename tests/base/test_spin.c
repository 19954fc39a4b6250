/* SPDX-License-Identifier: MIT */
/* The yield gate (shm/base/spin.h): when a waiter with no spin budget may
 * poll by yielding its core. Fed the times a yield took, as a waiter's
 * clock would give them: no clock, no threads. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "common.h"
#include "spin.h"

LEAK_CHECKED_SUITE(spin);

#define QUICK 3000                      /* a yield to one of our own threads: microseconds */
#define SLOW (SR_YIELD_SLOW_NS + 1)     /* another job's thread ran a slice */
#define T0 1000000000000ll              /* any time */

Test(spin, a_new_gate_is_open_and_quick_yields_keep_it_open)
{
    struct sr_yield_gate g = {0};
    int64_t now = T0;
    for (int i = 0; i < 1000; i++, now += QUICK) {
        cr_assert(sr__yield_gate_open(&g, now), "yield %d: the gate closed with only quick yields", i);
        cr_assert(sr__yield_gate_note(&g, QUICK, now), "a yield of %d ns was taken for a slow one", QUICK);
    }
    cr_assert(sr__yield_gate_note(&g, SR_YIELD_SLOW_NS, now), "a yield of exactly SR_YIELD_SLOW_NS is not slow");
}

Test(spin, a_slow_yield_closes_the_gate_for_the_first_back_off)
{
    struct sr_yield_gate g = {0};
    cr_assert(!sr__yield_gate_note(&g, SLOW, T0), "a yield of %lld ns was not taken for a slow one", (long long)SLOW);
    cr_assert(!sr__yield_gate_open(&g, T0), "the gate is open right after a slow yield");
    cr_assert(!sr__yield_gate_open(&g, T0 + SR_YIELD_BACKOFF_MIN_NS - 1), "the gate opened before its back-off ended");
    cr_assert(sr__yield_gate_open(&g, T0 + SR_YIELD_BACKOFF_MIN_NS), "the gate stayed closed past its back-off");
}

Test(spin, slow_yields_in_a_row_double_the_back_off_up_to_its_cap)
{
    struct sr_yield_gate g = {0};
    int64_t now = T0, want = SR_YIELD_BACKOFF_MIN_NS;
    for (int i = 0; i < 20; i++) {
        sr__yield_gate_note(&g, SLOW, now);
        cr_assert_eq(g.closed_until - now, want, "slow yield %d: closed for %lld ns, expected %lld", i,
                     (long long)(g.closed_until - now), (long long)want);
        now = g.closed_until; /* the next poll: at once when the gate opens */
        want = want * 2 > SR_YIELD_BACKOFF_MAX_NS ? SR_YIELD_BACKOFF_MAX_NS : want * 2;
    }
    cr_assert_eq(g.backoff, SR_YIELD_BACKOFF_MAX_NS, "the back-off passed its cap");
}

Test(spin, a_quick_poll_starts_the_back_off_over)
{
    struct sr_yield_gate g = {0};
    for (int i = 0; i < 5; i++)
        sr__yield_gate_note(&g, SLOW, T0);
    cr_assert_gt(g.backoff, SR_YIELD_BACKOFF_MIN_NS, "five slow yields left the first back-off");
    sr__yield_gate_quick(&g);
    int64_t now = g.closed_until;
    sr__yield_gate_note(&g, SLOW, now);
    cr_assert_eq(g.closed_until - now, SR_YIELD_BACKOFF_MIN_NS,
                 "after a quick poll a slow yield closed the gate for %lld ns, not the first back-off",
                 (long long)(g.closed_until - now));
}
