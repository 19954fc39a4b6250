/* Benchmark helpers. See bench_util.h. */
#include "bench_util.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SLICE_NS (100ll * 1000000) /* futex sleeps are bounded, then re-checked */

int64_t bench_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

bench_lat bench_lat_of(int64_t *samples, size_t n)
{
    qsort(samples, n, sizeof(*samples), cmp_i64);
    return (bench_lat){.p50 = samples[n / 2], .p99 = samples[n * 99 / 100]};
}

double bench_median(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void *bench_shared_alloc(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void bench_shared_free(void *p, size_t bytes)
{
    if (p)
        munmap(p, bytes);
}

static void futex_wait_slice(_Atomic uint32_t *w, uint32_t val)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = SLICE_NS};
    syscall(SYS_futex, w, FUTEX_WAIT, val, &ts, NULL, 0);
}

int bench_barrier_wait(bench_barrier *b, uint32_t n, int64_t timeout_ns)
{
    /* acquire: pairs with the release increment of gen that ended the previous generation */
    uint32_t gen = atomic_load_explicit(&b->gen, memory_order_acquire);
    /* acq_rel: the last arrival must see every earlier arrival's writes, which
     * it then publishes with its release increment of gen */
    if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) + 1 == n) {
        /* relaxed: nobody arrives for the next generation before gen moves (below) */
        atomic_store_explicit(&b->count, 0, memory_order_relaxed);
        /* release: pairs with the waiters' acquire loads of gen */
        atomic_fetch_add_explicit(&b->gen, 1, memory_order_release);
        syscall(SYS_futex, &b->gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        return 0;
    }
    int64_t deadline = bench_now_ns() + timeout_ns;
    /* acquire: pairs with the last arrival's release increment of gen */
    while (atomic_load_explicit(&b->gen, memory_order_acquire) == gen) {
        if (bench_now_ns() > deadline)
            return -ETIMEDOUT;
        futex_wait_slice(&b->gen, gen);
    }
    return 0;
}

void bench_rounds_add(bench_rounds *r, bench_lat ours, bench_lat floor)
{
    if (r->n >= BENCH_MAX_ROUNDS)
        return;
    r->ours[r->n] = ours;
    r->floor[r->n] = floor;
    r->n++;
}

bench_summary bench_summarize(const bench_rounds *r)
{
    double o50[BENCH_MAX_ROUNDS], o99[BENCH_MAX_ROUNDS], f50[BENCH_MAX_ROUNDS], f99[BENCH_MAX_ROUNDS];
    double r50[BENCH_MAX_ROUNDS], r99[BENCH_MAX_ROUNDS];
    int n = r->n;
    for (int i = 0; i < n; i++) {
        o50[i] = (double)r->ours[i].p50;
        o99[i] = (double)r->ours[i].p99;
        f50[i] = (double)r->floor[i].p50;
        f99[i] = (double)r->floor[i].p99;
        r50[i] = f50[i] > 0 ? o50[i] / f50[i] : 0;
        r99[i] = f99[i] > 0 ? o99[i] / f99[i] : 0;
    }
    if (n == 0)
        return (bench_summary){0};
    return (bench_summary){.ours50 = bench_median(o50, n), .ours99 = bench_median(o99, n),
                           .floor50 = bench_median(f50, n), .floor99 = bench_median(f99, n),
                           .ratio50 = bench_median(r50, n), .ratio99 = bench_median(r99, n)};
}

int bench_print(const char *name, const char *config, const char *floor_name, const bench_summary *s,
                double target, const char *extra)
{
    int met = target <= 0 || s->ratio50 <= target;
    printf("%-16s | %-38s | p50 %7.0f ns p99 %7.0f ns | floor %-9s p50 %7.0f ns p99 %7.0f ns | ratio p50 %4.2f p99 %4.2f",
           name, config, s->ours50, s->ours99, floor_name, s->floor50, s->floor99, s->ratio50, s->ratio99);
    if (target > 0)
        printf(" | target p50 <= %.1fx %s", target, met ? "met" : "NOT met");
    if (extra)
        printf(" | %s", extra);
    printf("\n");
    fflush(stdout);
    return met;
}
