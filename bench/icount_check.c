/* SPDX-License-Identifier: MIT */
/* The instruction counter's own test (icount.h; suite bench): a region of a
 * known number of instructions, counted twice with different lengths, must
 * differ by exactly the instructions added, whatever the pair's own cost.
 * Exit 0 if so, 1 if not, 77 (skipped) where ptrace is refused. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "icount.h"

/* 1 + 2n instructions: the load of the count, then n rounds of dec and jnz. */
static int64_t count_loop(uint64_t n, int *err)
{
    bench_icount ic;
    int rc = bench_icount_begin(&ic);
    if (rc) {
        *err = rc;
        return -1;
    }
#if defined(__x86_64__)
    __asm__ volatile("mov %0, %%rcx\n1:\n\tdec %%rcx\n\tjnz 1b" : : "r"(n) : "rcx", "cc");
#else
    for (volatile uint64_t i = 0; i < n; i++) {
    }
#endif
    int64_t got = bench_icount_end(&ic);
    if (got < 0)
        *err = (int)got;
    return got;
}

int main(void)
{
#if !defined(__x86_64__)
    puts("icount_check: skipped (the test loop is x86-64 assembly)");
    return 77;
#endif
    int err = 0;
    int64_t a = count_loop(1000, &err), b = count_loop(3000, &err);
    if (err == -EPERM || err == -ENOSYS) {
        printf("icount_check: skipped (ptrace refused: %s)\n", strerror(-err));
        return 77;
    }
    if (a < 0 || b < 0) {
        fprintf(stderr, "icount_check: could not count: %s\n", strerror(-err));
        return 1;
    }
    /* the same region twice more: the count is exact, so it must repeat */
    int64_t a2 = count_loop(1000, &err);
    printf("icount_check: 1000 rounds %lld instructions, 3000 rounds %lld (again: %lld)\n", (long long)a,
           (long long)b, (long long)a2);
    if (b - a != 4000 || a2 != a) {
        fprintf(stderr, "icount_check: expected the 2000 more rounds to add 4000 instructions and the repeat to "
                        "match: %lld more, repeat %lld against %lld\n", (long long)(b - a), (long long)a2, (long long)a);
        return 1;
    }
    return 0;
}
