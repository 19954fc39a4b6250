/* SPDX-License-Identifier: MIT */
/* The RPC layer's marshal table (lib/rpc/marshal.c, transport.h "Framing"):
 * what a copying transport (MPI between hosts) asks of a message, checked
 * here without one. A request carrying tensors names its parts (the payload
 * block, then each tensor's block in encoding order); a receiver that
 * materialises copies of those bytes in new blocks and rebinds the message
 * decodes the same values, on blocks of its own; the sender's references go
 * when the bytes have left; a message whose parts do not match what it
 * names is refused with -EBADMSG, never decoded. */
#include "codec.h"
#include "desc.h" /* sr__tensor_block */
#include "heap.h"
#include "marshal.h"
#include "payload.h"
#include "rpc_harness.h"
#include "shmrpc/tensor.h"
#include "wire.h"

LEAK_CHECKED_SUITE(marshal);

#define NAME "fn"

static uint64_t block_of(const sr_tensor *t) { return sr__block_to_off(sr__tensor_block(t)); }

static uint32_t refs(uint64_t off) { return sr__block_refcount(sr__block_from_off(off)); }

struct seen {
    const void *data[8];
    uint64_t len[8];
    int n;
};

static int note_part(void *arg, const void *data, uint64_t len)
{
    struct seen *s = arg;
    if (s->n == 8)
        return -E2BIG;
    s->data[s->n] = data;
    s->len[s->n++] = len;
    return 0;
}

/* A request to NAME with vals, as calls.c frames one (no envelope). */
static int frame_request(sr_msg *m, size_t n, sr_value *const *vals)
{
    int64_t size = sr__codec_size(n, vals, 0);
    WCHECK(size > 0, "sr__codec_size: %s", sr_last_error());
    struct sr_wire w = {.call_id = 42, .name_len = (uint16_t)strlen(NAME)};
    memset(m, 0, sizeof(*m));
    m->type = SR_MSG_REQ;
    m->src = (uint16_t)sr_rank();
    uint8_t *p = sr__payload_reserve(m, &w, (size_t)size + w.name_len);
    WCHECK(p && (w.flags & SR_WIRE_BLOCK), "a payload block for %lld bytes: %s", (long long)size, sr_last_error());
    memcpy(p, NAME, w.name_len);
    WCHECK(sr__codec_encode(n, vals, 0, p + w.name_len, (size_t)size) == size, "encode: %s", sr_last_error());
    sr__wire_put(m, &w, true);
    return 0;
}

/* What a copying transport's receiver does: each part copied into a new
 * block of our heap. */
static int copy_parts(const struct seen *s, uint64_t *blocks)
{
    for (int i = 0; i < s->n; i++) {
        sr_block *b = sr__block_alloc(s->len[i]);
        WCHECK(b, "sr__block_alloc(%llu): %s", (unsigned long long)s->len[i], sr_last_error());
        memcpy(sr__block_data(b), s->data[i], s->len[i]);
        blocks[i] = sr__block_send_off(b); /* the message's reference, as the MPI transport makes it */
    }
    return 0;
}

static void drop_blocks(const uint64_t *blocks, int n)
{
    for (int i = 0; i < n; i++)
        sr__block_unref(sr__block_recv_off(blocks[i]));
}

static int decode_args(const sr_msg *m, sr_value **args)
{
    size_t len = 0;
    const uint8_t *p = sr__payload_get(m, &len);
    WCHECK(p, "payload: %s", sr_last_error());
    struct sr_wire w = sr__wire_get(m);
    int rc = sr__codec_decode(p + w.name_len, len - w.name_len, args);
    sr__payload_done(m);
    WCHECK(rc == 0, "decode: %s", sr_last_error());
    return 0;
}

static bool same_floats(const sr_tensor *a, const sr_tensor *b, int64_t n)
{
    return !memcmp(sr_tensor_data(a), sr_tensor_data(b), (size_t)n * sizeof(float));
}

/* Parts, copies, rebind, decode: the same values on our own blocks. */
static int round_trip(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_tensor *big = sr_full(SR_F32, 1, (int64_t[]){1000}, 2.5, 0);
    sr_tensor *small = sr_arange(SR_F32, 0, 3, 1, 0);
    WCHECK(big && small, "tensors: %s", sr_last_error());
    sr_value *items[] = {sr_str("x"), sr_value_from_tensor(small)};
    sr_value *inner = sr_list(2, items);
    sr_value_unref(items[0]);
    sr_value_unref(items[1]);
    sr_value *vals[] = {sr_int(7), sr_value_from_tensor(big), inner};
    uint32_t before = refs(block_of(big));
    sr_msg m;
    if (frame_request(&m, 3, vals))
        return 1;
    WCHECK(refs(block_of(big)) == before + 1, "the encoder took one reference of big's block: %u -> %u", before,
           refs(block_of(big)));
    struct seen s = {0};
    WCHECK(sr__rpc_marshal.parts(&m, note_part, &s) == 0, "parts: %s", sr_last_error());
    WCHECK(s.n == 3, "a payload and two tensors: %d parts", s.n);
    WCHECK(s.data[1] == sr_tensor_data(big) && s.len[1] >= 4000, "part 1 is big's block (%llu bytes)",
           (unsigned long long)s.len[1]);
    WCHECK(s.data[2] == sr_tensor_data(small), "part 2 is small's block, in encoding order");
    uint64_t blocks[3];
    if (copy_parts(&s, blocks))
        return 1;
    sr_msg in = m;
    WCHECK(sr__rpc_marshal.rebind(&in, blocks, 3) == 0, "rebind: %s", sr_last_error());
    sr__rpc_marshal.sent(&m); /* the bytes left: the sender's references go */
    WCHECK(refs(block_of(big)) == before, "sent() dropped the message's reference of big's block: %u, not %u",
           refs(block_of(big)), before);
    sr_value *args = NULL;
    if (decode_args(&in, &args))
        return 1;
    sr_tensor *got = sr_value_tensor(sr_value_list_at(args, 1));
    sr_tensor *got_small = sr_value_tensor(sr_value_list_at(sr_value_list_at(args, 2), 1));
    WCHECK(sr_value_list_len(args) == 3 && sr_value_int(sr_value_list_at(args, 0)) == 7, "the int came through");
    WCHECK(got && block_of(got) == blocks[1] && same_floats(got, big, 1000), "big came through on its copy");
    WCHECK(got_small && block_of(got_small) == blocks[2] && same_floats(got_small, small, 3),
           "small came through on its copy");
    sr_value_unref(args);
    for (int i = 0; i < 3; i++)
        sr_value_unref(vals[i]);
    sr_tensor_unref(big);
    sr_tensor_unref(small);
    return 0;
}

/* Parts that do not match what the message names: refused, never decoded. */
static int mismatched_parts(int rank, int world)
{
    (void)world;
    if (rank != 0)
        return 0;
    sr_tensor *t = sr_full(SR_F32, 1, (int64_t[]){100}, 1.0, 0);
    sr_value *vals[] = {sr_value_from_tensor(t)};
    sr_msg m;
    if (frame_request(&m, 1, vals))
        return 1;
    struct seen s = {0};
    WCHECK(sr__rpc_marshal.parts(&m, note_part, &s) == 0 && s.n == 2, "parts: %d, %s", s.n, sr_last_error());
    uint64_t blocks[3];
    if (copy_parts(&s, blocks))
        return 1;
    sr_msg in = m;
    WEXPECT_ERR(sr__rpc_marshal.rebind(&in, blocks, 1), -EBADMSG, "names more tensors than the 0 parts");
    in = m;
    blocks[2] = blocks[1];
    WEXPECT_ERR(sr__rpc_marshal.rebind(&in, blocks, 3), -EBADMSG, "came with 3 parts and names 2");
    in = m;
    WEXPECT_ERR(sr__rpc_marshal.rebind(&in, blocks, 0), -EBADMSG, "came without it");
    /* a control message names no part */
    sr_msg ctrl = {.type = SR_MSG_CTRL};
    WEXPECT_ERR(sr__rpc_marshal.rebind(&ctrl, blocks, 1), -EBADMSG, "came with 1 parts and names none");
    /* a payload whose bytes were cut: its values cannot be walked */
    struct sr_wire w = sr__wire_get(&in);
    in = m;
    w.len -= 9;
    sr__wire_put(&in, &w, true);
    WEXPECT_ERR(sr__rpc_marshal.rebind(&in, blocks, 2), -EBADMSG, "tensor descriptor needs");
    drop_blocks(blocks, 2);
    sr__rpc_marshal.sent(&m);
    sr_value_unref(vals[0]);
    sr_tensor_unref(t);
    return 0;
}

Test(marshal, parts_travel_as_copies_and_decode_on_our_blocks, .timeout = 60)
{
    RUN_JOB("marshal_rt", 1, .scenario = round_trip);
}

Test(marshal, parts_that_do_not_match_the_message_are_refused, .timeout = 60)
{
    RUN_JOB("marshal_bad", 1, .scenario = mismatched_parts);
}
