/* Client calls in flight: a table of recycled slots (see agent.h).
 *
 * A call id is (generation << 32) | slot index. The generation is odd while
 * the slot is in use and bumped on every begin and end, so a response that
 * arrives after its call timed out (or a duplicate) finds a different
 * generation and is dropped. Slot allocation takes a short mutex; the
 * response path takes it once to free the slot. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "agent.h"
#include "error.h"
#include "timeout.h"

int sr__calls_init(sr_agent *a, int32_t n)
{
    a->slots = calloc((size_t)n, sizeof(*a->slots));
    if (!a->slots)
        return sr__fail(-ENOMEM, "sr_init", "no memory for %d call slots", n);
    a->nslots = n;
    for (int32_t i = 0; i < n; i++)
        a->slots[i].next_free = i + 1 < n ? i + 1 : -1;
    a->free_head = 0;
    pthread_mutex_init(&a->slots_lock, NULL);
    atomic_init(&a->earliest_deadline, -1);
    return 0;
}

void sr__calls_fini(sr_agent *a)
{
    for (int32_t i = 0; i < a->nslots; i++)
        if (atomic_load_explicit(&a->slots[i].gen, memory_order_relaxed) & 1) /* relaxed: no other thread is left */
            sr__future_fail_text(a->slots[i].fut, -SR_ESHUTDOWN, "RPC agent shut down before the response arrived"),
                sr_future_unref(a->slots[i].fut);
    free(a->slots);
    pthread_mutex_destroy(&a->slots_lock);
}

/* Lower earliest_deadline to d if it is later (or none). */
static bool lower_deadline(sr_agent *a, int64_t d)
{
    /* seq_cst: pairs with the reset in sr__calls_expire (see there) */
    int64_t cur = atomic_load_explicit(&a->earliest_deadline, memory_order_seq_cst);
    while (cur < 0 || d < cur)
        if (atomic_compare_exchange_weak_explicit(&a->earliest_deadline, &cur, d, memory_order_relaxed,
                                                  memory_order_relaxed))
            return true;
    return false;
}

int sr__call_begin(sr_agent *a, int to, int64_t timeout_ms, sr_future *fut, uint64_t *id)
{
    pthread_mutex_lock(&a->slots_lock);
    int32_t i = a->free_head;
    if (i < 0) {
        pthread_mutex_unlock(&a->slots_lock);
        return sr__fail(-EBUSY, "sr_rpc", "%d calls are already in flight from this worker", a->nslots);
    }
    struct sr_call_slot *s = &a->slots[i];
    a->free_head = s->next_free;
    s->to = to;
    s->timeout_ms = timeout_ms;
    s->deadline_ns = sr__deadline_ns(sr_now_coarse_ns(), timeout_ms); /* saturating: -1 for none */
    s->fut = sr_future_ref(fut);
    /* seq_cst (a release at least): the fields above are visible to whoever
     * matches this generation; and ordered before lower_deadline's load (see
     * sr__calls_expire) */
    uint32_t gen = atomic_fetch_add_explicit(&s->gen, 1, memory_order_seq_cst) + 1;
    pthread_mutex_unlock(&a->slots_lock);
    atomic_fetch_add_explicit(&a->client_active, 1, memory_order_relaxed); /* relaxed: statistics */
    *id = (uint64_t)gen << 32 | (uint32_t)i;
    if (s->deadline_ns >= 0 && lower_deadline(a, s->deadline_ns))
        /* The progress thread may be asleep with a later timer: wake it to re-arm. */
        sr__agent_kick(a);
    return 0;
}

/* A response from a rank the call was not sent to: a peer's bug (a wrong
 * call id) must not complete our call. Dropped, counted, and reported on
 * stderr (the first few: a peer that keeps doing it must not flood it). */
static void stray(sr_agent *a, uint64_t id, int from, int to)
{
    /* relaxed: a statistic; nothing is published with it */
    uint64_t n = atomic_fetch_add_explicit(&a->stray_responses, 1, memory_order_relaxed) + 1;
    if (n <= 8)
        fprintf(stderr, "shmrpc: worker%d: dropped a response from worker%d to call %#" PRIx64
                        ", which was sent to worker%d (%" PRIu64 " dropped so far)\n",
                a->rank, from, id, to, n);
}

/* End call id if it is in flight and, when from >= 0, was sent to from. */
static sr_future *end_call(sr_agent *a, uint64_t id, int from)
{
    uint32_t i = (uint32_t)id, gen = (uint32_t)(id >> 32);
    if (i >= (uint32_t)a->nslots || !(gen & 1))
        return NULL;
    struct sr_call_slot *s = &a->slots[i];
    pthread_mutex_lock(&a->slots_lock);
    /* relaxed: under slots_lock, which every generation change holds */
    if (atomic_load_explicit(&s->gen, memory_order_relaxed) != gen) {
        pthread_mutex_unlock(&a->slots_lock);
        return NULL; /* timed out, failed, or a duplicate: drop it */
    }
    if (from >= 0 && s->to != from) { /* s->to: written before the generation bump we matched */
        int to = s->to;
        pthread_mutex_unlock(&a->slots_lock);
        stray(a, id, from, to);
        return NULL;
    }
    sr_future *f = s->fut;
    s->fut = NULL;
    atomic_store_explicit(&s->gen, gen + 1, memory_order_relaxed); /* relaxed: under slots_lock */
    s->next_free = a->free_head;
    a->free_head = (int32_t)i;
    pthread_mutex_unlock(&a->slots_lock);
    atomic_fetch_sub_explicit(&a->client_active, 1, memory_order_relaxed); /* relaxed: statistics */
    return f;
}

sr_future *sr__call_end(sr_agent *a, uint64_t id) { return end_call(a, id, -1); }

sr_future *sr__call_answer(sr_agent *a, uint64_t id, int from) { return end_call(a, id, from); }

/* Fail every call matching pred; returns the earliest remaining deadline. */
static int64_t fail_matching(sr_agent *a, int64_t now, int rank, const char *why)
{
    int64_t earliest = -1;
    for (int32_t i = 0; i < a->nslots; i++) {
        struct sr_call_slot *s = &a->slots[i];
        /* seq_cst (an acquire at least): pairs with call_begin's bump */
        uint32_t gen = atomic_load_explicit(&s->gen, memory_order_seq_cst);
        if (!(gen & 1))
            continue;
        bool hit = rank >= 0 ? s->to == rank : (s->deadline_ns >= 0 && s->deadline_ns <= now);
        if (!hit) {
            if (s->deadline_ns >= 0 && (earliest < 0 || s->deadline_ns < earliest))
                earliest = s->deadline_ns;
            continue;
        }
        int64_t ms = s->timeout_ms;
        int to = s->to;
        sr_future *f = sr__call_end(a, (uint64_t)gen << 32 | (uint32_t)i);
        if (!f)
            continue;
        if (rank >= 0)
            sr_future_set_error(f, -EPIPE, "worker%d: RPC to worker%d failed: the worker %s", a->rank, to, why);
        else {
            char why[512] = "";
            sr__outq_describe(a, to, why, sizeof(why)); /* its request may never have left */
            sr_future_set_error(f, -ETIMEDOUT,
                                "RPC ran for more than set timeout (%" PRId64 " ms) and will now be marked with an error%s",
                                ms, why);
        }
        sr_future_unref(f);
    }
    return earliest;
}

void sr__calls_expire(sr_agent *a, int64_t now)
{
    /* seq_cst: reset before the scan, never after it (a store may otherwise
     * pass the scan's loads). Pairs with the seq_cst generation bump and
     * load in call_begin/lower_deadline: either the scan sees the new call,
     * or that call sees -1 and lowers the deadline itself. */
    atomic_exchange_explicit(&a->earliest_deadline, -1, memory_order_seq_cst);
    int64_t e = fail_matching(a, now, -1, NULL);
    if (e >= 0)
        lower_deadline(a, e);
}

void sr__calls_fail_peer(sr_agent *a, int rank, const char *why)
{
    fail_matching(a, 0, rank, why);
}
