/* SPDX-License-Identifier: MIT */
/* bench_rpc probes: the profiler's cost on the hot round trip (probe_cost.c). */
#ifndef SR_BENCH_PROBE_COST_H
#define SR_BENCH_PROBE_COST_H

/* Parent: rounds of `self probe-one` and `bench_rpc_noprobe probe-one`, report. */
int bench_probe_cost(const char *self);
/* Child: one measurement, printed as "off stats trace" p50s in ns. */
int bench_probe_one(void);

#endif
