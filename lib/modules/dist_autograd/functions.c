/* SPDX-License-Identifier: MIT */
/* SendRpcBackward and RecvRpcBackward: the graph's ends at an RPC.
 *
 * A send function stands on the sender for the tensors a message carried:
 * its inputs are the gradients that come back for them by RPC (fed by a
 * backward request), and it passes each one along its edge to the tensor's
 * own graph. A recv function stands on the receiver as the grad_fn of the
 * tensors that arrived: when the pass reaches it, it sends their gradients
 * back to the sender's send function (zeros for a tensor that got none, as
 * PyTorch does, so the sender's graph is never left waiting).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "error.h"

struct send_fn {
    sr_node base;
    int64_t msg_id;
    int peer;
    char call[64]; /* the function called, for error texts */
};

struct recv_meta {
    sr_dtype dtype;
    int ndim;
    int64_t shape[SR_MAX_DIMS];
};

struct recv_fn {
    sr_node base;
    int64_t ctx_id, msg_id;
    int peer;
    struct recv_meta *meta; /* [num_inputs]: zeros for missing gradients */
};

static int send_apply(sr_node *n, sr_tensor *const *in, sr_tensor **out)
{
    for (uint32_t i = 0; i < n->num_next; i++)
        out[i] = in[i] ? sr_tensor_ref(in[i]) : NULL;
    return 0;
}

static const sr_node_ops send_ops = {.name = "SendRpcBackward", .apply = send_apply};

static int recv_apply(sr_node *n, sr_tensor *const *in, sr_tensor **out)
{
    (void)out;
    struct recv_fn *r = (struct recv_fn *)n;
    sr_tensor **grads = calloc(n->num_inputs ? n->num_inputs : 1, sizeof(*grads));
    if (!grads)
        return sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory");
    int rc = 0;
    for (uint32_t i = 0; !rc && i < n->num_inputs; i++) {
        grads[i] = in[i] ? sr_tensor_ref(in[i]) : sr_zeros(r->meta[i].dtype, r->meta[i].ndim, r->meta[i].shape, 0);
        rc = grads[i] ? 0 : -ENOMEM;
    }
    if (!rc)
        rc = sr__dist_send_grads(r->ctx_id, r->msg_id, r->peer, grads, n->num_inputs);
    for (uint32_t i = 0; i < n->num_inputs; i++)
        sr_tensor_unref(grads[i]);
    free(grads);
    return rc;
}

static void recv_destroy(sr_node *n) { free(((struct recv_fn *)n)->meta); }

static const sr_node_ops recv_ops = {
    .name = "RecvRpcBackward", .apply = recv_apply, .destroy = recv_destroy, .apply_without_grads = true};

sr_node *sr__send_fn_create(sr_tensor *const *ts, size_t n, int peer, const char *fn)
{
    struct send_fn *s = (struct send_fn *)sr__node_create(&send_ops, sizeof(*s), (uint32_t)n, (uint32_t)n, 0);
    if (!s)
        return NULL;
    s->peer = peer;
    s->msg_id = SR_NO_CONTEXT;
    snprintf(s->call, sizeof(s->call), "%s", fn ? fn : "?");
    for (size_t i = 0; i < n; i++) {
        sr_edge e = sr__tensor_gradient_edge(ts[i]); /* a reference */
        if (!e.fn) {
            sr__node_unref(&s->base);
            return NULL;
        }
        sr__node_set_edge(&s->base, (uint32_t)i, e);
        sr__node_unref(e.fn);
    }
    return &s->base;
}

sr_node *sr__recv_fn_create(int64_t ctx_id, int64_t msg_id, int peer, sr_tensor *const *ts, size_t n)
{
    struct recv_fn *r = (struct recv_fn *)sr__node_create(&recv_ops, sizeof(*r), (uint32_t)n, 0, 0);
    if (!r)
        return NULL;
    r->ctx_id = ctx_id;
    r->msg_id = msg_id;
    r->peer = peer;
    r->meta = calloc(n ? n : 1, sizeof(*r->meta));
    if (!r->meta) {
        sr__node_unref(&r->base);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        r->meta[i].dtype = sr_tensor_dtype(ts[i]);
        r->meta[i].ndim = sr_tensor_ndim(ts[i]);
        memcpy(r->meta[i].shape, sr_tensor_shape(ts[i]), (size_t)r->meta[i].ndim * sizeof(int64_t));
        sr__tensor_set_history(ts[i], &r->base, (uint32_t)i);
    }
    return &r->base;
}

bool sr__is_send_fn(const sr_node *n) { return n->ops == &send_ops; }
int sr__send_fn_peer(const sr_node *n) { return ((const struct send_fn *)n)->peer; }
const char *sr__send_fn_call(const sr_node *n) { return ((const struct send_fn *)n)->call; }
int sr__recv_fn_peer(const sr_node *n) { return ((const struct recv_fn *)n)->peer; }

int64_t sr__fn_message_id(const sr_node *n)
{
    return n->ops == &send_ops ? ((const struct send_fn *)n)->msg_id : ((const struct recv_fn *)n)->msg_id;
}

void sr__send_fn_set_id(sr_node *n, int64_t msg_id) { ((struct send_fn *)n)->msg_id = msg_id; }
