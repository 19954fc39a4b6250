/* SPDX-License-Identifier: MIT */
/* A stand-in for <criterion/criterion.h> for the suite runners that run
 * Criterion suites without Criterion's process machinery:
 * - the MPI suite runner (tests/mpi/runner.c, SR_TEST_MPI): the RPC, RRef
 *   and distributed-autograd suites run by every rank of an `mpirun -n 4`
 *   job, one test after another in the same processes (MPI is initialised
 *   once per process, so Criterion's process per test cannot run there);
 * - the ThreadSanitizer runner (tests/tsan/runner.c): Criterion's binaries
 *   cannot start under TSan ("Could not initialize inheritable arena"), so
 *   the concurrency suites are compiled again and run one test per forked
 *   process, with each TSan report attributed to its test.
 * Both define SR_TEST_SHIM and put tests/shim first on the include path.
 *
 * What the suites use of Criterion, and nothing more:
 * - Test(suite, name, .timeout, .disabled, .init, .fini, .description)
 *   registers the test in the runner's table (a constructor);
 * - TestSuite(suite, .init, .fini, .timeout) gives a suite's defaults
 *   (LEAK_CHECKED_SUITE's leak check runs after each test, as in Criterion);
 * - cr_assert* stops the test and fails it; cr_expect* fails it and goes
 *   on; cr_skip_test skips it; cr_log_* print on stderr.
 * The runner decides each test's outcome (under MPI: agreed across ranks,
 * tests/mpi/srt.h). */
#ifndef SR_TESTS_SHIM_CRITERION_H
#define SR_TESTS_SHIM_CRITERION_H

#ifndef SR_TEST_SHIM
#error "tests/shim is for the shim suite runners only (SR_TEST_SHIM): tests/mpi, tests/tsan"
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h> /* Criterion's header brings these in; the suites rely on it */
#include <string.h>

#ifdef SR_TEST_MPI
#include "srt.h" /* the harness routes its jobs through the MPI runner */
#endif

/* ---- registration ---- */

/* Options of a test or a suite (Criterion's names; 0 means unset). */
struct srt_opts {
    int unset_; /* lets the initialiser start with a field the user never names */
    double timeout;
    bool disabled;
    void (*init)(void);
    void (*fini)(void);
    const char *description;
};

struct srt_test {
    const char *suite, *name;
    void (*fn)(void);
    struct srt_opts opts;
};

void srt_register_test(struct srt_test *t);
void srt_register_suite(const char *suite, const struct srt_opts *opts);

#define Test(suite, name, ...)                                                                  \
    static void srt_fn_##suite##_##name(void);                                                  \
    __attribute__((constructor)) static void srt_reg_##suite##_##name(void)                     \
    {                                                                                           \
        static struct srt_test t_ = {#suite, #name, srt_fn_##suite##_##name,                    \
                                     {.unset_ = 0, __VA_ARGS__}};                               \
        srt_register_test(&t_);                                                                 \
    }                                                                                           \
    static void srt_fn_##suite##_##name(void)

#define TestSuite(suite, ...)                                                                   \
    __attribute__((constructor)) static void srt_suite_##suite(void)                           \
    {                                                                                           \
        static const struct srt_opts o_ = {.unset_ = 0, __VA_ARGS__};                           \
        srt_register_suite(#suite, &o_);                                                        \
    }

/* ---- assertions ---- */

/* A failed check: fatal ones end the test on this rank (a longjmp to the
 * runner; inside a job it takes the whole job down instead, since the rank's
 * agent is still running). fmt starts with a space (see SRT_CHECK_). */
void srt_check(bool fatal, bool ok, const char *file, int line, const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
_Noreturn void srt_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void srt_log(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* " " __VA_ARGS__: the optional message joins a one-space literal, so a
 * check without a message still has a (non-empty) format. */
#define SRT_CHECK_(fatal, ok, expr, ...) srt_check(fatal, ok, __FILE__, __LINE__, expr, " " __VA_ARGS__)

#define cr_assert(cond, ...) SRT_CHECK_(true, (cond), #cond, __VA_ARGS__)
#define cr_expect(cond, ...) SRT_CHECK_(false, (cond), #cond, __VA_ARGS__)
#define cr_assert_not(cond, ...) SRT_CHECK_(true, !(cond), "!(" #cond ")", __VA_ARGS__)
#define cr_expect_not(cond, ...) SRT_CHECK_(false, !(cond), "!(" #cond ")", __VA_ARGS__)
#define cr_assert_fail(...) SRT_CHECK_(true, false, "cr_assert_fail", __VA_ARGS__)
#define cr_expect_fail(...) SRT_CHECK_(false, false, "cr_expect_fail", __VA_ARGS__)

/* The operands are named as written (stringified here, before expansion). */
#define SRT_CMP_(fatal, ok, a, op, b, ...) SRT_CHECK_(fatal, ok, a " " op " " b, __VA_ARGS__)
#define cr_assert_eq(a, b, ...) SRT_CMP_(true, (a)==(b), #a, "==", #b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...) SRT_CMP_(true, (a)!=(b), #a, "!=", #b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...) SRT_CMP_(true, (a)<(b), #a, "<", #b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...) SRT_CMP_(true, (a)<=(b), #a, "<=", #b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...) SRT_CMP_(true, (a)>(b), #a, ">", #b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...) SRT_CMP_(true, (a)>=(b), #a, ">=", #b, __VA_ARGS__)
#define cr_expect_eq(a, b, ...) SRT_CMP_(false, (a)==(b), #a, "==", #b, __VA_ARGS__)
#define cr_expect_neq(a, b, ...) SRT_CMP_(false, (a)!=(b), #a, "!=", #b, __VA_ARGS__)
#define cr_expect_lt(a, b, ...) SRT_CMP_(false, (a)<(b), #a, "<", #b, __VA_ARGS__)
#define cr_expect_leq(a, b, ...) SRT_CMP_(false, (a)<=(b), #a, "<=", #b, __VA_ARGS__)
#define cr_expect_gt(a, b, ...) SRT_CMP_(false, (a)>(b), #a, ">", #b, __VA_ARGS__)
#define cr_expect_geq(a, b, ...) SRT_CMP_(false, (a)>=(b), #a, ">=", #b, __VA_ARGS__)
#define cr_assert_null(p, ...) SRT_CHECK_(true, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_assert_not_null(p, ...) SRT_CHECK_(true, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_expect_null(p, ...) SRT_CHECK_(false, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_expect_not_null(p, ...) SRT_CHECK_(false, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) SRT_CHECK_(true, !strcmp((a), (b)), #a " == " #b, __VA_ARGS__)
#define cr_assert_str_neq(a, b, ...) SRT_CHECK_(true, strcmp((a), (b)) != 0, #a " != " #b, __VA_ARGS__)
#define cr_expect_str_eq(a, b, ...) SRT_CHECK_(false, !strcmp((a), (b)), #a " == " #b, __VA_ARGS__)
#define cr_expect_str_neq(a, b, ...) SRT_CHECK_(false, strcmp((a), (b)) != 0, #a " != " #b, __VA_ARGS__)

#define cr_assert_float_eq(a, b, eps, ...) \
    SRT_CHECK_(true, ((a) - (b) <= (eps)) && ((b) - (a) <= (eps)), #a " == " #b " (within " #eps ")", __VA_ARGS__)
#define cr_expect_float_eq(a, b, eps, ...) \
    SRT_CHECK_(false, ((a) - (b) <= (eps)) && ((b) - (a) <= (eps)), #a " == " #b " (within " #eps ")", __VA_ARGS__)
#define cr_assert_arr_eq(a, b, size, ...) SRT_CHECK_(true, !memcmp((a), (b), (size)), #a " == " #b, __VA_ARGS__)

#define cr_skip_test(...) srt_skip(" " __VA_ARGS__)
#define cr_log_info(...) srt_log("info", __VA_ARGS__)
#define cr_log_warn(...) srt_log("warning", __VA_ARGS__)
#define cr_log_error(...) srt_log("error", __VA_ARGS__)

#endif
