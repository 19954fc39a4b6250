/* Releasing a context: locally, then on every worker it knows, which do the
 * same with the workers they know (transitive). A cleanup for a context a
 * worker does not have is a no-op that remembers the id (container.c), so a
 * request that the cleanup overtook does not create it again: idempotent.
 * Cleanups are module requests that nobody waits for; the transport never
 * drops a message (a full inbox queues it), so there is nothing to retry,
 * and a dead peer needs no cleanup.
 */
#include <stdlib.h>

#include "dist_autograd/context.h"
#include "error.h"
#include "rpc/module.h"

static void send_cleanup(int64_t ctx_id, int to)
{
    sr_future *f = NULL;
    if (!sr__module_rpc(to, SR_MOD_DIST_AUTOGRAD, SR_DA_CLEANUP, (uint64_t)ctx_id, (sr_args){0, NULL},
                        sr__rpc_default_timeout_ms(), &f))
        sr_future_unref(f); /* fire and forget; graceful shutdown still waits for it */
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

int sr__dist_serve_cleanup(int caller, uint64_t ctx_id, sr_future **out)
{
    sr_dctx *c = sr__dctx_find((int64_t)ctx_id);
    if (c)
        sr__dist_release(c, caller);
    else
        sr__dctx_unref(sr__dctx_remove((int64_t)ctx_id)); /* remembers the id */
    sr__dctx_unref(c);
    sr_future *f = sr_future_new();
    if (!f)
        return sr__fail(-ENOMEM, "sr_dist_autograd_context_end", "out of memory");
    sr_future_set_result(f, NULL);
    *out = f;
    return 0;
}
