/* SPDX-License-Identifier: MIT */
/* shmrun --join: a new worker for a running elastic job (join.c). */
#ifndef SR_LAUNCHER_JOIN_H
#define SR_LAUNCHER_JOIN_H

#include "args.h"

/* Join job a->join with a->argv (the lowest free rank, or a->join_rank)
 * and wait for that worker's end: its exit code, or 1 (no such job, a
 * refusal: one line on stderr), or 2 (a request too long). */
int join_job(const struct args *a);

#endif
