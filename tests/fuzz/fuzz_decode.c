/* SPDX-License-Identifier: MIT */
/* libFuzzer harness for what a worker decodes from its peers: value lists
 * (lib/rpc/codec.c, value.c: every kind, tensors, objects and RRefs
 * included), RPC messages as serve.c and calls.c take them apart (wire.h, the
 * payload inline or in a heap block, the extension block of ext.c, the
 * function name, the arguments or the result), and the RRef layer's control
 * messages. fuzz_env.h describes the in-process world it runs in and the
 * input format (the first byte selects the mode).
 *
 * The contract checked: any input is answered with 0 or an error, never a
 * crash, a sanitizer report or a leak; a plain value list (no tensor, object
 * or RRef) that decodes re-encodes to exactly the same bytes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "fuzz_env.h"
#include "codec.h"
#include "ext.h"
#include "payload.h"
#include "value_internal.h"
#include "wire.h"
#include "hooks.h"
#include "heap.h"
#include "tensor_impl.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* FUZZ_TRACE=1: print what each decode answered (to check that the seeds
 * reach the paths they were made for). */
static bool trace;
static FILE *report; /* where the oracles report (fz_report_open) */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    trace = getenv("FUZZ_TRACE") != NULL;
    report = fz_report_open();
    fz_env_init();
    return 0;
}

static bool plain(const sr_value *v)
{
    if (sr_value_type(v) != SR_KIND_LIST)
        return v->kind <= SR_KIND_BYTES;
    for (size_t i = 0; i < sr_value_list_len(v); i++)
        if (!plain(sr_value_list_at(v, i)))
            return false;
    return true;
}

/* A decoded plain list encodes back to the very bytes it came from. */
static void check_round_trip(const sr_value *list, const uint8_t *buf, size_t len)
{
    size_t n = sr_value_list_len(list);
    sr_value **items = sr__list_items(list);
    int64_t size = sr__codec_size(n, items, 0);
    uint8_t *out = size > 0 ? malloc((size_t)size) : NULL;
    if (size != (int64_t)len || !out || sr__codec_encode(n, items, 0, out, (size_t)size) != size ||
        memcmp(out, buf, len)) {
        fprintf(report, "fuzz_decode: a plain list of %zu bytes re-encodes to %lld different bytes (%s)\n", len,
                (long long)size, sr_last_error());
        abort();
    }
    free(out);
}

/* A decoded tensor views only bytes of its block (the decoder's extent
 * check, verified independently: the block is in the segment, where ASan
 * cannot see an overrun), and its elements can be read (a small one is
 * copied through the strided loop). */
static void check_tensor(sr_tensor *t)
{
    char repr[SR_SHAPE_STR];
    if (!sr_tensor_numel(t))
        return;
    __int128 last = t->offset;
    for (int i = 0; i < t->ndim; i++)
        last += (__int128)(t->shape[i] - 1) * t->strides[i];
    __int128 end = (last + 1) * (__int128)sr_dtype_size(t->dtype);
    if (t->offset < 0 || end > (__int128)sr__block_size(t->storage->block)) {
        fprintf(report, "fuzz_decode: a decoded tensor %s%s reaches byte %lld of its %zu-byte block\n",
                sr_dtype_name(t->dtype), sr__shape_str(t->ndim, t->shape, repr), (long long)end,
                sr__block_size(t->storage->block));
        abort();
    }
    if (sr_tensor_numel(t) <= 4096)
        sr_tensor_unref(sr_clone(t));
}

/* Every decoded value can be described, and every tensor checked. */
static void inspect(const sr_value *v)
{
    char repr[128];
    sr__value_repr(v, repr, sizeof(repr));
    if (sr_value_type(v) == SR_KIND_TENSOR)
        check_tensor(sr_value_tensor(v));
    for (size_t i = 0; i < sr_value_list_len(v); i++)
        inspect(sr_value_list_at(v, i));
}

static void values(const uint8_t *buf, size_t len)
{
    sr_value *list = NULL;
    int rc = sr__codec_decode(buf, len, &list);
    if (trace) {
        char repr[96];
        fprintf(report, "fuzz_decode: %zu bytes: %d %s\n", len, rc,
                rc ? sr_last_error() : sr__value_repr(sr_value_list_at(list, 0), repr, sizeof(repr)));
    }
    if (rc && rc != -EBADMSG && rc != -ENOMEM) {
        fprintf(report, "fuzz_decode: sr__codec_decode returned %d (%s)\n", rc, sr_last_error());
        abort();
    }
    if (!rc)
        inspect(list);
    if (!rc && plain(list))
        check_round_trip(list, buf, len);
    sr_value_unref(list);
}

/* A result (RESP, KEEP_RET with a value): extensions, then a list of one. */
static void result(const sr_msg *m, const uint8_t *p, size_t len)
{
    struct sr_ext_view ext = {.mask = 0};
    size_t used = 0;
    if ((sr__wire_get(m).flags & SR_WIRE_EXT) && sr__ext_parse(p, len, m->src, &ext, &used))
        return;
    sr_value *list = NULL;
    if (sr__codec_decode(p + used, len - used, &list))
        return;
    inspect(list);
    if (sr_value_list_len(list) == 1 && ext.mask)
        sr__ext_response_in(m->src, &ext, sr_value_list_at(list, 0));
    sr_value_unref(list);
}

/* A request (REQ, KEEP_CALL, MOD_REQ): extensions, the name, the arguments. */
static void request(const sr_msg *m, const uint8_t *p, size_t len)
{
    struct sr_wire w = sr__wire_get(m);
    struct sr_ext_view ext;
    size_t used = 0;
    if ((w.flags & SR_WIRE_EXT) && sr__ext_parse(p, len, m->src, &ext, &used))
        return;
    p += used;
    len -= used;
    size_t skip = m->type == SR_MSG_MOD_REQ ? 0 : w.name_len;
    if (skip > len)
        return;
    /* An unknown function's arguments are released, a known one's decoded:
     * the name's first byte picks which, so both paths are reached. */
    if (skip && p[0] == '?')
        sr__codec_release(p + skip, len - skip);
    else
        values(p + skip, len - skip);
}

static void message(const uint8_t *data, size_t size)
{
    if (size < 1 + FZ_SLOT_BYTES)
        return;
    sr_msg m = {.src = 1, .type = data[0]};
    memcpy(m.data, data + 1, FZ_SLOT_BYTES);
    size_t tail = size - 1 - FZ_SLOT_BYTES;
    memcpy(fz_payload(), data + 1 + FZ_SLOT_BYTES, tail < FZ_PAYLOAD_BYTES ? tail : FZ_PAYLOAD_BYTES);
    size_t len;
    const uint8_t *p = sr__payload_get(&m, &len);
    if (!p)
        return;
    switch (m.type) {
    case SR_MSG_REQ:
    case SR_MSG_KEEP_CALL:
    case SR_MSG_MOD_REQ: request(&m, p, len); break;
    case SR_MSG_RESP: result(&m, p, len); break;
    case SR_MSG_KEEP_RET:
        if (sr__wire_get(&m).flags & SR_WIRE_VALUE)
            result(&m, p, len);
        break;
    default: break;
    }
    sr__payload_done(&m);
}

static void rref_ctrl(const uint8_t *data, size_t size)
{
    if (size < 1 + FZ_SLOT_BYTES)
        return;
    sr__rref_ctrl(data[0] % FZ_WORLD, 0, data + 1, FZ_SLOT_BYTES);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t *buf = malloc(size - 1 ? size - 1 : 1);
    if (!buf)
        return 0;
    memcpy(buf, data + 1, size - 1);
    fz_unmark(buf, size - 1);
    fz_iter_begin();
    switch ((enum fz_mode)(data[0] & 3)) {
    case FZ_VALUES: values(buf, size - 1); break;
    case FZ_RELEASE: sr__codec_release(buf, size - 1); break;
    case FZ_MSG: message(buf, size - 1); break;
    case FZ_RREF_CTRL: rref_ctrl(buf, size - 1); break;
    }
    fz_iter_end();
    free(buf);
    return 0;
}
