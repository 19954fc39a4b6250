/* SPDX-License-Identifier: MIT */
/* The RRef layer as a protocol module of the agent (lib/rpc/module.h). */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>

#include "error.h"
#include "hooks.h"
#include "rref_internal.h"

/* ---- RRef values in messages: rref_id u64, fork_id u64, owner u16, owner_gen u32 (LE) ---- */

static void put64(uint8_t *p, uint64_t x)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(x >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t x = 0;
    for (int i = 0; i < 8; i++)
        x |= (uint64_t)p[i] << (8 * i);
    return x;
}

static unsigned owner_of(const uint8_t *w) { return (unsigned)w[16] | (unsigned)w[17] << 8; }
static uint32_t owner_gen_of(const uint8_t *w)
{
    return (uint32_t)w[18] | (uint32_t)w[19] << 8 | (uint32_t)w[20] << 16 | (uint32_t)w[21] << 24;
}

static int kind_sendable(void *obj, const char *fn) { return sr__rref_sendable(obj, fn); }

static int kind_encode(void *obj, int to, uint8_t *w)
{
    uint64_t fid;
    int rc = sr__rref_fork(obj, to, &fid);
    if (rc)
        return rc;
    unsigned owner = (unsigned)sr_rref_owner(obj);
    put64(w, sr_rref_id(obj));
    put64(w + 8, fid);
    w[16] = (uint8_t)owner;
    w[17] = (uint8_t)(owner >> 8);
    uint32_t gen = ((const sr_rref *)obj)->owner_gen;
    for (int i = 0; i < 4; i++)
        w[18 + i] = (uint8_t)(gen >> (8 * i));
    return 0;
}

static void kind_unencode(void *obj, const uint8_t *w) { sr__rref_unfork(obj, get64(w + 8)); }

static int kind_check(const uint8_t *w, char *why, size_t len)
{
    return sr__rref_wire_check(get64(w), get64(w + 8), owner_of(w), why, len);
}

static int kind_decode(const uint8_t *w, void **obj)
{
    sr_rref *r = NULL;
    int rc = sr__rref_from_wire(get64(w), get64(w + 8), owner_of(w), owner_gen_of(w), &r);
    *obj = r;
    return rc;
}

static void kind_release(void *obj) { sr_rref_unref(obj); }
static const char *kind_str(const void *obj, char *buf, size_t len) { return sr_rref_str(obj, buf, len); }

int sr__rref_module = -1, sr__rref_kind = -1;

static const sr_value_kind_ops rref_kind = {
    .name = "rref",
    .wire_size = SR_RREF_WIRE_SIZE,
    .sendable = kind_sendable,
    .encode = kind_encode,
    .unencode = kind_unencode,
    .check = kind_check,
    .decode = kind_decode,
    .release = kind_release,
    .str = kind_str,
};

SR_API sr_value *sr_value_from_rref(sr_rref *r)
{
    if (!r) {
        sr__fail(-EINVAL, __func__, "the RRef is NULL");
        return NULL;
    }
    sr_value *v = sr__value_module(sr__rref_kind, sr_rref_ref(r));
    if (!v)
        sr_rref_unref(r);
    return v;
}

SR_API sr_value *sr_rref_value(sr_rref *r) { return sr_value_from_rref(r); }

SR_API sr_rref *sr_value_rref(const sr_value *v) { return sr__value_module_obj(v, sr__rref_kind); }

SR_API sr_kind sr_rref_kind(void) { return (sr_kind)sr__rref_kind; }

/* ---- calls ---- */

/* The call's state (struct rref_call), made when first needed. */
static struct rref_call *call_state(sr_call *c)
{
    void **st = sr__call_state(c, sr__rref_module);
    if (!*st)
        *st = calloc(1, sizeof(struct rref_call));
    return *st;
}

int sr__rref_call_note(sr_call *c, uint64_t fid)
{
    struct rref_call *st = call_state(c);
    if (!st)
        return -ENOMEM;
    if (st->n == st->cap) {
        uint32_t cap = st->cap ? 2 * st->cap : 4;
        uint64_t *f = realloc(st->fids, cap * sizeof(*f));
        if (!f)
            return -ENOMEM;
        st->fids = f;
        st->cap = cap;
    }
    st->fids[st->n++] = fid;
    return 0;
}

static int rref_request_in(sr_call *c, const uint8_t *ext, size_t len)
{
    if (!(len == 1 && (ext[0] & SR_RREF_EXT_PROXY)))
        return 0;
    struct rref_call *st = call_state(c);
    if (!st)
        return sr__fail(-ENOMEM, "sr_rref_rpc", "out of memory for a proxy call");
    st->proxy = true;
    return 0;
}

/* A proxy call: argument 0 becomes the owner's local value. */
static int rref_prepare(sr_call *c)
{
    struct rref_call *st = *sr__call_state(c, sr__rref_module);
    if (!st || !st->proxy)
        return 0;
    st->proxy = false;
    sr_value *v = NULL;
    if (!sr_call_nargs(c))
        return sr__fail(-EINVAL, "sr_rref_rpc", "a proxy call needs the RRef as argument 0");
    int rc = sr__rref_proxy_value(sr_call_arg(c, 0), &v);
    return rc ? rc : sr__call_set_arg(c, 0, v);
}

/* After the answer: the forks the call kept are announced to their owners
 * (those its arguments took along were settled with their parents). */
static void rref_call_done(sr_call *c)
{
    void **slot = sr__call_state(c, sr__rref_module);
    struct rref_call *st = *slot;
    if (!st)
        return;
    sr__rref_announce_forks(st->fids, st->n);
    free(st->fids);
    free(st);
    *slot = NULL;
}

static sr_future *rref_gate(sr_call *c) { return sr__rref_gate(sr__call_args(c)); }

static void *rref_keep_open(uint64_t rid, int caller) { return sr__rref_remote_owner(rid, caller); }

static void rref_keep_set(void *h, int err, int cause, const char *text, sr_value *v)
{
    sr__rref_owner_set(h, err, cause, text, v);
    sr_rref_unref(h);
}

static void rref_keep_drop(void *h) { sr_rref_unref(h); }

/* to_here's fetch: the owner's value future, answered when it is set. */
static int rref_serve(int caller, uint8_t sub, uint64_t rid, sr_value *args, sr_future **out)
{
    (void)caller;
    (void)args;
    char text[256];
    int code = -EINVAL;
    unsigned kind = SR_RREF_FETCH_KIND(sub);
    if (kind != SR_RREF_FETCH && kind != SR_RREF_FETCH_CONFIRMED)
        return sr__fail(-EBADMSG, "sr_rref", "unknown RRef request kind %u", sub);
    if (SR_RREF_FETCH_GEN(sub) != (sr__rref_ctx.my_gen & 0x3fu)) /* meant for another generation of this rank */
        return sr__fail(-SR_EOWNERLOST, "sr_rref",
                        "worker%d generation %u does not have RRef %llx: it was fetched from generation %u (mod 64)",
                        sr__rref_ctx.rank, sr__rref_ctx.my_gen, (unsigned long long)rid, SR_RREF_FETCH_GEN(sub));
    *out = sr__rref_fetch_value(rid, kind == SR_RREF_FETCH_CONFIRMED, &code, text, sizeof(text));
    if (!*out)
        sr__error_set_text(text);
    return *out ? 0 : code;
}

/* ---- peers, lifecycle ---- */

/* sr_rref_set_ignore_leak's flag, read by each sr_init. */
static _Atomic bool ignore_leak;

SR_API void sr_rref_set_ignore_leak(bool ignore)
{
    /* relaxed: set before sr_init, on its thread or ordered before it by the application */
    atomic_store_explicit(&ignore_leak, ignore, memory_order_relaxed);
}

static int rref_init(const sr_init_opts *o)
{
    (void)o;
    /* relaxed: see sr_rref_set_ignore_leak */
    return sr__rref_init(sr__rpc_rank(), sr__rpc_world(), atomic_load_explicit(&ignore_leak, memory_order_relaxed));
}

/* Names for the profiler (module.h, "Probes"): control messages and module
 * requests. */
static const char *rref_describe_msg(uint8_t type, const uint8_t *bytes, size_t len)
{
    static const char *const ctrl[] = {[SR_RREF_FORK_REQUEST] = "fork_request", [SR_RREF_CHILD_ACCEPT] = "child_accept",
                                       [SR_RREF_USER_DELETE] = "user_delete", [SR_RREF_ACK] = "ack",
                                       [SR_RREF_NUDGE] = "nudge", [SR_RREF_ORPHANS_DONE] = "orphans_done"};
    uint8_t kind = len >= sizeof(struct sr_rref_msg) ? bytes[offsetof(struct sr_rref_msg, kind)] : 0;
    return type == SR_RREF_MSG_CTRL && kind < sizeof(ctrl) / sizeof(ctrl[0]) ? ctrl[kind] : NULL;
}

static const char *rref_describe_request(uint8_t sub)
{
    static const char *const req[] = {[SR_RREF_FETCH] = "to_here", [SR_RREF_FETCH_CONFIRMED] = "to_here"};
    sub = SR_RREF_FETCH_KIND(sub);
    return sub < sizeof(req) / sizeof(req[0]) ? req[sub] : NULL;
}

static const struct sr_module_call_ops rref_call = {
    .request_in = rref_request_in,
    .call_done = rref_call_done,
};

static const struct sr_module_gate_ops rref_gate_ops = {
    .gate = rref_gate,
    .prepare = rref_prepare,
};

static const struct sr_module_keep_ops rref_keep = {
    .open = rref_keep_open,
    .set = rref_keep_set,
    .drop = rref_keep_drop,
};

static const struct sr_module_life_ops rref_life = {
    .init = rref_init,
    .shutdown_users = sr__rref_shutdown_users,
    .shutdown_check = sr__rref_shutdown_check,
    .fini = sr__rref_fini,
    .peer_died = sr__rref_peer_died,
};

static const struct sr_module_request_ops rref_request = {
    .serve = rref_serve,
    .describe = rref_describe_request,
};

static const struct sr_module_msg_ops rref_msg = {
    .ntypes = 1,
    .on_msg = sr__rref_ctrl,
    .describe = rref_describe_msg,
};

static const sr_module rref_module = {
    .name = "rref",
    .call = &rref_call,
    .gate = &rref_gate_ops,
    .keep = &rref_keep,
    .life = &rref_life,
    .request = &rref_request,
    .msg = &rref_msg,
    .value_kind = &rref_kind,
};

__attribute__((constructor)) static void rref_register(void)
{
    sr__rref_module = sr__module_register(&rref_module, &sr__rref_kind);
}
