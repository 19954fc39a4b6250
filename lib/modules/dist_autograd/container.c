/* SPDX-License-Identifier: MIT */
/* The per-worker container of distributed autograd contexts: a sharded map
 * context_id -> context, the id counters and the thread's current context.
 *
 * Shards. PyTorch sizes its map from the core count (the smallest power of
 * two >= 2 x cores, at most 128): more shards than twice the threads that can
 * run at once buys no less contention, only more memory and a colder cache.
 * We do the same, so a 2-core machine has 4 shards and a 64-core one 128.
 * sr__dist_autograd_set_shards() overrides it (benches: 1 = one lock).
 *
 * Released ids. A cleanup can overtake a request of the same context (the
 * test-only reordering mode does that on purpose); each shard remembers its
 * last released ids so that a late request does not create the context
 * again, where nothing would ever release it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "context.h"
#include "error.h"

#define MAX_SHARDS 128
#define TOMBSTONES 64
#define COUNTER_BITS 48
#define COUNTER_MAX ((UINT64_C(1) << COUNTER_BITS) - 1)
#define GEN_SHIFT 40 /* a generation's first counter: (generation mod 256) << GEN_SHIFT */

struct shard {
    pthread_mutex_t lock;
    struct sr_idmap map;        /* id -> sr_dctx * (the container's reference) */
    int64_t dead[TOMBSTONES];   /* recently released ids */
    unsigned dead_next;
} __attribute__((aligned(64)));

static struct {
    struct shard *shards;
    unsigned nshards;           /* a power of two */
    int rank, world;
    _Atomic uint64_t next_ctx;  /* counters; relaxed: only uniqueness matters */
    _Atomic uint64_t next_msg;
    _Atomic int64_t count;      /* contexts alive (debug info) */
} box;

static unsigned forced_shards;
static _Thread_local int64_t current = SR_NO_CONTEXT;
_Atomic int64_t sr__dctx_passes;

/* Test and bench knobs (declared where used). */
void sr__dist_autograd_set_shards(unsigned n) { forced_shards = n; }
void sr__dist_autograd_set_next_counter(uint64_t c)
{
    atomic_store_explicit(&box.next_ctx, c, memory_order_relaxed); /* relaxed: set before use by the test */
}

static unsigned shard_count(void)
{
    if (forced_shards)
        return forced_shards;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned n = 1;
    while (n < MAX_SHARDS && n < 2 * (unsigned)(cores > 0 ? cores : 1))
        n <<= 1;
    return n;
}

int sr__dctx_container_init(int rank, int world)
{
    unsigned n = shard_count();
    n = n & (n - 1) ? MAX_SHARDS : n; /* a power of two */
    struct shard *s = aligned_alloc(64, n * sizeof(*s));
    if (!s)
        return sr__fail(-ENOMEM, "sr_init", "out of memory for %u autograd context shards", n);
    for (unsigned i = 0; i < n; i++) {
        memset(&s[i], 0, sizeof(s[i]));
        pthread_mutex_init(&s[i].lock, NULL);
        for (int k = 0; k < TOMBSTONES; k++)
            s[i].dead[k] = SR_NO_CONTEXT;
    }
    box.shards = s;
    box.nshards = n;
    box.rank = rank;
    box.world = world;
    uint64_t first = (uint64_t)(sr__rpc_generation() & 0xffu) << GEN_SHIFT;
    /* relaxed: before any RPC thread exists */
    atomic_store_explicit(&box.next_ctx, first, memory_order_relaxed);
    atomic_store_explicit(&box.next_msg, first, memory_order_relaxed);
    atomic_store_explicit(&box.count, 0, memory_order_relaxed);
    atomic_store_explicit(&sr__dctx_passes, 0, memory_order_relaxed);
    return 0;
}

/* At teardown: no thread of the runtime is left, so the locks are not
 * needed; contexts a pass or a call still holds stay until dropped. */
void sr__dctx_container_fini(void)
{
    for (unsigned i = 0; box.shards && i < box.nshards; i++) {
        struct shard *s = &box.shards[i];
        for (size_t k = 0; k < s->map.cap; k++) {
            sr_dctx *c = s->map.keys[k] ? s->map.vals[k] : NULL;
            sr__dctx_unref(c);
        }
        sr__idmap_free(&s->map);
        pthread_mutex_destroy(&s->lock);
    }
    free(box.shards);
    box.shards = NULL;
    box.nshards = 0;
    atomic_store_explicit(&box.count, 0, memory_order_relaxed); /* relaxed: no runtime thread is left */
    current = SR_NO_CONTEXT;
}

static struct shard *shard_of(int64_t id)
{
    uint64_t h = (uint64_t)id * 0xff51afd7ed558ccdull;
    return &box.shards[(h >> 32) & (box.nshards - 1)];
}

/* Map keys must not be 0, and context ids may be (worker 0's first). */
static uint64_t key_of(int64_t id) { return (uint64_t)id + 1; }

static int next_id(_Atomic uint64_t *counter, const char *who, int64_t *out)
{
    /* relaxed: ids need only be unique */
    uint64_t n = atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
    if (n > COUNTER_MAX)
        return sr__fail(-EOVERFLOW, who, "worker%d ran out of autograd ids: the counter passed %llu", box.rank,
                        (unsigned long long)COUNTER_MAX);
    *out = (int64_t)(((uint64_t)box.rank << COUNTER_BITS) | n);
    return 0;
}

int sr__dctx_next_message_id(int64_t *out) { return next_id(&box.next_msg, "sr_rpc", out); }

static int insert(sr_dctx *c)
{
    struct shard *s = shard_of(c->id);
    pthread_mutex_lock(&s->lock);
    int rc = sr__idmap_put(&s->map, key_of(c->id), c);
    pthread_mutex_unlock(&s->lock);
    if (!rc)
        atomic_fetch_add_explicit(&box.count, 1, memory_order_relaxed); /* relaxed: statistics */
    return rc;
}

int sr__dctx_new(sr_dctx **out)
{
    if (!box.shards)
        return sr__fail(-SR_ESHUTDOWN, "sr_dist_autograd_context_begin", "RPC has not been initialized");
    int64_t id = SR_NO_CONTEXT;
    int rc = next_id(&box.next_ctx, "sr_dist_autograd_context_begin", &id);
    if (rc)
        return rc;
    sr_dctx *c = sr__dctx_alloc(id, box.world);
    if (!c)
        return sr__fail(-ENOMEM, "sr_dist_autograd_context_begin", "out of memory");
    if (insert(c)) {
        sr__dctx_unref(c);
        return sr__fail(-ENOMEM, "sr_dist_autograd_context_begin", "out of memory");
    }
    *out = sr__dctx_ref(c);
    return 0;
}

sr_dctx *sr__dctx_find(int64_t id)
{
    if (!box.shards)
        return NULL;
    struct shard *s = shard_of(id);
    pthread_mutex_lock(&s->lock);
    sr_dctx *c = sr__idmap_get(&s->map, key_of(id));
    if (c)
        sr__dctx_ref(c);
    pthread_mutex_unlock(&s->lock);
    return c;
}

static bool was_released(const struct shard *s, int64_t id)
{
    for (int k = 0; k < TOMBSTONES; k++)
        if (s->dead[k] == id)
            return true;
    return false;
}

sr_dctx *sr__dctx_get_or_create(int64_t id, bool *released)
{
    *released = false;
    if (!box.shards)
        return NULL;
    struct shard *s = shard_of(id);
    pthread_mutex_lock(&s->lock);
    sr_dctx *c = sr__idmap_get(&s->map, key_of(id));
    if (!c && !(*released = was_released(s, id))) {
        c = sr__dctx_alloc(id, box.world);
        if (c && sr__idmap_put(&s->map, key_of(id), c)) {
            sr__dctx_unref(c);
            c = NULL;
        } else if (c) {
            atomic_fetch_add_explicit(&box.count, 1, memory_order_relaxed); /* relaxed: statistics */
        }
    }
    if (c)
        sr__dctx_ref(c);
    pthread_mutex_unlock(&s->lock);
    return c;
}

sr_dctx *sr__dctx_remove(int64_t id)
{
    if (!box.shards)
        return NULL;
    struct shard *s = shard_of(id);
    pthread_mutex_lock(&s->lock);
    sr_dctx *c = sr__idmap_del(&s->map, key_of(id));
    if (!was_released(s, id)) {
        s->dead[s->dead_next] = id;
        s->dead_next = (s->dead_next + 1) % TOMBSTONES;
    }
    pthread_mutex_unlock(&s->lock);
    if (c)
        atomic_fetch_sub_explicit(&box.count, 1, memory_order_relaxed); /* relaxed: statistics */
    return c; /* the container's reference, now the caller's */
}

/* ---- a worker died ---- */

/* References to every context of shard s, in a malloc'd array (*n). */
static sr_dctx **shard_contexts(struct shard *s, size_t *n)
{
    pthread_mutex_lock(&s->lock);
    sr_dctx **cs = malloc((s->map.len ? s->map.len : 1) * sizeof(*cs));
    size_t k = 0;
    for (size_t i = 0; cs && i < s->map.cap; i++)
        if (s->map.keys[i])
            cs[k++] = sr__dctx_ref(s->map.vals[i]);
    pthread_mutex_unlock(&s->lock);
    *n = k;
    return cs;
}

/* Runs before any message of the rank's next generation is taken (the
 * agent handles a death before the return), so every context of the rank
 * here was created by a generation that is gone: nothing will ever release
 * it, and the next generation's ids differ (see the top). No cleanup is
 * sent for those: every survivor releases them the same way. The shard lock
 * is not held while a context's lock is taken (context.h). */
void sr__dist_peer_died(int rank, const char *why)
{
    for (unsigned i = 0; box.shards && i < box.nshards; i++) {
        size_t n = 0;
        sr_dctx **cs = shard_contexts(&box.shards[i], &n);
        for (size_t k = 0; k < n; k++) {
            sr_dctx *c = cs[k];
            sr__dctx_peer_died(c, rank, why);
            if ((int)((uint64_t)c->id >> COUNTER_BITS) == rank) /* theirs, even if it reached us through others */
                sr__dctx_unref(sr__dctx_remove(c->id)); /* remembers the id, for late messages */
            sr__dctx_unref(c);
        }
        free(cs);
    }
}

int64_t sr__dctx_current(void) { return current; }

int64_t sr__dctx_set_current(int64_t id)
{
    int64_t old = current;
    current = id;
    return old;
}

int sr__dctx_not_found(const char *who, int64_t id)
{
    return sr__fail(-EINVAL, who, "Could not find autograd context with id: %lld", (long long)id);
}

int sr__dctx_check(const char *who, int64_t id)
{
    sr_dctx *c = sr__dctx_find(id);
    int rc = c ? sr__dctx_check_alive(c, who) : sr__dctx_not_found(who, id);
    sr__dctx_unref(c);
    return rc;
}

int sr__dctx_accumulate_grad(int64_t id, sr_tensor *leaf, sr_tensor *grad)
{
    bool released;
    sr_dctx *c = sr__dctx_get_or_create(id, &released);
    if (!c)
        return released ? sr__dctx_not_found("sr__dctx_accumulate_grad", id)
                        : sr__fail(-ENOMEM, "sr__dctx_accumulate_grad", "out of memory for autograd context %lld",
                                   (long long)id);
    int rc = c->sink.accumulate(&c->sink, leaf, grad);
    sr__dctx_unref(c);
    return rc;
}

/* ---- the public calls ---- */

SR_API int sr_dist_autograd_context_begin(int64_t *context_id)
{
    if (!context_id)
        return sr__fail(-EINVAL, "sr_dist_autograd_context_begin", "context_id is NULL");
    if (current != SR_NO_CONTEXT)
        return sr__fail(-EINVAL, "sr_dist_autograd_context_begin",
                        "Already have an autograd context id for this thread (%lld)", (long long)current);
    sr_dctx *c;
    int rc = sr__dctx_new(&c);
    if (rc)
        return rc;
    current = c->id;
    *context_id = c->id;
    sr__dctx_unref(c);
    return 0;
}

SR_API int sr_dist_autograd_context_end(int64_t context_id)
{
    sr_dctx *c = sr__dctx_find(context_id);
    if (!c)
        return sr__dctx_not_found("sr_dist_autograd_context_end", context_id);
    if (current == context_id)
        current = SR_NO_CONTEXT;
    sr__dist_release(c, -1);
    sr__dctx_unref(c);
    return 0;
}

SR_API int64_t sr_dist_autograd_current_context(void) { return current; }

SR_API bool sr_dist_autograd_is_valid_context(int64_t context_id)
{
    sr_dctx *c = sr__dctx_find(context_id);
    sr__dctx_unref(c);
    return c != NULL;
}

SR_API int64_t sr_dist_autograd_max_id(void)
{
    return (int64_t)(((uint64_t)(box.rank > 0 ? box.rank : 0) << COUNTER_BITS) | COUNTER_MAX);
}

SR_API int sr_dist_autograd_debug_info_get(sr_dist_autograd_debug_info *out)
{
    if (!out)
        return sr__fail(-EINVAL, "sr_dist_autograd_debug_info_get", "out is NULL");
    /* relaxed: a snapshot of statistics */
    out->num_current_backward_passes = (uint64_t)atomic_load_explicit(&sr__dctx_passes, memory_order_relaxed);
    out->num_autograd_contexts = (uint64_t)atomic_load_explicit(&box.count, memory_order_relaxed);
    return 0;
}
