/* SPDX-License-Identifier: MIT */
/* The profiler: what the job layers (lib/job's sr_spawn, the shmrun
 * launcher) may use (internal). Everything else of lib/modules/trace is
 * private to it.
 *
 * One job attempt, with SHMRPC_TRACE or SHMRPC_STATS set in the launcher's
 * environment (docs/PROFILING.md, "Jobs that end badly"):
 *
 *   sr__trace_job_begin   before the first fork: checks the trace path, makes
 *                         the workers' record areas (one memfd; with room
 *                         for a rank's later generations when the attempt
 *                         replaces ranks in place: each has an area of its
 *                         own, and its own process in the trace);
 *   sr__trace_job_child   in each worker's process, before exec or run;
 *   sr__trace_job_end     after every worker is reaped, however the attempt
 *                         ended: writes the merged trace and prints the
 *                         statistics the workers could not print.
 *
 * A launcher that restarts a job calls the three again for each attempt,
 * with the attempt's number (0 for the first). */
#ifndef SR_TRACE_SEAM_H
#define SR_TRACE_SEAM_H

#if !defined(SR__SEES_TRACE)
#error "trace_seam.h is the seam of the trace module layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>

struct sr_trace_job;

/* replacements: how many ranks the attempt may replace in place (0: none).
 * *tj = NULL (and 0) when neither variable is set. Errors, with
 * sr_last_error() naming `who` and the path: -errno when the trace file's
 * directory does not take a new file (checked by making and removing one),
 * -EISDIR when the path is a directory; -errno of memfd_create/ftruncate/mmap. */
int sr__trace_job_begin(struct sr_trace_job **tj, int world, int replacements, int attempt, const char *who);
/* In worker rank's child (tj may be NULL), once its environment says its
 * generation (SHMRPC_GENERATION, lib/job): exec: it will exec (the area's
 * fd stays open across it and SHMRPC_TRACE_AREA names it; with no tj, the
 * variable is removed); else the child keeps running this program (the
 * area is handed over in memory). */
void sr__trace_job_child(struct sr_trace_job *tj, int rank, bool exec);
/* The attempt's end (tj may be NULL): write the trace, print the statistics
 * of the workers that did not, free tj. Failures are logged (SR_LOG_ERROR);
 * sr_last_error() is left as it was (it may hold the job's failure). */
void sr__trace_job_end(struct sr_trace_job *tj);

#endif
