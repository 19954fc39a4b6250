/* SPDX-License-Identifier: MIT */
/* In-place writes and saved tensors (docs/TENSORS.md, "In-place writes and
 * saved tensors"), and in-place writes against concurrent encodes.
 *
 * Suite `snapshot`: a tensor saved for backward keeps the values of its
 * forward when the original is then written in place; the gradient is the
 * one of the pre-update values; views of the original follow its move; no
 * copy happens when nothing is saved; the old block is freed with the graph.
 *
 * Suite `torn`: one thread encodes a large tensor (sr__tensor_to_desc +
 * sr__tensor_from_desc, or takes a snapshot as autograd saves it) while
 * another fills it with k, k = 1, 2, ...; every snapshot must be uniform.
 * The rounds are handshaken so that each write starts in place and the
 * reader takes its reference while the write is visibly under way, which
 * without the storage's write lock yields torn snapshots (checked by hand:
 * with sr__storage_lock/unlock made no-ops, both tests fail in every run,
 * with a torn snapshot in 30 to 32 of the 32 rounds).
 *
 * (The codec's unwinding of a failed encode after such a write is the RPC
 * layer's: tests/rpc/test_value.c, suite codec_unwind.)
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "autograd/engine.h"
#include "common.h"
#include "heap.h"
#include "segment.h"
#include "shmrpc/value.h"
#include "desc.h"
#include "tensor_impl.h"
#include "tensor_util.h"

LEAK_CHECKED_SUITE(snapshot);
LEAK_CHECKED_SUITE(torn);

static sr_segment heap_seg; /* Criterion runs each test in its own process */

/* A one-worker segment whose heap this process attaches: tensors made from
 * now on live in the shared heap (they can be encoded, and the heap's
 * counters see their blocks). */
static void heap_up(void)
{
    sr_segment_opts o = {.world_size = 1,
                         .size = sr__segment_fixed_size(1, 0) + (256u << 20),
                         .name = test_ns("snapshot")};
    cr_assert_eq(sr__segment_create(&o, &heap_seg), 0, "%s", sr_last_error());
    cr_assert_eq(sr__heap_attach(&heap_seg, 0), 0, "sr__heap_attach: %s", sr_last_error());
}

static void heap_down(void)
{
    sr__heap_detach();
    sr__segment_detach(&heap_seg, true);
}

static void unref_all(sr_tensor **ts, int n)
{
    for (int i = 0; i < n; i++)
        sr_tensor_unref(ts[i]);
}

static void no_grad_add_(sr_tensor *t, sr_tensor *other, double alpha)
{
    bool prev = sr_no_grad_enter();
    cr_assert_eq(sr_add_(t, other, alpha), 0, "%s", sr_last_error());
    sr_no_grad_exit(prev);
}

Test(snapshot, a_saved_tensor_keeps_its_values_after_an_in_place_update)
{
    sr_tensor *x = tu_tensor(SR_F64, 1, SHAPE(2), VALS(3, 4), SR_REQUIRES_GRAD);
    sr_tensor *w = tu_tensor(SR_F64, 1, SHAPE(2), VALS(1, 2), 0);
    sr_tensor *y = sr_mul(x, w), *l = sr_sum(y);
    sr_block *forward_block = w->storage->block;
    uint64_t copies = sr__tensor_cow_copies();
    bool prev = sr_no_grad_enter();
    cr_assert_eq(sr_mul_scalar_(w, 10), 0, "%s", sr_last_error());
    sr_no_grad_exit(prev);
    cr_assert_eq(sr__tensor_cow_copies(), copies + 1, "the write copied once");
    cr_assert_neq(w->storage->block, forward_block, "the original moved to a private copy");
    tu_expect(w, VALS(10, 20), 2, 0, 0, "the original has the update");
    cr_assert_eq(sr_backward(l, true), 0, "no in-place error: %s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(1, 2), 2, 0, 0, "d(x*w)/dx is the forward's w");
    /* Saved again by a pass after the update: the same gradient, still. */
    cr_assert_eq(sr_backward(l, false), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(2, 4), 2, 0, 0, "retain_graph: the second pass sees the same w");
    sr_tensor *ts[] = {x, w, y, l};
    unref_all(ts, 4);
}

/* h = x @ W, loss = sum(tanh(h) * h): every saved tensor depends on W. */
static sr_tensor *mlp_loss(sr_tensor *x, sr_tensor *w)
{
    sr_tensor *h = sr_matmul(x, w), *a = sr_tanh(h), *p = sr_mul(a, h), *l = sr_sum(p);
    sr_tensor_unref(h);
    sr_tensor_unref(a);
    sr_tensor_unref(p);
    cr_assert(l, "%s", sr_last_error());
    return l;
}

Test(snapshot, the_gradient_is_the_one_of_the_pre_update_weights)
{
    sr_manual_seed(7);
    sr_tensor *x = sr_randn(SR_F64, 2, SHAPE(4, 3), 0), *w = sr_randn(SR_F64, 2, SHAPE(3, 2), SR_REQUIRES_GRAD);
    bool prev = sr_no_grad_enter();
    sr_tensor *w0 = sr_clone(w), *step = sr_randn(SR_F64, 2, SHAPE(3, 2), 0);
    sr_no_grad_exit(prev);
    cr_assert_eq(sr_tensor_set_requires_grad(w0, true), 0);
    /* Reference: the gradient at the pre-update weights, with no update. */
    sr_tensor *l0 = mlp_loss(x, w0);
    cr_assert_eq(sr_backward(l0, false), 0, "%s", sr_last_error());
    double want[6], before[6], s[6];
    cr_assert_eq(sr_tensor_to_f64(sr_tensor_grad(w0), want, 6), 0);
    cr_assert_eq(sr_tensor_to_f64(w, before, 6), 0);
    cr_assert_eq(sr_tensor_to_f64(step, s, 6), 0);
    /* Forward, then an optimizer-like step on W in place, then backward. */
    sr_tensor *l = mlp_loss(x, w);
    no_grad_add_(w, step, -0.5);
    cr_assert_eq(sr_backward(l, false), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(w), want, 6, 0, 0, "exactly the gradient of the forward's weights");
    double updated[6];
    for (int i = 0; i < 6; i++)
        updated[i] = before[i] - 0.5 * s[i];
    tu_expect(w, updated, 6, 0, 0, "and W holds the update");
    sr_tensor *ts[] = {x, w, w0, step, l0, l};
    unref_all(ts, 6);
}

Test(snapshot, views_of_the_original_follow_its_move)
{
    sr_tensor *x = sr_ones(SR_F64, 2, SHAPE(2, 3), SR_REQUIRES_GRAD);
    sr_tensor *w = tu_tensor(SR_F64, 2, SHAPE(2, 3), VALS(1, 2, 3, 4, 5, 6), 0);
    sr_tensor *row = sr_narrow(w, 0, 1, 1), *wt = sr_t(w);
    sr_tensor *y = sr_mul(x, w), *l = sr_sum(y);
    bool prev = sr_no_grad_enter();
    cr_assert_eq(sr_fill_(row, 9), 0, "a write through a view: %s", sr_last_error());
    sr_no_grad_exit(prev);
    cr_assert(sr_tensor_shares_storage(w, row) && sr_tensor_shares_storage(w, wt), "views still alias");
    tu_expect(w, VALS(1, 2, 3, 9, 9, 9), 6, 0, 0, "the base sees the view's write");
    tu_expect(wt, VALS(1, 9, 2, 9, 3, 9), 6, 0, 0, "and so does another view");
    cr_assert_eq(sr_fill_(wt, -1), 0, "no saved holder left on the copy");
    tu_expect(row, VALS(-1, -1, -1), 3, 0, 0, "writes through any view reach all of them");
    cr_assert_eq(sr_backward(l, false), 0, "%s", sr_last_error());
    tu_expect(sr_tensor_grad(x), VALS(1, 2, 3, 4, 5, 6), 6, 0, 0, "the saved w is the forward's");
    sr_tensor *ts[] = {x, w, row, wt, y, l};
    unref_all(ts, 6);
}

Test(snapshot, no_copy_when_nothing_is_saved)
{
    sr_tensor *x = sr_ones(SR_F32, 1, SHAPE(8), 0), *w = sr_ones(SR_F32, 1, SHAPE(8), SR_REQUIRES_GRAD);
    sr_block *b = w->storage->block;
    uint64_t copies = sr__tensor_cow_copies();
    /* 1. A whole training step: forward, backward (frees the saved
     * tensors), then the update. */
    sr_tensor *y = sr_mul(x, w), *l = sr_sum(y);
    cr_assert_eq(sr_backward(l, false), 0, "%s", sr_last_error());
    no_grad_add_(w, sr_tensor_grad(w), -0.1);
    cr_assert_eq(w->storage->block, b, "written in place");
    /* 2. A graph still alive but with nothing saved on w (add saves nothing). */
    sr_tensor *z = sr_add(x, w), *lz = sr_sum(z);
    no_grad_add_(w, x, 1.0);
    cr_assert_eq(w->storage->block, b, "nothing of w was saved");
    /* 3. A forward under no_grad records nothing. */
    bool prev = sr_no_grad_enter();
    sr_tensor *q = sr_mul(x, w);
    cr_assert_eq(sr_mul_scalar_(w, 2), 0);
    sr_no_grad_exit(prev);
    cr_assert_eq(w->storage->block, b, "no graph, no snapshot");
    /* 4. A graph dropped before the update. */
    sr_tensor *y2 = sr_mul(x, w), *l2 = sr_sum(y2);
    sr_tensor_unref(l2);
    sr_tensor_unref(y2);
    no_grad_add_(w, x, 1.0);
    cr_assert_eq(w->storage->block, b, "the snapshot went with its graph");
    cr_assert_eq(sr__tensor_cow_copies(), copies, "no copy at all");
    sr_tensor *ts[] = {x, w, y, l, z, lz, q};
    unref_all(ts, 7);
}

Test(snapshot, the_old_block_is_freed_with_the_graph, .init = heap_up, .fini = heap_down)
{
    sr_tensor *x = sr_ones(SR_F32, 1, SHAPE(1024), SR_REQUIRES_GRAD), *w = sr_ones(SR_F32, 1, SHAPE(1024), 0);
    cr_assert_neq(sr__block_to_off(w->storage->block), (uint64_t)-1, "in the shared heap");
    sr_heap_counters c0, c1, c2, c3;
    for (int round = 0; round < 2; round++) {
        /* round 0: the graph is dropped unused; round 1: backward frees it */
        sr_tensor *y = sr_mul(x, w), *l = sr_sum(y);
        sr_block *forward_block = w->storage->block;
        cr_assert_eq(sr__block_refcount(forward_block), 2, "w and its snapshot");
        sr__heap_counters_get(&c0);
        no_grad_add_(w, x, 1.0);
        sr__heap_counters_get(&c1);
        cr_assert_eq(c1.allocs, c0.allocs + 1, "one copy");
        cr_assert_eq(c1.local_frees, c0.local_frees, "the forward's block is still saved");
        cr_assert_eq(sr__block_refcount(forward_block), 1, "held by the snapshot alone");
        if (round == 0) {
            sr_tensor_unref(l);
            sr_tensor_unref(y);
            sr__heap_counters_get(&c2);
            cr_assert_eq(c2.local_frees, c1.local_frees + 1 + 1 + 1,
                         "the snapshot's block, y's and l's (x's snapshot only dropped a reference)");
        } else {
            cr_assert_eq(sr_backward(l, false), 0, "%s", sr_last_error());
            sr__heap_counters_get(&c2);
            cr_assert_geq(c2.local_frees, c1.local_frees + 1, "backward released the snapshot's block");
            sr_tensor_unref(l);
            sr_tensor_unref(y);
        }
    }
    sr_tensor_unref(x);
    sr_tensor_unref(w);
    sr__heap_counters_get(&c3);
    cr_assert_eq(c3.allocs, c3.local_frees, "every block of the test was freed");
}

/* ---- torn reads ---------------------------------------------------------- */

enum { TORN_N = 4 << 20, TORN_ROUNDS = 32 };

struct torn {
    sr_tensor *t;
    bool snapshot;            /* reader: sr__tensor_snapshot instead of to_desc/from_desc */
    _Atomic int started;      /* writer: round k's fill is about to start */
    _Atomic int acked;        /* reader: done with round k, holds no reference */
    int torn, taken, seen; /* reader's counts (seen: rounds caught mid-write), read after join */
};

static float at(const sr_tensor *u, int64_t i) { return ((const float *)sr_tensor_data(u))[i]; }

/* A reference on t's bytes as the reader sees them: by message or as saved. */
static sr_tensor *take(struct torn *s)
{
    if (s->snapshot)
        return sr__tensor_snapshot(s->t);
    struct sr_tensor_desc d;
    sr_tensor *u = NULL;
    cr_assert_eq(sr__tensor_to_desc(s->t, &d), 0, "%s", sr_last_error());
    cr_assert_eq(sr__tensor_from_desc(&d, &u), 0, "%s", sr_last_error());
    sr__tensor_desc_release(&d);
    return u;
}

/* Uniform: the last element first (the fill writes from the front), then
 * the first, then every step-th. */
static bool uniform(const sr_tensor *u, int64_t step)
{
    float v = at(u, TORN_N - 1);
    if (at(u, 0) != v)
        return false;
    for (int64_t i = 1; i < TORN_N; i += step)
        if (at(u, i) != v)
            return false;
    return true;
}

static void *torn_reader(void *arg)
{
    struct torn *s = arg;
    for (int k = 1; k <= TORN_ROUNDS; k++) {
        /* acquire: pairs with the writer's release store of started */
        while (atomic_load_explicit(&s->started, memory_order_acquire) < k)
            sched_yield();
        /* Take references until one shows the first element at k, i.e. the
         * write has visibly begun (without the lock the take then lands in
         * the middle of it), or the write is over. Bounded: the write ends. */
        for (;;) {
            sr_tensor *u = take(s);
            cr_assert(u, "%s", sr_last_error());
            s->taken++;
            bool seen = at(u, 0) == (float)k;
            if (seen || at(u, TORN_N - 1) == (float)k) {
                s->torn += !uniform(u, 1);
                s->seen += seen;
                sr_tensor_unref(u);
                break;
            }
            /* Sampled (every 4093rd element): a full scan would hold the
             * reference for milliseconds, so the write would copy instead
             * of writing in place, and the test would lose its teeth. */
            s->torn += !uniform(u, 4093);
            sr_tensor_unref(u);
        }
        /* release: the writer's next round starts after our reference went */
        atomic_store_explicit(&s->acked, k, memory_order_release);
    }
    return NULL;
}

static void run_torn(bool snapshot)
{
    int64_t n = TORN_N;
    struct torn s = {.t = sr_zeros(SR_F32, 1, &n, 0), .snapshot = snapshot};
    cr_assert(s.t, "%s", sr_last_error());
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, torn_reader, &s), 0);
    for (int k = 1; k <= TORN_ROUNDS; k++) {
        /* acquire: pairs with the reader's release of acked: its references
         * of round k - 1 are gone, so this fill starts in place */
        while (atomic_load_explicit(&s.acked, memory_order_acquire) < k - 1)
            sched_yield();
        /* release: pairs with the reader's acquire load of started */
        atomic_store_explicit(&s.started, k, memory_order_release);
        cr_assert_eq(sr_fill_(s.t, k), 0, "%s", sr_last_error());
    }
    pthread_join(th, NULL);
    cr_assert_eq(s.torn, 0, "%d of %d snapshots mixed two writes (%d of %d rounds caught mid-write)", s.torn,
                 s.taken, s.seen, TORN_ROUNDS);
    cr_assert_geq(s.taken, TORN_ROUNDS, "at least one reference per write");
    double last = (double)TORN_ROUNDS;
    cr_assert_eq(at(s.t, 0), last);
    cr_assert_eq(at(s.t, TORN_N - 1), last);
    sr_tensor_unref(s.t);
}

Test(torn, an_encode_never_sees_half_of_an_in_place_write, .init = heap_up, .fini = heap_down, .timeout = 120)
{
    run_torn(false);
}

Test(torn, a_snapshot_never_sees_half_of_an_in_place_write, .init = heap_up, .fini = heap_down, .timeout = 120)
{
    run_torn(true);
}
