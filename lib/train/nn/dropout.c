/* SPDX-License-Identifier: MIT */
/* torch.nn.functional.dropout: a mask drawn from an sr_generator, applied
 * with the recorded sr_mul, so backward multiplies by the same mask. */
#include <errno.h>
#include <stdlib.h>

#include "error.h"
#include "shmrpc/nn.h"
#include "tensor_seam.h"

/* A tensor of x's shape and dtype: 1/(1-p) where kept, 0 where dropped. */
static sr_tensor *draw_mask(const sr_tensor *x, double p, sr_generator *g)
{
    sr_dtype dt = sr_tensor_dtype(x);
    size_t n = sr_tensor_numel(x);
    sr_tensor *mask = sr__tensor_new("sr_dropout", dt, sr_tensor_ndim(x), sr_tensor_shape(x));
    double *v = mask ? malloc((n ? n : 1) * sizeof(double)) : NULL;
    if (!v) {
        sr_tensor_unref(mask);
        if (mask)
            sr__fail(-ENOMEM, "sr_dropout", "out of memory for a mask of %zu elements", n);
        return NULL;
    }
    double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    for (size_t i = 0; i < n; i++)
        v[i] = sr_generator_uniform(g) < 1.0 - p ? scale : 0.0;
    sr__store_f64(sr__tensor_new_data(mask), (int64_t)sr_dtype_size(dt), v, (int64_t)n, dt);
    free(v);
    return mask;
}

SR_API sr_tensor *sr_dropout(sr_tensor *x, double p, bool training, sr_generator *g)
{
    if (!x || sr__check_float("sr_dropout", x))
        return NULL;
    if (!(p >= 0.0 && p <= 1.0)) {
        sr__fail(-EINVAL, "sr_dropout", "dropout probability has to be between 0 and 1, but got %g", p);
        return NULL;
    }
    if (!training || p == 0.0)
        return sr_tensor_ref(x);
    if (!g) {
        sr__fail(-EINVAL, "sr_dropout", "no generator given for the mask");
        return NULL;
    }
    sr_tensor *mask = draw_mask(x, p, g), *out = mask ? sr_mul(x, mask) : NULL;
    sr_tensor_unref(mask);
    return out;
}
