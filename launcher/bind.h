/* SPDX-License-Identifier: MIT */
/* CPU binding of the workers (--bind-to, --report-bindings), like mpirun's.
 *
 * The units are cores (the allowed hardware threads of one core, from
 * sysfs topology/core_cpus_list) or NUMA nodes (the allowed CPUs of
 * /sys/devices/system/node/nodeN/cpulist), in NUMA-node order, then by
 * their first CPU. Only CPUs in shmrun's own affinity mask count (it already
 * reflects a cgroup cpuset and any taskset around shmrun); a unit with none
 * is skipped. Rank r gets unit r % units: with more ranks than units the
 * binding wraps round robin, and bind_plan_make says so (a warning of the log). The
 * worker pins itself with sched_setaffinity before exec, so every thread it
 * starts inherits the mask.
 *
 * SHMRUN_SYSFS (default /sys) replaces the sysfs root, for tests.
 * Lifetime: bind_plan_make .. bind_plan_free; bind_apply is async-signal-safe
 * (it runs in the forked child).
 */
#ifndef SR_LAUNCHER_BIND_H
#define SR_LAUNCHER_BIND_H

#include <sched.h>
#include <stdbool.h>
#include <sys/types.h>

#include "args.h"

struct bind_unit {
    cpu_set_t cpus; /* allowed CPUs of the unit */
    int node;       /* its NUMA node (-1: sysfs has none) */
};

struct bind_plan {
    enum bind_kind kind;
    int n;                  /* units */
    struct bind_unit *unit; /* [n]; for BIND_NONE one unit: the allowed set */
};

/* 0, or -errno with sr_last_error() set (no allowed CPU, unreadable sysfs). */
int bind_plan_make(struct bind_plan *p, enum bind_kind kind, int ranks);
void bind_plan_free(struct bind_plan *p);
/* In the child: pin to rank's unit. 0 or -errno. */
int bind_apply(const struct bind_plan *p, int rank);
/* One line on stderr: "shmrun: rank 0 (pid 4709) bound to core 0 of 2: cpus 0,1 (NUMA node 0)". */
void bind_report(const struct bind_plan *p, int rank, pid_t pid);

#endif
