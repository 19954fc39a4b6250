/* SPDX-License-Identifier: MIT */
/* Autograd state of a tensor: requires_grad, grad, grad_fn, hooks, and the
 * AccumulateGrad node that feeds a leaf's gradient into .grad or a sink.
 *
 * AccumulateGrad holds a strong reference to its leaf; the leaf points back
 * weakly (tensor->grad_acc), so a leaf used by several ops gets one node and
 * its hooks run once on the total gradient. acc_lock guards grad_acc and
 * serialises updates of .grad by concurrent backward passes. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine.h"
#include "error.h"
#include "tensor_impl.h"

static pthread_mutex_t acc_lock = PTHREAD_MUTEX_INITIALIZER;

void sr__acc_lock(void) { pthread_mutex_lock(&acc_lock); }
void sr__acc_unlock(void) { pthread_mutex_unlock(&acc_lock); }

struct acc_node {
    sr_node base;
    sr_tensor *leaf; /* owned */
};

sr_tensor *sr__accumulate_grad_leaf(const sr_node *n)
{
    return n->ops == &sr__accumulate_grad_ops ? ((const struct acc_node *)n)->leaf : NULL;
}

/* Taking ownership avoids a copy when nobody else can see the gradient. */
static bool can_steal(sr_tensor *g, const sr_tensor *leaf)
{
    /* acquire: pairs with the release side of other holders' unrefs */
    return atomic_load_explicit(&g->refcount, memory_order_acquire) == 1 &&
           atomic_load_explicit(&g->storage->refs, memory_order_acquire) == 1 &&
           sr__block_refcount(g->storage->block) == 1 && !g->requires_grad && g->dtype == leaf->dtype &&
           sr_tensor_is_contiguous(g);
}

static int accumulate_into_grad(sr_tensor *leaf, sr_tensor *g)
{
    int rc = 0;
    sr__acc_lock();
    if (!leaf->grad) {
        leaf->grad = can_steal(g, leaf) ? sr_tensor_ref(g) : sr_clone(g);
        if (!leaf->grad)
            rc = -ENOMEM;
    } else {
        rc = sr_add_(leaf->grad, g, 1.0);
    }
    sr__acc_unlock();
    return rc;
}

/* What a hook returned in place of was must keep its dtype and shape, or
 * the gradient no longer fits its tensor (a [3] would even be broadcast into
 * a [3, 3] .grad). hook names the hook. */
static int check_hook_result(const sr_tensor *was, const sr_tensor *got, const char *hook)
{
    bool same_dtype = got->dtype == was->dtype;
    if (same_dtype && sr__same_shape(got, was))
        return 0;
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    if (!same_dtype)
        return sr__fail(-EINVAL, "sr_backward", "%s has changed the type of value (was %s, got %s)", hook,
                        sr_dtype_name(was->dtype), sr_dtype_name(got->dtype));
    return sr__fail(-EINVAL, "sr_backward", "%s has changed the size of value (was %s, got %s)", hook,
                    sr__shape_str(was->ndim, was->shape, b1), sr__shape_str(got->ndim, got->shape, b2));
}

int sr__run_grad_hook(sr_tensor_hook_fn fn, void *arg, sr_tensor **g, const char *(*name)(const void *, char *),
                      const void *name_arg)
{
    sr_tensor *replace = NULL;
    int rc = fn(*g, &replace, arg);
    if (!rc && replace) {
        char buf[SR__HOOK_NAME_STR];
        rc = check_hook_result(*g, replace, name(name_arg, buf));
    }
    if (rc) {
        sr_tensor_unref(replace);
        return rc;
    }
    if (replace) {
        sr_tensor_unref(*g);
        *g = replace;
    }
    return 0;
}

struct leaf_hook {
    const sr_tensor *leaf;
    const struct sr_hook *h;
};

/* "hook 2 on a leaf f64 [3, 3]": hooks count from 1 in registration order. */
static const char *leaf_hook_name(const void *arg, char *buf)
{
    const struct leaf_hook *w = arg;
    unsigned nr = 1;
    for (const struct sr_hook *h = w->leaf->hooks; h != w->h; h = h->next)
        nr++;
    char b[SR_SHAPE_STR];
    snprintf(buf, SR__HOOK_NAME_STR, "hook %u on a leaf %s %s", nr, sr_dtype_name(w->leaf->dtype),
             sr__shape_str(w->leaf->ndim, w->leaf->shape, b));
    return buf;
}

static int run_leaf_hooks(sr_tensor *leaf, sr_tensor **g)
{
    int rc = 0;
    for (struct sr_hook *h = leaf->hooks; h && !rc; h = h->next)
        rc = sr__run_grad_hook(h->fn, h->arg, g, leaf_hook_name, &(struct leaf_hook){leaf, h});
    return rc;
}

/* g is owned (consumed); sink NULL means .grad. */
int sr__accumulate_grad_run(sr_node *n, sr_tensor *g, sr_grad_sink *sink)
{
    sr_tensor *leaf = ((struct acc_node *)n)->leaf;
    if (!sr__same_shape(g, leaf) || g->dtype != leaf->dtype) {
        char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
        sr__fail(-EINVAL, "sr_backward", "gradient %s %s does not match its leaf %s %s", sr_dtype_name(g->dtype),
                 sr__shape_str(g->ndim, g->shape, b1), sr_dtype_name(leaf->dtype),
                 sr__shape_str(leaf->ndim, leaf->shape, b2));
        sr_tensor_unref(g);
        return -EINVAL;
    }
    int rc = run_leaf_hooks(leaf, &g);
    if (!rc)
        rc = sink ? sink->accumulate(sink, leaf, g) : accumulate_into_grad(leaf, g);
    sr_tensor_unref(g);
    return rc;
}

static int acc_apply(sr_node *n, sr_tensor *const *in, sr_tensor **out)
{
    (void)out;
    return in[0] ? sr__accumulate_grad_run(n, sr_tensor_ref(in[0]), NULL) : 0;
}

static void acc_destroy(sr_node *n)
{
    sr_tensor *leaf = ((struct acc_node *)n)->leaf;
    sr__acc_lock();
    if (leaf->grad_acc == n)
        leaf->grad_acc = NULL;
    sr__acc_unlock();
    sr_tensor_unref(leaf);
}

const sr_node_ops sr__accumulate_grad_ops = {
    .name = "AccumulateGrad",
    .apply = acc_apply,
    .destroy = acc_destroy,
};

/* A new reference on n unless its last reference is already gone. */
static bool try_ref(sr_node *n)
{
    /* relaxed: acc_lock orders this against acc_destroy clearing grad_acc */
    uint32_t c = atomic_load_explicit(&n->refcount, memory_order_relaxed);
    while (c > 0)
        if (atomic_compare_exchange_weak_explicit(&n->refcount, &c, c + 1, memory_order_relaxed,
                                                  memory_order_relaxed))
            return true;
    return false;
}

sr_edge sr__tensor_gradient_edge(sr_tensor *t)
{
    if (t->grad_fn)
        return (sr_edge){sr__node_ref(t->grad_fn), t->output_nr};
    if (!t->requires_grad)
        return (sr_edge){NULL, 0};
    sr__acc_lock();
    sr_node *n = t->grad_acc;
    if (!n || !try_ref(n)) {
        n = sr__node_create(&sr__accumulate_grad_ops, sizeof(struct acc_node), 1, 0, 0);
        if (n) {
            ((struct acc_node *)n)->leaf = sr_tensor_ref(t);
            t->grad_acc = n;
        }
    }
    sr__acc_unlock();
    return (sr_edge){n, 0};
}

void sr__tensor_set_history(sr_tensor *t, sr_node *fn, uint32_t output_nr)
{
    sr__node_ref(fn);
    sr__node_unref(t->grad_fn);
    t->grad_fn = fn;
    t->output_nr = output_nr;
    t->requires_grad = true;
}

SR_API bool sr_tensor_requires_grad(const sr_tensor *t) { return t && t->requires_grad; }
SR_API bool sr_tensor_is_leaf(const sr_tensor *t) { return t && !t->grad_fn; }
SR_API sr_tensor *sr_tensor_grad(const sr_tensor *t) { return t ? t->grad : NULL; }

SR_API const char *sr_tensor_grad_fn_name(const sr_tensor *t)
{
    return t && t->grad_fn ? t->grad_fn->ops->name : NULL;
}

SR_API int sr_tensor_set_requires_grad(sr_tensor *t, bool requires_grad)
{
    if (!t)
        return sr__fail(-EINVAL, "sr_tensor_set_requires_grad", "tensor is NULL");
    if (t->grad_fn)
        return sr__fail(-EINVAL, "sr_tensor_set_requires_grad",
                        "you can only change requires_grad flags of leaf variables");
    if (requires_grad && t->dtype == SR_I64)
        return sr__fail(-EINVAL, "sr_tensor_set_requires_grad",
                        "only tensors of floating point dtype can require gradients (got i64)");
    t->requires_grad = requires_grad;
    return 0;
}

SR_API int sr_tensor_set_grad(sr_tensor *t, sr_tensor *grad)
{
    if (!t)
        return sr__fail(-EINVAL, "sr_tensor_set_grad", "tensor is NULL");
    if (grad && (grad->dtype != t->dtype || !sr__same_shape(grad, t))) {
        char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
        return sr__fail(-EINVAL, "sr_tensor_set_grad", "gradient %s %s does not match the tensor's %s %s",
                        sr_dtype_name(grad->dtype), sr__shape_str(grad->ndim, grad->shape, b1),
                        sr_dtype_name(t->dtype), sr__shape_str(t->ndim, t->shape, b2));
    }
    sr__acc_lock();
    sr_tensor *old = t->grad;
    t->grad = sr_tensor_ref(grad);
    sr__acc_unlock();
    sr_tensor_unref(old);
    return 0;
}

SR_API int sr_tensor_register_hook(sr_tensor *t, sr_tensor_hook_fn fn, void *arg)
{
    if (!t || !fn)
        return sr__fail(-EINVAL, "sr_tensor_register_hook", "tensor or hook is NULL");
    if (!t->requires_grad)
        return sr__fail(-EINVAL, "sr_tensor_register_hook",
                        "cannot register a hook on a tensor that doesn't require gradient");
    if (t->grad_fn)
        return sr__node_add_pre_hook(t->grad_fn, t->output_nr, fn, arg);
    struct sr_hook *h = calloc(1, sizeof(*h));
    if (!h)
        return sr__fail(-ENOMEM, "sr_tensor_register_hook", "out of memory");
    h->fn = fn;
    h->arg = arg;
    struct sr_hook **p = &t->hooks;
    while (*p)
        p = &(*p)->next;
    *p = h;
    return 0;
}
