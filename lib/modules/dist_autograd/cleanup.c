/* SPDX-License-Identifier: MIT */
/* Releasing a context: locally, then on every worker it knows, which do the
 * same with the workers they know (transitive). A cleanup is a one-way
 * module message (nobody waits for it, so it has no answer to wait for):
 * the context id in the first 8 data bytes. A cleanup for a context a worker
 * does not have is a no-op that remembers the id (container.c), so a request
 * that the cleanup overtook does not create it again: idempotent. The
 * transport never drops a message (a full inbox queues it), so there is
 * nothing to retry, and a dead peer needs no cleanup: its death makes every
 * context forget it (sr__dist_peer_died), so no cleanup goes to the next
 * generation of its rank either.
 */
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "error.h"
#include "module.h"

static void send_cleanup(int64_t ctx_id, int to)
{
    sr__module_send(to, sr__dist_module, SR_DA_MSG_CLEANUP, &ctx_id, sizeof(ctx_id), false); /* counted: graceful shutdown waits for it to be read */
}

void sr__dist_release(sr_dctx *c, int except)
{
    sr_dctx *mine = sr__dctx_remove(c->id);
    if (!mine) /* released already */
        return;
    int self = sr__rpc_rank(), world = sr__rpc_world();
    int *ranks = malloc((size_t)(world > 0 ? world : 1) * sizeof(*ranks));
    size_t n = ranks ? sr__dctx_known(c, ranks, (size_t)world) : 0;
    for (size_t i = 0; i < n && i < (size_t)world; i++)
        if (ranks[i] != self && ranks[i] != except)
            send_cleanup(c->id, ranks[i]);
    free(ranks);
    sr__dctx_unref(mine);
}

/* Test hook (tests/dist_autograd/test_dist_autograd_replace.c): cleanups
 * that found no context here. */
_Atomic uint64_t sr__dist_cleanups_unknown;

void sr__dist_on_cleanup(int from, uint8_t type, const uint8_t *bytes, size_t len)
{
    (void)type; /* the module has one */
    int64_t id = 0;
    memcpy(&id, bytes, len < sizeof(id) ? len : sizeof(id));
    sr_dctx *c = sr__dctx_find(id);
    if (c) {
        sr__dist_release(c, from);
    } else {
        sr__dctx_unref(sr__dctx_remove(id)); /* remembers the id */
        atomic_fetch_add_explicit(&sr__dist_cleanups_unknown, 1, memory_order_relaxed); /* relaxed: a statistic */
    }
    sr__dctx_unref(c);
}
