/* Protocol modules: how a layer above RPC plugs into the agent (internal).
 *
 * lib/rpc never names a layer above it. A layer (RRefs, distributed
 * autograd) fills one `sr_module` and registers it once, before sr_init;
 * the agent then calls its hooks at the points below. Every hook is
 * optional (NULL). docs/DIST_AUTOGRAD.md, "Layer seams", shows a module.
 *
 * Message kinds. A module may own
 *   - raw message types (`types`, numbers >= SR_MSG_MODULE_BASE): each one
 *     that arrives goes to on_msg on the polling thread, which must not
 *     block;
 *   - module requests: sr__module_rpc() sends MOD_REQ {module id, sub-kind,
 *     a 64-bit tag, encoded values}; on the callee, serve() returns a future
 *     and the agent answers with its value (RESP) or error (ERR) when it
 *     completes, without holding a thread. serve runs on the polling thread:
 *     heavy work goes to sr__exec_submit().
 *
 * The envelope. Any request (REQ, KEEP call, module request) and any result
 * (RESP, KEEP_RET) may carry an extension header: per module at most
 * SR_EXT_MAX bytes, written by the sending side's hook and handed to the
 * receiving side's hook (SR_WIRE_EXT; wire.h gives the byte layout).
 *
 * Per-call hooks, caller side (any thread, before the request is encoded):
 *   request_out(out, ext, &len)   may write the module's extension bytes.
 *   response_in(from, ext, len, v) the result v of a call that carried the
 *                                 module's extension back, before the
 *                                 caller's future completes.
 * Callee side:
 *   request_in(c, ext, len)       after the arguments were decoded (on the
 *                                 polling thread); may keep state in
 *                                 *sr__call_state(c, id).
 *   run_enter(c) / run_exit(c)    around the function, on the thread that
 *                                 runs it (an executor, the poller, or the
 *                                 idle waiter of sr_shutdown).
 *   response_out(c, v, ext, &len) before a successful result is encoded.
 *   call_done(c)                  always, once, when the call is finished
 *                                 (a call that ran: after its answer was
 *                                 sent): drop the state. Module messages to the caller
 *                                 that dropping the call's arguments
 *                                 causes go quietly: the answer, sent
 *                                 next, wakes the caller for them.
 * Thread context: tls_get()/tls_set(v) read and replace a module's
 * per-thread value (distributed autograd's current context). The agent sets
 * the caller's value around user callbacks of futures (then, done
 * callbacks), so continuations see the context they were made in.
 *
 * Peers: peer_died(rank, why) runs once per peer
 * whose process ended without a graceful shutdown, on whichever polling
 * thread saw the supervisor's report first (it must not block); why says
 * how it ended, for error messages ("worker2 exited with status 0 without
 * sr_shutdown"). Every wait of the module that involves that peer must then
 * fail (calls to it already have, with -EPIPE). It also runs, once for every
 * peer not handled yet, when this worker's own inbox is found corrupt: no
 * message from any peer can reach it any more (why says so: "worker1 can no
 * longer receive messages: the inbox ring of worker1 ... is corrupt"; calls
 * have failed with -EPROTO).
 *
 * Lifecycle: init() in sr_init after the transport is attached and before any
 * RPC thread starts; shutdown_users(deadline) in a graceful shutdown after the
 * first barrier (it may make calls); shutdown_check() after quiescence;
 * fini() at local teardown (always, also after a failed init: it must accept
 * a module that never ran init). Modules run in registration order, fini in
 * reverse.
 *
 * Registration happens before main(): each layer registers from a
 * constructor (__attribute__((constructor))) of its module file, so no file of
 * lib/rpc names it; the table is read-only afterwards, so hooks are read
 * without locks.
 */
#ifndef SR_RPC_MODULE_H
#define SR_RPC_MODULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shmrpc/future.h"
#include "shmrpc/rpc.h"
#include "shmrpc/value.h"
#include "ring.h"

enum { SR_MOD_RREF = 0, SR_MOD_DIST_AUTOGRAD = 1, SR_MOD_PROFILER = 2, SR_MOD_MAX = 4 };

/* Per module, the most extension bytes one message carries. */
#define SR_EXT_MAX 32
/* Raw module message types start here; module id owns the four types
 * SR_MSG_MODULE_TYPE(id, 0..3), so no two modules can collide. */
#define SR_MSG_MODULE_BASE 16
#define SR_MSG_MODULE_TYPE(id, k) (SR_MSG_MODULE_BASE + 4 * (id) + (k))

/* What the caller is about to send. */
enum sr_call_kind {
    SR_CALL_UNKNOWN = -1, /* a function call not looked up yet: sr__call_out_kind() */
    SR_CALL_BUILTIN = 0, /* a built-in function */
    SR_CALL_USER = 1,    /* a registered (user) function */
    SR_CALL_KEEP = 2,    /* a call whose result stays on the callee (remote()) */
    SR_CALL_MODULE = 3,  /* a module request */
};

/* A value kind a module owns (SR_KIND_RREF): how its values travel and are
 * released. A value of the kind holds one reference on its object. */
typedef struct sr_value_kind_ops {
    uint8_t kind;
    uint8_t wire_size;                                  /* bytes after the kind tag */
    int (*sendable)(void *obj, const char *fn);         /* 0, or -errno with the reason */
    int (*encode)(void *obj, int to, uint8_t *wire);    /* e.g. a new fork for rank `to` (-1: not known,
                                                           a local encode); 0 or -errno */
    void (*unencode)(void *obj, const uint8_t *wire);   /* undo encode: the send will not happen */
    int (*check)(const uint8_t *wire, char *why, size_t len); /* 0 or -EBADMSG */
    int (*decode)(const uint8_t *wire, void **obj);     /* a reference; also retires unused copies */
    void (*release)(void *obj);
    const char *(*str)(const void *obj, char *buf, size_t len);
} sr_value_kind_ops;

/* A request a module starts (sr__module_call_start). */
enum sr_req_kind {
    SR_REQ_CALL = 0,   /* a function call (REQ) */
    SR_REQ_KEEP = 1,   /* the result stays on the callee, kept by `module` (keep hooks) */
    SR_REQ_MODULE = 2, /* a module request, served by `module` */
};

struct sr_req {
    enum sr_req_kind kind;
    int module;           /* KEEP, MODULE: the module; CALL with ext_len: whose ext */
    uint8_t sub;          /* MODULE: its sub-kind */
    uint64_t tag;         /* KEEP, MODULE: the module's word */
    uint8_t ext_len;      /* the module's own extension bytes for this call */
    uint8_t ext[SR_EXT_MAX];
};

struct sr_call_out {
    int to;
    enum sr_call_kind kind;
    const char *fn;      /* NULL for a module request */
    int module;          /* SR_CALL_MODULE: the module that sends it */
    uint8_t sub;         /* SR_CALL_MODULE: its sub-kind */
    sr_args args;
};

typedef struct sr_module {
    const char *name;
    /* values */
    const sr_value_kind_ops *value_kind;
    /* raw messages */
    uint16_t types[4];   /* 0-terminated */
    void (*on_msg)(const sr_msg *m);
    /* module requests */
    int (*serve)(int caller, uint8_t sub, uint64_t tag, sr_value *args, sr_future **out);
    /* per call */
    int (*request_out)(const struct sr_call_out *out, uint8_t *ext, size_t *len);
    void (*response_in)(int from, const uint8_t *ext, size_t len, sr_value *v);
    int (*request_in)(sr_call *c, const uint8_t *ext, size_t len);
    void (*run_enter)(sr_call *c);
    void (*run_exit)(sr_call *c);
    void (*response_out)(sr_call *c, sr_value *v, uint8_t *ext, size_t *len);
    /* A future the call must wait for before it runs (NULL: none); the call is
     * gated again when it completes, and fails with its error. */
    sr_future *(*gate)(sr_call *c);
    /* Just before the function runs (after every gate): 0 or -errno (the
     * call fails with sr_last_error()). */
    int (*prepare)(sr_call *c);
    /* KEEP calls: the handle that will receive the result (NULL: -errno in
     * sr_last_error), then exactly one of set (err 0: v, else text, with
     * cause the failed function's own code, sr_future_error_code()'s value
     * for whoever reads the kept value) or drop. */
    void *(*keep_open)(uint64_t tag, int caller);
    void (*keep_set)(void *h, int err, int cause, const char *text, sr_value *v);
    void (*keep_drop)(void *h);
    void (*call_done)(sr_call *c);
    /* thread context */
    int64_t (*tls_get)(void);
    int64_t (*tls_set)(int64_t v);
    /* peers */
    void (*peer_died)(int rank, const char *why);
    /* profiling (probe.h): a short name for a module request's sub-kind
     * (type SR_MSG_MOD_REQ) or for a raw message of `type` (sub: its wire
     * ctrl byte), e.g. "fork_request"; NULL: numbered */
    const char *(*describe)(int type, uint8_t sub);
    /* lifecycle */
    int (*init)(const sr_init_opts *o);
    int (*shutdown_users)(int64_t deadline_ns);
    int (*shutdown_check)(void);
    void (*fini)(void);
} sr_module;

/* What o calls: a hook that needs to tell built-ins from user functions asks
 * (a registry lookup, made only then: most calls are made with no hook
 * interested). */
enum sr_call_kind sr__call_out_kind(const struct sr_call_out *o);

/* Register m under id (once; before sr_init). -EEXIST if taken. */
int sr__module_register(int id, const sr_module *m);

/* ---- what a module may use (the agent's side of the seam) ---- */

int sr__rpc_rank(void);  /* -1 when RPC is not initialised */
int sr__rpc_world(void);
/* The process of `rank` has ended (the supervisor published it): a message
 * to it can never be answered. If so, why (len bytes, may be NULL) says how:
 * "worker2 exited with status 0 without sr_shutdown". */
bool sr__rpc_peer_gone(int rank, char *why, size_t len);
/* The default RPC timeout in ms (0: none), captured now. */
int64_t sr__rpc_default_timeout_ms(void);
/* Start a module request to `to`: args are encoded like a call's; the
 * future completes with serve's value or error ("Error on Node N: ...").
 * timeout_ms 0: none. */
int sr__module_rpc(int to, int module, uint8_t sub, uint64_t tag, sr_args args, int64_t timeout_ms,
                   sr_future **out);
/* Check a call's arguments as sr_rpc_async does, capturing its timeout in ms
 * (0: none); who names the public function in errors. */
int sr__module_call_check(int to, const char *fn, sr_args args, double timeout_s, int64_t *ms, const char *who);
/* Start a request; f completes with its answer (KEEP: none, or the list of
 * a small plain result). */
int sr__module_call_start(int to, const struct sr_req *q, const char *fn, sr_args args, int64_t ms, sr_future *f);
/* A call's arguments, as one list (borrowed). */
sr_value *sr__call_args(sr_call *c);
/* Replace argument i of a call (takes v's reference); 0 or -ENOMEM. */
int sr__call_set_arg(sr_call *c, size_t i, sr_value *v);

/* Send a raw module message (type >= SR_MSG_MODULE_BASE), counted for
 * graceful shutdown's quiescence; quiet: wake nobody (see agent.h). */
int sr__module_send(int to, sr_msg *m, bool quiet);
/* Wait for f with the agent's polling wait; 0 when done, -ETIMEDOUT at the
 * deadline (< 0: none). */
int sr__module_wait(sr_future *f, int64_t deadline_ns);
/* Run fn(arg) off the polling thread: on an executor, or, when the thread
 * that polls only waits (an idle waiter in sr_shutdown, a user thread inside
 * sr__module_wait; not the progress thread, which never hands the inbox
 * back), on that thread once it has handed the inbox back — no
 * thread hop and no wake for a worker that has nothing else to do. fn must
 * not block. 0 or -ENOMEM / -SR_ESHUTDOWN (then fn never runs). */
int sr__exec_submit(void (*fn)(void *arg), void *arg);
/* Where a module keeps per-call state (NULL-initialised). */
void **sr__call_state(sr_call *c, int module);
/* The call whose request arguments this thread is decoding right now, or
 * NULL (any other decode: a result, a released buffer). A value kind's
 * decode hook may tie what it makes to that call through sr__call_state:
 * every call whose decode began gets call_done exactly once, also when the
 * decode failed. */
sr_call *sr__call_decoding(void);
/* The test-only reordering mode is on (reorder.h). */
bool sr__rpc_reordering(void);

/* ---- the agent's side (rpc internal) ---- */
extern const sr_module *sr__modules[SR_MOD_MAX];
/* The ops of a module value kind, or NULL. */
const sr_value_kind_ops *sr__value_kind(int kind);
/* A value of a module's kind over obj (takes its reference); NULL: -ENOMEM. */
sr_value *sr__value_module(int kind, void *obj);
/* The object of a value of that kind (borrowed), or NULL. */
void *sr__value_module_obj(const sr_value *v, int kind);
/* The thread context of every module, captured and restored around user
 * callbacks of futures. */
struct sr_tls_snap {
    int64_t v[SR_MOD_MAX];
    uint8_t mask; /* modules with a value */
};
void sr__tls_capture(struct sr_tls_snap *s);
void sr__tls_swap(struct sr_tls_snap *s); /* set s, and store the previous values in s */
/* A raw module message: handed to its module (true), or unknown (false). */
struct sr_agent;
bool sr__module_msg(struct sr_agent *a, const sr_msg *m);
/* The hooks of every module, in registration order (fini: reverse). */
void sr__modules_peer_died(int rank, const char *why);
int sr__modules_init(const sr_init_opts *o);
int sr__modules_shutdown_users(int64_t deadline_ns);
int sr__modules_shutdown_check(void);
void sr__modules_fini(void);

#endif
