/* SPDX-License-Identifier: MIT */
/* The shared heap across replacements in place (docs/HEAP.md §11): a
 * victim that holds a tensor of the survivor's (a block in the survivor's
 * heap area), an RRef the survivor owns and the value it fetched from it,
 * and whose tensor the survivor holds (a block in the victim's area) is
 * killed and replaced again and again. After each death:
 *   - the survivor's blocks the dead process held are freed (the
 *     supervisor's quarantine drops what the dead listed; the RRef layer
 *     drops the dead's fork, so the OwnerRRef's value goes too): the
 *     survivor's heap is back at its baseline once it drained;
 *   - the dead process's block the survivor holds stays readable until the
 *     survivor drops it, and that unref reclaims the dead area: only the
 *     survivor's and the current victim's areas are ever not FREE;
 *   - the memory the memfd holds does not grow across the replacements.
 * The figures are printed (docs/PERFORMANCE.md).
 *
 * Rank 0 drives and survives, rank 1 is the victim. Every step waits for an
 * event (a call's answer, the replacement's arrival: sr_wait_for_worker),
 * each with a bound.
 * Workers are forked copies of this test process: no Criterion call in them.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "common.h"
#include "error.h"
#include "heap.h"
#include "heap_stamp.h"
#include "helpers/replace_events.h"
#include "rpc_harness.h"
#include "segment.h"
#include "shmrpc/rpc.h"
#include "shmrpc/rref.h"
#include "shmrpc/spawn.h"
#include "shmrpc/tensor.h"

LEAK_CHECKED_SUITE(replace_heap);

#define WAIT_S REPLACE_WAIT_S
#define NREPL 100
#define NUMEL (1 << 14) /* 64 KiB of floats: a block of its own, not an inline value */

/* What rank 0 measured, for the test process to print (shared page). */
struct figures {
    uint64_t heap_base, heap_last;          /* rank 0's sr__heap_allocated after the first and last round */
    uint64_t memfd_first, memfd_max10, memfd_last; /* bytes the memfd holds: round 1, max of rounds 1-10, last */
    uint64_t outside_max, fixed;            /* most of it outside the two live areas; the segment's fixed parts */
    uint32_t areas;                         /* heap areas in the segment */
    uint32_t busy_max;                      /* most areas not FREE after a round */
    double seconds;
};
static struct figures *fig;

/* The second scenario's freeze record (shared page). */
static struct replace_freeze *fz;
static int last_gen = NREPL; /* the victim's generation that shuts down instead of waiting to be killed */

/* ---- the victim's functions ---- */
static sr_tensor *kept; /* the survivor's tensor, held by this generation until it dies */
static sr_rref *kept_rref;   /* an RRef the survivor owns */
static sr_value *kept_value; /* its value, fetched */

static int fn_keep(sr_call *c)
{
    sr_tensor *t = sr_value_tensor(sr_call_arg(c, 0));
    if (!t)
        return sr_call_fail(c, -EINVAL, "keep: not a tensor");
    kept = sr_tensor_ref(t);
    return sr_call_return(c, NULL);
}

static int fn_keep_rref(sr_call *c)
{
    sr_rref *r = sr_value_rref(sr_call_arg(c, 0));
    if (!r)
        return sr_call_fail(c, -EINVAL, "keep_rref: not an RRef");
    kept_rref = sr_rref_ref(r);
    int rc = sr_rref_to_here(kept_rref, WAIT_S, &kept_value);
    if (rc)
        return sr_call_fail(c, rc, "keep_rref: to_here: %s", sr_last_error());
    return sr_call_return(c, NULL);
}

static int fn_make(sr_call *c)
{
    int64_t shape[1] = {NUMEL};
    sr_tensor *t = sr_full(SR_F32, 1, shape, (double)sr_value_int(sr_call_arg(c, 0)), 0);
    if (!t)
        return sr_call_fail(c, -ENOMEM, "no tensor: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(t);
    sr_tensor_unref(t);
    return sr_call_return(c, v);
}

static int fn_freeze(sr_call *c)
{
    replace_freeze_self(fz);
    return sr_call_return(c, NULL); /* never: rank 0 kills it while stopped */
}

static int fn_noop(sr_call *c) { return sr_call_return(c, NULL); }

static int fn_die(sr_call *c)
{
    (void)c;
    raise(SIGKILL);
    return 0;
}

static void register_fns(void)
{
    sr_register("keep", fn_keep);
    sr_register("keep_rref", fn_keep_rref);
    sr_register("make", fn_make);
    sr_register("die", fn_die);
    sr_register("freeze", fn_freeze);
    sr_register("noop", fn_noop);
}

/* ---- the driver ---- */
static bool all_equal(const sr_tensor *t, float want)
{
    const float *p = sr_tensor_data(t);
    for (size_t i = 0; i < sr_tensor_numel(t); i++)
        if (p[i] != want)
            return false;
    return true;
}

/* Bytes of [off, off + len) of the segment the memfd holds (mincore: the
 * pages in its page cache); UINT64_MAX if mincore fails. */
static uint64_t resident(const sr_segment *seg, uint64_t off, uint64_t len)
{
    static unsigned char vec[(64u << 20) / 4096];
    uint64_t n = 0;
    for (uint64_t at = 0; at < len; at += sizeof(vec) * 4096) {
        uint64_t chunk = len - at < sizeof(vec) * 4096 ? len - at : sizeof(vec) * 4096;
        if (mincore((char *)seg->base + off + at, chunk, vec) != 0)
            return UINT64_MAX;
        for (uint64_t i = 0; i < (chunk + 4095) / 4096; i++)
            n += (vec[i] & 1) * 4096u;
    }
    return n;
}

static uint64_t area_bytes(const sr_segment *seg, int a)
{
    return resident(seg, seg->heap_off + (uint64_t)a * seg->heap_stride, seg->heap_stride);
}

static uint32_t areas_busy(const sr_segment *seg)
{
    uint32_t n = 0;
    for (uint32_t a = 0; a < seg->heap_areas; a++) {
        sr_heap_area st;
        n += sr__heap_area_get(seg, (int)a, &st) == 0 && st.state != SR_AREA_FREE;
    }
    return n;
}

/* One generation g of the victim: give it a tensor of ours (it keeps the
 * only reference), take one of its, kill it, wait for generation g + 1. */
static int one_round(unsigned g, sr_tensor **theirs)
{
    int64_t shape[1] = {NUMEL};
    sr_tensor *mine = sr_full(SR_F32, 1, shape, 1000.0 + g, 0);
    WCHECK(mine, "round %u: %s", g, sr_last_error());
    sr_value *arg = sr_value_from_tensor(mine), *v = NULL;
    sr_tensor_unref(mine);
    int rc = sr_rpc_sync(1, "keep", SR_ARGS(arg), WAIT_S, NULL);
    sr_value_unref(arg);
    WCHECK(rc == 0, "round %u: keep: %s", g, sr_last_error());
    /* an RRef of ours whose only fork the victim holds, and whose value it fetched */
    sr_tensor *owned = sr_full(SR_F32, 1, shape, 2000.0 + g, 0);
    WCHECK(owned, "round %u: %s", g, sr_last_error());
    sr_value *ov = sr_value_from_tensor(owned);
    sr_tensor_unref(owned);
    sr_rref *r = NULL;
    rc = sr_rref_create(ov, &r);
    sr_value_unref(ov);
    WCHECK(rc == 0, "round %u: sr_rref_create: %s", g, sr_last_error());
    arg = sr_value_from_rref(r);
    sr_rref_unref(r);
    rc = sr_rpc_sync(1, "keep_rref", SR_ARGS(arg), WAIT_S, NULL);
    sr_value_unref(arg);
    WCHECK(rc == 0, "round %u: keep_rref: %s", g, sr_last_error());
    sr_value *n = sr_int((int64_t)g);
    rc = sr_rpc_sync(1, "make", SR_ARGS(n), WAIT_S, &v);
    sr_value_unref(n);
    WCHECK(rc == 0 && sr_value_tensor(v), "round %u: make: %s", g, sr_last_error());
    *theirs = sr_tensor_ref(sr_value_tensor(v));
    sr_value_unref(v);
    rc = sr_rpc_sync(1, "die", SR_ARGS(), WAIT_S, NULL);
    WCHECK(rc == -EPIPE, "round %u: the call rank 1 died in: %d %s", g, rc, sr_last_error());
    /* the supervisor quarantined the dead area before it started the next
     * generation, and we handled the death before we take that one */
    WCHECK(sr_wait_for_worker(1, WAIT_S) == 0, "round %u: generation %u did not come within %d s: %s", g, g + 1,
           WAIT_S, sr_last_error());
    int64_t now = sr_worker_generation(1);
    WCHECK(now == (int64_t)g + 1, "round %u: rank 1 is generation %" PRId64 " here, want %u", g, now, g + 1);
    /* the new generation takes its heap area after the start barrier: an
     * answer from it says it has */
    WCHECK(sr_rpc_sync(1, "noop", SR_ARGS(), WAIT_S, NULL) == 0, "round %u: generation %u: %s", g, g + 1,
           sr_last_error());
    return 0;
}

static int driver_hundred(void)
{
    struct sr_launch_env env;
    sr_segment seg;
    WCHECK(sr__launch_env_get(&env) == 0 && sr__segment_attach(env.fd, &seg) == 0, "the segment: %s",
           sr_last_error());
    fig->areas = seg.heap_areas;
    fig->fixed = seg.size - (uint64_t)seg.heap_areas * seg.heap_stride; /* header, tables, inboxes */
    /* Rank 1 takes its heap area after the start barrier (xport.c, attach):
     * an answer from it says it has. */
    WCHECK(sr_rpc_sync(1, "noop", SR_ARGS(), WAIT_S, NULL) == 0, "rank 1 before the first round: %s",
           sr_last_error());
    int64_t t0 = replace_now_ns();
    for (unsigned g = 0; g < NREPL; g++) {
        sr_tensor *theirs = NULL;
        int dead = sr__heap_area_find(&seg, 1, g + 1); /* the heap counts generations from 1 */
        WCHECK(dead >= 0, "round %u: %s", g, sr_last_error());
        if (one_round(g, &theirs))
            return 1;
        /* The dead generation's block: still as it made it. Our unref is the
         * last reference to its area: it is reclaimed here. */
        WCHECK(all_equal(theirs, (float)g), "round %u: the dead generation's tensor changed", g);
        sr_tensor_unref(theirs);
        sr__heap_drain(); /* our block the dead held: freed by the supervisor onto our list */
        uint32_t busy = areas_busy(&seg);
        fig->busy_max = busy > fig->busy_max ? busy : fig->busy_max;
        WCHECK(busy == 2, "round %u: %u heap areas are not FREE (ours and the victim's: 2)", g, busy);
        sr_heap_area st;
        WCHECK(sr__heap_area_get(&seg, dead, &st) == 0 && st.state == SR_AREA_FREE && area_bytes(&seg, dead) == 0,
               "round %u: the dead generation's area %d is in state %u and holds %" PRIu64 " bytes", g, dead,
               st.state, area_bytes(&seg, dead));
        int victim = sr__heap_area_find(&seg, 1, g + 2);
        WCHECK(victim >= 0, "round %u: the new generation's area: %s", g, sr_last_error());
        uint64_t bytes = memfd_bytes(seg.fd), used = sr__heap_allocated();
        uint64_t live = area_bytes(&seg, sr__heap_area_find(&seg, 0, 1)) + area_bytes(&seg, victim);
        if (g == 0)
            fig->heap_base = used, fig->memfd_first = bytes;
        if (g < 10)
            fig->memfd_max10 = bytes > fig->memfd_max10 ? bytes : fig->memfd_max10;
        WCHECK(used == fig->heap_base, "round %u: rank 0's heap holds %" PRIu64 " bytes, %" PRIu64 " after the first",
               g, used, fig->heap_base);
        /* nothing but the fixed parts holds memory outside the two live areas
         * (the victim's may still be growing as it starts: measured apart) */
        uint64_t outside = bytes > live ? bytes - live : 0;
        fig->outside_max = outside > fig->outside_max ? outside : fig->outside_max;
        WCHECK(outside <= fig->fixed, "round %u: the memfd holds %" PRIu64 " bytes outside the two live areas, more "
               "than the segment's fixed parts (%" PRIu64 ")", g, outside, fig->fixed);
        fig->heap_last = used, fig->memfd_last = bytes;
    }
    fig->seconds = (double)(replace_now_ns() - t0) / 1e9;
    sr__segment_detach(&seg, false);
    return 0;
}

static int worker(int rank, int world, void *arg)
{
    (void)world;
    int (*driver)(void) = arg;
    register_fns();
    WCHECK(sr_init(NULL) == 0, "rank %d generation %u: sr_init: %s", rank, replace_my_gen(), sr_last_error());
    if (rank == 1) {
        if (replace_my_gen() < (unsigned)last_gen) {
            poll(NULL, 0, 3 * WAIT_S * 1000); /* a bound, not a synchronisation: rank 0's "die" ends us */
            return 99;
        }
    }
    if (rank == 0 && driver())
        return 1;
    int sd = sr_shutdown(true, 3 * WAIT_S);
    WCHECK(sd == 0, "rank %d generation %u: graceful shutdown: %s", rank, replace_my_gen(), sr_last_error());
    return 0;
}

/* 100 replacements: nothing grows (the measurement). */
Test(replace_heap, hundred_replacements_leak_nothing, .timeout = 300)
{
    fig = shared_page(sizeof(*fig));
    sr_spawn_opts o = {.name_prefix = test_ns("replheap"), .shm_size = 2 * (64u << 20), .restart = SR_RESTART_RANK,
                       .max_restarts = NREPL};
    int rc = sr_spawn(2, worker, (void *)driver_hundred, &o);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
    printf("replace_heap: %d replacements in %.2f s; %u heap areas, at most %u not FREE; rank 0's heap %" PRIu64
           " bytes after the first round, %" PRIu64 " after the last; memfd %" PRIu64 " bytes after the first, "
           "at most %" PRIu64 " in the first 10, %" PRIu64 " after the last; outside the two live areas at most "
           "%" PRIu64 " (the fixed parts are %" PRIu64 ")\n",
           NREPL, fig->seconds, fig->areas, fig->busy_max, fig->heap_base, fig->heap_last, fig->memfd_first,
           fig->memfd_max10, fig->memfd_last, fig->outside_max, fig->fixed);
}

/* ---- calls queued for a victim that dies ---- */

#define NQUEUED 8

/* Rank 0: the victim stops itself; calls with tensors of ours fill its
 * 2-slot inbox and wait in our outgoing queue; it is killed. What the
 * queued calls carried is let go when the queue is dropped, what was in its
 * inbox when its successor refuses it: our heap is back where it was. */
static int driver_queued(void)
{
    int64_t shape[1] = {NUMEL};
    WCHECK(sr_rpc_sync(1, "noop", SR_ARGS(), WAIT_S, NULL) == 0, "noop: %s", sr_last_error());
    sr__heap_drain();
    size_t base = sr__heap_allocated();
    sr_future *frozen = NULL, *f[NQUEUED];
    WCHECK(sr_rpc_async(1, "freeze", SR_ARGS(), WAIT_S, &frozen) == 0, "freeze: %s", sr_last_error());
    WCHECK(replace_wait_stopped(fz) == 0, "rank 1 did not stop within %d s", WAIT_S);
    for (int i = 0; i < NQUEUED; i++) {
        sr_tensor *t = sr_full(SR_F32, 1, shape, 3000.0 + i, 0);
        WCHECK(t, "%s", sr_last_error());
        sr_value *v = sr_value_from_tensor(t);
        sr_tensor_unref(t);
        int rc = sr_rpc_async(1, "keep", SR_ARGS(v), WAIT_S, &f[i]);
        sr_value_unref(v);
        WCHECK(rc == 0, "call %d: %s", i, sr_last_error());
    }
    WCHECK(sr__heap_allocated() >= base + NQUEUED * NUMEL * sizeof(float), "the queued calls' tensors are live");
    WCHECK(kill(atomic_load(&fz->pid), SIGKILL) == 0, "kill: %s", strerror(errno));
    for (int i = 0; i < NQUEUED; i++) {
        int rc = sr_future_wait(f[i], NULL);
        WCHECK(rc == -EPIPE, "call %d to the dead victim ended with %d: %s", i, rc, sr_last_error());
        sr_future_unref(f[i]);
    }
    WCHECK(sr_future_wait(frozen, NULL) == -EPIPE, "the freeze call: %s", sr_last_error());
    sr_future_unref(frozen);
    WCHECK(sr_wait_for_worker(1, WAIT_S) == 0, "generation 1 did not come within %d s: %s", WAIT_S, sr_last_error());
    /* its answer comes after it refused what was left in its inbox */
    WCHECK(sr_rpc_sync(1, "noop", SR_ARGS(), WAIT_S, NULL) == 0, "noop after: %s", sr_last_error());
    sr__heap_drain();
    size_t used = sr__heap_allocated();
    WCHECK(used == base, "rank 0's heap holds %zu bytes, %zu before the calls to the victim that died", used, base);
    return 0;
}

Test(replace_heap, calls_queued_for_a_victim_that_dies_let_go_of_their_tensors, .timeout = 120)
{
    fz = shared_page(sizeof(*fz));
    last_gen = 1;
    sr_spawn_opts o = {.name_prefix = test_ns("replq"), .shm_size = 2 * (64u << 20), .ring_slots = 2,
                       .restart = SR_RESTART_RANK, .max_restarts = 1};
    int rc = sr_spawn(2, worker, (void *)driver_queued, &o);
    cr_assert_eq(rc, 0, "job: %d: %s", rc, sr_last_error());
}
