/* SPDX-License-Identifier: MIT */
/* Whether a process or thread is blocked in the kernel right now: state S
 * in its /proc stat line ("pid (comm) S ..."; the command may hold spaces
 * and parentheses, so the state is found after the last ')'). For tests
 * that must know a peer sleeps (only a ring can wake it now) before they
 * act; poll it with a bound.
 *
 * Test helper, header-only: each test program has its own copy.
 */
#ifndef SR_TESTS_PROC_STATE_H
#define SR_TESTS_PROC_STATE_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* path: "/proc/<pid>/stat" or "/proc/self/task/<tid>/stat". */
static inline bool proc_stat_sleeps(const char *path)
{
    char buf[256];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] == 'S';
}

#endif
