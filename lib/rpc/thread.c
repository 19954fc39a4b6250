/* SPDX-License-Identifier: MIT */
/* The RPC layer's per-thread state (thread.h). */
#include "thread.h"

#include <stddef.h>

_Thread_local struct sr_rpc_thread sr__thr = {.answer_to = -1};
