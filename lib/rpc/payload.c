/* Message payloads. See payload.h. */
#include "payload.h"

#include <errno.h>
#include <string.h>

#include "error.h"

static struct sr_wire *wire(const sr_msg *m) { return (struct sr_wire *)m->data; }

uint8_t *sr__payload_reserve(sr_msg *m, size_t len)
{
    struct sr_wire *w = wire(m);
    w->len = (uint32_t)len;
    if (len <= SR_WIRE_INLINE) {
        w->flags = 0;
        return w->p.inl;
    }
    if (len > UINT32_MAX) {
        sr__fail(-EMSGSIZE, "sr_rpc", "message of %zu bytes is larger than 4 GiB", len);
        return NULL;
    }
    sr_block *b = sr_block_alloc(len);
    if (!b)
        return NULL;
    uint64_t off = sr_block_to_off(b);
    if (off == (uint64_t)-1) {
        sr_block_unref(b);
        sr__fail(-EMSGSIZE, "sr_rpc", "a %zu-byte message needs the shared heap, which is not attached", len);
        return NULL;
    }
    w->flags = SR_WIRE_BLOCK;
    w->p.block_off = off;
    return sr_block_data(b);
}

void sr__payload_abandon(sr_msg *m)
{
    sr__payload_done(m);
}

const uint8_t *sr__payload_get(const sr_msg *m, size_t *len)
{
    const struct sr_wire *w = wire(m);
    *len = w->len;
    if (!(w->flags & SR_WIRE_BLOCK)) {
        if (w->len > SR_WIRE_INLINE) {
            sr__fail(-EBADMSG, "sr_rpc", "inline payload of %u bytes from worker%u exceeds %d", w->len, m->src,
                     SR_WIRE_INLINE);
            return NULL;
        }
        return w->p.inl;
    }
    sr_block *b = sr_block_from_off(w->p.block_off);
    if (!b || sr_block_size(b) < w->len) {
        sr__fail(-EBADMSG, "sr_rpc", "payload block at offset %llu from worker%u is invalid",
                 (unsigned long long)w->p.block_off, m->src);
        return NULL;
    }
    return sr_block_data(b);
}

void sr__payload_done(const sr_msg *m)
{
    const struct sr_wire *w = wire(m);
    if (!(w->flags & SR_WIRE_BLOCK))
        return;
    sr_block *b = sr_block_from_off(w->p.block_off);
    if (b)
        sr_block_unref(b);
}
