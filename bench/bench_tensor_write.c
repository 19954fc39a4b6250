/* SPDX-License-Identifier: MIT */
/* Cost of the tensor layer's write and encode paths on small tensors, where
 * any fixed cost (the per-storage write lock, a saved tensor's own storage)
 * shows most. One process, a one-worker segment with an attached heap.
 *
 *   add_       sr_add_scalar_ on a 16-element f32 tensor (sole holder: no copy)
 *   encode     sr__tensor_to_desc + sr__tensor_desc_release of that tensor
 *   fwd_save   sr_mul(x, w) with x requiring grad (records MulBackward0, which
 *              saves both operands), then drop the result and its graph
 *   add        sr_add(w, w2) of two 16-element f32 tensors, no grad: the
 *              smallest out-of-place op (what pinning its inputs costs)
 *   mm         sr_mm(a, b) of f32 [32, 784] x [784, 128], no grad
 *
 * Batches of BATCH ops after a warm-up; p50 and p99 of the per-op mean of
 * each batch, in ns. Prints one line per op.
 */
#include "bench_util.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "heap.h"
#include "segment.h"
#include "shmrpc/tensor.h"
#include "desc.h"

enum { WARMUP = 20000, BATCH = 1000, BATCHES = 1000 };
/* The counts, or --smoke's (main). */
static int warmup = WARMUP, batch = BATCH, batches = BATCHES;

static sr_tensor *x, *w, *w2, *t, *ma, *mb;

static int cmp_double(const void *a, const void *b)
{
    double p = *(const double *)a, q = *(const double *)b;
    return p < q ? -1 : p > q;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_tensor_write: %s: %s\n", what, sr_last_error());
    exit(1);
}

static void op_add(void)
{
    if (sr_add_scalar_(t, 1.0))
        die("sr_add_scalar_");
}

static void op_encode(void)
{
    struct sr_tensor_desc d;
    if (sr__tensor_to_desc(t, &d))
        die("sr__tensor_to_desc");
    sr__tensor_desc_release(&d);
}

static void op_fwd_save(void)
{
    sr_tensor *y = sr_mul(x, w);
    if (!y)
        die("sr_mul");
    sr_tensor_unref(y);
}

static void op_add_out(void)
{
    sr_tensor *y = sr_add(w, w2);
    if (!y)
        die("sr_add");
    sr_tensor_unref(y);
}

static void op_mm(void)
{
    sr_tensor *y = sr_mm(ma, mb);
    if (!y)
        die("sr_mm");
    sr_tensor_unref(y);
}

/* scale: batches of batch / scale ops and warmup / scale warm-up ops (a slow op) */
static void run_scaled(const char *name, void (*op)(void), int scale)
{
    static double per_op[BATCHES];
    int per_batch = batch / scale > 0 ? batch / scale : 1;
    for (int i = 0; i < warmup / scale; i++)
        op();
    for (int b = 0; b < batches; b++) {
        double t0 = now_ns();
        for (int i = 0; i < per_batch; i++)
            op();
        per_op[b] = (now_ns() - t0) / per_batch;
    }
    qsort(per_op, (size_t)batches, sizeof(double), cmp_double);
    printf("%-9s p50 %9.1f ns  p99 %9.1f ns\n", name, per_op[batches / 2], per_op[batches * 99 / 100]);
    bench_rec r;
    bench_rec_begin(&r, name);
    bench_rec_num(&r, "p50_ns", per_op[batches / 2]);
    bench_rec_num(&r, "p99_ns", per_op[batches * 99 / 100]);
    bench_rec_emit(&r);
}

static void run(const char *name, void (*op)(void)) { run_scaled(name, op, 1); }

int main(int argc, char **argv)
{
    bench_cli cli = {.prog = "bench_tensor_write", .smoke_what = "20 batches of 200 ops (mm: of 1)"};
    bench_cli_parse(&cli, argc, argv);
    if (cli.smoke)
        warmup = 200, batch = 200, batches = 20;
    sr_segment seg;
    sr_segment_opts o = {.world_size = 1, .size = sr__segment_fixed_size(1, 0) + (16u << 20),
                         .name = "bench_tensor_write"};
    if (sr__segment_create(&o, &seg) || sr__heap_attach(&seg, 0))
        die("segment");
    int64_t n = 16;
    t = sr_zeros(SR_F32, 1, &n, 0);
    x = sr_ones(SR_F32, 1, &n, SR_REQUIRES_GRAD);
    w = sr_ones(SR_F32, 1, &n, 0);
    w2 = sr_ones(SR_F32, 1, &n, 0);
    ma = sr_randn(SR_F32, 2, (int64_t[]){32, 784}, 0);
    mb = sr_randn(SR_F32, 2, (int64_t[]){784, 128}, 0);
    if (!t || !x || !w || !w2 || !ma || !mb)
        die("factories");
    run("add_", op_add);
    run("encode", op_encode);
    run("fwd_save", op_fwd_save);
    run("add", op_add_out);
    run_scaled("mm", op_mm, 200); /* about 100 us an op: batches of 5 */
    sr_tensor_unref(t);
    sr_tensor_unref(x);
    sr_tensor_unref(w);
    sr_tensor_unref(w2);
    sr_tensor_unref(ma);
    sr_tensor_unref(mb);
    sr__heap_detach();
    sr__segment_detach(&seg, true);
    return 0;
}
