/* SPDX-License-Identifier: MIT */
/* Worker output: --tag-output, --output-dir and the folding of identical
 * stderr lines.
 *
 * Without either flag shmrun does nothing here: workers inherit its stdout
 * and stderr, and no byte passes through the launcher.
 *
 * --output-dir DIR alone: each rank's stdout and stderr are files,
 * DIR/RANK/stdout.log and DIR/RANK/stderr.log (torchrun's per-rank layout,
 * without its run and attempt levels: shmrun never restarts), opened
 * (truncated) by shmrun and inherited by the worker: still no relay.
 *
 * --tag-output: each rank's stdout and stderr are pipes to shmrun, which
 * reads them on its supervisor loop, cuts them into lines and writes each
 * line whole, prefixed "[RANK] " (or "[NAME] ", the name the worker
 * published at attach; its rank until then), to its own stdout or stderr.
 * Lines from different ranks never mix. A line longer than 64 KiB is cut;
 * a last line without a newline gets one. With --output-dir as well, the
 * lines also go, untagged, to the rank's files.
 *
 * Folding (--tag-output with --fold-window > 0): a stderr line waits up to
 * the window for the same text from other ranks and is printed once, as
 * "[0-3,5] text". It goes out early once every rank whose stderr is still
 * open has sent it, and at the latest when the job ends. Each rank's lines
 * keep their order (a line joins a waiting copy only if that copy comes
 * after the rank's previous line); lines leave in arrival order, so one
 * waiting line holds back the stderr lines after it, for at most the window.
 *
 * Lifetime: out_create (before the first fork) .. out_destroy (after the
 * supervisor returned). Single-threaded: the hooks run on the supervisor.
 */
#ifndef SR_LAUNCHER_OUTPUT_H
#define SR_LAUNCHER_OUTPUT_H

#include "args.h"
#include "job.h"

struct out;

/* *o = NULL when workers inherit shmrun's output. 0, or -errno with
 * sr_last_error() naming the file or the rank. */
int out_create(struct out **o, const struct args *a, sr_job *job);
/* In rank's child, before exec: its stdout and stderr. 0 or -errno. */
int out_child(const struct out *o, int rank);
/* In the parent once rank is forked: drop the worker's ends. */
void out_forked(struct out *o, int rank);
/* The supervisor hooks that relay the pipes (input fds, fold deadline, the
 * final flush); leaves h alone when nothing is piped. */
void out_hooks(struct out *o, sr_job_hooks *h);
void out_destroy(struct out *o);

#endif
