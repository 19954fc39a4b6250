/* SPDX-License-Identifier: MIT */
/* Per-thread caches of freed objects (internal): a thread keeps the objects
 * it frees, up to a bound, for its own next allocation of the same kind, so
 * that the steady state of a call allocates nothing (the caller's futures,
 * future.c; the callee's call records, serve.c).
 *
 * Ownership. A cache is a _Thread_local of its user, defined with
 * SR__OBJCACHE_INIT: each thread has its own and only that thread touches
 * it, so nothing in it needs an ordering. An object enters it only through
 * sr__objcache_put by the thread that dropped the object's last reference,
 * once nothing else refers to it; the user's own hand-over (an acq_rel
 * decrement, the end of a call) orders every other holder's use before
 * that, and so before the object's reuse. It leaves only through
 * sr__objcache_get, on the same thread.
 *
 * Bound. At most `bound` objects (SR__OBJCACHE_MAX at the most) per cache
 * and thread: a put beyond it returns false and the caller frees the object.
 * An object freed on another thread than the one that allocated it stays in
 * the freeing thread's cache, still within that thread's bound.
 *
 * Thread exit. The first put of a thread enrols its cache with one
 * pthread key (objcache.c); the key's destructor frees every enrolled
 * cache's objects with the cache's drop function, and from then on each put
 * on that thread refuses (the caller frees), so a thread leaves nothing
 * behind, whatever its other destructors free after ours. A thread that
 * ends without running destructors (the main thread's exit()) keeps its
 * objects reachable from its thread-locals until the process ends.
 *
 * AddressSanitizer builds keep no objects (every put refuses), so that a use
 * after the last reference is still caught and the leak checks see every
 * object freed where its user frees it. */
#ifndef SR_RPC_OBJCACHE_H
#define SR_RPC_OBJCACHE_H

#if !defined(SR__IN_RPC)
#error "objcache.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SR__OBJCACHE_MAX 8

enum { SR__OBJCACHE_NEW, SR__OBJCACHE_ON, SR__OBJCACHE_OFF }; /* not enrolled yet; enrolled; refusing */

struct sr__objcache {
    uint8_t state;             /* SR__OBJCACHE_* */
    uint8_t n, bound;          /* objects held; the most it holds */
    void (*drop)(void *obj);   /* frees one object (at thread exit) */
    struct sr__objcache *next; /* the thread's enrolled caches (objcache.c) */
    void *obj[SR__OBJCACHE_MAX];
};

/* The initialiser of a cache: static _Thread_local struct sr__objcache c =
 * SR__OBJCACHE_INIT(4, free_fn); a bound over SR__OBJCACHE_MAX is a
 * build error (the array of size -1). */
#define SR__OBJCACHE_INIT(max, drop_fn)                                                                         \
    {.bound = (max) + 0 * sizeof(char[(max) <= SR__OBJCACHE_MAX ? 1 : -1]), .drop = (drop_fn)}

/* Enrol c with this thread's exit destructor (objcache.c): true if it may
 * hold objects now. */
bool sr__objcache_enrol(struct sr__objcache *c);

/* An object kept by this thread, or NULL: the caller allocates. */
static inline void *sr__objcache_get(struct sr__objcache *c) { return c->n ? c->obj[--c->n] : NULL; }

/* Keep obj, whose last reference this thread dropped, for this thread's
 * next get. False: not kept (full, the thread is exiting, or ASan), the
 * caller frees it. */
static inline bool sr__objcache_put(struct sr__objcache *c, void *obj)
{
#if defined(__SANITIZE_ADDRESS__)
    (void)c;
    (void)obj;
    return false;
#else
    if (c->n >= c->bound || (c->state != SR__OBJCACHE_ON && !sr__objcache_enrol(c)))
        return false;
    c->obj[c->n++] = obj;
    return true;
#endif
}

#endif
