/* SPDX-License-Identifier: MIT */
/* Graph nodes: creation, edges, saved tensors, and iterative destruction. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "error.h"
#include "tensor_impl.h"

/* Sequence numbers order execution (newest first). One process-wide counter;
 * relaxed: only uniqueness and the order within one thread's forward pass
 * matter, and that is program order. */
static _Atomic uint64_t next_seq;

#define ALIGN_UP(x) (((x) + 15) & ~(size_t)15)

sr_node *sr__node_create(const sr_node_ops *ops, size_t size, uint32_t num_inputs, uint32_t num_next,
                         uint32_t num_saved)
{
    size_t base = ALIGN_UP(size), edges = ALIGN_UP(num_next * sizeof(sr_edge));
    sr_node *n = calloc(1, base + edges + num_saved * sizeof(struct sr_saved));
    if (!n) {
        sr__fail(-ENOMEM, "sr__node_create", "out of memory for a %s node", ops->name);
        return NULL;
    }
    n->ops = ops;
    atomic_init(&n->refcount, 1);
    n->num_inputs = num_inputs;
    n->num_next = num_next;
    n->num_saved = num_saved;
    n->next = (sr_edge *)((char *)n + base);
    n->saved = (struct sr_saved *)((char *)n + base + edges);
    /* relaxed: the counter only has to hand out distinct, increasing numbers */
    n->seq = ops == &sr__accumulate_grad_ops ? UINT64_MAX
                                             : atomic_fetch_add_explicit(&next_seq, 1, memory_order_relaxed);
    return n;
}

sr_node *sr__node_ref(sr_node *n)
{
    /* relaxed: the caller already holds a reference */
    if (n)
        atomic_fetch_add_explicit(&n->refcount, 1, memory_order_relaxed);
    return n;
}

/* Nodes whose last reference went while another node was being destroyed:
 * destroying a long chain would otherwise recurse once per node. */
static _Thread_local sr_node *free_list;
static _Thread_local bool freeing;

static void node_destroy(sr_node *n)
{
    if (n->ops->destroy)
        n->ops->destroy(n);
    for (uint32_t i = 0; i < n->num_saved; i++)
        sr_tensor_unref(n->saved[i].t);
    for (uint32_t i = 0; i < n->num_next; i++)
        sr__node_unref(n->next[i].fn);
    struct sr_pre_hook *h = n->pre_hooks;
    while (h) {
        struct sr_pre_hook *next = h->next;
        free(h);
        h = next;
    }
    free(n);
}

void sr__node_unref(sr_node *n)
{
    /* acq_rel: the last holder destroys after every other holder's use
     * (pairs with their decrements) */
    if (!n || atomic_fetch_sub_explicit(&n->refcount, 1, memory_order_acq_rel) != 1)
        return;
    n->free_link = free_list;
    free_list = n;
    if (freeing)
        return;
    freeing = true;
    while ((n = free_list)) {
        free_list = n->free_link;
        node_destroy(n);
    }
    freeing = false;
}

void sr__node_set_edge(sr_node *n, uint32_t i, sr_edge e)
{
    sr__node_ref(e.fn);
    sr__node_unref(n->next[i].fn);
    n->next[i] = e;
}

bool sr__node_needs_grad(const sr_node *n, uint32_t i) { return n->next[i].fn != NULL; }

void sr__node_save(sr_node *n, uint32_t i, const sr_tensor *t)
{
    if (!t)
        return;
    /* A snapshot, not an alias: its own storage object over the same block
     * (its own block reference), with no history (saving an output with its
     * grad_fn would make a cycle). An in-place write to t before backward
     * then moves t to a private copy and this keeps the forward's values
     * (docs/TENSORS.md, "In-place writes and saved tensors"). */
    n->saved[i].t = sr__tensor_snapshot(t);
}

/* The state word (engine.h, "Concurrent passes"): passes holding the node
 * in the low bits, and two flags. */
#define NODE_RELEASED (1u << 31) /* saved state freed: no pass may run it again */
#define NODE_DOOMED (1u << 30)   /* a pass without retain_graph holds it */

static int second_time(const sr_node *n)
{
    return sr__fail(-EPERM, "sr_backward",
                    "Trying to backward through the graph a second time (or directly access saved tensors after "
                    "they have already been freed). Saved intermediate values of the graph are freed when you call "
                    "sr_backward without retain_graph. Specify retain_graph=true if you need to backward through "
                    "the graph a second time (node %s)",
                    n->ops->name);
}

bool sr__node_has_state(const sr_node *n) { return n->num_saved > 0 || n->ops->release != NULL; }

int sr__node_use(sr_node *n, bool will_release)
{
    /* acquire: pairs with the release store in node_release, so a pass that
     * sees a node not released also sees its saved state intact */
    uint32_t s = atomic_load_explicit(&n->state, memory_order_acquire), want;
    do {
        if (s & (NODE_RELEASED | NODE_DOOMED))
            return second_time(n);
        want = (s + 1) | (will_release ? NODE_DOOMED : 0);
    } while (!atomic_compare_exchange_weak_explicit(&n->state, &s, want, memory_order_acquire,
                                                    memory_order_acquire));
    return 0;
}

/* Free the saved state: only the thread that dropped the last use of a
 * doomed node gets here, so this has one owner. */
static void node_release(sr_node *n)
{
    bool had_state = n->ops->release != NULL;
    for (uint32_t i = 0; i < n->num_saved; i++) {
        had_state |= n->saved[i].t != NULL;
        sr_tensor_unref(n->saved[i].t);
        n->saved[i].t = NULL;
    }
    if (n->ops->release)
        n->ops->release(n);
    /* release: pairs with the acquire in sr__node_use and sr__node_saved.
     * Nothing was freed (every slot empty): the node stays runnable, as in
     * PyTorch a node that saved nothing. */
    atomic_store_explicit(&n->state, had_state ? NODE_RELEASED : 0, memory_order_release);
}

void sr__node_unuse(sr_node *n, bool will_release, bool ran)
{
    if (will_release && !ran) { /* give the node back unreleased: it may run again */
        /* release: pairs with the next user's acquire (our reads of the saved state came first) */
        atomic_fetch_sub_explicit(&n->state, NODE_DOOMED + 1, memory_order_release);
        return;
    }
    /* acq_rel: the last user frees after every other user's reads (pairs
     * with their decrements) */
    uint32_t before = atomic_fetch_sub_explicit(&n->state, 1, memory_order_acq_rel);
    if (before == (NODE_DOOMED | 1))
        node_release(n);
}

int sr__node_saved(sr_node *n, uint32_t i, sr_tensor **out)
{
    /* acquire: pairs with the release store in node_release */
    if (atomic_load_explicit(&n->state, memory_order_acquire) & NODE_RELEASED)
        return second_time(n);
    *out = n->saved[i].t;
    return 0;
}

int sr__node_add_pre_hook(sr_node *n, uint32_t input_nr, sr_tensor_hook_fn fn, void *arg)
{
    struct sr_pre_hook *h = calloc(1, sizeof(*h));
    if (!h)
        return sr__fail(-ENOMEM, "sr_tensor_register_hook", "out of memory");
    h->input_nr = input_nr;
    h->fn = fn;
    h->arg = arg;
    struct sr_pre_hook **p = &n->pre_hooks;
    while (*p)
        p = &(*p)->next;
    *p = h;
    return 0;
}
