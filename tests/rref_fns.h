/* SPDX-License-Identifier: MIT */
/* Functions and helpers shared by the RRef suites (test_rref*.c) and the
 * distributed autograd ones (dist_autograd_fns.h), defined in rref_fns.c:
 * the remote functions every worker registers (register_rref_fns), a barrier
 * over RPC, and checks of an owner's fork set at the protocol's stable
 * points. */
#ifndef SR_TESTS_RREF_FNS_H
#define SR_TESTS_RREF_FNS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "rpc_harness.h"
#include "shmrpc/rref.h"

#define WORLD 4
#define WAIT_S 30.0 /* bound of every wait in these tests */

/* ---- remote functions (register_rref_fns registers them on every worker) ---- */

/* make_list, sleep_ms, fail, rref_info, hold, held_to_here, drop_held,
 * forks_of, counters, forward, remote_of, rref_list, and arrive (the
 * barrier's); call it from a job's register_fns (RREF_JOB does). */
void register_rref_fns(void);

/* ---- RRefs a worker keeps between calls ("hold") ---- */

/* Keep a reference to r; 0, or -1 without memory. */
int held_add(sr_rref *r);
/* Drop every held RRef, in an order shuffled by seed; returns how many. */
size_t held_drop_all(unsigned seed);
/* A new reference to held RRef i, or NULL. */
sr_rref *held_at(size_t i);

/* ---- running a job ---- */

/* The scenario RREF_JOB runs on each worker; set by the test before sr_spawn
 * forks. */
extern scenario_fn rref_scenario;
/* A failing worker leaves at once: the job ends with its report instead of
 * its peers waiting out their barriers and shutdown bounds. */
int fail_fast(int rank, int world);

#define RREF_JOB(name, sc, ...)                                                                  \
    do {                                                                                          \
        rref_scenario = sc;                                                                       \
        RUN_JOB(name, WORLD, .scenario = fail_fast, .register_fns = register_rref_fns, __VA_ARGS__); \
    } while (0)

/* Every worker of the job calls it: returns when all have (arrive on rank 0). */
int barrier(void);
void sleep_ms(int64_t ms);

/* ---- checks ---- */

/* Control messages sent again, summed over every worker; -1 on an error. */
int64_t retries_everywhere(void);
/* The owner's fork set of r is exactly want[0..n). */
int expect_forks(sr_rref *r, const uint64_t *want, size_t n, const char *when);
/* Wait (bounded) until the owner confirmed the user RRef r. */
int wait_confirmed(sr_rref *r);
/* to_here(r) is the list [a, a + 1]. */
int expect_pair(sr_rref *r, int64_t a);
/* Every RRef counter of every worker is zero (call after a barrier that
 * follows each worker's sr_rref_wait_idle). */
int expect_all_counters_zero(const char *when);

#endif
