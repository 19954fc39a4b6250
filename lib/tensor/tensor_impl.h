/* SPDX-License-Identifier: MIT */
/* Tensor internals shared by lib/tensor and lib/tensor/autograd; private to
 * the tensor layer (the layers above see tensor/tensor_seam.h or tensor/desc.h).
 *
 * Storage and copy-on-write (see tensor.h for the contract):
 *   sr_tensor --(ref)--> sr_storage --(one block ref)--> sr_block (shared heap)
 * All tensor objects of this process that view one storage point to one
 * sr_storage, so `storage->block` may be swapped by a copy-on-write and every
 * local view follows. `storage->refs` counts local tensor objects; the
 * block's own refcount counts storages and in-flight descriptors across all
 * processes. A write needs the block to ourselves: sr__storage_make_writable()
 * clones it when sr__block_refcount(block) > 1.
 *
 * Saved tensors (docs/TENSORS.md, "In-place writes and saved tensors"): a
 * tensor saved for backward gets its OWN storage object over the same block
 * (sr__tensor_snapshot), with its own block reference. A later in-place write
 * to the original then finds the block shared and moves the original (and
 * its views) to a private copy; the saved tensor keeps the forward's values.
 *
 * The write lock (`storage->lock`, a spinlock: sr__storage_lock/unlock).
 * It makes "make writable + write" atomic with respect to anyone who takes a
 * new reference on the storage's block, so that reference sees either the
 * bytes before the write or after it, never a mix:
 *   - writers: every in-place write of a whole op holds it from the
 *     copy-on-write check to the end of the write (sr__tensor_write_begin /
 *     _end: lib/tensor/inplace.c, the optimizers' sr__ox_map_, and through
 *     sr_add_ gradient accumulation into .grad); sr_tensor_mutable_data holds
 *     it only around the copy-on-write (the caller's writes come later);
 *   - block-reference takers: sr__tensor_to_desc (an RPC encode),
 *     sr__tensor_snapshot (a saved tensor), sr__storage_block_off
 *     (sr__tensor_sendable, the codec's sendability check) read `block`
 *     and take their reference under it. If the reference is taken
 *     first, the writer then sees the block shared and copies; if the
 *     writer is first, the reader waits for the write to end.
 *   - readers (pins, below) take it to reference the block they read.
 * Lock order: the storage lock is a leaf among the tensor layer's locks:
 * callers may hold a graph task's lock and sr__acc_lock (task -> acc ->
 * storage), but nothing is acquired under it except the heap's internal
 * locks (sr__block_alloc / sr__block_unref in the copy-on-write) and malloc.
 * Never hold two storage locks at once (an in-place op pins its other
 * operands BEFORE it takes its destination's lock, see below), and never
 * call back into user code under it. Critical sections are one elementwise
 * pass (plus one memcpy on a copy), so waiters spin briefly and then yield.
 *
 * Readers pin what they read. Every op that reads tensor data reads it from
 * a pinned block: it takes the storage lock briefly, a reference on the
 * current block, and remembers the data pointer (a pin); it computes from
 * that pointer and drops the reference at the end. A pinned block has
 * refcount > 1, so a concurrent in-place write copies instead of writing
 * under the reader (make_writable), and the block outlives the snapshots
 * that shared it: the reader sees exactly the values at its pin, never torn,
 * never freed. The chokepoints:
 *   - sr__loop_init / sr__loop_done: every elementwise op, reduction and copy
 *     (sr__map*, sr__binary_into, sr__copy_raw) pins its read operands, once
 *     per storage, for the loop (struct sr_loop holds the references);
 *   - explicit pins, sr__tensor_pin / _unpin, for code that reads without a
 *     loop (matmul, nll_loss, argmax, accuracy, sr_tensor_item). A thread's
 *     explicit pins live in a small thread-local table keyed by storage:
 *     pins of one storage nest and share one block, and a loop run by the
 *     thread reads a storage the thread pinned from that pin (without
 *     locking it again);
 *   - ops that save inputs for backward (mul, div, pow, pow_scalar, the unary
 *     ops saving their input, mm/bmm) pin them for the whole op
 *     (sr__pin_saved), so the snapshot saves the version the forward read;
 *   - in-place writes (sr__tensor_write_begin_from / _end_from): the sources
 *     in other storages are pinned explicitly before the destination's lock
 *     is taken, so the loop under the lock locks nothing; a source in the
 *     destination's own storage is read under the destination's lock from
 *     its writable block (no pin: a pin there would force a copy).
 * Not pinned: written operands (the caller owns them or holds their lock),
 * views (no data is read), snapshots' own reads (nobody writes a snapshot's
 * storage), sr_tensor_data's pointer (the caller's to synchronise). A thread
 * must not write in place a storage it has pinned (the write would copy and
 * the thread's later reads would still see the pinned version).
 *
 * Who writes what:
 *   refs     atomic; any thread holding a tensor of the storage.
 *   lock     atomic; sr__storage_lock/unlock.
 *   block    only sr__storage_make_writable, under the lock. Readers read
 *            it under the lock and take a block reference (encodes,
 *            snapshots, pins); only a written operand (owned or locked by
 *            its writer) and sr_tensor_data read it unlocked.
 *   the bytes of the block: only the holder of the lock, after
 *            make_writable found (or made) the block private to this storage
 *            (and sr_tensor_mutable_data's caller, after it).
 *   a tensor's dtype, geometry and storage pointer: written once, when it
 *            is made; its autograd fields: see struct sr_tensor.
 */
#ifndef SR_LIB_TENSOR_IMPL_H
#define SR_LIB_TENSOR_IMPL_H

#if !defined(SR__IN_TENSOR)
#error "tensor_impl.h is private to the tensor layer (docs/ARCHITECTURE.md)"
#endif
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "heap.h"
#include "shmrpc/tensor.h"
#include "tensor_seam.h"

typedef struct sr_node sr_node;
struct sr_hook;

struct sr_storage {
    _Atomic uint32_t refs; /* local tensor objects viewing this storage */
    _Atomic uint32_t lock; /* the write lock: 0 free, 1 held (see the top of this file) */
    sr_block *block;       /* holds one block reference; swapped under the lock */
    /* block's data and size, checked (sr__block_check) when block is set and
     * written with it. The block header is shared memory that a faulty peer
     * could scribble on; these private copies are what every read and write
     * of the tensor layer uses, so a corrupted header is an error when a
     * storage is made over it, and never a wild pointer later. */
    char *data;
    size_t nbytes;
};

struct sr_tensor {
    _Atomic uint32_t refcount;
    sr_dtype dtype;
    int ndim;
    int64_t offset; /* in elements, from the start of the block's data */
    int64_t shape[SR_MAX_DIMS];
    int64_t strides[SR_MAX_DIMS]; /* in elements, >= 0 */
    struct sr_storage *storage;

    /* autograd metadata; written by the thread that builds or runs the graph */
    bool requires_grad;
    uint32_t output_nr;       /* which output of grad_fn this tensor is */
    sr_node *grad_fn;         /* owned; NULL for a leaf */
    sr_node *grad_acc;        /* weak: the leaf's AccumulateGrad, guarded by sr__acc_lock */
    sr_tensor *grad;          /* owned */
    struct sr_hook *hooks;    /* leaf hooks, run by AccumulateGrad */
};

struct sr_hook {
    sr_tensor_hook_fn fn;
    void *arg;
    struct sr_hook *next;
};

/* ---- core (tensor.c) ---- */
/* A tensor object over storage s (takes a storage ref), no autograd state. */
sr_tensor *sr__tensor_wrap(struct sr_storage *s, sr_dtype dt, int ndim, const int64_t *shape,
                           const int64_t *strides, int64_t offset);
/* A view of t's storage with another geometry (shares storage, no history). */
sr_tensor *sr__tensor_alias(const sr_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                            int64_t offset);
/* Adopts one block ref. NULL on -ENOMEM, or -EPROTO if the block's header
 * fails sr__block_check (the caller keeps its reference then). */
struct sr_storage *sr__storage_new(sr_block *block);
void sr__storage_unref(struct sr_storage *s);
/* The write lock (see the top of this file). */
void sr__storage_lock(struct sr_storage *s);
void sr__storage_unlock(struct sr_storage *s);
/* Copy-on-write: make the block private to this storage. The caller holds
 * s's lock. */
int sr__storage_make_writable(struct sr_storage *s, const char *fn);
/* A new reference on s's current block, taken under the lock; *data (if
 * not NULL) gets its checked data pointer, read under the same lock. */
sr_block *sr__storage_block_ref(struct sr_storage *s, char **data);
/* sr__block_to_off of s's current block, read under the lock. */
uint64_t sr__storage_block_off(struct sr_storage *s);
/* An in-place write of t: check grad mode (-EPERM), take the storage lock,
 * make the storage writable. On 0 the caller writes, then calls
 * sr__tensor_write_end(t); on error the lock is not held. */
int sr__tensor_write_begin(sr_tensor *t, const char *fn);
void sr__tensor_write_end(sr_tensor *t);
/* write_begin + write_end: make t writable for writes that follow later
 * (sr_tensor_mutable_data), without holding the lock across them. */
int sr__tensor_prepare_write(sr_tensor *t, const char *fn);
/* The block this thread pinned for s, or NULL (not referenced again);
 * *data (if not NULL) gets its checked data pointer. */
sr_block *sr__storage_pinned(const struct sr_storage *s, char **data);
/* An op that saves inputs for backward pins them from before its forward
 * reads them to after it saved them, so that what it saves is what it read
 * (sr__tensor_snapshot takes the pinned block). Pins in[0..n) (NULL entries
 * skipped) only if the op records history; pass the result to unpin. */
bool sr__pin_saved(sr_tensor *const *in, int n);
void sr__unpin_saved(bool pinned, sr_tensor *const *in, int n);
/* Copy-on-write copies made by this process so far (a statistic for tests
 * and benchmarks). */
uint64_t sr__tensor_cow_copies(void);
static inline char *sr__tensor_ptr(const sr_tensor *t)
{
    return t->storage->data + t->offset * (int64_t)sr_dtype_size(t->dtype);
}
void sr__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);

/* ---- shapes and errors (shape.c; the rest in seam.h) ---- */
int sr__check_shape(const char *fn, int ndim, const int64_t *shape);
/* Broadcast two shapes into out (ndim *out_ndim); -EINVAL naming fn and both shapes. */
int sr__broadcast_shapes(const char *fn, int na, const int64_t *sa, int nb, const int64_t *sb, int *out_ndim,
                         int64_t *out);
/* Strides (in elements) that read t as if it had shape [ndim] by broadcasting. */
void sr__broadcast_strides(const sr_tensor *t, int ndim, const int64_t *shape, int64_t *strides);

/* ---- strided loops (loop.c) ---- */
#define SR_LOOP_MAX_OPS 4
struct sr_loop {
    int ndim;
    int nops;
    int64_t shape[SR_MAX_DIMS];
    char *base[SR_LOOP_MAX_OPS];
    int64_t stride[SR_LOOP_MAX_OPS][SR_MAX_DIMS]; /* in bytes */
    int nheld;                                    /* the read operands' pins the loop took */
    const struct sr_storage *held_storage[SR_LOOP_MAX_OPS];
    sr_block *held[SR_LOOP_MAX_OPS];              /* one block reference each */
    char *held_data[SR_LOOP_MAX_OPS];             /* their checked data pointers */
};
typedef void (*sr_inner_fn)(char **ptrs, const int64_t *strides, int64_t n, void *ctx);
/* Operand i: tensor ts[i] through broadcast strides over shape. Operands
 * [0, nout) are written: the caller owns them or holds their write lock. The
 * others are read, from a pinned block ("Readers pin what they read" at the
 * top of this file): the thread's own pin of the storage if it has one, the
 * current block if a written operand shares the storage, else a pin the loop
 * takes here and drops in sr__loop_done (which every init must be paired
 * with). So never init a loop holding a storage lock other than a written
 * operand's, unless its read operands are pinned already. */
void sr__loop_init(struct sr_loop *L, int ndim, const int64_t *shape, int nops, int nout,
                   const sr_tensor *const *ts);
void sr__loop_run(struct sr_loop *L, sr_inner_fn fn, void *ctx);
void sr__loop_done(struct sr_loop *L);
/* Elements as int64 (n at a time, byte stride; doubles: seam.h). */
void sr__load_i64(int64_t *dst, const char *src, int64_t stride, int64_t n, sr_dtype dt);
void sr__store_i64(char *dst, int64_t stride, const int64_t *src, int64_t n, sr_dtype dt);
/* dst (written through COW by the caller) = src broadcast to dst's shape. */
void sr__copy_raw(sr_tensor *dst, const sr_tensor *src);

/* ---- helpers used by ops ---- */
/* Sum g over broadcast dims so that it has `shape` (g itself, new ref, if equal). */
sr_tensor *sr__sum_to(sr_tensor *g, int ndim, const int64_t *shape);
/* Tensors with the same dtype as t: filled with v. */
sr_tensor *sr__full_like(const sr_tensor *t, double v);

/* Op spans (tensor_seam.h, "op spans"): SR_OP_SPAN("matmul"); as the first
 * statement of a public op's body calls the registered begin hook now and
 * its end hook when the body returns (a cleanup attribute). */
extern _Atomic(const sr_op_hooks *) sr__op_hooks;
struct sr_op_scope {
    const sr_op_hooks *h; /* NULL: no span */
    const char *op;
    int64_t token;
};
static inline struct sr_op_scope sr__op_scope_begin(const char *op)
{
    /* acquire: pairs with the release in sr__tensor_op_hooks_set (the hooks' table is complete) */
    const sr_op_hooks *h = atomic_load_explicit(&sr__op_hooks, memory_order_acquire);
    if (__builtin_expect(h == NULL, 1))
        return (struct sr_op_scope){0};
    return (struct sr_op_scope){.h = h, .op = op, .token = h->begin(op)};
}
static inline void sr__op_scope_end(struct sr_op_scope *s)
{
    if (__builtin_expect(s->h != NULL, 0))
        s->h->end(s->op, s->token);
}
#define SR_OP_SPAN(name) \
    __attribute__((cleanup(sr__op_scope_end), unused)) struct sr_op_scope sr__op_scope_ = sr__op_scope_begin(name)

#endif
