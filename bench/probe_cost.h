/* SPDX-License-Identifier: MIT */
/* bench_rpc probes: the profiler's cost on the hot round trip (probe_cost.c). */
#ifndef SR_BENCH_PROBE_COST_H
#define SR_BENCH_PROBE_COST_H

#include <stdbool.h>

/* Parent: rounds of `self probe-one` and `bench_rpc_noprobe probe-one`, report. */
int bench_probe_cost(const char *self);
/* Parent, before bench_probe_cost: one round of few calls, each child run
 * with `probe-one --smoke` (bench_rpc --smoke). */
void bench_probe_smoke(void);
/* Child: one measurement, printed as "off stats trace" p50s in ns; smoke:
 * few calls. */
int bench_probe_one(bool smoke);

#endif
