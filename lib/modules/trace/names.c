/* SPDX-License-Identifier: MIT */
/* Interned function names. See trace.h.
 *
 * An open-addressing table of ids (id + 1; 0: empty) hashed by name, and the
 * names themselves by id. A slot and a name are written once, under `lock`:
 * the name first, then the slot with a release store; a lookup's acquire
 * load of the slot pairs with it, so the name it then reads is complete.
 * The names' text lives in the record area (trace.h), with its offset in
 * the area's table, so that whoever reads the area can name the records. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

#define SLOTS 1024 /* > 2 * SR_TRACE_FNS: probes stay short */

static _Atomic uint32_t slots[SLOTS];
static char *names[SR_TRACE_FNS];
static _Atomic uint32_t count;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static uint32_t hash(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/* The slot of name, or of the empty slot where it would go. */
static uint32_t find(const char *name, uint32_t h, uint32_t *id)
{
    for (uint32_t i = h % SLOTS;; i = (i + 1) % SLOTS) {
        /* acquire: pairs with the release store in sr__trace_name_id */
        uint32_t v = atomic_load_explicit(&slots[i], memory_order_acquire);
        if (!v || !strcmp(names[v - 1], name)) {
            *id = v;
            return i;
        }
    }
}

/* A copy of name in the area, recorded in its table of names (under lock). */
static char *in_area(const char *name)
{
    struct sr_area *a = sr__area();
    size_t len = strlen(name) + 1;
    uint64_t off = a ? sr__area_alloc(a, len) : 0;
    if (!off)
        return NULL;
    char *copy = memcpy(SR_AT(a, off), name, len);
    /* relaxed: count is written under lock */
    uint32_t n = atomic_load_explicit(&count, memory_order_relaxed);
    a->name[n] = off;
    atomic_store_explicit(&a->nnames, n + 1, memory_order_release); /* pairs with sr__area_name */
    return copy;
}

uint32_t sr__trace_name_id(const char *name)
{
    uint32_t h = hash(name), v;
    find(name, h, &v);
    if (v)
        return v - 1;
    pthread_mutex_lock(&lock);
    uint32_t i = find(name, h, &v);
    /* relaxed: count is written under lock */
    uint32_t n = atomic_load_explicit(&count, memory_order_relaxed);
    char *copy = v || n >= SR_TRACE_FNS - 1 ? NULL : in_area(name);
    if (!v && copy) {
        names[n] = copy;
        atomic_store_explicit(&count, n + 1, memory_order_release); /* pairs with sr__trace_names */
        atomic_store_explicit(&slots[i], n + 1, memory_order_release); /* pairs with find */
        v = n + 1;
    }
    pthread_mutex_unlock(&lock);
    return v ? v - 1 : SR_TRACE_FNS - 1; /* full (or no memory): "(other)" */
}

uint32_t sr__trace_names(void)
{
    /* acquire: pairs with the release in sr__trace_name_id: names[< n] are set */
    return atomic_load_explicit(&count, memory_order_acquire);
}

const char *sr__trace_name(uint32_t id)
{
    if (id == SR_TRACE_FNS - 1)
        return "(other)";
    return id < sr__trace_names() ? names[id] : NULL;
}

void sr__trace_names_forget(void)
{
    /* one thread exists: the lock may have been held by another at the fork */
    pthread_mutex_init(&lock, NULL);
    for (unsigned i = 0; i < SLOTS; i++)
        atomic_store_explicit(&slots[i], 0, memory_order_relaxed); /* relaxed: one thread */
    memset(names, 0, sizeof(names));
    atomic_store_explicit(&count, 0, memory_order_relaxed);
}
