/* SPDX-License-Identifier: MIT */
/* The shim runners' shared part. See registry.h. */
#include "registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct srt_test **srt_tests;
size_t srt_ntests;
static size_t tests_cap;

static struct suite {
    const char *name;
    struct srt_opts opts;
} suites[64];
static size_t nsuites;

static void out_of_memory(void)
{
    fputs("srt: out of memory registering tests\n", stderr);
    abort();
}

void srt_register_test(struct srt_test *t)
{
    if (srt_ntests == tests_cap) {
        tests_cap = tests_cap ? 2 * tests_cap : 64;
        srt_tests = realloc(srt_tests, tests_cap * sizeof(*srt_tests));
        if (!srt_tests)
            out_of_memory();
    }
    srt_tests[srt_ntests++] = t;
}

void srt_register_suite(const char *suite, const struct srt_opts *opts)
{
    if (nsuites == sizeof(suites) / sizeof(suites[0]))
        out_of_memory();
    suites[nsuites++] = (struct suite){suite, *opts};
}

const struct srt_opts *srt_suite_opts(const char *name)
{
    static const struct srt_opts none;
    for (size_t i = 0; i < nsuites; i++)
        if (!strcmp(suites[i].name, name))
            return &suites[i].opts;
    return &none;
}

double srt_timeout_of(const struct srt_test *t, double dflt)
{
    const struct srt_opts *s = srt_suite_opts(t->suite);
    return t->opts.timeout > 0 ? t->opts.timeout : s->timeout > 0 ? s->timeout : dflt;
}

void srt_check_text(char why[SRT_REASON_MAX], const char *file, int line, const char *expr, const char *fmt,
                    va_list ap)
{
    char msg[SRT_REASON_MAX - 128] = "";
    vsnprintf(msg, sizeof(msg), fmt + 1, ap); /* fmt starts with the shim's space */
    snprintf(why, SRT_REASON_MAX, "%s:%d: %s%s%s", file, line, expr, *msg ? ": " : "", msg);
}

void srt_run_body(const struct srt_test *t, sigjmp_buf *jmp)
{
    const struct srt_opts *const volatile s = srt_suite_opts(t->suite); /* volatile: kept across the longjmp */
    if (!sigsetjmp(*jmp, 0)) {
        if (s->init)
            s->init();
        if (t->opts.init)
            t->opts.init();
        t->fn();
    }
    if (!sigsetjmp(*jmp, 0)) {
        if (t->opts.fini)
            t->opts.fini();
        if (s->fini)
            s->fini();
    }
}

double srt_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}
