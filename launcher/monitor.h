/* SPDX-License-Identifier: MIT */
/* shmrun --monitor[=SECONDS]: a live view of a running job, on stderr.
 *
 * Every interval, one line per worker: calls served and made per second
 * (and their totals), messages waiting in its inbox, its calls in flight,
 * its heap in use and its CPU use (% of one core). On a terminal the lines
 * are redrawn in place (ANSI: cursor up, erase line); otherwise each
 * interval's lines are appended after a header line. When the job ends, one
 * last set of lines gives the totals and the averages over the job.
 *
 * Everything is read from the job's segment (segment.h, struct
 * sr_worker_counters: counters the workers keep anyway, relaxed loads;
 * the inbox rings' positions) and from /proc/PID/stat, by the supervisor
 * between its waits (a next_due/on_due timer that exists only with
 * --monitor): the workers do nothing for it but sample their heap's bytes
 * at most once per interval (SHMRPC_MONITOR_INTERVAL, set in their
 * environment).
 *
 * Lifetime: mon_create (after the segment, before the first fork) ..
 * mon_destroy. Single-threaded: its hooks run on the supervisor. */
#ifndef SR_LAUNCHER_MONITOR_H
#define SR_LAUNCHER_MONITOR_H

#include "args.h"
#include "job.h"

struct monitor;

/* *m = NULL without --monitor. 0 or -ENOMEM. */
int mon_create(struct monitor **m, const struct args *a, sr_job *job);
/* In a worker's child, before exec: SHMRPC_MONITOR_INTERVAL. */
void mon_child(const struct monitor *m);
/* Add the monitor's timer and final lines to h, chaining what h already
 * holds (the output relay's hooks); leaves h alone without a monitor. */
void mon_hooks(struct monitor *m, sr_job_hooks *h);
void mon_destroy(struct monitor *m);

#endif
