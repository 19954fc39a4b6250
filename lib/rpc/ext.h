/* SPDX-License-Identifier: MIT */
/* The envelope's extension block (internal; layout in wire.h).
 *
 * Outgoing: the sending side's module hooks write their bytes into an
 * sr_ext_buf, which is then copied to the front of the payload. Incoming:
 * sr__ext_parse checks the block against the payload's length (the data is
 * a peer's, read from shared memory) before any byte of it is used.
 */
#ifndef SR_RPC_EXT_H
#define SR_RPC_EXT_H

#if !defined(SR__IN_RPC)
#error "ext.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
#include <stddef.h>
#include <stdint.h>

#include "module.h"

struct sr_ext_buf {
    size_t len; /* bytes used in b; 0: no extension */
    uint8_t b[1 + SR_MODULE_MAX * (2 + SR_EXT_MAX)];
};

struct sr_ext_view {
    const uint8_t *data[SR_MODULE_MAX];
    uint8_t len[SR_MODULE_MAX];
    uint8_t mask; /* modules present */
};

/* Callers' hooks for one outgoing request; module `own` (-1: none) brings
 * its own bytes instead (a module starting the call itself). */
void sr__ext_request_out(const struct sr_call_out *o, int own, const uint8_t *bytes, size_t len,
                         struct sr_ext_buf *e);
/* Callees' hooks for one outgoing result: those of the modules in mods
 * (the call's, see sr__call_state). */
void sr__ext_response_out(sr_call *c, unsigned mods, sr_value *v, struct sr_ext_buf *e);
/* Parse the block at the front of a payload of len bytes: 0 with *used set,
 * or -EBADMSG with the reason (naming the sender) in sr_last_error(). */
int sr__ext_parse(const uint8_t *p, size_t len, int from, struct sr_ext_view *v, size_t *used);
/* Hand a received result's extensions to the callers' hooks. */
void sr__ext_response_in(int from, const struct sr_ext_view *v, sr_value *result);

#endif
