/* SPDX-License-Identifier: MIT */
/* Factories and the process-wide random generator. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "autograd/engine.h"
#include "error.h"
#include "tensor_impl.h"
#include "xoshiro.h"

/* xoshiro256** seeded through splitmix64; one per process (tensor.h). */
static pthread_mutex_t rng_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t rng_state[4];
static bool rng_seeded;
#define DEFAULT_SEED 67280421310721ull /* PyTorch's default seed value */

static void seed_locked(uint64_t seed)
{
    sr__xoshiro_seed(rng_state, seed);
    rng_seeded = true;
}

static uint64_t next_locked(void) { return sr__xoshiro_next(rng_state); }

SR_API void sr_manual_seed(uint64_t seed)
{
    pthread_mutex_lock(&rng_lock);
    seed_locked(seed);
    pthread_mutex_unlock(&rng_lock);
}

/* n uniforms in [0, 1) with 53 random bits; normal: Box-Muller pairs. */
static void fill_random(double *dst, int64_t n, bool normal)
{
    pthread_mutex_lock(&rng_lock);
    if (!rng_seeded)
        seed_locked(DEFAULT_SEED);
    for (int64_t i = 0; i < n; i++)
        dst[i] = (double)(next_locked() >> 11) * 0x1.0p-53;
    pthread_mutex_unlock(&rng_lock);
    if (!normal)
        return;
    for (int64_t i = 0; i < n; i += 2) {
        double u1 = 1.0 - dst[i], u2 = i + 1 < n ? dst[i + 1] : 0.5; /* u1 in (0, 1] */
        double r = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
        dst[i] = r * cos(th);
        if (i + 1 < n)
            dst[i + 1] = r * sin(th);
    }
}

static sr_tensor *finish(sr_tensor *t, unsigned flags, const char *fn)
{
    if (t && (flags & SR_REQUIRES_GRAD)) {
        if (t->dtype == SR_I64) {
            sr__fail(-EINVAL, fn, "only tensors of floating point dtype can require gradients (got i64)");
            sr_tensor_unref(t);
            return NULL;
        }
        t->requires_grad = true;
    }
    return t;
}

static sr_tensor *filled(const char *fn, sr_dtype dt, int ndim, const int64_t *shape, double v, unsigned flags)
{
    sr_tensor *t = sr__tensor_new(fn, dt, ndim, shape);
    if (!t)
        return NULL;
    int64_t n = sr__numel(ndim, shape);
    char *p = sr__tensor_ptr(t);
    if (v == 0.0 && !signbit(v)) {
        memset(p, 0, (size_t)n * sr_dtype_size(dt));
    } else {
        for (int64_t i = 0; i < n; i++)
            sr__store_f64(p + i * (int64_t)sr_dtype_size(dt), 0, &v, 1, dt);
    }
    return finish(t, flags, fn);
}

SR_API sr_tensor *sr_empty(sr_dtype dt, int ndim, const int64_t *shape, unsigned flags)
{
    return finish(sr__tensor_new("sr_empty", dt, ndim, shape), flags, "sr_empty");
}

SR_API sr_tensor *sr_zeros(sr_dtype dt, int ndim, const int64_t *shape, unsigned flags)
{
    return filled("sr_zeros", dt, ndim, shape, 0.0, flags);
}

SR_API sr_tensor *sr_ones(sr_dtype dt, int ndim, const int64_t *shape, unsigned flags)
{
    return filled("sr_ones", dt, ndim, shape, 1.0, flags);
}

SR_API sr_tensor *sr_full(sr_dtype dt, int ndim, const int64_t *shape, double value, unsigned flags)
{
    return filled("sr_full", dt, ndim, shape, value, flags);
}

SR_API sr_tensor *sr_scalar_tensor(sr_dtype dt, double v, unsigned flags)
{
    return filled("sr_scalar_tensor", dt, 0, NULL, v, flags);
}

sr_tensor *sr__full_like(const sr_tensor *t, double v)
{
    return filled("sr__full_like", t->dtype, t->ndim, t->shape, v, 0);
}

SR_API sr_tensor *sr_zeros_like(const sr_tensor *t)
{
    return t ? sr__full_like(t, 0.0) : NULL;
}

SR_API sr_tensor *sr_ones_like(const sr_tensor *t)
{
    return t ? sr__full_like(t, 1.0) : NULL;
}

static sr_tensor *random_tensor(const char *fn, sr_dtype dt, int ndim, const int64_t *shape, unsigned flags,
                                bool normal)
{
    if (dt == SR_I64) {
        sr__fail(-EINVAL, fn, "dtype i64 is not supported (f32 or f64 needed)");
        return NULL;
    }
    sr_tensor *t = sr__tensor_new(fn, dt, ndim, shape);
    if (!t)
        return NULL;
    int64_t n = sr__numel(ndim, shape);
    char *p = sr__tensor_ptr(t);
    double buf[512];
    for (int64_t i = 0; i < n; i += 512) {
        int64_t m = n - i < 512 ? n - i : 512;
        fill_random(buf, m, normal);
        sr__store_f64(p + i * (int64_t)sr_dtype_size(dt), (int64_t)sr_dtype_size(dt), buf, m, dt);
    }
    return finish(t, flags, fn);
}

SR_API sr_tensor *sr_rand(sr_dtype dt, int ndim, const int64_t *shape, unsigned flags)
{
    return random_tensor("sr_rand", dt, ndim, shape, flags, false);
}

SR_API sr_tensor *sr_randn(sr_dtype dt, int ndim, const int64_t *shape, unsigned flags)
{
    return random_tensor("sr_randn", dt, ndim, shape, flags, true);
}

SR_API sr_tensor *sr_arange(sr_dtype dt, double start, double end, double step, unsigned flags)
{
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step)) {
        sr__fail(-EINVAL, "sr_arange", "bad range start %g end %g step %g", start, end, step);
        return NULL;
    }
    double count = ceil((end - start) / step);
    int64_t n = count > 0 ? (int64_t)count : 0;
    sr_tensor *t = sr__tensor_new("sr_arange", dt, 1, &n);
    if (!t)
        return NULL;
    char *p = sr__tensor_ptr(t);
    for (int64_t i = 0; i < n; i++) {
        double v = start + (double)i * step;
        sr__store_f64(p + i * (int64_t)sr_dtype_size(dt), 0, &v, 1, dt);
    }
    return finish(t, flags, "sr_arange");
}

SR_API sr_tensor *sr_eye(sr_dtype dt, int64_t n, int64_t m, unsigned flags)
{
    int64_t shape[2] = {n, m < 0 ? n : m};
    sr_tensor *t = filled("sr_eye", dt, 2, shape, 0.0, 0);
    if (!t)
        return NULL;
    char *p = sr__tensor_ptr(t);
    double one = 1.0;
    for (int64_t i = 0; i < shape[0] && i < shape[1]; i++)
        sr__store_f64(p + (i * shape[1] + i) * (int64_t)sr_dtype_size(dt), 0, &one, 1, dt);
    return finish(t, flags, "sr_eye");
}

SR_API sr_tensor *sr_from_data(sr_dtype dt, int ndim, const int64_t *shape, const void *data, unsigned flags)
{
    sr_tensor *t = sr__tensor_new("sr_from_data", dt, ndim, shape);
    if (!t)
        return NULL;
    size_t bytes = (size_t)sr__numel(ndim, shape) * sr_dtype_size(dt);
    if (bytes && !data) {
        sr_tensor_unref(t);
        sr__fail(-EINVAL, "sr_from_data", "data is NULL");
        return NULL;
    }
    if (bytes)
        memcpy(sr__tensor_ptr(t), data, bytes);
    return finish(t, flags, "sr_from_data");
}
