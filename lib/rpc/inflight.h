/* SPDX-License-Identifier: MIT */
/* Objects in flight: owner-local values passed by reference inside encoded
 * buffers (self-calls).
 *
 * The encoder records each object value it writes, with the reference it took
 * for the receiver; the decoder accepts a pointer from a buffer only if it is
 * recorded here, so a corrupt buffer can never make it dereference a forged
 * pointer. A record is claimed exactly once (decode or release), which hands
 * its reference to the claimer. Process-local; safe across threads.
 */
#ifndef SR_RPC_INFLIGHT_H
#define SR_RPC_INFLIGHT_H

#if !defined(SR__IN_RPC)
#error "inflight.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shmrpc/value.h"

/* Record one more in-flight reference to v (the caller has taken it).
 * 0 or -ENOMEM. */
int sr__inflight_add(sr_value *v);
/* Is addr an object of this type name (tlen bytes) with an unclaimed in-flight
 * reference? addr is only compared, never dereferenced, unless it is recorded. */
bool sr__inflight_has(uint64_t addr, const char *type, size_t tlen);
/* Claim one in-flight reference to the object at addr: the object, whose
 * reference now belongs to the caller, or NULL if none is recorded. */
sr_value *sr__inflight_claim(uint64_t addr);

/* Unclaimed in-flight references to v (diagnostics and tests). */
uint32_t sr__inflight_count(const sr_value *v);

#endif
