/* SPDX-License-Identifier: MIT */
/* Numbers from the command line and the environment: one strict syntax.
 *
 * The whole string is the number, in decimal: no leading or trailing
 * whitespace, no '+', no base prefix ("0x10"), no empty string, no
 * overflow. A '-' is accepted only where negative values are (lo < 0).
 * strtol alone skips leading whitespace and signs, which made " 3" pass
 * where "3 " did not. Each caller words its own error, naming the option or
 * variable and quoting the value; these only say whether it is one.
 */
#ifndef SR_SHM_PARSE_H
#define SR_SHM_PARSE_H

#if !defined(SR__SEES_BASE)
#error "parse.h is the seam of the base layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stddef.h>
#include <stdint.h>

/* The first len bytes of s, all decimal digits (at least one), as a value
 * <= max. 0, or -EINVAL (not digits), -ERANGE (above max). */
int sr__parse_digits(const char *s, size_t len, uint64_t max, uint64_t *out);

/* s, a decimal integer in [lo, hi] ('-' only when lo < 0). 0, -EINVAL, -ERANGE. */
int sr__parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);

/* s, seconds in [0, max]: digits with an optional fraction ("10", "0.5",
 * ".5", "2."), no sign or exponent. 0, -EINVAL, -ERANGE. */
int sr__parse_seconds(const char *s, double max, double *out);

/* Environment variable `name` as by sr__parse_int: 0 and *out (left alone
 * when unset), or -EINVAL with the error 'fn: environment NAME="V" is not an
 * integer in [lo, hi]'. */
int sr__env_int(const char *fn, const char *name, int64_t lo, int64_t hi, int64_t *out);

#endif
