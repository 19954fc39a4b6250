/* Tensor internals shared by lib/tensor and lib/autograd.
 *
 * Storage and copy-on-write (see tensor.h for the contract):
 *   sr_tensor --(ref)--> sr_storage --(one block ref)--> sr_block (shared heap)
 * All tensor objects of this process that view one storage point to one
 * sr_storage, so `storage->block` may be swapped by a copy-on-write and every
 * local view follows. `storage->refs` counts local tensor objects; the
 * block's own refcount counts storages and in-flight descriptors across all
 * processes. A write needs the block to ourselves: sr__storage_make_writable()
 * clones it when sr_block_refcount(block) > 1.
 *
 * Threads: refs and version are atomics; `block` is swapped only by a writer,
 * which must already exclude concurrent readers of the same storage (tensor.h
 * "Threads").
 */
#ifndef SR_LIB_TENSOR_IMPL_H
#define SR_LIB_TENSOR_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "heap.h"
#include "shmrpc/tensor.h"

typedef struct sr_node sr_node;
struct sr_hook;

struct sr_storage {
    _Atomic uint32_t refs;    /* local tensor objects viewing this storage */
    _Atomic uint32_t version; /* bumped by every in-place write; saved tensors compare it */
    sr_block *block;          /* holds one block reference */
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
/* A new contiguous tensor with fresh uninitialised storage; fn names the caller in errors. */
sr_tensor *sr__tensor_new(const char *fn, sr_dtype dt, int ndim, const int64_t *shape);
/* A view of t's storage with another geometry (shares storage, no history). */
sr_tensor *sr__tensor_alias(const sr_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                            int64_t offset);
struct sr_storage *sr__storage_new(sr_block *block); /* adopts one block ref */
void sr__storage_unref(struct sr_storage *s);
/* Copy-on-write: make the block private to this storage, bump the version. */
int sr__storage_make_writable(struct sr_storage *s, const char *fn);
int sr__tensor_prepare_write(sr_tensor *t, const char *fn);
static inline char *sr__tensor_ptr(const sr_tensor *t)
{
    return (char *)sr_block_data(t->storage->block) + t->offset * (int64_t)sr_dtype_size(t->dtype);
}
int64_t sr__numel(int ndim, const int64_t *shape);
void sr__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);

/* ---- shapes and errors (shape.c) ---- */
#define SR_SHAPE_STR 160
const char *sr__shape_str(int ndim, const int64_t *shape, char *buf);
int sr__check_shape(const char *fn, int ndim, const int64_t *shape);
int sr__check_dtype(const char *fn, sr_dtype dt);
int sr__check_same_dtype(const char *fn, const sr_tensor *a, const sr_tensor *b);
int sr__check_float(const char *fn, const sr_tensor *a);
bool sr__same_shape(const sr_tensor *a, const sr_tensor *b);
/* Normalise a possibly negative dim into [0, ndim); -EINVAL naming fn. */
int sr__wrap_dim(const char *fn, int dim, int ndim);
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
};
typedef void (*sr_inner_fn)(char **ptrs, const int64_t *strides, int64_t n, void *ctx);
/* Operand i: tensor ts[i] read through broadcast strides over shape. */
void sr__loop_init(struct sr_loop *L, int ndim, const int64_t *shape, int nops, const sr_tensor *const *ts);
void sr__loop_run(struct sr_loop *L, sr_inner_fn fn, void *ctx);
/* Elements as doubles / int64 (n at a time, byte stride). */
void sr__load_f64(double *dst, const char *src, int64_t stride, int64_t n, sr_dtype dt);
void sr__store_f64(char *dst, int64_t stride, const double *src, int64_t n, sr_dtype dt);
void sr__load_i64(int64_t *dst, const char *src, int64_t stride, int64_t n, sr_dtype dt);
void sr__store_i64(char *dst, int64_t stride, const int64_t *src, int64_t n, sr_dtype dt);
/* dst (written through COW by the caller) = src broadcast to dst's shape. */
void sr__copy_raw(sr_tensor *dst, const sr_tensor *src);

/* ---- helpers used by ops ---- */
/* Sum g over broadcast dims so that it has `shape` (g itself, new ref, if equal). */
sr_tensor *sr__sum_to(sr_tensor *g, int ndim, const int64_t *shape);
/* Tensors with the same dtype as t: filled with v. */
sr_tensor *sr__full_like(const sr_tensor *t, double v);

#endif
