/* SPDX-License-Identifier: MIT */
/* remote(): creating an RRef on another worker or on this one, the callee's
 * side of REMOTE_CALL, and the proxy remote().
 *
 * To another worker (scenario 1 of docs/RREF.md): the caller takes the rref
 * id and, right after it, the fork id (one counter, so the REMOTE_CALL needs
 * to carry only the rref id), adds a pending user and sends the REMOTE_CALL.
 * The callee creates (or finds, if a use overtook the call) the OwnerRRef,
 * adds the creator's fork, runs the function into the OwnerRRef and answers
 * REMOTE_RET, which confirms the user. A timeout or a dead callee is stored
 * on the RRef as its creation error.
 *
 * To self: an OwnerRRef that is not registered anywhere (nothing forked it
 * yet), filled by an ordinary self-call; its completion holds it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "error.h"
#include "hooks.h"
#include "rref_internal.h"

#define CREATION_TIMED_OUT \
    "RRef creation via rpc.remote() timed out, and it is possible that the RRef on the owner node does not exist."

static void drop_rref(void *p) { sr_rref_unref(p); }

/* The caller's view of a finished REMOTE_CALL. This callback's reference
 * to r goes before the confirmation is published, so that whoever waits
 * for it and then drops r finds r's delete already queued. */
static void user_created(sr_future *f, void *p)
{
    sr_rref *r = p;
    struct after d;
    sr__after_init(&d);
    char msg[600];
    int err = sr_future_value(f, NULL);
    if (err == -ETIMEDOUT)
        snprintf(msg, sizeof(msg), "%s", CREATION_TIMED_OUT);
    else if (err)
        snprintf(msg, sizeof(msg), "RRef creation via rpc.remote() failed: %s", sr_last_error());
    if (err)
        sr__rref_set_create_error(r, err, msg);
    sr_value *carried = err ? NULL : sr__future_peek(f); /* none, or the list of the value */
    if (sr_value_list_len(carried) == 1) /* before the confirmation publishes it */
        r->cached = sr_value_ref(sr_value_list_at(carried, 0));
    sr__rref_lock();
    sr_future *confirm = r->confirm ? sr_future_ref(r->confirm) : NULL; /* made lazily, under the lock */
    r->adds_sent = 1; /* the REMOTE_CALL */
    if (sr__rref_live_locked(r))
        sr__user_resolve_locked(r, !err, &d);
    sr__idle_check_locked(&d);
    d.unref[d.nunref++] = r;
    sr__rref_unlock();
    sr__after_run(&d);
    if (err && confirm)
        sr_future_set_error(confirm, err, "%s", msg);
    sr_future_unref(confirm);
}

static void owner_created(sr_future *f, void *p)
{
    sr_rref *r = p;
    sr_value *v = NULL;
    int err = sr_future_value(f, &v);
    if (err == -ETIMEDOUT) {
        sr__rref_set_create_error(r, err, CREATION_TIMED_OUT);
        sr__rref_owner_fail(r, err, CREATION_TIMED_OUT);
    } else if (err) {
        sr__rref_owner_fail(r, err, "%s", sr_last_error());
    } else {
        sr_future_set_result(r->value, v);
    }
    sr_value_unref(v);
    sr_rref_unref(r);
}

/* A call's request: proxy calls carry the RRef module's extension byte. */
/* who: the public function the user called, for errors */
static struct sr_req request(enum sr_req_kind kind, uint64_t rid, bool proxy, const char *who)
{
    struct sr_req q = {.kind = kind, .who = who, .module = sr__rref_module, .tag = rid, .ext_len = proxy ? 1 : 0};
    q.ext[0] = SR_RREF_EXT_PROXY;
    return q;
}

static int remote_self(const char *fn, sr_args args, int64_t ms, bool proxy, sr_rref **out)
{
    uint64_t rid = sr__rref_new_ids(1);
    if (rid == SR_RREF_NO_ID)
        return -EOVERFLOW;
    sr_rref *r = sr__rref_alloc(true, sr__rpc_rank(), rid, SR_RREF_NO_ID);
    sr_future *f = r ? sr_future_new() : NULL;
    if (!f) {
        sr_rref_unref(r);
        return -ENOMEM;
    }
    struct sr_req q = request(SR_REQ_CALL, 0, proxy, proxy ? "sr_rref_remote" : "sr_remote");
    int rc = sr__future_on_done(f, owner_created, drop_rref, sr_rref_ref(r));
    if (rc)
        sr_rref_unref(r); /* the callback's reference: it will never run */
    else
        rc = sr__module_call_start(sr__rpc_rank(), &q, fn, args, ms, f);
    sr_future_unref(f); /* a call that did not start drops the callback's reference with it */
    if (rc) {
        sr_rref_unref(r);
        return rc;
    }
    *out = r;
    return 0;
}

/* Count r as a pending user; its call's callback holds it until REMOTE_RET. */
static int add_pending(sr_rref *r)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr__rref_lock();
    int rc = sr__rref_live_locked(r)
                 ? 0
                 : sr__fail(-SR_ESHUTDOWN, "sr_remote", "RPC has not been initialized. Call sr_init first.");
    if (!rc) {
        r->registered = r->creating = true;
        c->pending_remote++;
    }
    sr__rref_unlock();
    return rc;
}

/* The REMOTE_CALL could not be sent: forget the user without a delete. */
static void drop_pending(sr_rref *r)
{
    struct after d;
    sr__after_init(&d);
    sr__rref_lock();
    atomic_store_explicit(&r->deleted, true, memory_order_relaxed); /* relaxed: under the lock */ /* the owner never heard of it */
    sr__user_resolve_locked(r, false, &d);
    sr__idle_check_locked(&d);
    sr__rref_unlock();
    sr__after_run(&d);
}

static int remote_user(int to, const char *fn, sr_args args, int64_t ms, bool proxy, sr_rref **out)
{
    uint64_t rid = sr__rref_new_ids(2); /* the rref id, then the creator's fork id */
    if (rid == SR_RREF_NO_ID)
        return -EOVERFLOW;
    sr_rref *r = sr__rref_alloc(false, to, rid, rid + 1);
    sr_future *f = r ? sr_future_new() : NULL;
    int rc = !f ? -ENOMEM : add_pending(r);
    if (rc) {
        sr_future_unref(f);
        sr_rref_unref(r);
        return rc;
    }
    if ((rc = sr__future_on_done(f, user_created, drop_rref, sr_rref_ref(r)))) {
        sr_rref_unref(r); /* the callback's reference: it will never run */
    } else {
        struct sr_req q = request(SR_REQ_KEEP, rid, proxy, proxy ? "sr_rref_remote" : "sr_remote");
        rc = sr__module_call_start(to, &q, fn, args, ms, f);
    }
    if (rc)
        drop_pending(r);
    sr_future_unref(f); /* a call that did not start drops the callback's reference with it */
    if (rc) {
        sr_rref_unref(r);
        return rc;
    }
    *out = r;
    return 0;
}

static int remote_any(int to, const char *fn, sr_args args, double timeout_s, bool proxy, sr_rref **out)
{
    int64_t ms;
    if (sr__rpc_rank() < 0)
        return sr__fail(-SR_ESHUTDOWN, "sr_remote", "RPC has not been initialized. Call sr_init first.");
    if (!out)
        return sr__fail(-EINVAL, "sr_remote", "out is NULL");
    int rc = sr__module_call_check(to, fn, args, timeout_s, &ms, "sr_remote");
    if (rc)
        return rc;
    return to == sr__rpc_rank() ? remote_self(fn, args, ms, proxy, out) : remote_user(to, fn, args, ms, proxy, out);
}

SR_API int sr_remote(int to, const char *fn, sr_args args, double timeout_s, sr_rref **out)
{
    return remote_any(to, fn, args, timeout_s, false, out);
}

/* ---- proxies ------------------------------------------------------------------- */

/* [rref, extra...]: the callee replaces argument 0 by its local value. */
static sr_value **proxy_args(sr_rref *r, sr_args extra, sr_args *out)
{
    if (extra.n && !extra.v) {
        sr__fail(-EINVAL, "sr_rref_rpc", "%zu extra arguments but the array is NULL", extra.n);
        return NULL;
    }
    sr_value **v = malloc((extra.n + 1) * sizeof(*v));
    if (!v || !(v[0] = sr_value_from_rref(r))) {
        free(v);
        sr__fail(-ENOMEM, "sr_rref_rpc", "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < extra.n; i++)
        v[i + 1] = extra.v[i];
    *out = (sr_args){extra.n + 1, v};
    return v;
}

static void proxy_args_free(sr_value **v)
{
    if (v) {
        sr_value_unref(v[0]);
        free(v);
    }
}

SR_API int sr_rref_remote(sr_rref *r, const char *fn, sr_args extra, double timeout_s, sr_rref **out)
{
    if (!r)
        return sr__fail(-EINVAL, "sr_rref_remote", "the RRef is NULL");
    sr_args args;
    sr_value **v = proxy_args(r, extra, &args);
    if (!v)
        return -ENOMEM;
    int rc = remote_any(r->owner, fn, args, timeout_s, true, out);
    proxy_args_free(v);
    return rc;
}

/* who: sr_rref_rpc_async or sr_rref_rpc_sync, for errors. */
static int rref_rpc(sr_rref *r, const char *fn, sr_args extra, double timeout_s, sr_future **out, const char *who)
{
    int64_t ms;
    if (!r || !out)
        return sr__fail(-EINVAL, who, "%s is NULL", r ? "out" : "the RRef");
    if (sr__rpc_rank() < 0)
        return sr__fail(-SR_ESHUTDOWN, who, "RPC has not been initialized. Call sr_init first.");
    sr_args args;
    sr_value **v = proxy_args(r, extra, &args);
    if (!v)
        return -ENOMEM;
    sr_future *f = NULL;
    int rc = sr__module_call_check(r->owner, fn, args, timeout_s, &ms, who);
    if (!rc && !(f = sr_future_new()))
        rc = -ENOMEM;
    struct sr_req q = request(SR_REQ_CALL, 0, true, who);
    if (!rc && (rc = sr__module_call_start(r->owner, &q, fn, args, ms, f)))
        f = (sr_future_unref(f), NULL);
    proxy_args_free(v);
    if (!rc)
        *out = f;
    return rc;
}

SR_API int sr_rref_rpc_async(sr_rref *r, const char *fn, sr_args extra, double timeout_s, sr_future **out)
{
    return rref_rpc(r, fn, extra, timeout_s, out, "sr_rref_rpc_async");
}

SR_API int sr_rref_rpc_sync(sr_rref *r, const char *fn, sr_args extra, double timeout_s, sr_value **out)
{
    sr_future *f = NULL;
    int rc = rref_rpc(r, fn, extra, timeout_s, &f, "sr_rref_rpc_sync");
    if (rc)
        return rc;
    rc = sr_future_wait(f, out);
    sr_future_unref(f);
    return rc;
}

/* ---- the callee of a REMOTE_CALL ---------------------------------------------------- */

sr_rref *sr__rref_remote_owner(uint64_t rid, int caller)
{
    struct rref_ctx *c = &sr__rref_ctx;
    struct after d;
    sr__after_init(&d);
    sr_rref *r = NULL;
    enum sr_fork_add res;
    sr__rref_lock();
    sr_rref *o = c->active && SR_RREF_ID_RANK(rid) == caller ? sr__owner_get_or_create_locked(rid, false) : NULL;
    if (o && !sr__forks_add(&c->forks, rid, rid + 1, caller, sr__rpc_peer_generation(caller), &res)) {
        if (o->awaiting) { /* uses overtook their creating call; it is here now */
            o->awaiting = false;
            c->awaiting--;
        }
        r = sr_rref_ref(o);
    }
    if (o) /* gone at once if its creator's delete came first (a tombstone) or the add failed */
        sr__owner_maybe_erase_locked(rid, &d);
    sr__rref_unlock();
    sr__after_run(&d);
    return r;
}

void sr__rref_owner_set(sr_rref *owner, int err, int cause, const char *text, sr_value *v)
{
    if (err)
        sr__future_fail_cause(owner->value, err, cause, text); /* -EALREADY if it already completed: keep that */
    else
        sr_future_set_result(owner->value, v);
}
