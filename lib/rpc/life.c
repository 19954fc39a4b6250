/* SPDX-License-Identifier: MIT */
/* The agent's lifetime (agent.h, "Lifetime"): publishing it, the
 * references every entry point takes, and unpublishing it for sr_shutdown.
 *
 * References. Every public call takes one and drops it, so they are
 * counted per thread, with no atomic read-modify-write: each thread that
 * calls has a line of its own (a slot, held for the thread's life and
 * recycled at its exit) whose count only it writes. sr_shutdown, which
 * comes once, pays for the ordering instead (an asymmetric fence,
 * membarrier(2) MEMBARRIER_CMD_PRIVATE_EXPEDITED, a full fence on every
 * running thread of the process), and then reads every slot. The pairs:
 *   taker (sr__agent_get)                  sr__agent_unpublish
 *   R1 store its count + 1                 U1 store live = NULL, draining = 1
 *      signal fence (no CPU fence)            membarrier
 *      load live                              load every count (and users)
 *   R2 (sr__agent_put) store its count - 1;   until all are 0, sleeping on
 *      at 0, signal fence, load draining:     drain_seq between looks
 *      if set, bump drain_seq and wake
 * R1: either the taker's store comes before the fence membarrier runs on
 * its thread, and U1's load sees the reference, or its load of live comes
 * after that fence and sees NULL. R2 likewise: either U1 sees the count at
 * 0, or the putter sees draining and wakes it. Under ThreadSanitizer, which
 * cannot see membarrier, both sides use a seq_cst fence (the C11 form of
 * the same pairs).
 * Without membarrier (Linux < 4.14), or for a thread that found no slot
 * free, or one that holds a reference of that kind, the process-wide
 * `users` count serves, with seq_cst read-modify-writes as before. */
#include <limits.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"
#include "error.h"
#include "tsan.h"

static _Atomic(sr_agent *) live;  /* the published agent, or NULL */
static _Atomic uint32_t users;    /* references taken on the process-wide count and not yet put */
static _Atomic uint32_t draining; /* sr__agent_unpublish waits for every reference to go */
static _Atomic uint32_t drain_seq; /* bumped by the last put of a thread while draining: the drainer sleeps on it */
static _Atomic uint64_t epochs;   /* numbers the published agents */

/* ---- per-thread references -------------------------------------------------- */

#define REF_SLOTS 1024

struct ref_slot {
    _Atomic uint32_t held; /* references this slot's thread holds: written by it only */
    char pad[60];
};

static struct ref_slot *slots;         /* [REF_SLOTS], allocated once (refs_start), never freed */
static _Atomic uint32_t slots_used;    /* slots handed out at least once (at most REF_SLOTS): the drainer reads up to here */
static pthread_mutex_t free_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t free_slots[REF_SLOTS]; /* under free_lock: slots of threads that exited */
static uint32_t free_n;                /* under free_lock */
static pthread_key_t slot_key;         /* its destructor recycles a thread's slot */
static _Atomic bool asym;              /* membarrier works in this process: slots may be used */
static pid_t asym_pid;                 /* the process that registered (under life_lock, api.c) */

/* Tests only (tests/rpc/test_agent_life.c): fewer slots than REF_SLOTS, so
 * that threads past them take the process-wide count; and how many
 * references were taken there (relaxed: a statistic). */
_Atomic uint32_t sr__ref_slots_max = REF_SLOTS;
_Atomic uint64_t sr__ref_global_taken;

static _Thread_local struct ref_slot *mine; /* this thread's slot, or NULL */
static _Thread_local bool slot_none;        /* this thread found every slot taken: it counts on `users` */
static _Thread_local uint32_t held_global;  /* references this thread holds on `users` */

static inline void light_fence(void)
{
#ifdef SR_TSAN
    atomic_thread_fence(memory_order_seq_cst);
#else
    atomic_signal_fence(memory_order_seq_cst); /* the drainer's membarrier fences this thread */
#endif
}

static void slot_free(void *p)
{
    struct ref_slot *s = p;
    /* relaxed: our own count; a thread that exits holding a reference keeps
     * it (sr_shutdown would wait for it, as for any reference never put) */
    if (atomic_load_explicit(&s->held, memory_order_relaxed))
        return;
    pthread_mutex_lock(&free_lock);
    free_slots[free_n++] = (uint32_t)(s - slots);
    pthread_mutex_unlock(&free_lock);
}

/* fork(2) copies free_lock as some thread may hold it: hold it across. */
static void fork_prepare(void) { pthread_mutex_lock(&free_lock); }
static void fork_done(void) { pthread_mutex_unlock(&free_lock); }

/* Once per process (a forked child registers again): the slots, and the
 * asymmetric fence. Called by sr__agent_publish, under life_lock. */
static void refs_start(void)
{
    if (atomic_load_explicit(&asym, memory_order_relaxed) && asym_pid == getpid()) /* relaxed: under life_lock */
        return;
    if (!slots) {
        slots = aligned_alloc(64, REF_SLOTS * sizeof(*slots));
        if (!slots || pthread_key_create(&slot_key, slot_free) || pthread_atfork(fork_prepare, fork_done, fork_done)) {
            free(slots);
            slots = NULL;
            return; /* the process-wide count serves */
        }
        memset(slots, 0, REF_SLOTS * sizeof(*slots));
    }
#ifndef SR_TSAN
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0))
        return;
#endif
    asym_pid = getpid();
    /* release: the slots above are ready for whoever sees it */
    atomic_store_explicit(&asym, true, memory_order_release);
}

/* This thread's slot, taken at its first reference; NULL: none (no
 * membarrier, none left when it asked, or it holds references on `users`). */
static struct ref_slot *my_slot(void)
{
    if (sr_likely(mine != NULL))
        return mine;
    /* acquire: refs_start's release */
    if (held_global || slot_none || !atomic_load_explicit(&asym, memory_order_acquire))
        return NULL;
    uint32_t i = UINT32_MAX;
    pthread_mutex_lock(&free_lock);
    if (free_n)
        i = free_slots[--free_n];
    pthread_mutex_unlock(&free_lock);
    if (i == UINT32_MAX) {
        /* relaxed (load, CAS): it only hands out indices, never past the
         * last slot; the drainer's membarrier orders the rest */
        uint32_t max = atomic_load_explicit(&sr__ref_slots_max, memory_order_relaxed);
        i = atomic_load_explicit(&slots_used, memory_order_relaxed);
        do {
            if (i >= REF_SLOTS || i >= max) {
                slot_none = true; /* once: no retry on every call */
                return NULL;
            }
        } while (!atomic_compare_exchange_weak_explicit(&slots_used, &i, i + 1, memory_order_relaxed,
                                                        memory_order_relaxed));
    }
    if (pthread_setspecific(slot_key, &slots[i])) {
        slot_free(&slots[i]);
        return NULL;
    }
    return mine = &slots[i];
}

static void wake_drainer(void)
{
    atomic_fetch_add_explicit(&drain_seq, 1, memory_order_release); /* release: the count we dropped, before */
    syscall(SYS_futex, &drain_seq, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

sr_agent *sr__agent_get(const char *fn)
{
    struct ref_slot *s = my_slot();
    sr_agent *a;
    if (sr_likely(s != NULL)) {
        /* R1 (relaxed store, signal fence): the count is ours */
        atomic_store_explicit(&s->held, atomic_load_explicit(&s->held, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        light_fence();
        a = atomic_load_explicit(&live, memory_order_acquire); /* acquire: pairs with sr__agent_publish */
    } else {
        held_global++;
        atomic_fetch_add_explicit(&sr__ref_global_taken, 1, memory_order_relaxed); /* relaxed: a statistic */
        /* seq_cst: pairs with sr__agent_unpublish (store live, then load
         * users): either it sees our reference, or we see NULL */
        atomic_fetch_add_explicit(&users, 1, memory_order_seq_cst);
        a = atomic_load_explicit(&live, memory_order_seq_cst);
    }
    if (!a) {
        sr__agent_put(NULL);
        if (fn)
            sr__fail(-SR_ESHUTDOWN, fn, "RPC has not been initialized. Call sr_init first.");
    }
    return a;
}

sr_agent *sr__agent_peek(void)
{
    return atomic_load_explicit(&live, memory_order_acquire); /* acquire: pairs with sr__agent_publish */
}

void sr__agent_put(sr_agent *a)
{
    (void)a;
    if (held_global) { /* the newest reference is on `users` (a thread takes a slot only with none there) */
        held_global--;
        /* seq_cst: pairs with sr__agent_unpublish (store draining, then load
         * users): either it sees the count drop, or we see it draining and wake it */
        if (atomic_fetch_sub_explicit(&users, 1, memory_order_seq_cst) == 1 &&
            atomic_load_explicit(&draining, memory_order_seq_cst))
            wake_drainer();
        return;
    }
    struct ref_slot *s = mine;
    uint32_t h = atomic_load_explicit(&s->held, memory_order_relaxed); /* relaxed: ours */
    /* R2, release: what we did with the agent happens-before the drainer's
     * acquire load of the count, and so before it frees the agent */
    atomic_store_explicit(&s->held, h - 1, memory_order_release);
    if (h == 1) {
        light_fence();
        if (atomic_load_explicit(&draining, memory_order_relaxed)) /* relaxed: R2's pair is the membarrier */
            wake_drainer();
    }
}

void sr__agent_publish(sr_agent *a)
{
    refs_start();
    a->epoch = atomic_fetch_add_explicit(&epochs, 1, memory_order_relaxed) + 1; /* relaxed: a unique number */
    /* seq_cst: a's fields are complete before any sr__agent_get sees it */
    atomic_store_explicit(&live, a, memory_order_seq_cst);
}

/* Every reference put (U1's loads). acquire: pairs with R2's release. */
static bool references_gone(void)
{
    if (atomic_load_explicit(&users, memory_order_seq_cst)) /* seq_cst: sr__agent_put's global pair */
        return false;
    uint32_t n = atomic_load_explicit(&slots_used, memory_order_relaxed); /* relaxed: see my_slot */
    for (uint32_t i = 0; slots && i < n; i++)
        if (atomic_load_explicit(&slots[i].held, memory_order_acquire))
            return false;
    return true;
}

void sr__agent_unpublish(sr_agent *a)
{
    /* seq_cst: see sr__agent_get and sr__agent_put */
    atomic_store_explicit(&live, NULL, memory_order_seq_cst);
    atomic_store_explicit(&draining, 1, memory_order_seq_cst);
    /* U1: the takers' side of R1 and R2 (only where slots are in use) */
    if (atomic_load_explicit(&asym, memory_order_relaxed)) { /* relaxed: set under life_lock, which we hold */
#ifdef SR_TSAN
        atomic_thread_fence(memory_order_seq_cst);
#else
        syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0); /* registered by refs_start */
#endif
    }
    /* seq_cst: pairs with the D2 fence of a holder about to sleep (holder_sleep) */
    atomic_store_explicit(&a->closing, true, memory_order_seq_cst);
    a->wake->poke(a->self);
    for (;;) {
        uint32_t seq = atomic_load_explicit(&drain_seq, memory_order_acquire); /* acquire: wake_drainer */
        if (references_gone())
            break;
        syscall(SYS_futex, &drain_seq, FUTEX_WAIT_PRIVATE, seq, NULL, NULL, 0);
    }
    atomic_store_explicit(&draining, 0, memory_order_relaxed); /* relaxed: only sr_shutdown (under life_lock) reads it again */
}
