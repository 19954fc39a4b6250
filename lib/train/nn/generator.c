/* SPDX-License-Identifier: MIT */
/* The seeded generator of nn.h: xoshiro256** (Blackman and Vigna) seeded
 * through splitmix64, and what is drawn from it. Only integer arithmetic
 * and exact conversions, so a seed gives the same stream on every machine. */
#include <errno.h>
#include <math.h>

#include "error.h"
#include "shmrpc/nn.h"
#include "tensor_seam.h"

/* A NULL generator: -EINVAL in sr_last_error() and the documented "no value". */
static bool null_gen(const sr_generator *g, const char *fn)
{
    if (g)
        return false;
    sr__fail(-EINVAL, fn, "generator is NULL");
    return true;
}

SR_API void sr_generator_init(sr_generator *g, uint64_t seed)
{
    if (!null_gen(g, "sr_generator_init"))
        sr__xoshiro_seed(g->s, seed);
}

SR_API uint64_t sr_generator_next(sr_generator *g)
{
    return null_gen(g, "sr_generator_next") ? 0 : sr__xoshiro_next(g->s);
}

SR_API double sr_generator_uniform(sr_generator *g)
{
    if (null_gen(g, "sr_generator_uniform"))
        return NAN;
    return (double)(sr__xoshiro_next(g->s) >> 11) * 0x1.0p-53; /* exact: 53 bits */
}

SR_API uint64_t sr_generator_below(sr_generator *g, uint64_t n)
{
    if (null_gen(g, "sr_generator_below") || n == 0)
        return 0;
    /* Reject the lowest 2^64 mod n values so every residue is equally likely. */
    uint64_t floor = -n % n, r;
    do
        r = sr_generator_next(g);
    while (r < floor);
    return r % n;
}

SR_API int sr_generator_permutation(sr_generator *g, int64_t n, int64_t *out)
{
    if (n < 0 || (n > 0 && !out))
        return sr__fail(-EINVAL, "sr_generator_permutation", "bad arguments (n %lld, out %p)", (long long)n,
                        (void *)out);
    for (int64_t i = 0; i < n; i++)
        out[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)sr_generator_below(g, (uint64_t)i + 1), t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
    return 0;
}

SR_API sr_tensor *sr_generator_uniform_tensor(sr_generator *g, sr_dtype dt, int ndim, const int64_t *shape,
                                              double lo, double hi, unsigned flags)
{
    const char *fn = "sr_generator_uniform_tensor";
    if (!g || dt == SR_I64 || sr__check_dtype(fn, dt)) {
        sr__fail(-EINVAL, fn, "needs a generator and dtype f32 or f64 (got %s)", sr_dtype_name(dt));
        return NULL;
    }
    sr_tensor *t = sr_empty(dt, ndim, shape, 0);
    if (!t)
        return NULL;
    char *p = sr__tensor_new_data(t);
    int64_t n = sr__numel(ndim, shape), es = (int64_t)sr_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        double v = lo + (hi - lo) * sr_generator_uniform(g);
        sr__store_f64(p + i * es, 0, &v, 1, dt);
    }
    if ((flags & SR_REQUIRES_GRAD) && sr_tensor_set_requires_grad(t, true)) {
        sr_tensor_unref(t);
        return NULL;
    }
    return t;
}
