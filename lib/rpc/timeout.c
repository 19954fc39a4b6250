/* SPDX-License-Identifier: MIT */
/* Timeout conversion. See timeout.h. */
#include "timeout.h"

#include <errno.h>
#include <math.h>

#include "error.h"

int sr__timeout_ms(double s, const char *fn, int64_t *ms)
{
    if (isnan(s) || s < 0)
        return sr__fail(-EINVAL, fn, "timeout %g is not a number of seconds (>= 0: 0 is the default, "
                                     "SR_TIMEOUT_NONE no timeout)", s);
    if (isinf(s)) { /* SR_TIMEOUT_NONE */
        *ms = 0;
        return 0;
    }
    if (s >= SR_MAX_RPC_TIMEOUT) { /* checked before any conversion: a double too large for int64 is UB */
        *ms = SR__MAX_TIMEOUT_MS;
        return 0;
    }
    int64_t t = llround(s * 1000); /* s * 1000 < 1e12: in range */
    *ms = s > 0 && t == 0 ? 1 : t; /* never round a real timeout to "none" */
    return 0;
}

int64_t sr__deadline_ns(int64_t now_ns, int64_t ms)
{
    if (ms <= 0)
        return -1;
    int64_t ns, d;
    if (__builtin_mul_overflow(ms, (int64_t)1000000, &ns) || __builtin_add_overflow(now_ns, ns, &d))
        return INT64_MAX;
    return d;
}
