/* SPDX-License-Identifier: MIT */
/* RRef.backward: a backward pass from the scalar tensor an RRef holds, run
 * on its owner: distributed in a context, or local into .grad (owner only).
 * A user asks the owner with a module request; the owner roots the pass
 * without holding a thread (backward.c). */
#include <errno.h>

#include "context.h"
#include "error.h"
#include "module.h"

static const char *who = "sr_rref_backward";

/* The owner's tensor (borrowed from v), or NULL with PyTorch's error. */
static sr_tensor *value_tensor(sr_value *v)
{
    sr_tensor *t = sr_value_type(v) == SR_KIND_TENSOR ? sr_value_tensor(v) : NULL;
    if (!t)
        sr__fail(-EINVAL, who, "RRef should contain a tensor for .backward()");
    return t;
}

static int owner_backward(sr_rref *r, int64_t ctx, bool retain, sr_future **out)
{
    sr_value *v = NULL;
    int rc = sr_rref_local_value(r, &v);
    sr_tensor *t = rc ? NULL : value_tensor(v);
    if (!rc && !t)
        rc = -EINVAL;
    if (!rc && ctx == SR_NO_CONTEXT) {
        rc = sr_backward(t, retain);
        sr_future *f = rc ? NULL : sr_future_new();
        if (f)
            sr_future_set_result(f, NULL);
        rc = rc ? rc : f ? 0 : -ENOMEM;
        *out = f;
    } else if (!rc) {
        rc = sr__dist_backward_async(ctx, &t, 1, retain, out);
    }
    sr_value_unref(v);
    return rc;
}

int sr__dist_serve_rref_backward(int caller, uint64_t ctx, sr_value *args, sr_future **out)
{
    (void)caller;
    sr_rref *r = sr_value_rref(sr_value_list_at(args, 0));
    if (sr_value_list_len(args) != 2 || !r || !sr_rref_is_owner(r))
        return sr__fail(-EBADMSG, who, "a malformed RRef backward request");
    return owner_backward(r, (int64_t)ctx, sr_value_bool(sr_value_list_at(args, 1)), out);
}

SR_API int sr_rref_backward(sr_rref *r, int64_t context_id, bool retain_graph)
{
    if (!r)
        return sr__fail(-EINVAL, who, "rref is NULL");
    sr_future *f = NULL;
    int rc;
    if (sr_rref_is_owner(r)) {
        rc = owner_backward(r, context_id, retain_graph, &f);
    } else if (context_id == SR_NO_CONTEXT) {
        return sr__fail(-EINVAL, who, "User RRefs require 'dist_autograd_ctx_id' to be specified");
    } else {
        sr_value *args[2] = {sr_value_from_rref(r), sr_bool(retain_graph)};
        rc = args[0] && args[1] ? sr__module_rpc(sr_rref_owner(r), sr__dist_module, SR_DA_RREF_BACKWARD,
                                                 (uint64_t)context_id, (sr_args){2, args},
                                                 sr__rpc_default_timeout_ms(), &f, who)
                                : -ENOMEM;
        sr_value_unref(args[0]);
        sr_value_unref(args[1]);
    }
    if (rc)
        return rc;
    rc = sr__module_wait(f, -1);
    rc = rc ? rc : sr_future_value(f, NULL);
    sr_future_unref(f);
    return rc;
}
