/* SPDX-License-Identifier: MIT */
/* The distributed optimizer's two sides (internal): the caller's object
 * (dist_optim.c) and the owner's functions (local.c), which every program
 * registers before main(). */
#ifndef SR_DIST_OPTIM_IMPL_H
#define SR_DIST_OPTIM_IMPL_H

#if !defined(SR__IN_TRAIN)
#error "dist_optim_impl.h is private to the training (train) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdint.h>

#include "shmrpc/dist_optim.h"

/* The owner's functions:
 *   new(kind, opts bytes | None, [param RRefs...]) -> RRef(local optimizer)
 *   step(local optimizer, context id) -> None   (an RRef proxy call) */
#define SR_DIST_OPTIM_NEW "sr.dist_optim.new"
#define SR_DIST_OPTIM_STEP "sr.dist_optim.step"
/* The type name of the object an owner keeps in its optimizer RRef. */
#define SR_DIST_OPTIM_TYPE "shmrpc.LocalOptimizer"

/* This worker's counters, for tests: steps run under the worker's lock, the
 * most steps ever seen inside it at once (1 while the lock holds), and the
 * local optimizers alive here. */
struct sr__dist_optim_stats {
    uint64_t steps;
    uint32_t max_inside;
    int64_t live;
};
void sr__dist_optim_stats_get(struct sr__dist_optim_stats *out);

#endif
