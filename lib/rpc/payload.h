/* SPDX-License-Identifier: MIT */
/* Message payloads (internal): inline in the slot, or in a shared-heap block. */
#ifndef SR_RPC_PAYLOAD_H
#define SR_RPC_PAYLOAD_H

#if !defined(SR__IN_RPC)
#error "payload.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
#include <stddef.h>
#include <stdint.h>

#include "heap.h"
#include "wire.h"

/* Reserve len payload bytes for an outgoing message: inline when they fit,
 * else a new block of our heap. Returns where to write, or NULL (-ENOMEM /
 * -EMSGSIZE in sr_last_error). */
uint8_t *sr__payload_reserve(sr_msg *m, struct sr_wire *w, size_t len);
/* Undo a reservation whose message was never sent. */
void sr__payload_abandon(const struct sr_wire *w);

/* The payload of an incoming message, validated; NULL with -EBADMSG. The
 * caller calls sr__payload_done once it has decoded it. */
const uint8_t *sr__payload_get(const sr_msg *m, size_t *len);
void sr__payload_done(const sr_msg *m);

#endif
