/* torch.nn.functional.linear and the MLP forward, built from recorded ops
 * (matmul of a transposed view, broadcast add, relu), so their backward comes
 * from those ops'.
 *
 * Parameters read through a snapshot. A parameter server runs forwards on
 * executor threads while another trainer's optimizer step writes the same
 * parameters in place (docs/TENSORS.md, "In-place writes and saved
 * tensors"). An op reads its inputs' bytes without the storage's write lock,
 * so a forward reading a weight directly could see half of a step, or read
 * a block that the step's copy-on-write has just let go of and that the heap
 * then reuses (NaN losses with 3 concurrent trainers, docs/PERFORMANCE.md).
 * So sr_linear reads the weight and the bias through param_view(): a
 * snapshot taken under the write lock (its own block reference: a step
 * either finished before it or moves the parameter onto a copy), tied to the
 * parameter by an identity node so that the gradient still reaches it. The
 * output and every tensor saved for backward then come from one version of
 * each parameter. Cost per parameter and forward: one storage object, one
 * block reference and one node (about 100 ns); no bytes are copied unless a
 * step writes while the forward holds the snapshot. */
#include <errno.h>

#include "autograd/engine.h"
#include "error.h"
#include "shmrpc/nn.h"
#include "tensor/tensor_impl.h"

/* AliasBackward0: the gradient passes through unchanged. */
static int alias_apply(sr_node *n, sr_tensor *const *grads_in, sr_tensor **grads_out)
{
    (void)n;
    grads_out[0] = grads_in[0] ? sr_tensor_ref(grads_in[0]) : NULL;
    return 0;
}

static const sr_node_ops alias_ops = {.name = "AliasBackward0", .apply = alias_apply};

/* p's values as of now, for reading while p may be written in place by
 * another thread; the gradient of the result flows to p. NULL for NULL. */
static sr_tensor *param_view(sr_tensor *p)
{
    sr_tensor *s = p ? sr__tensor_snapshot(p) : NULL;
    if (!s) {
        if (p)
            sr__fail(-ENOMEM, "sr_linear", "out of memory for a parameter snapshot");
        return NULL;
    }
    if (!sr__any_requires_grad(&p, 1))
        return s;
    return sr__attach(s, sr__node_for_inputs(&alias_ops, sizeof(sr_node), &p, 1, 1, 0));
}

static int check_linear(const sr_tensor *x, const sr_tensor *w, const sr_tensor *b)
{
    char b1[SR_SHAPE_STR], b2[SR_SHAPE_STR];
    if (w->ndim != 2 || (b && (b->ndim != 1 || b->shape[0] != w->shape[0])))
        return sr__fail(-EINVAL, "sr_linear", "weight %s must be [out, in] and bias %s [out]",
                        sr__shape_str(w->ndim, w->shape, b1), b ? sr__shape_str(b->ndim, b->shape, b2) : "(none)");
    if (x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1])
        return sr__fail(-EINVAL, "sr_linear", "input %s does not end in the weight %s's %lld input features",
                        sr__shape_str(x->ndim, x->shape, b1), sr__shape_str(w->ndim, w->shape, b2),
                        (long long)w->shape[1]);
    if (sr__check_same_dtype("sr_linear", x, w) || (b && sr__check_same_dtype("sr_linear", w, b)))
        return -EINVAL;
    return sr__check_float("sr_linear", x);
}

SR_API sr_tensor *sr_linear(sr_tensor *x, sr_tensor *weight, sr_tensor *bias)
{
    if (!x || !weight || check_linear(x, weight, bias))
        return NULL;
    sr_tensor *w = param_view(weight), *b = bias ? param_view(bias) : NULL;
    sr_tensor *wt = w && (b || !bias) ? sr_t(w) : NULL;
    sr_tensor *y = wt ? sr_matmul(x, wt) : NULL, *out = y;
    if (y && b) {
        out = sr_add(y, b);
        sr_tensor_unref(y);
    }
    sr_tensor_unref(wt);
    sr_tensor_unref(w);
    sr_tensor_unref(b);
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
