/* SPDX-License-Identifier: MIT */
/* Elastic jobs (sr_spawn's max_workers; segment.h, "Elastic jobs"): free
 * ranks, and workers that leave with sr_shutdown while the others go on.
 *
 * Three workers launched in room for four: rank 3 is free.
 *   - rank 0 sees world size 4, rank 3 absent: a call to it fails at once
 *     naming it ("is free"), its name is unknown, a wait for its departure
 *     returns at once;
 *   - rank 0 holds a UserRRef owned by rank 1 and a distributed-autograd
 *     context that reached rank 1, and has a call running on rank 1 that
 *     blocks; rank 1 then leaves (sr_shutdown(true)): while it is leaving a
 *     new call to it fails at once naming it, and the blocked call, once
 *     released, is answered, and the calls rank 1 sent without waiting
 *     just before it left have all run (a leaver finishes its own work);
 *   - once rank 1 has left: the RRef fails with -SR_EOWNERLOST naming it,
 *     the context's backward pass fails naming it, a call fails at once
 *     ("left the job"); a new context with rank 2 works;
 *   - rank 0 leaves too (nothing depends on rank 0 staying); rank 2, the
 *     last, sees it go and leaves; the job ends with every worker at 0.
 * Every wait is on an event (a futex word in a shared page, a call's
 * answer, sr_wait_for_departure) or a bounded poll paced by calls'
 * answers, each with a bound.
 *
 * Workers are forked copies of this test process: no Criterion call in them.
 */
#include <criterion/criterion.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "error.h"
#include "rpc_harness.h"
#include "shmrpc/dist_autograd.h"
#include "shmrpc/rpc.h"
#include "shmrpc/rref.h"
#include "shmrpc/spawn.h"
#include "shmrpc/tensor.h"

LEAK_CHECKED_SUITE(elastic);

#define WAIT_S 20
#define LAUNCHED 3
#define ROOM 4
#define NOTES 64

struct shared {
    _Atomic uint32_t go_leave;  /* rank 1 leaves once it reads 1 */
    _Atomic uint32_t unblock;   /* rank 1's blocked call returns once it reads 1 */
    _Atomic uint32_t blocked;   /* rank 1's call is running */
    _Atomic uint32_t notes;     /* rank 0 ran rank 1's fire-and-forget calls ("note") */
    _Atomic uint32_t started;   /* every_worker_leaves_at_once: notes whose call started */
};
static struct shared *sh;

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Until *w != 0 (another process's release store and wake); bounded. */
static int wait_word(_Atomic uint32_t *w)
{
    int64_t end = now_ns() + (int64_t)WAIT_S * 1000000000;
    while (!atomic_load_explicit(w, memory_order_acquire)) { /* acquire: pairs with set_word */
        int64_t ns = end - now_ns();
        if (ns <= 0)
            return -ETIMEDOUT;
        struct timespec left = {ns / 1000000000, ns % 1000000000};
        syscall(SYS_futex, w, FUTEX_WAIT, 0, &left, NULL, 0);
    }
    return 0;
}

static void set_word(_Atomic uint32_t *w)
{
    atomic_store_explicit(w, 1, memory_order_release); /* release: pairs with wait_word */
    syscall(SYS_futex, w, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* ---- functions every rank registers ---- */
static sr_tensor *ones(bool rg) { return sr_full(SR_F64, 2, (const int64_t[]){2, 2}, 1.0, rg ? SR_REQUIRES_GRAD : 0); }

static int fn_add(sr_call *c)
{
    sr_tensor *s = sr_add(sr_value_tensor(sr_call_arg(c, 0)), sr_value_tensor(sr_call_arg(c, 1)));
    if (!s)
        return sr_call_fail(c, -EINVAL, "add: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(s);
    sr_tensor_unref(s);
    return sr_call_return(c, v);
}

static int fn_seven(sr_call *c) { return sr_call_return(c, sr_int(7)); }

static int fn_note(sr_call *c)
{
    atomic_fetch_add_explicit(&sh->notes, 1, memory_order_relaxed); /* relaxed: read after rank 1 left */
    return sr_call_return(c, NULL);
}

/* rank 1, as it leaves: calls nobody waits for, sent just before its leave
 * (which must see them processed: segment.h, E2) */
static int send_notes(int n)
{
    for (int i = 0; i < n; i++) {
        sr_future *f = NULL;
        WCHECK(sr_rpc_async(0, "note", SR_ARGS(), WAIT_S, &f) == 0, "note: %s", sr_last_error());
        sr_future_unref(f);
    }
    return 0;
}

static int fn_block(sr_call *c)
{
    set_word(&sh->blocked);
    int rc = wait_word(&sh->unblock);
    return rc ? sr_call_fail(c, rc, "block: never released") : sr_call_return(c, sr_int(11));
}

static void register_fns(void)
{
    sr_register("add", fn_add);
    sr_register("seven", fn_seven);
    sr_register("block", fn_block);
    sr_register("note", fn_note);
}

/* sum(add(a, a)) on `to`, in the current context; NULL with the error. */
static sr_tensor *remote_sum(int to, sr_tensor *a)
{
    sr_value *va = sr_value_from_tensor(a), *r = NULL;
    int rc = sr_rpc_sync(to, "add", SR_ARGS(va, va), WAIT_S, &r);
    sr_value_unref(va);
    sr_tensor *t = rc ? NULL : sr_value_tensor(r), *s = t ? sr_sum(t) : NULL;
    sr_value_unref(r);
    return s;
}

/* Until a call to rank r fails because r is leaving: a poll paced by the
 * answers of the calls made before (they succeed until then); bounded. */
static int wait_leaving(int r)
{
    int64_t end = now_ns() + (int64_t)WAIT_S * 1000000000;
    for (;;) {
        int rc = sr_rpc_sync(r, "seven", SR_ARGS(), WAIT_S, NULL);
        if (rc == -EPIPE && strstr(sr_last_error(), "is leaving the job"))
            return 0;
        if ((rc && rc != -EPIPE) || now_ns() > end)
            return rc ? rc : -ETIMEDOUT;
    }
}

/* ---- the driver ---- */
static int free_rank(void)
{
    WCHECK(sr_world_size() == ROOM, "world size %d", sr_world_size());
    WCHECK(sr_worker_present(0) == 1 && sr_worker_present(2) == 1 && sr_worker_present(3) == 0 &&
               sr_worker_present(ROOM) == -EINVAL, "present: %d %d %d", sr_worker_present(0), sr_worker_present(2),
           sr_worker_present(3));
    int rc = sr_rpc_sync(3, "seven", SR_ARGS(), WAIT_S, NULL);
    WCHECK(rc == -EPIPE && strstr(sr_last_error(), "rank 3") && strstr(sr_last_error(), "is free"),
           "a call to the free rank: %d '%s'", rc, sr_last_error());
    WCHECK(sr_worker_rank("worker3") == -EINVAL, "the free rank's name is known: %s", sr_last_error());
    WCHECK(!strcmp(sr_worker_name(3), "worker3"), "the free rank's name for messages: %s", sr_worker_name(3));
    WCHECK(sr_wait_for_departure(3, WAIT_S) == 0, "departure of the free rank: %s", sr_last_error());
    WCHECK(sr_worker_rank("worker1") == 1 && !strcmp(sr_worker_name(1), "worker1"), "rank 1's name: %s",
           sr_last_error());
    return 0;
}

static int leave_of_rank1(void)
{
    sr_rref *rref = NULL;
    sr_value *v = NULL;
    WCHECK(sr_remote(1, "seven", SR_ARGS(), WAIT_S, &rref) == 0, "remote: %s", sr_last_error());
    WCHECK(sr_rref_to_here(rref, WAIT_S, &v) == 0 && sr_value_int(v) == 7, "to_here: %s", sr_last_error());
    sr_value_unref(v);
    int64_t ctx;
    sr_tensor *t = ones(true), *s = NULL;
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "context_begin: %s", sr_last_error());
    s = remote_sum(1, t);
    WCHECK(s, "the forward pass through rank 1: %s", sr_last_error());
    sr_future *blocked = NULL;
    WCHECK(sr_rpc_async(1, "block", SR_ARGS(), WAIT_S, &blocked) == 0, "block: %s", sr_last_error());
    WCHECK(wait_word(&sh->blocked) == 0, "rank 1 never ran the blocking call");
    set_word(&sh->go_leave);
    WCHECK(wait_leaving(1) == 0, "rank 1 never said it was leaving: %s", sr_last_error());
    int rc = sr_rpc_sync(1, "seven", SR_ARGS(), WAIT_S, NULL);
    WCHECK(rc == -EPIPE && strstr(sr_last_error(), "worker1 (rank 1) is leaving the job"),
           "a call to the leaving rank: %d '%s'", rc, sr_last_error());
    set_word(&sh->unblock);
    WCHECK(sr_future_wait(blocked, &v) == 0 && sr_value_int(v) == 11, "the call the leaver finished: %s",
           sr_last_error());
    sr_value_unref(v);
    sr_future_unref(blocked);
    WCHECK(sr_wait_for_departure(1, WAIT_S) == 0, "rank 1 never left: %s", sr_last_error());
    WCHECK(sr_worker_present(1) == 0, "rank 1 still present");
    /* relaxed: the notes ran before rank 1's leave ended, which this worker saw */
    WCHECK(atomic_load_explicit(&sh->notes, memory_order_relaxed) == NOTES, "rank 1's notes before it left: %u of %d",
           atomic_load_explicit(&sh->notes, memory_order_relaxed), NOTES);
    rc = sr_rref_to_here(rref, WAIT_S, &v);
    WCHECK(rc == -SR_EOWNERLOST && strstr(sr_last_error(), "worker1") && strstr(sr_last_error(), "left the job"),
           "the RRef rank 1 owned: %d '%s'", rc, sr_last_error());
    sr_rref_unref(rref);
    rc = sr_dist_autograd_backward(ctx, &s, 1, false);
    WCHECK(rc == -EPIPE && strstr(sr_last_error(), "recorded RPCs with a worker that is gone since: worker1 "
                                                    "(generation 0) left the job"),
           "the pass in the context rank 1 was in: %d '%s'", rc, sr_last_error());
    sr_tensor_unref(s);
    sr_dist_autograd_context_end(ctx); /* it may be gone already: failed by the departure */
    rc = sr_rpc_sync(1, "seven", SR_ARGS(), WAIT_S, NULL);
    WCHECK(rc == -EPIPE && strstr(sr_last_error(), "left the job"), "a call to the rank that left: %d '%s'", rc,
           sr_last_error());
    WCHECK(sr_worker_rank("worker1") == -EINVAL, "the name of the rank that left is known");
    /* a new context with the workers present works */
    WCHECK(sr_dist_autograd_context_begin(&ctx) == 0, "context_begin: %s", sr_last_error());
    s = remote_sum(2, t);
    WCHECK(s && sr_dist_autograd_backward(ctx, &s, 1, false) == 0, "a pass with rank 2: %s", sr_last_error());
    sr_tensor *g = NULL;
    WCHECK(sr_dist_autograd_get_gradient(ctx, t, &g) == 0 && ((const double *)sr_tensor_data(g))[0] == 2.0,
           "the gradient with rank 2: %s", sr_last_error());
    sr_tensor_unref(g);
    sr_tensor_unref(s);
    sr_tensor_unref(t);
    WCHECK(sr_dist_autograd_context_end(ctx) == 0, "context_end: %s", sr_last_error());
    return 0;
}

static int worker(int rank, int world, void *arg)
{
    (void)arg;
    WCHECK(world == ROOM, "fn's world size %d", world);
    register_fns();
    WCHECK(sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    if (rank == 0) {
        int rc = free_rank();
        if (!rc)
            rc = leave_of_rank1();
        if (rc)
            return rc;
    } else if (rank == 1) {
        WCHECK(wait_word(&sh->go_leave) == 0, "rank 1 was never told to leave");
        if (send_notes(NOTES))
            return 1;
    } else {
        /* the last one: rank 0 leaves before it (it serves meanwhile) */
        WCHECK(sr_wait_for_departure(0, 3 * WAIT_S) == 0, "rank 0 never left: %s", sr_last_error());
        int rc = sr_rpc_sync(0, "seven", SR_ARGS(), WAIT_S, NULL);
        WCHECK(rc == -EPIPE && strstr(sr_last_error(), "worker0") && strstr(sr_last_error(), "left the job"),
               "a call to rank 0 after it left: %d '%s'", rc, sr_last_error());
    }
    int rc = sr_shutdown(true, 3 * WAIT_S);
    WCHECK(rc == 0, "rank %d: leave: %d: %s", rank, rc, sr_last_error());
    return 0;
}

Test(elastic, free_ranks_and_leaves_with_rrefs_and_contexts, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    sr_spawn_opts o = {.name_prefix = test_ns("elastic1"), .shm_size = ROOM * (64u << 20), .max_workers = ROOM};
    int rc = sr_spawn(LAUNCHED, worker, NULL, &o);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
}

/* A job that is not elastic keeps the collective shutdown (every other
 * suite); max_workers below the world size is refused. */
Test(elastic, max_workers_below_the_world_size_is_refused, .timeout = 30)
{
    sr_spawn_opts o = {.name_prefix = test_ns("elastic2"), .max_workers = 1};
    int rc = sr_spawn(2, worker, NULL, &o);
    cr_assert_eq(rc, -EINVAL, "%d: %s", rc, sr_last_error());
    cr_assert(strstr(sr_last_error(), "max_workers 1 is below the world size 2"), "%s", sr_last_error());
}

/* Every worker leaves at once, rank 0 included: each one's rounds ask the
 * others, who answer while leaving themselves; a round that a departure
 * ends early is asked again of those still present. */
static int leave_at_once(int rank, int world, void *arg)
{
    (void)arg;
    register_fns();
    WCHECK(world == ROOM && sr_init(NULL) == 0, "rank %d: sr_init: %s", rank, sr_last_error());
    /* a call nobody waits for to every launched rank first, so that there is
     * something to drain; one to a rank already leaving fails at once */
    for (int r = 0; r < LAUNCHED; r++) {
        sr_future *f = NULL;
        int rc = sr_rpc_async(r, "note", SR_ARGS(), WAIT_S, &f);
        WCHECK(rc == 0 || (rc == -EPIPE && (strstr(sr_last_error(), "is leaving the job") ||
                                            strstr(sr_last_error(), "left the job"))),
               "note to %d: %d %s", r, rc, sr_last_error());
        if (!rc) /* relaxed: read after every worker exited */
            atomic_fetch_add_explicit(&sh->started, 1, memory_order_relaxed);
        sr_future_unref(f);
    }
    int rc = sr_shutdown(true, 3 * WAIT_S);
    WCHECK(rc == 0, "rank %d: leave: %d: %s", rank, rc, sr_last_error());
    return 0;
}

Test(elastic, every_worker_leaves_at_once, .timeout = 120)
{
    sh = shared_page(sizeof(*sh));
    sr_spawn_opts o = {.name_prefix = test_ns("elastic3"), .shm_size = ROOM * (64u << 20), .max_workers = ROOM};
    int rc = sr_spawn(LAUNCHED, leave_at_once, NULL, &o);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
    /* relaxed: the workers have exited */
    uint32_t started = atomic_load_explicit(&sh->started, memory_order_relaxed);
    cr_assert_geq(started, LAUNCHED, "each worker's own note, at least, started");
    cr_assert_eq(atomic_load_explicit(&sh->notes, memory_order_relaxed), started,
                 "every note that started ran before its worker left");
}
