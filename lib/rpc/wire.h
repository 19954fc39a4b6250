/* RPC messages on the inbox rings (internal).
 *
 * Every RPC message is one ring slot: sr_msg.type says what it is, and its 56
 * data bytes hold struct sr_wire. A payload of up to SR_WIRE_INLINE bytes
 * travels inline; a larger one is written into a block of the sender's
 * shared heap and only the block's offset travels (the receiver drops the
 * block reference when it has decoded it; the sender's arena gets it back
 * through the remote-free list).
 *
 *   REQ          call_id, payload = function name (name_len bytes) + encoded args
 *   RESP         call_id, payload = encoded result (a list of one value)
 *   ERR          call_id, code = -errno, payload = message text
 *   CTRL         ctrl = subtype, a = b = arguments (barrier, quiescence waves)
 * RRefs (lib/rref, protocol in docs/RREF.md):
 *   REMOTE_CALL  as REQ; rref_id = the new RRef, whose creator's fork id is
 *                rref_id + 1 (remote() takes both from one counter); the
 *                result stays on the callee, in its OwnerRRef
 *   REMOTE_RET   call_id: the OwnerRRef exists and has its value (which may
 *                be an error); with SR_WIRE_VALUE, a copy of that value (a
 *                list of one) when it is small plain data (no tensor,
 *                object or RRef)
 *   RREF_FETCH   call_id, rref_id, no payload; answered by RESP or ERR
 *   RREF         ctrl = enum sr_rref_ctrl, call_id = the sender's retry token
 *                (echoed by RREF_ACK), args = {rref_id, fork_id, extra}
 * Modules (module.h):
 *   MOD_REQ      call_id, ctrl = module id, name_len = the module's sub-kind,
 *                tag = the module's word, payload = encoded args; answered
 *                by RESP or ERR
 *   >= 16        raw module messages (SR_MSG_MODULE_BASE), the module's own
 * The envelope (SR_WIRE_EXT, on REQ, REMOTE_CALL, MOD_REQ, RESP, REMOTE_RET,
 * RREF_FETCH): the payload starts with an extension block, before the
 * function name: u8 count, then count records {u8 module, u8 len, len bytes}
 * (len <= SR_EXT_MAX, modules distinct); ext.h parses it.
 * Flags: SR_WIRE_PROXY (REQ, REMOTE_CALL): argument 0 is an RRef owned by
 * the callee, and its local value replaces it before the function runs.
 * SR_WIRE_CONFIRMED (RREF_FETCH): the sender's UserRRef is confirmed, so a
 * missing OwnerRRef has been deleted rather than not yet created.
 * SR_WIRE_VALUE (REMOTE_RET): the payload is the value.
 */
#ifndef SR_RPC_WIRE_H
#define SR_RPC_WIRE_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ring.h"

enum sr_rpc_msg {
    SR_MSG_REQ = 1,
    SR_MSG_RESP = 2,
    SR_MSG_ERR = 3,
    SR_MSG_CTRL = 4,
    SR_MSG_REMOTE_CALL = 5,
    SR_MSG_REMOTE_RET = 6,
    SR_MSG_RREF_FETCH = 7,
    SR_MSG_RREF = 8,
    SR_MSG_MOD_REQ = 9,
};

/* RRef control messages: idempotent, retried until acknowledged. */
enum sr_rref_ctrl {
    SR_RREF_FORK_REQUEST = 1, /* user -> owner: register fork_id (args: rref_id, fork_id) */
    SR_RREF_CHILD_ACCEPT = 2, /* child -> parent: the owner knows fork_id; release the parent */
    SR_RREF_USER_DELETE = 3,  /* user -> owner: fork_id is gone (extra: adds_sent << 1 | confirmed) */
    SR_RREF_ACK = 4,          /* answer to any of the above: call_id = the token */
};

enum sr_ctrl {
    SR_CTRL_BARRIER = 1,      /* worker -> leader: arrived (a = epoch) */
    SR_CTRL_RELEASE = 2,      /* leader -> all: barrier complete (a = epoch) */
    SR_CTRL_COUNT_REQ = 3,    /* leader -> all: report counters (a = wave) */
    SR_CTRL_COUNT_RESP = 4,   /* worker -> leader: a = wave, b = sent, c = done */
    SR_CTRL_QUIESCENT = 5,    /* leader -> all: no user message in flight anywhere */
    SR_CTRL_NAME = 6,         /* worker -> all: my name is in my worker-table entry */
};

#define SR_WIRE_INLINE 32
#define SR_WIRE_BLOCK 0x1u
#define SR_WIRE_PROXY 0x2u
#define SR_WIRE_CONFIRMED 0x4u
#define SR_WIRE_VALUE 0x8u
#define SR_WIRE_EXT 0x10u

struct sr_wire {
    uint64_t call_id;
    uint32_t len;       /* payload bytes */
    uint16_t name_len;  /* REQ: bytes of function name at the start of the payload */
    uint8_t flags;      /* SR_WIRE_BLOCK: the payload is in the heap block at p.block_off; see above */
    uint8_t ctrl;       /* CTRL: enum sr_ctrl; RREF: enum sr_rref_ctrl */
    union {
        struct {
            int32_t code;   /* ERR: -errno */
            uint32_t pad;
        };
        uint64_t rref_id;   /* REMOTE_CALL, RREF_FETCH */
        uint64_t tag;       /* MOD_REQ: the module's word */
    };
    union {
        uint8_t inl[SR_WIRE_INLINE];
        uint64_t block_off;
        struct { uint64_t a, b, c; } args; /* CTRL */
    } p;
};
static_assert(sizeof(struct sr_wire) <= SR_MSG_DATA, "an RPC header fits one slot");
static_assert(offsetof(struct sr_wire, p) == 24, "the inline payload starts after a 24-byte header");

/* sr_msg.data is only 4-byte aligned, so the header is copied, never cast. */
#define SR_WIRE_HDR offsetof(struct sr_wire, p)

static inline struct sr_wire sr_wire_get(const sr_msg *m)
{
    struct sr_wire w;
    memcpy(&w, m->data, sizeof(w));
    return w;
}

/* Write the header; the payload union is written only for block and control
 * messages (an inline payload is already in place). */
static inline void sr_wire_put(sr_msg *m, const struct sr_wire *w, bool with_union)
{
    memcpy(m->data, w, with_union || (w->flags & SR_WIRE_BLOCK) ? sizeof(*w) : SR_WIRE_HDR);
}

static inline uint8_t *sr_wire_inline(sr_msg *m) { return m->data + SR_WIRE_HDR; }
static inline const uint8_t *sr_wire_inline_c(const sr_msg *m) { return m->data + SR_WIRE_HDR; }

#endif
