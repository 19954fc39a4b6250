/* SPDX-License-Identifier: MIT */
/* Future callbacks that call out, after PyTorch's rpc_test.py
 * (test_callback_with_ret, test_callback_chain, test_callback_in_rpc,
 * test_callback_with_error, add_use_future_nested_cb): a `then` callback
 * runs on the thread that completes the future, here the thread that read
 * the response (the progress thread, or a caller polling for its own
 * answer), and may block on a nested sr_rpc_sync. Regression tests for
 * a blocking call inside a callback that hung the worker for good.
 *
 * Every wait in a worker is bounded: a worker whose callback does not finish
 * in EVENT_WAIT_S reports it and exits at once (a hung progress thread
 * would otherwise hang its sr_shutdown too). */
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "rpc_harness.h"

LEAK_CHECKED_SUITE(rpc_callbacks);

#define WORLD 3
#define EVENT_WAIT_S 20

/* ---- helpers -------------------------------------------------------------- */

static double num(const sr_value *v)
{
    return sr_value_type(v) == SR_KIND_INT ? (double)sr_value_int(v) : sr_value_double(v);
}

/* A number from a completed future (the parent of a then). */
static int parent_num(sr_future *parent, double *x)
{
    sr_value *v = NULL;
    int rc = sr_future_wait(parent, &v); /* done already: returns at once, like fut.wait() in PyTorch's callbacks */
    if (rc)
        return rc;
    *x = num(v);
    sr_value_unref(v);
    return 0;
}

/* sr_rpc_async(to, "add", x, y) */
static int add_async(int to, double x, double y, sr_future **out)
{
    sr_value *a = sr_double(x), *b = sr_double(y);
    int rc = sr_rpc_async(to, "add", SR_ARGS(a, b), 0, out);
    sr_value_unref(a);
    sr_value_unref(b);
    return rc;
}

static int wait_num(sr_future *f, double *x)
{
    sr_value *v = NULL;
    int rc = sr_future_wait(f, &v);
    if (!rc) {
        *x = num(v);
        sr_value_unref(v);
    }
    return rc;
}

/* Wait for a semaphore a callback posts; on a timeout the callback is hung:
 * report it and leave at once (the job's other workers are then torn down). */
static void sem_wait_or_die(sem_t *s, int rank, const char *what)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += EVENT_WAIT_S;
    while (sem_timedwait(s, &ts) != 0) {
        if (errno == EINTR)
            continue;
        fprintf(stderr, "rank %d: %s did not finish in %d s: the callback hangs\n", rank, what, EVENT_WAIT_S);
        _exit(3);
    }
}

/* ---- test_callback_with_ret ------------------------------------------------ */

static int dst_of(int rank) { return (rank + 1) % WORLD; }

static int plus_one(sr_future *parent, void *arg, sr_value **result)
{
    (void)arg;
    double x;
    int rc = parent_num(parent, &x);
    if (!rc)
        *result = sr_double(x + 1);
    return rc;
}

/* callback(fut0): rpc_async(dst, add, fut0.wait(), 1).then(+1).wait() */
static int with_ret(sr_future *parent, void *arg, sr_value **result)
{
    int dst = (int)(intptr_t)arg;
    double x, y;
    sr_future *f1 = NULL, *f2 = NULL;
    int rc = parent_num(parent, &x);
    if (!rc)
        rc = add_async(dst, x, 1, &f1);
    if (!rc)
        rc = sr_future_then(f1, plus_one, NULL, &f2);
    if (!rc)
        rc = wait_num(f2, &y); /* blocks on the thread that read fut0's answer */
    sr_future_unref(f1);
    sr_future_unref(f2);
    if (!rc)
        *result = sr_double(y);
    return rc;
}

static int scenario_with_ret(int rank, int world)
{
    (void)world;
    sr_future *f0, *f3;
    double got = 0;
    WCHECK(add_async(dst_of(rank), 2, 1, &f0) == 0, "rpc_async: %s", sr_last_error());
    WCHECK(sr_future_then(f0, with_ret, (void *)(intptr_t)dst_of(rank), &f3) == 0, "then: %s", sr_last_error());
    int rc = wait_num(f3, &got);
    sr_future_unref(f0);
    sr_future_unref(f3);
    WCHECK(rc == 0, "rank %d: fut3.wait() failed: %d %s", rank, rc, sr_last_error());
    WCHECK(got == 2 + 3, "rank %d: fut3 holds %g, expected 5", rank, got);
    return 0;
}

/* Calls time out after 10 s (and shutdown after 10 s), so that a hang
 * fails in seconds, not in the default minute. */
Test(rpc_callbacks, callback_with_ret)
{
    RUN_JOB("cb_ret", WORLD, .scenario = scenario_with_ret, .opts = {.rpc_timeout_s = 10}, .shutdown_timeout = 10);
}

/* The same, with the caller not polling: it waits on a semaphore the last
 * callback posts, so the progress thread reads the answer and runs the
 * callback, which blocks there (20 rounds: both threads may race to it). */
static sem_t done_sem;
static double done_val;
static int done_rc;

static void post_done(sr_future *f, void *arg)
{
    (void)arg;
    done_rc = wait_num(f, &done_val);
    sem_post(&done_sem);
}

static int scenario_with_ret_on_progress(int rank, int world)
{
    (void)world;
    sem_init(&done_sem, 0, 0);
    for (int round = 0; round < 20; round++) {
        sr_future *f0, *f3;
        WCHECK(add_async(dst_of(rank), round, 1, &f0) == 0, "rpc_async: %s", sr_last_error());
        WCHECK(sr_future_then(f0, with_ret, (void *)(intptr_t)dst_of(rank), &f3) == 0, "then: %s", sr_last_error());
        WCHECK(sr_future_add_done_callback(f3, post_done, NULL) == 0, "add_done_callback: %s", sr_last_error());
        sem_wait_or_die(&done_sem, rank, "a then callback that calls rpc_sync");
        sr_future_unref(f0);
        sr_future_unref(f3);
        WCHECK(done_rc == 0, "rank %d round %d: %d %s", rank, round, done_rc, sr_last_error());
        WCHECK(done_val == round + 1 + 2, "rank %d round %d: got %g", rank, round, done_val);
    }
    sem_destroy(&done_sem);
    return 0;
}

Test(rpc_callbacks, callback_with_ret_on_progress_thread)
{
    RUN_JOB("cb_ret_prog", WORLD, .scenario = scenario_with_ret_on_progress);
}

/* ---- a callback whose nested call times out: the timeout fires -------------- */

/* Shared by the job: released[r] lets the stall that rank r called answer. */
static _Atomic uint32_t *released;

static int fn_stall(sr_call *c)
{
    int caller = sr_call_caller(c);
    time_t until = time(NULL) + EVENT_WAIT_S;
    /* Answer only once the caller has seen its timeout (bounded). */
    while (!atomic_load(&released[caller]) && time(NULL) < until) {
        struct timespec ts = {1, 0};
        syscall(SYS_futex, &released[caller], FUTEX_WAIT, 0, &ts, NULL, 0);
    }
    return sr_call_return(c, sr_none());
}

static int nested_timeout(sr_future *parent, void *arg, sr_value **result)
{
    (void)parent;
    sr_value *v = NULL;
    int rc = sr_rpc_sync((int)(intptr_t)arg, "stall", SR_NOARGS, 0.05, &v);
    sr_value_unref(v);
    atomic_store(&released[sr_rank()], 1);
    syscall(SYS_futex, &released[sr_rank()], FUTEX_WAKE, 1, NULL, NULL, 0);
    *result = sr_int(rc);
    return 0;
}

static int scenario_nested_timeout(int rank, int world)
{
    (void)world;
    sem_init(&done_sem, 0, 0);
    sr_future *f0, *f3;
    WCHECK(add_async(dst_of(rank), 1, 1, &f0) == 0, "rpc_async: %s", sr_last_error());
    WCHECK(sr_future_then(f0, nested_timeout, (void *)(intptr_t)dst_of(rank), &f3) == 0, "then: %s", sr_last_error());
    WCHECK(sr_future_add_done_callback(f3, post_done, NULL) == 0, "add_done_callback: %s", sr_last_error());
    sem_wait_or_die(&done_sem, rank, "a then callback whose rpc_sync times out");
    sr_future_unref(f0);
    sr_future_unref(f3);
    WCHECK(done_rc == 0 && done_val == -ETIMEDOUT, "rank %d: the nested call returned %g, not -ETIMEDOUT", rank,
           done_val);
    sem_destroy(&done_sem);
    return 0;
}

static void register_stall(void) { sr_register("stall", fn_stall); }

Test(rpc_callbacks, nested_call_in_callback_times_out)
{
    released = shared_page(WORLD * sizeof(*released));
    RUN_JOB("cb_tmo", WORLD, .scenario = scenario_nested_timeout, .register_fns = register_stall);
}

/* ---- test_callback_chain ------------------------------------------------------ */

static int scenario_chain(int rank, int world)
{
    (void)world;
    sr_future *f;
    WCHECK(add_async(dst_of(rank), rank + 1, 1, &f) == 0, "rpc_async: %s", sr_last_error());
    for (int i = 0; i < 20; i++) {
        sr_future *g;
        WCHECK(sr_future_then(f, plus_one, NULL, &g) == 0, "then: %s", sr_last_error());
        sr_future_unref(f);
        f = g;
    }
    double got = 0;
    int rc = wait_num(f, &got);
    sr_future_unref(f);
    WCHECK(rc == 0 && got == rank + 1 + 1 + 20, "rank %d: chain gave %d %g", rank, rc, got);
    return 0;
}

Test(rpc_callbacks, callback_chain)
{
    RUN_JOB("cb_chain", WORLD, .scenario = scenario_chain);
}

/* A chain in which every link makes a blocking call (nested rpc_sync in
 * each callback, from whichever thread reads the previous answer). */
static int link_sync(sr_future *parent, void *arg, sr_value **result)
{
    double x;
    int rc = parent_num(parent, &x);
    sr_value *a = NULL, *b = NULL, *v = NULL;
    if (!rc) {
        a = sr_double(x), b = sr_double(1);
        rc = sr_rpc_sync((int)(intptr_t)arg, "add", SR_ARGS(a, b), 0, &v);
    }
    if (!rc)
        *result = sr_double(num(v));
    sr_value_unref(a);
    sr_value_unref(b);
    sr_value_unref(v);
    return rc;
}

static int scenario_chain_sync(int rank, int world)
{
    (void)world;
    sem_init(&done_sem, 0, 0);
    sr_future *f, *first;
    WCHECK(add_async(dst_of(rank), 0, 1, &f) == 0, "rpc_async: %s", sr_last_error());
    first = sr_future_ref(f);
    for (int i = 0; i < 10; i++) {
        sr_future *g;
        WCHECK(sr_future_then(f, link_sync, (void *)(intptr_t)((rank + 1 + i) % WORLD), &g) == 0, "then: %s",
               sr_last_error());
        sr_future_unref(f);
        f = g;
    }
    WCHECK(sr_future_add_done_callback(f, post_done, NULL) == 0, "add_done_callback: %s", sr_last_error());
    sem_wait_or_die(&done_sem, rank, "a chain of callbacks that call rpc_sync");
    sr_future_unref(f);
    sr_future_unref(first);
    WCHECK(done_rc == 0 && done_val == 11, "rank %d: chain gave %d %g", rank, done_rc, done_val);
    sem_destroy(&done_sem);
    return 0;
}

Test(rpc_callbacks, callback_chain_with_nested_rpc_sync)
{
    RUN_JOB("cb_chain_sync", WORLD, .scenario = scenario_chain_sync);
}

/* ---- test_callback_with_error ------------------------------------------------- */

static int fn_raise(sr_call *c) { return sr_call_fail(c, -EINVAL, "Expected error"); }

static int rethrow(sr_future *parent, void *arg, sr_value **result)
{
    (void)arg, (void)result;
    int rc = sr_future_wait(parent, NULL);
    if (rc != -SR_EREMOTE || !strstr(sr_last_error(), "Expected error"))
        return sr_errorf(-EPROTO, "the parent's error was %d '%s'", rc, sr_last_error());
    return sr_errorf(-ERANGE, "Another expected error");
}

static int scenario_with_error(int rank, int world)
{
    (void)world;
    sr_future *f, *g;
    WCHECK(sr_rpc_async(dst_of(rank), "raise", SR_NOARGS, 0, &f) == 0, "rpc_async: %s", sr_last_error());
    WCHECK(sr_future_then(f, rethrow, NULL, &g) == 0, "then: %s", sr_last_error());
    int rc = sr_future_wait(g, NULL);
    sr_future_unref(f);
    sr_future_unref(g);
    WEXPECT_ERR(rc, -ERANGE, "Another expected error");
    return 0;
}

static void register_raise(void) { sr_register("raise", fn_raise); }

Test(rpc_callbacks, callback_with_error)
{
    RUN_JOB("cb_err", WORLD, .scenario = scenario_with_error, .register_fns = register_raise);
}

/* ---- test_callback_in_rpc: add_use_future_cb / add_use_future_nested_cb ------- */

struct nested_out {
    sr_future *out;
    int to;
    double z;
};

static int set_out(sr_future *parent, void *arg, sr_value **result)
{
    struct nested_out *n = arg;
    /* Our own reference: fn_nested_cb drops its one as soon as it sees out
     * done, and n (on its stack) goes with it. */
    sr_future *out = sr_future_ref(n->out);
    double x;
    int rc = parent_num(parent, &x);
    sr_value *v = rc ? NULL : sr_double(x);
    if (rc)
        sr_future_set_error(out, rc, "%s", sr_last_error());
    else
        sr_future_set_result(out, v);
    sr_future_unref(out);
    sr_value_unref(v);
    *result = sr_none();
    return 0;
}

/* callback(fut1): rpc_async(to, add, fut1.wait(), z).then(out.set_result) */
static int nested_cb(sr_future *parent, void *arg, sr_value **result)
{
    struct nested_out *n = arg;
    double x;
    sr_future *f2 = NULL, *g = NULL;
    int rc = parent_num(parent, &x);
    if (!rc)
        rc = add_async(n->to, x, n->z, &f2);
    if (!rc)
        rc = sr_future_then(f2, set_out, n, &g);
    if (rc)
        sr_future_set_error(n->out, rc, "%s", sr_last_error());
    sr_future_unref(f2);
    sr_future_unref(g);
    *result = sr_none();
    return 0;
}

/* add_use_future_nested_cb(to, x, y, z), run by an executor of dst1. */
static int fn_nested_cb(sr_call *c)
{
    struct nested_out n = {.out = sr_future_new(), .to = (int)sr_value_int(sr_call_arg(c, 0)),
                           .z = num(sr_call_arg(c, 3))};
    sr_future *f1 = NULL, *g = NULL;
    double v = 0;
    int rc = add_async(n.to, num(sr_call_arg(c, 1)), num(sr_call_arg(c, 2)), &f1);
    if (!rc)
        rc = sr_future_then(f1, nested_cb, &n, &g);
    if (!rc)
        rc = wait_num(n.out, &v);
    sr_future_unref(f1);
    sr_future_unref(g);
    sr_future_unref(n.out);
    if (rc)
        return sr_call_fail(c, rc, "%s", sr_last_error());
    return sr_call_return(c, sr_double(v));
}

static int scenario_in_rpc(int rank, int world)
{
    (void)world;
    sr_value *to = sr_int((rank + 2) % WORLD), *x = sr_double(1), *y = sr_double(1), *z = sr_double(2), *v = NULL;
    int rc = sr_rpc_sync(dst_of(rank), "nested_cb", SR_ARGS(to, x, y, z), 0, &v);
    double got = rc ? 0 : num(v);
    sr_value_unref(to), sr_value_unref(x), sr_value_unref(y), sr_value_unref(z), sr_value_unref(v);
    WCHECK(rc == 0 && got == 4, "rank %d: add_use_future_nested_cb gave %d %g: %s", rank, rc, got, sr_last_error());
    return 0;
}

static void register_nested_cb(void) { sr_register("nested_cb", fn_nested_cb); }

Test(rpc_callbacks, callback_in_rpc)
{
    RUN_JOB("cb_in_rpc", WORLD, .scenario = scenario_in_rpc, .register_fns = register_nested_cb);
}

/* ---- a callback on the progress thread waits for a future another thread
 * completes (no message arrives for it: the completer must wake the poller) */

static sem_t go_sem;
static sr_future *other;

static void *completer(void *p)
{
    (void)p;
    sem_wait(&go_sem);
    sr_value *v = sr_double(41);
    sr_future_set_result(other, v);
    sr_value_unref(v);
    return NULL;
}

static int wait_other(sr_future *parent, void *arg, sr_value **result)
{
    (void)parent, (void)arg;
    double x = 0;
    sem_post(&go_sem);
    int rc = wait_num(other, &x);
    if (!rc)
        *result = sr_double(x + 1);
    return rc;
}

static int scenario_wait_other(int rank, int world)
{
    (void)world;
    sem_init(&done_sem, 0, 0);
    sem_init(&go_sem, 0, 0);
    other = sr_future_new();
    pthread_t t;
    WCHECK(pthread_create(&t, NULL, completer, NULL) == 0, "pthread_create");
    sr_future *f0, *f3;
    WCHECK(add_async(dst_of(rank), 1, 1, &f0) == 0, "rpc_async: %s", sr_last_error());
    WCHECK(sr_future_then(f0, wait_other, NULL, &f3) == 0, "then: %s", sr_last_error());
    WCHECK(sr_future_add_done_callback(f3, post_done, NULL) == 0, "add_done_callback: %s", sr_last_error());
    sem_wait_or_die(&done_sem, rank, "a callback waiting for a future set by another thread");
    pthread_join(t, NULL);
    sr_future_unref(f0);
    sr_future_unref(f3);
    sr_future_unref(other);
    WCHECK(done_rc == 0 && done_val == 42, "rank %d: got %d %g", rank, done_rc, done_val);
    sem_destroy(&done_sem);
    sem_destroy(&go_sem);
    return 0;
}

Test(rpc_callbacks, callback_waits_for_a_future_set_by_another_thread)
{
    RUN_JOB("cb_other", WORLD, .scenario = scenario_wait_other);
}
