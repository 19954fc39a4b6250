/* SPDX-License-Identifier: MIT */
/* Tensor descriptors. See desc.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "heap.h"
#include "desc.h"
#include "tensor_impl.h"

#define FN "sr__tensor_from_desc"

bool sr__tensor_sendable(const sr_tensor *t) { return sr__storage_block_off(t->storage) != (uint64_t)-1; }

sr_block *sr__tensor_block(const sr_tensor *t)
{
    struct sr_storage *st = t->storage;
    sr__storage_lock(st);
    sr_block *b = st->block;
    sr__storage_unlock(st);
    return b;
}

int sr__tensor_to_desc(const sr_tensor *t, struct sr_tensor_desc *d)
{
    if (!t || !d)
        return sr__fail(-EINVAL, "sr__tensor_to_desc", "tensor or descriptor is NULL");
    /* The block is read and referenced under the storage's write lock, so a
     * concurrent in-place write either ended before (we send its result) or
     * starts after and, finding the block shared, writes a copy (we send
     * the values before it): never a mix (tensor_impl.h). */
    struct sr_storage *st = t->storage;
    sr__storage_lock(st);
    sr_block *b = st->block;
    uint64_t off = sr__block_to_off(b);
    if (off != (uint64_t)-1) /* the descriptor's reference, moved into the message (heap.h) */
        off = sr__block_send_off(sr__block_ref(b));
    sr__storage_unlock(st);
    if (off == (uint64_t)-1)
        return sr__fail(-EINVAL, "sr__tensor_to_desc", "the tensor's storage is a private block, not in the "
                        "shared heap (was sr__heap_attach called before it was made?)");
    memset(d, 0, sizeof(*d));
    d->magic = SR_TENSOR_DESC_MAGIC;
    d->dtype = (uint8_t)t->dtype;
    d->ndim = (uint8_t)t->ndim;
    d->flags = t->requires_grad ? SR_DESC_REQUIRES_GRAD : 0;
    d->offset = t->offset;
    d->block = off;
    memcpy(d->shape, t->shape, (size_t)t->ndim * sizeof(int64_t));
    memcpy(d->strides, t->strides, (size_t)t->ndim * sizeof(int64_t));
    return 0;
}

static int check_fields(const struct sr_tensor_desc *d)
{
    if (d->magic != SR_TENSOR_DESC_MAGIC)
        return sr__fail(-EINVAL, FN, "bad magic 0x%08x", d->magic);
    if (sr__check_dtype(FN, (sr_dtype)d->dtype))
        return -EINVAL;
    if (d->ndim > SR_MAX_DIMS)
        return sr__fail(-EINVAL, FN, "ndim %u exceeds %d", d->ndim, SR_MAX_DIMS);
    if (d->flags & ~SR_DESC_REQUIRES_GRAD)
        return sr__fail(-EINVAL, FN, "unknown flags 0x%x", d->flags);
    if ((d->flags & SR_DESC_REQUIRES_GRAD) && d->dtype == SR_I64)
        return sr__fail(-EINVAL, FN, "an i64 tensor cannot require grad");
    for (int i = d->ndim; i < SR_MAX_DIMS; i++)
        if (d->shape[i] || d->strides[i])
            return sr__fail(-EINVAL, FN, "shape/stride entry %d past ndim %u is not zero", i, d->ndim);
    if (sr__check_shape(FN, d->ndim, d->shape))
        return -EINVAL;
    int64_t es = (int64_t)sr_dtype_size((sr_dtype)d->dtype), bytes;
    for (int i = 0; i < d->ndim; i++) {
        if (d->strides[i] < 0)
            return sr__fail(-EINVAL, FN, "stride %d is negative (%lld)", i, (long long)d->strides[i]);
        /* The extent check bounds a stride only where its dimension has two
         * or more elements; every other one must still be a byte distance
         * that the kernels can compute (stride * element size) */
        if (__builtin_mul_overflow(d->strides[i], es, &bytes))
            return sr__fail(-EINVAL, FN, "stride %d (%lld elements of %lld bytes) overflows a byte offset", i,
                            (long long)d->strides[i], (long long)es);
    }
    if (d->offset < 0)
        return sr__fail(-EINVAL, FN, "offset %lld is negative", (long long)d->offset);
    return 0;
}

/* The view's last byte must lie inside the block. */
static int check_extent(const struct sr_tensor_desc *d, size_t block_bytes)
{
    int64_t last = d->offset, es = (int64_t)sr_dtype_size((sr_dtype)d->dtype), bytes;
    bool empty = sr__numel(d->ndim, d->shape) == 0, overflow = false;
    for (int i = 0; i < d->ndim && !empty; i++) {
        int64_t step;
        overflow |= __builtin_mul_overflow(d->shape[i] - 1, d->strides[i], &step);
        overflow |= __builtin_add_overflow(last, step, &last);
    }
    overflow |= __builtin_add_overflow(last, empty ? 0 : 1, &last);
    overflow |= __builtin_mul_overflow(last, es, &bytes);
    if (overflow || (uint64_t)bytes > block_bytes)
        return sr__fail(-EINVAL, FN, "the view (offset %lld, %u dims) reaches past its %zu-byte block",
                        (long long)d->offset, d->ndim, block_bytes);
    return 0;
}

int sr__tensor_desc_check(const struct sr_tensor_desc *d, size_t block_bytes)
{
    if (!d)
        return sr__fail(-EINVAL, FN, "descriptor is NULL");
    int rc = check_fields(d);
    return rc ? rc : check_extent(d, block_bytes);
}

int sr__tensor_from_desc(const struct sr_tensor_desc *d, sr_tensor **out)
{
    if (!d || !out)
        return sr__fail(-EINVAL, FN, "descriptor or out is NULL");
    int rc = check_fields(d);
    if (rc)
        return rc;
    sr_block *b = sr__block_from_off(d->block);
    if (!b) {
        char why[256]; /* sr__fail rewrites the buffer sr_last_error() points to */
        snprintf(why, sizeof(why), "%s", sr_last_error());
        return sr__fail(-EINVAL, FN, "block offset %llu: %s", (unsigned long long)d->block, why);
    }
    void *data;
    size_t size;
    if ((rc = sr__block_check(b, &data, &size)) || (rc = check_extent(d, size)))
        return rc;
    struct sr_storage *s = sr__storage_new(sr__block_ref(b));
    if (!s) {
        sr__block_unref(b);
        return -ENOMEM;
    }
    sr_tensor *t = sr__tensor_wrap(s, (sr_dtype)d->dtype, d->ndim, d->shape, d->strides, d->offset);
    sr__storage_unref(s);
    if (!t)
        return -ENOMEM;
    t->requires_grad = d->flags & SR_DESC_REQUIRES_GRAD;
    *out = t;
    return 0;
}

void sr__tensor_desc_release(const struct sr_tensor_desc *d)
{
    sr_block *b = d ? sr__block_recv_off(d->block) : NULL; /* the descriptor's reference, out of the message */
    sr__block_unref(b);
}
