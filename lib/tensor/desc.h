/* SPDX-License-Identifier: MIT */
/* The tensor layer's seam for the RPC layer (internal): all that the codec
 * and the values (lib/rpc/codec.c, value.c) see of a tensor. They never
 * include tensor_impl.h; what they need of a tensor's insides is a function
 * here. Mostly descriptors: how a tensor travels in a message.
 *
 * A descriptor is fixed-size plain data: geometry plus the storage block's
 * offset in the segment. It never holds a pointer, so any worker can read it.
 *
 * References. sr__tensor_to_desc() takes one block reference that belongs to
 * the descriptor, so the sender may drop its tensor at once. It takes it
 * under the storage's write lock (tensor_impl.h), so it may run while another
 * thread writes the tensor in place: the descriptor then names the bytes
 * before that write or after it, never a mix. Release through the
 * descriptor's block offset, never through the tensor, whose storage may
 * have moved to a copy since. Whoever frees the
 * message releases it with sr__tensor_desc_release(), exactly once, whether
 * or not a tensor was made from it. sr__tensor_from_desc() takes the
 * receiver's own reference. While a descriptor is alive the block has at
 * least two holders, so a write by either side copies first (tensor.h,
 * copy-on-write): the receiver sees the values at send time.
 *
 * Within one message, two descriptors of one storage become two storages on
 * the receiver (they no longer alias each other); the RPC layer may keep a
 * per-message map if that ever matters.
 */
#ifndef SR_LIB_TENSOR_DESC_H
#define SR_LIB_TENSOR_DESC_H

#if !defined(SR__SEES_TENSOR)
#error "desc.h is the seam of the tensor layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "heap.h"
#include "shmrpc/tensor.h"

#define SR_TENSOR_DESC_MAGIC 0x54447253u /* "SrDT" */
#define SR_DESC_REQUIRES_GRAD 1u

struct sr_tensor_desc {
    uint32_t magic;
    uint8_t dtype;
    uint8_t ndim;    /* <= SR_MAX_DIMS; entries past ndim are zero */
    uint16_t flags;  /* SR_DESC_REQUIRES_GRAD */
    int64_t offset;  /* first element, in elements from the block's data */
    uint64_t block;  /* sr__block_to_off() of the storage */
    int64_t shape[SR_MAX_DIMS];
    int64_t strides[SR_MAX_DIMS]; /* in elements, >= 0 */
};
_Static_assert(sizeof(struct sr_tensor_desc) == 152, "descriptor layout is part of the message format");

/* Whether sr__tensor_to_desc() could describe t: its storage is a block of
 * the shared heap. Takes no reference (the codec's size pass). */
bool sr__tensor_sendable(const sr_tensor *t);
/* Errors: -EINVAL when t's storage is not in the shared heap (no
 * sr__heap_attach) or t is NULL. */
int sr__tensor_to_desc(const sr_tensor *t, struct sr_tensor_desc *d);
/* A leaf tensor (requires_grad from the flags, no history) viewing the
 * block. Errors: -EINVAL for any malformed field, an offset that is not a
 * block, or a view that reaches past the block, always with a message. */
int sr__tensor_from_desc(const struct sr_tensor_desc *d, sr_tensor **out);
/* The block t's storage views now, shared or private, read under the
 * storage's write lock; no reference is taken, so it stays valid while the
 * caller holds t and no in-place write moves t to a copy. The block a
 * descriptor of t would name: for the layers above that check a transfer
 * was zero-copy (the receiver views the sender's block) or count the
 * references a message holds on it. */
sr_block *sr__tensor_block(const sr_tensor *t);
/* Drop the descriptor's block reference (see above). */
void sr__tensor_desc_release(const struct sr_tensor_desc *d);
/* The checks of sr__tensor_from_desc against a block of block_bytes. */
int sr__tensor_desc_check(const struct sr_tensor_desc *d, size_t block_bytes);

/* For values (compare.c). Same dtype, shape and elements (strides, offsets
 * and storage may differ); floats compare as doubles, so 0.0 == -0.0 and NaN
 * equals NaN, and a tensor always equals itself and its decoded copy. */
bool sr__tensor_equal(const sr_tensor *a, const sr_tensor *b);
/* "f32[2, 3]": dtype and shape, in buf[SR_TENSOR_REPR]. */
#define SR_TENSOR_REPR 176
const char *sr__tensor_repr(const sr_tensor *t, char *buf);

#endif
