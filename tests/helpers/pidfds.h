/* SPDX-License-Identifier: MIT */
/* How many pidfds this process holds (tests/job: a worker must hold none
 * of its siblings' under a supervisor, and inherit none). Header-only. */
#ifndef SR_TESTS_PIDFDS_H
#define SR_TESTS_PIDFDS_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static inline int count_pidfds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    char path[64], target[64];
    while (d && (e = readdir(d))) {
        snprintf(path, sizeof(path), "/proc/self/fd/%.20s", e->d_name);
        ssize_t len = readlink(path, target, sizeof(target) - 1);
        target[len > 0 ? len : 0] = 0;
        n += !strcmp(target, "anon_inode:[pidfd]");
    }
    if (d)
        closedir(d);
    return n;
}

#endif
