/* SPDX-License-Identifier: MIT */
/* The RPC layer's marshal table (transport.h, "Framing"; marshal.c). */
#ifndef SR_RPC_MARSHAL_H
#define SR_RPC_MARSHAL_H

#if !defined(SR__IN_RPC)
#error "marshal.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
#include "transport.h"
#include "tsan.h"

extern const struct sr_tport_marshal sr__rpc_marshal;

/* ThreadSanitizer (shm/base/tsan.h): m is about to leave this thread for another
 * process; the blocks it names (its payload, its tensors) are released, and
 * whoever receives or frees them in this process later acquires them in
 * sr__block_from_off or the drain of remote frees. Nothing outside a TSan
 * build. */
#ifdef SR_TSAN
void sr__marshal_handoff(const sr_msg *m);
#else
static inline void sr__marshal_handoff(const sr_msg *m) { (void)m; }
#endif

#endif
