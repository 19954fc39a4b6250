/* SPDX-License-Identifier: MIT */
/* Distributed autograd: what a layer above it (the distributed optimizer,
 * lib/train/dist_optim) may use besides the public shmrpc/dist_autograd.h
 * (internal). Everything else of lib/modules/dist_autograd is private to it. */
#ifndef SR_DIST_AUTOGRAD_SEAM_H
#define SR_DIST_AUTOGRAD_SEAM_H

#if !defined(SR__SEES_DIST_AUTOGRAD)
#error "dist_autograd_seam.h is the seam of the dist_autograd module layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdint.h>

#include "shmrpc/dist_autograd.h"
#include "shmrpc/tensor.h"

/* The thread's current context id (SR_NO_CONTEXT: none); set returns the old. */
int64_t sr__dctx_current(void);
int64_t sr__dctx_set_current(int64_t id);
/* An "unknown context" error, with PyTorch's text. */
int sr__dctx_not_found(const char *who, int64_t id);
/* 0 if context id is here and usable: else the "unknown context" error, or
 * -EPIPE naming the worker that died after the context recorded RPCs with
 * it (its gradients can no longer be complete). */
int sr__dctx_check(const char *who, int64_t id);
/* Add grad to the gradient that context id holds for leaf on this worker,
 * as a backward pass reaching leaf here does (the context is made here if
 * this worker has not seen it yet): a layer above may add a gradient term
 * of its own (a regulariser's) before a step. Like the pass's sink, it
 * checks no shape: whoever reads the gradients does (the distributed
 * optimizer). Errors: the "unknown context" error for a context already
 * released here, -ENOMEM. */
int sr__dctx_accumulate_grad(int64_t id, sr_tensor *leaf, sr_tensor *grad);

#endif
