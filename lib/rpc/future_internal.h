/* SPDX-License-Identifier: MIT */
/* Futures, internal side: how the runtime waits on and completes them.
 *
 * The state word is also the futex word of sleepers:
 *   PENDING -> COMPLETING (the completer won; others get -EALREADY)
 *           -> DONE       (result published; release, pairs with waiters' acquire)
 * A sleeper sets the WAITERS bit before it sleeps; a completer whose exchange
 * to DONE returns a word with WAITERS set issues the futex wake. So an
 * uncontended completion makes no syscall. A thread that polls the worker's
 * inbox while it waits (it sleeps on the doorbell, not on the future) sets
 * the POLLER bit instead (sr__future_arm_wake); a completer that finds it
 * calls the wake hook, which rings that worker's doorbell.
 */
#ifndef SR_RPC_FUTURE_INTERNAL_H
#define SR_RPC_FUTURE_INTERNAL_H

#if !defined(SR__IN_RPC)
#error "future_internal.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "module.h" /* the part of the futures' internals that modules use */
#include "shmrpc/future.h"

/* How a thread waits for a future. The RPC agent installs a hook that polls
 * the worker's inbox while it waits (so a caller needs no thread hop to see
 * its own response). Without a hook, waits sleep on the future's word.
 * Returns 0 once the future is done, -ETIMEDOUT at the deadline (< 0: none). */
typedef int (*sr_wait_hook)(sr_future *f, int64_t deadline_ns);
/* Install the hooks (the agent, at sr_init). They are never removed: each
 * finds the live agent itself (agent.h, "Lifetime"), so a thread that read a
 * hook while another shuts down never calls into freed memory. */
void sr__future_set_hooks(sr_wait_hook wait, void (*wake)(void));
/* The modules' thread context around user callbacks (modules.c, when a
 * module with a tls group registers): capture it when a user callback is
 * added, swap it in and out around the callback. */
struct sr_tls_snap;
void sr__future_set_tls_hooks(void (*capture)(struct sr_tls_snap *s), void (*swap)(struct sr_tls_snap *s));

/* Ask the completer of f to call the wake hook. False if f is already done. */
bool sr__future_arm_wake(sr_future *f);

/* The same without the wait hook: sleep on the future's word only. */
int sr__future_wait_plain(sr_future *f, int64_t deadline_ns);

/* Sleep (futex) until the future is done or the deadline passes. */
void sr__future_sleep(sr_future *f, int64_t deadline_ns);

/* For a thread that sleeps on the future together with other words
 * (futex_waitv): set the WAITERS bit and give the word and the value to
 * sleep on (a private futex). false: the future is done or its state moved,
 * so re-check instead of sleeping. */
bool sr__future_wait_word(sr_future *f, _Atomic uint32_t **word, uint32_t *val);


/* sr_future_set_result for a completer that holds a reference to f for the
 * whole call (no reference of its own is taken): adopts v (NULL: None),
 * which is dropped if f is already complete (-EALREADY). */
int sr__future_complete_held(sr_future *f, sr_value *v);

/* The stored error of a completed future (0 if it holds a value). */
int sr__future_error(const sr_future *f);

/* A new future for an RPC call of sr_rpc_async or sr_rpc_sync (NULL: no
 * memory), marked as a call's: its waiter is a caller, which serves no plain
 * call while it waits (agent.h, "Serving waiters"). It holds two
 * references, the caller's and the call slot's: sr__rpc_start hands the
 * second to the slot without a locked add, or drops it if the call does not
 * start (calls.c). sr__future_is_call: was f made so? */
sr_future *sr__future_new_call(void);
bool sr__future_is_call(const sr_future *f);

#endif
