/* SPDX-License-Identifier: MIT */
/* Message payloads. See payload.h. */
#include "payload.h"

#include <errno.h>
#include <string.h>

#include "error.h"

/* The message's reference to the block at off: taken out of it, dropped. */
static void drop_block(uint64_t off)
{
    sr_block *b = sr__block_recv_off(off);
    if (b)
        sr__block_unref(b);
}

uint8_t *sr__payload_reserve(sr_msg *m, struct sr_wire *w, size_t len)
{
    w->len = (uint32_t)len;
    if (len <= SR_WIRE_INLINE) {
        w->flags = 0;
        return sr__wire_inline(m);
    }
    if (len > UINT32_MAX) {
        sr__fail(-EMSGSIZE, "sr_rpc", "message of %zu bytes is larger than 4 GiB", len);
        return NULL;
    }
    sr_block *b = sr__block_alloc(len);
    if (!b)
        return NULL;
    uint64_t off = sr__block_send_off(b); /* our reference becomes the message's (heap.h) */
    if (off == (uint64_t)-1) {
        sr__block_unref(b);
        sr__fail(-EMSGSIZE, "sr_rpc", "a %zu-byte message needs the shared heap, which is not attached", len);
        return NULL;
    }
    w->flags = SR_WIRE_BLOCK;
    w->p.block_off = off;
    return sr__block_data(b);
}

void sr__payload_abandon(const struct sr_wire *w)
{
    if (w->flags & SR_WIRE_BLOCK)
        drop_block(w->p.block_off);
}

const uint8_t *sr__payload_get(const sr_msg *m, size_t *len)
{
    struct sr_wire w = sr__wire_get(m);
    *len = w.len;
    if (!(w.flags & SR_WIRE_BLOCK)) {
        if (w.len > SR_WIRE_INLINE) {
            sr__fail(-EBADMSG, "sr_rpc", "inline payload of %u bytes from worker%u exceeds %d", w.len, m->src,
                     SR_WIRE_INLINE);
            return NULL;
        }
        return sr__wire_inline_c(m);
    }
    /* One checked snapshot of the header's data pointer and size (heap.h):
     * re-reading them, a peer's scribble between the check and the use
     * would point the decoder anywhere. */
    sr_block *b = sr__block_from_off(w.p.block_off);
    void *data = NULL;
    size_t size = 0;
    if (!b || sr__block_check(b, &data, &size) || size < w.len) {
        sr__fail(-EBADMSG, "sr_rpc", "payload block at offset %llu from worker%u is invalid (%zu bytes for a %u-byte payload)",
                 (unsigned long long)w.p.block_off, m->src, size, w.len);
        return NULL;
    }
    return data;
}

void sr__payload_done(const sr_msg *m)
{
    struct sr_wire w = sr__wire_get(m);
    sr__payload_abandon(&w);
}
