/* SPDX-License-Identifier: MIT */
/* Tensor objects, storages and copy-on-write. See tensor_impl.h. */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/engine.h"
#include "atomics.h"
#include "error.h"
#include "log.h"
#include "tensor_impl.h"

SR_API const char *sr_dtype_name(sr_dtype dt)
{
    switch (dt) {
    case SR_F32: return "f32";
    case SR_F64: return "f64";
    case SR_I64: return "i64";
    }
    return "?";
}

SR_API size_t sr_dtype_size(sr_dtype dt)
{
    switch (dt) {
    case SR_F32: return 4;
    case SR_F64: return 8;
    case SR_I64: return 8;
    }
    return 0;
}

int64_t sr__numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

void sr__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 1 ? shape[i] : 1;
    }
}

struct sr_storage *sr__storage_new(sr_block *block)
{
    void *data;
    size_t nbytes;
    if (sr__block_check(block, &data, &nbytes))
        return NULL;
    struct sr_storage *s = malloc(sizeof(*s));
    if (!s) {
        sr__fail(-ENOMEM, "sr__storage_new", "out of memory");
        return NULL;
    }
    atomic_init(&s->refs, 1);
    atomic_init(&s->lock, 0);
    s->block = block;
    s->data = data;
    s->nbytes = nbytes;
    return s;
}

void sr__storage_unref(struct sr_storage *s)
{
    /* acq_rel: the last tensor object of this process frees the storage after
     * every other thread's use of it (pairs with the other decrements) */
    if (s && atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1) {
        sr__block_unref(s->block);
        free(s);
    }
}

void sr__storage_lock(struct sr_storage *s)
{
    unsigned spins = 0;
    /* acquire: pairs with the release in sr__storage_unlock, so we see the
     * previous holder's block swap, its writes to the bytes, and the block
     * references it took */
    while (atomic_exchange_explicit(&s->lock, 1, memory_order_acquire)) {
        /* relaxed: only decides when to retry the exchange, which is what
         * synchronises */
        while (atomic_load_explicit(&s->lock, memory_order_relaxed)) {
            if (++spins < 128)
                sr__cpu_relax();
            else
                sched_yield(); /* a long write (a big tensor) or a preempted holder */
        }
    }
}

void sr__storage_unlock(struct sr_storage *s)
{
    /* release: pairs with the acquire exchange in sr__storage_lock */
    atomic_store_explicit(&s->lock, 0, memory_order_release);
}

/* relaxed: a statistic; tests read it on the thread that made the copies */
static _Atomic uint64_t cow_copies;

uint64_t sr__tensor_cow_copies(void) { return atomic_load_explicit(&cow_copies, memory_order_relaxed); }

int sr__storage_make_writable(struct sr_storage *s, const char *fn)
{
    if (sr__block_refcount(s->block) <= 1)
        return 0; /* acquire inside: we see every former holder's writes */
    size_t n = s->nbytes;
    sr_block *copy = sr__block_alloc(n);
    void *data;
    size_t copy_n;
    if (copy && sr__block_check(copy, &data, &copy_n)) {
        sr__block_unref(copy);
        return sr__fail(-EPROTO, fn, "copy-on-write of a %zu-byte storage: a new block's header is corrupt", n);
    }
    if (!copy) {
        char why[256]; /* sr__fail rewrites the buffer sr_last_error() points to */
        snprintf(why, sizeof(why), "%s", sr_last_error());
        return sr__fail(-ENOMEM, fn, "copy-on-write of a %zu-byte storage: %s", n, why);
    }
    memcpy(data, s->data, n);
    sr_block *old = s->block;
    s->block = copy;
    s->data = data;
    sr__block_unref(old);
    /* relaxed: see cow_copies */
    atomic_fetch_add_explicit(&cow_copies, 1, memory_order_relaxed);
    return 0;
}

sr_block *sr__storage_block_ref(struct sr_storage *s, char **data)
{
    sr__storage_lock(s);
    sr_block *b = sr__block_ref(s->block);
    if (data)
        *data = s->data;
    sr__storage_unlock(s);
    return b;
}

uint64_t sr__storage_block_off(struct sr_storage *s)
{
    sr__storage_lock(s);
    uint64_t off = sr__block_to_off(s->block);
    sr__storage_unlock(s);
    return off;
}

int sr__tensor_write_begin(sr_tensor *t, const char *fn)
{
    if (t->requires_grad && sr__grad_mode()) {
        if (!t->grad_fn)
            return sr__fail(-EPERM, fn, "a leaf Variable that requires grad is being used in an in-place "
                                        "operation (use sr_no_grad_enter)");
        return sr__fail(-EPERM, fn, "in-place operations on tensors with a grad_fn are not supported "
                                    "while grad mode is enabled");
    }
    sr__storage_lock(t->storage);
    int rc = sr__storage_make_writable(t->storage, fn);
    if (rc)
        sr__storage_unlock(t->storage);
    return rc;
}

void sr__tensor_write_end(sr_tensor *t) { sr__storage_unlock(t->storage); }

int sr__tensor_prepare_write(sr_tensor *t, const char *fn)
{
    int rc = sr__tensor_write_begin(t, fn);
    if (!rc)
        sr__tensor_write_end(t);
    return rc;
}

/* ---- pins (tensor_impl.h, "Readers pin what they read") ---- */

/* A thread's explicit pins: the storages it pinned and the block it holds for
 * each. Few at a time (an op's inputs, nested at most a couple of levels), so
 * a small array searched from the top. */
enum { PIN_MAX = 16 };
struct pin_entry {
    const struct sr_storage *s;
    sr_block *b; /* one block reference */
    char *data;  /* b's checked data pointer */
    uint32_t n;  /* pins of s by this thread */
};
static _Thread_local struct {
    int n;
    struct pin_entry e[PIN_MAX];
} pins;

static struct pin_entry *pin_find(const struct sr_storage *s)
{
    for (int i = pins.n - 1; i >= 0; i--)
        if (pins.e[i].s == s)
            return &pins.e[i];
    return NULL;
}

sr_block *sr__storage_pinned(const struct sr_storage *s, char **data)
{
    if (pins.n == 0)
        return NULL;
    struct pin_entry *e = pin_find(s);
    if (e && data)
        *data = e->data;
    return e ? e->b : NULL;
}

const char *sr__tensor_pin(const sr_tensor *t)
{
    struct pin_entry *e = pin_find(t->storage);
    if (e) {
        e->n++;
    } else {
        if (pins.n == PIN_MAX) { /* nesting is bounded by the code, so a bug */
            sr_logf(SR_LOG_ERROR, "more than %d tensor pins held by one thread", PIN_MAX);
            abort();
        }
        e = &pins.e[pins.n++];
        e->s = t->storage;
        e->b = sr__storage_block_ref(t->storage, &e->data);
        e->n = 1;
    }
    return e->data + t->offset * (int64_t)sr_dtype_size(t->dtype);
}

void sr__tensor_unpin(const sr_tensor *t)
{
    struct pin_entry *e = pin_find(t->storage);
    if (!e) {
        sr_logf(SR_LOG_ERROR, "sr__tensor_unpin of a storage this thread has not pinned");
        abort();
    }
    if (--e->n)
        return;
    sr__block_unref(e->b);
    *e = pins.e[--pins.n];
}

/* The sources of a write to dst that live in another storage. */
static bool is_source(const sr_tensor *dst, const sr_tensor *const *src, int i)
{
    return src[i] && src[i]->storage != dst->storage;
}

int sr__tensor_write_begin_from(sr_tensor *t, const char *fn, const sr_tensor *const *src, int n)
{
    for (int i = 0; i < n; i++)
        if (is_source(t, src, i))
            sr__tensor_pin(src[i]);
    int rc = sr__tensor_write_begin(t, fn);
    if (rc)
        for (int i = 0; i < n; i++)
            if (is_source(t, src, i))
                sr__tensor_unpin(src[i]);
    return rc;
}

void sr__tensor_write_end_from(sr_tensor *t, const sr_tensor *const *src, int n)
{
    sr__tensor_write_end(t);
    for (int i = 0; i < n; i++)
        if (is_source(t, src, i))
            sr__tensor_unpin(src[i]);
}

bool sr__pin_saved(sr_tensor *const *in, int n)
{
    if (!sr__any_requires_grad(in, (size_t)n))
        return false;
    for (int i = 0; i < n; i++)
        if (in[i])
            sr__tensor_pin(in[i]);
    return true;
}

void sr__unpin_saved(bool pinned, sr_tensor *const *in, int n)
{
    for (int i = 0; pinned && i < n; i++)
        if (in[i])
            sr__tensor_unpin(in[i]);
}

sr_tensor *sr__tensor_snapshot(const sr_tensor *t)
{
    /* the block this thread read t from, if it pinned t (the op saving what
     * its forward read), else t's current one */
    sr_block *b = sr__storage_pinned(t->storage, NULL);
    b = b ? sr__block_ref(b) : sr__storage_block_ref(t->storage, NULL);
    struct sr_storage *s = sr__storage_new(b);
    if (!s) {
        sr__block_unref(b);
        return NULL;
    }
    sr_tensor *u = sr__tensor_wrap(s, t->dtype, t->ndim, t->shape, t->strides, t->offset);
    sr__storage_unref(s); /* u holds it now, or it is freed with its block reference */
    return u;
}

/* Live tensors of this process by dtype, for the shutdown leak check.
 * relaxed (every access): a count, ordered with nothing; the check reads it
 * after the runtime's threads are joined. */
static _Atomic int64_t live_tensors[3];

void sr__tensor_live_counts(int64_t out[3])
{
    for (int i = 0; i < 3; i++)
        out[i] = atomic_load_explicit(&live_tensors[i], memory_order_relaxed);
}

sr_tensor *sr__tensor_wrap(struct sr_storage *s, sr_dtype dt, int ndim, const int64_t *shape,
                           const int64_t *strides, int64_t offset)
{
    sr_tensor *t = calloc(1, sizeof(*t));
    if (!t) {
        sr__fail(-ENOMEM, "sr__tensor_wrap", "out of memory");
        return NULL;
    }
    atomic_init(&t->refcount, 1);
    t->dtype = dt;
    t->ndim = ndim;
    t->offset = offset;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->strides[i] = strides[i];
    }
    /* relaxed: the caller holds a reference to s through another tensor */
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    t->storage = s;
    atomic_fetch_add_explicit(&live_tensors[dt], 1, memory_order_relaxed); /* relaxed: see live_tensors */
    return t;
}

sr_tensor *sr__tensor_new(const char *fn, sr_dtype dt, int ndim, const int64_t *shape)
{
    if (sr__check_dtype(fn, dt) || sr__check_shape(fn, ndim, shape))
        return NULL;
    int64_t numel = sr__numel(ndim, shape);
    sr_block *b = sr__block_alloc((size_t)numel * sr_dtype_size(dt));
    if (!b) {
        char why[256]; /* sr__fail rewrites the buffer sr_last_error() points to */
        snprintf(why, sizeof(why), "%s", sr_last_error());
        sr__fail(-ENOMEM, fn, "cannot allocate %lld elements of %s: %s", (long long)numel, sr_dtype_name(dt), why);
        return NULL;
    }
    struct sr_storage *s = sr__storage_new(b);
    if (!s) {
        sr__block_unref(b);
        return NULL;
    }
    int64_t strides[SR_MAX_DIMS];
    sr__contiguous_strides(ndim, shape, strides);
    sr_tensor *t = sr__tensor_wrap(s, dt, ndim, shape, strides, 0);
    sr__storage_unref(s); /* the tensor holds it now */
    return t;
}

sr_tensor *sr__tensor_alias(const sr_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                            int64_t offset)
{
    return sr__tensor_wrap(t->storage, t->dtype, ndim, shape, strides, offset);
}

SR_API sr_tensor *sr_tensor_ref(sr_tensor *t)
{
    /* relaxed: the caller already holds a reference */
    if (t)
        atomic_fetch_add_explicit(&t->refcount, 1, memory_order_relaxed);
    return t;
}

static void free_hooks(struct sr_hook *h)
{
    while (h) {
        struct sr_hook *next = h->next;
        free(h);
        h = next;
    }
}

SR_API void sr_tensor_unref(sr_tensor *t)
{
    /* acq_rel: the last holder frees after all others' uses (pairs with
     * their decrements) */
    if (!t || atomic_fetch_sub_explicit(&t->refcount, 1, memory_order_acq_rel) != 1)
        return;
    sr__node_unref(t->grad_fn);
    sr_tensor_unref(t->grad);
    free_hooks(t->hooks);
    sr__storage_unref(t->storage);
    atomic_fetch_sub_explicit(&live_tensors[t->dtype], 1, memory_order_relaxed); /* relaxed: see live_tensors */
    free(t);
}

/* Accessors of a NULL tensor: the documented "no value" and -EINVAL in
 * sr_last_error(), never a crash or a pointer made from NULL. */
static bool null_tensor(const sr_tensor *t, const char *fn)
{
    if (t)
        return false;
    sr__fail(-EINVAL, fn, "tensor is NULL");
    return true;
}

SR_API sr_dtype sr_tensor_dtype(const sr_tensor *t)
{
    return null_tensor(t, "sr_tensor_dtype") ? (sr_dtype)-1 : t->dtype;
}

SR_API int sr_tensor_ndim(const sr_tensor *t) { return null_tensor(t, "sr_tensor_ndim") ? -EINVAL : t->ndim; }

SR_API const int64_t *sr_tensor_shape(const sr_tensor *t)
{
    return null_tensor(t, "sr_tensor_shape") ? NULL : t->shape;
}

SR_API const int64_t *sr_tensor_strides(const sr_tensor *t)
{
    return null_tensor(t, "sr_tensor_strides") ? NULL : t->strides;
}

SR_API size_t sr_tensor_numel(const sr_tensor *t)
{
    return null_tensor(t, "sr_tensor_numel") ? 0 : (size_t)sr__numel(t->ndim, t->shape);
}

char *sr__tensor_new_data(sr_tensor *t) { return sr__tensor_ptr(t); }

SR_API const void *sr_tensor_data(const sr_tensor *t)
{
    return null_tensor(t, "sr_tensor_data") ? NULL : sr__tensor_ptr(t);
}

SR_API int64_t sr_tensor_size(const sr_tensor *t, int dim)
{
    if (null_tensor(t, "sr_tensor_size"))
        return -1;
    int d = sr__wrap_dim("sr_tensor_size", dim, t->ndim);
    return d < 0 ? -1 : t->shape[d];
}

SR_API bool sr_tensor_is_contiguous(const sr_tensor *t)
{
    if (null_tensor(t, "sr_tensor_is_contiguous"))
        return false;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] == 1)
            continue;
        if (t->shape[i] == 0)
            return true;
        if (t->strides[i] != expect)
            return false;
        expect *= t->shape[i];
    }
    return true;
}

SR_API bool sr_tensor_shares_storage(const sr_tensor *a, const sr_tensor *b)
{
    return a && b && a->storage == b->storage;
}

SR_API void *sr_tensor_mutable_data(sr_tensor *t)
{
    if (!t || sr__tensor_prepare_write(t, "sr_tensor_mutable_data"))
        return NULL;
    return sr__tensor_ptr(t);
}

SR_API int sr_tensor_to_f64(const sr_tensor *t, double *dst, size_t n)
{
    if (!t || !dst)
        return sr__fail(-EINVAL, "sr_tensor_to_f64", "tensor or destination is NULL");
    size_t numel = sr_tensor_numel(t);
    if (n < numel)
        return sr__fail(-EINVAL, "sr_tensor_to_f64", "destination holds %zu elements, the tensor has %zu", n,
                        numel);
    sr_tensor *dt = sr__tensor_new("sr_tensor_to_f64", SR_F64, t->ndim, t->shape);
    if (!dt)
        return -ENOMEM;
    sr__copy_raw(dt, t);
    memcpy(dst, sr__tensor_ptr(dt), numel * sizeof(double));
    sr_tensor_unref(dt);
    return 0;
}

SR_API double sr_tensor_item(const sr_tensor *t)
{
    if (!t) {
        sr__fail(-EINVAL, "sr_tensor_item", "tensor is NULL");
        return NAN;
    }
    if (sr_tensor_numel(t) != 1) {
        char b[SR_SHAPE_STR];
        sr__fail(-EINVAL, "sr_tensor_item", "a tensor of shape %s has %zu elements, not 1",
                 sr__shape_str(t->ndim, t->shape, b), sr_tensor_numel(t));
        return NAN;
    }
    double v;
    sr__load_f64(&v, sr__tensor_pin(t), 0, 1, t->dtype);
    sr__tensor_unpin(t);
    return v;
}
