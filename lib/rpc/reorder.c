/* SPDX-License-Identifier: MIT */
/* The test-only reordering mode. See reorder.h. */
#include "reorder.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "error.h"
#include "parse.h"

struct held {
    struct held *next;
    int64_t at;    /* release time */
    int to;
    int16_t stamp; /* expect[to] when it was held: the generation of `to` it is for, and counted for */
    sr_msg m;
};

struct sr_reorder {
    pthread_mutex_t lock;
    struct held *head;     /* sorted by release time; lock */
    uint64_t rng;          /* lock */
    int64_t min_ns, span_ns; /* written at create: delays are min_ns + [0, span_ns] */
    _Atomic int64_t next;  /* head's release time, -1 if empty: a hint read without the lock */
};

/* splitmix64: small, fast, and good enough to pick delays. */
static uint64_t next_rand(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

int sr__reorder_create(sr_agent *a)
{
    const char *seed = getenv("SHMRPC_REORDER_SEED");
    if (!seed || !*seed)
        return 0;
    int64_t n = 0, max_us = 2000, min_us = 0;
    if (sr__env_int("sr_init", "SHMRPC_REORDER_SEED", 0, INT64_MAX, &n) ||
        sr__env_int("sr_init", "SHMRPC_REORDER_MAX_US", 1, INT64_MAX / 1000, &max_us) ||
        sr__env_int("sr_init", "SHMRPC_REORDER_MIN_US", 0, max_us, &min_us))
        return -EINVAL;
    struct sr_reorder *r = calloc(1, sizeof(*r));
    if (!r)
        return sr__fail(-ENOMEM, "sr_init", "out of memory for the reordering mode");
    r->min_ns = min_us * 1000;
    r->span_ns = max_us * 1000 - r->min_ns;
    r->rng = (uint64_t)n * UINT64_C(1000003) + (uint64_t)a->rank;
    pthread_mutex_init(&r->lock, NULL);
    atomic_init(&r->next, -1);
    a->reorder = r;
    return 0;
}

void sr__reorder_destroy(sr_agent *a)
{
    struct sr_reorder *r = a->reorder;
    if (!r)
        return;
    for (struct held *h = r->head, *n; h; h = n) {
        n = h->next;
        free(h);
    }
    pthread_mutex_destroy(&r->lock);
    free(r);
    a->reorder = NULL;
}

/* Mostly short delays, some up to the bound, a few at the bound: later
 * messages often overtake earlier ones, and a long one is overtaken by many. */
static int64_t pick_delay(struct sr_reorder *r)
{
    uint64_t x = next_rand(&r->rng);
    unsigned kind = (unsigned)(x % 10);
    int64_t span = kind < 5 ? r->span_ns / 4 : r->span_ns;
    if (kind == 9)
        return r->min_ns + r->span_ns;
    return r->min_ns + (int64_t)((x >> 8) % (uint64_t)(span + 1));
}

int sr__reorder_hold(sr_agent *a, int to, const sr_msg *m)
{
    struct sr_reorder *r = a->reorder;
    struct held *h = malloc(sizeof(*h));
    if (!h)
        return sr__fail(-ENOMEM, "sr_rpc", "out of memory holding a message (reordering mode)");
    h->to = to;
    h->stamp = atomic_load_explicit(&a->expect[to], memory_order_relaxed); /* relaxed: see agent.h, expect */
    h->m = *m;
    h->m.src = (uint16_t)a->rank;
    pthread_mutex_lock(&r->lock);
    h->at = sr__now_ns() + pick_delay(r);
    struct held **p = &r->head;
    while (*p && (*p)->at <= h->at)
        p = &(*p)->next;
    h->next = *p;
    *p = h;
    bool first = r->head == h;
    /* relaxed: a hint; the list under the lock is the truth */
    atomic_store_explicit(&r->next, r->head->at, memory_order_relaxed);
    pthread_mutex_unlock(&r->lock);
    return first ? 1 : 0; /* first: the progress thread may sleep with a later timer (the caller kicks) */
}

/* Send one held message. Sent now, it would be stamped with the
 * destination's generation of now (the transport stamps at the send): one
 * held across a replacement would reach the successor of the generation it
 * was meant and counted for (agent.h, quiesce), so it is dropped instead,
 * as the outgoing queue drops what it held for a rank that died. */
static void release(sr_agent *a, struct held *h, int (*send)(sr_agent *a, int to, sr_msg *m))
{
    /* relaxed: see agent.h, expect; written by the thread that handles exits */
    if (atomic_load_explicit(&a->expect[h->to], memory_order_relaxed) != h->stamp) {
        if (h->m.type != SR_MSG_CTRL)
            sr__msg_release(&h->m); /* its generation is gone: its count no longer adds up (quiesce) */
        return;
    }
    if (send(a, h->to, &h->m)) { /* the peer left while we held it: as if sent and lost */
        char how[128] = "could not be reached";
        sr_tport *t = a->tp[h->to];
        if (sr__tport_peer_gone(t, h->to))
            t->ops->live->exit_text(t, h->to, how, sizeof(how));
        sr__msg_release(&h->m);
        sr__calls_fail_peer(a, h->to, how);
    }
}

void sr__reorder_pump(sr_agent *a, int64_t now, int (*send)(sr_agent *a, int to, sr_msg *m))
{
    struct sr_reorder *r = a->reorder;
    /* relaxed: a hint, re-checked under the lock */
    int64_t next = atomic_load_explicit(&r->next, memory_order_relaxed);
    if (next < 0 || next > now)
        return;
    pthread_mutex_lock(&r->lock);
    struct held *due = NULL, **tail = &r->head;
    while (*tail && (*tail)->at <= now)
        tail = &(*tail)->next;
    if (tail != &r->head) { /* cut the due prefix off the list */
        due = r->head;
        r->head = *tail;
        *tail = NULL;
    }
    atomic_store_explicit(&r->next, r->head ? r->head->at : -1, memory_order_relaxed); /* relaxed: as above */
    pthread_mutex_unlock(&r->lock);
    for (struct held *h = due, *n; h; h = n) {
        n = h->next;
        release(a, h, send);
        free(h);
    }
}

int64_t sr__reorder_next(sr_agent *a)
{
    /* relaxed: a hint for the progress thread's sleep */
    return a->reorder ? atomic_load_explicit(&a->reorder->next, memory_order_relaxed) : -1;
}
