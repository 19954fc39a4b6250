/* SPDX-License-Identifier: MIT */
/* A distributed autograd context: known workers, send and recv functions,
 * accumulated gradients, the current pass's graph task. See context.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "error.h"

struct grad_slot {
    sr_tensor *leaf; /* a reference: the key must stay valid */
    sr_tensor *grad;
};

/* The gradient sink: the engine calls it under its task lock (lock order:
 * task -> context). Gradients add up across passes, as PyTorch's do. */
static int sink_accumulate(sr_grad_sink *sink, sr_tensor *leaf, sr_tensor *grad)
{
    sr_dctx *c = (sr_dctx *)((char *)sink - offsetof(sr_dctx, sink));
    int rc = 0;
    pthread_mutex_lock(&c->lock);
    struct grad_slot *g = sr__idmap_get(&c->grads, (uintptr_t)leaf);
    if (g) {
        sr_tensor *sum = sr_add(g->grad, grad);
        if (sum) {
            sr_tensor_unref(g->grad);
            g->grad = sum;
        } else {
            rc = -EINVAL;
        }
    } else if (!(g = malloc(sizeof(*g))) || sr__idmap_put(&c->grads, (uintptr_t)leaf, g)) {
        free(g);
        rc = sr__fail(-ENOMEM, "sr_dist_autograd_backward", "out of memory for a gradient");
    } else {
        /* Kept by reference, as it arrived (zero-copy); later passes add
         * out of place. A strided view (an expanded sum's) is made dense. */
        g->leaf = sr_tensor_ref(leaf);
        g->grad = sr_contiguous(grad);
        rc = g->grad ? 0 : -ENOMEM;
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

sr_dctx *sr__dctx_alloc(int64_t id, int world)
{
    sr_dctx *c = calloc(1, sizeof(*c));
    size_t words = (size_t)(world > 0 ? world : 1) / 64 + 1;
    if (c)
        c->known = calloc(words, sizeof(*c->known));
    if (!c || !c->known) {
        free(c);
        return NULL;
    }
    c->id = id;
    c->known_words = words;
    c->pass = SR_NO_CONTEXT;
    c->sink.accumulate = sink_accumulate;
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->begin_lock, NULL);
    return c;
}

sr_dctx *sr__dctx_ref(sr_dctx *c)
{
    atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed); /* relaxed: the caller holds one */
    return c;
}

static void drop_fns(struct sr_idmap *m)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i])
            sr__node_unref(m->vals[i]);
    sr__idmap_free(m);
}

void sr__dctx_unref(sr_dctx *c)
{
    /* acq_rel: the last holder sees every other holder's writes */
    if (!c || atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
        return;
    sr__graph_task_destroy(c->task);
    drop_fns(&c->send);
    drop_fns(&c->recv);
    for (size_t i = 0; i < c->grads.cap; i++) {
        struct grad_slot *g = c->grads.keys[i] ? c->grads.vals[i] : NULL;
        if (g) {
            sr_tensor_unref(g->leaf);
            sr_tensor_unref(g->grad);
            free(g);
        }
    }
    sr__idmap_free(&c->grads);
    free(c->dead_text);
    free(c->known);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->begin_lock);
    free(c);
}

void sr__dctx_add_known(sr_dctx *c, int rank)
{
    if (rank < 0 || (size_t)rank / 64 >= c->known_words)
        return;
    pthread_mutex_lock(&c->lock);
    c->known[rank / 64] |= UINT64_C(1) << (rank % 64);
    pthread_mutex_unlock(&c->lock);
}

bool sr__dctx_peer_died(sr_dctx *c, int rank, const char *why)
{
    if (rank < 0 || (size_t)rank / 64 >= c->known_words)
        return false;
    uint64_t bit = UINT64_C(1) << (rank % 64);
    pthread_mutex_lock(&c->lock);
    bool involved = (c->known[rank / 64] & bit) != 0;
    c->known[rank / 64] &= ~bit;
    if (involved && !c->dead_err) {
        c->dead_text = strdup(why ? why : "");
        c->dead_err = -EPIPE;
    }
    pthread_mutex_unlock(&c->lock);
    return involved;
}

int sr__dctx_check_alive(sr_dctx *c, const char *who)
{
    pthread_mutex_lock(&c->lock);
    int err = c->dead_err;
    char text[256];
    snprintf(text, sizeof(text), "%s", err && c->dead_text ? c->dead_text : "out of memory for its text");
    pthread_mutex_unlock(&c->lock);
    if (!err)
        return 0;
    return sr__fail(err, who, "autograd context %lld recorded RPCs with a worker that is gone since: %s",
                    (long long)c->id, text);
}

size_t sr__dctx_known(sr_dctx *c, int *ranks, size_t cap)
{
    size_t n = 0;
    pthread_mutex_lock(&c->lock);
    for (size_t w = 0; w < c->known_words; w++)
        for (int b = 0; b < 64; b++)
            if (c->known[w] & (UINT64_C(1) << b)) {
                if (n < cap)
                    ranks[n] = (int)(w * 64 + (size_t)b);
                n++;
            }
    pthread_mutex_unlock(&c->lock);
    return n;
}

/* Message ids are unique per worker (rank-prefixed), so a second function
 * under one id is a duplicated or forged message: it is refused, and the
 * first stays (replacing it would drop the map's reference unreleased). */
int sr__dctx_add_fn(sr_dctx *c, bool send, int64_t msg_id, sr_node *fn)
{
    struct sr_idmap *m = send ? &c->send : &c->recv;
    pthread_mutex_lock(&c->lock);
    bool dup = sr__idmap_get(m, (uint64_t)msg_id + 1) != NULL;
    int rc = dup ? 0 : sr__idmap_put(m, (uint64_t)msg_id + 1, sr__node_ref(fn));
    pthread_mutex_unlock(&c->lock);
    if (dup)
        return sr__fail(-EBADMSG, "sr_rpc", "autograd message id %lld is recorded twice in context %lld",
                        (long long)msg_id, (long long)c->id);
    if (rc) {
        sr__node_unref(fn);
        return sr__fail(-ENOMEM, "sr_rpc", "out of memory recording an autograd function");
    }
    return 0;
}

sr_node *sr__dctx_send_fn(sr_dctx *c, int64_t msg_id)
{
    pthread_mutex_lock(&c->lock);
    sr_node *fn = sr__idmap_get(&c->send, (uint64_t)msg_id + 1);
    if (fn)
        sr__node_ref(fn);
    pthread_mutex_unlock(&c->lock);
    return fn;
}

/* ---- the public calls ---- */

SR_API int sr_dist_autograd_get_gradients(int64_t context_id, size_t *n, sr_tensor ***tensors, sr_tensor ***grads)
{
    if (!n || !tensors || !grads)
        return sr__fail(-EINVAL, "sr_dist_autograd_get_gradients", "incompatible function arguments: an output is NULL");
    sr_dctx *c = sr__dctx_find(context_id);
    if (!c)
        return sr__dctx_not_found("sr_dist_autograd_get_gradients", context_id);
    int rc = sr__dctx_check_alive(c, "sr_dist_autograd_get_gradients");
    if (rc) {
        sr__dctx_unref(c);
        return rc;
    }
    pthread_mutex_lock(&c->lock);
    size_t k = 0, len = c->grads.len;
    sr_tensor **ts = malloc((len ? len : 1) * sizeof(*ts)), **gs = malloc((len ? len : 1) * sizeof(*gs));
    for (size_t i = 0; ts && gs && i < c->grads.cap; i++) {
        struct grad_slot *g = c->grads.keys[i] ? c->grads.vals[i] : NULL;
        if (g) {
            ts[k] = sr_tensor_ref(g->leaf);
            gs[k++] = sr_tensor_ref(g->grad);
        }
    }
    pthread_mutex_unlock(&c->lock);
    sr__dctx_unref(c);
    if (!ts || !gs) {
        free(ts);
        free(gs);
        return sr__fail(-ENOMEM, "sr_dist_autograd_get_gradients", "out of memory");
    }
    *n = k;
    *tensors = ts;
    *grads = gs;
    return 0;
}

SR_API void sr_dist_autograd_gradients_free(size_t n, sr_tensor **tensors, sr_tensor **grads)
{
    for (size_t i = 0; (tensors || grads) && i < n; i++) { /* no arrays: nothing to walk, whatever n says */
        sr_tensor_unref(tensors ? tensors[i] : NULL);
        sr_tensor_unref(grads ? grads[i] : NULL);
    }
    free(tensors);
    free(grads);
}

SR_API int sr_dist_autograd_get_gradient(int64_t context_id, const sr_tensor *leaf, sr_tensor **grad)
{
    if (!leaf || !grad)
        return sr__fail(-EINVAL, "sr_dist_autograd_get_gradient", "incompatible function arguments: %s is NULL",
                        leaf ? "grad" : "leaf");
    sr_dctx *c = sr__dctx_find(context_id);
    if (!c)
        return sr__dctx_not_found("sr_dist_autograd_get_gradient", context_id);
    int rc = sr__dctx_check_alive(c, "sr_dist_autograd_get_gradient");
    if (rc) {
        sr__dctx_unref(c);
        return rc;
    }
    pthread_mutex_lock(&c->lock);
    struct grad_slot *g = sr__idmap_get(&c->grads, (uintptr_t)leaf);
    *grad = g ? sr_tensor_ref(g->grad) : NULL;
    pthread_mutex_unlock(&c->lock);
    sr__dctx_unref(c);
    return *grad ? 0 : sr__fail(-ENOENT, "sr_dist_autograd_get_gradient", "no gradient for this tensor in context %lld",
                                (long long)context_id);
}

SR_API int sr_dist_autograd_known_workers(int64_t context_id, int *ranks, size_t cap, size_t *n)
{
    if (!n || (cap && !ranks))
        return sr__fail(-EINVAL, "sr_dist_autograd_known_workers", "incompatible function arguments");
    sr_dctx *c = sr__dctx_find(context_id);
    if (!c)
        return sr__dctx_not_found("sr_dist_autograd_known_workers", context_id);
    *n = sr__dctx_known(c, ranks, cap);
    sr__dctx_unref(c);
    return 0;
}

static int cmp_info(const void *a, const void *b)
{
    int64_t x = ((const sr_dist_fn_info *)a)->message_id, y = ((const sr_dist_fn_info *)b)->message_id;
    return x < y ? -1 : x > y;
}

static sr_dist_fn_info fn_info(const sr_node *fn, bool send)
{
    sr_dist_fn_info i = {.message_id = sr__fn_message_id(fn), .num_next = fn->num_next,
                         .peer = send ? sr__send_fn_peer(fn) : sr__recv_fn_peer(fn)};
    for (uint32_t k = 0; k < fn->num_next && k < 8; k++)
        i.next_names[k] = fn->next[k].fn ? fn->next[k].fn->ops->name : NULL;
    return i;
}

SR_API int sr_dist_autograd_functions(int64_t context_id, bool send, sr_dist_fn_info *out, size_t cap, size_t *n)
{
    if (!n || (cap && !out))
        return sr__fail(-EINVAL, "sr_dist_autograd_functions", "incompatible function arguments");
    sr_dctx *c = sr__dctx_find(context_id);
    if (!c)
        return sr__dctx_not_found("sr_dist_autograd_functions", context_id);
    pthread_mutex_lock(&c->lock);
    struct sr_idmap *m = send ? &c->send : &c->recv;
    size_t k = 0;
    sr_dist_fn_info *all = malloc((m->len ? m->len : 1) * sizeof(*all));
    for (size_t i = 0; all && i < m->cap; i++)
        if (m->keys[i])
            all[k++] = fn_info(m->vals[i], send);
    pthread_mutex_unlock(&c->lock);
    sr__dctx_unref(c);
    if (!all)
        return sr__fail(-ENOMEM, "sr_dist_autograd_functions", "out of memory");
    qsort(all, k, sizeof(*all), cmp_info); /* the smallest ids first, whatever cap is */
    if (k && cap)
        memcpy(out, all, (k < cap ? k : cap) * sizeof(*all));
    free(all);
    *n = k;
    return 0;
}
