/* SPDX-License-Identifier: MIT */
/* Wire codec for value lists (format and contract in codec.h).
 *
 * Encoding is two steps: size (validates every value: kinds that cannot be
 * sent, tensors outside the shared heap, depth, lengths) and write. Writing
 * takes one reference per object for the receiver and records it in flight
 * (inflight.h), and one block reference per tensor (its descriptor's, see
 * tensor/desc.h); if a step fails, the references already taken are dropped
 * again, so a failed encode holds none.
 *
 * Decoding walks the buffer up to three times with one walker:
 *   CHECK    validates everything, allocates nothing, consumes nothing;
 *   BUILD    constructs the values, adopting the buffer's references;
 *   RELEASE  consumes the buffer's references without building anything.
 * A tensor descriptor's block reference is dropped by BUILD (after the
 * tensor took its own) or by RELEASE: exactly once per well-formed buffer.
 * A malformed buffer fails in CHECK, so -EBADMSG leaves its references alone
 * (a malformed buffer's references cannot be trusted, and are not dropped). If
 * BUILD fails part-way (-ENOMEM, or an object claimed twice by a forged
 * buffer), the walker switches to RELEASE for the rest, so after
 * sr__codec_decode() returns 0 or -ENOMEM the buffer holds no references.
 */
#include "codec.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "heap.h"
#include "inflight.h"
#include "value_internal.h"
#include "desc.h"
#include "module.h"

/* Beyond this an encoding could not be held in memory anyway; it also keeps
 * the running size sum far from int64 overflow. */
#define SR_CODEC_MAX_TOTAL (INT64_C(1) << 62)

#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define to_le16(x) __builtin_bswap16(x)
#define to_le32(x) __builtin_bswap32(x)
#define to_le64(x) __builtin_bswap64(x)
#else
#define to_le16(x) (x)
#define to_le32(x) (x)
#define to_le64(x) (x)
#endif

#define TENSOR_DESC_BYTES ((int64_t)sizeof(struct sr_tensor_desc))

/* The message of a nested error without its "worker<R>: " prefix, which the
 * outer message (and the RPC error "Error on Node R") already carries. */
static const char *error_detail(const char *msg)
{
    const char *p = msg;
    if (strncmp(p, "worker", 6) != 0)
        return msg;
    for (p += 6; *p >= '0' && *p <= '9'; p++)
        ;
    return p[0] == ':' && p[1] == ' ' ? p + 2 : msg;
}

/* ---- size ---------------------------------------------------------------- */

static int64_t value_size(const sr_value *v, int self_call, const char *fn);

static int64_t items_size(size_t n, sr_value *const *vals, int self_call, const char *fn)
{
    int64_t total = 4; /* the count */
    for (size_t i = 0; i < n; i++) {
        if (!vals[i])
            return sr__fail(-EINVAL, fn, "value %zu of %zu is NULL", i, n);
        int64_t s = value_size(vals[i], self_call, fn);
        if (s < 0)
            return s;
        total += s;
        if (total > SR_CODEC_MAX_TOTAL)
            return sr__fail(-EMSGSIZE, fn, "the encoding exceeds %" PRId64 " bytes", SR_CODEC_MAX_TOTAL);
    }
    return total;
}

static int64_t blob_size(const sr_value *v, const char *fn)
{
    if (v->u.len > SR_CODEC_MAX_LEN)
        return sr__fail(-EMSGSIZE, fn, "a %s of %zu bytes exceeds the codec limit of %u bytes",
                        sr_kind_name((sr_kind)v->kind), v->u.len, SR_CODEC_MAX_LEN);
    return 1 + 4 + (int64_t)v->u.len;
}

static int64_t list_size(const sr_value *v, int self_call, const char *fn)
{
    int64_t s = items_size(v->u.n, sr__list_items(v), self_call, fn);
    return s < 0 ? s : 1 + s;
}

/* What sr__tensor_to_desc() will need at encode time, checked without
 * taking a reference: the storage must be a block of the shared heap. */
static int64_t tensor_size(const sr_value *v, const char *fn)
{
    if (!sr__tensor_sendable(v->u.tensor)) {
        char repr[96];
        return sr__fail(-EINVAL, fn, "%s cannot be sent: its storage is a private block, not in the shared "
                        "heap (was sr__heap_attach called before it was made?)", sr__value_repr(v, repr, sizeof(repr)));
    }
    return 1 + TENSOR_DESC_BYTES;
}

static int64_t value_size(const sr_value *v, int self_call, const char *fn)
{
    switch ((sr_kind)v->kind) {
    case SR_KIND_NONE: return 1;
    case SR_KIND_BOOL: return 2;
    case SR_KIND_INT:
    case SR_KIND_DOUBLE: return 9;
    case SR_KIND_STR:
    case SR_KIND_BYTES: return blob_size(v, fn);
    case SR_KIND_LIST:
        if (v->depth > SR_CODEC_MAX_DEPTH)
            return sr__fail(-EINVAL, fn, "a list nested %d deep exceeds the codec's limit of %d",
                            v->depth, SR_CODEC_MAX_DEPTH);
        if (v->u.n > SR_CODEC_MAX_LEN)
            return sr__fail(-EMSGSIZE, fn, "a list of %zu items exceeds the codec limit of %u",
                            v->u.n, SR_CODEC_MAX_LEN);
        return list_size(v, self_call, fn);
    case SR_KIND_OBJECT:
        if (!self_call)
            return sr__fail(-EINVAL, fn, "object of type '%s' is owner-local and cannot be sent to another worker",
                            v->u.obj.type);
        if (strlen(v->u.obj.type) > SR_CODEC_MAX_LEN)
            return sr__fail(-EMSGSIZE, fn, "an object type name exceeds %u bytes", SR_CODEC_MAX_LEN);
        return 1 + 4 + 4 + 8 + 4 + (int64_t)strlen(v->u.obj.type);
    case SR_KIND_TENSOR: return tensor_size(v, fn);
    default: break;
    }
    const sr_value_kind_ops *k = sr__value_kind(v->kind); /* a module's kind (module.h) */
    if (k) {
        int rc = k->sendable ? k->sendable(v->u.mod, fn) : 0; /* a failed remote(): "RRef creation ..." */
        return rc ? rc : 1 + k->wire_size;
    }
    return sr__fail(-EINVAL, fn, "a value has the unknown kind %d", v->kind);
}

static int64_t encoded_size(size_t n, sr_value *const *vals, int self_call, const char *fn)
{
    if (n && !vals)
        return sr__fail(-EINVAL, fn, "NULL values with n = %zu", n);
    if (n > SR_CODEC_MAX_LEN)
        return sr__fail(-EMSGSIZE, fn, "%zu values exceed the codec limit of %u", n, SR_CODEC_MAX_LEN);
    return items_size(n, vals, self_call, fn);
}

/* No values, or one None: what most requests and answers of small calls
 * carry (a no-op's arguments, a function that returns nothing). Their
 * encoding is fixed ([count 0] or [count 1][NONE]), so size, encode and
 * decode skip the walk: a no-op call makes four such steps. */
static bool lone_none(size_t n, sr_value *const *vals)
{
    return n == 1 && vals && vals[0] && vals[0]->kind == SR_KIND_NONE;
}

int64_t sr__codec_size(size_t n, sr_value *const *vals, int self_call)
{
    if (n == 0)
        return 4;
    if (lone_none(n, vals))
        return 5;
    return encoded_size(n, vals, self_call, __func__);
}

/* ---- encode --------------------------------------------------------------- */

struct enc {
    uint8_t *p;          /* next byte to write; the size was checked beforehand */
    size_t refs_taken;   /* object and tensor-block references taken so far */
    size_t mods_encoded; /* module values encoded so far (undone if the encode fails) */
    int to;              /* the destination rank, -1 if not known */
};

static void put_u8(struct enc *e, uint8_t x) { *e->p++ = x; }

static void put_u16(struct enc *e, uint16_t x)
{
    x = to_le16(x);
    memcpy(e->p, &x, 2);
    e->p += 2;
}

static void put_u32(struct enc *e, uint32_t x)
{
    x = to_le32(x);
    memcpy(e->p, &x, 4);
    e->p += 4;
}

static void put_u64(struct enc *e, uint64_t x)
{
    x = to_le64(x);
    memcpy(e->p, &x, 8);
    e->p += 8;
}

static void put_blob(struct enc *e, const void *data, size_t n)
{
    put_u32(e, (uint32_t)n);
    memcpy(e->p, data, n);
    e->p += n;
}

static int put_object(struct enc *e, sr_value *v)
{
    /* The receiver's reference: adopted by the decoder, dropped by release. */
    int rc = sr__inflight_add(sr_value_ref(v));
    if (rc) {
        sr_value_unref(v);
        return rc;
    }
    e->refs_taken++;
    put_u32(e, (uint32_t)getpid()); /* only objects pay for the syscall */
    put_u32(e, (uint32_t)sr__error_rank());
    put_u64(e, (uint64_t)(uintptr_t)v);
    put_blob(e, v->u.obj.type, strlen(v->u.obj.type));
    return 0;
}

/* The descriptor, field by field in the order of struct sr_tensor_desc. */
static void put_desc(struct enc *e, const struct sr_tensor_desc *d)
{
    put_u32(e, d->magic);
    put_u8(e, d->dtype);
    put_u8(e, d->ndim);
    put_u16(e, d->flags);
    put_u64(e, (uint64_t)d->offset);
    put_u64(e, d->block);
    for (int i = 0; i < SR_MAX_DIMS; i++)
        put_u64(e, (uint64_t)d->shape[i]);
    for (int i = 0; i < SR_MAX_DIMS; i++)
        put_u64(e, (uint64_t)d->strides[i]);
}

static int put_tensor(struct enc *e, sr_value *v)
{
    struct sr_tensor_desc d;
    /* Takes the descriptor's block reference, dropped exactly once: by the
     * decoder after the receiver's tensor took its own, by sr__codec_release()
     * for a message never decoded, or by unwind_refs() if this encode fails. */
    int rc = sr__tensor_to_desc(v->u.tensor, &d);
    if (rc)
        return rc;
    e->refs_taken++;
    put_desc(e, &d);
    return 0;
}

/* A module's value: its own bytes (an RRef makes a new fork for the
 * receiver). */
static int put_module(struct enc *e, sr_value *v)
{
    const sr_value_kind_ops *k = sr__value_kind(v->kind);
    int rc = k->encode(v->u.mod, e->to, e->p);
    if (rc)
        return rc;
    e->mods_encoded++;
    e->p += k->wire_size;
    return 0;
}

static int put_items(struct enc *e, size_t n, sr_value *const *vals);

/* Only kinds that passed encoded_size() reach here. */
static int put_value(struct enc *e, sr_value *v)
{
    put_u8(e, v->kind);
    switch ((sr_kind)v->kind) {
    case SR_KIND_BOOL: put_u8(e, v->u.b); break;
    case SR_KIND_INT: put_u64(e, (uint64_t)v->u.i); break;
    case SR_KIND_DOUBLE: {
        uint64_t bits;
        memcpy(&bits, &v->u.d, 8);
        put_u64(e, bits);
        break;
    }
    case SR_KIND_STR:
    case SR_KIND_BYTES: put_blob(e, v->tail, v->u.len); break;
    case SR_KIND_LIST: return put_items(e, v->u.n, sr__list_items(v));
    case SR_KIND_OBJECT: return put_object(e, v);
    case SR_KIND_TENSOR: return put_tensor(e, v);
    default: return v->kind >= SR_KIND_MODULE ? put_module(e, v) : 0;
    }
    return 0;
}

static int put_items(struct enc *e, size_t n, sr_value *const *vals)
{
    put_u32(e, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        int rc = put_value(e, vals[i]);
        if (rc)
            return rc;
    }
    return 0;
}

/* Drop the first *left references that put_items() took, visiting the
 * values in the same order with a cursor over the bytes written (as
 * unwind_mods does). A tensor's reference is dropped through the block
 * offset its descriptor names, not through the tensor: another thread may
 * have written the tensor in place since, moving its storage to a copy
 * (desc.h). */
static void unwind_refs(const uint8_t **cur, size_t n, sr_value *const *vals, size_t *left, int self_call)
{
    for (size_t i = 0; i < n && *left; i++) {
        sr_value *v = vals[i];
        if (v->kind == SR_KIND_OBJECT) {
            sr_value_unref(sr__inflight_claim((uint64_t)(uintptr_t)v));
            --*left;
            *cur += value_size(v, self_call, __func__);
        } else if (v->kind == SR_KIND_TENSOR) {
            uint64_t off; /* tag, magic, dtype, ndim, flags, offset, then the block */
            memcpy(&off, *cur + 1 + 4 + 1 + 1 + 2 + 8, 8);
            sr__block_unref(sr__block_recv_off(to_le64(off))); /* back out of the unsent message */
            --*left;
            *cur += 1 + TENSOR_DESC_BYTES;
        } else if (v->kind == SR_KIND_LIST) {
            *cur += 1 + 4;
            unwind_refs(cur, v->u.n, sr__list_items(v), left, self_call);
        } else {
            *cur += value_size(v, self_call, __func__);
        }
    }
}

/* Undo the first *left RRef forks that put_items() made, visiting the values
 * in the same order with a cursor over the bytes written, where each fork id
 * is (sizes come from value_size, as when they were written). */
static void unwind_mods(const uint8_t **cur, size_t n, sr_value *const *vals, size_t *left, int self_call)
{
    for (size_t i = 0; i < n && *left; i++) {
        sr_value *v = vals[i];
        const sr_value_kind_ops *k = sr__value_kind(v->kind);
        if (k) {
            k->unencode(v->u.mod, *cur + 1);
            --*left;
            *cur += 1 + k->wire_size;
        } else if (v->kind == SR_KIND_LIST) {
            *cur += 1 + 4;
            unwind_mods(cur, v->u.n, sr__list_items(v), left, self_call);
        } else {
            *cur += value_size(v, self_call, __func__);
        }
    }
}

int64_t sr__codec_encode(size_t n, sr_value *const *vals, int self_call, uint8_t *buf, size_t cap)
{
    return sr__codec_encode_to(n, vals, self_call, -1, buf, cap);
}

int64_t sr__codec_encode_to(size_t n, sr_value *const *vals, int self_call, int to, uint8_t *buf, size_t cap)
{
    static const char fn[] = "sr__codec_encode";
    bool fixed = n == 0 || lone_none(n, vals); /* the two fixed encodings: no references to take */
    int64_t size = fixed ? 4 + (int64_t)n : encoded_size(n, vals, self_call, fn);
    if (size < 0)
        return size;
    if (!buf || cap < (uint64_t)size)
        return sr__fail(-ENOSPC, fn, "a buffer of %zu bytes cannot hold the %" PRId64 "-byte encoding",
                        buf ? cap : 0, size);
    struct enc e = {.p = buf, .to = to};
    if (fixed) {
        put_u32(&e, (uint32_t)n);
        if (n)
            put_u8(&e, SR_KIND_NONE);
        return size;
    }
    int rc = put_items(&e, n, vals);
    if (rc) {
        const uint8_t *cur = buf + 4;
        unwind_refs(&cur, n, vals, &e.refs_taken, self_call);
        cur = buf + 4;
        unwind_mods(&cur, n, vals, &e.mods_encoded, self_call);
        return rc;
    }
    return size;
}

/* ---- decode --------------------------------------------------------------- */

/* VISIT: the structure only (bounds, tags, lengths), handing each tensor
 * descriptor's block field to a visitor; nothing is checked against the
 * heap (the marshalling of messages between hosts, sr__codec_visit_tensors). */
enum walk_mode { CHECK, BUILD, RELEASE, VISIT };

struct dec {
    const uint8_t *buf;
    size_t len, pos;
    enum walk_mode mode;
    int err;            /* BUILD's failure; the rest of the walk is RELEASE */
    const char *fn;
    int (*visit)(void *arg, uint8_t *block_field); /* VISIT */
    void *visit_arg;
};

__attribute__((format(printf, 3, 4)))
static int bad(const struct dec *d, size_t at, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return sr__fail(-EBADMSG, d->fn, "offset %zu: %s", at, msg);
}

static size_t left(const struct dec *d) { return d->len - d->pos; }

static int need(struct dec *d, size_t n, const char *what)
{
    if (left(d) < n)
        return bad(d, d->pos, "%s needs %zu byte%s, %zu left", what, n, n == 1 ? "" : "s", left(d));
    return 0;
}

static int get_u8(struct dec *d, const char *what, uint8_t *x)
{
    int rc = need(d, 1, what);
    if (!rc)
        *x = d->buf[d->pos++];
    return rc;
}

static int get_u32(struct dec *d, const char *what, uint32_t *x)
{
    int rc = need(d, 4, what);
    if (!rc) {
        memcpy(x, d->buf + d->pos, 4);
        *x = to_le32(*x);
        d->pos += 4;
    }
    return rc;
}

static int get_u64(struct dec *d, const char *what, uint64_t *x)
{
    int rc = need(d, 8, what);
    if (!rc) {
        memcpy(x, d->buf + d->pos, 8);
        *x = to_le64(*x);
        d->pos += 8;
    }
    return rc;
}

/* A length or count, checked against the bytes that remain before anything
 * proportional to it is allocated: each unit needs at least one byte. */
static int get_len(struct dec *d, const char *what, uint32_t *n)
{
    size_t at = d->pos;
    int rc = get_u32(d, what, n);
    if (rc)
        return rc;
    if (*n > SR_CODEC_MAX_LEN)
        return bad(d, at, "%s %" PRIu32 " exceeds the limit of %u", what, *n, SR_CODEC_MAX_LEN);
    if (*n > left(d))
        return bad(d, at, "%s %" PRIu32 " runs past the end (%zu bytes left)", what, *n, left(d));
    return 0;
}

/* In BUILD, keep v (or note that building failed and release the rest). */
static void built(struct dec *d, sr_value *v, sr_value **out)
{
    if (d->mode != BUILD)
        return;
    if (!v) {
        d->err = -ENOMEM;
        d->mode = RELEASE;
    }
    *out = v;
}

static int walk_value(struct dec *d, int depth, sr_value **out);

/* Items are built only while list is (BUILD), so a built item always has a
 * list to go into. */
static int walk_items(struct dec *d, int depth, uint32_t n, sr_value *list)
{
    for (uint32_t i = 0; i < n; i++) {
        sr_value *item = NULL;
        int rc = walk_value(d, depth, &item);
        if (item)
            sr__list_set(list, i, item);
        if (rc)
            return rc;
    }
    return 0;
}

static int walk_list(struct dec *d, size_t at, int depth, sr_value **out)
{
    if (depth >= SR_CODEC_MAX_DEPTH)
        return bad(d, at, "lists nested deeper than %d", SR_CODEC_MAX_DEPTH);
    uint32_t n;
    int rc = get_len(d, "list length", &n);
    if (rc)
        return rc;
    sr_value *list = NULL;
    if (d->mode == BUILD)
        built(d, sr__list_alloc(n), &list);
    rc = walk_items(d, depth + 1, n, list);
    *out = list; /* even on failure: the caller owns what was built */
    return rc;
}

static int walk_blob(struct dec *d, uint8_t tag, sr_value **out)
{
    size_t at = d->pos;
    uint32_t n;
    int rc = get_len(d, tag == SR_KIND_STR ? "string length" : "bytes length", &n);
    if (rc)
        return rc;
    const uint8_t *p = d->buf + d->pos;
    d->pos += n;
    if (d->mode == CHECK && tag == SR_KIND_STR) {
        const uint8_t *nul = memchr(p, 0, n);
        if (nul)
            return bad(d, at + 4 + (size_t)(nul - p), "string of length %" PRIu32 " contains a NUL byte", n);
    }
    if (d->mode == BUILD)
        built(d, tag == SR_KIND_STR ? sr__str_n((const char *)p, n) : sr_bytes(p, n), out);
    return 0;
}

static int object_check(struct dec *d, size_t at, uint32_t pid, int32_t rank, uint64_t addr,
                        const char *type, uint32_t tlen)
{
    int tl = tlen < 64 ? (int)tlen : 64;
    if (pid != (uint32_t)getpid()) {
        if (rank >= 0)
            return bad(d, at, "object of type '%.*s' is owner-local and cannot leave worker %d (pid %" PRIu32 ")",
                       tl, type, rank, pid);
        return bad(d, at, "object of type '%.*s' is owner-local and cannot leave its process (pid %" PRIu32 ")",
                   tl, type, pid);
    }
    if (rank != sr__error_rank()) /* the pid is ours, so the rank must be too: a corrupt buffer */
        return bad(d, at, "object of type '%.*s' claims rank %d but this process is rank %d",
                   tl, type, rank, sr__error_rank());
    if (!sr__inflight_has(addr, type, tlen))
        return bad(d, at, "object %#" PRIx64 " of type '%.*s' is not in flight in this process", addr, tl, type);
    return 0;
}

static int walk_object(struct dec *d, size_t at, sr_value **out)
{
    uint32_t pid, rank, tlen;
    uint64_t addr;
    int rc;
    if ((rc = get_u32(d, "object owner pid", &pid)) || (rc = get_u32(d, "object owner rank", &rank)) ||
        (rc = get_u64(d, "object pointer", &addr)) || (rc = get_len(d, "object type length", &tlen)))
        return rc;
    const char *type = (const char *)d->buf + d->pos;
    d->pos += tlen;
    if (d->mode == VISIT)
        return 0;
    if (d->mode == CHECK)
        return object_check(d, at, pid, (int32_t)rank, addr, type, tlen);
    /* The buffer's reference passes to the decoded value, or is dropped. */
    sr_value *v = sr__inflight_claim(addr);
    if (d->mode == RELEASE) {
        sr_value_unref(v);
    } else if (!v) { /* a forged buffer names an object more often than it was sent */
        d->err = bad(d, at, "object %#" PRIx64 " was already claimed", addr);
        d->mode = RELEASE;
    } else {
        *out = v;
    }
    return 0;
}

static uint16_t rd16(const uint8_t *p)
{
    uint16_t x;
    memcpy(&x, p, 2);
    return to_le16(x);
}

static uint32_t rd32(const uint8_t *p)
{
    uint32_t x;
    memcpy(&x, p, 4);
    return to_le32(x);
}

static uint64_t rd64(const uint8_t *p)
{
    uint64_t x;
    memcpy(&x, p, 8);
    return to_le64(x);
}

/* The wire layout of a descriptor is its struct's field order, packed. */
_Static_assert(offsetof(struct sr_tensor_desc, shape) == 24 &&
                   offsetof(struct sr_tensor_desc, strides) == 24 + 8 * SR_MAX_DIMS,
               "put_desc and get_desc follow struct sr_tensor_desc");

#define DESC_BLOCK_AT 16 /* the block field's offset in a descriptor's bytes (get_desc) */

/* The fixed-size descriptor; every field is read, none is trusted yet. */
static int get_desc(struct dec *d, struct sr_tensor_desc *t)
{
    int rc = need(d, (size_t)TENSOR_DESC_BYTES, "tensor descriptor");
    if (rc)
        return rc;
    const uint8_t *p = d->buf + d->pos;
    t->magic = rd32(p);
    t->dtype = p[4];
    t->ndim = p[5];
    t->flags = rd16(p + 6);
    t->offset = (int64_t)rd64(p + 8);
    t->block = rd64(p + DESC_BLOCK_AT);
    for (int i = 0; i < SR_MAX_DIMS; i++) {
        t->shape[i] = (int64_t)rd64(p + 24 + 8 * i);
        t->strides[i] = (int64_t)rd64(p + 24 + 8 * (SR_MAX_DIMS + i));
    }
    d->pos += (size_t)TENSOR_DESC_BYTES;
    return 0;
}

/* CHECK: the block offset names a live block of the shared heap, and the
 * descriptor describes a view inside it. Nothing is dereferenced before
 * sr__block_from_off() has validated the offset. */
static int tensor_check(struct dec *d, size_t at, const struct sr_tensor_desc *t)
{
    char why[256]; /* bad() rewrites the buffer sr_last_error() points to */
    sr_block *b = sr__block_from_off(t->block);
    void *data;
    size_t size = 0;
    int rc = !b ? -EINVAL : sr__block_check(b, &data, &size) ? -EPROTO : sr__tensor_desc_check(t, size);
    if (!rc)
        return 0;
    snprintf(why, sizeof(why), "%s", error_detail(sr_last_error()));
    return bad(d, at, "tensor descriptor (block offset %" PRIu64 "): %s", t->block, why);
}

/* BUILD makes a tensor viewing the block (its own reference); BUILD and
 * RELEASE both drop the descriptor's reference, exactly once. */
static int walk_tensor(struct dec *d, size_t at, sr_value **out)
{
    struct sr_tensor_desc t;
    int rc = get_desc(d, &t);
    if (rc)
        return rc;
    if (d->mode == VISIT) /* the descriptor follows the tag; its block field is at DESC_BLOCK_AT */
        return d->visit(d->visit_arg, (uint8_t *)(uintptr_t)d->buf + at + 1 + DESC_BLOCK_AT);
    if (d->mode == CHECK)
        return tensor_check(d, at, &t);
    if (d->mode == BUILD) {
        sr_tensor *x = NULL;
        rc = sr__tensor_from_desc(&t, &x);
        if (rc) { /* -ENOMEM: CHECK has validated everything else */
            d->err = rc;
            d->mode = RELEASE;
        } else {
            built(d, sr_value_from_tensor(x), out);
            sr_tensor_unref(x);
        }
    }
    sr__tensor_desc_release(&t);
    return 0;
}

/* A module's value (an RRef): CHECK validates it; BUILD materialises it
 * (an RRef tells its owner and parent); RELEASE does the same and drops it
 * at once, which is how a fork that will never be used is retired. */
static int walk_module(struct dec *d, size_t at, uint8_t tag, sr_value **out)
{
    const sr_value_kind_ops *k = sr__value_kind(tag);
    if (!k)
        return bad(d, at, "no module decodes kind tag %u", tag);
    char what[32];
    snprintf(what, sizeof(what), "%s value", sr_kind_name((sr_kind)tag));
    int rc = need(d, k->wire_size, what);
    if (rc)
        return rc;
    const uint8_t *wire = d->buf + d->pos;
    d->pos += k->wire_size;
    if (d->mode == VISIT)
        return 0;
    char why[160];
    if (d->mode == CHECK)
        return k->check(wire, why, sizeof(why)) ? bad(d, at, "%s", why) : 0;
    void *obj = NULL;
    if (k->decode(wire, &obj)) {
        if (d->mode == BUILD) {
            d->err = -ENOMEM;
            d->mode = RELEASE;
        }
        return 0;
    }
    sr_value *v = d->mode == BUILD ? sr__value_module(tag, obj) : NULL;
    if (d->mode == BUILD)
        built(d, v, out); /* NULL: -ENOMEM, and the rest is released */
    if (!v)
        k->release(obj);
    return 0;
}

static int walk_value(struct dec *d, int depth, sr_value **out)
{
    size_t at = d->pos;
    uint8_t tag, b;
    uint64_t x;
    int rc = get_u8(d, "kind tag", &tag);
    if (rc)
        return rc;
    switch (tag) {
    case SR_KIND_NONE:
        if (d->mode == BUILD)
            built(d, sr_none(), out);
        return 0;
    case SR_KIND_BOOL:
        if ((rc = get_u8(d, "bool", &b)))
            return rc;
        if (b > 1)
            return bad(d, at + 1, "bool byte %#x is neither 0 nor 1", b);
        if (d->mode == BUILD)
            built(d, sr_bool(b), out);
        return 0;
    case SR_KIND_INT:
    case SR_KIND_DOUBLE:
        if ((rc = get_u64(d, tag == SR_KIND_INT ? "int" : "double", &x)))
            return rc;
        if (d->mode == BUILD) {
            double f;
            memcpy(&f, &x, 8);
            built(d, tag == SR_KIND_INT ? sr_int((int64_t)x) : sr_double(f), out);
        }
        return 0;
    case SR_KIND_STR:
    case SR_KIND_BYTES: return walk_blob(d, tag, out);
    case SR_KIND_LIST: return walk_list(d, at, depth, out);
    case SR_KIND_OBJECT: return walk_object(d, at, out);
    case SR_KIND_TENSOR: return walk_tensor(d, at, out);
    default:
        if (tag >= SR_KIND_MODULE && tag < SR_KIND_MODULE + SR_MODULE_MAX)
            return walk_module(d, at, tag, out);
        return bad(d, at, "unknown kind tag %u", tag);
    }
}

static int walk_top(struct dec *d, sr_value **out)
{
    uint32_t n;
    int rc = get_len(d, "value count", &n);
    if (rc)
        return rc;
    sr_value *list = NULL;
    if (d->mode == BUILD)
        built(d, sr__list_alloc(n), &list);
    rc = walk_items(d, 0, n, list);
    *out = list;
    if (!rc && d->pos != d->len)
        rc = bad(d, d->pos, "%zu trailing bytes after the last value", left(d));
    return rc;
}

static const uint8_t no_bytes[1];

int sr__codec_decode(const uint8_t *buf, size_t len, sr_value **out)
{
    if (!out)
        return sr__fail(-EINVAL, __func__, "out is NULL");
    *out = NULL;
    if (buf && len == 4 && rd32(buf) == 0) { /* [count 0]: the immortal empty list, nothing to check */
        *out = sr__list_alloc(0);
        return 0;
    }
    struct dec d = {.buf = buf ? buf : no_bytes, .len = buf ? len : 0, .mode = CHECK, .fn = __func__};
    sr_value *list = NULL;
    int rc = walk_top(&d, &list);
    if (rc)
        return rc;
    d.pos = 0;
    d.mode = BUILD;
    rc = walk_top(&d, &list);
    if (!rc)
        rc = d.err;
    if (rc) {
        sr_value_unref(list);
        return rc;
    }
    *out = list;
    return 0;
}

int sr__codec_decode_one(const uint8_t *buf, size_t len, sr_value **out, size_t *n)
{
    /* [count 1][NONE]: nothing to check, build or release */
    if (out && buf && len == 5 && rd32(buf) == 1 && buf[4] == SR_KIND_NONE) {
        *out = sr_none();
        *n = 1;
        return 0;
    }
    sr_value *list = NULL;
    int rc = sr__codec_decode(buf, len, out ? &list : NULL);
    if (rc)
        return rc;
    *n = sr_value_list_len(list);
    *out = *n == 1 ? sr_value_ref(sr_value_list_at(list, 0)) : NULL;
    sr_value_unref(list);
    return 0;
}

void sr__codec_release(const uint8_t *buf, size_t len)
{
    struct dec d = {.buf = buf ? buf : no_bytes, .len = buf ? len : 0, .mode = CHECK, .fn = __func__};
    sr_value *unused = NULL;
    if (walk_top(&d, &unused))
        return; /* malformed: its references cannot be trusted; the error stays in sr_last_error() */
    d.pos = 0;
    d.mode = RELEASE;
    walk_top(&d, &unused);
}

int sr__codec_visit_tensors(uint8_t *buf, size_t len, int (*fn)(void *arg, uint8_t *block_field), void *arg)
{
    struct dec d = {.buf = buf ? buf : no_bytes, .len = buf ? len : 0, .mode = VISIT, .fn = "sr_rpc",
                    .visit = fn, .visit_arg = arg};
    sr_value *unused = NULL;
    return walk_top(&d, &unused);
}
