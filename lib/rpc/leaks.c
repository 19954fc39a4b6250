/* SPDX-License-Identifier: MIT */
/* The shutdown leak check of tensors and values. See leaks.h. */
#include "leaks.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>

#include "error.h"
#include "log.h"
#include "shmrpc/rpc.h"
#include "tensor_seam.h"
#include "value_internal.h"

static _Atomic bool ignore_leak;
/* Written by sr_init and read by sr_shutdown, both under the life lock. */
static int64_t base_tensors[3], base_values[SR__VALUE_KINDS];

SR_API void sr_set_ignore_leak(bool ignore)
{
    /* relaxed: a setting read by the next sr_shutdown; the caller orders
     * it before that call */
    atomic_store_explicit(&ignore_leak, ignore, memory_order_relaxed);
}

void sr__leaks_baseline(void)
{
    sr__tensor_live_counts(base_tensors);
    sr__value_live_counts(base_values);
}

/* " (2 f32, 1 i64)": the kinds with a count above their baseline, into
 * buf; returns the total. Counts below their baseline (objects made before
 * sr_init and freed since) are none. */
static int64_t kinds(const int64_t *now, const int64_t *base, int n, const char *(*name)(int), char *buf,
                     size_t len)
{
    int64_t total = 0;
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        int64_t d = now[i] - base[i];
        if (d <= 0)
            continue;
        total += d;
        if (used < len)
            used += (size_t)snprintf(buf + used, len - used, "%s%" PRId64 " %s", used ? ", " : " (", d, name(i));
    }
    if (used && used < len)
        snprintf(buf + used, len - used, ")");
    return total;
}

static const char *dtype_name(int i) { return sr_dtype_name((sr_dtype)i); }
static const char *kind_name(int i) { return sr_kind_name((sr_kind)i); }

int sr__leaks_check(const char *who)
{
    int64_t t[3], v[SR__VALUE_KINDS];
    char tk[96], vk[256];
    sr__tensor_live_counts(t);
    sr__value_live_counts(v);
    int64_t nt = kinds(t, base_tensors, 3, dtype_name, tk, sizeof(tk));
    int64_t nv = kinds(v, base_values, SR__VALUE_KINDS, kind_name, vk, sizeof(vk));
    if (!nt && !nv)
        return 0;
    char msg[1024];
    snprintf(msg, sizeof(msg),
             "Detected tensor and value leaks during shutdown: %s still holds %" PRId64 " tensor%s%s and %" PRId64
             " value%s%s made since sr_init (release them before sr_shutdown)",
             who, nt, nt == 1 ? "" : "s", tk, nv, nv == 1 ? "" : "s", vk);
    sr_logf(SR_LOG_WARN, "%s", msg);
    /* relaxed: see sr_set_ignore_leak */
    return atomic_load_explicit(&ignore_leak, memory_order_relaxed) ? 0 : sr__fail(-EBUSY, "sr_shutdown", "%s", msg);
}
