/* SPDX-License-Identifier: MIT */
/* RRefs when a worker dies and its rank is replaced (sr_spawn's
 * SR_RESTART_RANK; docs/RREF.md, "A dead worker, a replaced rank").
 *
 * Three workers: rank 0 drives, rank 1 is the victim (killed by SIGKILL
 * inside a call, replaced by generation 1, which says "hello" to rank 0),
 * rank 2 a survivor. Every job ends with a graceful shutdown whose RRef
 * leak check is on. Also run under the reordering seeds (meson.build).
 *
 * Workers are forked copies of this test process: no Criterion call in them.
 */
#include <criterion/criterion.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "error.h"
#include "rref_internal.h" /* sr__rref_test_before_send */
#include "helpers/replace_events.h"
#include "rpc_harness.h"
#include "shmrpc/rpc.h"
#include "shmrpc/rref.h"
#include "shmrpc/spawn.h"

LEAK_CHECKED_SUITE(rref_death);

#define WAIT_S 20
#define WORLD 3
/* "At once": far below WAIT_S, the bound a use that waited would hit. */
#define PROMPT_MS 5000

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* ---- functions every rank registers ---- */
static sr_rref *kept, *kept2; /* this process's RRefs kept between calls */

static int fn_ident(sr_call *c) { return sr_call_return(c, sr_value_ref(sr_call_arg(c, 0))); }

static int fn_die(sr_call *c)
{
    (void)c;
    raise(SIGKILL);
    return 0;
}

/* Keep argument 0 and wait until its owner confirmed it (a stable point). */
static int fn_keep(sr_call *c)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    sr_future *f = NULL;
    if (!r || sr_rref_confirmation(r, &f))
        return sr_call_fail(c, -EINVAL, "keep: no RRef: %s", sr_last_error());
    int rc = sr_future_wait(f, NULL);
    sr_future_unref(f);
    if (rc)
        return sr_call_fail(c, rc, "keep: not confirmed: %s", sr_last_error());
    kept = sr_rref_ref(r);
    return sr_call_return(c, NULL);
}

/* to_here on the kept RRef: [rc, ms it took, the error text]. */
static int fn_try_kept(sr_call *c)
{
    sr_value *v = NULL;
    int64_t t0 = now_ms();
    int rc = sr_rref_to_here(kept, WAIT_S, &v);
    sr_value *items[3] = {sr_int(rc), sr_int(now_ms() - t0), sr_str(rc ? sr_last_error() : "")};
    sr_value_unref(v);
    sr_value *l = sr_list(3, items);
    for (int i = 0; i < 3; i++)
        sr_value_unref(items[i]);
    return sr_call_return(c, l);
}

static int fn_drop_kept(sr_call *c)
{
    sr_rref_unref(kept);
    sr_rref_unref(kept2);
    kept = kept2 = NULL;
    int rc = sr_rref_wait_idle(WAIT_S); /* its deletes applied (or, to a lost owner, never sent) */
    if (rc == -EPIPE) /* once, if a death released a hold on a child (sr_rref_wait_idle) */
        rc = sr_rref_wait_idle(WAIT_S);
    return rc ? sr_call_fail(c, rc, "drop_kept: %s", sr_last_error()) : sr_call_return(c, NULL);
}

/* [owner RRefs, live forks] of this worker (the owner's tables). */
static int fn_info(sr_call *c)
{
    sr_rref_debug_info d;
    if (sr_rref_debug_info_get(&d))
        return sr_call_fail(c, -EINVAL, "info: %s", sr_last_error());
    sr_value *items[2] = {sr_int((int64_t)d.num_owner_rrefs), sr_int((int64_t)d.num_forks)};
    sr_value *l = sr_list(2, items);
    sr_value_unref(items[0]);
    sr_value_unref(items[1]);
    return sr_call_return(c, l);
}

/* rank 2: an RRef it creates and owns, returned (forked) to the caller. */
static int fn_make_owned(sr_call *c)
{
    sr_rref *r = NULL;
    sr_value *v = sr_int(6);
    int rc = sr_rref_create(v, &r);
    sr_value_unref(v);
    if (rc)
        return sr_call_fail(c, rc, "make_owned: %s", sr_last_error());
    sr_value *out = sr_value_from_rref(r);
    sr_rref_unref(r);
    return sr_call_return(c, out);
}

/* The victim (test b): hold an RRef owned by rank 2 made by remote(), fork it
 * onwards to rank 0 (which keeps it), and hold one that rank 2 created. */
static int fn_hold_survivors(sr_call *c)
{
    sr_value *five = sr_int(5), *v = NULL;
    int rc = sr_remote(2, "ident", SR_ARGS(five), WAIT_S, &kept);
    sr_value_unref(five);
    if (!rc)
        rc = sr_rref_to_here(kept, WAIT_S, &v); /* confirmed */
    sr_value_unref(v);
    sr_value *rv = rc ? NULL : sr_value_from_rref(kept);
    if (!rc)
        rc = sr_rpc_sync(0, "keep", SR_ARGS(rv), WAIT_S, NULL);
    sr_value_unref(rv);
    v = NULL;
    if (!rc)
        rc = sr_rpc_sync(2, "make_owned", SR_NOARGS, WAIT_S, &v);
    if (!rc)
        kept2 = sr_rref_ref(sr_value_rref(v));
    sr_value_unref(v);
    return rc ? sr_call_fail(c, rc, "hold_survivors: %s", sr_last_error()) : sr_call_return(c, NULL);
}

/* The id of an RRef this process creates now. */
static int fn_new_id(sr_call *c)
{
    sr_rref *r = NULL;
    sr_value *v = sr_int(0);
    int rc = sr_rref_create(v, &r);
    sr_value_unref(v);
    if (rc)
        return sr_call_fail(c, rc, "new_id: %s", sr_last_error());
    uint64_t id = sr_rref_id(r);
    sr_rref_unref(r);
    return sr_call_return(c, sr_int((int64_t)id));
}

static struct replace_freeze *fz; /* (c)'s: shared by the job's processes, made before sr_spawn */

/* Stop this process (rank 1): its answers cannot come until it is killed. */
static int fn_freeze(sr_call *c)
{
    replace_freeze_self(fz);
    return sr_call_return(c, NULL); /* never: it is killed while stopped */
}

/* Keep argument 0 without waiting for its owner. */
static int fn_hold(sr_call *c)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    if (!r)
        return sr_call_fail(c, -EINVAL, "hold: no RRef");
    kept = sr_rref_ref(r);
    return sr_call_return(c, NULL);
}

/* (d)'s events, in a page shared by the job's processes (made before
 * sr_spawn): each a word set once, with a futex wake, and waited for with
 * a bound. */
struct stale_view {
    _Atomic uint32_t armed; /* rank 0: the callback that holds its polling thread is registered */
    _Atomic uint32_t held;  /* rank 0: its polling thread is inside that callback */
    _Atomic uint32_t up;    /* rank 1 generation 1: its sr_init returned (its return is published) */
    _Atomic uint32_t go;    /* rank 0: the callback may return */
};
static struct stale_view *sv;

static void flag_set(_Atomic uint32_t *w)
{
    atomic_store_explicit(w, 1, memory_order_release); /* release: pairs with flag_wait's acquire */
    syscall(SYS_futex, w, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0); /* shared: the page crosses processes */
}

/* 0 once *w is set; -ETIMEDOUT after WAIT_S. */
static int flag_wait(_Atomic uint32_t *w)
{
    int64_t end = now_ms() + WAIT_S * 1000;
    while (!atomic_load_explicit(w, memory_order_acquire)) { /* acquire: pairs with flag_set */
        int64_t ms = end - now_ms();
        if (ms <= 0)
            return -ETIMEDOUT;
        struct timespec left = {ms / 1000, ms % 1000 * 1000000};
        syscall(SYS_futex, w, FUTEX_WAIT, 0, &left, NULL, 0);
    }
    return 0;
}

/* rank 2: answer once rank 0 registered its callback on this call. */
static int fn_gate(sr_call *c)
{
    int rc = flag_wait(&sv->armed);
    return rc ? sr_call_fail(c, rc, "gate: rank 0 never armed its callback") : sr_call_return(c, NULL);
}

static void register_fns(void)
{
    sr_register("gate", fn_gate);
    sr_register("freeze", fn_freeze);
    sr_register("hold", fn_hold);
    sr_register("hello", replace_fn_hello);
    sr_register("ident", fn_ident);
    sr_register("die", fn_die);
    sr_register("keep", fn_keep);
    sr_register("try_kept", fn_try_kept);
    sr_register("drop_kept", fn_drop_kept);
    sr_register("info", fn_info);
    sr_register("make_owned", fn_make_owned);
    sr_register("hold_survivors", fn_hold_survivors);
    sr_register("new_id", fn_new_id);
}

/* (e)'s events, in a page shared by the job's processes (made before
 * sr_spawn), set once each with flag_set. */
struct late_fork {
    _Atomic uint32_t decided; /* rank 2: its FORK_REQUEST to rank 1 is decided, held before the send */
    _Atomic uint32_t back;    /* rank 0: rank 1's replacement said hello */
    _Atomic uint32_t sent;    /* rank 2: the hook returned; the request goes now */
    _Atomic int32_t err;      /* rank 2: what the hook's waits gave, before `sent` */
    _Atomic uint32_t fired;   /* rank 2: the hook held a request (once) */
};
static struct late_fork *lf;

/* rank 2 (sr__rref_test_before_send): hold its first FORK_REQUEST to rank
 * 1 until rank 1 died, was replaced and rank 2 handled both, so that the
 * send happens when rank 1's generation as rank 2 knows it is 1. */
static void late_fork_hook(int to, enum sr_rref_ctrl kind)
{
    if (to != 1 || kind != SR_RREF_FORK_REQUEST || atomic_exchange(&lf->fired, 1))
        return;
    flag_set(&lf->decided);
    int rc = flag_wait(&lf->back);
    if (!rc)
        rc = sr_wait_for_worker(1, WAIT_S); /* its death and return handled here */
    if (!rc && sr_worker_generation(1) != 1)
        rc = -ESTALE;
    atomic_store_explicit(&lf->err, rc, memory_order_relaxed); /* relaxed: published by flag_set */
    flag_set(&lf->sent);
}

/* ---- checks ---- */

/* A use failed at once with -SR_EOWNERLOST naming rank 1's generation 0. */
static int lost_ok(const char *who, int rc, int64_t ms, const char *text)
{
    WCHECK(rc == -SR_EOWNERLOST && strstr(text, "worker1 (rank 1, generation 0)") && strstr(text, "SIGKILL"),
           "%s: to_here gave %d (want -SR_EOWNERLOST naming worker1, rank 1, generation 0, SIGKILL): %s", who, rc,
           text);
    WCHECK(ms < PROMPT_MS, "%s: the failing to_here took %lld ms", who, (long long)ms);
    return 0;
}

static int driver_try(sr_rref *r, const char *who)
{
    sr_value *v = NULL;
    int64_t t0 = now_ms();
    int rc = sr_rref_to_here(r, WAIT_S, &v);
    sr_value_unref(v);
    return lost_ok(who, rc, now_ms() - t0, rc ? sr_last_error() : "");
}

static int remote_try(int rank, const char *who)
{
    sr_value *v = NULL;
    WCHECK(sr_rpc_sync(rank, "try_kept", SR_NOARGS, WAIT_S, &v) == 0, "%s: try_kept: %s", who, sr_last_error());
    int rc = lost_ok(who, (int)sr_value_int(sr_value_list_at(v, 0)), sr_value_int(sr_value_list_at(v, 1)),
                     sr_value_str(sr_value_list_at(v, 2)));
    sr_value_unref(v);
    return rc;
}

static int info(int rank, int64_t *owners, int64_t *forks)
{
    sr_value *v = NULL;
    WCHECK(sr_rpc_sync(rank, "info", SR_NOARGS, WAIT_S, &v) == 0, "info: %s", sr_last_error());
    *owners = sr_value_int(sr_value_list_at(v, 0));
    *forks = sr_value_int(sr_value_list_at(v, 1));
    sr_value_unref(v);
    return 0;
}

static int kill_victim(void)
{
    int rc = sr_rpc_sync(1, "die", SR_NOARGS, WAIT_S, NULL);
    WCHECK(rc == -EPIPE && strstr(sr_last_error(), "(generation 0) was killed by signal SIGKILL"),
           "the call rank 1 died in: %d '%s'", rc, sr_last_error());
    return 0;
}

/* *out: an RRef owned by the victim (rank 1) holding `value`, confirmed by
 * a to_here. */
static int victim_owned(int value, sr_rref **out)
{
    sr_value *arg = sr_int(value), *v = NULL;
    int rc = sr_remote(1, "ident", SR_ARGS(arg), WAIT_S, out);
    sr_value_unref(arg);
    WCHECK(rc == 0, "remote: %s", sr_last_error());
    rc = sr_rref_to_here(*out, WAIT_S, &v);
    int64_t got = rc ? -1 : sr_value_int(v);
    sr_value_unref(v);
    WCHECK(rc == 0 && got == value, "to_here before: %d (%lld): %s", rc, (long long)got, sr_last_error());
    return 0;
}

/* (a) An RRef owned by the victim, held by rank 0 and rank 2: after the
 * kill every to_here fails at once with -SR_EOWNERLOST naming the owner,
 * also once the replacement is there (which never had the value); a fresh
 * remote() to the replacement works; the handles' deletes go nowhere. */
static int driver_owner_dies(void)
{
    sr_value *seven = NULL, *v = NULL;
    sr_rref *r = NULL;
    if (victim_owned(7, &r))
        return 1;
    sr_value *rv = sr_value_from_rref(r);
    WCHECK(sr_rpc_sync(2, "keep", SR_ARGS(rv), WAIT_S, NULL) == 0, "keep on rank 2: %s", sr_last_error());
    sr_value_unref(rv);
    if (kill_victim() || driver_try(r, "rank 0 after the kill") || remote_try(2, "rank 2 after the kill"))
        return 1;
    WCHECK(replace_wait_hello(1) == 0, "rank 1's replacement never said hello within %d s", WAIT_S);
    /* the replacement is known now: the old handles must not reach it */
    if (driver_try(r, "rank 0 after the replacement") || remote_try(2, "rank 2 after the replacement"))
        return 1;
    sr_future *f = NULL;
    WCHECK(sr_rref_confirmation(r, &f) == 0, "confirmation: %s", sr_last_error());
    int rc = sr_future_wait(f, NULL);
    sr_future_unref(f);
    WCHECK(rc == -SR_EOWNERLOST, "the confirmation of a lost RRef gave %d: %s", rc, sr_last_error());
    rv = sr_value_from_rref(r);
    rc = sr_rpc_sync(2, "ident", SR_ARGS(rv), WAIT_S, NULL);
    sr_value_unref(rv);
    WCHECK(rc == -SR_EOWNERLOST, "passing a lost RRef on gave %d: %s", rc, sr_last_error());
    /* the replacement's ids are its own: generation 1 in bits 40-47 (docs/RREF.md, "Ids") */
    v = NULL;
    WCHECK(sr_rpc_sync(1, "new_id", SR_NOARGS, WAIT_S, &v) == 0, "new_id: %s", sr_last_error());
    uint64_t id = (uint64_t)sr_value_int(v);
    sr_value_unref(v);
    WCHECK(SR_RREF_ID_RANK(id) == 1 && SR_RREF_ID_LOCAL(id) >> 40 == 1,
           "an id made by rank 1's replacement is %#llx: want rank 1, generation 1 in bits 40-47",
           (unsigned long long)id);
    sr_rref *fresh = NULL;
    seven = sr_int(8);
    WCHECK(sr_remote(1, "ident", SR_ARGS(seven), WAIT_S, &fresh) == 0, "remote after: %s", sr_last_error());
    sr_value_unref(seven);
    v = NULL;
    WCHECK(sr_rref_to_here(fresh, WAIT_S, &v) == 0 && sr_value_int(v) == 8, "to_here of the fresh one: %s",
           sr_last_error());
    sr_value_unref(v);
    sr_rref_unref(fresh);
    sr_rref_unref(r); /* no delete for the lost one: nothing of it is on rank 1 now */
    WCHECK(sr_rpc_sync(2, "drop_kept", SR_NOARGS, WAIT_S, NULL) == 0, "drop_kept: %s", sr_last_error());
    /* -EPIPE once if the death released rank 0's hold on the child it gave
       rank 2 (its CHILD_ACCEPT still on its way: reordering) */
    rc = sr_rref_wait_idle(WAIT_S);
    WCHECK(rc == 0 || (rc == -EPIPE && sr_rref_wait_idle(WAIT_S) == 0), "rank 0 idle: %s", sr_last_error());
    int64_t owners = -1, forks = -1;
    if (info(1, &owners, &forks))
        return 1;
    WCHECK(owners == 0 && forks == 0, "the replacement has %lld owner RRefs and %lld forks, want none",
           (long long)owners, (long long)forks);
    return 0;
}

/* (b) RRefs owned by rank 2 and held by the victim (one made by its
 * remote() and forked onwards to rank 0, one made by rank 2 and returned to
 * it): after the kill, rank 2 drops the victim's forks, frees the RRef that
 * only the victim held, keeps the one rank 0 holds, and the leak check at
 * shutdown is exact. */
static int driver_holder_dies(void)
{
    int64_t owners = -1, forks = -1;
    WCHECK(sr_rpc_sync(1, "hold_survivors", SR_NOARGS, WAIT_S, NULL) == 0, "hold_survivors: %s", sr_last_error());
    if (info(2, &owners, &forks))
        return 1;
    WCHECK(owners == 2 && forks == 3, "rank 2 before the kill: %lld owners, %lld forks, want 2 and 3",
           (long long)owners, (long long)forks);
    if (kill_victim())
        return 1;
    int64_t end = now_ms() + WAIT_S * 1000;
    do { /* rank 2 handles the death on its own polling thread: ask until it did, bounded */
        if (info(2, &owners, &forks))
            return 1;
    } while ((owners != 1 || forks != 1) && now_ms() < end && sched_yield() == 0);
    WCHECK(owners == 1 && forks == 1,
           "rank 2 after the kill: %lld owners, %lld forks, want 1 and 1 (the victim's forks released)",
           (long long)owners, (long long)forks);
    sr_value *v = NULL;
    WCHECK(sr_rref_to_here(kept, WAIT_S, &v) == 0 && sr_value_int(v) == 5, "rank 0's fork after the kill: %s",
           sr_last_error());
    sr_value_unref(v);
    sr_rref_unref(kept);
    kept = NULL;
    WCHECK(sr_rref_wait_idle(WAIT_S) == 0, "rank 0 idle: %s", sr_last_error());
    if (info(2, &owners, &forks))
        return 1;
    WCHECK(owners == 0 && forks == 0, "rank 2 at the end: %lld owners, %lld forks", (long long)owners,
           (long long)forks);
    WCHECK(replace_wait_hello(1) == 0, "rank 1's replacement never said hello within %d s", WAIT_S);
    return 0;
}

/* (c) rank 0 passes an RRef owned by the victim to rank 2 while the victim
 * is stopped, so the child fork waits for an acceptance that cannot come;
 * the victim is killed and replaced. The death releases rank 0's hold on
 * the child (reported once to a caller of sr_rref_wait_idle), and rank 0's
 * graceful shutdown, which waits for its pending children, must not fail
 * for a death the job went on after. */
static int driver_child_lost(void)
{
    sr_rref *r = NULL;
    if (victim_owned(7, &r))
        return 1;
    sr_future *f = NULL;
    WCHECK(sr_rpc_async(1, "freeze", SR_NOARGS, WAIT_S, &f) == 0, "freeze: %s", sr_last_error());
    WCHECK(replace_wait_stopped(fz) == 0, "rank 1 did not stop within %d s", WAIT_S);
    sr_value *rv = sr_value_from_rref(r);
    WCHECK(sr_rpc_sync(2, "hold", SR_ARGS(rv), WAIT_S, NULL) == 0, "hold on rank 2: %s", sr_last_error());
    sr_value_unref(rv);
    sr_rref_unref(r); /* the child's parent: held by the pending child now */
    WCHECK(kill(atomic_load_explicit(&fz->pid, memory_order_relaxed), SIGKILL) == 0, "kill: %s", strerror(errno));
    int rc = sr_future_wait(f, NULL);
    sr_future_unref(f);
    WCHECK(rc == -EPIPE, "the freeze call ended with %d: %s", rc, sr_last_error());
    WCHECK(replace_wait_hello(1) == 0, "rank 1's replacement never said hello within %d s", WAIT_S);
    WCHECK(sr_rpc_sync(2, "drop_kept", SR_NOARGS, WAIT_S, NULL) == 0, "drop_kept: %s", sr_last_error());
    return 0; /* no sr_rref_wait_idle here: the graceful shutdown waits for the children */
}

/* (e) The same child, deterministically: rank 2 decides to ask rank 1
 * (generation 0) to register the fork it keeps, and the request goes out
 * only after rank 1 was killed and replaced and rank 2 took the new
 * generation (late_fork_hook). The request is meant for generation 0:
 * generation 1 must ignore it. Stamped with the generation known at the
 * send, generation 1 took it for a fork of an RRef it never had, and its
 * graceful shutdown failed ("Leaking RRef"). */
static int driver_late_fork(void)
{
    sr_rref *r = NULL;
    if (victim_owned(7, &r))
        return 1;
    sr_future *f = NULL, *held = NULL;
    WCHECK(sr_rpc_async(1, "freeze", SR_NOARGS, WAIT_S, &f) == 0, "freeze: %s", sr_last_error());
    WCHECK(replace_wait_stopped(fz) == 0, "rank 1 did not stop within %d s", WAIT_S);
    sr_value *rv = sr_value_from_rref(r);
    /* async: the request may be decided in the call's decode, before its answer */
    WCHECK(sr_rpc_async(2, "hold", SR_ARGS(rv), WAIT_S, &held) == 0, "hold on rank 2: %s", sr_last_error());
    sr_value_unref(rv);
    sr_rref_unref(r);
    WCHECK(flag_wait(&lf->decided) == 0, "rank 2 decided no fork request to rank 1 within %d s", WAIT_S);
    WCHECK(kill(atomic_load_explicit(&fz->pid, memory_order_relaxed), SIGKILL) == 0, "kill: %s", strerror(errno));
    int rc = sr_future_wait(f, NULL);
    sr_future_unref(f);
    WCHECK(rc == -EPIPE, "the freeze call ended with %d: %s", rc, sr_last_error());
    WCHECK(replace_wait_hello(1) == 0, "rank 1's replacement never said hello within %d s", WAIT_S);
    flag_set(&lf->back);
    WCHECK(flag_wait(&lf->sent) == 0, "rank 2's held fork request was not let go within %d s", 2 * WAIT_S);
    int32_t err = atomic_load_explicit(&lf->err, memory_order_relaxed); /* relaxed: after `sent` */
    WCHECK(err == 0, "rank 2 did not take rank 1's generation 1 before the send: %d", err);
    rc = sr_future_wait(held, NULL);
    sr_future_unref(held);
    WCHECK(rc == 0, "hold on rank 2: %d: %s", rc, sr_last_error());
    WCHECK(sr_rpc_sync(2, "drop_kept", SR_NOARGS, WAIT_S, NULL) == 0, "drop_kept: %s", sr_last_error());
    return 0; /* the graceful shutdowns (rank 1's generation 1 too) check for leaks */
}

/* (d) A module call (remote()) to a replaced rank from a worker that has
 * not polled since the replacement: the call itself must take the new
 * generation, not fail with -EPIPE against the old one. Rank 0's polling
 * thread is held inside a call's done callback from before the replacement
 * attaches until remote() returned, and rank 0's own thread makes no other
 * call meanwhile, so nothing but remote() can refresh rank 0's view. */
static pthread_t driver_thread;

static void hold_poller(sr_future *f, void *arg)
{
    (void)f;
    (void)arg;
    if (pthread_equal(pthread_self(), driver_thread))
        return; /* never: the response cannot come before the callback is armed (fn_gate) */
    flag_set(&sv->held);
    (void)flag_wait(&sv->go); /* a bound; the driver sets it even when remote() failed */
}

static int driver_stale_view(void)
{
    driver_thread = pthread_self();
    if (kill_victim())
        return 1;
    /* rank 1 is gone, its replacement not attached yet (it waits for `held`):
     * a call fails at once, named as the function called */
    sr_value *v = NULL, *nine = sr_int(9);
    sr_rref *r = NULL;
    int rc = sr_remote(1, "ident", SR_ARGS(nine), WAIT_S, &r);
    WCHECK(rc == -EPIPE && strstr(sr_last_error(), "worker0: sr_remote: destination rank 1 is gone: worker1 "
                                                   "(generation 0) was killed by signal SIGKILL"),
           "remote() to the dead rank: %d: %s", rc, sr_last_error());
    sr_future *f = NULL;
    WCHECK(sr_rpc_async(2, "gate", SR_NOARGS, WAIT_S, &f) == 0, "gate: %s", sr_last_error());
    WCHECK(sr_future_add_done_callback(f, hold_poller, NULL) == 0, "callback: %s", sr_last_error());
    flag_set(&sv->armed);
    WCHECK(flag_wait(&sv->held) == 0, "rank 0's polling thread never ran the gate's callback within %d s", WAIT_S);
    WCHECK(flag_wait(&sv->up) == 0, "rank 1's replacement did not start within %d s", WAIT_S);
    rc = sr_remote(1, "ident", SR_ARGS(nine), WAIT_S, &r);
    char text[512];
    snprintf(text, sizeof(text), "%s", rc ? sr_last_error() : "");
    flag_set(&sv->go);
    sr_value_unref(nine);
    WCHECK(sr_future_wait(f, NULL) == 0, "gate: %s", sr_last_error());
    sr_future_unref(f);
    WCHECK(rc == 0, "remote() to rank 1's replacement before this worker polled: %d: %s", rc, text);
    WCHECK(sr_rref_to_here(r, WAIT_S, &v) == 0 && sr_value_int(v) == 9, "to_here: %s", sr_last_error());
    sr_value_unref(v);
    sr_rref_unref(r);
    WCHECK(replace_wait_hello(1) == 0, "rank 1's replacement never said hello within %d s", WAIT_S);
    return 0;
}

static int worker(int rank, int world, void *arg)
{
    (void)world;
    int (*driver)(void) = arg;
    register_fns();
    if (rank == 2 && lf) /* (e) */
        sr__rref_test_before_send = late_fork_hook;
    if (rank == 1 && replace_my_gen() > 0 && sv) /* (d): attach only once rank 0 stopped polling */
        WCHECK(flag_wait(&sv->held) == 0, "rank 0's polling thread was not held within %d s", WAIT_S);
    WCHECK(sr_init(NULL) == 0, "rank %d generation %u: sr_init: %s", rank, replace_my_gen(), sr_last_error());
    if (rank == 1 && replace_my_gen() > 0 && sv)
        flag_set(&sv->up);
    if (rank == 1 && replace_my_gen() > 0)
        WCHECK(sr_rpc_sync(0, "hello", SR_NOARGS, WAIT_S, NULL) == 0, "hello: %s", sr_last_error());
    if (rank == 1 && replace_my_gen() == 0) {
        poll(NULL, 0, 3 * WAIT_S * 1000); /* a bound, not a synchronisation: rank 0 has it killed */
        return 99;
    }
    if (rank == 0) {
        int rc = driver();
        if (rc)
            return rc;
    }
    int sd = sr_shutdown(true, 3 * WAIT_S); /* the leak check is on */
    WCHECK(sd == 0, "rank %d generation %u: graceful shutdown: %s", rank, replace_my_gen(), sr_last_error());
    return 0;
}

static int spawn(const char *name, int (*driver)(void))
{
    sr_spawn_opts o = {.name_prefix = test_ns(name), .shm_size = WORLD * (64u << 20), .restart = SR_RESTART_RANK,
                       .max_restarts = 1};
    return sr_spawn(WORLD, worker, (void *)driver, &o);
}

/* The job of one test (in the test's process): it must end well. */
static void run_death_job(const char *name, int (*driver)(void))
{
    int rc = spawn(name, driver);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
}

Test(rref_death, an_owner_dies_its_rrefs_fail_at_once_and_its_replacement_is_fresh, .timeout = 120)
{
    run_death_job("rrefdeath_a", driver_owner_dies);
}

Test(rref_death, a_child_lost_with_its_owner_does_not_fail_the_shutdown, .timeout = 120)
{
    fz = shared_page(sizeof(*fz));
    run_death_job("rdchild", driver_child_lost);
}

Test(rref_death, a_fork_request_decided_before_its_owner_died_is_ignored_by_its_replacement, .timeout = 120)
{
    fz = shared_page(sizeof(*fz));
    lf = shared_page(sizeof(*lf));
    run_death_job("rdlate", driver_late_fork);
}

Test(rref_death, a_holder_dies_its_forks_are_released_on_the_owner, .timeout = 120)
{
    run_death_job("rrefdeath_b", driver_holder_dies);
}

Test(rref_death, a_remote_to_a_replaced_rank_takes_its_new_generation_without_a_poll, .timeout = 120)
{
    sv = shared_page(sizeof(*sv));
    run_death_job("rrefdeath_d", driver_stale_view);
}
