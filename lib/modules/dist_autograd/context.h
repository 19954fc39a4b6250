/* SPDX-License-Identifier: MIT */
/* Distributed autograd contexts and the per-worker container (internal).
 *
 * Container. Contexts live in a map context_id -> context split into shards
 * (a power of two, up to 128; see container.c for how many), each cache-line
 * aligned with its own lock, so threads beginning and ending contexts rarely
 * meet. A lookup takes a reference under the shard lock and drops the lock
 * before anything else is done with the context.
 *
 * Context. Everything in it is guarded by its lock, except the id (fixed).
 * It holds the known workers, the send and recv functions by message id (one
 * reference each), the gradients accumulated for this worker's leaves (leaf
 * -> grad, one reference each) and the graph task of the current pass (pass
 * id, retain flag, and how many threads use it), and the state of every
 * pass this worker is engaged in (backward.c; each holds a reference to the
 * context, so the list is empty when the context is freed).
 *
 * begin_lock serialises the building of a pass's task (backward.c,
 * begin_pass): it is held across the graph walk, never while a task runs.
 *
 * Lock order: begin_lock -> engine task lock -> context lock -> (none). The engine calls
 * into a context (the gradient sink, RecvRpcBackward sending its gradients)
 * while it holds its task lock, so no code may call the engine (feed, run,
 * add_root) while it holds a context lock. Shard locks are never held while
 * another lock is taken.
 *
 * Lifetime. A context is refcounted: the container holds one reference until
 * the context is released (context_end, a cleanup message, or shutdown);
 * every lookup returns its own. A released context stays alive while a pass
 * or a call still holds it, but can no longer be found.
 */
#ifndef SR_DIST_AUTOGRAD_CONTEXT_H
#define SR_DIST_AUTOGRAD_CONTEXT_H

#if !defined(SR__IN_DIST_AUTOGRAD)
#error "context.h is private to the dist_autograd module layer (docs/ARCHITECTURE.md)"
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "tensor_seam.h"
#include "idmap.h"
#include "dist_autograd_seam.h" /* current context, not-found error */
#include "shmrpc/dist_autograd.h"
#include "shmrpc/future.h"
#include "module.h"

struct sr__dpass;

typedef struct sr_dctx {
    int64_t id;
    _Atomic uint32_t refs;
    pthread_mutex_t lock;
    pthread_mutex_t begin_lock;  /* making the pass's task (see above) */
    uint64_t *known;             /* bitmap of ranks, [known_words] */
    size_t known_words;
    struct sr_idmap send, recv;  /* message id -> sr_node * */
    struct sr_idmap grads;       /* (uintptr_t)leaf -> struct grad_slot * */
    sr_graph_task *task;         /* the current pass's, or NULL */
    int64_t pass;                /* its id */
    bool retain;                 /* its retain_graph */
    bool root_busy;              /* a backward rooted here is running */
    uint32_t task_users;         /* threads using task (a root pass counts until it ends) */
    struct sr__dpass *engaged;   /* the passes this worker is engaged in (backward.c) */
    sr_grad_sink sink;           /* accumulates into grads */
    int dead_err;                /* -EPIPE once a worker it involved died (sr__dctx_peer_died), else 0 */
    char *dead_text;             /* then: how that worker ended */
} sr_dctx;

/* ---- container.c ---- */
int sr__dctx_container_init(int rank, int world);
void sr__dctx_container_fini(void);
/* A new context (one reference for the caller, one for the container). */
int sr__dctx_new(sr_dctx **out);
/* The context with this id (a reference), or NULL. */
sr_dctx *sr__dctx_find(int64_t id);
/* The context with this id, created if absent (receivers). NULL: -ENOMEM,
 * or the id was released here already (a late message): *released set. */
sr_dctx *sr__dctx_get_or_create(int64_t id, bool *released);
/* Take the context out of the container (its reference is dropped); the
 * context or NULL if it was not there. A reference for the caller. */
sr_dctx *sr__dctx_remove(int64_t id);
/* A worker died (the module's peer_died hook): every context that involves
 * it fails its backward passes from now on and forgets it (no cleanup goes
 * to the rank's next generation); the contexts it created are released
 * here, without cleanup messages (every survivor does the same). */
void sr__dist_peer_died(int rank, const char *why);
/* A fresh autograd message id; -EOVERFLOW past the counter's range. */
int sr__dctx_next_message_id(int64_t *out);
/* Backward passes in progress on this worker (debug info). */
extern _Atomic int64_t sr__dctx_passes;

/* ---- context.c ---- */
sr_dctx *sr__dctx_alloc(int64_t id, int world);
sr_dctx *sr__dctx_ref(sr_dctx *c);
void sr__dctx_unref(sr_dctx *c);
void sr__dctx_add_known(sr_dctx *c, int rank);          /* takes the lock */
int sr__dctx_add_fn(sr_dctx *c, bool send, int64_t msg_id, sr_node *fn); /* takes the lock */
/* The send function for msg_id (a reference), or NULL. */
sr_node *sr__dctx_send_fn(sr_dctx *c, int64_t msg_id);
/* rank died (why: how): if c involves it, c forgets it and is marked dead
 * (the first death wins); returns whether it did. Takes the lock. */
bool sr__dctx_peer_died(sr_dctx *c, int rank, const char *why);
/* 0, or -EPIPE naming the dead worker if c involved one that died. */
int sr__dctx_check_alive(sr_dctx *c, const char *who);
/* The known workers, sorted ascending, into ranks[cap]; returns the count. */
size_t sr__dctx_known(sr_dctx *c, int *ranks, size_t cap);

/* ---- functions.c: SendRpcBackward and RecvRpcBackward ---- */
/* A send function for the tensors of a message that require grad: one next
 * edge each (their gradient edges). fn names the call for error texts. */
sr_node *sr__send_fn_create(sr_tensor *const *ts, size_t n, int peer, const char *fn);
/* A recv function for received tensors: each becomes one of its outputs. */
sr_node *sr__recv_fn_create(int64_t ctx_id, int64_t msg_id, int peer, sr_tensor *const *ts, size_t n);
void sr__send_fn_set_id(sr_node *n, int64_t msg_id);
bool sr__is_send_fn(const sr_node *n);
int sr__send_fn_peer(const sr_node *n);
const char *sr__send_fn_call(const sr_node *n);
int64_t sr__fn_message_id(const sr_node *n);
int sr__recv_fn_peer(const sr_node *n);

/* ---- record.c: tensors of a value ---- */
/* The tensors of vs[nv] (nested lists included) that require grad, in the
 * order the codec sends them; *n of them in a malloc'd array (borrowed). */
int sr__grad_tensors(sr_value *const *vs, size_t nv, sr_tensor ***out, size_t *n);

/* ---- backward.c ---- */
/* Module request: gradients for one send function (see backward.c). */
int sr__dist_serve_propagate(int caller, uint64_t ctx_id, sr_value *args, sr_future **out);
/* RecvRpcBackward: send grads[n] to the peer's send function msg_id. */
int sr__dist_send_grads(int64_t ctx_id, int64_t msg_id, int peer, sr_tensor *const *grads, size_t n);

/* A pass rooted here; *out completes when every worker has finished. */
int sr__dist_backward_async(int64_t context_id, sr_tensor *const *roots, size_t n, bool retain, sr_future **out);

/* ---- module.c ---- */
/* The module's id (sr__module_register). */
extern int sr__dist_module;
/* record.c: the per-call hooks and the current context as the thread value. */
extern const struct sr_module_call_ops sr__dist_call_ops;
extern const struct sr_module_tls_ops sr__dist_tls_ops;

/* ---- cleanup.c ---- */
/* A cleanup message (the module's raw message type SR_DA_MSG_CLEANUP: the
 * context id, 8 bytes) arrived from `from` (on the polling thread). */
enum { SR_DA_MSG_CLEANUP = 0 };
void sr__dist_on_cleanup(int from, uint8_t type, const uint8_t *bytes, size_t len);
/* Release c here and tell its known workers (except `except`, -1: none). */
void sr__dist_release(sr_dctx *c, int except);

/* ---- rref_backward.c ---- */
int sr__dist_serve_rref_backward(int caller, uint64_t ctx_id, sr_value *args, sr_future **out);

/* Module request sub-kinds. */
enum { SR_DA_PROPAGATE = 1, SR_DA_RREF_BACKWARD = 3 };

#endif
