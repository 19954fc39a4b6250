/* SPDX-License-Identifier: MIT */
/* shmrpc: PyTorch-style distributed RPC between the processes of one host,
 * over shared memory. This umbrella header includes every public header. */
#ifndef SHMRPC_H
#define SHMRPC_H

#if defined(SR__BUILDING) && !defined(SR__SEES_JOB)
#error "shmrpc/shmrpc.h belongs to the job layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include "checkpoint.h"
#include "error.h"
#include "future.h"
#include "log.h"
#include "rpc.h"
#include "rref.h"
#include "value.h"
#include "version.h"
#include "spawn.h"
#include "stats.h"
#include "tensor.h"
#include "autograd_function.h"
#include "dist_autograd.h"
#include "optim.h"
#include "dist_optim.h"
#include "nn.h"
#include "data.h"

#endif
