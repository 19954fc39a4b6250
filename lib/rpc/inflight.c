/* SPDX-License-Identifier: MIT */
/* Objects in flight (see inflight.h): a small mutex-protected table.
 *
 * Only self-calls put objects in buffers and each is decoded soon after, so
 * the table stays a handful of entries long and a linear scan is enough. The
 * lock is taken only by buffers that hold objects.
 */
#include "inflight.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

struct inflight {
    sr_value *obj;
    uint32_t n; /* unclaimed references */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct inflight *table; /* guarded by lock, as are len and cap */
static size_t len, cap;

static struct inflight *find_locked(uint64_t addr)
{
    for (size_t i = 0; i < len; i++)
        if ((uint64_t)(uintptr_t)table[i].obj == addr)
            return &table[i];
    return NULL;
}

int sr__inflight_add(sr_value *v)
{
    int rc = 0;
    pthread_mutex_lock(&lock);
    struct inflight *e = find_locked((uint64_t)(uintptr_t)v);
    if (e) {
        e->n++;
    } else if (len == cap) {
        size_t ncap = cap ? 2 * cap : 8;
        struct inflight *t = realloc(table, ncap * sizeof(*t));
        if (t) {
            table = t;
            cap = ncap;
            table[len++] = (struct inflight){v, 1};
        } else {
            rc = sr__fail(-ENOMEM, "sr__codec_encode", "out of memory recording object %p in flight", (void *)v);
        }
    } else {
        table[len++] = (struct inflight){v, 1};
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

bool sr__inflight_has(uint64_t addr, const char *type, size_t tlen)
{
    pthread_mutex_lock(&lock);
    struct inflight *e = find_locked(addr);
    /* Safe to read: the recorded reference keeps the object alive while we hold the lock. */
    const char *t = e ? sr_value_object_type(e->obj) : NULL;
    bool found = t && strlen(t) == tlen && memcmp(t, type, tlen) == 0;
    pthread_mutex_unlock(&lock);
    return found;
}

sr_value *sr__inflight_claim(uint64_t addr)
{
    sr_value *v = NULL;
    pthread_mutex_lock(&lock);
    struct inflight *e = find_locked(addr);
    if (e) {
        v = e->obj;
        if (--e->n == 0)
            *e = table[--len];
        if (len == 0) { /* nothing in flight: give the table back (and keep leak checks quiet) */
            free(table);
            table = NULL;
            cap = 0;
        }
    }
    pthread_mutex_unlock(&lock);
    return v;
}

uint32_t sr__inflight_count(const sr_value *v)
{
    pthread_mutex_lock(&lock);
    struct inflight *e = find_locked((uint64_t)(uintptr_t)v);
    uint32_t n = e ? e->n : 0;
    pthread_mutex_unlock(&lock);
    return n;
}
