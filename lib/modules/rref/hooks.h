/* SPDX-License-Identifier: MIT */
/* What the RRef module (module.c) plugs into the agent's hooks (internal;
 * lib/rpc/module.h): RRef values in the codec (forks), remote()'s kept
 * results, to_here's fetch, the gate that defers calls on an owner until its
 * own RRef arguments have their values, proxy calls, the control messages,
 * peer death, and the graceful-shutdown steps. No timer: nothing here is
 * ever due at a time.
 */
#ifndef SR_RREF_HOOKS_H
#define SR_RREF_HOOKS_H

#if !defined(SR__IN_RREF)
#error "hooks.h is private to the rref module layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "module.h"
#include "shmrpc/rref.h"

/* ---- codec ------------------------------------------------------------------
 * An RRef travels as its ids and owner: SR_RREF_WIRE_SIZE bytes after the
 * kind tag (rref_id u64, fork_id u64, owner u16, the owner's generation
 * u32). The fork id is new for every send, made by the sender (the parent),
 * so the parent's rank is the fork id's rank. */
#define SR_RREF_WIRE_SIZE 22

/* 0 if r can be sent now, else -errno naming why (a failed or timed-out
 * remote(): "RRef creation ..."; deleted; another round). */
int sr__rref_sendable(const sr_rref *r, const char *fn);
/* Prepare a child fork for one send to rank `to` (-1: not known) (PyTorch's
 * prepareChildFork): an owner registers the fork at once (early fork
 * registration); a user keeps itself as the child's parent until the child
 * is accepted (G2), and remembers `to`, so that the death of the child's
 * worker (or of the owner) releases it. 0 or -ENOMEM. */
int sr__rref_fork(sr_rref *r, int to, uint64_t *fork_id);
/* Undo sr__rref_fork for a send that will not happen. */
void sr__rref_unfork(sr_rref *r, uint64_t fork_id);
/* Validate an encoded RRef; 0 or -EBADMSG with the reason in why. */
int sr__rref_wire_check(uint64_t rid, uint64_t fid, unsigned owner, char *why, size_t len);
/* Materialise a received RRef and tell its owner and parent what they need
 * (notifyOwnerAndParentOfFork). Also how a buffer that will never be decoded
 * is released: decoding it and dropping the result is always right. */
int sr__rref_from_wire(uint64_t rid, uint64_t fid, unsigned owner, uint32_t owner_gen, sr_rref **out);

/* ---- dispatch ---------------------------------------------------------------- */

/* A REMOTE_CALL arrived: the OwnerRRef (created, or awaited by earlier uses)
 * with the creator's fork (rid + 1) added. A reference for the call; NULL
 * on -ENOMEM. */
sr_rref *sr__rref_remote_owner(uint64_t rid, int caller);
/* The creating call finished: the value, or the error text with its cause
 * (the failed function's own code, which to_here's callers read from
 * sr_last_error_code() / sr_future_error_code()). */
void sr__rref_owner_set(sr_rref *owner, int err, int cause, const char *text, sr_value *v);
/* RREF_FETCH: the owner's value future (a reference), or NULL with code and
 * text when the RRef is known to be deleted. */
sr_future *sr__rref_fetch_value(uint64_t rid, bool confirmed, int *code, char *text, size_t len);
/* NULL when every OwnerRRef in args has its value (UserRRefs never wait:
 * an unconfirmed one is safe to use, see use.c); else a future (a
 * reference) that completes when they have. */
sr_future *sr__rref_gate(sr_value *args);
/* Proxy calls: the local value of the OwnerRRef in arg0 (a new reference),
 * or -errno with sr_last_error() set. */
int sr__rref_proxy_value(const sr_value *arg0, sr_value **out);
/* An SR_MSG_RREF control message. */
void sr__rref_ctrl(int from, uint8_t type, const uint8_t *bytes, size_t len);

/* ---- agent ------------------------------------------------------------------- */

/* A peer died: drop what is owed to it, fail what waited for it (pending
 * users it was to confirm fail with an error naming it). */
void sr__rref_peer_died(int rank, const char *why);

/* ---- lifecycle ------------------------------------------------------------------ */

int sr__rref_init(int rank, int world, bool ignore_leaks);
/* Graceful shutdown, after the first barrier: wait until this worker has no
 * pending user or child, then delete every UserRRef on its owner. */
int sr__rref_shutdown_users(int64_t deadline_ns);
/* After quiescence: drop owners nobody forked, then the leak check. */
int sr__rref_shutdown_check(void);
/* Local teardown (always): forget everything; RRefs still held by the
 * application fail every later use. */
void sr__rref_fini(void);

#endif
