/* SPDX-License-Identifier: MIT */
/* The RRef steps of graceful shutdown, the leak check, and local teardown.
 *
 * lib/rpc/shutdown.c runs, in order (docs/API.md, sr_shutdown; docs/RREF.md):
 *   1. a barrier with every worker;
 *   2. sr__rref_shutdown_users: wait until this worker has no pending user,
 *      no pending child and no unacknowledged control message, then
 *   3. delete every UserRRef still alive on its owner (USER_DELETE);
 *   a second barrier, so that every worker has sent its deletes;
 *   4.+5. the quiescence waves: no call and no RRef message is in flight or
 *      being processed anywhere, so every delete has been applied and no
 *      OwnerRRef can lose another fork;
 *   6. sr__rref_shutdown_check: OwnerRRefs that nothing forked are dropped;
 *      every fork still alive is a leak;
 *   a final barrier, then 7. local teardown (sr__rref_fini), always.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"
#include "hooks.h"
#include "rref_internal.h"

#define LEAKS_IN_ERROR 4
#define LEAKS_ON_STDERR 32

/* Mark up to AFTER_MAX users deleted and queue their deletes; false if none was left. */
static bool delete_some_users(struct after *d)
{
    struct rref_ctx *c = &sr__rref_ctx;
    size_t pos = 0;
    uint64_t fid;
    void *p;
    int n = 0;
    while (n < AFTER_MAX && sr__map_next(&c->users, &pos, &fid, &p)) {
        sr_rref *r = p;
        if (atomic_load_explicit(&r->deleted, memory_order_relaxed)) /* relaxed: under the lock */
            continue;
        sr__user_delete_locked(r, d);
        n++;
    }
    return n > 0;
}

int sr__rref_shutdown_users(int64_t deadline)
{
    struct rref_ctx *c = &sr__rref_ctx;
    double left = deadline < 0 ? 0 : (double)(deadline - sr__now_ns()) / 1e9;
    /* A child lost with a worker that died is reported once to a caller of
     * sr_rref_wait_idle; where the job replaces ranks that death was not
     * the end of the job, and does not fail its shutdown (its parent was
     * released when the death was handled). */
    int rc = sr__rref_wait_idle(deadline < 0 ? 0 : (left > 0 ? left : 1e-9), !sr__rpc_replaces());
    if (rc)
        return sr__fail(rc, "sr_shutdown", "waiting for pending RRef users and children: %s", sr_last_error());
    for (bool more = true; more;) {
        struct after d;
    sr__after_init(&d);
        sr__rref_lock();
        more = c->active && delete_some_users(&d);
        sr__rref_unlock();
        sr__after_run(&d);
    }
    return 0;
}

/* Drop the records of owners with no fork left (never forked, or awaiting a
 * creating call that will not come now); their refs go into drop. */
static size_t drop_unforked_locked(sr_rref **drop, size_t cap)
{
    struct rref_ctx *c = &sr__rref_ctx;
    size_t n = 0, pos = 0;
    uint64_t rid;
    void *p;
    while (n < cap && sr__map_next(&c->owners, &pos, &rid, &p)) {
        sr_rref *o = p;
        if (sr__forks_count(&c->forks, rid))
            continue;
        sr__map_del(&c->owners, rid);
        pos = 0; /* the table moved under the iterator */
        c->awaiting -= o->awaiting;
        drop[n++] = o;
    }
    return n;
}

static void drop_unforked(void)
{
    sr_rref *drop[64];
    size_t n;
    do {
        sr__rref_lock();
        n = drop_unforked_locked(drop, 64);
        sr__rref_unlock();
        for (size_t i = 0; i < n; i++) {
            char s[96];
            sr__rref_owner_fail(drop[i], -SR_ESHUTDOWN, "%s was never created: RPC shut down first",
                                sr_rref_str(drop[i], s, sizeof(s)));
            sr_rref_unref(drop[i]);
        }
    } while (n == 64);
}

/* "Leaking RRef (0,3) with fork id (1,7)" for each live fork: the first 32
 * on stderr, the first few in the error. Returns the number of leaks. */
static size_t report_leaks(char *msg, size_t len)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr__rref_lock();
    size_t n = c->forks.live;
    uint64_t (*all)[2] = n ? malloc(n * sizeof(*all)) : NULL;
    n = all ? sr__forks_all(&c->forks, all, n) : n;
    sr__rref_unlock();
    size_t used = (size_t)snprintf(msg, len, "Detected RRef Leaks during shutdown: %zu fork%s still alive after every "
                                   "user was deleted:", n, n == 1 ? "" : "s");
    for (size_t i = 0; all && i < n; i++) {
        char a[32], b[32], line[96];
        snprintf(line, sizeof(line), "Leaking RRef %s with fork id %s", sr__id_str(all[i][0], a, sizeof(a)),
                 sr__id_str(all[i][1], b, sizeof(b)));
        if (i < LEAKS_ON_STDERR)
            sr_logf(SR_LOG_WARN, "%s", line);
        else if (i == LEAKS_ON_STDERR)
            sr_logf(SR_LOG_WARN, "... and %zu more leaking forks", n - i);
        if (i < LEAKS_IN_ERROR && used < len)
            used += (size_t)snprintf(msg + used, len - used, " %s;", line);
    }
    free(all);
    return n;
}

int sr__rref_shutdown_check(void)
{
    struct rref_ctx *c = &sr__rref_ctx;
    /* after quiescence every announcement has landed: the dead generations'
       forks go now even where an ORPHANS_DONE never came */
    sr__rref_drops_run(true);
    drop_unforked();
    char msg[480];
    size_t leaks = report_leaks(msg, sizeof(msg));
    sr__rref_lock();
    size_t users = c->pending_users.n + c->unannounced.n, children = c->children.n, unacked = c->unacked.n;
    bool ignore = c->ignore_leaks;
    sr__rref_unlock();
    if (users || children || unacked)
        sr_logf(SR_LOG_WARN, "sr_shutdown: after quiescence, %zu pending users, %zu pending children and %zu "
                            "unacknowledged RRef messages remain", users, children, unacked);
    if (leaks && !ignore)
        return sr__fail(-EBUSY, "sr_shutdown", "%s", msg);
    return 0;
}

/* ---- teardown ------------------------------------------------------------------------ */

static void fail_and_unref_owners(sr_u64map *m)
{
    size_t pos = 0;
    uint64_t k;
    void *p;
    while (sr__map_next(m, &pos, &k, &p)) {
        sr__rref_owner_fail(p, -SR_ESHUTDOWN, "RPC shut down before the RRef's value was set");
        sr_rref_unref(p);
    }
    sr__map_free(m);
}

static void unref_all(sr_u64map *m, bool fail_confirm)
{
    size_t pos = 0;
    uint64_t k;
    void *p;
    while (sr__map_next(m, &pos, &k, &p)) {
        sr_rref *r = p;
        if (fail_confirm && r->confirm)
            sr_future_set_error(r->confirm, -SR_ESHUTDOWN, "RPC shut down before the owner confirmed the RRef");
        sr_rref_unref(r);
    }
    sr__map_free(m);
}

void sr__rref_fini(void)
{
    struct rref_ctx *c = &sr__rref_ctx;
    sr__rref_lock();
    c->active = false;
    atomic_store_explicit(&c->live_gen, 0, memory_order_relaxed); /* relaxed: only ends liveness */
    sr_u64map owners = c->owners, pending = c->pending_users, children = c->children, unacked = c->unacked;
    sr_fork_table forks = c->forks;
    sr_future *idle = c->idle;
    sr__map_free(&c->users); /* weak references */
    sr__map_free(&c->unannounced); /* weak too: their RRefs see the round is over */
    sr__map_free(&c->announce_upto); /* fork ids, not references */
    sr__map_free(&c->child_to); /* ranks, not references */
    size_t lpos = 0;
    uint64_t lrank;
    void *lp;
    while (sr__map_next(&c->lost, &lpos, &lrank, &lp))
        free(lp); /* the dead generations of this round (lost.c) */
    sr__map_free(&c->lost);
    for (lpos = 0; sr__map_next(&c->drops, &lpos, &lrank, &lp);)
        free(lp);
    sr__map_free(&c->drops);
    sr__map_free(&c->orphans); /* tokens, not references */
    atomic_store_explicit(&c->orphans_pending, 0, memory_order_relaxed); /* relaxed: under the lock */
    c->owners = c->pending_users = c->children = c->unacked = (sr_u64map){0};
    c->forks = (sr_fork_table){0};
    c->idle = NULL;
    c->awaiting = 0;
    sr__rref_unlock();
    /* Outside the lock: these may run destructors that drop more RRefs. */
    if (idle) {
        sr_future_set_error(idle, -SR_ESHUTDOWN, "RPC shut down");
        sr_future_unref(idle);
    }
    unref_all(&pending, true);
    unref_all(&children, false);
    fail_and_unref_owners(&owners);
    size_t pos = 0;
    uint64_t k;
    void *p;
    while (sr__map_next(&unacked, &pos, &k, &p))
        free(p);
    sr__map_free(&unacked);
    sr__forks_free(&forks);
}
