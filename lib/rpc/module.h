/* SPDX-License-Identifier: MIT */
/* Protocol modules: how a layer above RPC plugs into the agent (internal).
 *
 * This is the one header of lib/rpc that a layer above it (lib/modules/...)
 * includes. lib/rpc never names a layer above it: a layer fills one
 * `sr_module` and registers it once, before sr_init; the agent then calls
 * its hooks at the points below. docs/DIST_AUTOGRAD.md, "Layer seams",
 * shows a module.
 *
 * A module is a name and optional groups of hooks, one per concern; a group
 * a module has no use for is NULL, and so is any hook inside a group:
 *   call     per-call hooks (the envelope, the callee's run, the call's end)
 *   gate     hold a call before its function runs, prepare its arguments
 *   keep     keep a KEEP call's result on the callee (remote())
 *   tls      a per-thread value carried into future callbacks
 *   life     init, graceful shutdown, teardown, peers' deaths
 *   request  serve module requests (sr__module_rpc)
 *   msg      raw module messages (sr__module_send)
 *   value_kind  a kind of sr_value the module owns
 *   probe    the profiler: the agent's probe points (at most one module)
 *
 * Ids and kinds. sr__module_register hands out the module's id (0, 1, ... in
 * registration order) and, for a module with a value kind, the kind number
 * (SR_KIND_MODULE, SR_KIND_MODULE + 1, ... in the same order). Both travel
 * on the wire. Registration happens before main(): each layer registers from
 * a constructor (__attribute__((constructor))) of its module file, and the
 * constructors of one binary run in the fixed order of its link (the
 * objects of the library in the order lib/meson.build lists them: rref,
 * dist_autograd, trace); every process of a job runs the same binary, so
 * every process hands out the same ids and kinds. The table is read-only
 * afterwards, so hooks are read without locks.
 *
 * Message kinds. A module may own
 *   - raw message types (msg: ntypes <= 4, numbered 0..ntypes-1 by the
 *     module): sr__module_send sends up to SR_MODULE_MSG_MAX bytes; each one
 *     that arrives goes to msg->on_msg(from, type, bytes, len) on the polling
 *     thread, which must not block (len is always SR_MODULE_MSG_MAX: the
 *     bytes the sender did not fill are zero);
 *   - module requests: sr__module_rpc() sends MOD_REQ {module id, sub-kind,
 *     a 64-bit tag, encoded values}; on the callee, request->serve() returns
 *     a future and the agent answers with its value (RESP) or error (ERR)
 *     when it completes, without holding a thread. serve runs on the polling
 *     thread: heavy work goes to sr__exec_submit().
 *
 * The envelope. Any request (REQ, KEEP call, module request) and any result
 * (RESP, KEEP_RET) may carry an extension header: per module at most
 * SR_EXT_MAX bytes, written by the sending side's hook and handed to the
 * receiving side's hook.
 *
 * Per-call hooks (call), caller side (any thread, before the request is
 * encoded):
 *   request_out(out, ext, &len)   may write the module's extension bytes.
 *   response_in(from, ext, len, v) the result v of a call that carried the
 *                                 module's extension back, before the
 *                                 caller's future completes.
 * Callee side:
 *   request_in(c, ext, len)       after the arguments were decoded (on the
 *                                 polling thread), for a request that
 *                                 carried the module's extension; may keep
 *                                 state in *sr__call_state(c, id).
 *   The hooks below, and the gate's prepare, run for a module only on the
 *   calls where it took its state slot (sr__call_state, from request_in or
 *   a value kind's decode hook): a call no module took a slot of (most
 *   calls) runs none of them, and pays no indirect call for nothing.
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
 * Thread context (tls): get()/set(v) read and replace a module's
 * per-thread value (distributed autograd's current context). The agent sets
 * the caller's value around user callbacks of futures (then, done
 * callbacks), so continuations see the context they were made in, and
 * `none` around a call served on a waiting thread, so it runs as on an
 * executor.
 *
 * Peers (life): peer_died(rank, why) runs once per peer
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
 * Lifecycle (life): init() in sr_init after the transport is attached and
 * before any RPC thread starts; shutdown_users(deadline) in a graceful
 * shutdown after the first barrier (it may make calls); shutdown_check()
 * after quiescence; fini() at local teardown (always, also after a failed
 * init: it must accept a module that never ran init). Modules run in
 * registration order, fini in reverse.
 *
 * Probes (probe): where the profiler (lib/modules/trace) sees the agent's
 * calls. It turns them on and off with sr__probe_set(mask). Each probe point
 * in lib/rpc is
 *     if (sr__probing()) ...;
 * one relaxed load of a word that is almost never written, and one branch
 * the CPU predicts: that is the whole cost while profiling is off. A build
 * with -Dprobes=false (SR_NO_PROBES) builds without any point; bench_rpc
 * measures both (docs/PERFORMANCE.md, "Profiling off"). The ops run on the
 * thread of the event, must not block and must not call back into RPC.
 * Times are CLOCK_MONOTONIC ns (sr__probe_now), the same clock in every
 * process of the host.
 *   caller  call_out (before the request leaves: the id is now in flight),
 *           call_sent (it left, or failed to: rc), call_end (its answer
 *           arrived, or it expired or its peer died: from = -1; t0 the
 *           arrival, before the future completes).
 *   callee  serve_in (decoded: t_arrive, t_decoded), ran (the function
 *           returned on its thread: t_run0, t_run1), served (the answer is
 *           about to go: err, t), reply (it is built and about to be sent:
 *           from t0 to t1; recorded before the send, so that a worker killed
 *           once its answer is out still has the record of it).
 *           struct sr_probe_call carries the times; a field of 0 was not
 *           measured (profiling was turned on mid-call).
 * The statistics of both sides are recorded before the caller's future
 * completes (call_end, served), so a caller that sees its call finished
 * sees it counted on both workers. Raw module messages: msg (dir 0 sent, 1
 * received). Spans: span (a module's own phases, e.g. a distributed
 * autograd pass: sr__probe_span).
 */
#ifndef SR_RPC_MODULE_H
#define SR_RPC_MODULE_H

#if !defined(SR__SEES_RPC)
#error "module.h is the seam of the RPC core (rpc) layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "shmrpc/future.h"
#include "shmrpc/rpc.h"
#include "shmrpc/value.h"

/* The most modules one process registers. */
#define SR_MODULE_MAX 4
/* Per module, the most extension bytes one message carries. */
#define SR_EXT_MAX 32
/* The bytes of one raw module message. */
#define SR_MODULE_MSG_MAX 56

/* What the caller is about to send. */
enum sr_call_kind {
    SR_CALL_UNKNOWN = -1, /* a function call not looked up yet: sr__call_out_kind() */
    SR_CALL_BUILTIN = 0, /* a built-in function */
    SR_CALL_USER = 1,    /* a registered (user) function */
    SR_CALL_KEEP = 2,    /* a call whose result stays on the callee (remote()) */
    SR_CALL_MODULE = 3,  /* a module request */
};

/* A value kind a module owns (its number: sr__module_register): how its
 * values travel and are released. A value of the kind holds one reference
 * on its object. */
typedef struct sr_value_kind_ops {
    const char *name;                                   /* sr_kind_name(), e.g. "rref" */
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
    const char *who;      /* the public function the user called, for errors (NULL: "sr_rpc") */
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

/* Per-call hooks (see above). */
struct sr_module_call_ops {
    int (*request_out)(const struct sr_call_out *out, uint8_t *ext, size_t *len);
    void (*response_in)(int from, const uint8_t *ext, size_t len, sr_value *v);
    int (*request_in)(sr_call *c, const uint8_t *ext, size_t len);
    void (*run_enter)(sr_call *c);
    void (*run_exit)(sr_call *c);
    void (*response_out)(sr_call *c, sr_value *v, uint8_t *ext, size_t *len);
    void (*call_done)(sr_call *c);
};

/* Holding a call before it runs. */
struct sr_module_gate_ops {
    /* A future the call must wait for before it runs (NULL: none); the call is
     * gated again when it completes, and fails with its error. */
    sr_future *(*gate)(sr_call *c);
    /* Just before the function runs (after every gate): 0 or -errno (the
     * call fails with sr_last_error()). */
    int (*prepare)(sr_call *c);
};

/* KEEP calls: the handle that will receive the result (NULL: -errno in
 * sr_last_error), then exactly one of set (err 0: v, else text, with cause
 * the failed function's own code, sr_future_error_code()'s value for
 * whoever reads the kept value) or drop. */
struct sr_module_keep_ops {
    void *(*open)(uint64_t tag, int caller);
    void (*set)(void *h, int err, int cause, const char *text, sr_value *v);
    void (*drop)(void *h);
};

/* The module's per-thread value. */
struct sr_module_tls_ops {
    int64_t (*get)(void);
    int64_t (*set)(int64_t v);
    int64_t none; /* the value of a thread that never set it (an executor's) */
};

/* Lifecycle and peers. */
struct sr_module_life_ops {
    int (*init)(const sr_init_opts *o);
    int (*shutdown_users)(int64_t deadline_ns);
    int (*shutdown_check)(void);
    void (*fini)(void);
    void (*peer_died)(int rank, const char *why);
};

/* Module requests. */
struct sr_module_request_ops {
    int (*serve)(int caller, uint8_t sub, uint64_t tag, sr_value *args, sr_future **out);
    /* For the profiler: a short name of a sub-kind ("to_here"); NULL: numbered. */
    const char *(*describe)(uint8_t sub);
};

/* Raw module messages. */
struct sr_module_msg_ops {
    uint8_t ntypes; /* types 0..ntypes-1 (at most 4) */
    void (*on_msg)(int from, uint8_t type, const uint8_t *bytes, size_t len);
    /* For the profiler: a short name of a message ("fork_request"); NULL: numbered. */
    const char *(*describe)(uint8_t type, const uint8_t *bytes, size_t len);
};

/* The profiler's probes (see above). */
enum { SR_PROBE_STATS = 1u, SR_PROBE_TRACE = 2u };

struct sr_probe_call {
    int caller;
    uint64_t call_id;
    const char *name;     /* the function, or "<module>:<request>" */
    int64_t t_arrive, t_decoded, t_run0, t_run1;
};

struct sr_probe_ops {
    void (*call_out)(uint64_t id, int to, const char *name, int64_t t0);
    void (*call_sent)(uint64_t id, int to, int rc, int64_t t0, int64_t t1);
    void (*call_end)(uint64_t id, int from, int err, int64_t t0, int64_t t1);
    void (*serve_in)(const struct sr_probe_call *c);
    void (*ran)(const struct sr_probe_call *c);
    void (*served)(const struct sr_probe_call *c, int err, int64_t t);
    void (*reply)(const struct sr_probe_call *c, int err, int64_t t0, int64_t t1);
    void (*msg)(int dir, int peer, const char *name, int64_t t);
    void (*span)(const char *cat, const char *name, int64_t t0, int64_t t1);
};

typedef struct sr_module {
    const char *name;
    const struct sr_module_call_ops *call;
    const struct sr_module_gate_ops *gate;
    const struct sr_module_keep_ops *keep;
    const struct sr_module_tls_ops *tls;
    const struct sr_module_life_ops *life;
    const struct sr_module_request_ops *request;
    const struct sr_module_msg_ops *msg;
    const sr_value_kind_ops *value_kind;
    const struct sr_probe_ops *probe;
} sr_module;

/* Register m (once; before sr_init): its id (>= 0), or -ENOSPC (the table
 * is full), -EEXIST (a second probe group), -EINVAL (a bad msg group). A
 * module with a value kind gets its kind number in *kind (may be NULL
 * otherwise). See "Ids and kinds". */
int sr__module_register(const sr_module *m, int *kind);

/* What o calls: a hook that needs to tell built-ins from user functions asks
 * (a registry lookup, made only then: most calls are made with no hook
 * interested). */
enum sr_call_kind sr__call_out_kind(const struct sr_call_out *o);

/* ---- what a module may use (the agent's side of the seam) ---- */

int sr__rpc_rank(void);  /* -1 when RPC is not initialised */
int sr__rpc_world(void);
/* This process's generation of its rank (segment.h, "Replacement in
 * place"): 0 for the first process, and whenever RPC is not initialised. */
uint32_t sr__rpc_generation(void);
/* Does the job replace a rank that dies (so that a death is not the end of
 * it)? false whenever RPC is not initialised. */
bool sr__rpc_replaces(void);
/* The process of `rank` has ended (the supervisor published it): a message
 * to it can never be answered. If so, why (len bytes, may be NULL) says how:
 * "worker2 exited with status 0 without sr_shutdown". */
bool sr__rpc_peer_gone(int rank, char *why, size_t len);
/* rank's generation as this worker knows it (ours for our own rank; 0 when
 * the job replaces no rank, or RPC is not initialised). During the
 * peer-death hook for rank, the generation that died. */
uint32_t sr__rpc_peer_generation(int rank);
/* rank shares our heap (our host's segment): the tensors a message carries
 * reach it by reference, zero-copy; across hosts they arrive as copies of
 * the same values (transport.h). False when RPC is not initialised. */
bool sr__rpc_shares_heap(int rank);
/* The default RPC timeout in ms (0: none), captured now. */
int64_t sr__rpc_default_timeout_ms(void);
/* Start a module request to `to`: args are encoded like a call's; the
 * future completes with serve's value or error ("Error on Node N: ...").
 * timeout_ms 0: none. who: the public function the user called, for errors. */
int sr__module_rpc(int to, int module, uint8_t sub, uint64_t tag, sr_args args, int64_t timeout_ms,
                   sr_future **out, const char *who);
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

/* Send raw message `type` of module `module` (len <= SR_MODULE_MSG_MAX
 * bytes, else -EINVAL), counted for graceful shutdown's quiescence; quiet:
 * wake nobody (the receiver reads it with its next message or poll). */
int sr__module_send(int to, int module, uint8_t type, const void *bytes, size_t len, bool quiet);
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
/* Where a module keeps per-call state (NULL-initialised when first
 * taken). Taking it signs the module up for the call's run_enter,
 * run_exit, prepare, response_out and call_done hooks (see above). The
 * call's thread only (the hand-overs of a call order its threads). */
void **sr__call_state(sr_call *c, int module);
/* The call whose request arguments this thread is decoding right now, or
 * NULL (any other decode: a result, a released buffer). A value kind's
 * decode hook may tie what it makes to that call through sr__call_state:
 * every call whose decode began gets call_done exactly once, also when the
 * decode failed. */
sr_call *sr__call_decoding(void);
/* The test-only reordering mode is on (reorder.h). */
bool sr__rpc_reordering(void);

/* A value of a module's kind over obj (takes its reference); NULL: -ENOMEM. */
sr_value *sr__value_module(int kind, void *obj);
/* The object of a value of that kind (borrowed), or NULL. */
void *sr__value_module_obj(const sr_value *v, int kind);

/* Futures (future.c; future_internal.h has the runtime's side). */
/* Wait on one future with a deadline; 0 when done, -ETIMEDOUT first. */
int sr__future_wait_until(sr_future *f, int64_t deadline_ns);
/* Complete with an already formatted message (e.g. "Error on Node 1: ..."). */
int sr__future_fail_text(sr_future *f, int err, const char *msg);
/* The same with the error's cause (sr_future_error_code()): for -SR_EREMOTE,
 * the remote function's own code. */
int sr__future_fail_cause(sr_future *f, int err, int cause, const char *msg);
/* add_done_callback with a release hook: if f is destroyed before it
 * completes, release(arg) runs instead of cb, so arg is never leaked. */
int sr__future_on_done(sr_future *f, void (*cb)(sr_future *, void *), void (*release)(void *), void *arg);
/* Borrowed result value of a completed future (NULL if it holds an error). */
sr_value *sr__future_peek(const sr_future *f);

/* Timeouts (timeout.c; timeout.h gives the rules: NaN and infinities
 * refused, 0 is none, anything > 0 at least 1 ms, clamped to
 * SR_MAX_RPC_TIMEOUT). */
/* s seconds as whole ms in *ms. -EINVAL naming fn and s for NaN, an
 * infinity or a negative s; *ms is then left alone. */
int sr__timeout_ms(double s, const char *fn, int64_t *ms);
/* The deadline ms after now_ns, in ns: -1 (none) when ms <= 0; INT64_MAX
 * when the sum would overflow. */
int64_t sr__deadline_ns(int64_t now_ns, int64_t ms);

/* Probes. Written by sr__probe_set, read relaxed by every probe point: a
 * point that reads a stale mask misses or records one event, which is
 * harmless; the ops themselves are published before any mask is set
 * (registration happens in a constructor, before main). */
extern _Atomic uint32_t sr__probe_mask;
extern const struct sr_probe_ops *sr__probe_ops;

static inline bool sr__probing(void)
{
#ifdef SR_NO_PROBES
    return false;
#else
    /* relaxed: see sr__probe_mask */
    return __builtin_expect(atomic_load_explicit(&sr__probe_mask, memory_order_relaxed) != 0, 0);
#endif
}

static inline int64_t sr__probe_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The agent's gauges, for the profiler's counter tracks (docs/PROFILING.md):
 * this worker's calls in flight and the messages waiting in its inbox
 * (relaxed reads of statistics; zeros without an agent). Any thread. */
struct sr_rpc_gauges {
    uint64_t in_flight, inbox;
};
void sr__rpc_gauges(struct sr_rpc_gauges *g);

/* Turn probes on (mask != 0) or off; returns the previous mask (0, and
 * nothing changes, without a profiler). */
uint32_t sr__probe_set(uint32_t mask);
/* A span of a layer above RPC (no-op when off). */
void sr__probe_span(const char *cat, const char *name, int64_t t0);

/* ---- the agent's side (rpc internal) ---- */
extern const sr_module *sr__modules[SR_MODULE_MAX];
/* Which modules have each per-call hook: a bit per module id, set by
 * sr__module_register (constructors, before main) and read-only after.
 * Every call runs each of these lists once or twice; walking the set bits
 * instead of every module's ops costs a no-op call some 190 fewer
 * instructions (docs/PERFORMANCE.md). */
enum sr__hook_kind {
    SR_HOOK_REQUEST_OUT, SR_HOOK_REQUEST_IN, SR_HOOK_RUN_ENTER, SR_HOOK_RUN_EXIT, SR_HOOK_RESPONSE_OUT,
    SR_HOOK_RESPONSE_IN, SR_HOOK_CALL_DONE, SR_HOOK_GATE, SR_HOOK_PREPARE, SR_HOOK_N
};
extern uint8_t sr__hooks[SR_HOOK_N];
/* The lowest module id in *mask (non-zero), cleared from it. */
static inline int sr__hook_next(unsigned *mask)
{
    int id = __builtin_ctz(*mask);
    *mask &= *mask - 1;
    return id;
}
/* The highest, for the hooks run in reverse order. */
static inline int sr__hook_last(unsigned *mask)
{
    int id = 31 - __builtin_clz(*mask);
    *mask &= ~(1u << id);
    return id;
}
/* The ops of a module value kind, or NULL. */
const sr_value_kind_ops *sr__value_kind(int kind);
/* The thread context of every module, captured and restored around user
 * callbacks of futures. */
struct sr_tls_snap {
    int64_t v[SR_MODULE_MAX];
    uint8_t mask; /* modules with a value */
};
void sr__tls_capture(struct sr_tls_snap *s);
void sr__tls_swap(struct sr_tls_snap *s); /* set s, and store the previous values in s */
/* Set every module's value to its none, and store the previous ones in s
 * (undone by sr__tls_swap(s)): a served call on a waiting thread runs as on
 * an executor (agent.h, "Serving waiters"). */
void sr__tls_clear(struct sr_tls_snap *s);
/* A module's name for a module request's sub-kind (type SR_MSG_MOD_REQ) or
 * for a raw message, as "<module>:<what>" in buf. */
const char *sr__probe_module_name(int module, int type, uint8_t sub, const uint8_t *bytes, char *buf, size_t len);
/* A raw module message: handed to its module (true), or unknown (false). */
struct sr_agent;
struct sr_msg;
bool sr__module_msg(struct sr_agent *a, const struct sr_msg *m);
/* The hooks of every module, in registration order (fini: reverse). */
void sr__modules_peer_died(int rank, const char *why);
int sr__modules_init(const sr_init_opts *o);
int sr__modules_shutdown_users(int64_t deadline_ns);
int sr__modules_shutdown_check(void);
void sr__modules_fini(void);

#endif
