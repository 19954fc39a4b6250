/* SPDX-License-Identifier: MIT */
/* The RRef object: creation, references and the delete it triggers (G1),
 * accessors and the string form. See rref_internal.h for the fields. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hooks.h"
#include "rref_internal.h"

sr_rref *sr__rref_alloc(bool is_owner, int owner, uint64_t rid, uint64_t fid)
{
    sr_rref *r = calloc(1, sizeof(*r));
    if (!r || (is_owner && !(r->value = sr_future_new()))) {
        free(r);
        sr__fail(-ENOMEM, "sr_rref", "out of memory for an RRef");
        return NULL;
    }
    atomic_init(&r->refs, 1);
    r->is_owner = is_owner;
    r->owner = (uint16_t)owner;
    r->rref_id = rid;
    r->fork_id = is_owner ? SR_RREF_NO_ID : fid;
    /* an owner is this process; a remote() user's owner is the generation its call goes to
       (a received user's comes with it: sr__rref_from_wire) */
    r->owner_gen = is_owner ? sr__rref_ctx.my_gen : sr__rpc_peer_generation(owner);
    /* relaxed: the round changes only at init and fini, never under a live RRef's feet */
    r->gen = atomic_load_explicit(&sr__rref_ctx.gen, memory_order_relaxed);
    atomic_init(&r->confirmed, is_owner);
    atomic_init(&r->deleted, false);
    atomic_init(&r->create_err, 0);
    return r;
}

SR_API sr_rref *sr_rref_ref(sr_rref *r)
{
    /* relaxed: the caller holds a reference, so r cannot go */
    if (r)
        atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
    return r;
}

/* An unannounced user (fork.c) is gone: its owner never counted it, so
 * only its parent is told, to drop its hold (G2). Lock held. */
void sr__unannounced_gone_locked(sr_rref *r, struct after *d)
{
    struct rref_ctx *c = &sr__rref_ctx;
    int parent = SR_RREF_ID_RANK(r->fork_id);
    sr__map_del(&c->unannounced, r->fork_id);
    r->unannounced = false;
    r->registered = false;
    atomic_store_explicit(&r->deleted, true, memory_order_relaxed); /* relaxed: under the lock */
    if (parent == c->rank) /* a call to itself: the parent is here */
        sr__child_accepted_locked(r->fork_id, d);
    else
        sr__ctrl_queue_locked(d, parent, SR_RREF_CHILD_ACCEPT, r->rref_id, r->fork_id, 0);
    sr__idle_check_locked(d);
}

/* G1: the last local reference to a UserRRef tells its owner. */
static void user_gone(sr_rref *r)
{
    struct rref_ctx *c = &sr__rref_ctx;
    struct after d;
    sr__after_init(&d);
    sr__rref_lock();
    if (r->unannounced && sr__rref_live_locked(r)) {
        sr__unannounced_gone_locked(r, &d);
    } else if (r->registered && sr__rref_live_locked(r)) {
        if (sr__map_get(&c->users, r->fork_id) == r)
            sr__map_del(&c->users, r->fork_id);
        r->registered = false;
        sr__user_delete_locked(r, &d);
    }
    sr__rref_unlock();
    sr__after_run(&d);
}

SR_API void sr_rref_unref(sr_rref *r)
{
    /* acq_rel: the last holder must see every other holder's writes before destroying */
    if (!r || atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (!r->is_owner)
        user_gone(r);
    sr_future_unref(r->value);
    sr_future_unref(r->confirm);
    sr_value_unref(r->cached);
    free(r->create_msg);
    free(r);
}

void sr__user_delete_locked(sr_rref *r, struct after *d)
{
    /* relaxed: written under the lock we hold; lock-free readers only take a hint */
    if (atomic_load_explicit(&r->deleted, memory_order_relaxed))
        return;
    atomic_store_explicit(&r->deleted, true, memory_order_relaxed);
    if (sr__rref_owner_lost_locked(r))
        return; /* its owner died with the value: nothing to delete, and its rank's new generation never had it */
    /* relaxed: written under the lock we hold */
    bool confirmed = atomic_load_explicit(&r->confirmed, memory_order_relaxed);
    sr__ctrl_queue_locked(d, r->owner, SR_RREF_USER_DELETE, r->rref_id, r->fork_id,
                          (uint64_t)r->adds_sent << 2 | confirmed);
}

void sr__user_resolve_locked(sr_rref *r, bool confirmed, struct after *d)
{
    struct rref_ctx *c = &sr__rref_ctx;
    if (r->creating) { /* a remote() user: its call, not the table, holds it */
        r->creating = false;
        c->pending_remote--;
    } else if (sr__map_get(&c->pending_users, r->fork_id) == r) {
        sr__map_del(&c->pending_users, r->fork_id);
        d->unref[d->nunref++] = r; /* the pending table's reference */
    } else {
        return;
    }
    if (confirmed)
        /* release: pairs with the acquire in sr_rref_confirmed_by_owner */
        atomic_store_explicit(&r->confirmed, true, memory_order_release);
    /* Tracked for the deletes of graceful shutdown; if the table cannot grow,
     * the RRef still deletes itself when dropped. */
    sr__map_put(&c->users, r->fork_id, r);
    if (confirmed && r->confirm)
        d->complete[d->ncomplete++] = sr_future_ref(r->confirm);
}

void sr__rref_owner_fail(sr_rref *r, int err, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sr_future_set_error(r->value, err, "%s", msg); /* -EALREADY if it already completed: keep that */
}

void sr__rref_set_create_error(sr_rref *r, int err, const char *msg)
{
    /* relaxed: only the remote() completion writes it, once */
    if (atomic_load_explicit(&r->create_err, memory_order_relaxed))
        return;
    r->create_msg = strdup(msg);
    /* release: publishes create_msg to the acquire loads in the users of the RRef */
    atomic_store_explicit(&r->create_err, err < 0 ? err : -EINVAL, memory_order_release);
}

SR_API int sr_rref_create(sr_value *v, sr_rref **out)
{
    if (!v || !out)
        return sr__fail(-EINVAL, "sr_rref_create", "%s is NULL", v ? "out" : "the value");
    sr__rref_lock();
    bool active = sr__rref_ctx.active;
    sr__rref_unlock();
    if (!active)
        return sr__fail(-SR_ESHUTDOWN, "sr_rref_create", "RPC has not been initialized. Call sr_init first.");
    uint64_t rid = sr__rref_new_ids(1);
    sr_rref *r = rid == SR_RREF_NO_ID ? NULL : sr__rref_alloc(true, sr__rref_ctx.rank, rid, SR_RREF_NO_ID);
    if (!r)
        return rid == SR_RREF_NO_ID ? -EOVERFLOW : -ENOMEM;
    sr_future_set_result(r->value, v);
    *out = r;
    return 0;
}

/* ---- accessors ---------------------------------------------------------------- */

SR_API int sr_rref_owner(const sr_rref *r)
{
    return r ? r->owner : sr__fail(-EINVAL, "sr_rref_owner", "the RRef is NULL");
}

SR_API const char *sr_rref_owner_name(const sr_rref *r)
{
    return r ? sr_worker_name(r->owner) : NULL;
}

SR_API bool sr_rref_is_owner(const sr_rref *r) { return r && r->is_owner; }

SR_API bool sr_rref_confirmed_by_owner(const sr_rref *r)
{
    /* acquire: pairs with the release store in sr__user_resolve_locked */
    return r && atomic_load_explicit(&((sr_rref *)r)->confirmed, memory_order_acquire);
}

SR_API uint64_t sr_rref_id(const sr_rref *r) { return r ? r->rref_id : SR_RREF_NO_ID; }
SR_API uint64_t sr_rref_fork_id(const sr_rref *r) { return r ? r->fork_id : SR_RREF_NO_ID; }

SR_API const char *sr_rref_str(const sr_rref *r, char *buf, size_t len)
{
    char a[32], b[32];
    if (!buf || !len) { /* nowhere to write: a static empty string, never NULL */
        if (!buf && len)
            sr__fail(-EINVAL, "sr_rref_str", "buffer is NULL with length %zu", len);
        return buf ? buf : "";
    }
    if (!r)
        snprintf(buf, len, "NULL");
    else if (r->is_owner)
        snprintf(buf, len, "OwnerRRef(rref_id=%s)", sr__id_str(r->rref_id, a, sizeof(a)));
    else
        snprintf(buf, len, "UserRRef(rref_id=%s, fork_id=%s)", sr__id_str(r->rref_id, a, sizeof(a)),
                 sr__id_str(r->fork_id, b, sizeof(b)));
    return buf;
}

SR_API int sr_rref_confirmation(sr_rref *r, sr_future **out)
{
    if (!r || !out)
        return sr__fail(-EINVAL, "sr_rref_confirmation", "%s is NULL", r ? "out" : "the RRef");
    return sr__rref_confirm_future(r, out);
}

/* A confirmation failed at once: r's owner died (lost.c). */
static int lost_future(sr_rref *r, sr_future **out)
{
    int rc = sr__rref_fail_lost(r, "sr_rref_confirmation");
    if (!(*out = sr_future_new()))
        return -ENOMEM;
    sr_future_set_error(*out, rc, "%s", sr_last_error());
    return 0;
}

int sr__rref_confirm_future(sr_rref *r, sr_future **out)
{
    struct after d;
    sr__after_init(&d);
    int rc = sr__rref_check_owner(r, "sr_rref_confirmation");
    if (rc) /* its owner died */
        return lost_future(r, out);
    sr__rref_lock();
    bool live = sr__rref_live_locked(r), pending = r->creating && live;
    if (!r->confirm && pending) /* a remote() user: made on demand, completed by its REMOTE_RET */
        r->confirm = sr_future_new();
    if (r->unannounced && live) /* the confirmation needs the owner: ask it now (fork.c) */
        rc = sr__user_announce_locked(sr_rref_ref(r), &d);
    sr_future *f = !rc && r->confirm ? sr_future_ref(r->confirm) : NULL;
    sr__rref_unlock();
    sr__after_run(&d);
    if (rc == -SR_EOWNERLOST) /* found lost by its announcement */
        return lost_future(r, out);
    if (rc)
        return rc;
    if (f) {
        *out = f;
        return 0;
    }
    if (!(f = sr_future_new()))
        return -ENOMEM;
    /* acquire: pairs with the release store in sr__rref_set_create_error */
    int err = atomic_load_explicit(&r->create_err, memory_order_acquire);
    if (err)
        sr_future_set_error(f, err, "%s", r->create_msg ? r->create_msg : "RRef creation failed");
    else
        sr_future_set_result(f, NULL); /* an owner, or a user already confirmed */
    *out = f;
    return 0;
}
