/* Per-thread tables: adoption, statistics blocks, trace records. See
 * trace.h. Nothing here is ever freed: a table stays reachable from `tables`
 * for the life of the process (a thread may record until it exits, even
 * after exit() has started), and adoption bounds the memory. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trace.h"

static _Atomic(struct sr_ttable *) tables; /* push-only list: release on push, acquire on read */
static _Atomic uint32_t epoch;
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

static struct sr_ttable *adopt(void)
{
    for (struct sr_ttable *t = sr__ttables(); t; t = t->next) {
        bool f = false;
        /* acquire: pairs with the release in release(): the last writer's words are ours */
        if (atomic_compare_exchange_strong_explicit(&t->owned, &f, true, memory_order_acquire, memory_order_relaxed))
            return t;
    }
    struct sr_ttable *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    atomic_init(&t->owned, true);
    /* relaxed: the reset epoch is a hint, re-checked on each record */
    atomic_init(&t->epoch, atomic_load_explicit(&epoch, memory_order_relaxed));
    t->next = atomic_load_explicit(&tables, memory_order_relaxed);
    /* release: publishes the table's fields to readers (acquire in sr__ttables) */
    while (!atomic_compare_exchange_weak_explicit(&tables, &t->next, t, memory_order_release, memory_order_relaxed))
        ;
    return t;
}

struct sr_ttable *sr__ttable(void)
{
    if (mine)
        return mine;
    pthread_once(&key_once, make_key);
    if (!(mine = adopt()))
        return NULL;
    mine->tid = gettid();
    pthread_setspecific(key, mine);
    return mine;
}

struct sr_ttable *sr__ttables(void)
{
    /* acquire: pairs with the release push in adopt */
    return atomic_load_explicit(&tables, memory_order_acquire);
}

uint32_t sr__stats_epoch(void)
{
    /* acquire: pairs with the release in sr_stats_reset (stats.c) */
    return atomic_load_explicit(&epoch, memory_order_acquire);
}

void sr__stats_bump_epoch(void)
{
    atomic_fetch_add_explicit(&epoch, 1, memory_order_release); /* pairs with sr__stats_epoch */
}

/* A reset happened since this table last recorded: the writer zeroes its own. */
static void catch_up(struct sr_ttable *t, uint32_t e)
{
    for (unsigned i = 0; i < SR_TRACE_FNS; i++) {
        /* relaxed: the writer's own pointer */
        struct sr_fn_block *b = atomic_load_explicit(&t->fn[i], memory_order_relaxed);
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
    uint32_t e = sr__stats_epoch();
    /* relaxed: only this thread writes the table's epoch */
    if (atomic_load_explicit(&t->epoch, memory_order_relaxed) != e)
        catch_up(t, e);
    /* relaxed: only this thread writes its pointers */
    struct sr_fn_block *b = atomic_load_explicit(&t->fn[id], memory_order_relaxed);
    if (!b && (b = calloc(1, sizeof(*b))))
        atomic_store_explicit(&t->fn[id], b, memory_order_release); /* pairs with the snapshot's acquire */
    return b;
}

void sr__trace_add(struct sr_ttable *t, const struct sr_rec *r)
{
    if (t->nrec >= sr__trace_cap) {
        atomic_fetch_add_explicit(&t->dropped, 1, memory_order_relaxed); /* relaxed: a statistic */
        return;
    }
    /* relaxed: only this thread writes n */
    uint32_t n = t->tail ? atomic_load_explicit(&t->tail->n, memory_order_relaxed) : SR_TRACE_CHUNK;
    if (n == SR_TRACE_CHUNK) {
        struct sr_chunk *c = malloc(sizeof(*c));
        if (!c) {
            atomic_fetch_add_explicit(&t->dropped, 1, memory_order_relaxed); /* relaxed: a statistic */
            return;
        }
        atomic_init(&c->next, NULL);
        atomic_init(&c->n, 0);
        if (t->tail)
            atomic_store_explicit(&t->tail->next, c, memory_order_release); /* pairs with the reader's acquire (write.c) */
        else
            atomic_store_explicit(&t->head, c, memory_order_release); /* pairs with the writer's acquire (write.c) */
        t->tail = c;
        n = 0;
    }
    t->tail->r[n] = *r;
    t->nrec++;
    atomic_store_explicit(&t->tail->n, n + 1, memory_order_release); /* pairs with the reader's acquire (write.c) */
}

/* A forked child (sr_spawn's workers) starts with its parent's tables but
 * only the forking thread: every table is free for adoption, the parent's
 * statistics are reset away, and its trace records are marked written, so
 * the child's figures and trace are its own. */
static void atfork_child(void)
{
    mine = NULL;
    for (struct sr_ttable *t = sr__ttables(); t; t = t->next) {
        atomic_store_explicit(&t->owned, false, memory_order_relaxed); /* relaxed: one thread exists */
        struct sr_chunk *c = atomic_load_explicit(&t->head, memory_order_relaxed);
        while (c && atomic_load_explicit(&c->next, memory_order_relaxed))
            c = atomic_load_explicit(&c->next, memory_order_relaxed);
        t->flushed = c;
        t->flushed_n = c ? atomic_load_explicit(&c->n, memory_order_relaxed) : 0;
        atomic_store_explicit(&t->dropped, 0, memory_order_relaxed);
    }
    sr__stats_bump_epoch();
}

__attribute__((constructor)) static void tables_atfork(void) { pthread_atfork(NULL, NULL, atfork_child); }
