/* SPDX-License-Identifier: MIT */
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
 *   ERR          call_id, code = -errno, cause = the failed function's own
 *                -errno when code is -SR_EREMOTE (0: none), payload = text
 *   CTRL         ctrl = subtype, a = b = arguments (barrier, quiescence waves)
 *   KEEP_CALL    as REQ, but the result stays on the callee: ctrl = the
 *                module that keeps it, tag = the module's word (module.h,
 *                keep hooks; RRefs use it for remote())
 *   KEEP_RET     call_id: the kept result is set (it may be an error); with
 *                SR_WIRE_VALUE, a copy of it (a list of one) when it is small
 *                plain data (no tensor, object or module value)
 *   MOD_REQ      call_id, ctrl = module id, name_len = the module's sub-kind,
 *                tag = the module's word, payload = encoded args; answered
 *                by RESP or ERR
 *   >= 16        raw module messages (SR_MSG_MODULE_BASE), the module's own
 * The envelope (SR_WIRE_EXT, on REQ, KEEP_CALL, MOD_REQ, RESP, KEEP_RET):
 * the payload starts with an extension block, before the function name: u8
 * count, then count records {u8 module, u8 len, len bytes} (len <=
 * SR_EXT_MAX, modules distinct); ext.h parses it.
 * Flags: SR_WIRE_BLOCK (the payload is in a heap block), SR_WIRE_VALUE
 * (KEEP_RET carries the value), SR_WIRE_EXT (the envelope is present).
 */
#ifndef SR_RPC_WIRE_H
#define SR_RPC_WIRE_H

#if !defined(SR__IN_RPC)
#error "wire.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
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
    SR_MSG_KEEP_CALL = 5,
    SR_MSG_KEEP_RET = 6,
    SR_MSG_MOD_REQ = 9,
};

enum sr_ctrl {
    SR_CTRL_BARRIER = 1,      /* worker -> leader: arrived (a = epoch) */
    SR_CTRL_RELEASE = 2,      /* leader -> all: barrier complete (a = epoch) */
    SR_CTRL_COUNT_REQ = 3,    /* leader -> all: report counters (a = wave) */
    SR_CTRL_COUNT_RESP = 4,   /* worker -> leader: a = wave, b = sent, c = done */
    SR_CTRL_QUIESCENT = 5,    /* leader -> all: no user message in flight anywhere */
    SR_CTRL_NAME = 6,         /* worker -> all: my name is in my worker-table entry */
    SR_CTRL_LEAVE_REQ = 7,    /* leaver -> peer (elastic jobs): report your counts for me (a = round) */
    SR_CTRL_LEAVE_RESP = 8,   /* peer -> leaver: a = round, b = sent to it, c = done from it (leave.c) */
};

#define SR_WIRE_INLINE 32
#define SR_WIRE_BLOCK 0x1u
#define SR_WIRE_VALUE 0x8u
#define SR_WIRE_EXT 0x10u

struct sr_wire {
    uint64_t call_id;
    uint32_t len;       /* payload bytes */
    uint16_t name_len;  /* REQ: bytes of function name at the start of the payload */
    uint8_t flags;      /* SR_WIRE_BLOCK: the payload is in the heap block at p.block_off; see above */
    uint8_t ctrl;       /* CTRL: enum sr_ctrl; KEEP_CALL, MOD_REQ: the module; module messages: theirs */
    union {
        struct {
            int32_t code;   /* ERR: -errno */
            int32_t cause;  /* ERR: for -SR_EREMOTE, the callee's own -errno (0: unknown) */
        };
        uint64_t tag;       /* KEEP_CALL, MOD_REQ: the module's word */
    };
    union {
        uint8_t inl[SR_WIRE_INLINE];
        uint64_t block_off;
        struct { uint64_t a, b, c; } args; /* CTRL */
    } p;
};
static_assert(sizeof(struct sr_wire) <= SR_MSG_DATA, "an RPC header fits one slot");
static_assert(offsetof(struct sr_wire, p) == 24, "the inline payload starts after a 24-byte header");

/* Raw module messages: module id owns the four types
 * SR_MSG_MODULE_TYPE(id, 0..3), so no two modules can collide. */
#define SR_MSG_MODULE_BASE 16
#define SR_MSG_MODULE_TYPE(id, k) (SR_MSG_MODULE_BASE + 4 * (id) + (k))

/* sr_msg.data is only 4-byte aligned, so the header is copied, never cast. */
#define SR_WIRE_HDR offsetof(struct sr_wire, p)

static inline struct sr_wire sr__wire_get(const sr_msg *m)
{
    struct sr_wire w;
    memcpy(&w, m->data, sizeof(w));
    return w;
}

/* One field of the header, for the readers that need no more (the whole
 * header is 56 bytes to copy). */
static inline uint8_t sr__wire_flags(const sr_msg *m) { return m->data[offsetof(struct sr_wire, flags)]; }

static inline uint16_t sr__wire_name_len(const sr_msg *m)
{
    uint16_t n;
    memcpy(&n, m->data + offsetof(struct sr_wire, name_len), sizeof(n));
    return n;
}

/* Write the header; the payload union is written only for block and control
 * messages (an inline payload is already in place). */
static inline void sr__wire_put(sr_msg *m, const struct sr_wire *w, bool with_union)
{
    /* two constant sizes, so each copy is a few moves (a variable size
     * became `rep movsq`, slow to start on small copies) */
    if (with_union || (w->flags & SR_WIRE_BLOCK))
        memcpy(m->data, w, sizeof(*w));
    else
        memcpy(m->data, w, SR_WIRE_HDR);
}

/* A request's header, whose call id was taken just now: the id stored on
 * its own, over w's (never set), not copied through w with the rest. A
 * wider load that spans the id's store, still in flight, would wait for it
 * to commit (a store is forwarded to a load only if it covers the whole
 * load): copied whole, that load drew a fifth of sr__rpc_start's samples
 * (perf, bench_rpc self). */
static inline void sr__wire_put_call(sr_msg *m, const struct sr_wire *w, uint64_t id)
{
    sr__wire_put(m, w, false);
    memcpy(m->data, &id, sizeof(id));
}

static inline uint8_t *sr__wire_inline(sr_msg *m) { return m->data + SR_WIRE_HDR; }
static inline const uint8_t *sr__wire_inline_c(const sr_msg *m) { return m->data + SR_WIRE_HDR; }

#endif
