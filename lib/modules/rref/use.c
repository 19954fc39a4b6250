/* SPDX-License-Identifier: MIT */
/* Using RRefs: to_here and its owner side (RREF_FETCH), local_value, the
 * gate that defers a call on the owner until the values of its own RRef
 * arguments are set, and waiting for the worker's RRef traffic to settle.
 *
 * A call is never deferred on a UserRRef's confirmation: a user received
 * from another user is safe to use before its owner confirms it (its
 * parent's hold, G2, keeps the OwnerRRef alive; its delete waits for the
 * confirmation in pending_users), so its function runs at once and the
 * owner's ACK is bookkeeping nobody's call waits for (docs/RREF.md). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hooks.h"
#include "rref_internal.h"

int sr__rref_deadline(double timeout_s, const char *fn, int64_t *ms, int64_t *deadline)
{
    int rc = 0;
    if (timeout_s == 0) /* SR_TIMEOUT_DEFAULT */
        *ms = sr__rpc_default_timeout_ms(); /* the default is captured now, as for calls */
    else
        rc = sr__timeout_ms(timeout_s, fn, ms); /* NaN and negative values: -EINVAL */
    if (!rc)
        *deadline = sr__deadline_ns(sr__now_ns(), *ms);
    return rc;
}

int sr__rref_wait(sr_future *f, int64_t deadline_ns)
{
    return sr__future_wait_until(f, deadline_ns);
}

/* 0 if r may be used by fn now; else the error, set in sr_last_error(). */
static int usable(sr_rref *r, const char *fn, bool *deleted)
{
    if (!r)
        return sr__fail(-EINVAL, fn, "the RRef is NULL");
    bool live = sr__rref_live(r);
    *deleted = atomic_load_explicit(&r->deleted, memory_order_relaxed); /* relaxed: a hint (see sr_rref) */
    char s[96];
    if (!live)
        return sr__fail(-SR_ESHUTDOWN, fn, "%s belongs to an RPC round that has shut down",
                        sr_rref_str(r, s, sizeof(s)));
    int rc = sr__rref_check_owner(r, fn); /* its owner died: lost, whatever else happened */
    if (rc)
        return rc;
    /* acquire: pairs with the release store in sr__rref_set_create_error; create_msg is complete */
    int err = atomic_load_explicit(&r->create_err, memory_order_acquire);
    if (err == -EPIPE) /* the owner died before its REMOTE_RET (its hook may not have run yet) */
        return sr__rref_fail_lost(r, fn);
    if (err)
        return sr__fail(err, fn, "%s", r->create_msg ? r->create_msg : "RRef creation via rpc.remote() failed");
    return 0;
}

static void hold_done(sr_future *f, void *p)
{
    (void)f;
    sr_rref_unref(p);
}

static void hold_drop(void *p) { sr_rref_unref(p); }

/* A user's to_here: one RREF_FETCH. The RRef is held until the fetch's
 * answer arrives, even past this call's timeout, so that the RRef's delete
 * can never overtake the fetch on its way to the owner (the call itself has
 * no timeout; only this wait has). While we wait, our own reference is the
 * hold; a timeout hands it to a callback. */
static int fetch(sr_rref *r, int64_t deadline, int64_t ms, sr_value **out)
{
    sr_future *f = sr_future_new();
    if (!f)
        return -ENOMEM;
    struct sr_req q = {.kind = SR_REQ_MODULE, .who = "sr_rref_to_here", .module = sr__rref_module, .tag = r->rref_id,
                       .sub = SR_RREF_FETCH_SUB(sr_rref_confirmed_by_owner(r) ? SR_RREF_FETCH_CONFIRMED
                                                                               : SR_RREF_FETCH, r->owner_gen)};
    int rc = sr__module_call_start(r->owner, &q, NULL, (sr_args){0, NULL}, 0, f);
    if (!rc && (rc = sr__rref_wait(f, deadline)) == -ETIMEDOUT) {
        if (sr__future_on_done(f, hold_done, hold_drop, sr_rref_ref(r)))
            sr_rref_unref(r); /* no memory for the hold: a late answer may find the RRef gone */
        sr__fail(rc, "sr_rref_to_here",
                 "RPC ran for more than set timeout (%" PRId64 " ms) and will now be marked with an error", ms);
    } else if (!rc) {
        rc = sr_future_value(f, out);
    }
    if (rc == -EPIPE) /* the owner died: its value with it */
        rc = sr__rref_fail_lost(r, "sr_rref_to_here");
    else if (rc && rc != -ETIMEDOUT && sr__rref_check_owner(r, "sr_rref_to_here"))
        rc = -SR_EOWNERLOST; /* answered by its owner's successor (a fetch sent as it died) */
    sr_future_unref(f);
    return rc;
}

/* A remote() user still awaiting its REMOTE_RET waits for it: a small plain
 * value rides along (lib/rpc/serve.c), and then no fetch is needed, which halves
 * the messages of remote() + to_here(). Otherwise, or afterwards, fetch.
 * (A value too big or not plain, e.g. a tensor, is fetched after the
 * REMOTE_RET, not alongside it: one more round trip, see docs/RREF.md.) */
static int to_here_user(sr_rref *r, int64_t deadline, int64_t ms, sr_value **out)
{
    sr_future *f = NULL;
    sr__rref_lock();
    if (r->creating && !r->confirm) /* made on demand, completed by the REMOTE_RET */
        r->confirm = sr_future_new();
    if (r->creating && r->confirm)
        f = sr_future_ref(r->confirm);
    sr__rref_unlock();
    if (f) {
        int rc = sr__rref_wait(f, deadline);
        sr_future_unref(f); /* f stays non-NULL: it says we waited */
        if (rc == -ETIMEDOUT)
            return sr__fail(rc, "sr_rref_to_here",
                            "RPC ran for more than set timeout (%" PRId64 " ms) and will now be marked with an error",
                            ms);
        /* acquire: pairs with the release store in sr__rref_set_create_error */
        int err = atomic_load_explicit(&r->create_err, memory_order_acquire);
        if (err == -EPIPE) /* the owner died before its REMOTE_RET */
            return sr__rref_fail_lost(r, "sr_rref_to_here");
        if (err)
            return sr__fail(err, "sr_rref_to_here", "%s", r->create_msg ? r->create_msg : "RRef creation failed");
    }
    /* Only a to_here() that overlapped the creation uses the copy that came
     * with it (it is then as if fetched at that moment); later ones fetch,
     * and so learn, for one, that the owner has died. */
    if (f && r->cached) { /* written before the confirmation completed: visible now */
        *out = sr_value_ref(r->cached);
        return 0;
    }
    return fetch(r, deadline, ms, out);
}

SR_API int sr_rref_to_here(sr_rref *r, double timeout_s, sr_value **out)
{
    bool deleted = false;
    char s[96];
    int64_t ms, deadline;
    int rc = usable(r, "sr_rref_to_here", &deleted);
    if (!rc)
        rc = sr__rref_deadline(timeout_s, "sr_rref_to_here", &ms, &deadline);
    if (rc)
        return rc;
    if (!r->is_owner && deleted)
        return sr__fail(-EINVAL, "sr_rref_to_here", "%s has been deleted. Cannot call to_here() on it after deletion.",
                        sr_rref_str(r, s, sizeof(s)));
    if (!r->is_owner)
        return to_here_user(r, deadline, ms, out);
    if (sr__rref_wait(r->value, deadline))
        return sr__fail(-ETIMEDOUT, "sr_rref_to_here", "the value of %s was not set within %" PRId64 " ms",
                        sr_rref_str(r, s, sizeof(s)), ms);
    return sr_future_value(r->value, out);
}

SR_API int sr_rref_local_value(sr_rref *r, sr_value **out)
{
    bool deleted = false;
    char s[96];
    if (r && !r->is_owner) {
        const char *me = sr_worker_name(sr_rank()), *own = sr_worker_name(r->owner);
        return sr__fail(-EINVAL, "sr_rref_local_value",
                        "For %s, can't call localValue() on user WorkerInfo(id=%d, name=%s). "
                        "Call it on owner WorkerInfo(id=%d, name=%s)",
                        sr_rref_str(r, s, sizeof(s)), sr_rank(), me ? me : "?", r->owner, own ? own : "?");
    }
    int64_t ms, deadline;
    int rc = usable(r, "sr_rref_local_value", &deleted);
    if (!rc)
        rc = sr__rref_deadline(SR_TIMEOUT_DEFAULT, "sr_rref_local_value", &ms, &deadline);
    if (rc)
        return rc;
    if (sr__rref_wait(r->value, deadline))
        return sr__fail(-ETIMEDOUT, "sr_rref_local_value", "the value of %s was not set within %" PRId64 " ms",
                        sr_rref_str(r, s, sizeof(s)), ms);
    return sr_future_value(r->value, out);
}

/* ---- the owner's side of to_here and proxies ------------------------------------- */

sr_future *sr__rref_fetch_value(uint64_t rid, bool confirmed, int *code, char *text, size_t len)
{
    struct rref_ctx *c = &sr__rref_ctx;
    char s[32];
    sr_future *f = NULL;
    sr__rref_lock();
    sr_rref *o = c->active ? sr__map_get(&c->owners, rid) : NULL;
    bool gone = !o && c->active && sr__rref_gone_for_good_locked(rid); /* deleted, whatever the flag says */
    if (!o && c->active && !confirmed && !gone) /* the fetch overtook the creating REMOTE_CALL */
        o = sr__owner_get_or_create_locked(rid, true);
    if (o)
        f = sr_future_ref(o->value);
    sr__rref_unlock();
    if (f)
        return f;
    confirmed |= gone;
    *code = confirmed ? -EINVAL : -ENOMEM;
    snprintf(text, len, confirmed ? "Error on Node %d: RRef %s has been deleted. Cannot call to_here() on it after deletion."
                                  : "Error on Node %d: out of memory for the OwnerRRef of %s",
             c->rank, sr__id_str(rid, s, sizeof(s)));
    return NULL;
}

int sr__rref_proxy_value(const sr_value *arg0, sr_value **out)
{
    sr_rref *r = sr_value_rref(arg0);
    bool deleted = false;
    if (!r || !r->is_owner)
        return sr__fail(-EINVAL, "sr_rref_rpc", "argument 0 of a proxy call must be an RRef owned by worker%d, not %s",
                        sr__rref_ctx.rank, r ? "a UserRRef" : sr_kind_name(sr_value_type(arg0)));
    int rc = usable(r, "sr_rref_rpc", &deleted);
    if (rc)
        return rc;
    if (!sr_future_done(r->value)) /* the gate waited for it: never here */
        return sr__fail(-EAGAIN, "sr_rref_rpc", "the value of the RRef is not set yet");
    return sr_future_value(r->value, out);
}

/* ---- the gate ----------------------------------------------------------------------- */

struct gate {
    _Atomic uint32_t left; /* values not set yet; the last one frees the gate */
    sr_future *agg;
};

static void gate_finish(struct gate *g)
{
    /* acq_rel: the last one completes the gate after every other item finished */
    if (atomic_fetch_sub_explicit(&g->left, 1, memory_order_acq_rel) != 1)
        return;
    sr_future_set_result(g->agg, NULL); /* -EALREADY if an error came first */
    sr_future_unref(g->agg);
    free(g);
    /* relaxed: statistics */
    atomic_fetch_sub_explicit(&sr__rref_ctx.deferred, 1, memory_order_relaxed);
}

/* An owner's value may be an error: the function still runs (and sees it). */
static void gate_done(sr_future *f, void *p)
{
    (void)f;
    gate_finish(p);
}

static void gate_drop(void *p)
{
    struct gate *g = p;
    sr__future_fail_text(g->agg, -SR_ESHUTDOWN, "the RRef argument went away before its value was set");
    gate_finish(g);
}

struct waits {
    sr_future *f[16];
    size_t n;
};

/* OwnerRRefs among the arguments whose value is not set yet. */
static void collect(const sr_value *v, struct waits *w)
{
    sr_rref *r = sr_value_rref(v);
    if (r) {
        if (r->is_owner && !sr_future_done(r->value) && w->n < 16) /* more are collected again later */
            w->f[w->n++] = r->value;
        return;
    }
    for (size_t i = 0; i < sr_value_list_len(v); i++)
        collect(sr_value_list_at(v, i), w);
}

sr_future *sr__rref_gate(sr_value *args)
{
    struct waits w; /* f[] is written before it is read: no clearing on every call */
    w.n = 0;
    collect(args, &w);
    if (!w.n)
        return NULL;
    struct gate *g = malloc(sizeof(*g));
    sr_future *agg = sr_future_new();
    if (!g || !agg) { /* no memory to wait without a thread: fail the call rather than block */
        free(g);
        if (agg)
            sr_future_set_error(agg, -ENOMEM, "out of memory deferring a call on its RRef arguments");
        return agg;
    }
    g->agg = sr_future_ref(agg);
    atomic_init(&g->left, (uint32_t)w.n);
    /* relaxed: statistics */
    atomic_fetch_add_explicit(&sr__rref_ctx.deferred, 1, memory_order_relaxed);
    for (size_t i = 0; i < w.n; i++)
        if (sr__future_on_done(w.f[i], gate_done, gate_drop, g)) {
            sr__future_fail_text(g->agg, -ENOMEM, sr_last_error());
            gate_finish(g);
        }
    return agg;
}

/* ---- waiting for quiet -------------------------------------------------------------- */

/* One round: 0 when idle now, 1 after waiting for the idle future once
 * (the caller checks again), or -errno. */
static int wait_idle_once(int64_t deadline)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr__rref_lock();
    if (!c->active) {
        sr__rref_unlock();
        return sr__fail(-SR_ESHUTDOWN, "sr_rref_wait_idle", "RPC has not been initialized. Call sr_init first.");
    }
    if (sr__idle_locked()) {
        sr__rref_unlock();
        return 0;
    }
    if (!c->idle)
        c->idle = sr_future_new();
    sr_future *f = c->idle ? sr_future_ref(c->idle) : NULL;
    sr__rref_unlock();
    if (!f)
        return sr__fail(-ENOMEM, "sr_rref_wait_idle", "out of memory");
    int rc = sr__rref_wait(f, deadline);
    if (!rc)
        rc = sr_future_value(f, NULL);
    sr_future_unref(f);
    return rc ? rc : 1;
}

/* Count this thread among the idle waiters, so that later deletes ask for
 * a loud ACK, and nudge the owners of earlier ones, whose ACKs may come
 * quietly (protocol.c). 0, or -errno (then not counted). */
static int nudge_owners(void)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr__rref_lock();
    int world = c->world;
    bool *mark = c->active ? calloc((size_t)world, sizeof(*mark)) : NULL;
    if (mark) {
        /* relaxed: under the lock, which orders it with the deletes queued (read under it) */
        atomic_fetch_add_explicit(&c->idle_waiters, 1, memory_order_relaxed);
        sr__unacked_delete_owners_locked(mark, world);
    }
    bool active = c->active;
    sr__rref_unlock();
    if (!mark)
        return active ? sr__fail(-ENOMEM, "sr_rref_wait_idle", "out of memory")
                      : sr__fail(-SR_ESHUTDOWN, "sr_rref_wait_idle", "RPC has not been initialized. Call sr_init first.");
    /* N1: pairs with N2 in sr__ctrl_after_send (protocol.c) */
    atomic_thread_fence(memory_order_seq_cst);
    for (int r = 0; r < world; r++)
        if (mark[r])
            sr__ctrl_nudge(r);
    free(mark);
    return 0;
}

/* A pending child released because a worker it needed died (peer-death
 * hook, protocol.c): idle now, but say so, once, naming the rank. */
static int report_lost_child(void)
{
    struct rref_ctx *c = &sr__rref_ctx;
    char how[sizeof(c->lost_how)];
    sr__rref_lock();
    int rank = c->lost_rank;
    uint64_t fid = c->lost_fid;
    memcpy(how, c->lost_how, sizeof(how));
    c->lost_rank = -1;
    sr__rref_unlock();
    if (rank < 0)
        return 0;
    return sr__fail(-EPIPE, "sr_rref_wait_idle",
                    "worker%d died before the RRef child fork %" PRIx64 " was accepted (%s); its parent was released",
                    rank, fid, how);
}

SR_API int sr_rref_wait_idle(double timeout_s) { return sr__rref_wait_idle(timeout_s, true); }

int sr__rref_wait_idle(double timeout_s, bool report_lost)
{
    struct rref_ctx *c = &sr__rref_ctx;
    int64_t ms, deadline;
    /* its default is no timeout */
    int rc = sr__rref_deadline(timeout_s == 0 ? SR_TIMEOUT_NONE : timeout_s, "sr_rref_wait_idle", &ms, &deadline);
    if (rc)
        return rc;
    /* Again after each completion: the idle future is completed from a
     * handler's deferred work, after which an unref it ran (a parent whose
     * child was accepted) may have queued a delete: not idle after all. */
    rc = nudge_owners();
    if (rc)
        return rc;
    /* The forks held unannounced by running calls (fork.c) ask their owners
     * now: idleness means every user received is confirmed. None is made
     * unannounced while this thread is counted among the waiters. */
    sr__rref_announce_all(-1);
    /* ... and those this worker's children are held by elsewhere: a pending
     * child must not wait for the end of the call it was passed to. */
    sr__rref_announce_children();
    while ((rc = wait_idle_once(deadline)) == 1)
        ;
    /* relaxed: only counted; a waiter that went makes later ACKs quiet again */
    atomic_fetch_sub_explicit(&c->idle_waiters, 1, memory_order_relaxed);
    if (!rc && report_lost)
        rc = report_lost_child();
    if (rc == -ETIMEDOUT) {
        sr__rref_lock();
        size_t u = c->pending_users.n + c->unannounced.n, ch = c->children.n, re = c->unacked.n;
        sr__rref_unlock();
        return sr__fail(rc, "sr_rref_wait_idle",
                        "still %zu pending users, %zu pending children and %zu unacknowledged messages after %" PRId64
                        " ms",
                        u, ch, re, ms);
    }
    return rc;
}
