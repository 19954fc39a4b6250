/* SPDX-License-Identifier: MIT */
/* The machine's floor. See floor.h.
 *
 * Ordering: every store of a ping-pong word is a release that pairs with the
 * peer's acquire load of the same word; the values themselves are the
 * messages, so nothing else needs ordering. */
#include "floor.h"

#include <errno.h>
#include <sched.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PEER_TIMEOUT_NS (10ll * 1000000000)
#define SLICE_NS (10ll * 1000000)
#define MAX_SLICES (PEER_TIMEOUT_NS / SLICE_NS)
#define CHECK_EVERY 0xffffu /* spins between two clock reads in the (rare) overtime check */

/* Spin until the line holds `want` (want_odd < 0) or any value of the given
 * parity (want_odd >= 0); *seen gets the value. 0, or -ETIMEDOUT after
 * PEER_TIMEOUT_NS. The clock is read only every CHECK_EVERY spins, so the
 * bound costs the loop nothing measurable. */
static int spin_for(_Atomic uint32_t *line, uint32_t want, int want_odd, uint32_t *seen)
{
    int64_t deadline = 0;
    for (uint32_t spins = 1;; spins++) {
        /* acquire: pairs with the peer's release store of the line */
        uint32_t v = atomic_load_explicit(line, memory_order_acquire);
        if (want_odd < 0 ? v == want : (int)(v & 1) == want_odd) {
            *seen = v;
            return 0;
        }
        if (__builtin_expect((spins & CHECK_EVERY) == 0, 0)) {
            if (!deadline)
                deadline = bench_now_ns() + PEER_TIMEOUT_NS;
            else if (bench_now_ns() > deadline)
                return -ETIMEDOUT;
        }
    }
}

int bench_floor_cacheline(bench_floor_area *a, enum bench_role role, uint32_t n, int64_t *rtt_ns)
{
    if (role == BENCH_ECHO) {
        for (uint32_t i = 0; i < n; i++) {
            uint32_t v;
            if (spin_for(&a->line, 0, 1, &v))
                return -ETIMEDOUT;
            /* release: pairs with the initiator's acquire in spin_for */
            atomic_store_explicit(&a->line, v + 1, memory_order_release);
        }
        return 0;
    }
    /* relaxed: at rest the line holds the echo's last value, which this
     * process already observed (or the initial zero) */
    uint32_t v = atomic_load_explicit(&a->line, memory_order_relaxed);
    int64_t t = bench_now_ns();
    for (uint32_t i = 0; i < n; i++) {
        /* release: pairs with the echo's acquire in spin_for */
        atomic_store_explicit(&a->line, v + 1, memory_order_release);
        uint32_t seen;
        if (spin_for(&a->line, v + 2, -1, &seen))
            return -ETIMEDOUT;
        v += 2;
        int64_t t2 = bench_now_ns();
        rtt_ns[i] = t2 - t;
        t = t2;
    }
    return 0;
}

int bench_floor_twoline(bench_floor_area *a, enum bench_role role, uint32_t n, int64_t *rtt_ns)
{
    uint32_t seen;
    if (role == BENCH_ECHO) {
        for (uint32_t i = 0; i < n; i++) {
            /* relaxed: only this process writes rep; at rest req == rep */
            uint32_t v = atomic_load_explicit(&a->rep, memory_order_relaxed) + 1;
            if (spin_for(&a->req, v, -1, &seen))
                return -ETIMEDOUT;
            /* release: pairs with the initiator's acquire in spin_for */
            atomic_store_explicit(&a->rep, v, memory_order_release);
        }
        return 0;
    }
    /* relaxed: only this process writes req; at rest req == rep */
    uint32_t v = atomic_load_explicit(&a->req, memory_order_relaxed);
    int64_t t = bench_now_ns();
    for (uint32_t i = 0; i < n; i++) {
        v++;
        /* release: pairs with the echo's acquire in spin_for */
        atomic_store_explicit(&a->req, v, memory_order_release);
        if (spin_for(&a->rep, v, -1, &seen))
            return -ETIMEDOUT;
        int64_t t2 = bench_now_ns();
        rtt_ns[i] = t2 - t;
        t = t2;
    }
    return 0;
}

static void futex_wake1(_Atomic uint32_t *w)
{
    syscall(SYS_futex, w, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* Sleep until *w != old. 0, or -ETIMEDOUT after PEER_TIMEOUT_NS. */
static int futex_wait_change(_Atomic uint32_t *w, uint32_t old)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = SLICE_NS};
    for (long slices = 0;; slices++) {
        /* acquire: pairs with the peer's release store before its wake */
        if (atomic_load_explicit(w, memory_order_acquire) != old)
            return 0;
        if (slices == MAX_SLICES)
            return -ETIMEDOUT;
        syscall(SYS_futex, w, FUTEX_WAIT, old, &ts, NULL, 0);
    }
}

int bench_floor_futex(bench_floor_area *a, enum bench_role role, uint32_t n, int64_t *rtt_ns)
{
    if (role == BENCH_ECHO) {
        for (uint32_t i = 0; i < n; i++) {
            /* relaxed: only this process writes pong */
            uint32_t q = atomic_load_explicit(&a->pong, memory_order_relaxed);
            if (futex_wait_change(&a->ping, q))
                return -ETIMEDOUT;
            /* release: pairs with the initiator's acquire in futex_wait_change */
            atomic_store_explicit(&a->pong, q + 1, memory_order_release);
            futex_wake1(&a->pong);
        }
        return 0;
    }
    /* relaxed: only this process writes ping; at rest pong == ping */
    uint32_t v = atomic_load_explicit(&a->ping, memory_order_relaxed);
    for (uint32_t i = 0; i < n; i++, v++) {
        int64_t t = bench_now_ns();
        /* release: pairs with the echo's acquire in futex_wait_change */
        atomic_store_explicit(&a->ping, v + 1, memory_order_release);
        futex_wake1(&a->ping);
        if (futex_wait_change(&a->pong, v))
            return -ETIMEDOUT;
        rtt_ns[i] = bench_now_ns() - t;
    }
    return 0;
}

double bench_floor_memcpy_gibs(size_t bytes, int reps)
{
    char *x = malloc(bytes), *y = malloc(bytes);
    if (!x || !y) {
        free(x);
        free(y);
        return -1;
    }
    memset(x, 1, bytes);
    memset(y, 2, bytes);
    int64_t best = INT64_MAX;
    for (int r = 0; r < reps; r++) {
        int64_t t = bench_now_ns();
        memcpy(y, x, bytes);
        t = bench_now_ns() - t;
        best = t < best ? t : best;
    }
    /* check after timing: the copy really happened (and cannot be elided) */
    int ok = y[bytes / 2] == 1 && y[bytes - 1] == 1;
    free(x);
    free(y);
    return ok ? (double)bytes / ((double)best * 1e-9) / (double)(1u << 30) : -1;
}

static int measure_pair(bench_floor_area *a, enum bench_role role, uint32_t ncl, uint32_t nfx, int64_t *s,
                        bench_floor_result *out)
{
    int rc = bench_floor_cacheline(a, role, ncl / 4 + 1, s); /* warm-up */
    if (!rc)
        rc = bench_floor_cacheline(a, role, ncl, s);
    if (!rc && role == BENCH_INITIATOR)
        out->cacheline = bench_lat_of(s, ncl);
    if (!rc)
        rc = bench_floor_futex(a, role, nfx / 4 + 1, s); /* warm-up */
    if (!rc)
        rc = bench_floor_futex(a, role, nfx, s);
    if (!rc && role == BENCH_INITIATOR)
        out->futex = bench_lat_of(s, nfx);
    return rc;
}

int bench_floor_measure(uint32_t n_cacheline, uint32_t n_futex, bench_floor_result *out)
{
    if (!n_cacheline || !n_futex)
        return -EINVAL;
    uint32_t n = n_cacheline > n_futex ? n_cacheline : n_futex;
    int64_t *s = malloc((size_t)(n + n / 4 + 1) * sizeof(*s));
    bench_floor_area *a = bench_shared_alloc(sizeof(*a));
    if (!s || !a) {
        free(s);
        bench_shared_free(a, sizeof(*a));
        return -ENOMEM;
    }
    pid_t pid = fork();
    if (pid == 0)
        _exit(measure_pair(a, BENCH_ECHO, n_cacheline, n_futex, NULL, NULL) ? 1 : 0);
    int rc = pid < 0 ? -errno : measure_pair(a, BENCH_INITIATOR, n_cacheline, n_futex, s, out);
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && !rc && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        rc = -ECHILD;
    free(s);
    bench_shared_free(a, sizeof(*a));
    return rc;
}

/* The area of bench_floor_futex_cpu: the ping-pong, and the echo's CPU. */
struct futex_cpu_area {
    bench_floor_area a;
    _Atomic int64_t echo_cpu_ns;
};

/* One side: a warm-up, then n timed round trips; its CPU time over them. */
static int futex_cpu_side(struct futex_cpu_area *f, enum bench_role role, uint32_t n, int64_t *s, int64_t *cpu)
{
    int rc = bench_floor_futex(&f->a, role, n / 4 + 1, s);
    int64_t t = bench_process_cpu_ns();
    if (!rc)
        rc = bench_floor_futex(&f->a, role, n, s);
    *cpu = bench_process_cpu_ns() - t;
    return rc;
}

/* One side of the yield ping-pong: `me` moves the word from me to !me,
 * n times, yielding while it is the other's turn. */
static int yield_side(_Atomic uint32_t *turn, uint32_t me, uint32_t n)
{
    int64_t limit = bench_now_ns() + 10ll * 1000000000;
    for (uint32_t i = 0; i < n; i++) {
        while (atomic_load_explicit(turn, memory_order_acquire) != me) { /* acquire: pairs with the other's store */
            sched_yield();
            if (bench_now_ns() > limit)
                return -ETIMEDOUT;
        }
        atomic_store_explicit(turn, !me, memory_order_release); /* release: pairs with the other's load */
    }
    return 0;
}

int bench_floor_yield_switch(uint32_t n, double *ns_per_switch)
{
    cpu_set_t mine, one;
    if (!n || sched_getaffinity(0, sizeof(mine), &mine))
        return -EINVAL;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &mine)) {
            CPU_SET(c, &one);
            break;
        }
    _Atomic uint32_t *turn = bench_shared_alloc(sizeof(*turn));
    if (!turn)
        return -ENOMEM;
    uint32_t warm = n / 4 + 1;
    pid_t pid = fork();
    if (pid == 0)
        _exit(sched_setaffinity(0, sizeof(one), &one) || yield_side(turn, 1, warm + n) ? 1 : 0);
    int rc = pid < 0 ? -errno : sched_setaffinity(0, sizeof(one), &one) ? -errno : yield_side(turn, 0, warm);
    int64_t t = bench_now_ns();
    if (!rc)
        rc = yield_side(turn, 0, n);
    t = bench_now_ns() - t;
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && !rc && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        rc = -ECHILD;
    sched_setaffinity(0, sizeof(mine), &mine);
    if (!rc)
        *ns_per_switch = (double)t / (2.0 * n);
    bench_shared_free(turn, sizeof(*turn));
    return rc;
}

int bench_floor_futex_cpu(uint32_t n, double *cpu_ns_per_rtt)
{
    if (!n)
        return -EINVAL;
    int64_t *s = malloc((size_t)n * sizeof(*s));
    struct futex_cpu_area *f = bench_shared_alloc(sizeof(*f));
    if (!s || !f) {
        free(s);
        bench_shared_free(f, sizeof(*f));
        return -ENOMEM;
    }
    pid_t pid = fork();
    if (pid == 0) {
        int64_t cpu = 0;
        int rc = futex_cpu_side(f, BENCH_ECHO, n, s, &cpu);
        atomic_store(&f->echo_cpu_ns, cpu); /* read after waitpid */
        _exit(rc ? 1 : 0);
    }
    int64_t cpu = 0;
    int rc = pid < 0 ? -errno : futex_cpu_side(f, BENCH_INITIATOR, n, s, &cpu);
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && !rc && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        rc = -ECHILD;
    if (!rc)
        *cpu_ns_per_rtt = (double)(cpu + atomic_load(&f->echo_cpu_ns)) / n;
    free(s);
    bench_shared_free(f, sizeof(*f));
    return rc;
}
