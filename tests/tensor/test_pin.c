/* SPDX-License-Identifier: MIT */
/* Readers pin what they read (lib/tensor/tensor_impl.h, "Readers pin what
 * they read"; docs/TENSORS.md, "In-place writes and saved tensors").
 *
 * Suite `pin`: the mechanics, on one thread: pins nest and share one block,
 * an op's pins are gone when it returns, an op reading one storage twice
 * reads one version of it, an op saves for backward the version its forward
 * read, and the pins cost no copy where none is due (an
 * in-place op reading its own storage, an optimizer-style update).
 *
 * Suite `pinned_reads`: a reader thread computes sr_mul_scalar(W, 1),
 * sr_sum(W), sr_mm(x, W), sr_copy_(dst, W) and sr_sum(sr_mul(x, W)) with its
 * backward (whose gradient must come from the W the forward read) on a 4 MiB
 * W over and over,
 * while the main thread fills W with k in place, k = 1, 2, ...: on odd rounds
 * while a snapshot of W (what autograd saves for a pending backward) holds
 * W's block, so the fill moves W to a copy and the snapshot, released right
 * after, was the last holder of the block the reader is in; on even rounds
 * with nothing else holding the block, so the fill writes in place. Every
 * result must be one k throughout. Each round starts when the reader has
 * just begun an op (a handshake, no sleeps), and a freshly filled tensor of
 * -1s then takes the freed block's place. Without pins (checked by hand
 * with the library before them): the in-heap test saw 112 of 369 results
 * that were not one k, in every run; under ASan the malloc test stops at a
 * heap-use-after-free in sr_mul_scalar's loop reading W's freed block. With
 * the pins but snapshots ignoring them, the forward+backward op fails too
 * (and so do the two `pin` *_saves_the_version_its_forward_read tests).
 *
 * Suite `pin_order`: two threads run sr_add_(a, b) and sr_add_(b, a): each
 * write pins its source before taking its own storage lock, so the two
 * never wait for each other's lock while holding their own (a deadlock
 * would end in the test's timeout).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "common.h"
#include "heap.h"
#include "segment.h"
#include "shmrpc/nn.h"
#include "tensor_impl.h"
#include "tensor_util.h"

LEAK_CHECKED_SUITE(pin);
LEAK_CHECKED_SUITE(pinned_reads);
LEAK_CHECKED_SUITE(pin_order);

static sr_segment heap_seg; /* Criterion runs each test in its own process */

static void heap_up(void)
{
    sr_segment_opts o = {.world_size = 1,
                         .size = sr__segment_fixed_size(1, 0) + (256u << 20),
                         .name = test_ns("pin")};
    cr_assert_eq(sr__segment_create(&o, &heap_seg), 0, "%s", sr_last_error());
    cr_assert_eq(sr__heap_attach(&heap_seg, 0), 0, "sr__heap_attach: %s", sr_last_error());
}

static void heap_down(void)
{
    sr__heap_detach();
    sr__segment_detach(&heap_seg, true);
}

static uint32_t refs(const sr_tensor *t) { return sr__block_refcount(t->storage->block); }

/* ---- mechanics ------------------------------------------------------------ */

Test(pin, pins_nest_and_share_one_block)
{
    sr_tensor *w = sr_zeros(SR_F32, 1, SHAPE(8), 0);
    sr_tensor *v = sr_narrow(w, 0, 2, 4); /* a view: the same storage */
    cr_assert(w && v, "%s", sr_last_error());
    cr_assert_eq(refs(w), 1);
    const char *p = sr__tensor_pin(w);
    cr_assert_eq(refs(w), 2, "a pin is one block reference");
    const char *q = sr__tensor_pin(v);
    cr_assert_eq(refs(w), 2, "a second pin of the storage only counts");
    cr_assert_eq(q, p + 2 * sizeof(float), "the view's first element in the same block");
    cr_assert_eq(sr__storage_pinned(w->storage, NULL), w->storage->block);
    sr__tensor_unpin(v);
    cr_assert_eq(refs(w), 2);
    sr__tensor_unpin(w);
    cr_assert_eq(refs(w), 1, "the last unpin drops the reference");
    cr_assert_null(sr__storage_pinned(w->storage, NULL));
    sr_tensor_unref(v);
    sr_tensor_unref(w);
}

Test(pin, a_pinned_tensor_written_in_place_moves_and_the_pin_keeps_the_old_values)
{
    sr_tensor *w = sr_full(SR_F32, 1, SHAPE(4), 1.0, 0);
    cr_assert(w, "%s", sr_last_error());
    const float *p = (const float *)sr__tensor_pin(w);
    uint64_t c0 = sr__tensor_cow_copies();
    cr_assert_eq(sr_fill_(w, 2.0), 0, "%s", sr_last_error());
    cr_assert_eq(sr__tensor_cow_copies(), c0 + 1, "the write copied instead of writing under the reader");
    cr_assert_eq(p[0], 1.0f);
    cr_assert_eq(p[3], 1.0f);
    cr_assert_eq(((const float *)sr_tensor_data(w))[0], 2.0f);
    /* an op of this thread inside the pin reads the pinned version */
    sr_tensor *s = sr_sum(w);
    cr_assert(s, "%s", sr_last_error());
    cr_assert_eq(sr_tensor_item(s), 4.0, "the sum of the pinned 1s");
    sr_tensor_unref(s);
    sr__tensor_unpin(w);
    s = sr_sum(w);
    cr_assert_eq(sr_tensor_item(s), 8.0, "the sum of the new 2s");
    sr_tensor_unref(s);
    sr_tensor_unref(w);
}

Test(pin, ops_leave_no_pin_behind)
{
    sr_tensor *a = sr_full(SR_F32, 2, SHAPE(3, 4), 1.0, 0), *b = sr_full(SR_F32, 2, SHAPE(4, 2), 2.0, 0);
    sr_tensor *t = sr_arange(SR_I64, 0, 3, 1, 0);
    cr_assert(a && b && t, "%s", sr_last_error());
    sr_tensor *r[] = {sr_add(a, a), sr_mul_scalar(a, 3), sr_sum(a), sr_sum_dim(a, 1, false), sr_mm(a, b),
                      sr_matmul(a, b), sr_clone(a), sr_log_softmax(a, 1), sr_nll_loss(a, t),
                      sr_argmax(a, 1), sr_exp(a), sr_tensor_ref(a)};
    for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++)
        cr_assert(r[i], "op %zu: %s", i, sr_last_error());
    cr_assert_eq(sr_copy_(r[0], a), 0, "%s", sr_last_error());
    cr_assert_neq(sr_add_(r[0], b, 1.0), 0, "a shape error");
    cr_assert_eq(sr_addcmul_(r[0], a, a, 0.5), 0, "%s", sr_last_error());
    cr_assert_float_eq(sr_accuracy(a, t), 1.0 / 3.0, 1e-12);
    cr_assert_eq(sr_tensor_item(r[2]), 12.0);
    cr_assert_null(sr__storage_pinned(a->storage, NULL));
    cr_assert_null(sr__storage_pinned(b->storage, NULL));
    cr_assert_null(sr__storage_pinned(t->storage, NULL));
    cr_assert_eq(refs(a), 1, "no reference left on a's block");
    cr_assert_eq(refs(b), 1);
    cr_assert_eq(refs(t), 1);
    for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++)
        sr_tensor_unref(r[i]);
    sr_tensor_unref(a);
    sr_tensor_unref(b);
    sr_tensor_unref(t);
}

Test(pin, no_copy_where_none_is_due)
{
    sr_tensor *w = sr_full(SR_F32, 1, SHAPE(16), 1.0, 0), *g = sr_full(SR_F32, 1, SHAPE(16), 0.5, 0);
    sr_tensor *m = sr_full(SR_F32, 1, SHAPE(16), 3.0, 0);
    cr_assert(w && g && m, "%s", sr_last_error());
    uint64_t c0 = sr__tensor_cow_copies();
    cr_assert_eq(sr_add_(w, g, -0.1), 0, "%s", sr_last_error());      /* an SGD step */
    cr_assert_eq(sr_add_(w, w, 1.0), 0, "%s", sr_last_error());       /* its own storage: read under its lock */
    cr_assert_eq(sr_addcmul_(w, g, m, 2.0), 0, "%s", sr_last_error()); /* two sources */
    cr_assert_eq(sr_fill_(w, 1.0), 0, "%s", sr_last_error());
    sr_tensor *y = sr_mul(w, w);
    cr_assert(y, "%s", sr_last_error());
    cr_assert_eq(sr__tensor_cow_copies(), c0, "pins of the sources, or of a finished read, never copy");
    cr_assert_eq(refs(w), 1);
    cr_assert_eq(refs(g), 1);
    sr_tensor_unref(y);
    sr_tensor_unref(w);
    sr_tensor_unref(g);
    sr_tensor_unref(m);
}

/* What an op saves for backward is the version its forward read. A write
 * between the forward's read and the save is simulated on one thread: the
 * test pins W (as the op's read would), then writes W (moving it to a copy
 * of 2s), then runs the op, which reads the pinned 1s and must save them. */
static void saves_what_it_read(bool mm)
{
    sr_tensor *w = sr_full(SR_F64, 2, SHAPE(3, 3), 1.0, 0), *x = sr_ones(SR_F64, 2, SHAPE(3, 3), SR_REQUIRES_GRAD);
    cr_assert(w && x, "%s", sr_last_error());
    sr__tensor_pin(w);
    cr_assert_eq(sr_fill_(w, 2.0), 0, "%s", sr_last_error());
    sr_tensor *y = mm ? sr_mm(x, w) : sr_mul(x, w);
    sr_tensor *l = y ? sr_sum(y) : NULL;
    cr_assert(l, "%s", sr_last_error());
    cr_assert_eq(sr_tensor_item(l), mm ? 27.0 : 9.0, "the forward read the pinned 1s");
    sr__tensor_unpin(w);
    cr_assert_eq(sr_backward(l, false), 0, "%s", sr_last_error());
    const double *g = sr_tensor_data(sr_tensor_grad(x));
    for (int i = 0; i < 9; i++)
        cr_assert_eq(g[i], mm ? 3.0 : 1.0, "grad[%d] = %g: the saved W is the forward's, not the 2s", i, g[i]);
    sr_tensor_unref(l);
    sr_tensor_unref(y);
    sr_tensor_unref(x);
    sr_tensor_unref(w);
}

Test(pin, mul_saves_the_version_its_forward_read) { saves_what_it_read(false); }
Test(pin, mm_saves_the_version_its_forward_read) { saves_what_it_read(true); }

/* ---- concurrent reads and in-place writes ------------------------------- */

enum { PR_ROWS = 256, PR_COLS = 4096, PR_N = PR_ROWS * PR_COLS, PR_ROUNDS = 48, PR_OPS = 5 };

struct pr {
    sr_tensor *w, *x, *dst; /* W [ROWS, COLS]; x = ones [1, ROWS]; dst: sr_copy_'s target */
    _Atomic int begun;      /* reader: ops begun */
    _Atomic bool done;      /* writer: the last round is over */
    int bad, reads;         /* reader's counts, read after join */
    int by_op[PR_OPS];      /* results checked, per op */
    char why[200];          /* the first bad result */
};

/* k if v is a whole number in [0, PR_ROUNDS] times unit, else -1. */
static int as_k(double v, double unit)
{
    double k = v / unit;
    return k >= 0 && k <= PR_ROUNDS && k == (double)(int)k && (double)(int)k * unit == v ? (int)k : -1;
}

/* -1 unless all n floats of p are equal to one k times unit. */
static int uniform_k(const float *p, int64_t n, double unit)
{
    for (int64_t i = 1; i < n; i++)
        if (p[i] != p[0])
            return -1;
    return as_k(p[0], unit);
}

static int pr_op(struct pr *s, int op)
{
    sr_tensor *y = NULL;
    int k = -1;
    switch (op) {
    case 0:
        y = sr_mul_scalar(s->w, 1.0);
        k = y ? uniform_k(sr_tensor_data(y), PR_N, 1.0) : -1;
        break;
    case 1:
        y = sr_sum(s->w);
        k = y ? as_k(sr_tensor_item(y), (double)PR_N) : -1;
        break;
    case 2:
        y = sr_mm(s->x, s->w);
        k = y ? uniform_k(sr_tensor_data(y), PR_COLS, (double)PR_ROWS) : -1;
        break;
    case 3:
        k = sr_copy_(s->dst, s->w) ? -1 : uniform_k(sr_tensor_data(s->dst), PR_N, 1.0);
        break;
    case 4: { /* forward and backward: the saved W is the one the forward read */
        sr_tensor *x = sr_ones(SR_F32, 2, SHAPE(1, PR_COLS), SR_REQUIRES_GRAD);
        sr_tensor *m = x ? sr_mul(x, s->w) : NULL;
        y = m ? sr_sum(m) : NULL;
        int kf = y ? as_k(sr_tensor_item(y), (double)PR_N) : -1;
        if (kf >= 0 && !sr_backward(y, false)) { /* x.grad = the saved W summed over its rows */
            int kb = uniform_k(sr_tensor_data(sr_tensor_grad(x)), PR_COLS, (double)PR_ROWS);
            k = kb == kf ? kf : -1;
        }
        sr_tensor_unref(m);
        sr_tensor_unref(x);
        break;
    }
    }
    sr_tensor_unref(y);
    return k;
}

static void *pr_reader(void *arg)
{
    struct pr *s = arg;
    static const char *names[PR_OPS] = {"sr_mul_scalar(W, 1)", "sr_sum(W)", "sr_mm(x, W)", "sr_copy_(dst, W)",
                                        "sr_sum(sr_mul(x, W)) and its backward"};
    /* acquire: pairs with the writer's release store of done */
    for (int i = 0; !atomic_load_explicit(&s->done, memory_order_acquire); i++) {
        int op = i % PR_OPS;
        /* release: the writer, seeing this, knows an op has begun */
        atomic_fetch_add_explicit(&s->begun, 1, memory_order_release);
        int k = pr_op(s, op);
        s->reads++;
        s->by_op[op]++;
        if (k < 0 && !s->bad++)
            snprintf(s->why, sizeof(s->why), "%s (read %d) mixed writes or read a freed block: %s", names[op],
                     s->reads, sr_last_error());
    }
    return NULL;
}

static void run_pinned_reads(void)
{
    struct pr s = {.w = sr_zeros(SR_F32, 2, SHAPE(PR_ROWS, PR_COLS), 0),
                   .x = sr_ones(SR_F32, 2, SHAPE(1, PR_ROWS), 0),
                   .dst = sr_zeros(SR_F32, 2, SHAPE(PR_ROWS, PR_COLS), 0)};
    cr_assert(s.w && s.x && s.dst, "%s", sr_last_error());
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, pr_reader, &s), 0);
    sr_tensor *poison = NULL;
    int moved = 0;
    for (int k = 1; k <= PR_ROUNDS; k++) {
        /* a pending backward's saved W holds W's block (odd rounds) */
        sr_tensor *saved = k % 2 ? sr__tensor_snapshot(s.w) : NULL;
        cr_assert(saved || k % 2 == 0, "%s", sr_last_error());
        /* acquire: pairs with the reader's release increment: wait until it
         * begins an op, so the write lands in the middle of one */
        int b0 = atomic_load_explicit(&s.begun, memory_order_acquire);
        while (atomic_load_explicit(&s.begun, memory_order_acquire) == b0)
            sched_yield();
        uint64_t c0 = sr__tensor_cow_copies();
        cr_assert_eq(sr_fill_(s.w, k), 0, "%s", sr_last_error());
        moved += sr__tensor_cow_copies() != c0;
        /* the saved W is released: without pins its block, which the reader
         * may be in, is freed here; -1s take its place */
        sr_tensor_unref(saved);
        sr_tensor_unref(poison);
        poison = sr_full(SR_F32, 2, SHAPE(PR_ROWS, PR_COLS), -1.0, 0);
        cr_assert(poison, "%s", sr_last_error());
    }
    /* release: pairs with the reader's acquire load of done */
    atomic_store_explicit(&s.done, true, memory_order_release);
    pthread_join(th, NULL);
    cr_assert_eq(s.bad, 0, "%d of %d results were not one k: first %s", s.bad, s.reads, s.why);
    cr_assert_geq(s.reads, PR_ROUNDS, "at least one read per round");
    cr_assert_geq(moved, (PR_ROUNDS + 1) / 2, "every write under a snapshot copied (%d copies)", moved);
    const float *w = sr_tensor_data(s.w);
    cr_assert_eq(w[0], (float)PR_ROUNDS);
    cr_assert_eq(w[PR_N - 1], (float)PR_ROUNDS);
    cr_assert_eq(refs(s.w), 1, "no pin left on W");
    sr_tensor_unref(poison);
    sr_tensor_unref(s.w);
    sr_tensor_unref(s.x);
    sr_tensor_unref(s.dst);
}

Test(pinned_reads, a_reader_sees_one_version_while_w_is_written_in_heap, .init = heap_up, .fini = heap_down,
     .timeout = 120)
{
    run_pinned_reads();
}

/* No heap attached: blocks are malloc'd, so ASan sees a read of a freed one. */
Test(pinned_reads, a_reader_sees_one_version_while_w_is_written_in_malloc, .timeout = 120)
{
    run_pinned_reads();
}

/* ---- lock order ------------------------------------------------------------ */

enum { PO_ITERS = 20000 };

struct po {
    sr_tensor *dst, *src;
};

static void *po_adder(void *arg)
{
    struct po *p = arg;
    for (int i = 0; i < PO_ITERS; i++)
        if (sr_add_(p->dst, p->src, 0.0))
            return (void *)1;
    return NULL;
}

Test(pin_order, crossed_in_place_adds_never_deadlock, .timeout = 60)
{
    sr_tensor *a = sr_ones(SR_F32, 1, SHAPE(64), 0), *b = sr_ones(SR_F32, 1, SHAPE(64), 0);
    cr_assert(a && b, "%s", sr_last_error());
    struct po ab = {a, b}, ba = {b, a};
    pthread_t t1, t2;
    cr_assert_eq(pthread_create(&t1, NULL, po_adder, &ab), 0);
    cr_assert_eq(pthread_create(&t2, NULL, po_adder, &ba), 0);
    void *r1, *r2;
    pthread_join(t1, &r1);
    pthread_join(t2, &r2);
    cr_assert_null(r1, "%s", sr_last_error());
    cr_assert_null(r2, "%s", sr_last_error());
    cr_assert_eq(((const float *)sr_tensor_data(a))[63], 1.0f);
    cr_assert_eq(refs(a), 1);
    cr_assert_eq(refs(b), 1);
    sr_tensor_unref(a);
    sr_tensor_unref(b);
}
