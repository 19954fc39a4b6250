/* SPDX-License-Identifier: MIT */
/* The local autograd engine and its extension points (internal). Part of
 * the tensor layer (docs/TENSORS.md, "Layer"); tensor/tensor_seam.h exports this
 * header whole to the layers above, for distributed autograd.
 *
 * Graph. A node is one backward function: it receives num_inputs gradients
 * (one per output of the forward op that made it) and produces num_next
 * gradients, one per next edge (one per differentiable input of that op). An
 * edge {fn, input_nr} says "this gradient is input input_nr of node fn"; an
 * edge with fn == NULL needs no gradient. A leaf that requires grad is
 * reached through its AccumulateGrad node, which adds the gradient to the
 * leaf's .grad, or hands it to a gradient sink.
 *
 * Pluggable nodes. Any module may define a node type: a struct whose first
 * member is `sr_node`, an `sr_node_ops` vtable, and sr__node_create(). That
 * is how lib/modules/dist_autograd adds SendRpcBackward / RecvRpcBackward without
 * touching this engine.
 *
 * Graph tasks. One backward pass is an sr_graph_task:
 *   1. sr__graph_task_add_root(edge) for every root: it walks the graph from
 *      edge.fn, counts for every node reached how many edges point at it
 *      (its dependencies), and adds one dependency for the root itself. A
 *      distributed send function is added the same way, so it starts with
 *      dependency 1: the gradient that will arrive by RPC (FAST mode).
 *   2. sr__graph_task_feed / _feed_node deliver gradients to a root (or, later,
 *      to a send function), each satisfying that one dependency.
 *   3. sr__graph_task_run executes ready nodes (all dependencies satisfied),
 *      highest sequence number first (later-created nodes first, as PyTorch),
 *      until none is ready. Nodes whose gradients have not all arrived wait in
 *      the task; a later feed + run continues the same pass.
 * All roots must be added before the first feed. A task's functions take its
 * lock, so RPC handler threads may feed it concurrently; node apply, hooks
 * and the sink run under that lock, with grad mode disabled.
 *
 * Gradient sink. With a sink, AccumulateGrad nodes do not touch .grad: after
 * the leaf's hooks ran, sink->accumulate(sink, leaf, grad) receives the
 * gradient (a per-context map for distributed autograd).
 *
 * Lifetime. Tensors own their grad_fn; nodes own their next nodes, and
 * AccumulateGrad owns its leaf while the leaf points back weakly. A task holds
 * a reference on every node it reached until it is destroyed. Dropping the
 * last reference to a long chain is iterative, not recursive. A node's
 * memory goes only with its last reference (no tensor, node or task holds
 * it), never when its saved state is freed.
 *
 * Concurrent passes. Several threads may run passes whose graphs share
 * nodes (two losses of one forward; every training thread's graph reaching
 * the same parameters). What a node keeps and who may touch it:
 *   - seq, edges, hooks, saved slots are written while the forward builds
 *     the node, before any pass can reach it; passes only read them, except:
 *   - the saved state (saved slots, ops->release) of a node that has some
 *     (sr__node_has_state) is freed by exactly one thread: its `state` word
 *     counts the passes holding the node, and every pass holds each such
 *     node it reaches from discovery (sr__graph_task_add_root) until it ran
 *     it or the task is destroyed. Taking the hold is one CAS; a pass without
 *     retain_graph also marks the node doomed, and fails (PyTorch's "second
 *     time" error, before it runs anything) if the node is already doomed or
 *     released, as does any pass that reaches such a node. Whoever drops the
 *     last hold of a doomed node that its pass ran frees the state and marks
 *     it released; until then every holder reads it safely. Of two passes
 *     without retain_graph over one node, exactly one runs. A doomed node
 *     whose pass failed before running it is handed back intact.
 *   - nodes without state (AccumulateGrad, most views and sums) are shared
 *     freely and never written by a pass: any number of passes run them.
 *   - AccumulateGrad's gradient goes into the leaf's .grad under
 *     sr__acc_lock (variable.c), the lock of every leaf's grad and
 *     grad_acc; with a sink, the sink serialises its own accumulation
 *     (distributed autograd: the context lock).
 *   - everything else a pass writes (dependencies, gradient buffers, the
 *     ready queue) is the task's own, under the task lock.
 * Lock order: task lock -> sr__acc_lock -> storage locks; the sink's lock
 * after the task lock. No lock is held across passes.
 */
#ifndef SR_LIB_AUTOGRAD_ENGINE_H
#define SR_LIB_AUTOGRAD_ENGINE_H

#if !defined(SR__SEES_TENSOR)
#error "engine.h is the seam of the tensor layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shmrpc/tensor.h"

typedef struct sr_node sr_node;

typedef struct sr_edge {
    sr_node *fn;       /* NULL: no gradient needed */
    uint32_t input_nr; /* which input of fn */
} sr_edge;

typedef struct sr_node_ops {
    const char *name; /* "MulBackward0", ... */
    /* grads_in[num_inputs]: borrowed, NULL meaning zero. grads_out[num_next]
     * is all NULL on entry; store new references (NULL: no gradient; edges
     * with fn == NULL may be skipped, see sr__node_needs_grad). Returns 0 or
     * -errno after sr__fail(). Runs with grad mode disabled. */
    int (*apply)(sr_node *n, sr_tensor *const *grads_in, sr_tensor **grads_out);
    /* Optional: drop the node's own saved state (beyond sr__node_save slots)
     * after a backward without retain_graph. */
    void (*release)(sr_node *n);
    /* Optional: free the node's own resources before its memory goes. */
    void (*destroy)(sr_node *n);
    /* Run apply even when every incoming gradient is NULL (a distributed
     * RecvRpcBackward must always answer its sender). */
    bool apply_without_grads;
} sr_node_ops;

struct sr_saved {
    sr_tensor *t; /* snapshot: no history, its own storage over the saved block */
};

struct sr_pre_hook {
    uint32_t input_nr;
    sr_tensor_hook_fn fn;
    void *arg;
    struct sr_pre_hook *next;
};

struct sr_node {
    const sr_node_ops *ops;
    _Atomic uint32_t refcount;
    uint32_t num_inputs; /* gradients received (outputs of the forward op) */
    uint32_t num_next;   /* gradients produced (edges) */
    uint32_t num_saved;
    _Atomic uint32_t state; /* passes holding it, "doomed", "released": see "Concurrent passes" */
    uint64_t seq;        /* creation order; execution priority */
    sr_edge *next;       /* [num_next], owned refs on next[i].fn */
    struct sr_saved *saved; /* [num_saved] */
    struct sr_pre_hook *pre_hooks;
    sr_node *free_link;  /* deferred destruction list */
};

/* A node of `size` bytes (>= sizeof(sr_node), the derived struct) with
 * refcount 1, zeroed beyond the base, edges all NULL. NULL on -ENOMEM. */
sr_node *sr__node_create(const sr_node_ops *ops, size_t size, uint32_t num_inputs, uint32_t num_next,
                         uint32_t num_saved);
sr_node *sr__node_ref(sr_node *n);
void sr__node_unref(sr_node *n);
/* Edge i := e (takes a ref on e.fn). */
void sr__node_set_edge(sr_node *n, uint32_t i, sr_edge e);
bool sr__node_needs_grad(const sr_node *n, uint32_t i);
/* Save a snapshot of t (NULL allowed; sr__tensor_snapshot): the values t
 * has now, whatever in-place writes t receives later. */
void sr__node_save(sr_node *n, uint32_t i, const sr_tensor *t);
/* The saved tensor (borrowed), checking it was not freed; -EPERM with
 * PyTorch's message otherwise. */
int sr__node_saved(sr_node *n, uint32_t i, sr_tensor **out);
/* Whether n keeps state that a pass without retain_graph frees (saved
 * slots or ops->release): only such nodes are held by passes. */
bool sr__node_has_state(const sr_node *n);
/* Hold n (has state) for a pass: -EPERM with PyTorch's "backward through the
 * graph a second time" if it was released, or is held by another pass that
 * will release it; will_release: this pass will (retain_graph false). */
int sr__node_use(sr_node *n, bool will_release);
/* Drop the pass's hold; ran: the pass executed n. The last hold of a node
 * that a pass without retain_graph ran frees its saved state; a pass that
 * would have released n but did not run it gives it back unreleased. */
void sr__node_unuse(sr_node *n, bool will_release, bool ran);
int sr__node_add_pre_hook(sr_node *n, uint32_t input_nr, sr_tensor_hook_fn fn, void *arg);

/* ---- tensors and the graph ---- */
/* Where t's gradient goes: {grad_fn, output_nr}, {AccumulateGrad, 0} for a
 * leaf that requires grad (created on first use), or {NULL, 0}. NULL fn with
 * -ENOMEM possible: check sr_last_error only if t requires grad. */
sr_edge sr__tensor_gradient_edge(sr_tensor *t);
/* Make t a non-leaf output output_nr of fn (takes a ref on fn, requires grad). */
void sr__tensor_set_history(sr_tensor *t, sr_node *fn, uint32_t output_nr);
/* The AccumulateGrad node type, and the leaf of such a node (borrowed). */
extern const sr_node_ops sr__accumulate_grad_ops;
sr_tensor *sr__accumulate_grad_leaf(const sr_node *n);
/* Run AccumulateGrad n on grad (owned: consumed): the leaf's hooks, then the
 * sink (NULL: the leaf's .grad, which adopts grad when nobody else can see
 * it). */
struct sr_grad_sink;
int sr__accumulate_grad_run(sr_node *n, sr_tensor *grad, struct sr_grad_sink *sink);
/* Run hook fn on *g (owned): a gradient it returns in place of *g replaces
 * it, and must keep its dtype and shape, else -EINVAL naming the hook
 * (name(name_arg, buf), called only then) and both shapes, as PyTorch's
 * "hook 'h' has changed the size of value". On an error *g is kept. Every
 * place that runs hooks (leaf hooks, tensor hooks on a node's inputs) runs
 * them through here. */
#define SR__HOOK_NAME_STR 224
int sr__run_grad_hook(sr_tensor_hook_fn fn, void *arg, sr_tensor **g, const char *(*name)(const void *, char *),
                      const void *name_arg);
/* Serialises the creation of AccumulateGrad nodes (tensor->grad_acc). */
void sr__acc_lock(void);
void sr__acc_unlock(void);

/* ---- ops recording history (function.c) ---- */
/* True when grad mode is on and any of the n inputs (NULL allowed) requires grad. */
bool sr__any_requires_grad(sr_tensor *const *in, size_t n);
/* A node of `ops` for an op with inputs in[0..n) (edges from their gradient
 * edges) and num_outputs outputs. NULL on -ENOMEM. */
sr_node *sr__node_for_inputs(const sr_node_ops *ops, size_t size, sr_tensor *const *in, size_t n,
                             uint32_t num_outputs, uint32_t num_saved);
/* Make out (a single-output op's result) output 0 of node and drop the
 * caller's node reference. node NULL (allocation failed): unrefs out and
 * returns NULL. */
sr_tensor *sr__attach(sr_tensor *out, sr_node *node);

/* ---- the engine ---- */
typedef struct sr_grad_sink {
    /* leaf: the AccumulateGrad's tensor; grad: borrowed. 0 or -errno. */
    int (*accumulate)(struct sr_grad_sink *sink, sr_tensor *leaf, sr_tensor *grad);
} sr_grad_sink;

typedef struct sr_graph_task sr_graph_task;

/* sink NULL: accumulate into .grad. retain_graph false: free each node's saved
 * tensors after it ran. */
int sr__graph_task_create(bool retain_graph, sr_grad_sink *sink, sr_graph_task **out);
int sr__graph_task_add_root(sr_graph_task *g, sr_edge root);
/* Deliver grad (borrowed) as input root.input_nr of root.fn; satisfies one
 * dependency of root.fn. -EINVAL if root.fn was never added/reached. */
int sr__graph_task_feed(sr_graph_task *g, sr_edge root, sr_tensor *grad);
/* Deliver all num_inputs gradients of fn at once (borrowed, NULL entries
 * allowed); satisfies one dependency (a send function's RPC). */
int sr__graph_task_feed_node(sr_graph_task *g, sr_node *fn, sr_tensor *const *grads);
/* Execute ready nodes until none is ready. On error the task is unusable. */
int sr__graph_task_run(sr_graph_task *g);
/* Nodes reached but not yet executed. */
size_t sr__graph_task_pending(sr_graph_task *g);
/* Whether node n was reached by this task and has executed. */
bool sr__graph_task_executed(sr_graph_task *g, const sr_node *n);
void sr__graph_task_destroy(sr_graph_task *g);

/* The thread's grad mode (grad_mode.c), for the engine and ops. */
bool sr__grad_mode(void);

#endif
