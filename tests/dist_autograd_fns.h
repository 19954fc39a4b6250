/* SPDX-License-Identifier: MIT */
/* Functions and helpers shared by the distributed autograd suites
 * (test_dist_autograd*.c), defined in dist_autograd_fns.c: the user functions every worker registers (ports
 * of the helpers of PyTorch's dist_autograd_test.py), calls in each of
 * PyTorch's execution modes, notes passed between workers, and checks of
 * gradients and of a context's send/recv functions.
 *
 * Rules these tests keep:
 *   - a helper RPC (notes, barriers, inspection of another worker) is made
 *     from a thread with no current context (noctx_rpc, da_barrier), so it
 *     never adds to the graph or to the known workers under test;
 *   - every wait is bounded (WAIT_S) and reports what it waited for;
 *   - waits are on events (a response, a condition variable), never sleeps. */
#ifndef SR_TESTS_DIST_AUTOGRAD_FNS_H
#define SR_TESTS_DIST_AUTOGRAD_FNS_H

#include <math.h>
#include <sched.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rref_fns.h"
#include "shmrpc/dist_autograd.h"
#include "shmrpc/tensor.h"

/* ---- state shared by the job's processes (mapped before sr_spawn) ---- */

struct da_shared {
    _Atomic int fail[WORLD];   /* per origin rank: the failing hooks of its chains fail */
    _Atomic int exit_in_hook;  /* the exit hook _exit()s the worker */
    _Atomic int hook_calls[WORLD];
    sem_t pass_over; /* process-shared: posted when a dying-peer pass has returned */
    sem_t gate[WORLD]; /* process-shared: gate_add on worker w waits for gate[w] */
};

extern struct da_shared *dash;

/* The run is under the reordering delivery mode (SHMRPC_REORDER_SEED). */
bool reordering(void);

#define DSHAPE(...) (const int64_t[]){__VA_ARGS__}

/* An r x c F64 tensor of v (of random values), requiring grad if rg. */
sr_tensor *t_full(int64_t r, int64_t c, double v, bool rg);

sr_tensor *t_rand(int64_t r, int64_t c, bool rg);

/* A fresh leaf with t's values (no history), requiring grad if rg. */
sr_tensor *leaf_copy(sr_tensor *t, bool rg);

/* got (may be NULL) equals want[0..n) within tol (relative to max(1,|want|)). */
int expect_vals(const sr_tensor *got, const double *want, size_t n, double tol, const char *what);

/* got equals the tensor want (same shape and dtype, values within tol). */
int expect_same(const sr_tensor *got, const sr_tensor *want, double tol, const char *what);

/* Every element of got is v. */
int expect_all(const sr_tensor *got, double v, const char *what);

/* The context's gradient for leaf is all v. */
int expect_grad_all(int64_t ctx, const sr_tensor *leaf, double v, const char *what);

/* The context holds exactly n gradients on this worker. */
int expect_num_grads(int64_t ctx, size_t want, const char *what);

/* Value, list and tensor references. */
sr_value *tv(sr_tensor *t);

void unref_values(sr_value **v, size_t n);

void unref_tensors(sr_tensor **t, size_t n);

/* The tensor in v (a new reference), consuming v; NULL if v holds none. */
sr_tensor *take_tensor(sr_value *v);

enum mode { LOCAL, RPC_SYNC, RPC_ASYNC, REMOTE };

extern const char *const mode_name[];

/* fn(args) on dst in mode m: the result value, or NULL with the error. */
sr_value *call_mode(enum mode m, int dst, const char *fn, sr_args args);

/* The tensor fn(a[, b]) on dst in mode m (a new reference) or NULL. */
sr_tensor *op_mode(enum mode m, int dst, const char *fn, sr_tensor *a, sr_tensor *b);

/* The other ranks in turn (PyTorch's _next_rank), per thread. */
int next_dst(void);

/* sr_rpc_sync(to, fn, args) made by a fresh thread, which has no context. */
int noctx_rpc(int to, const char *fn, sr_args args, sr_value **out);

/* The barrier (rref_fns.h), called from a thread with no context. */
int da_barrier(void);

#define NOTE_SLOTS 16

/* Pass "context id of this origin, for slot" to worker to. */
int send_note(int to, int slot, int64_t id);

/* Wait (bounded) for the note of origin in slot. */
int wait_note(int slot, int origin, int64_t *id);

/* Poll worker w (by RPC, each try paced by its answer) until context id is
 * gone there; bounded by 10 s, like PyTorch's _all_contexts_cleaned_up. */
int expect_gone_on(int w, int64_t id, const char *what);

/* Poll every worker until it holds no context (and runs no pass). */
int expect_no_contexts_anywhere(const char *what);

/* The context's send (or recv) functions; fails unless there are exactly want. */
int get_fns(int64_t ctx, bool send, sr_dist_fn_info *out, size_t want, const char *what);

/* got (a function's name, may be NULL) contains want. */
bool name_is(const char *got, const char *want);

/* Send function f has the given next functions (by name). */
int expect_next(const sr_dist_fn_info *f, uint32_t n, const char *const *names, const char *what);

/* The context knows exactly the workers want[0..n). */
int expect_known(int64_t ctx, const int *want, size_t n, const char *what);

/* The tensor of an owner's RRef value rv (its local value, *hold: unref it), or NULL. */
sr_tensor *rref_tensor(sr_value *rv, sr_value **hold);

/* nested_udf(t1, t2, dst): PyTorch's _nested_python_udf:
 * t3 = t1*t2, t4 = t1+t2, res = rpc_sync(dst, add, (t3, t4)), t1*t2*t3*t4*res. */
sr_tensor *nested_udf_body(sr_tensor *t1, sr_tensor *t2, int dst, bool local);

/* Fails while *arg (a flag in the shared page) is set: SimulateBackwardError. */
int failing_hook(sr_tensor *grad, sr_tensor **replace, void *arg);

enum { CHAIN_FAIL = 1, CHAIN_SUM = 2, CHAIN_EXIT = 4, CHAIN_GATE = 8 };

/* hop_scale(t, hops, flags) on dst, from this worker (the origin). */
sr_tensor *chain(enum mode m, int dst, sr_tensor *t, int hops, int flags);

void register_da_fns(void);

/* The scenario of a DA_JOB, then a barrier and expect_quiet on every worker. */
extern scenario_fn da_scenario;

int da_then_quiet(int rank, int world);

/* A job of WORLD workers running sc on each (failing fast) with the user
 * functions that reg registers, and the shared page. */
#define DA_JOB_FNS(name, sc, reg, ...)                                                              \
    do {                                                                                            \
        dash = shared_page(sizeof(*dash));                                                          \
        for (int w_ = 0; w_ < WORLD; w_++)                                                          \
            cr_assert_eq(sem_init(&dash->gate[w_], 1, 0), 0);                                       \
        da_scenario = sc;                                                                           \
        rref_scenario = da_then_quiet;                                                              \
        RUN_JOB(name, WORLD, .scenario = fail_fast, .register_fns = reg, .shutdown_timeout = 30,    \
                __VA_ARGS__);                                                                       \
        munmap(dash, sizeof(*dash));                                                                \
    } while (0)

#define DA_JOB(name, sc, ...) DA_JOB_FNS(name, sc, register_da_fns, __VA_ARGS__)

/* Begin a context, failing the worker with a message if it cannot. */
#define CTX_BEGIN(id)                                                                               \
    do {                                                                                            \
        int rc_b_ = sr_dist_autograd_context_begin(&(id));                                          \
        WCHECK(rc_b_ == 0, "context_begin: %d: %s", rc_b_, sr_last_error());                        \
    } while (0)

#define CTX_END(id)                                                                                 \
    do {                                                                                            \
        int rc_e_ = sr_dist_autograd_context_end(id);                                               \
        WCHECK(rc_e_ == 0, "context_end: %d: %s", rc_e_, sr_last_error());                          \
    } while (0)

/* Distributed backward from n roots, failing the worker with a message. */
int da_backward(int64_t ctx, sr_tensor *const *roots, size_t n, bool retain, const char *what);

#endif
