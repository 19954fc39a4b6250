/* SPDX-License-Identifier: MIT */
/* What the shim's suite runners share (tests/mpi/runner.c, tests/tsan/runner.c):
 * the table the Test and TestSuite constructors fill before main, a test's
 * bound, and the text of a failed check. Each runner decides how a test
 * runs, how it is bounded and how its outcome is told. */
#ifndef SR_TESTS_SHIM_REGISTRY_H
#define SR_TESTS_SHIM_REGISTRY_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include "criterion/criterion.h"

#define SRT_REASON_MAX 512

/* Every registered test, in registration (source) order. */
extern struct srt_test **srt_tests;
extern size_t srt_ntests;

/* The test's .timeout, else its suite's, else dflt (seconds). */
double srt_timeout_of(const struct srt_test *t, double dflt);
/* The suite's .init/.fini (a suite without TestSuite has none). */
const struct srt_opts *srt_suite_opts(const char *suite);

/* "file:line: expr: message" of a failed check into why; fmt starts with
 * the shim's space (criterion.h, SRT_CHECK_). */
void srt_check_text(char why[SRT_REASON_MAX], const char *file, int line, const char *expr, const char *fmt,
                    va_list ap);

/* The suite's init, the test's init, its body, then the test's fini and the
 * suite's fini, as under Criterion. A fatal check or a skip siglongjmps to
 * *jmp (the runner's), which lands back here: the finis (the leak check)
 * still run. */
void srt_run_body(const struct srt_test *t, sigjmp_buf *jmp);

double srt_now_s(void);

#endif
