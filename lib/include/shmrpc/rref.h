/* SPDX-License-Identifier: MIT */
/* shmrpc: remote references (torch.distributed.rpc.RRef).
 *
 * An RRef names a value that lives on one worker, its owner. The owner holds
 * the one OwnerRRef, with the value; any number of UserRRefs on other
 * workers refer to it. RRefs may be passed freely, as arguments and results,
 * nested in lists, in every direction (user -> owner, owner -> user, user ->
 * user, to self): passing one forks it, and the fork/ACK protocol (docs/
 * RREF.md) makes the owner delete the value exactly when no UserRRef is left
 * anywhere and no local reference holds the OwnerRRef.
 *
 * Ids: every RRef has a globally unique rref id, and every UserRRef a fork
 * id, both (created_on rank, local counter) packed as rank << 48 | counter,
 * from one per-process counter. Their string form is "(rank,counter)".
 *
 * Lifetime: RRefs are refcounted. A function that hands an RRef back through
 * **out gives the caller one reference; sr_rref_unref() drops it. Dropping
 * the last reference to a UserRRef tells its owner (G1). An RRef outlives
 * sr_shutdown() as an object, but every operation on it then fails with
 * -SR_ESHUTDOWN (graceful shutdown deletes every UserRRef on its owner).
 *
 * Threads: every call may be made from any thread, concurrently.
 *
 * Errors are -errno / -SR_E* with the detail in sr_last_error():
 *   -SR_ESHUTDOWN  RPC not initialised, or the RRef belongs to a shut-down round
 *   -EINVAL        bad argument; local_value on a user (names both workers)
 *   -ETIMEDOUT     "RRef creation via rpc.remote() timed out, ..." (a timed-out
 *                  remote(), raised on the RRef's next use), or a to_here /
 *                  proxy call that ran past its own timeout
 *   -SR_EREMOTE    the function that made the value failed: "Error on Node 1: ..."
 *   -SR_EOWNERLOST the owner died (or its rank was replaced): the value is lost;
 *                  every use fails at once, naming the owner, its rank and generation
 *   plus the errors of the calls in rpc.h
 */
#ifndef SHMRPC_RREF_H
#define SHMRPC_RREF_H

#if defined(SR__BUILDING) && !defined(SR__SEES_RREF)
#error "shmrpc/rref.h belongs to the rref module layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "future.h"
#include "rpc.h"
#include "value.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An id's parts, and the "no id" value (an OwnerRRef has no fork id). */
#define SR_RREF_NO_ID UINT64_MAX
#define SR_RREF_ID_RANK(id) ((int)((id) >> 48))
#define SR_RREF_ID_LOCAL(id) ((id) & ((UINT64_C(1) << 48) - 1))

/* ---- creating ------------------------------------------------------------ */

/* Run fn(args) on worker `to` and keep its result there: *out is at once a
 * UserRRef to it, or an OwnerRRef when `to` is this worker. Arguments are
 * borrowed, as in sr_rpc_async. timeout_s bounds the creation (the function's
 * run included; 0 the default, SR_TIMEOUT_NONE none): a creation that fails or times out
 * is stored on the RRef and raised by its next use (to_here, a fork, a
 * proxy), e.g. "RRef creation via rpc.remote() timed out, ...". An error of
 * the function itself is the RRef's value: to_here() raises it. Errors
 * returned directly: those of sr_rpc_async (bad rank, name, arguments). */
SR_API int sr_remote(int to, const char *fn, sr_args args, double timeout_s, sr_rref **out);

/* A local OwnerRRef holding v (RRef(v)); it takes its own reference to v.
 * It enters the RRef context only when it is first forked. */
SR_API int sr_rref_create(sr_value *v, sr_rref **out);

SR_API sr_rref *sr_rref_ref(sr_rref *r);
SR_API void sr_rref_unref(sr_rref *r); /* NULL is a no-op */

/* A new value that holds an RRef (it takes its own reference to r), and
 * the RRef inside a value (an accessor: borrowed; NULL if v is not an
 * RRef). Passing such a value in a call forks the RRef. */
SR_API sr_value *sr_value_from_rref(sr_rref *r);
SR_API sr_rref *sr_value_rref(const sr_value *v);
/* The old name of sr_value_from_rref, kept for one release. */
SR_API sr_value *sr_rref_value(sr_rref *r) __attribute__((deprecated("use sr_value_from_rref")));
/* The kind of such a value (sr_value_type(v) == SR_KIND_RREF; sr_kind_name
 * gives "rref"). The RRef layer's kind is numbered when the library loads,
 * so SR_KIND_RREF is not a constant expression: compare with it, do not use
 * it as a case label. */
SR_API sr_kind sr_rref_kind(void);
#define SR_KIND_RREF (sr_rref_kind())

/* ---- using --------------------------------------------------------------- */

/* The value. On a user: fetched from the owner (a copy; tensors share
 * storage, copy-on-write). On the owner: the value itself, once it is set.
 * timeout_s: 0 the default, SR_TIMEOUT_NONE none, negative or NaN -EINVAL
 * (rpc.h). "... has been deleted. Cannot call
 * to_here() on it after deletion." after the RRef was deleted on its owner. */
SR_API int sr_rref_to_here(sr_rref *r, double timeout_s, sr_value **out);

/* Owner only: a new reference in *out to the value itself (the same object
 * on every call), waiting for it, within the default call timeout, if the
 * creating call has not finished. On a user: -EINVAL "For
 * UserRRef(rref_id=(1,5), fork_id=(1,6)), can't call localValue() on user
 * WorkerInfo(id=2, name=worker2). Call it on owner WorkerInfo(id=1, name=worker1)". */
SR_API int sr_rref_local_value(sr_rref *r, sr_value **out);

SR_API int sr_rref_owner(const sr_rref *r);              /* rank; -EINVAL for NULL */
SR_API const char *sr_rref_owner_name(const sr_rref *r); /* NULL after shutdown */
SR_API bool sr_rref_is_owner(const sr_rref *r);
/* True for an OwnerRRef; for a UserRRef, once the owner has acknowledged it. */
SR_API bool sr_rref_confirmed_by_owner(const sr_rref *r);

/* A future completed when the owner has confirmed this RRef (at once for an
 * OwnerRRef or a confirmed user), or failed with the creation error of a
 * remote() (PyTorch's rref._get_future()). */
SR_API int sr_rref_confirmation(sr_rref *r, sr_future **out);

/* Proxies: run fn on the owner with the owner's value as argument 0 and
 * `extra` after it (rref.rpc_sync().fn(*extra) in PyTorch). The value is the
 * owner's object itself, so in-place updates made by one call are seen by
 * the next. The RRef is forked to the owner for the call (the owner's value
 * stays alive while it runs). timeout_s as in sr_rpc_sync. */
SR_API int sr_rref_rpc_sync(sr_rref *r, const char *fn, sr_args extra, double timeout_s, sr_value **out);
SR_API int sr_rref_rpc_async(sr_rref *r, const char *fn, sr_args extra, double timeout_s, sr_future **out);
SR_API int sr_rref_remote(sr_rref *r, const char *fn, sr_args extra, double timeout_s, sr_rref **out);

/* "OwnerRRef(rref_id=(1,5))" or "UserRRef(rref_id=(1,5), fork_id=(1,6))";
 * always NUL-terminated (len > 0); returns buf. */
SR_API const char *sr_rref_str(const sr_rref *r, char *buf, size_t len); /* buf NULL: "" */
SR_API uint64_t sr_rref_id(const sr_rref *r);
SR_API uint64_t sr_rref_fork_id(const sr_rref *r); /* SR_RREF_NO_ID for an OwnerRRef */

/* ---- debug ---------------------------------------------------------------- */

typedef struct sr_rref_debug_info {
    uint64_t num_owner_rrefs;      /* OwnerRRefs in the context (forked, or awaiting creation) */
    uint64_t num_pending_owners;   /* of which created by a use that arrived before the creating call */
    uint64_t num_forks;            /* live forks of owned RRefs (the owner's view of its users) */
    uint64_t num_pending_users;    /* UserRRefs not yet confirmed by their owner */
    uint64_t num_confirmed_users;  /* live UserRRefs no longer pending */
    uint64_t num_pending_children; /* forks sent by this worker, parent held until the child's accept */
    uint64_t num_pending_futures;  /* control messages sent and not yet acknowledged */
    uint64_t num_tombstones;       /* deletes that arrived before the fork they delete */
    uint64_t num_deferred_calls;   /* calls waiting for their RRef arguments to be confirmed */
    uint64_t num_retries;          /* control messages sent again: always 0 (nothing is resent) */
    uint64_t num_ctrl_sent;        /* control messages sent (FORK_REQUEST, CHILD_ACCEPT, USER_DELETE, ACK) */
} sr_rref_debug_info;

SR_API int sr_rref_debug_info_get(sr_rref_debug_info *out);

/* The owner's fork set of rref_id (this worker must be its owner): up to cap
 * fork ids in ascending order into out; returns how many there are. */
SR_API int sr_rref_debug_forks(uint64_t rref_id, uint64_t *out, size_t cap);

/* Wait until this worker has no pending user, no pending child and no
 * unacknowledged control message: every fork and delete it sent has been
 * applied by its receiver. -ETIMEDOUT (timeout_s: 0, the default, or
 * SR_TIMEOUT_NONE: no bound; negative or NaN -EINVAL). */
SR_API int sr_rref_wait_idle(double timeout_s);

/* Graceful shutdown's leak check: true only logs RRefs still forked after
 * every user was deleted, instead of failing sr_shutdown with -EBUSY
 * (PyTorch's _ignore_rref_leak; its library default is to ignore, ours is
 * false). Process-wide; each sr_init reads it, so set it before sr_init. */
SR_API void sr_rref_set_ignore_leak(bool ignore);

#ifdef __cplusplus
}
#endif
#endif
