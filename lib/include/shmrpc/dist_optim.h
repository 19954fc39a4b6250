/* SPDX-License-Identifier: MIT */
/* shmrpc: the distributed optimizer (torch.distributed.optim.DistributedOptimizer).
 *
 * A distributed optimizer takes RRefs to parameters (leaf f32/f64 tensors)
 * scattered over the workers and steps each one on its owner with the
 * gradients that a distributed autograd context holds for it.
 *
 * Creation groups the parameter RRefs by owner (owners in order of first
 * appearance, parameters in the order given) and asks every owner at once
 * (one rpc_async each, then a wait for all) to build a local optimizer
 * (optim.h) over the RRefs' local values: the owner's tensors themselves,
 * not copies, so whatever else holds them on the owner (a module) sees the
 * steps. Each owner keeps its optimizer in an RRef it owns; the distributed
 * optimizer holds a UserRRef to each (an OwnerRRef for its own worker).
 *
 * A step checks the context id here, then calls every owner at once through
 * its optimizer RRef. Each owner reads the context's gradient for each of
 * its parameters (none: the parameter and its state stay as they are), then
 * takes the one lock of its worker that every distributed optimizer's step
 * there shares (torch's _LocalOptimizer.global_lock) and steps. The caller
 * waits for every owner before it returns.
 *
 * Lifetime. sr_dist_optim_destroy() drops the optimizer RRefs; an owner's
 * local optimizer (and its references to the parameters and its state) goes
 * when the last reference to its RRef goes. Destroy every distributed
 * optimizer before a graceful sr_shutdown(), or the RRef leak check reports
 * its optimizer RRefs. The parameter RRefs stay the caller's.
 *
 * Threads. Every call may be made from any thread. Steps of one distributed
 * optimizer may run concurrently (different contexts, different threads);
 * destroy must not race with them. On each worker, steps of all distributed
 * optimizers are serialised (so several trainers may each own an optimizer
 * over the same parameters); there is no ordering across workers, and
 * nothing orders a step against a forward pass reading the parameters.
 *
 * Internal functions. Every program that links shmrpc registers, before
 * main(), the functions "sr.dist_optim.new" and "sr.dist_optim.step"; those
 * names are taken (sr_register() says -EEXIST).
 *
 * Errors are -errno / -SR_E* with the detail in sr_last_error():
 *   -EINVAL   a bad argument (NULL, bad kind, a NULL RRef); an unknown context
 *             in step: "Could not find autograd context with id: N"
 *   an owner's failure, after every owner has answered, with the code of the
 *   failed call (-SR_EREMOTE when the owner's function failed, -EPIPE,
 *   -ETIMEDOUT, ...) and, if several failed, the text of the last owner:
 *     "sr_dist_optim_create: Error creating optimizer. Error on Node 1:
 *      sr_optim_create: SGD: Invalid learning rate: -1.0"
 *     "sr_dist_optim_step: Error running optimizer. Error on Node 2:
 *      sr_optim_step_grads: gradient 0 has shape [2] but its parameter has
 *      shape [3, 3]"
 *   The owners that did not fail have stepped (or, in create, their
 *   optimizers are dropped again).
 */
#ifndef SHMRPC_DIST_OPTIM_H
#define SHMRPC_DIST_OPTIM_H

#if defined(SR__BUILDING) && !defined(SR__SEES_TRAIN)
#error "shmrpc/dist_optim.h belongs to the training (train) layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "optim.h"
#include "rref.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sr_dist_optim sr_dist_optim;

/* A distributed optimizer of kind `kind` with options `opts` (NULL: the
 * kind's defaults, as in sr_optim_create; SGD then fails for its missing
 * lr) over params[0..n), into *out. The RRefs are borrowed; each owner
 * keeps forks of them while it builds its optimizer. n == 0 makes an
 * optimizer that owns nothing and whose step does nothing (as torch's).
 * Errors: -EINVAL (out or params NULL, a NULL RRef, a bad kind); an owner's
 * failure ("Error creating optimizer." then the owner's text): an option out
 * of range, a parameter RRef whose value is not an f32/f64 leaf tensor, one
 * listed twice, an RRef whose creating call failed. */
SR_API int sr_dist_optim_create(sr_optim_kind kind, const sr_optim_opts *opts, sr_rref *const *params, size_t n,
                                sr_dist_optim **out);

/* One step on every owner with the gradients of distributed autograd
 * context `context_id` (which must exist on this worker, and on each owner
 * that holds a parameter). Returns when every owner has answered. */
SR_API int sr_dist_optim_step(sr_dist_optim *o, int64_t context_id);

/* Drops the optimizer RRefs; NULL is ignored. */
SR_API void sr_dist_optim_destroy(sr_dist_optim *o);

/* ---- checkpoints: the local optimizers on their owner ----
 * A checkpoint of a parameter server needs a consistent cut of the
 * parameters and of the local optimizers' state: no step may run while it is
 * read. */

/* The RRef to the local optimizer that o keeps on worker `owner` (borrowed,
 * valid until sr_dist_optim_destroy(o)), or NULL if o holds no parameter
 * there. Pass it to the owner (as an RPC argument) so that the owner can reach
 * that optimizer with sr_dist_optim_with_locals(). */
SR_API sr_rref *sr_dist_optim_local_rref(const sr_dist_optim *o, int owner);

/* On the owner: run fn(optims, n, arg) with the n local optimizers behind
 * the optimizer RRefs rrefs[0..n) (OwnerRRefs on this worker, as
 * sr_dist_optim_local_rref() handed them out and an RPC brought them here),
 * while holding this worker's step lock: no distributed-optimizer step runs
 * here until fn returns, so fn may read or write the parameters and use
 * sr_optim_state_export/_import. fn must not step a distributed optimizer.
 * Returns fn's result, or -EINVAL (an RRef that is NULL, not owned here, or
 * not a local optimizer's) before fn runs. */
SR_API int sr_dist_optim_with_locals(sr_rref *const *rrefs, size_t n,
                                     int (*fn)(sr_optim *const *optims, size_t n, void *arg), void *arg);

#ifdef __cplusplus
}
#endif
#endif
