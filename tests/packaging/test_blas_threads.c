/* SPDX-License-Identifier: MIT */
/* OpenBLAS's thread count is the host application's unless SHMRPC_BLAS_THREADS
 * asks otherwise (lib/tensor/gemm.c, docs/TENSORS.md).
 * Each test runs in its own process (Criterion forks), so each sees gemm.c's
 * once-only decision fresh: the "host" sets a count, shmrpc runs a matmul,
 * and the count afterwards is what the variable promised; and a process
 * forked before its first matmul starts no OpenBLAS pool. Without OpenBLAS
 * the suite skips itself. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include "../common.h"
#include <shmrpc/tensor.h>

#ifdef SR_HAVE_CBLAS
#include <cblas.h>
#endif

LEAK_CHECKED_SUITE(blas_threads);

/* The host sets `host` threads, then shmrpc's first matmul runs (checked);
 * returns OpenBLAS's thread count after it. */
static int count_after_matmul(const char *shmrpc_env, const char *openblas_env, int host)
{
#ifdef SR_HAVE_CBLAS
    unsetenv("SHMRPC_BLAS_THREADS");
    unsetenv("OPENBLAS_NUM_THREADS");
    if (shmrpc_env)
        setenv("SHMRPC_BLAS_THREADS", shmrpc_env, 1);
    if (openblas_env)
        setenv("OPENBLAS_NUM_THREADS", openblas_env, 1);
    openblas_set_num_threads(host);
    cr_assert_eq(openblas_get_num_threads(), host, "OpenBLAS did not take the host's %d threads", host);
    cr_assert_str_eq(sr_matmul_backend(), "openblas");
    int64_t shape[2] = {8, 8};
    sr_tensor *a = sr_ones(SR_F64, 2, shape, 0), *b = sr_ones(SR_F64, 2, shape, 0);
    sr_tensor *c = sr_mm(a, b);
    cr_assert(c, "sr_mm: %s", sr_last_error());
    double v[64];
    cr_assert_eq(sr_tensor_to_f64(c, v, 64), 0);
    cr_assert_eq(v[0], 8.0);
    cr_assert_eq(v[63], 8.0);
    sr_tensor_unref(a);
    sr_tensor_unref(b);
    sr_tensor_unref(c);
    return openblas_get_num_threads();
#else
    (void)shmrpc_env, (void)openblas_env, (void)host;
    cr_skip_test("built without OpenBLAS");
    return -1;
#endif
}

/* The documented default: one thread per worker process. */
Test(blas_threads, unset_sets_one_thread)
{
    int n = count_after_matmul(NULL, NULL, 2);
    cr_assert_eq(n, 1, "SHMRPC_BLAS_THREADS unset: expected 1 BLAS thread after a matmul, got %d", n);
}

/* keep: the host's own openblas_set_num_threads() stands. */
Test(blas_threads, keep_leaves_the_host_setting)
{
    int n = count_after_matmul("keep", NULL, 2);
    cr_assert_eq(n, 2, "SHMRPC_BLAS_THREADS=keep: the host's 2 threads became %d", n);
}

/* OPENBLAS_NUM_THREADS set and SHMRPC_BLAS_THREADS unset: the user asked
 * OpenBLAS directly, shmrpc leaves it. */
Test(blas_threads, openblas_num_threads_is_respected)
{
    int n = count_after_matmul(NULL, "2", 2);
    cr_assert_eq(n, 2, "OPENBLAS_NUM_THREADS=2: the count became %d", n);
}

Test(blas_threads, explicit_count)
{
    int n = count_after_matmul("2", NULL, 1);
    cr_assert_eq(n, 2, "SHMRPC_BLAS_THREADS=2: expected 2 threads, got %d", n);
}

/* A value that is neither a count nor "keep" is said on stderr, naming it,
 * and the default applies. */
Test(blas_threads, bad_value_is_reported, .init = cr_redirect_stderr)
{
    int n = count_after_matmul("lots", NULL, 2);
    cr_assert_eq(n, 1, "SHMRPC_BLAS_THREADS=lots: expected the default 1, got %d", n);
    fflush(stderr);
    char buf[512] = {0};
    FILE *f = cr_get_redirected_stderr();
    size_t got = fread(buf, 1, sizeof(buf) - 1, f);
    cr_assert(got > 0 && strstr(buf, "SHMRPC_BLAS_THREADS='lots'") && strstr(buf, "'keep'"),
              "stderr does not name the bad value: '%s'", buf);
}

#ifdef SR_HAVE_CBLAS
/* This process's threads (/proc/self/task), or -1. */
static int own_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}
#endif

/* A process forked before its first matmul (sr_spawn's workers) inherits
 * the choice made. OpenBLAS shuts its pool down at a fork and rebuilds it
 * in the child at the next openblas_set_num_threads, so a child that made
 * the choice itself got one pool thread that never works and spins on
 * sched_yield for about 0.1 s of CPU. The child must run its matmul with
 * no thread beside its own. */
Test(blas_threads, a_forked_child_starts_no_blas_pool)
{
#ifdef SR_HAVE_CBLAS
    unsetenv("SHMRPC_BLAS_THREADS");
    unsetenv("OPENBLAS_NUM_THREADS");
    if (openblas_get_num_procs() < 2)
        cr_skip_test("one CPU: OpenBLAS has no pool to start");
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        int64_t shape[2] = {8, 8};
        sr_tensor *a = sr_ones(SR_F32, 2, shape, 0);
        sr_tensor *c = a ? sr_mm(a, a) : NULL;
        int threads = own_threads();
        sr_tensor_unref(a);
        sr_tensor_unref(c);
        _exit(!c ? 2 : threads == 1 && openblas_get_num_threads() == 1 ? 0 : 3 + (threads > 1));
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "the child did not exit");
    cr_assert_neq(WEXITSTATUS(st), 2, "the child's matmul failed");
    cr_assert_eq(WEXITSTATUS(st), 0, "after a matmul, the forked child %s",
                 WEXITSTATUS(st) == 4 ? "had an OpenBLAS pool thread beside its own" : "did not run OpenBLAS on one thread");
#else
    cr_skip_test("built without OpenBLAS");
#endif
}
