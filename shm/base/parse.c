/* SPDX-License-Identifier: MIT */
/* Numbers from the command line and the environment. See parse.h. */
#include "parse.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static int is_digit(char c) { return c >= '0' && c <= '9'; }

int sr__parse_digits(const char *s, size_t len, uint64_t max, uint64_t *out)
{
    if (!s || len == 0)
        return -EINVAL;
    uint64_t v = 0;
    int range = 0;
    for (size_t i = 0; i < len; i++) {
        if (!is_digit(s[i]))
            return -EINVAL;
        unsigned d = (unsigned)(s[i] - '0');
        if (d > max || v > (max - d) / 10) /* v * 10 + d > max, without overflowing */
            range = -ERANGE;  /* keep checking: a later non-digit makes it -EINVAL */
        else
            v = v * 10 + d;
    }
    if (range)
        return range;
    *out = v;
    return 0;
}

int sr__parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (!s)
        return -EINVAL;
    bool neg = s[0] == '-' && lo < 0;
    const char *d = s + neg;
    /* the magnitude's bound: |lo| for a negative value (as unsigned: INT64_MIN too) */
    uint64_t max = neg ? (uint64_t)0 - (uint64_t)lo : hi < 0 ? 0 : (uint64_t)hi;
    uint64_t m;
    int rc = sr__parse_digits(d, strlen(d), max, &m);
    if (rc)
        return rc;
    int64_t v = neg ? (int64_t)(0 - m) : (int64_t)m;
    if (v < lo || v > hi)
        return -ERANGE;
    *out = v;
    return 0;
}

int sr__parse_seconds(const char *s, double max, double *out)
{
    if (!s)
        return -EINVAL;
    size_t whole = strspn(s, "0123456789");
    size_t frac = s[whole] == '.' ? strspn(s + whole + 1, "0123456789") : 0;
    size_t len = whole + (s[whole] == '.') + frac;
    if (whole + frac == 0 || s[len])
        return -EINVAL;
    double v = strtod(s, NULL); /* plain decimal, checked above (shmrun runs in the C locale) */
    if (!(v <= max))
        return -ERANGE;
    *out = v;
    return 0;
}

int sr__env_int(const char *fn, const char *name, int64_t lo, int64_t hi, int64_t *out)
{
    const char *s = getenv(name);
    if (s && sr__parse_int(s, lo, hi, out))
        return sr__fail(-EINVAL, fn, "environment %s=\"%s\" is not an integer in [%lld, %lld]", name, s,
                        (long long)lo, (long long)hi);
    return 0;
}
