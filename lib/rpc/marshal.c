/* SPDX-License-Identifier: MIT */
/* The marshal table of RPC messages (transport.h, "Framing"): where a
 * message's parts are, for a transport whose peers do not share our heap.
 *
 * A message's parts: the payload's heap block (SR_WIRE_BLOCK), then the
 * block of every tensor its encoded values name, in encoding order. Each
 * travels whole (a view of a larger storage takes the storage along, as
 * PyTorch's RPC does). The receiving transport materialises each as a block
 * of its own heap and rebind() points the head and the descriptors at them,
 * so the decoder sees a message a local peer could have sent: one reference
 * per block, dropped as usual (payload.h, codec.h).
 *
 * The payload's layout (wire.h): [extension block][function name] values for
 * REQ and KEEP_CALL; [extension block] values for MOD_REQ, RESP and a
 * KEEP_RET with SR_WIRE_VALUE; text for ERR. */
#include "marshal.h"

#include <endian.h>
#include <errno.h>
#include <string.h>

#include "codec.h"
#include "error.h"
#include "ext.h"
#include "heap.h"
#include "payload.h"

static bool has_wire(uint16_t type)
{
    switch (type) {
    case SR_MSG_REQ:
    case SR_MSG_RESP:
    case SR_MSG_ERR:
    case SR_MSG_KEEP_CALL:
    case SR_MSG_KEEP_RET:
    case SR_MSG_MOD_REQ: return true;
    default: return false;
    }
}

/* Where the encoded values start in the payload p of len bytes: 0 with *at;
 * 1: the payload holds no values; -EBADMSG. */
static int values_at(const sr_msg *m, const uint8_t *p, size_t len, size_t *at)
{
    struct sr_wire w = sr__wire_get(m);
    if (m->type == SR_MSG_ERR || (m->type == SR_MSG_KEEP_RET && !(w.flags & SR_WIRE_VALUE)))
        return 1;
    size_t used = 0;
    struct sr_ext_view ext;
    if ((w.flags & SR_WIRE_EXT) && sr__ext_parse(p, len, m->src, &ext, &used))
        return -EBADMSG;
    if (m->type == SR_MSG_REQ || m->type == SR_MSG_KEEP_CALL) {
        if (w.name_len > len - used)
            return sr__fail(-EBADMSG, "sr_rpc", "a request from worker%u names %u bytes of function in a %zu-byte payload",
                            m->src, w.name_len, len);
        used += w.name_len;
    }
    *at = used;
    return 0;
}

/* The payload block of m, checked: its data, or NULL (-EBADMSG). */
static uint8_t *payload_block(const sr_msg *m, uint64_t off, uint32_t len)
{
    sr_block *b = sr__block_from_off(off);
    void *data = NULL;
    size_t size = 0;
    if (!b || sr__block_check(b, &data, &size) || size < len) {
        sr__fail(-EBADMSG, "sr_rpc", "the payload block at offset %llu of a message from worker%u is invalid "
                                     "(%zu bytes for a %u-byte payload)",
                 (unsigned long long)off, m->src, size, len);
        return NULL;
    }
    return data;
}

static uint64_t field_get(const uint8_t *f)
{
    uint64_t x;
    memcpy(&x, f, 8);
    return le64toh(x);
}

static void field_put(uint8_t *f, uint64_t v)
{
    v = htole64(v);
    memcpy(f, &v, 8);
}

/* Visit the tensor blocks named by m's payload (its values, if any). */
static int each_tensor(const sr_msg *m, uint8_t *p, size_t len, int (*fn)(void *, uint8_t *), void *arg)
{
    size_t at = 0;
    int rc = values_at(m, p, len, &at);
    if (rc)
        return rc < 0 ? rc : 0;
    return sr__codec_visit_tensors(p + at, len - at, fn, arg);
}

struct parts_walk {
    int (*each)(void *arg, const void *data, uint64_t len);
    void *arg;
};

static int part_of_tensor(void *p, uint8_t *field)
{
    struct parts_walk *w = p;
    uint64_t off = field_get(field);
    sr_block *b = sr__block_from_off(off);
    void *data = NULL;
    size_t size = 0;
    if (!b || sr__block_check(b, &data, &size))
        return sr__fail(-EBADMSG, "sr_rpc", "a tensor's block at offset %llu is invalid", (unsigned long long)off);
    return w->each(w->arg, data, size);
}

static int m_parts(const sr_msg *m, int (*each)(void *arg, const void *data, uint64_t len), void *arg)
{
    if (!has_wire(m->type))
        return 0;
    struct sr_wire w = sr__wire_get(m);
    if (!(w.flags & SR_WIRE_BLOCK))
        return 0; /* inline: no tensor descriptor fits in SR_WIRE_INLINE bytes */
    uint8_t *p = payload_block(m, w.p.block_off, w.len);
    if (!p)
        return -EBADMSG;
    int rc = each(arg, p, w.len);
    struct parts_walk pw = {each, arg};
    return rc ? rc : each_tensor(m, p, w.len, part_of_tensor, &pw);
}

static int drop_tensor(void *p, uint8_t *field)
{
    (void)p;
    sr_block *b = sr__block_recv_off(field_get(field)); /* the descriptor's reference, out of the message */
    if (b)
        sr__block_unref(b);
    return 0;
}

/* The bytes left: the references the encoder took (the payload's, and one
 * per tensor descriptor) go, and nothing else is undone (an RRef the values
 * carry now belongs to the receiver, unlike sr__codec_release's). */
static void m_sent(const sr_msg *m)
{
    if (!has_wire(m->type))
        return;
    struct sr_wire w = sr__wire_get(m);
    if (!(w.flags & SR_WIRE_BLOCK))
        return;
    uint8_t *p = payload_block(m, w.p.block_off, w.len);
    if (p)
        each_tensor(m, p, w.len, drop_tensor, NULL);
    sr__payload_done(m);
}

#ifdef SR_TSAN
static int release_tensor(void *p, uint8_t *field)
{
    (void)p;
    sr_block *b = sr__block_from_off(field_get(field));
    if (b)
        sr__block_handoff(b);
    return 0;
}

void sr__marshal_handoff(const sr_msg *m)
{
    if (!has_wire(m->type))
        return;
    struct sr_wire w = sr__wire_get(m);
    if (!(w.flags & SR_WIRE_BLOCK))
        return;
    sr_block *b = sr__block_from_off(w.p.block_off);
    uint8_t *p = payload_block(m, w.p.block_off, w.len);
    if (p)
        each_tensor(m, p, w.len, release_tensor, NULL);
    if (b)
        sr__block_handoff(b); /* last: the walk above read the payload */
}
#endif

struct rebind_walk {
    const uint64_t *blocks;
    size_t n, next;
};

static int rebind_tensor(void *p, uint8_t *field)
{
    struct rebind_walk *r = p;
    if (r->next >= r->n)
        return sr__fail(-EBADMSG, "sr_rpc", "a message names more tensors than the %zu parts that came with it",
                        r->n - 1);
    field_put(field, r->blocks[r->next++]);
    return 0;
}

static int m_rebind(sr_msg *m, const uint64_t *blocks, size_t n)
{
    struct sr_wire w = has_wire(m->type) ? sr__wire_get(m) : (struct sr_wire){.flags = 0};
    if (!(w.flags & SR_WIRE_BLOCK))
        return n ? sr__fail(-EBADMSG, "sr_rpc", "a message of type %u from worker%u came with %zu parts and names none",
                            m->type, m->src, n)
                 : 0;
    if (!n)
        return sr__fail(-EBADMSG, "sr_rpc", "a message from worker%u names a payload block and came without it", m->src);
    w.p.block_off = blocks[0];
    sr__wire_put(m, &w, true);
    uint8_t *p = payload_block(m, blocks[0], w.len);
    if (!p)
        return -EBADMSG;
    struct rebind_walk r = {blocks, n, 1};
    int rc = each_tensor(m, p, w.len, rebind_tensor, &r);
    if (!rc && r.next != n)
        rc = sr__fail(-EBADMSG, "sr_rpc", "a message from worker%u came with %zu parts and names %zu", m->src, n,
                      r.next);
    return rc;
}

const struct sr_tport_marshal sr__rpc_marshal = {
    .parts = m_parts,
    .sent = m_sent,
    .rebind = m_rebind,
};
