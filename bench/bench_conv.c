/* SPDX-License-Identifier: MIT */
/* The convolution layers at the shapes of the Fashion-MNIST CNN, f32,
 * batch 64, one thread (OpenBLAS's, when built with it), against PyTorch's
 * one-thread figures measured in the same run (bench/compare/torch_conv.py):
 *   conv1  conv2d [64, 1, 28, 28] * [32, 1, 3, 3], padding 1, forward + backward
 *   conv2  conv2d [64, 32, 14, 14] * [64, 32, 3, 3], padding 1, forward + backward
 *   pool   max_pool2d 2 x 2 of [64, 32, 28, 28], forward + backward
 *   norm   layer_norm of [64, 32, 28, 28] over [32, 28, 28] with weight and bias, forward + backward
 *   step   the CNN Conv2d(1, 32, 3, p 1)-ReLU-MaxPool2d(2)-Conv2d(32, 64, 3, p 1)-
 *          ReLU-MaxPool2d(2)-Flatten-Linear(3136, 10) as an sr_sequential
 *          model: forward, cross_entropy, backward
 * One line per workload: wall-clock p50 and p99 over 30 runs, samples/s at
 * the p50, the p50 of the process's CPU time per run (both ours and
 * PyTorch's), which a machine shared with other jobs distorts least; "x1.5"
 * is PyTorch's time over ours (above 1, ours is faster); and the p50 of the
 * process's page faults per run (ours), which shows a run that gets fresh
 * pages from the kernel for its outputs instead of reusing freed ones. e.g.
 *   conv conv2 (openblas): p50 38.1 ms p99 41.0 ms, 1680 samples/s (PyTorch 45.9 ms, x1.20); CPU p50 37.3 ms
 *   (PyTorch 32.3 ms, x0.87); 0 page faults/run
 * Backward gets a gradient of ones (conv1, conv2, pool, norm), made once.
 * The process is a one-worker job (sr_init without a launcher), so that its
 * tensors come from the shared heap as every worker's do; without it they
 * would be glibc's malloc blocks, which give a run's multi-MiB outputs back
 * to the kernel and fault them in again (docs/PERFORMANCE.md). */
#include <math.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "shmrpc/nn.h"
#include "shmrpc/rpc.h"
#include "shmrpc/tensor.h"

#ifndef BENCH_COMPARE_DIR
#define BENCH_COMPARE_DIR "bench/compare"
#endif

#define BATCH 64

struct work {
    sr_tensor *x, *w, *b, *target;
    sr_tensor *gy; /* the output gradient, made by the first run */
    sr_module *model;
};

typedef int (*run_fn)(struct work *w);

/* Backward from y with a gradient of ones (made once, outside the timing
 * that matters: the warm-up's first run). */
static int backward_ones(struct work *w, sr_tensor *y)
{
    if (y && !w->gy)
        w->gy = sr_ones_like(y);
    int rc = y && w->gy ? sr_backward_multi(&y, &w->gy, 1, false) : -1;
    sr_tensor_unref(y);
    return rc;
}

static void clear_grads(struct work *w)
{
    sr_tensor *ts[] = {w->x, w->w, w->b};
    for (int i = 0; i < 3; i++)
        if (ts[i])
            sr_tensor_set_grad(ts[i], NULL);
}

static int run_conv(struct work *w)
{
    clear_grads(w);
    return backward_ones(w, sr_conv2d(w->x, w->w, w->b, NULL, (const int64_t[]){1, 1}, NULL, 1));
}

static int run_pool(struct work *w)
{
    clear_grads(w);
    return backward_ones(w, sr_max_pool2d(w->x, (const int64_t[]){2, 2}, NULL, NULL));
}

static int run_norm(struct work *w)
{
    clear_grads(w);
    return backward_ones(w, sr_layer_norm(w->x, 3, (const int64_t[]){32, 28, 28}, w->w, w->b, 1e-5));
}

static int run_step(struct work *w)
{
    sr_module_zero_grad(w->model);
    sr_tensor *logits = sr_module_forward(w->model, w->x);
    sr_tensor *loss = logits ? sr_cross_entropy(logits, w->target) : NULL;
    int rc = loss ? sr_backward(loss, false) : -1;
    sr_tensor_unref(logits);
    sr_tensor_unref(loss);
    return rc;
}

/* "PyTorch 32.3 ms, x0.87" (PyTorch's time over ours: above 1, ours is
 * faster), or why there is no figure. */
static const char *vs(const bench_torch *t, const char *key, double ours_ns, char *buf, size_t len)
{
    const bench_torch_fig *f = bench_torch_get(t, key);
    if (f && isfinite(f->p50_ns) && ours_ns > 0)
        snprintf(buf, len, "PyTorch %.2f ms, x%.2f", f->p50_ns * 1e-6, f->p50_ns / ours_ns);
    else
        snprintf(buf, len, "PyTorch: %s", f ? "no p50 in its output" : t->measured ? "no such figure" : t->why);
    return buf;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double page_faults(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)(u.ru_minflt + u.ru_majflt);
}

/* p50 and p99 (ns) of reps runs after 3 warm-ups (--smoke: 1), the p50 of the
 * process's CPU time per run in *cpu (what a loaded machine distorts
 * least) and of its page faults per run in *faults; NaN on a failed run. */
static double measure(run_fn f, struct work *w, int reps, double *p99, double *cpu, double *faults)
{
    double *t = malloc(3 * (size_t)reps * sizeof(double)), *c = t + reps, *pf = c + reps;
    for (int i = 0; i < (bench_smoke_on() ? 1 : 3); i++)
        if (f(w)) {
            free(t);
            return *p99 = *cpu = *faults = NAN;
        }
    for (int i = 0; i < reps; i++) {
        double pf0 = page_faults();
        int64_t t0 = bench_now_ns(), c0 = bench_process_cpu_ns();
        if (f(w)) {
            free(t);
            return *p99 = *cpu = *faults = NAN;
        }
        t[i] = (double)(bench_now_ns() - t0);
        c[i] = (double)(bench_process_cpu_ns() - c0);
        pf[i] = page_faults() - pf0;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp);
    qsort(c, (size_t)reps, sizeof(double), cmp);
    qsort(pf, (size_t)reps, sizeof(double), cmp);
    double p50 = t[reps / 2];
    *p99 = t[reps * 99 / 100];
    *cpu = c[reps / 2];
    *faults = pf[reps / 2];
    free(t);
    return p50;
}

static void setup(const char *name, struct work *w)
{
    sr_manual_seed(1);
    memset(w, 0, sizeof(*w));
    if (!strcmp(name, "conv1") || !strcmp(name, "conv2")) {
        bool first = !strcmp(name, "conv1");
        int64_t c = first ? 1 : 32, o = first ? 32 : 64, hw = first ? 28 : 14;
        w->x = sr_randn(SR_F32, 4, (const int64_t[]){BATCH, c, hw, hw}, SR_REQUIRES_GRAD);
        w->w = sr_randn(SR_F32, 4, (const int64_t[]){o, c, 3, 3}, SR_REQUIRES_GRAD);
        w->b = sr_randn(SR_F32, 1, &o, SR_REQUIRES_GRAD);
    } else if (!strcmp(name, "pool")) {
        w->x = sr_randn(SR_F32, 4, (const int64_t[]){BATCH, 32, 28, 28}, SR_REQUIRES_GRAD);
    } else if (!strcmp(name, "norm")) {
        w->x = sr_randn(SR_F32, 4, (const int64_t[]){BATCH, 32, 28, 28}, SR_REQUIRES_GRAD);
        w->w = sr_randn(SR_F32, 3, (const int64_t[]){32, 28, 28}, SR_REQUIRES_GRAD);
        w->b = sr_randn(SR_F32, 3, (const int64_t[]){32, 28, 28}, SR_REQUIRES_GRAD);
    } else {
        static const sr_layer_spec spec[] = {SR_CONV2D(1, 32, 3, 1, 1), SR_RELU(), SR_MAX_POOL2D(2, 2),
                                             SR_CONV2D(32, 64, 3, 1, 1), SR_RELU(), SR_MAX_POOL2D(2, 2),
                                             SR_FLATTEN(), SR_LINEAR(3136, 10)};
        sr_generator g;
        sr_generator_init(&g, 1);
        if (sr_sequential_create(spec, 8, SR_F32, &g, &w->model))
            fprintf(stderr, "bench_conv: %s\n", sr_last_error());
        w->x = sr_randn(SR_F32, 4, (const int64_t[]){BATCH, 1, 28, 28}, 0);
        int64_t t[BATCH];
        for (int i = 0; i < BATCH; i++)
            t[i] = (i * 7) % 10;
        w->target = sr_from_data(SR_I64, 1, (const int64_t[]){BATCH}, t, 0);
    }
}

static void teardown(struct work *w)
{
    sr_tensor_unref(w->x);
    sr_tensor_unref(w->w);
    sr_tensor_unref(w->b);
    sr_tensor_unref(w->target);
    sr_tensor_unref(w->gy);
    sr_module_destroy(w->model);
}

int main(int argc, char **argv)
{
    static const char *names[] = {"conv1", "conv2", "pool", "norm", "step", NULL};
    bench_cli cli = {.prog = "bench_conv", .names = {"conv1", "conv2", "pool", "norm", "step"},
                     .flags = {"--no-torch"},
                     .usage = "  --no-torch  skip PyTorch (bench/compare/torch_conv.py, run first otherwise)",
                     .smoke_what = "1 warm-up and 1 timed run per workload"};
    bench_cli_parse(&cli, argc, argv);
    bench_torch pt;
    bench_torch_run(&pt, BENCH_COMPARE_DIR "/torch_conv.py", getenv("BENCH_TORCH_QUICK") ? "--quick" : "",
                    cli.flag[0] ? "--no-torch" : getenv("BENCH_NO_TORCH") ? "BENCH_NO_TORCH set" : NULL);
    setenv("SHMRPC_WORLD_SIZE", "1", 0); /* one worker on purpose: no warning */
    if (sr_init(NULL)) {
        fprintf(stderr, "bench_conv: sr_init: %s\n", sr_last_error());
        return 1;
    }
    int failed = 0;
    for (int i = 0; names[i]; i++) {
        if (!bench_cli_wants(&cli, names[i]))
            continue;
        struct work w;
        setup(names[i], &w);
        run_fn f = !strcmp(names[i], "pool") ? run_pool : !strcmp(names[i], "step") ? run_step
                 : !strcmp(names[i], "norm") ? run_norm : run_conv;
        double p99, cpu, faults;
        double p50 = measure(f, &w, cli.smoke ? 1 : getenv("BENCH_TORCH_QUICK") ? 5 : 30, &p99, &cpu, &faults);
        teardown(&w);
        if (isnan(p50)) {
            fprintf(stderr, "bench_conv: %s failed: %s\n", names[i], sr_last_error());
            failed = 1;
            continue;
        }
        char vs_wall[300], vs_cpu[300], cpu_key[32];
        snprintf(cpu_key, sizeof(cpu_key), "%s_cpu", names[i]);
        printf("conv %s (%s): p50 %.2f ms p99 %.2f ms, %.0f samples/s (%s); CPU p50 %.2f ms (%s); %.0f page faults/run\n",
               names[i], sr_matmul_backend(), p50 * 1e-6, p99 * 1e-6, BATCH / (p50 * 1e-9),
               vs(&pt, names[i], p50, vs_wall, sizeof(vs_wall)), cpu * 1e-6,
               vs(&pt, cpu_key, cpu, vs_cpu, sizeof(vs_cpu)), faults);
        bench_rec r;
        bench_rec_begin(&r, names[i]);
        bench_rec_str(&r, "backend", sr_matmul_backend());
        bench_rec_num(&r, "p50_ns", p50);
        bench_rec_num(&r, "p99_ns", p99);
        bench_rec_num(&r, "samples_per_s", BATCH / (p50 * 1e-9));
        bench_rec_num(&r, "cpu_p50_ns", cpu);
        bench_rec_num(&r, "page_faults_p50", faults);
        bench_rec_torch(&r, &pt, names[i]);
        bench_rec_emit(&r);
    }
    if (sr_shutdown(true, 0)) {
        fprintf(stderr, "bench_conv: sr_shutdown: %s\n", sr_last_error());
        failed = 1;
    }
    return failed;
}
