/* SPDX-License-Identifier: MIT */
/* Wire encoding of values (internal).
 *
 * A value list is encoded as a byte string: a count, then each value as a
 * one-byte kind tag followed by its payload (little-endian, unaligned):
 *   none -, bool u8, int i64, double f64, str u32 len + bytes (no NUL),
 *   bytes u32 len + bytes, list u32 n + n values, tensor: a tensor descriptor
 *   (struct sr_tensor_desc, fixed size) whose storage is a shared-heap block
 *   offset, object: the owner's pid u32, rank i32, pointer u64 and type
 *   name (u32 len + bytes, for the error naming it; decodable only in the
 *   same process: a self-call), rref: rref id u64, fork id u64, owner u16
 *   (the fork id is new for this send: encoding forks the RRef, decoding
 *   tells its owner and parent, docs/RREF.md).
 *
 * Decoding is bounds-checked everywhere: a truncated or malformed buffer, an
 * unknown tag, a length past the end, nesting deeper than SR_CODEC_MAX_DEPTH,
 * or trailing bytes give -EBADMSG with a message naming the offset and what
 * was wrong. It never reads outside [buf, buf + len) and never crashes.
 *
 * Encoding tensors takes a block reference for the receiver (the descriptor
 * owns it until decoded); sr__codec_release() drops the references a buffer
 * holds when it will never be decoded (a send that failed, a timed-out reply).
 * Objects work the same way: the encoder takes a value reference for the
 * receiver. RRefs too: the encoder forks them; releasing a buffer (on either
 * side) decodes each RRef and drops it, which retires the fork. After sr__codec_decode() returns 0 or -ENOMEM the buffer holds no
 * references (never release it then). -EBADMSG found the buffer malformed
 * before consuming anything, and a malformed buffer's references are never
 * dropped: they cannot be trusted. (One exception: a forged buffer naming an
 * object more often than it was sent fails only while building, and then the
 * whole buffer is consumed.)
 */
#ifndef SR_RPC_CODEC_H
#define SR_RPC_CODEC_H

#if !defined(SR__IN_RPC)
#error "codec.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
#include <stddef.h>
#include <stdint.h>

#include "shmrpc/value.h"

#define SR_CODEC_MAX_DEPTH 32
#define SR_CODEC_MAX_LEN (1u << 30)

/* Exact encoded size of n values, or -errno (e.g. a private tensor block
 * that cannot be sent, an object bound for another process: -EINVAL naming
 * it). self_call: objects may be passed by reference. */
int64_t sr__codec_size(size_t n, sr_value *const *vals, int self_call);

/* Encode into buf (cap >= sr__codec_size). Returns bytes written or -errno. */
int64_t sr__codec_encode(size_t n, sr_value *const *vals, int self_call, uint8_t *buf, size_t cap);
/* As sr__codec_encode, for a message bound for rank `to`: the module value
 * kinds' encode hooks are told it (an RRef records where its child went). */
int64_t sr__codec_encode_to(size_t n, sr_value *const *vals, int self_call, int to, uint8_t *buf, size_t cap);

/* Decode a list of values; *out is a new SR_KIND_LIST value. 0 or -EBADMSG
 * (-ENOMEM if memory runs out). */
int sr__codec_decode(const uint8_t *buf, size_t len, sr_value **out);
/* Decode a list that should hold one value (a result): *out is that value
 * (a reference) and *n the list's length; a list of another length is
 * decoded and dropped (*out NULL, *n its length). A lone None, the most
 * common result, is recognised without a list. Returns as sr__codec_decode. */
int sr__codec_decode_one(const uint8_t *buf, size_t len, sr_value **out, size_t *n);

/* Drop the block references held by an encoded buffer that will not be decoded. */
void sr__codec_release(const uint8_t *buf, size_t len);

/* Walk an encoded list's structure (bounds, tags and lengths checked, nothing
 * else) and call fn with the position of each tensor descriptor's block
 * offset (8 bytes, little-endian), in encoding order; fn may rewrite it. 0,
 * fn's nonzero return, or -EBADMSG (malformed, the reason in sr_last_error).
 * The marshalling of messages between hosts (marshal.c) uses it. */
int sr__codec_visit_tensors(uint8_t *buf, size_t len, int (*fn)(void *arg, uint8_t *block_field), void *arg);

#endif
