/* SPDX-License-Identifier: MIT */
/* The leak checks themselves: a leak made by our code under Criterion is
 * reported, both in a test process (the LEAK_CHECKED_SUITE check) and in an
 * sr_spawn worker (its check before _exit). Both run with the suppressions of
 * every test (tests/lsan.supp): a suppression broad enough to hide our leaks
 * (leak:libcriterion.so did: Criterion's frames are under every test) fails
 * these tests. Built only with -Dsanitize=true. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "shmrpc/error.h"
#include "shmrpc/spawn.h"

#include <sanitizer/lsan_interface.h>

LEAK_CHECKED_SUITE(lsan_canary);

#define HIDE ((uintptr_t)0x5a5a5a5a5a5a5a5a)

/* A block only reachable through a disguised pointer: leaked to LSan, freed
 * again through the disguise. noinline: its frame (and the plain pointer in
 * it) is gone when the check runs. */
__attribute__((noinline)) static uintptr_t hidden_block(size_t n)
{
    char *p = malloc(n);
    if (!p)
        abort();
    memset(p, 0x42, n);
    return (uintptr_t)p ^ HIDE;
}

/* Overwrite the dead stack below us, where copies of the pointer may remain. */
__attribute__((noinline)) static void scrub_stack(void)
{
    volatile char junk[4096];
    memset((char *)junk, 0, sizeof(junk));
}

/* Run f with stderr sent to /dev/null (the expected report is noise). */
static int quietly(int (*f)(void))
{
    fflush(stderr);
    int saved = dup(2), null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    cr_assert(saved >= 0 && null >= 0);
    dup2(null, 2);
    close(null);
    int r = f();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    return r;
}

static int recoverable_check(void) { return __lsan_do_recoverable_leak_check(); }

Test(lsan_canary, a_leak_in_a_test_is_reported)
{
    uintptr_t h = hidden_block(123);
    scrub_stack();
    int leaked = quietly(recoverable_check);
    free((void *)(h ^ HIDE)); /* now the after-test check must find nothing */
    cr_assert(leaked, "LeakSanitizer did not report a block leaked by the test body: a suppression in "
                      "tests/lsan.supp (or LSAN_OPTIONS) hides our own leaks");
}

static int leaking_worker(int rank, int n, void *arg)
{
    (void)rank, (void)n, (void)arg;
    /* The worker's own check reports to stderr just before _exit. */
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null >= 0)
        dup2(null, 2);
    (void)hidden_block(77); /* never freed */
    scrub_stack();
    return 0; /* a clean return: sr_spawn's leak check runs */
}

Test(lsan_canary, a_leak_in_a_worker_fails_the_job)
{
    sr_spawn_opts o = {.name_prefix = test_ns("canary"), .shm_size = 16u << 20};
    int rc = sr_spawn(1, leaking_worker, NULL, &o);
    cr_assert_eq(rc, -SR_EWORKER, "a worker that leaked and returned 0 should fail the job, got %d (%s): a "
                                  "suppression in tests/lsan.supp hides our own leaks",
                 rc, rc ? sr_last_error() : "no error");
    cr_assert(strstr(sr_last_error(), "exited with status"), "%s", sr_last_error());
}
