/* Distributed autograd as a protocol module of the agent (lib/rpc/module.h):
 * forward recording (record.c), backward requests (backward.c), cleanup
 * (cleanup.c) and RRef.backward (rref_backward.c). */
#include <errno.h>

#include "modules/dist_autograd/context.h"
#include "error.h"
#include "rpc/module.h"
#include "rpc/wire.h"

void sr__dist_record_hooks(sr_module *m);

static int da_serve(int caller, uint8_t sub, uint64_t tag, sr_value *args, sr_future **out)
{
    switch (sub) {
    case SR_DA_PROPAGATE: return sr__dist_serve_propagate(caller, tag, args, out);
    case SR_DA_RREF_BACKWARD: return sr__dist_serve_rref_backward(caller, tag, args, out);
    }
    return sr__fail(-EBADMSG, "sr_dist_autograd", "unknown request kind %u from worker%d", sub, caller);
}

static int da_init(const sr_init_opts *o)
{
    (void)o;
    return sr__dctx_container_init(sr__rpc_rank(), sr__rpc_world());
}

/* Names for the profiler (probe.h). */
static const char *da_describe(int type, uint8_t sub)
{
    if (type == SR_MSG_DA_CLEANUP)
        return "cleanup";
    return type != SR_MSG_MOD_REQ ? NULL : sub == SR_DA_PROPAGATE ? "backward" : sub == SR_DA_RREF_BACKWARD ? "rref_backward" : NULL;
}

static sr_module da_module = {
    .name = "dist_autograd",
    .types = {SR_MSG_DA_CLEANUP},
    .on_msg = sr__dist_on_cleanup,
    .serve = da_serve,
    .describe = da_describe,
    .init = da_init,
    .fini = sr__dctx_container_fini,
};

__attribute__((constructor)) static void da_register(void)
{
    sr__dist_record_hooks(&da_module);
    sr__module_register(SR_MOD_DIST_AUTOGRAD, &da_module);
}
