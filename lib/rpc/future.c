/* SPDX-License-Identifier: MIT */
/* Futures. See shmrpc/future.h and future_internal.h. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "future_internal.h"
#include "module.h"
#include "objcache.h"
#include "waiter.h"

/* CALLBACKS: a callback was added (under lock, before completion); only then
 * does the completer take the lock to collect the list. */
enum { PENDING = 0, COMPLETING = 1, DONE = 2, WAITERS = 0x100, POLLER = 0x200, CALLBACKS = 0x400, STATE = 0xff };

struct callback {
    struct callback *next;
    void (*fn)(sr_future *f, void *arg);
    void (*release)(void *arg); /* a future destroyed before completion drops arg with it */
    void *arg;
    struct sr_tls_snap tls;     /* user callbacks: the modules' thread context they were made in */
};

/* The modules' thread context (sr__future_set_tls_hooks): NULL while no
 * module keeps any, and then a user callback captures nothing. */
static _Atomic(void (*)(struct sr_tls_snap *)) tls_capture;
static void (*tls_swap)(struct sr_tls_snap *); /* set before tls_capture (its release store) */

void sr__future_set_tls_hooks(void (*capture)(struct sr_tls_snap *s), void (*swap)(struct sr_tls_snap *s))
{
    tls_swap = swap;
    /* release: pairs with the acquire load in on_done; tls_swap is set before */
    atomic_store_explicit(&tls_capture, capture, memory_order_release);
}

/* Run a callback, in the thread context it was made in if it is a user's. */
static void run_callback(sr_future *f, struct callback *c)
{
    if (!c->tls.mask) {
        c->fn(f, c->arg);
        return;
    }
    tls_swap(&c->tls); /* mask set: captured with the hooks, after on_done's acquire */
    c->fn(f, c->arg);
    tls_swap(&c->tls);
}

/* What a call touches (refs to msg, 48 bytes) is in the first cache line;
 * the lock, taken only around callbacks, is in the second (aligned_alloc). */
struct sr_future {
    _Atomic uint32_t refs;
    _Atomic uint32_t state;      /* see future_internal.h */
    struct callback *cbs, **tail;
    sr_value *value;             /* written by the completer before DONE */
    int err;
    int cause;                   /* err's cause: for -SR_EREMOTE, the remote function's own code */
    char *msg;
    bool call; /* an RPC call's own future (sr__future_new_call): set before it is shared */
    pthread_mutex_t lock;        /* guards cbs between on_done and a completer that saw CALLBACKS */
};

bool sr__future_is_call(const sr_future *f) { return f->call; }

/* Set by sr_init, never cleared (see sr__future_set_hooks). */
static _Atomic(sr_wait_hook) wait_hook;
static _Atomic(void (*)(void)) wake_hook;

void sr__future_set_hooks(sr_wait_hook wait, void (*wake)(void))
{
    /* release: pairs with the acquire loads in sr__future_wait_until and finish_complete */
    atomic_store_explicit(&wait_hook, wait, memory_order_release);
    atomic_store_explicit(&wake_hook, wake, memory_order_release);
}

bool sr__future_arm_wake(sr_future *f)
{
    /* relaxed: the CAS revalidates */
    uint32_t v = atomic_load_explicit(&f->state, memory_order_relaxed);
    while ((v & STATE) != DONE) {
        /* seq_cst: the poller then announces its sleep and re-checks f (D2);
         * either the completer's exchange sees POLLER, or the re-check sees DONE */
        if ((v & POLLER) || atomic_compare_exchange_weak_explicit(&f->state, &v, v | POLLER, memory_order_seq_cst,
                                                                  memory_order_relaxed))
            return true;
    }
    return false;
}

static void future_free(void *p)
{
    sr_future *f = p;
    pthread_mutex_destroy(&f->lock);
    free(f);
}

/* Freed futures kept by the thread that freed them, for its next
 * sr_future_new (objcache.h): a call's future costs no allocation in the
 * steady state (a caller frees the previous call's future just before the
 * next call). The cache holds only futures whose last reference this
 * thread dropped (the acq_rel decrement, or the sole-owner acquire load,
 * orders every other holder's use before the reuse). */
static _Thread_local struct sr__objcache cache = SR__OBJCACHE_INIT(8, future_free);

/* f's last reference is gone: keep it for this thread's next future, or free it. */
static void future_recycle(sr_future *f)
{
    if (!sr__objcache_put(&cache, f))
        future_free(f);
}

SR_API sr_future *sr_future_new(void)
{
    sr_future *f = sr__objcache_get(&cache);
    if (!f) {
        f = aligned_alloc(64, (sizeof(*f) + 63) & ~(size_t)63);
        if (!f) {
            sr__fail(-ENOMEM, "sr_future_new", "out of memory");
            return NULL;
        }
        pthread_mutex_init(&f->lock, NULL);
    }
    /* not shared yet: plain initialisation (the lock is unlocked either way) */
    atomic_init(&f->refs, 1);
    atomic_init(&f->state, PENDING);
    f->cbs = NULL;
    f->tail = &f->cbs;
    f->value = NULL;
    f->err = 0;
    f->cause = 0;
    f->msg = NULL;
    f->call = false; /* a cached future may have been a call's */
    return f;
}

sr_future *sr__future_new_call(void)
{
    sr_future *f = sr_future_new();
    if (f) { /* not shared yet: plain stores */
        f->call = true;
        /* the caller's and the call slot's; relaxed: nobody else sees f yet, and
         * slots_lock publishes it with the slot (sr__call_begin) */
        atomic_store_explicit(&f->refs, 2, memory_order_relaxed);
    }
    return f;
}

SR_API sr_future *sr_future_ref(sr_future *f)
{
    if (!f) {
        sr__fail(-EINVAL, "sr_future_ref", "future is NULL");
        return NULL;
    }
    /* relaxed: the caller holds a reference, so the future cannot go */
    atomic_fetch_add_explicit(&f->refs, 1, memory_order_relaxed);
    return f;
}

SR_API void sr_future_unref(sr_future *f)
{
    if (!f)
        return;
    /* Sole owner (as sr_value_unref): a count of 1 is our own reference and
     * nobody can take one without holding one, so skip the read-modify-write.
     * acquire: pairs with the release half of the decrements that brought it
     * to 1. Else acq_rel: the last holder must see every other holder's writes. */
    if (atomic_load_explicit(&f->refs, memory_order_acquire) != 1 &&
        atomic_fetch_sub_explicit(&f->refs, 1, memory_order_acq_rel) != 1)
        return;
    sr_value_unref(f->value);
    if (f->msg) /* a call into the allocator for NULL is some 20 instructions a call */
        free(f->msg);
    for (struct callback *c = f->cbs, *n; c; c = n) { /* never completed: callbacks never run */
        n = c->next;
        if (c->release)
            c->release(c->arg);
        free(c);
    }
    future_recycle(f);
}

SR_API bool sr_future_done(const sr_future *f)
{
    if (!f) {
        sr__fail(-EINVAL, "sr_future_done", "future is NULL");
        return false;
    }
    /* acquire: pairs with the completer's exchange to DONE; the result is visible */
    return (atomic_load_explicit(&((sr_future *)f)->state, memory_order_acquire) & STATE) == DONE;
}

int sr__future_error(const sr_future *f) { return f->err; }
sr_value *sr__future_peek(const sr_future *f) { return f->value; }

/* Win the right to complete: PENDING -> COMPLETING, keeping the WAITERS and POLLER bits. */
static int begin_complete(sr_future *f)
{
    /* relaxed: only the CAS matters; the result is published by finish_complete */
    uint32_t v = atomic_load_explicit(&f->state, memory_order_relaxed);
    do {
        if ((v & STATE) != PENDING)
            return sr__fail(-EALREADY, "sr_future_set_result", "Future can only be marked completed once");
    } while (!atomic_compare_exchange_weak_explicit(&f->state, &v, (v & ~(uint32_t)STATE) | COMPLETING,
                                                    memory_order_relaxed, memory_order_relaxed));
    return 0;
}

static void futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Completion holds a reference from before "done" is published to its last
 * touch of f (the futex wake, the unlock, the callbacks): a waiter that sees
 * DONE may drop the last other reference at once. held: the completer's
 * caller holds one for the whole completion (sr__future_complete_held);
 * else one is taken here, which is safe: f is COMPLETING, not DONE, so
 * whoever waits for it still holds theirs. The lock is taken only when a
 * callback was added (CALLBACKS; see on_done), so a plain completion is one
 * exchange. */
static void finish_complete(sr_future *f, bool held)
{
    if (!held)
        sr_future_ref(f);
    /* acq_rel: release publishes value/err to the acquire loads in
     * sr_future_done, sleepers and on_done; acquire: on_done's CAS that set
     * CALLBACKS (under lock) is seen */
    uint32_t old = atomic_exchange_explicit(&f->state, DONE, memory_order_acq_rel);
    struct callback *cbs = NULL;
    if (old & CALLBACKS) {
        pthread_mutex_lock(&f->lock); /* an on_done that set the bit may still be appending */
        cbs = f->cbs;
        f->cbs = NULL;
        f->tail = &f->cbs;
        pthread_mutex_unlock(&f->lock);
    }
    if (old & WAITERS)
        futex_wake_all(&f->state);
    if (old & POLLER) {
        /* acquire: pairs with sr__future_set_hooks */
        void (*wake)(void) = atomic_load_explicit(&wake_hook, memory_order_acquire);
        if (wake)
            wake();
    }
    while (cbs) {
        struct callback *n = cbs->next;
        run_callback(f, cbs);
        free(cbs);
        cbs = n;
    }
    if (!held)
        sr_future_unref(f);
}

SR_API int sr_future_set_result(sr_future *f, sr_value *v)
{
    if (!f)
        return sr__fail(-EINVAL, "sr_future_set_result", "future is NULL");
    int rc = begin_complete(f);
    if (rc)
        return rc;
    f->value = v ? sr_value_ref(v) : sr_none();
    finish_complete(f, false);
    return 0;
}

int sr__future_complete_held(sr_future *f, sr_value *v)
{
    int rc = begin_complete(f);
    if (rc) {
        sr_value_unref(v);
        return rc;
    }
    f->value = v ? v : sr_none(); /* adopted */
    finish_complete(f, true);
    return 0;
}

int sr__future_fail_text(sr_future *f, int err, const char *msg) { return sr__future_fail_cause(f, err, err, msg); }

int sr__future_fail_cause(sr_future *f, int err, int cause, const char *msg)
{
    int rc = begin_complete(f);
    if (rc)
        return rc;
    f->err = err < 0 ? err : -EINVAL;
    f->cause = cause < 0 ? cause : f->err;
    f->msg = strdup(msg ? msg : "");
    finish_complete(f, false);
    return 0;
}

SR_API int sr_future_set_error(sr_future *f, int err, const char *fmt, ...)
{
    if (!f)
        return sr__fail(-EINVAL, "sr_future_set_error", "future is NULL (error %d)", err);
    char msg[512] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
    }
    return sr__future_fail_text(f, err, msg);
}

/* The outcome of a completed future, re-raised every time. */
static int outcome(sr_future *f, sr_value **out)
{
    if (f->err) {
        sr__error_set(f->cause, f->msg ? f->msg : "");
        return f->err;
    }
    if (out)
        *out = sr_value_ref(f->value);
    return 0;
}

SR_API int sr_future_value(sr_future *f, sr_value **out)
{
    if (!f)
        return sr__fail(-EINVAL, "sr_future_value", "future is NULL");
    if (!sr_future_done(f))
        return sr__fail(-EAGAIN, "sr_future_value", "the future is not complete yet");
    return outcome(f, out);
}

SR_API int sr_future_error_code(const sr_future *f)
{
    if (!f)
        return sr__fail(-EINVAL, "sr_future_error_code", "future is NULL");
    if (!sr_future_done(f))
        return sr__fail(-EAGAIN, "sr_future_error_code", "the future is not complete yet");
    return f->err ? f->cause : 0;
}

bool sr__future_wait_word(sr_future *f, _Atomic uint32_t **word, uint32_t *val)
{
    /* relaxed: the CAS below revalidates */
    uint32_t v = atomic_load_explicit(&f->state, memory_order_relaxed);
    if ((v & STATE) == DONE)
        return false;
    /* relaxed: setting WAITERS needs atomicity only; the futex re-checks the value */
    if (!(v & WAITERS) &&
        !atomic_compare_exchange_strong_explicit(&f->state, &v, v | WAITERS, memory_order_relaxed,
                                                 memory_order_relaxed))
        return false; /* the state moved: let the caller re-check */
    *word = &f->state;
    *val = v | WAITERS;
    return true;
}

void sr__future_sleep(sr_future *f, int64_t deadline_ns)
{
    _Atomic uint32_t *w;
    uint32_t v;
    if (!sr__future_wait_word(f, &w, &v))
        return;
    struct timespec ts, *tp = NULL;
    if (deadline_ns >= 0) {
        int64_t left = deadline_ns - sr__now_ns();
        if (left <= 0)
            return;
        ts = (struct timespec){.tv_sec = left / 1000000000, .tv_nsec = left % 1000000000};
        tp = &ts;
    }
    syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v, tp, NULL, 0);
}

int sr__future_wait_until(sr_future *f, int64_t deadline_ns)
{
    if (sr_future_done(f))
        return 0;
    /* acquire: pairs with sr__future_set_hooks */
    sr_wait_hook hook = atomic_load_explicit(&wait_hook, memory_order_acquire);
    if (hook)
        return hook(f, deadline_ns);
    return sr__future_wait_plain(f, deadline_ns);
}

int sr__future_wait_plain(sr_future *f, int64_t deadline_ns)
{
    while (!sr_future_done(f)) {
        if (deadline_ns >= 0 && sr__now_ns() >= deadline_ns)
            return -ETIMEDOUT;
        sr__future_sleep(f, deadline_ns);
    }
    return 0;
}

SR_API int sr_future_wait(sr_future *f, sr_value **out)
{
    if (!f)
        return sr__fail(-EINVAL, "sr_future_wait", "future is NULL");
    int rc = sr__future_wait_until(f, -1);
    if (rc)
        return rc;
    return outcome(f, out);
}

static int on_done(sr_future *f, void (*cb)(sr_future *, void *), void (*release)(void *), void *arg, bool user);

/* Queue c for the completer, or false if f is done (the caller runs c). The
 * first callback sets CALLBACKS with a CAS that fails only against the
 * completer's exchange to DONE: then the completer did not see the bit and
 * will not touch the list, and c is not queued. A later one finds the bit
 * set, so the completer (whose exchange returns it) takes the list under
 * the lock, after this append. */
static bool add_callback(sr_future *f, struct callback *c)
{
    bool queued = false;
    pthread_mutex_lock(&f->lock);
    /* acquire: pairs with the completer's exchange to DONE (the result is
     * visible to a callback run here) */
    uint32_t v = atomic_load_explicit(&f->state, memory_order_acquire);
    /* acq_rel on success: pairs with the completer's exchange (it sees the bit);
     * acquire on failure: as the load */
    while ((v & STATE) != DONE && !(v & CALLBACKS) &&
           !atomic_compare_exchange_weak_explicit(&f->state, &v, v | CALLBACKS, memory_order_acq_rel,
                                                  memory_order_acquire))
        ;
    if ((v & STATE) != DONE) {
        *f->tail = c;
        f->tail = &c->next;
        queued = true;
    }
    pthread_mutex_unlock(&f->lock);
    return queued;
}

SR_API int sr_future_add_done_callback(sr_future *f, void (*cb)(sr_future *, void *), void *arg)
{
    return on_done(f, cb, NULL, arg, true);
}

int sr__future_on_done(sr_future *f, void (*cb)(sr_future *, void *), void (*release)(void *), void *arg)
{
    return on_done(f, cb, release, arg, false);
}

/* user: a user's callback, run in the thread context it is registered in
 * (module.h), so a continuation keeps, e.g., its distributed autograd
 * context. */
static int on_done(sr_future *f, void (*cb)(sr_future *, void *), void (*release)(void *), void *arg, bool user)
{
    if (!f || !cb)
        return sr__fail(-EINVAL, "sr_future_add_done_callback", "incompatible function arguments: %s is NULL",
                        f ? "callback" : "future");
    struct callback *c = malloc(sizeof(*c));
    if (!c)
        return sr__fail(-ENOMEM, "sr_future_add_done_callback", "out of memory");
    *c = (struct callback){.fn = cb, .release = release, .arg = arg};
    /* acquire: pairs with sr__future_set_tls_hooks (tls_swap is set) */
    void (*capture)(struct sr_tls_snap *) = user ? atomic_load_explicit(&tls_capture, memory_order_acquire) : NULL;
    if (capture)
        capture(&c->tls);
    if (add_callback(f, c))
        return 0;
    run_callback(f, c);
    free(c);
    return 0;
}

struct then_ctx {
    sr_then_fn fn;
    void *arg;
    sr_future *child;
};

static void drop_then(void *p)
{
    struct then_ctx *t = p;
    sr_future_unref(t->child);
    free(t);
}

static void run_then(sr_future *parent, void *p)
{
    struct then_ctx *t = p;
    sr_value *result = NULL;
    int rc = t->fn(parent, t->arg, &result);
    if (rc) /* a callback that forwards a remote error keeps its cause */
        sr__future_fail_cause(t->child, rc, sr__error_cause(rc), sr_last_error());
    else
        sr_future_set_result(t->child, result);
    sr_value_unref(result);
    sr_future_unref(t->child);
    free(t);
}

SR_API int sr_future_then(sr_future *f, sr_then_fn cb, void *arg, sr_future **out)
{
    if (!f || !cb || !out)
        return sr__fail(-EINVAL, "sr_future_then", "incompatible function arguments: %s is NULL",
                        !f ? "future" : !cb ? "callback" : "out");
    struct then_ctx *t = malloc(sizeof(*t));
    sr_future *child = sr_future_new();
    if (!t || !child) {
        free(t);
        sr_future_unref(child);
        return sr__fail(-ENOMEM, "sr_future_then", "out of memory");
    }
    *t = (struct then_ctx){cb, arg, sr_future_ref(child)};
    int rc = on_done(f, run_then, drop_then, t, true);
    if (rc) {
        sr_future_unref(t->child);
        sr_future_unref(child);
        free(t);
        return rc;
    }
    *out = child;
    return 0;
}

/* wait_all: one aggregate future, completed by the first error or the last value. */
struct all_ctx {
    _Atomic size_t remaining;
    _Atomic uint32_t refs;
    size_t n;
    sr_future *const *fs;
    sr_future *agg;
};

static void all_ctx_unref(void *p)
{
    struct all_ctx *a = p;
    /* acq_rel: the last holder frees; it must see the others' writes */
    if (atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel) == 1) {
        sr_future_unref(a->agg);
        free(a);
    }
}

static void complete_all(struct all_ctx *a)
{
    sr_value **vals = malloc((a->n ? a->n : 1) * sizeof(*vals));
    if (!vals) {
        sr_future_set_error(a->agg, -ENOMEM, "sr_future_wait_all: out of memory");
        return;
    }
    for (size_t i = 0; i < a->n; i++)
        vals[i] = sr__future_peek(a->fs[i]);
    sr_value *list = sr_list(a->n, vals);
    free(vals);
    if (list)
        sr_future_set_result(a->agg, list);
    else
        sr_future_set_error(a->agg, -ENOMEM, "sr_future_wait_all: out of memory");
    sr_value_unref(list);
}

static void on_one_done(sr_future *f, void *p)
{
    struct all_ctx *a = p;
    if (f->err)
        sr__future_fail_cause(a->agg, f->err, f->cause, f->msg); /* the first error wins; later ones are -EALREADY */
    /* acq_rel: the last one to finish must see every result */
    else if (atomic_fetch_sub_explicit(&a->remaining, 1, memory_order_acq_rel) == 1)
        complete_all(a);
    all_ctx_unref(a);
}

SR_API int sr_future_wait_all(sr_future *const *fs, size_t n, sr_value **out)
{
    if (n && !fs)
        return sr__fail(-EINVAL, "sr_future_wait_all", "futures array is NULL");
    for (size_t i = 0; i < n; i++)
        if (!fs[i])
            return sr__fail(-EINVAL, "sr_future_wait_all", "future %zu is NULL", i);
    struct all_ctx *a = malloc(sizeof(*a));
    sr_future *agg = sr_future_new();
    if (!a || !agg) {
        free(a);
        sr_future_unref(agg);
        return sr__fail(-ENOMEM, "sr_future_wait_all", "out of memory");
    }
    *a = (struct all_ctx){.n = n, .fs = fs, .agg = sr_future_ref(agg)};
    atomic_init(&a->remaining, n);
    atomic_init(&a->refs, (uint32_t)n + 1);
    if (n == 0)
        complete_all(a);
    for (size_t i = 0; i < n; i++)
        if (sr__future_on_done(fs[i], on_one_done, all_ctx_unref, a)) { /* -ENOMEM: fail fast, drop its share */
            sr__future_fail_text(agg, -ENOMEM, sr_last_error());
            all_ctx_unref(a);
        }
    int rc = sr_future_wait(agg, out);
    /* The stragglers may still run on_one_done after we return; they only
     * touch a and agg (refcounted), never fs, once agg is complete. */
    all_ctx_unref(a);
    sr_future_unref(agg);
    return rc;
}
