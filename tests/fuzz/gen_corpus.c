/* SPDX-License-Identifier: MIT */
/* Writes the decoder fuzzer's seed corpus (tests/fuzz/corpus/) from real
 * encodings: values encoded by sr__codec_encode in the fuzzer's own world
 * (fuzz_env.h), wrapped in the input format of fuzz_decode.c, with what
 * varies between runs replaced by markers (fz_mark). Run by hand after a
 * change of the wire format:
 *   ./dev fuzz-corpus
 * (build-fuzz/tests/fuzz/fuzz_gen_corpus tests/fuzz/corpus tests/fuzz/corpus-dispatch
 * tests/fuzz/corpus-files tests/fuzz/corpus-segment). Messages also go to the
 * dispatch corpus, without the mode byte; the file fuzzer's seeds
 * (fuzz_files.c) are files this library wrote: checkpoints, and IDX files
 * plain and gzip-compressed; the segment fuzzer's (fuzz_segment.c) are
 * segments this library created, with lines as workers and the supervisor
 * write them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "error.h"
#include "fuzz_env.h"
#include "codec.h"
#include "module.h"
#include "wire.h"
#include "context.h"
#include "doorbell.h"
#include "ring.h"
#include "hooks.h"
#include "rref_internal.h"
#include "shmrpc/checkpoint.h"

static const char *dir, *dispatch_dir, *files_dir, *segment_dir;

static void write_file(const char *d, const char *name, const uint8_t *buf, size_t len)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", d, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) {
        fprintf(stderr, "gen_corpus: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

/* A seed for fuzz_decode (mode byte first); a message is also one for
 * fuzz_dispatch (no mode byte). */
static void write_seed(const char *name, uint8_t mode, const uint8_t *body, size_t len)
{
    uint8_t *buf = malloc(len + 1);
    buf[0] = mode;
    memcpy(buf + 1, body, len);
    fz_mark(buf + 1, len);
    write_file(dir, name, buf, len + 1);
    if (mode == FZ_MSG)
        write_file(dispatch_dir, name, buf + 1, len);
    free(buf);
}

/* Encode n values (taking their references) into *len bytes; self_call lets
 * objects through. The encoding's references are released again, so the
 * world stays as it was. */
static uint8_t *encode(size_t n, sr_value **vals, int self_call, size_t *len)
{
    int64_t size = sr__codec_size(n, vals, self_call);
    uint8_t *buf = size > 0 ? malloc((size_t)size) : NULL;
    if (!buf || sr__codec_encode(n, vals, self_call, buf, (size_t)size) != size) {
        fprintf(stderr, "gen_corpus: encode: %s\n", sr_last_error());
        exit(1);
    }
    sr__codec_release(buf, (size_t)size);
    for (size_t i = 0; i < n; i++)
        sr_value_unref(vals[i]);
    *len = (size_t)size;
    return buf;
}

static sr_value *tensor(int i) { return sr_value_from_tensor(fz.tensors[i]); }

static sr_value *strv(const char *s) { return sr_str(s); }

/* A raw RRef value: kind tag, rref id, fork id, owner, the owner's
 * generation (0) (module.c's layout). */
static size_t rref_wire(uint8_t *p, uint64_t rid, uint64_t fid, unsigned owner)
{
    p[0] = (uint8_t)SR_KIND_RREF;
    for (int i = 0; i < 8; i++) {
        p[1 + i] = (uint8_t)(rid >> (8 * i));
        p[9 + i] = (uint8_t)(fid >> (8 * i));
    }
    p[17] = (uint8_t)owner;
    p[18] = (uint8_t)(owner >> 8);
    memset(p + 19, 0, 4);
    return 1 + SR_RREF_WIRE_SIZE;
}

static uint64_t rid_of(int rank, uint64_t local) { return (uint64_t)rank << 48 | local; }

static void value_seeds(void)
{
    size_t len;
    uint8_t *b;
    static const uint8_t raw[] = {0, 1, 2, 255};
    sr_value *scalars[] = {sr_none(), sr_bool(true), sr_bool(false), sr_int(-1), sr_int(INT64_MAX),
                           sr_double(1.5), strv("abc"), strv(""), sr_bytes(raw, sizeof(raw))};
    b = encode(sizeof(scalars) / sizeof(scalars[0]), scalars, 0, &len);
    write_seed("values-scalars", FZ_VALUES, b, len);
    free(b);

    sr_value *inner[] = {sr_int(2), sr_list(0, NULL)};
    sr_value *mid[] = {sr_int(1), sr_list(2, inner)};
    sr_value_unref(inner[0]), sr_value_unref(inner[1]);
    sr_value *nested[] = {sr_list(2, mid), strv("x")};
    sr_value_unref(mid[0]), sr_value_unref(mid[1]);
    b = encode(2, nested, 0, &len);
    write_seed("values-nested-lists", FZ_VALUES, b, len);
    free(b);

    b = encode(0, NULL, 0, &len);
    write_seed("values-empty", FZ_VALUES, b, len);
    free(b);

    static const char *tnames[FZ_NTENSORS] = {"f32", "f32-transposed", "f64", "i64"};
    for (int i = 0; i < FZ_NTENSORS; i++) {
        char name[64];
        sr_value *one[1] = {tensor(i)};
        b = encode(1, one, 0, &len);
        snprintf(name, sizeof(name), "values-tensor-%s", tnames[i]);
        write_seed(name, FZ_VALUES, b, len);
        snprintf(name, sizeof(name), "release-tensor-%s", tnames[i]);
        write_seed(name, FZ_RELEASE, b, len);
        free(b);
    }

    sr_value *objs[] = {sr_value_ref(fz.object), sr_int(3)};
    b = encode(2, objs, 1, &len);
    write_seed("values-object", FZ_VALUES, b, len);
    write_seed("release-object", FZ_RELEASE, b, len);
    free(b);

    /* Sent twice, in flight once in the harness: the second is forged. */
    sr_value *twice[] = {sr_value_ref(fz.object), sr_value_ref(fz.object)};
    b = encode(2, twice, 1, &len);
    write_seed("values-object-twice", FZ_VALUES, b, len);
    free(b);

    /* 32 nested lists decode; a 33rd is too deep. */
    for (int depth = 32; depth <= 33; depth++) {
        uint8_t deep[4 + 33 * 5 + 1] = {1, 0, 0, 0};
        size_t n = 4;
        for (int k = 0; k < depth; k++) {
            deep[n++] = SR_KIND_LIST;
            deep[n++] = 1, deep[n++] = 0, deep[n++] = 0, deep[n++] = 0;
        }
        deep[n++] = SR_KIND_NONE;
        char name[64];
        snprintf(name, sizeof(name), "values-lists-%d-deep", depth);
        write_seed(name, FZ_VALUES, deep, n);
    }

    sr_value *in_list[] = {strv("w"), sr_value_ref(fz.object)};
    sr_value *mixed[] = {tensor(0), sr_list(2, in_list), sr_double(-0.0), tensor(3)};
    sr_value_unref(in_list[0]), sr_value_unref(in_list[1]);
    b = encode(4, mixed, 1, &len);
    write_seed("values-mixed", FZ_VALUES, b, len);
    free(b);
}

/* RRefs: this worker's own (rref id 0, fork id 1, see fuzz_env.h), a user
 * from its owner, a user from a third worker, and a child arriving at the
 * owner from another worker. */
static void rref_seeds(void)
{
    static const struct {
        const char *name;
        int rid_rank, fid_rank;
        uint64_t rid_local, fid_local;
        unsigned owner;
    } rrefs[] = {
        {"own-fork", 0, 0, 0, 1, 0},
        {"user-from-owner", 1, 1, 5, 6, 1},
        {"user-from-third", 1, 2, 5, 9, 1},
        {"child-at-owner", 0, 2, 0, 3, 0},
    };
    for (size_t i = 0; i < sizeof(rrefs) / sizeof(rrefs[0]); i++) {
        uint8_t b[4 + 1 + SR_RREF_WIRE_SIZE + 9] = {2, 0, 0, 0};
        size_t n = 4 + rref_wire(b + 4, rid_of(rrefs[i].rid_rank, rrefs[i].rid_local),
                                 rid_of(rrefs[i].fid_rank, rrefs[i].fid_local), rrefs[i].owner);
        b[n++] = SR_KIND_INT;
        for (int k = 0; k < 8; k++)
            b[n++] = (uint8_t)k;
        char name[64];
        snprintf(name, sizeof(name), "values-rref-%s", rrefs[i].name);
        write_seed(name, FZ_VALUES, b, n);
        snprintf(name, sizeof(name), "release-rref-%s", rrefs[i].name);
        write_seed(name, FZ_RELEASE, b, n);
    }
}

/* A message: the type, the slot (header and inline payload), then the
 * payload block's bytes when the payload does not fit inline. */
static void msg_seed(const char *name, uint16_t type, struct sr_wire w, const uint8_t *payload, size_t len)
{
    uint8_t buf[1 + FZ_SLOT_BYTES + 4096] = {0};
    buf[0] = (uint8_t)type;
    w.len = (uint32_t)len;
    if (len > SR_WIRE_INLINE) {
        w.flags |= SR_WIRE_BLOCK;
        w.p.block_off = fz.payload_off;
        memcpy(buf + 1 + FZ_SLOT_BYTES, payload, len);
    } else {
        memcpy(w.p.inl, payload, len);
        len = 0;
    }
    memcpy(buf + 1, &w, sizeof(w));
    write_seed(name, FZ_MSG, buf, 1 + FZ_SLOT_BYTES + len);
}

/* ext (NULL: none), then the name, then the encoded values. */
static size_t payload(uint8_t *p, const uint8_t *ext, size_t elen, const char *fn, size_t n, sr_value **vals, int self)
{
    size_t len, at = 0;
    if (elen) {
        memcpy(p, ext, elen);
        at += elen;
    }
    memcpy(p + at, fn, strlen(fn));
    at += strlen(fn);
    uint8_t *b = encode(n, vals, self, &len);
    memcpy(p + at, b, len);
    free(b);
    return at + len;
}

static void message_seeds(void)
{
    uint8_t p[4096];
    uint8_t da_ext[3 + 16] = {1, (uint8_t)sr__dist_module, 16};
    int64_t msg_id = 9;
    memcpy(da_ext + 3, &fz.dctx_id, 8); /* the context, then the message id */
    memcpy(da_ext + 11, &msg_id, 8);
    const uint8_t proxy_ext[] = {1, (uint8_t)sr__rref_module, 1, SR_RREF_EXT_PROXY};
    size_t n;

    sr_value *five[] = {sr_int(5)};
    n = payload(p, NULL, 0, "echo", 1, five, 0);
    msg_seed("msg-req-inline", SR_MSG_REQ, (struct sr_wire){.call_id = 1, .name_len = 4}, p, n);

    sr_value *two[] = {tensor(0), tensor(2)};
    n = payload(p, da_ext, sizeof(da_ext), "add", 2, two, 0);
    msg_seed("msg-req-block-ext", SR_MSG_REQ, (struct sr_wire){.call_id = 2, .name_len = 3, .flags = SR_WIRE_EXT}, p,
             n);

    sr_value *targs[] = {tensor(1), strv("unused argument of an unknown function")};
    n = payload(p, NULL, 0, "?nosuch", 2, targs, 0);
    msg_seed("msg-req-unknown-fn", SR_MSG_REQ, (struct sr_wire){.call_id = 3, .name_len = 7}, p, n);

    uint8_t rb[4 + 1 + SR_RREF_WIRE_SIZE] = {1, 0, 0, 0};
    size_t rn = 4 + rref_wire(rb + 4, rid_of(0, 0), rid_of(0, 1), 0);
    memcpy(p, proxy_ext, sizeof(proxy_ext));
    memcpy(p + sizeof(proxy_ext), "method", 6);
    memcpy(p + sizeof(proxy_ext) + 6, rb, rn);
    msg_seed("msg-req-rref-proxy", SR_MSG_REQ, (struct sr_wire){.call_id = 4, .name_len = 6, .flags = SR_WIRE_EXT},
             p, sizeof(proxy_ext) + 6 + rn);

    n = payload(p, NULL, 0, "", 0, NULL, 0);
    msg_seed("msg-mod-req-fetch", SR_MSG_MOD_REQ,
             (struct sr_wire){.call_id = 5, .ctrl = (uint8_t)sr__rref_module, .name_len = SR_RREF_FETCH, .tag = 0}, p, n);

    /* Distributed autograd's backward request: gradients for send
     * function 9 of the context, pass 1, no retain (backward.c, PROPAGATE). */
    sr_value *gargs[] = {sr_int(9), sr_int(1), sr_bool(false), tensor(2)};
    n = payload(p, NULL, 0, "", 4, gargs, 0);
    msg_seed("msg-mod-req-dist-propagate", SR_MSG_MOD_REQ,
             (struct sr_wire){.call_id = 14, .ctrl = (uint8_t)sr__dist_module, .name_len = SR_DA_PROPAGATE,
                              .tag = (uint64_t)fz.dctx_id},
             p, n);

    /* RRef.backward at the owner (rref_backward.c): [the RRef, retain],
     * outside any context, so the owner runs a local backward from the
     * scalar its OwnerRRef holds (fuzz_dispatch's FZ_OWNER_RID). */
    size_t bn = 4 + rref_wire(p + 4, FZ_OWNER_RID, rid_of(0, 1), 0);
    uint8_t *flag = encode(1, (sr_value *[]){sr_bool(false)}, 0, &n);
    memcpy(p, (const uint8_t[]){2, 0, 0, 0}, 4); /* two values */
    memcpy(p + bn, flag + 4, n - 4);
    free(flag);
    msg_seed("msg-mod-req-rref-backward", SR_MSG_MOD_REQ,
             (struct sr_wire){.call_id = 15, .ctrl = (uint8_t)sr__dist_module, .name_len = SR_DA_RREF_BACKWARD,
                              .tag = (uint64_t)SR_NO_CONTEXT},
             p, bn + n - 4);

    sr_value *kargs[] = {sr_int(9), strv("keep")};
    n = payload(p, NULL, 0, "make", 2, kargs, 0);
    msg_seed("msg-keep-call", SR_MSG_KEEP_CALL,
             (struct sr_wire){.call_id = 6, .ctrl = (uint8_t)sr__rref_module, .name_len = 4, .tag = rid_of(0, 7)}, p, n);

    sr_value *r42[] = {sr_int(42)};
    n = payload(p, NULL, 0, "", 1, r42, 0);
    msg_seed("msg-resp-inline", SR_MSG_RESP, (struct sr_wire){.call_id = 7}, p, n);

    sr_value *rt[] = {tensor(2)};
    n = payload(p, da_ext, sizeof(da_ext), "", 1, rt, 0);
    msg_seed("msg-resp-block-ext", SR_MSG_RESP, (struct sr_wire){.call_id = 8, .flags = SR_WIRE_EXT}, p, n);

    sr_value *kept[] = {strv("kept")};
    n = payload(p, NULL, 0, "", 1, kept, 0);
    msg_seed("msg-keep-ret-value", SR_MSG_KEEP_RET, (struct sr_wire){.call_id = 9, .flags = SR_WIRE_VALUE}, p, n);

    /* Found by fuzz_dispatch: a second request naming the autograd message
     * id of msg-req-block-ext leaked the first one's recv function, and a
     * module request for a module id past the table read beyond it. */
    sr_value *again[] = {tensor(2)};
    n = payload(p, da_ext, sizeof(da_ext), "echo", 1, again, 0);
    msg_seed("regress-autograd-message-id-twice", SR_MSG_REQ,
             (struct sr_wire){.call_id = 11, .name_len = 4, .flags = SR_WIRE_EXT}, p, n);
    n = payload(p, NULL, 0, "", 0, NULL, 0);
    msg_seed("regress-mod-req-unknown-module", SR_MSG_MOD_REQ,
             (struct sr_wire){.call_id = 12, .ctrl = 7, .name_len = 1, .tag = 0}, p, n);

    /* Found by fuzz_decode: a result whose autograd message id is -1 (the
     * id map's empty key) lost its recv function. */
    int64_t minus_one = -1;
    memcpy(da_ext + 11, &minus_one, 8);
    sr_value *rt2[] = {tensor(2)};
    n = payload(p, da_ext, sizeof(da_ext), "", 1, rt2, 0);
    msg_seed("regress-autograd-message-id-minus-one", SR_MSG_RESP,
             (struct sr_wire){.call_id = 13, .flags = SR_WIRE_EXT}, p, n);

    const char *err = "Error on Node 1: something went wrong far away";
    msg_seed("msg-err", SR_MSG_ERR, (struct sr_wire){.call_id = 10, .code = -EINVAL}, (const uint8_t *)err,
             strlen(err));
}

/* A module's raw message: its type, then the slot's bytes as it sent them
 * (sr__module_send). */
static void module_msg_seed(const char *name, int module, uint8_t type, const void *bytes, size_t len)
{
    uint8_t buf[1 + FZ_SLOT_BYTES] = {(uint8_t)SR_MSG_MODULE_TYPE(module, type)};
    memcpy(buf + 1, bytes, len);
    write_seed(name, FZ_MSG, buf, sizeof(buf));
}

/* Distributed autograd's cleanup of a context (cleanup.c): fuzz_decode's
 * context, one fuzz_dispatch does not know (a cleanup that overtook it). */
static void module_msg_seeds(void)
{
    module_msg_seed("msg-mod-dist-cleanup", sr__dist_module, SR_DA_MSG_CLEANUP, &fz.dctx_id, sizeof(fz.dctx_id));
}

static void ctrl_seed(const char *name, uint8_t src, uint8_t kind, uint64_t token, uint64_t a, uint64_t b, uint64_t c)
{
    uint8_t buf[1 + FZ_SLOT_BYTES] = {src};
    struct sr_rref_msg w = {.token = token, .kind = kind, .args = {a, b, c}};
    memcpy(buf + 1, &w, sizeof(w));
    write_seed(name, FZ_RREF_CTRL, buf, sizeof(buf));
}

static void ctrl_seeds(void)
{
    ctrl_seed("rref-ctrl-fork-request", 1, SR_RREF_FORK_REQUEST, 11, rid_of(0, 0), rid_of(1, 4), 0);
    ctrl_seed("rref-ctrl-child-accept", 1, SR_RREF_CHILD_ACCEPT, 12, FZ_USER_RID, rid_of(0, 2), 0);
    ctrl_seed("rref-ctrl-user-delete", 1, SR_RREF_USER_DELETE, 13, rid_of(0, 0), rid_of(0, 1), 1 << 1 | 1);
    ctrl_seed("rref-ctrl-ack", 1, SR_RREF_ACK, 1, 0, 0, 0);
}

/* ---- the file fuzzer's seeds (fuzz_files.c) ---- */

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = malloc(1 << 20);
    *len = f && buf ? fread(buf, 1, 1 << 20, f) : 0;
    if (!f || !buf || !*len || !feof(f)) {
        fprintf(stderr, "gen_corpus: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    return buf;
}

/* A file seed: the kind byte, then body (and, for IDX, a second part). */
static void file_seed(const char *name, uint8_t kind, const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    uint8_t *buf = malloc(3 + alen + blen);
    size_t n = 0;
    buf[n++] = kind;
    if (kind == 1) { /* the images file's length, then both files */
        buf[n++] = (uint8_t)alen;
        buf[n++] = (uint8_t)(alen >> 8);
    }
    memcpy(buf + n, a, alen);
    if (blen)
        memcpy(buf + n + alen, b, blen);
    write_file(files_dir, name, buf, n + alen + blen);
    free(buf);
}

static void checkpoint_seed(const char *name, size_t n, const char *const *names, sr_tensor *const *ts, size_t nmeta)
{
    char path[] = "/tmp/shmrpc-gen-corpus-XXXXXX";
    int fd = mkstemp(path);
    const char *mnames[] = {"epoch", "step"};
    const int64_t mvals[] = {3, -42};
    if (fd < 0 || sr_checkpoint_save(path, n, names, ts, nmeta, mnames, mvals)) {
        fprintf(stderr, "gen_corpus: cannot save a checkpoint at %s: %s\n", path, sr_last_error());
        exit(1);
    }
    close(fd);
    size_t len;
    uint8_t *img = slurp(path, &len);
    unlink(path);
    file_seed(name, 0, img, len, NULL, 0);
    free(img);
}

/* An IDX file: big-endian magic and dims, then the bytes. */
static size_t idx_file(uint8_t *out, uint32_t magic, int ndim, const uint32_t *dims, const uint8_t *data, size_t len)
{
    size_t n = 0;
    for (int i = -1; i < ndim; i++) {
        uint32_t v = i < 0 ? magic : dims[i];
        for (int k = 3; k >= 0; k--)
            out[n++] = (uint8_t)(v >> (8 * k));
    }
    memcpy(out + n, data, len);
    return n + len;
}

static size_t gzipped(uint8_t *out, size_t cap, const uint8_t *in, size_t len)
{
    char path[] = "/tmp/shmrpc-gen-corpus-XXXXXX";
    int fd = mkstemp(path);
    gzFile g = fd >= 0 ? gzdopen(fd, "wb9") : NULL;
    if (!g || gzwrite(g, in, (unsigned)len) != (int)len || gzclose(g) != Z_OK) {
        fprintf(stderr, "gen_corpus: cannot gzip into %s\n", path);
        exit(1);
    }
    size_t n;
    uint8_t *buf = slurp(path, &n);
    unlink(path);
    if (n > cap) {
        fprintf(stderr, "gen_corpus: %zu gzipped bytes do not fit the seed's %zu\n", n, cap);
        exit(1);
    }
    memcpy(out, buf, n);
    free(buf);
    return n;
}

static void file_seeds(void)
{
    const char *names[] = {"fc.weight", "fc.weight_t", "fc.bias", "steps"};
    checkpoint_seed("ckpt-four-tensors", 4, names, fz.tensors, 2);
    checkpoint_seed("ckpt-one-tensor-no-meta", 1, names, fz.tensors, 0);
    checkpoint_seed("ckpt-meta-only", 0, NULL, NULL, 2);

    enum { N = 3, PX = 28 * 28 };
    static uint8_t pixels[N * PX], img[16 + N * PX], lab[8 + N], gz[8192];
    for (size_t i = 0; i < sizeof(pixels); i++)
        pixels[i] = (uint8_t)(i * 7);
    const uint8_t labels[N] = {3, 9, 0};
    size_t ni = idx_file(img, 0x00000803u, 3, (const uint32_t[]){N, 28, 28}, pixels, sizeof(pixels));
    size_t nl = idx_file(lab, 0x00000801u, 1, (const uint32_t[]){N}, labels, N);
    file_seed("idx-three-samples", 1, img, ni, lab, nl);
    size_t ngz = gzipped(gz, sizeof(gz), img, ni);
    file_seed("idx-three-samples-gzip", 1, gz, ngz, lab, nl);
}

/* ---- the segment fuzzer's seeds (fuzz_segment.c) ----
 * The generator is the only process and thread that ever sees these
 * segments: their atomic fields are written with plain seq_cst stores that
 * pair with nothing. */

/* Every rank attached, with a name and a pid, as after the start barrier. */
static void seg_attached(sr_segment *s)
{
    for (uint32_t r = 0; r < s->world; r++) {
        struct sr_worker_info *w = sr__seg_worker(s, (int)r);
        w->pid = 1000 + (int32_t)r;
        w->doorbell_kind = SR_DOORBELL_FUTEX;
        snprintf(w->name, sizeof(w->name), "worker%u", r);
        atomic_store(&w->state, SR_WORKER_ATTACHED);
    }
}

/* Rank 1 killed while serving a call from rank 0 (its crash report), rank
 * 2 exited with status 3 after a graceful shutdown. */
static void seg_exits(sr_segment *s)
{
    seg_attached(s);
    struct sr_worker_info *w = sr__seg_worker(s, 1);
    w->exit_code = 2; /* CLD_KILLED */
    w->exit_status = 11;
    w->exit_seq = 1;
    w->crash_caller = 0;
    snprintf(w->crash_fn, sizeof(w->crash_fn), "train_step");
    atomic_store(&w->crashed, 1);
    atomic_store(&w->exited, 1);
    w = sr__seg_worker(s, 2);
    atomic_store(&w->state, SR_WORKER_DETACHED);
    w->exit_code = 1; /* CLD_EXITED */
    w->exit_status = 3;
    w->exit_seq = 2;
    atomic_store(&w->exited, 1);
    atomic_store(&s->hdr->exits, 2);
}

/* Rank 0's area owned, rank 1's quarantined: the heap's attach as rank 0
 * takes a spare. */
static void seg_areas(sr_segment *s)
{
    seg_attached(s);
    atomic_store(&sr__seg_area(s, 0)->state, sr__area_word(SR_AREA_OWNED, 0, 1));
    atomic_store(&sr__seg_area(s, 1)->state, sr__area_word(SR_AREA_QUARANTINED, 1, 1));
    atomic_store(&sr__seg_area(s, 1)->foreign, 3);
}

/* Found by fuzz_segment: a worker table off its cache-line alignment was
 * accepted, and its lines' fields (atomics among them) read misaligned. */
static void seg_misaligned(sr_segment *s) { s->hdr->table_off += 4; }

/* Rank 0's inbox as a running job leaves it: 5 messages from rank 1, 2
 * read and freed, 1 read and held (the consumer detached), and a claim of
 * rank 1's not yet published. */
static void seg_ring(sr_segment *s)
{
    seg_attached(s);
    struct sr_ring *r = sr__seg_inbox(s, 0);
    sr_msg m[2] = {{.type = 1, .src = 1}};
    struct sr_ring_cons c;
    char why[128];
    uint32_t at;
    for (int i = 0; i < 5; i++)
        sr__ring_enqueue(r, s->ring_slots, 1, &m[0]);
    if (sr__ring_cons_attach(&c, r, s->ring_slots, why, sizeof(why)) || sr__ring_dequeue_burst(&c, m, 2) != 2 ||
        sr__ring_read_burst(&c, m, 1) != 1 || sr__ring_claim(r, s->ring_slots, 1, &at)) {
        fprintf(stderr, "gen_corpus: the ring seed: %s\n", why);
        exit(1);
    }
    sr__ring_cons_detach(&c);
}

/* Rank 0's inbox as a consumer about to sleep leaves it (shm/doorbell.h,
 * "Watching the head"): 3 messages read and freed, the free slot at its
 * head watched; claim: and then a claim of it by rank 1, not yet
 * published, and watched again (the ring's claim watch). */
static void seg_ring_watch(sr_segment *s, bool claim)
{
    seg_attached(s);
    struct sr_ring *r = sr__seg_inbox(s, 0);
    sr_msg m[3] = {{.type = 1, .src = 1}};
    struct sr_ring_cons c;
    char why[128] = "";
    uint32_t at;
    for (int i = 0; i < 3; i++)
        sr__ring_enqueue(r, s->ring_slots, 1, &m[0]);
    bool ok = !sr__ring_cons_attach(&c, r, s->ring_slots, why, sizeof(why)) && sr__ring_dequeue_burst(&c, m, 3) == 3 &&
              sr__ring_watch(&c) && (!claim || (sr__ring_claim(r, s->ring_slots, 1, &at) == 1 && sr__ring_watch(&c)));
    if (!ok) {
        fprintf(stderr, "gen_corpus: the watched ring seed: %s\n", why);
        exit(1);
    }
    sr__ring_cons_detach(&c);
}

static void seg_ring_watched(sr_segment *s) { seg_ring_watch(s, false); }
static void seg_ring_claim_watched(sr_segment *s) { seg_ring_watch(s, true); }

/* recover: the fuzzer's consumer attaches to the ring as a dead one's
 * successor (its input's first byte, bit 2). */
static void segment_seed(const char *name, int world, bool recover, uint32_t flags, int launched,
                         void (*edit)(sr_segment *))
{
    sr_segment_opts o = fz_segment_opts(world);
    o.flags = flags;
    o.launched = launched;
    sr_segment s;
    static uint8_t buf[1 + 8192];
    if (sr__segment_create(&o, &s)) {
        fprintf(stderr, "gen_corpus: cannot create a segment: %s\n", sr_last_error());
        exit(1);
    }
    if (edit)
        edit(&s);
    buf[0] = (uint8_t)(world - 1) | (recover ? 4 : 0);
    size_t n = fz_segment_image(&s, buf + 1, sizeof(buf) - 1);
    write_file(segment_dir, name, buf, 1 + n);
    sr__segment_detach(&s, true);
}

static void segment_seeds(void)
{
    segment_seed("segment-one-worker", 1, false, 0, 0, NULL);
    segment_seed("segment-attached", 2, false, 0, 0, seg_attached);
    segment_seed("segment-exit-and-crash", 3, false, 0, 0, seg_exits);
    segment_seed("segment-elastic-two-free", 4, false, SR_SEG_F_ELASTIC, 2, seg_attached);
    segment_seed("segment-replace-areas-taken", 2, false, SR_SEG_F_REPLACE, 0, seg_areas);
    segment_seed("segment-ring-in-use", 2, false, 0, 0, seg_ring);
    segment_seed("segment-ring-in-use-recovered", 2, true, 0, 0, seg_ring);
    segment_seed("segment-ring-head-watched", 2, false, 0, 0, seg_ring_watched);
    segment_seed("segment-ring-claim-watched", 2, false, 0, 0, seg_ring_claim_watched);
    segment_seed("segment-ring-claim-watched-recovered", 2, true, 0, 0, seg_ring_claim_watched);
    segment_seed("regress-misaligned-worker-table", 2, false, 0, 0, seg_misaligned);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s CORPUS_DIR DISPATCH_CORPUS_DIR FILES_CORPUS_DIR SEGMENT_CORPUS_DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    dispatch_dir = argv[2];
    files_dir = argv[3];
    segment_dir = argv[4];
    fz_env_init();
    fz_iter_begin();
    value_seeds();
    rref_seeds();
    message_seeds();
    module_msg_seeds();
    ctrl_seeds();
    file_seeds();
    segment_seeds();
    fz_iter_end();
    return 0;
}
