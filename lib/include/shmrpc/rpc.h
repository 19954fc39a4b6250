/* SPDX-License-Identifier: MIT */
/* shmrpc: remote procedure calls (torch.distributed.rpc).
 *
 * A worker calls sr_init() once, under shmrun or inside sr_spawn(); then any
 * thread may call any function registered on any worker (itself included).
 * sr_shutdown() ends the worker's participation. Every call below is
 * thread-safe, also against a concurrent sr_shutdown(): a call either
 * completes, or fails with -SR_ESHUTDOWN naming the function ("RPC has not
 * been initialized"); a call in flight when the worker shuts down fails with
 * "RPC agent shut down before the response arrived".
 *
 * Destinations are ranks (0..world_size-1); sr_worker_rank() maps a name.
 * Timeouts are in seconds, the same everywhere (calls, sr_init_opts,
 * sr_set_rpc_timeout, sr_shutdown, the waits): 0 (SR_TIMEOUT_DEFAULT) is
 * the function's default (for a call, the current default, captured when
 * the call is sent; for sr_shutdown and the waits, no bound);
 * SR_TIMEOUT_NONE (+infinity) is no timeout; a negative value or NaN is
 * -EINVAL naming the function and the value. Any timeout > 0 is at least
 * 1 ms (a tiny one is rounded up, never to "none"); one above
 * SR_MAX_RPC_TIMEOUT (about 31.7 years) is clamped to it.
 *
 * Errors (returned as -errno / -SR_E*, detail in sr_last_error()):
 *   -SR_ESHUTDOWN  before sr_init or after sr_shutdown
 *   -EINVAL        bad rank, name, argument, or timeout
 *   -ENOENT        "Error on Node 1: function 'x' is not registered on worker1"
 *   -ETIMEDOUT     "RPC ran for more than set timeout (100 ms) and will now be marked with an error"
 *   -SR_EREMOTE    the function failed: "Error on Node 1: in 'fn': <message>";
 *                  sr_last_error_code() (sr_future_error_code()) gives the
 *                  function's own code, e.g. -ENOSPC
 *   -EPIPE         the destination worker's process ended, at once, saying how:
 *                  "RPC to worker2 failed: the worker exited with status 0
 *                  without sr_shutdown" (or "was killed by signal SIGKILL",
 *                  "... after a non-graceful sr_shutdown")
 */
#ifndef SHMRPC_RPC_H
#define SHMRPC_RPC_H

#if defined(SR__BUILDING) && !defined(SR__SEES_RPC)
#error "shmrpc/rpc.h belongs to the RPC core (rpc) layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "future.h"
#include "value.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SR_DEFAULT_RPC_TIMEOUT 60.0
/* A timeout argument or field: the default, or no timeout at all. */
#define SR_TIMEOUT_DEFAULT 0.0
#define SR_TIMEOUT_NONE (__builtin_inf())
/* The old name of SR_TIMEOUT_DEFAULT (it was -1, which is now -EINVAL). */
#define SR_UNSET_RPC_TIMEOUT SR_TIMEOUT_DEFAULT
#define SR_MAX_RPC_TIMEOUT 1e9 /* seconds; larger timeouts are clamped to it */
#define SR_DEFAULT_NUM_WORKER_THREADS 16

typedef struct sr_init_opts {
    const char *name;        /* NULL: "worker<rank>"; [A-Za-z0-9_:-]{1,127}, unique */
    double rpc_timeout_s;    /* > 0: the default call timeout; 0: 60 s;
                                SR_TIMEOUT_NONE: none. NaN or negative: -EINVAL */
    int num_worker_threads;  /* the most executor threads for user functions,
                                started as calls need them; 0: default (16) */
} sr_init_opts;

/* Attach to the job, start the progress thread and an executor, exchange
 * names. The job is shmrun's, sr_spawn's, or mpirun's (docs/MULTIHOST.md:
 * there sr_init is collective, every rank calls it, and a build without
 * Open MPI refuses with -ENOTSUP); started by none of them, the process is
 * a one-worker job of its own (docs/LAUNCHER.md, "Without a launcher").
 * Errors: -EALREADY "RPC is already initialized"; -EINVAL bad or
 * duplicate name ("is not unique"), a name of 128 characters or more
 * (refused, never truncated), or a bad rpc_timeout_s; -EPIPE a worker's
 * process ended before every worker had attached, at once ("rank 2 exited
 * with status 0 before attaching"); -ETIMEDOUT ranks that never attached
 * while none arrived for 60 s; other errors of the transport. */
SR_API int sr_init(const sr_init_opts *opts);

/* graceful: barrier with every worker; wait until this worker has no
 * pending UserRRef or child fork; delete every UserRRef on its owner; wait
 * until no call or RRef message is in flight anywhere (fire-and-forget chains
 * included); then the RRef leak check: an RRef still forked is reported as
 * "Leaking RRef (0,3) with fork id (1,7)", and is -EBUSY unless
 * sr_rref_set_ignore_leak(true) (shmrpc/rref.h); then tear down. timeout_s bounds the graceful part (0,
 * the default, or SR_TIMEOUT_NONE: no bound); -ETIMEDOUT if it passes (the leader, rank 0, names the workers
 * that never arrived). -EPIPE at once when a worker leaves without a
 * graceful shutdown of its own (it returned from main without sr_shutdown,
 * called sr_shutdown(false), or was killed), or had left before: "worker2
 * exited with status 0 without sr_shutdown"; also when that worker is the
 * leader. Local teardown always runs, even after an error, except for
 * -EINVAL: a NaN or negative timeout_s is refused before anything is
 * done. */
SR_API int sr_shutdown(bool graceful, double timeout_s);
/* The tensor and value leak check of a graceful sr_shutdown: after the
 * teardown, tensors and values this process made since sr_init and still
 * holds are reported, "Detected tensor and value leaks during shutdown:
 * worker1 (rank 1) still holds 2 tensors (2 f32) and 1 value (1 object)
 * ...", and sr_shutdown returns -EBUSY (after a teardown that did
 * complete). true only logs the report. Process-wide, read by each
 * sr_shutdown. */
SR_API void sr_set_ignore_leak(bool ignore);

SR_API int sr_rank(void);
SR_API int sr_world_size(void);
/* Name of rank, or NULL (-EINVAL) if out of range. In an elastic job
 * (shmrun --max-workers) a rank not present has the name of the worker
 * that held it last, or "worker<rank>" if none did (for messages). */
SR_API const char *sr_worker_name(int rank);
/* Rank of a name, or -EINVAL ("could not find destination 'x'"). In an
 * elastic job only the workers present are found. */
SR_API int sr_worker_rank(const char *name);
/* Wait until `rank` is alive as this worker sees it: at once for a worker
 * running, or, in a job that replaces ranks (shmrun --restart rank), once
 * a dead rank's new generation has attached and its old one's death is
 * handled here, or, in an elastic job (shmrun --max-workers), once a worker
 * has joined the rank; a call made then reaches it. timeout_s 0 (the
 * default) or SR_TIMEOUT_NONE: no bound. 0;
 * -ETIMEDOUT; -EPIPE the rank is gone and the job replaces none; -EINVAL. */
SR_API int sr_wait_for_worker(int rank, double timeout_s);
/* rank's generation as this worker knows it: 0 for the process the job
 * started with, one more for each replacement (shmrun --restart rank);
 * -EPIPE while it is gone and not back; -EINVAL; -SR_ESHUTDOWN. A change
 * between two calls means the rank was replaced in between. */
SR_API int64_t sr_worker_generation(int rank);
/* Is `rank` held by a running worker, as this worker sees it? 1 yes (it
 * may be leaving), 0 no: in an elastic job (shmrun --max-workers) a free
 * rank, or one whose worker left or died; in any job a rank whose worker
 * ended. -EINVAL out of range; -SR_ESHUTDOWN. */
SR_API int sr_worker_present(int rank);
/* Wait until `rank` is not present (above): its worker left the job,
 * detached or ended, and this worker has handled it (its RRefs and
 * distributed-autograd contexts failed). timeout_s 0 or SR_TIMEOUT_NONE:
 * no bound. 0;
 * -ETIMEDOUT; -EINVAL out of range or our own rank; -SR_ESHUTDOWN. */
SR_API int sr_wait_for_departure(int rank, double timeout_s);

/* Default timeout for calls sent from now on: seconds, 0 back to
 * SR_DEFAULT_RPC_TIMEOUT, SR_TIMEOUT_NONE none. 0, or -EINVAL for NaN or a
 * negative value (the default is then unchanged), or -SR_ESHUTDOWN. Values
 * above SR_MAX_RPC_TIMEOUT are clamped to it; any value > 0 is at least
 * 1 ms. */
SR_API int sr_set_rpc_timeout(double seconds);
/* The default in seconds, SR_TIMEOUT_NONE when there is none; -1 before
 * sr_init. */
SR_API double sr_get_rpc_timeout(void);

/* ---- functions ---------------------------------------------------------- */

typedef struct sr_call sr_call;
/* A function: read arguments with sr_call_arg, finish with
 * return sr_call_return(c, value) or return sr_call_fail(c, err, fmt, ...).
 * A NULL c is -EINVAL in sr_last_error(): nargs 0, arg NULL, caller, return
 * (which still drops v) and fail -EINVAL. */
typedef int (*sr_fn)(sr_call *c);
/* An async function returns a future instead of a value and holds no thread
 * while it waits (@rpc.functions.async_execution). It must not block. */
typedef int (*sr_async_fn)(sr_call *c, sr_future **result);

SR_API size_t sr_call_nargs(const sr_call *c);
SR_API sr_value *sr_call_arg(const sr_call *c, size_t i); /* borrowed */
SR_API int sr_call_caller(const sr_call *c);              /* rank of the caller */
SR_API int sr_call_return(sr_call *c, sr_value *v);       /* takes ownership of v */
SR_API int sr_call_fail(sr_call *c, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Register by name (letters, digits, '_', '.', ':' and '-', < 64 bytes).
 * -EEXIST if the name is taken (built-ins included). */
SR_API int sr_register(const char *name, sr_fn fn);
SR_API int sr_register_async(const char *name, sr_async_fn fn);

/* ---- calls ---------------------------------------------------------------- */

typedef struct sr_args {
    size_t n;
    sr_value *const *v;
} sr_args;
/* SR_ARGS(a, b, ...): the arguments of one call, written in the call:
 *     sr_rpc_sync(1, "add", SR_ARGS(x, y), SR_TIMEOUT_DEFAULT, &out);
 * In C the array is a compound literal, alive until the end of the enclosing
 * block. In C++ (which has no compound literals) it is the array of a
 * std::initializer_list, alive until the end of the full expression that
 * contains SR_ARGS: use it inside the call, never keep an sr_args made by it
 * in a variable. SR_NOARGS is the empty list in both languages. */
#ifndef __cplusplus
#define SR_ARGS(...) \
    ((sr_args){sizeof((sr_value *[]){__VA_ARGS__}) / sizeof(sr_value *), (sr_value *[]){__VA_ARGS__}})
#define SR_NOARGS ((sr_args){0, NULL})
#else
#define SR_ARGS(...) (::sr__args_cxx({__VA_ARGS__}))
#define SR_NOARGS (::sr_args{0, nullptr})
#endif

/* Arguments are borrowed: the call takes its own references. The result in
 * *out (out may be NULL) is the caller's. */
SR_API int sr_rpc_sync(int to, const char *fn, sr_args args, double timeout_s, sr_value **out);
SR_API int sr_rpc_async(int to, const char *fn, sr_args args, double timeout_s, sr_future **out);

/* Wait for f on a thread that has nothing else to do meanwhile (a
 * parameter server's main thread, waiting for the end of training), and
 * serve this worker's incoming calls on it, as sr_shutdown serves while it
 * waits: a call this thread reads runs here, with no hop to an executor
 * thread and no wake-up of one. A plain function runs after this thread has
 * handed the inbox back, so one that blocks (on a lock that another call
 * releases, or on a nested RPC) never stops the worker from serving: the
 * progress thread or the executors take over meanwhile. Served functions see
 * this thread's state as theirs, so call it holding no lock a served function
 * may take, outside any distributed autograd context and with grad mode on
 * (as an executor runs them). In a callback on the thread that polls the
 * inbox (a nested wait), or without an initialised RPC agent, it waits as
 * sr_future_wait does.
 * Returns as sr_future_wait: 0 with *out = a new reference to f's value (out
 * may be NULL), or f's error with its message in sr_last_error(); -EINVAL
 * if f is NULL. */
SR_API int sr_serve_until(sr_future *f, sr_value **out);

/* sr_serve_until, for at most timeout_s seconds (the waits' rules, docs/API.md
 * "Timeouts": 0 or SR_TIMEOUT_NONE: no bound; negative or NaN: -EINVAL).
 * -ETIMEDOUT when f is not done by then, naming this worker and the bound;
 * f is untouched (still pending, still the caller's): a server that bounds
 * its wait by the trainers' progress serves again while they make some. */
SR_API int sr_serve_until_timeout(sr_future *f, double timeout_s, sr_value **out);

/* ---- debug ---------------------------------------------------------------- */

typedef struct sr_debug_info {
    uint64_t client_active_calls;  /* our calls awaiting a response */
    uint64_t server_active_calls;  /* requests we are executing */
    uint64_t server_async_calls;   /* of which async functions awaiting their future */
    uint32_t thread_pool_size, num_idle_threads; /* executors started so far; asleep */
    uint64_t messages_sent, messages_received;
    uint64_t wakes_issued;         /* doorbell wake syscalls this worker made */
    uint64_t sleeps_taken;         /* sleeps of the thread reading this worker's inbox, on its doorbell: the
                                    * progress thread's, and a waiting user thread's that holds the inbox */
} sr_debug_info;

SR_API int sr_debug_info_get(sr_debug_info *out);

#ifdef __cplusplus
} /* extern "C" */

#include <initializer_list>

/* SR_ARGS in C++: the list's array is a temporary of the full expression that
 * holds the call (see SR_ARGS above). */
inline sr_args sr__args_cxx(std::initializer_list<sr_value *> l) noexcept
{
    return sr_args{l.size(), l.begin()};
}
#endif
#endif
