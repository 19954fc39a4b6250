/* SPDX-License-Identifier: MIT */
/* Test-only delivery mode: seeded reordering and delay of messages (internal).
 *
 * With SHMRPC_REORDER_SEED=<n> set when sr_init runs, every message this
 * worker sends, except the shutdown control messages (SR_MSG_CTRL), is held
 * in a local queue for a random delay and released, in release-time order,
 * by whichever thread pumps the queue after that time: the progress thread
 * on its timer, or a thread polling for its own response. Delays come from a
 * PRNG seeded with (n, rank), so runs are reproducible in their choices
 * (thread timing still varies), and between any pair of workers later
 * messages overtake earlier ones. SHMRPC_REORDER_MAX_US bounds the delay
 * (default 2000 us), SHMRPC_REORDER_MIN_US (default 0) keeps it from below.
 * The mode neither duplicates a message nor loses one, except one held for
 * a generation of its destination that died meanwhile: it is dropped, as a
 * message queued for a dead rank is (outq.c), not delivered to the rank's
 * replacement (the transport stamps a message with the generation of its
 * destination when it is sent).
 *
 * User RPCs keep working under it: nothing in the RPC layer assumes FIFO
 * delivery (PyTorch does not either).
 */
#ifndef SR_RPC_REORDER_H
#define SR_RPC_REORDER_H

#if !defined(SR__IN_RPC)
#error "reorder.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdint.h>

#include "agent.h"

/* Enable the mode if the environment asks for it; 0 or -errno. */
int sr__reorder_create(sr_agent *a);
/* Drop what is still held (after the agent stopped) and free the mode. */
void sr__reorder_destroy(sr_agent *a);
/* Hold a copy of m for `to`. 0; 1 when it is now the first to go (the
 * caller kicks the progress thread, which may sleep with a later timer);
 * or -ENOMEM. */
int sr__reorder_hold(sr_agent *a, int to, const sr_msg *m);
/* Send every held message whose time has come, with send (sr__agent_send_now). */
void sr__reorder_pump(sr_agent *a, int64_t now_ns, int (*send)(sr_agent *a, int to, sr_msg *m));
/* Release time of the next held message, or -1 if none. */
int64_t sr__reorder_next(sr_agent *a);

#endif
