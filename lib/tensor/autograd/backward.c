/* SPDX-License-Identifier: MIT */
/* sr_backward / sr_backward_multi: a local graph task from tensor roots. */
#include <errno.h>
#include <stdlib.h>

#include "engine.h"
#include "error.h"
#include "tensor_impl.h"

/* The gradient for root i: the caller's (checked) or an implicit 1. */
static int root_grad(sr_tensor *root, sr_tensor *given, size_t i, sr_tensor **out)
{
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    if (!root)
        return sr__fail(-EINVAL, "sr_backward", "root %zu is NULL", i);
    if (!root->requires_grad)
        return sr__fail(-EINVAL, "sr_backward",
                        "element %zu of tensors does not require grad and does not have a grad_fn", i);
    if (given) {
        if (!sr__same_shape(given, root) || given->dtype != root->dtype)
            return sr__fail(-EINVAL, "sr_backward",
                            "Mismatch in shape: grad_output[%zu] has a shape of %s %s and output[%zu] has a "
                            "shape of %s %s",
                            i, sr_dtype_name(given->dtype), sr__shape_str(given->ndim, given->shape, b1), i,
                            sr_dtype_name(root->dtype), sr__shape_str(root->ndim, root->shape, b2));
        *out = sr_tensor_ref(given);
        return 0;
    }
    if (sr_tensor_numel(root) != 1)
        return sr__fail(-EINVAL, "sr_backward", "grad can be implicitly created only for scalar outputs");
    *out = sr__full_like(root, 1.0);
    return *out ? 0 : -ENOMEM;
}

static int run_task(sr_edge *edges, sr_tensor **grads, size_t n, bool retain_graph)
{
    sr_graph_task *g;
    int rc = sr__graph_task_create(retain_graph, NULL, &g);
    if (rc)
        return rc;
    for (size_t i = 0; !rc && i < n; i++)
        rc = sr__graph_task_add_root(g, edges[i]);
    for (size_t i = 0; !rc && i < n; i++)
        rc = sr__graph_task_feed(g, edges[i], grads[i]);
    if (!rc)
        rc = sr__graph_task_run(g);
    sr__graph_task_destroy(g);
    return rc;
}

SR_API int sr_backward_multi(sr_tensor *const *roots, sr_tensor *const *grad_roots, size_t n, bool retain_graph)
{
    if (!roots || n == 0)
        return sr__fail(-EINVAL, "sr_backward", "No tensors provided for gradient computation");
    sr_edge *edges = calloc(n, sizeof(*edges));
    sr_tensor **grads = calloc(n, sizeof(*grads));
    int rc = edges && grads ? 0 : sr__fail(-ENOMEM, "sr_backward", "out of memory");
    for (size_t i = 0; !rc && i < n; i++)
        rc = root_grad(roots[i], grad_roots ? grad_roots[i] : NULL, i, &grads[i]);
    for (size_t i = 0; !rc && i < n; i++) {
        edges[i] = sr__tensor_gradient_edge(roots[i]);
        if (!edges[i].fn)
            rc = -ENOMEM;
    }
    if (!rc)
        rc = run_task(edges, grads, n, retain_graph);
    for (size_t i = 0; edges && grads && i < n; i++) {
        sr__node_unref(edges[i].fn);
        sr_tensor_unref(grads[i]);
    }
    free(edges);
    free(grads);
    return rc;
}

SR_API int sr_backward(sr_tensor *root, bool retain_graph)
{
    return sr_backward_multi(&root, NULL, 1, retain_graph);
}
