/* SPDX-License-Identifier: MIT */
/* A representative job for tests/trace/test_trace.c, run under shmrun with
 * SHMRPC_TRACE: RPC (a built-in, a user function, an error), RRefs (remote(),
 * to_here, a user passing its RRef to another user: the child accept its
 * parent gets, with no fork request since the function drops the child
 * (docs/RREF.md, flow 4), user deletes) and a distributed autograd pass (forward through
 * RPC, backward on two workers). Rank 0 drives; the others serve from
 * sr_shutdown. Exits non-zero, saying why, if anything fails.
 *
 * With an argument, a job that never reaches a graceful end
 * (tests/trace/test_trace.c checks that its trace and statistics survive):
 *   kill  rank 1 calls twice on rank 0, last_words on rank 2, then SIGKILLs itself;
 *   hang  rank 1 calls twice on rank 0, last_words on rank 2, writes "ready" on stdout and
 *         waits for a signal (the test then sends SIGINT to shmrun).
 * The other ranks wait in sr_shutdown. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shmrpc/shmrpc.h"

#define CHECK(cond, what)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "trace_prog: %s failed: %s\n", what, sr_last_error()); \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static int twice(sr_call *c) { return sr_call_return(c, sr_int(2 * sr_value_int(sr_call_arg(c, 0)))); }

static int last_words(sr_call *c) { return sr_call_return(c, sr_int(1)); }

static int fails(sr_call *c) { return sr_call_fail(c, -EINVAL, "fails on purpose"); }

/* rank 2: fetch the value of an RRef owned by rank 1, passed by rank 0 */
static int fetch(sr_call *c)
{
    sr_value *v = NULL;
    int rc = sr_rref_to_here(sr_value_rref(sr_call_arg(c, 0)), 0, &v);
    return rc ? rc : sr_call_return(c, v);
}

static void rpc_and_rrefs(void)
{
    sr_value *x = sr_int(21), *out = NULL;
    CHECK(sr_rpc_sync(1, "add", SR_ARGS(x, x), 0, &out) == 0, "add");
    sr_value_unref(out);
    CHECK(sr_rpc_sync(2, "twice", SR_ARGS(x), 0, &out) == 0 && sr_value_int(out) == 42, "twice");
    sr_value_unref(out);
    CHECK(sr_rpc_sync(1, "fails", SR_NOARGS, 0, NULL) == -SR_EREMOTE, "fails");
    sr_rref *r = NULL;
    CHECK(sr_remote(1, "twice", SR_ARGS(x), 0, &r) == 0, "remote");
    CHECK(sr_rref_to_here(r, 0, &out) == 0 && sr_value_int(out) == 42, "to_here");
    sr_value_unref(out);
    sr_value *rv = sr_value_from_rref(r);
    CHECK(sr_rpc_sync(2, "fetch", SR_ARGS(rv), 0, &out) == 0 && sr_value_int(out) == 42, "fetch on a user");
    sr_value_unref(out);
    sr_value_unref(rv);
    sr_rref_unref(r);
    sr_value_unref(x);
}

static void autograd(void)
{
    int64_t ctx, shape = 4;
    CHECK(sr_dist_autograd_context_begin(&ctx) == 0, "context_begin");
    sr_tensor *w = sr_ones(SR_F64, 1, &shape, SR_REQUIRES_GRAD);
    sr_value *wv = sr_value_from_tensor(w), *out = NULL;
    CHECK(sr_rpc_sync(1, "mul", SR_ARGS(wv, wv), 0, &out) == 0, "mul");
    sr_tensor *loss = sr_sum(sr_value_tensor(out));
    CHECK(loss && sr_dist_autograd_backward(ctx, &loss, 1, false) == 0, "backward");
    sr_tensor_unref(loss);
    sr_value_unref(out);
    sr_value_unref(wv);
    sr_tensor_unref(w);
    CHECK(sr_dist_autograd_context_end(ctx) == 0, "context_end");
}

/* rank 1 in the modes that end badly: a call to rank 0 (every worker is
 * then recording), its last call, then its end */
static void end_badly(const char *mode)
{
    sr_value *x = sr_int(1), *out = NULL;
    CHECK(sr_rpc_sync(0, "twice", SR_ARGS(x), 0, &out) == 0, "twice on rank 0");
    sr_value_unref(out);
    sr_value_unref(x);
    CHECK(sr_rpc_sync(2, "last_words", SR_NOARGS, 0, &out) == 0, "last_words");
    sr_value_unref(out);
    if (!strcmp(mode, "kill"))
        raise(SIGKILL);
    printf("ready\n");
    fflush(stdout);
    for (;;)
        pause();
}

int main(int argc, char **argv)
{
    sr_register("twice", twice);
    sr_register("fails", fails);
    sr_register("fetch", fetch);
    sr_register("last_words", last_words);
    CHECK(sr_init(NULL) == 0, "sr_init");
    if (argc > 1) {
        if (sr_rank() == 1)
            end_badly(argv[1]);
    } else if (sr_rank() == 0) {
        rpc_and_rrefs();
        autograd();
    }
    CHECK(sr_shutdown(true, 60) == 0, "sr_shutdown");
    return 0;
}
