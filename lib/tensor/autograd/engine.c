/* SPDX-License-Identifier: MIT */
/* The autograd engine: graph tasks (see engine.h) and sr_backward. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "error.h"
#include "tensor_impl.h"

struct entry {
    sr_node *node;      /* owned reference */
    int64_t deps;       /* gradients still to arrive */
    bool done;          /* executed */
    bool held;          /* the pass holds node (sr__node_use) until it ran */
    sr_tensor **inputs; /* [node->num_inputs], accumulated gradients */
};

struct sr_graph_task {
    pthread_mutex_t lock;
    bool retain_graph;
    bool fed;    /* roots are fixed once the first gradient arrived */
    bool failed; /* an error left the task half-run */
    sr_grad_sink *sink;
    struct entry **slots; /* open addressing on the node pointer */
    size_t cap, count, executed;
    struct entry **heap;  /* ready nodes, max-heap on node->seq */
    size_t heap_len, heap_cap;
};

static size_t slot_of(const sr_graph_task *g, const sr_node *n)
{
    uint64_t h = (uint64_t)(uintptr_t)n * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (g->cap - 1);
}

static struct entry *lookup(const sr_graph_task *g, const sr_node *n)
{
    for (size_t i = slot_of(g, n);; i = (i + 1) & (g->cap - 1)) {
        if (!g->slots[i] || g->slots[i]->node == n)
            return g->slots[i];
    }
}

static int grow(sr_graph_task *g)
{
    struct entry **old = g->slots;
    size_t old_cap = g->cap;
    g->cap = old_cap ? old_cap * 2 : 64;
    g->slots = calloc(g->cap, sizeof(*g->slots));
    if (!g->slots) {
        g->slots = old;
        g->cap = old_cap;
        return sr__fail(-ENOMEM, "sr_backward", "out of memory for the graph of %zu nodes", g->count);
    }
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i])
            continue;
        size_t j = slot_of(g, old[i]->node);
        while (g->slots[j])
            j = (j + 1) & (g->cap - 1);
        g->slots[j] = old[i];
    }
    free(old);
    return 0;
}

/* A new entry for n (*out); -ENOMEM, or -EPERM when n has state that
 * another pass released or will release: the pass fails here, before it
 * ran anything (engine.h, "Concurrent passes"). */
static int insert(sr_graph_task *g, sr_node *n, struct entry **out)
{
    int rc = (g->count + 1) * 2 > g->cap ? grow(g) : 0;
    if (!rc && sr__node_has_state(n))
        rc = sr__node_use(n, !g->retain_graph);
    if (rc)
        return rc;
    struct entry *e = calloc(1, sizeof(*e));
    sr_tensor **inputs = calloc(n->num_inputs ? n->num_inputs : 1, sizeof(*inputs));
    if (!e || !inputs) {
        free(e);
        free(inputs);
        if (sr__node_has_state(n))
            sr__node_unuse(n, !g->retain_graph, false);
        return sr__fail(-ENOMEM, "sr_backward", "out of memory");
    }
    e->held = sr__node_has_state(n);
    e->node = sr__node_ref(n);
    e->inputs = inputs;
    size_t i = slot_of(g, n);
    while (g->slots[i])
        i = (i + 1) & (g->cap - 1);
    g->slots[i] = e;
    g->count++;
    *out = e;
    return 0;
}

static int heap_push(sr_graph_task *g, struct entry *e)
{
    if (g->heap_len == g->heap_cap) {
        size_t cap = g->heap_cap ? g->heap_cap * 2 : 32;
        struct entry **h = realloc(g->heap, cap * sizeof(*h));
        if (!h)
            return sr__fail(-ENOMEM, "sr_backward", "out of memory");
        g->heap = h;
        g->heap_cap = cap;
    }
    size_t i = g->heap_len++;
    while (i > 0 && g->heap[(i - 1) / 2]->node->seq < e->node->seq) {
        g->heap[i] = g->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    g->heap[i] = e;
    return 0;
}

static struct entry *heap_pop(sr_graph_task *g)
{
    struct entry *top = g->heap[0], *last = g->heap[--g->heap_len];
    size_t i = 0, n = g->heap_len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && g->heap[c + 1]->node->seq > g->heap[c]->node->seq)
            c++;
        if (g->heap[c]->node->seq <= last->node->seq)
            break;
        g->heap[i] = g->heap[c];
        i = c;
    }
    if (n)
        g->heap[i] = last;
    return top;
}

int sr__graph_task_create(bool retain_graph, sr_grad_sink *sink, sr_graph_task **out)
{
    sr_graph_task *g = calloc(1, sizeof(*g));
    if (!g || grow(g)) {
        free(g);
        return sr__fail(-ENOMEM, "sr__graph_task_create", "out of memory");
    }
    pthread_mutex_init(&g->lock, NULL);
    g->retain_graph = retain_graph;
    g->sink = sink;
    *out = g;
    return 0;
}

void sr__graph_task_destroy(sr_graph_task *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->cap; i++) {
        struct entry *e = g->slots[i];
        if (!e)
            continue;
        for (uint32_t k = 0; k < e->node->num_inputs; k++)
            sr_tensor_unref(e->inputs[k]);
        free(e->inputs);
        if (e->held) /* never ran: a failed or abandoned pass */
            sr__node_unuse(e->node, !g->retain_graph, false);
        sr__node_unref(e->node);
        free(e);
    }
    free(g->slots);
    free(g->heap);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

static int push(sr_node ***stack, size_t *len, size_t *cap, sr_node *n)
{
    if (*len == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        sr_node **s = realloc(*stack, c * sizeof(*s));
        if (!s)
            return sr__fail(-ENOMEM, "sr_backward", "out of memory walking the graph");
        *stack = s;
        *cap = c;
    }
    (*stack)[(*len)++] = n;
    return 0;
}

/* Count, for every node newly reachable from root, the edges pointing at
 * it. Iterative: graphs can be deep. */
static int discover(sr_graph_task *g, sr_node *root)
{
    size_t len = 0, cap = 0;
    sr_node **stack = NULL;
    struct entry *e;
    int rc = insert(g, root, &e);
    if (!rc)
        rc = push(&stack, &len, &cap, root);
    while (!rc && len) {
        sr_node *n = stack[--len];
        for (uint32_t i = 0; !rc && i < n->num_next; i++) {
            sr_node *m = n->next[i].fn;
            if (!m)
                continue;
            e = lookup(g, m);
            if (!e && !(rc = insert(g, m, &e)))
                rc = push(&stack, &len, &cap, m);
            if (!rc)
                e->deps++;
        }
    }
    free(stack);
    return rc;
}

int sr__graph_task_add_root(sr_graph_task *g, sr_edge root)
{
    if (!root.fn)
        return sr__fail(-EINVAL, "sr_backward", "root edge has no node");
    pthread_mutex_lock(&g->lock);
    int rc = 0;
    if (g->fed || g->failed) {
        rc = sr__fail(-EINVAL, "sr_backward", "roots must be added before any gradient is fed");
    } else {
        if (!lookup(g, root.fn))
            rc = discover(g, root.fn);
        if (!rc)
            lookup(g, root.fn)->deps++;
    }
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static int buffer_add(sr_tensor **slot, sr_tensor *grad)
{
    if (!grad)
        return 0;
    if (!*slot) {
        *slot = sr_tensor_ref(grad);
        return 0;
    }
    sr_tensor *sum = sr_add(*slot, grad);
    if (!sum)
        return -EINVAL;
    sr_tensor_unref(*slot);
    *slot = sum;
    return 0;
}

/* One dependency of e satisfied, with its gradients already buffered. */
static int satisfy(sr_graph_task *g, struct entry *e)
{
    if (e->deps <= 0 || e->done)
        return sr__fail(-EINVAL, "sr_backward", "node %s received more gradients than it has dependencies",
                        e->node->ops->name);
    return --e->deps == 0 ? heap_push(g, e) : 0;
}

static struct entry *fed_entry(sr_graph_task *g, const sr_node *fn)
{
    struct entry *e = fn ? lookup(g, fn) : NULL;
    if (!e)
        sr__fail(-EINVAL, "sr_backward", "node %s is not part of this backward pass", fn ? fn->ops->name : "NULL");
    return e;
}

int sr__graph_task_feed(sr_graph_task *g, sr_edge root, sr_tensor *grad)
{
    pthread_mutex_lock(&g->lock);
    g->fed = true;
    struct entry *e = fed_entry(g, root.fn);
    bool prev = sr_no_grad_enter();
    int rc = !e ? -EINVAL
             : root.input_nr >= root.fn->num_inputs
                 ? sr__fail(-EINVAL, "sr_backward", "input %u of node %s is out of range", root.input_nr,
                            root.fn->ops->name)
                 : buffer_add(&e->inputs[root.input_nr], grad);
    if (!rc)
        rc = satisfy(g, e);
    sr_no_grad_exit(prev);
    g->failed |= rc != 0;
    pthread_mutex_unlock(&g->lock);
    return rc;
}

int sr__graph_task_feed_node(sr_graph_task *g, sr_node *fn, sr_tensor *const *grads)
{
    pthread_mutex_lock(&g->lock);
    g->fed = true;
    struct entry *e = fed_entry(g, fn);
    bool prev = sr_no_grad_enter();
    int rc = e ? 0 : -EINVAL;
    for (uint32_t i = 0; !rc && i < fn->num_inputs; i++)
        rc = buffer_add(&e->inputs[i], grads ? grads[i] : NULL);
    if (!rc)
        rc = satisfy(g, e);
    sr_no_grad_exit(prev);
    g->failed |= rc != 0;
    pthread_mutex_unlock(&g->lock);
    return rc;
}

struct pre_hook {
    const sr_node *n;
    const struct sr_pre_hook *h;
};

/* "hook 1 on input 0 of MulBackward0": the hooks of one tensor count from 1. */
static const char *pre_hook_name(const void *arg, char *buf)
{
    const struct pre_hook *w = arg;
    unsigned nr = 1;
    for (const struct sr_pre_hook *h = w->n->pre_hooks; h != w->h; h = h->next)
        nr += h->input_nr == w->h->input_nr;
    snprintf(buf, SR__HOOK_NAME_STR, "hook %u on input %u of %s", nr, w->h->input_nr, w->n->ops->name);
    return buf;
}

static int run_pre_hooks(sr_node *n, sr_tensor **inputs)
{
    int rc = 0;
    for (struct sr_pre_hook *h = n->pre_hooks; h && !rc; h = h->next)
        if (inputs[h->input_nr])
            rc = sr__run_grad_hook(h->fn, h->arg, &inputs[h->input_nr], pre_hook_name, &(struct pre_hook){n, h});
    return rc;
}

static int apply_node(sr_graph_task *g, sr_node *n, sr_tensor **inputs, sr_tensor **outputs)
{
    int rc = run_pre_hooks(n, inputs);
    if (rc)
        return rc;
    if (n->ops == &sr__accumulate_grad_ops) {
        sr_tensor *grad = inputs[0]; /* handed over, so .grad may adopt it without a copy */
        inputs[0] = NULL;
        return grad ? sr__accumulate_grad_run(n, grad, g->sink) : 0;
    }
    bool any = false;
    for (uint32_t i = 0; i < n->num_inputs; i++)
        any |= inputs[i] != NULL;
    return any || n->ops->apply_without_grads ? n->ops->apply(n, inputs, outputs) : 0;
}

/* Pass outputs (owned) along the node's edges. */
static int propagate(sr_graph_task *g, sr_node *n, sr_tensor **outputs)
{
    int rc = 0;
    for (uint32_t i = 0; i < n->num_next; i++) {
        sr_node *m = n->next[i].fn;
        if (m && !rc) {
            struct entry *e = lookup(g, m);
            rc = buffer_add(&e->inputs[n->next[i].input_nr], outputs[i]);
            if (!rc)
                rc = satisfy(g, e);
        }
        sr_tensor_unref(outputs[i]);
    }
    return rc;
}

static int execute(sr_graph_task *g, struct entry *e)
{
    sr_node *n = e->node;
    sr_tensor **outputs = calloc(n->num_next ? n->num_next : 1, sizeof(*outputs));
    if (!outputs)
        return sr__fail(-ENOMEM, "sr_backward", "out of memory");
    int rc = apply_node(g, n, e->inputs, outputs);
    e->done = true;
    g->executed++;
    for (uint32_t i = 0; i < n->num_inputs; i++) {
        sr_tensor_unref(e->inputs[i]);
        e->inputs[i] = NULL;
    }
    if (e->held) { /* the last holder of a node without retain_graph frees its saved state */
        e->held = false;
        sr__node_unuse(n, !g->retain_graph, true);
    }
    if (rc) {
        for (uint32_t i = 0; i < n->num_next; i++)
            sr_tensor_unref(outputs[i]);
    } else {
        rc = propagate(g, n, outputs);
    }
    free(outputs);
    return rc;
}

int sr__graph_task_run(sr_graph_task *g)
{
    pthread_mutex_lock(&g->lock);
    int rc = g->failed ? sr__fail(-EINVAL, "sr_backward", "the backward pass already failed") : 0;
    bool prev = sr_no_grad_enter();
    while (!rc && g->heap_len)
        rc = execute(g, heap_pop(g));
    sr_no_grad_exit(prev);
    g->failed |= rc != 0;
    pthread_mutex_unlock(&g->lock);
    return rc;
}

size_t sr__graph_task_pending(sr_graph_task *g)
{
    pthread_mutex_lock(&g->lock);
    size_t n = g->count - g->executed;
    pthread_mutex_unlock(&g->lock);
    return n;
}

bool sr__graph_task_executed(sr_graph_task *g, const sr_node *n)
{
    pthread_mutex_lock(&g->lock);
    struct entry *e = lookup(g, n);
    bool done = e && e->done;
    pthread_mutex_unlock(&g->lock);
    return done;
}
