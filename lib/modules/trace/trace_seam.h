/* The profiler: what the job layers (lib/job's sr_spawn, the shmrun
 * launcher) may use (internal). Everything else of lib/modules/trace is
 * private to it. */
#ifndef SR_TRACE_SEAM_H
#define SR_TRACE_SEAM_H

#if !defined(SR__SEES_TRACE)
#error "trace_seam.h is the seam of the trace module layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
/* What sr_spawn and shmrun call at the end of a job: merge if SHMRPC_TRACE
 * is set, logging a failure (SR_LOG_ERROR); sr_last_error() is left as it was
 * (it may hold the job's failure). */
void sr__trace_job_end(int world);

#endif
