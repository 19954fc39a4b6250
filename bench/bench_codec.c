/* SPDX-License-Identifier: MIT */
/* Cost of the wire codec on the commonest call: an argument list of two ints.
 *
 * One op = size + encode into a stack buffer, decode, drop the decoded list.
 * Batches of BATCH ops are timed after a warm-up; p50 and p99 are over the
 * per-op mean of each batch. The floor is what decode cannot avoid: three
 * malloc/free pairs (the list and its two ints), timed the same way.
 * Prints one line.
 */
#include "bench_util.h"
#include "icount.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "codec.h"
#include "waiter.h"

enum { WARMUP = 100000, BATCH = 1000, BATCHES = 2000 };
/* The counts, or --smoke's (main). */
static int warmup = WARMUP, batch = BATCH, batches = BATCHES, icount_ops = 100; /* single-stepped: icount.h */

static volatile int64_t sink; /* defeats dead-code elimination */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void encode_decode(sr_value *const *args)
{
    uint8_t buf[64];
    int64_t size = sr__codec_size(2, args, 0);
    int64_t n = sr__codec_encode(2, args, 0, buf, (size_t)size);
    sr_value *out = NULL;
    if (n < 0 || sr__codec_decode(buf, (size_t)n, &out)) {
        fprintf(stderr, "bench_codec: %s\n", sr_last_error());
        exit(1);
    }
    sink += sr_value_int(sr_value_list_at(out, 1));
    sr_value_unref(out);
}

static void malloc_floor(sr_value *const *args)
{
    (void)args;
    void *p[3];
    for (int i = 0; i < 3; i++)
        p[i] = malloc(32);
    sink += (int64_t)(uintptr_t)p[2] & 1;
    for (int i = 0; i < 3; i++)
        free(p[i]);
}

/* Fills ns[] with per-op means; returns the p50 and sets *p99. */
static double time_batches(void (*op)(sr_value *const *), sr_value *const *args, double *ns, double *p99)
{
    for (int i = 0; i < warmup; i++)
        op(args);
    for (int b = 0; b < batches; b++) {
        int64_t t0 = sr__now_ns();
        for (int i = 0; i < batch; i++)
            op(args);
        ns[b] = (double)(sr__now_ns() - t0) / batch;
    }
    qsort(ns, (size_t)batches, sizeof(double), cmp_double);
    *p99 = ns[batches * 99 / 100];
    return ns[batches / 2];
}

int main(int argc, char **argv)
{
    bench_cli cli = {.prog = "bench_codec", .smoke_what = "100 batches of 100 ops"};
    bench_cli_parse(&cli, argc, argv);
    if (cli.smoke)
        warmup = 1000, batch = 100, batches = 100, icount_ops = 5;
    sr_value *args[] = {sr_int(1), sr_int(2)};
    static double ns[BATCHES];
    double p99, floor99;
    double p50 = time_batches(encode_decode, args, ns, &p99);
    double floor50 = time_batches(malloc_floor, args, ns, &floor99);

    /* Check the result after timing: the values survive the trip. */
    uint8_t buf[64];
    int64_t n = sr__codec_encode(2, args, 0, buf, sizeof(buf));
    sr_value *out = NULL, *want = sr_list(2, args);
    if (n < 0 || sr__codec_decode(buf, (size_t)n, &out) || !sr_value_equal(out, want)) {
        fprintf(stderr, "bench_codec: the round trip changed the values: %s\n", sr_last_error());
        return 1;
    }
    printf("codec 2-int args (%lld B): encode+decode p50 %.0f ns p99 %.0f ns/op; "
           "floor 3x malloc+free p50 %.0f ns p99 %.0f ns; ratio %.1fx\n",
           (long long)n, p50, p99, floor50, floor99, p50 / floor50);
    /* the same op counted exactly (icount.h): comparable across runs and builds */
    bench_icount ic;
    int64_t ins = -1;
    if (!bench_icount_begin(&ic)) {
        for (int i = 0; i < icount_ops; i++)
            encode_decode(args);
        ins = bench_icount_end(&ic);
    }
    if (ins >= 0)
        printf("codec 2-int args: %.0f instructions per encode+decode in user mode (%d ops single-stepped)\n",
               (double)ins / icount_ops, icount_ops);
    bench_rec r;
    bench_rec_begin(&r, "codec 2-int args encode+decode");
    bench_rec_num(&r, "bytes", (double)n);
    bench_rec_num(&r, "p50_ns", p50);
    bench_rec_num(&r, "p99_ns", p99);
    bench_rec_str(&r, "floor", "3x malloc+free");
    bench_rec_num(&r, "floor_p50_ns", floor50);
    bench_rec_num(&r, "floor_p99_ns", floor99);
    bench_rec_num(&r, "ratio_p50", p50 / floor50);
    if (ins >= 0)
        bench_rec_num(&r, "instructions_per_op", (double)ins / icount_ops);
    bench_rec_emit(&r);
    sr_value_unref(out);
    sr_value_unref(want);
    sr_value_unref(args[0]);
    sr_value_unref(args[1]);
    return 0;
}
