/* SPDX-License-Identifier: MIT */
/* Recording history: what every differentiable op does after its forward. */
#include "engine.h"
#include "tensor_impl.h"

bool sr__any_requires_grad(sr_tensor *const *in, size_t n)
{
    if (!sr__grad_mode())
        return false;
    for (size_t i = 0; i < n; i++)
        if (in[i] && in[i]->requires_grad)
            return true;
    return false;
}

sr_node *sr__node_for_inputs(const sr_node_ops *ops, size_t size, sr_tensor *const *in, size_t n,
                             uint32_t num_outputs, uint32_t num_saved)
{
    sr_node *node = sr__node_create(ops, size, num_outputs, (uint32_t)n, num_saved);
    if (!node)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (!in[i] || !in[i]->requires_grad)
            continue;
        sr_edge e = sr__tensor_gradient_edge(in[i]);
        if (!e.fn) {
            sr__node_unref(node);
            return NULL;
        }
        node->next[i] = e; /* adopts the edge's reference */
    }
    return node;
}

sr_tensor *sr__attach(sr_tensor *out, sr_node *node)
{
    if (!node) {
        sr_tensor_unref(out);
        return NULL;
    }
    sr__tensor_set_history(out, node, 0);
    sr__node_unref(node);
    return out;
}
