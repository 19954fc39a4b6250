/* SPDX-License-Identifier: MIT */
/* Per-thread tables: adoption, statistics blocks, trace records. See
 * trace.h. Everything is made in the record area and never freed: a table
 * stays reachable from the area's list for the life of the process (a
 * thread may record until it exits, even after exit() has started), and
 * adoption bounds the memory. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "trace.h"

static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static _Thread_local struct sr_ttable *mine;
uint64_t sr__trace_cap = 1u << 20; /* SHMRPC_TRACE_MAX_EVENTS */

/* The thread exits: its table goes to the next new thread. */
static void release(void *p)
{
    struct sr_ttable *t = p;
    /* release: pairs with the acquire CAS in adopt, which takes over the writes */
    atomic_store_explicit(&t->owned, false, memory_order_release);
}

static void make_key(void) { pthread_key_create(&key, release); }

const struct sr_ttable *sr__area_tables(const struct sr_area *a)
{
    /* acquire: pairs with the release push in adopt */
    return sr__area_get(a, atomic_load_explicit(&((struct sr_area *)a)->tables, memory_order_acquire),
                        sizeof(struct sr_ttable));
}

const struct sr_ttable *sr__area_next(const struct sr_area *a, const struct sr_ttable *t)
{
    /* relaxed: written before the table was published (the list's acquire covers it) */
    uint64_t next = atomic_load_explicit(&((struct sr_ttable *)t)->next, memory_order_relaxed);
    /* a list only grows towards older tables, which lie lower in the area: a bad one cannot loop */
    return next < (uint64_t)((const char *)t - (const char *)a) ? sr__area_get(a, next, sizeof(*t)) : NULL;
}

static struct sr_ttable *adopt(struct sr_area *a)
{
    for (const struct sr_ttable *c = sr__area_tables(a); c; c = sr__area_next(a, c)) {
        struct sr_ttable *t = (struct sr_ttable *)c;
        bool f = false;
        /* acquire: pairs with the release in release(): the last writer's words are ours */
        if (atomic_compare_exchange_strong_explicit(&t->owned, &f, true, memory_order_acquire, memory_order_relaxed))
            return t;
    }
    uint64_t off = sr__area_alloc(a, sizeof(struct sr_ttable));
    if (!off)
        return NULL;
    struct sr_ttable *t = SR_AT(a, off);
    atomic_init(&t->owned, true);
    /* relaxed: the reset epoch is a hint, re-checked on each record */
    atomic_init(&t->epoch, atomic_load_explicit(&a->epoch, memory_order_relaxed));
    uint64_t next = atomic_load_explicit(&a->tables, memory_order_relaxed);
    do /* relaxed: published by the release CAS */
        atomic_store_explicit(&t->next, next, memory_order_relaxed);
    /* release: publishes the table's fields to readers (acquire in sr__area_tables) */
    while (!atomic_compare_exchange_weak_explicit(&a->tables, &next, off, memory_order_release, memory_order_relaxed));
    return t;
}

struct sr_ttable *sr__ttable(void)
{
    if (mine)
        return mine;
    struct sr_area *a = sr__area();
    pthread_once(&key_once, make_key);
    if (!a || !(mine = adopt(a)))
        return NULL;
    mine->tid = gettid();
    mine->named = false; /* the next trace record says who the new owner is first */
    pthread_setspecific(key, mine);
    return mine;
}

uint32_t sr__stats_epoch(void)
{
    struct sr_area *a = sr__area();
    /* acquire: pairs with the release in sr__stats_bump_epoch */
    return a ? atomic_load_explicit(&a->epoch, memory_order_acquire) : 0;
}

void sr__stats_bump_epoch(void)
{
    struct sr_area *a = sr__area();
    if (a)
        atomic_fetch_add_explicit(&a->epoch, 1, memory_order_release); /* pairs with sr__stats_epoch */
}

static struct sr_fn_block *block_at(struct sr_area *a, uint64_t off) { return off ? SR_AT(a, off) : NULL; }

/* A reset happened since this table last recorded: the writer zeroes its own. */
static void catch_up(struct sr_area *a, struct sr_ttable *t, uint32_t e)
{
    for (unsigned i = 0; i < SR_TRACE_FNS; i++) {
        /* relaxed: the writer's own offset */
        struct sr_fn_block *b = block_at(a, atomic_load_explicit(&t->fn[i], memory_order_relaxed));
        if (!b)
            continue;
        atomic_store_explicit(&b->calls, 0, memory_order_relaxed); /* relaxed: the writer's own words */
        atomic_store_explicit(&b->errors, 0, memory_order_relaxed);
        atomic_store_explicit(&b->served, 0, memory_order_relaxed);
        atomic_store_explicit(&b->serve_errors, 0, memory_order_relaxed);
        sr__hist_zero(&b->rtt);
        sr__hist_zero(&b->queue);
        sr__hist_zero(&b->run);
    }
    /* release: a reader that sees the new epoch (acquire in stats.c) sees the zeros */
    atomic_store_explicit(&t->epoch, e, memory_order_release);
}

struct sr_fn_block *sr__fn_block(struct sr_ttable *t, uint32_t id)
{
    struct sr_area *a = sr__area(); /* t's: a thread has a table only once the area exists */
    /* acquire: pairs with the release in sr__stats_bump_epoch */
    uint32_t e = atomic_load_explicit(&a->epoch, memory_order_acquire);
    /* relaxed: only this thread writes the table's epoch */
    if (atomic_load_explicit(&t->epoch, memory_order_relaxed) != e)
        catch_up(a, t, e);
    /* relaxed: only this thread writes its offsets */
    uint64_t off = atomic_load_explicit(&t->fn[id], memory_order_relaxed);
    if (!off && (off = sr__area_alloc(a, sizeof(struct sr_fn_block))))
        atomic_store_explicit(&t->fn[id], off, memory_order_release); /* pairs with the snapshot's acquire */
    return block_at(a, off);
}

/* A new chunk after t's tail, or NULL when the area is full. */
static struct sr_chunk *grow(struct sr_ttable *t)
{
    struct sr_area *a = sr__area();
    uint64_t off = sr__area_alloc(a, sizeof(struct sr_chunk));
    if (!off)
        return NULL;
    if (t->tail) /* release: pairs with the reader's acquire (write.c) */
        atomic_store_explicit(&t->tail->next, off, memory_order_release);
    else /* release: pairs with the reader's acquire (write.c) */
        atomic_store_explicit(&t->head, off, memory_order_release);
    return t->tail = SR_AT(a, off);
}

static void add(struct sr_ttable *t, const struct sr_rec *r);

/* The owner's name, once per owner, before its first trace record: the
 * runtime's threads name themselves (lib/rpc: shmrpc-progress,
 * shmrpc-exec<i>) before they record anything. */
static void add_name(struct sr_ttable *t)
{
    struct sr_rec r = {.kind = SR_REC_THREAD, .tid = t->tid, .peer = -1};
    t->named = true;
    if (prctl(PR_GET_NAME, r.text) == 0) {
        r.text[sizeof(r.text) - 1] = '\0';
        add(t, &r);
    }
}

void sr__trace_add(struct sr_ttable *t, const struct sr_rec *r)
{
    if (!t->named)
        add_name(t);
    add(t, r);
}

static void add(struct sr_ttable *t, const struct sr_rec *r)
{
    if (t->nrec >= sr__trace_cap) {
        atomic_fetch_add_explicit(&t->dropped, 1, memory_order_relaxed); /* relaxed: a statistic */
        return;
    }
    /* relaxed: only this thread writes n */
    uint32_t n = t->tail ? atomic_load_explicit(&t->tail->n, memory_order_relaxed) : SR_TRACE_CHUNK;
    if (n == SR_TRACE_CHUNK) {
        if (!grow(t)) {
            atomic_fetch_add_explicit(&t->dropped, 1, memory_order_relaxed); /* relaxed: a statistic */
            return;
        }
        n = 0;
    }
    t->tail->r[n] = *r;
    t->nrec++;
    atomic_store_explicit(&t->tail->n, n + 1, memory_order_release); /* pairs with the reader's acquire (write.c) */
}

/* A forked child (sr_spawn's workers, or any fork of a recording program)
 * starts with only the forking thread and a copy of its parent's records,
 * which are not its own: it forgets the area and the names, and makes or
 * attaches its own at the next use. */
static void atfork_child(void)
{
    mine = NULL;
    sr__area_forget();
    sr__trace_names_forget();
}

__attribute__((constructor)) static void tables_atfork(void) { pthread_atfork(NULL, NULL, atfork_child); }
