/* SPDX-License-Identifier: MIT */
/* Shared helpers for the Criterion suites. */
#ifndef SR_TESTS_COMMON_H
#define SR_TESTS_COMMON_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The voluntary context switches a /proc status file counts (a thread's:
 * /proc/thread-self/status, /proc/self/task/N/status), or -1 if it cannot
 * be read (the thread has ended). */
static inline long long proc_voluntary_switches(const char *status_path)
{
    FILE *f = fopen(status_path, "r");
    char line[128];
    long long v = -1, x;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "voluntary_ctxt_switches: %lld", &x) == 1)
            v = x;
    if (f)
        fclose(f);
    return v;
}

/* This process's threads whose name (/proc/self/task/N/comm) starts with
 * prefix: the runtime's shmrpc-exec*, shmrpc-standby, ... */
static inline int threads_named(const char *prefix)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[64], comm[32] = "";
        snprintf(path, sizeof(path), "/proc/self/task/%.20s/comm", e->d_name);
        FILE *f = e->d_name[0] == '.' ? NULL : fopen(path, "r");
        if (f && fgets(comm, sizeof(comm), f))
            n += !strncmp(comm, prefix, strlen(prefix));
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return n;
}

/* A segment name unique to this test process, so suites can run in parallel
 * and leak checks can look for exactly this test's segment. */
static inline const char *test_ns(const char *test)
{
    static _Thread_local char buf[40];
    snprintf(buf, sizeof(buf), "t-%.24s-%d", test, (int)getpid());
    return buf;
}


/* Criterion runs each test in a child process and ignores the report
 * LeakSanitizer prints when that child exits, so a leaking test would still
 * pass. Every suite declares itself with LEAK_CHECKED_SUITE(name): after each
 * test, a leak check runs and a leak aborts the test process. Criterion 2.4
 * counts a crash in .fini as a warning, not a failure ("crashed during its
 * setup or teardown"; the synthesis still says Passing), and a binary with a
 * warning exits 1, which fails the meson test. So never run the suites with
 * --ignore-warnings; and a cr_assert in .fini would not work (2.4 ignores
 * it). tests/lsan.supp must not suppress our code: see lsan_canary.c. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#include <stdlib.h>
static inline void sr_test_no_leaks(void)
{
    if (__lsan_do_recoverable_leak_check()) {
        fprintf(stderr, "LeakSanitizer found leaks in this test (report above)\n");
        abort();
    }
}
#else
static inline void sr_test_no_leaks(void) {}
#endif
#define LEAK_CHECKED_SUITE(name) TestSuite(name, .fini = sr_test_no_leaks)

#endif
