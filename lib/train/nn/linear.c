/* SPDX-License-Identifier: MIT */
/* torch.nn.functional.linear and the MLP forward, built from recorded ops
 * (matmul of a transposed view, broadcast add, relu), so their backward comes
 * from those ops'.
 *
 * A parameter server runs forwards on executor threads while another
 * trainer's optimizer step writes the same parameters in place
 * (docs/TENSORS.md, "In-place writes and saved tensors"). That needs nothing
 * here: every op pins what it reads (tensor_impl.h, "Readers pin what they
 * read"), so the matmul reads one whole version of the weight, keeps its
 * block alive while it reads, and saves that version for backward; the add
 * reads one version of the bias. */
#include <errno.h>

#include "error.h"
#include "shmrpc/nn.h"
#include "tensor_seam.h"

static int check_linear(const sr_tensor *x, const sr_tensor *w, const sr_tensor *b)
{
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    const int64_t *ws = sr_tensor_shape(w), *xs = sr_tensor_shape(x);
    int xd = sr_tensor_ndim(x);
    if (sr_tensor_ndim(w) != 2 || (b && (sr_tensor_ndim(b) != 1 || sr_tensor_shape(b)[0] != ws[0])))
        return sr__fail(-EINVAL, "sr_linear", "weight %s must be [out, in] and bias %s [out]",
                        sr__tensor_shape_str(w, b1), b ? sr__tensor_shape_str(b, b2) : "(none)");
    if (xd < 1 || xs[xd - 1] != ws[1])
        return sr__fail(-EINVAL, "sr_linear", "input %s does not end in the weight %s's %lld input features",
                        sr__tensor_shape_str(x, b1), sr__tensor_shape_str(w, b2), (long long)ws[1]);
    if (sr__check_same_dtype("sr_linear", x, w) || (b && sr__check_same_dtype("sr_linear", w, b)))
        return -EINVAL;
    return sr__check_float("sr_linear", x);
}

SR_API sr_tensor *sr_linear(sr_tensor *x, sr_tensor *weight, sr_tensor *bias)
{
    if (!x || !weight || check_linear(x, weight, bias))
        return NULL;
    sr_tensor *wt = sr_t(weight);
    sr_tensor *y = wt ? sr_matmul(x, wt) : NULL, *out = y;
    if (y && bias) {
        out = sr_add(y, bias);
        sr_tensor_unref(y);
    }
    sr_tensor_unref(wt);
    return out;
}

SR_API sr_tensor *sr_mlp_apply(sr_tensor *x, sr_tensor *const *params, int nlayers)
{
    if (!x || !params || nlayers < 1) {
        sr__fail(-EINVAL, "sr_mlp_apply", "needs an input and %d >= 1 layers of parameters", nlayers);
        return NULL;
    }
    sr_tensor *h = sr_tensor_ref(x);
    for (int i = 0; h && i < nlayers; i++) {
        sr_tensor *y = sr_linear(h, params[2 * i], params[2 * i + 1]);
        sr_tensor_unref(h);
        h = y;
        if (h && i + 1 < nlayers) {
            y = sr_relu(h);
            sr_tensor_unref(h);
            h = y;
        }
    }
    return h;
}
