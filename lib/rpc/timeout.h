/* SPDX-License-Identifier: MIT */
/* Timeouts (internal): the one place where a timeout in seconds, as the
 * public API takes it, becomes whole milliseconds and then a deadline.
 *
 * Every conversion saturates instead of overflowing: a double is checked
 * before it is converted to an integer (a conversion out of range is
 * undefined behaviour), and a deadline is now + ms computed with an overflow
 * check. The rules (docs/API.md, "Timeouts"):
 *   - NaN and negative values are refused (-EINVAL);
 *   - +infinity (SR_TIMEOUT_NONE) is "none" (ms 0, deadline -1);
 *   - 0 is the function's default: callers whose default is a timeout (a
 *     call: the current default) replace it before they convert; converted,
 *     0 is "none", the default of the waits (sr_shutdown, sr_wait_for_*);
 *   - any s > 0 is at least 1 ms: a tiny timeout is never rounded to "none";
 *   - s above SR_MAX_RPC_TIMEOUT (about 31.7 years) is clamped to it. */
#ifndef SR_RPC_TIMEOUT_H
#define SR_RPC_TIMEOUT_H

#if !defined(SR__IN_RPC)
#error "timeout.h is private to the RPC core (rpc) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdint.h>

#include "module.h" /* sr__timeout_ms, sr__deadline_ns: modules use them too */
#include "shmrpc/rpc.h"

#define SR__MAX_TIMEOUT_MS ((int64_t)SR_MAX_RPC_TIMEOUT * 1000)

#endif
