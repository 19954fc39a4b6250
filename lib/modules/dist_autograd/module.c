/* SPDX-License-Identifier: MIT */
/* Distributed autograd as a protocol module of the agent (lib/rpc/module.h):
 * forward recording (record.c), backward requests (backward.c), cleanup
 * (cleanup.c) and RRef.backward (rref_backward.c). */
#include <errno.h>

#include "context.h"
#include "error.h"
#include "module.h"

int sr__dist_module = -1;

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

/* Names for the profiler (module.h, "Probes"). */
static const char *da_describe_msg(uint8_t type, const uint8_t *bytes, size_t len)
{
    (void)bytes, (void)len;
    return type == SR_DA_MSG_CLEANUP ? "cleanup" : NULL;
}

static const char *da_describe_request(uint8_t sub)
{
    return sub == SR_DA_PROPAGATE ? "backward" : sub == SR_DA_RREF_BACKWARD ? "rref_backward" : NULL;
}

static const struct sr_module_life_ops da_life = {
    .init = da_init,
    .fini = sr__dctx_container_fini,
    .peer_died = sr__dist_peer_died,
};

static const struct sr_module_request_ops da_request = {
    .serve = da_serve,
    .describe = da_describe_request,
};

static const struct sr_module_msg_ops da_msg = {
    .ntypes = 1,
    .on_msg = sr__dist_on_cleanup,
    .describe = da_describe_msg,
};

static const sr_module da_module = {
    .name = "dist_autograd",
    .call = &sr__dist_call_ops,
    .tls = &sr__dist_tls_ops,
    .life = &da_life,
    .request = &da_request,
    .msg = &da_msg,
};

__attribute__((constructor)) static void da_register(void)
{
    sr__dist_module = sr__module_register(&da_module, NULL);
}
