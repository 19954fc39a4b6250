/* SPDX-License-Identifier: MIT */
/* Tutorial, step 5: your own kernel in autograd (docs/TUTORIAL.md).
 *
 *     shmrun -n 2 ./tutorial_05_custom_function
 *
 * softsign(x) = x / (1 + |x|), forward and backward written as plain C loops
 * (as a kernel library would give them), becomes an autograd function, as
 * torch.autograd.Function does in Python:
 *
 *     class Softsign(torch.autograd.Function):
 *         @staticmethod
 *         def forward(ctx, x):
 *             ctx.save_for_backward(x)
 *             return my_forward_kernel(x)
 *         @staticmethod
 *         def backward(ctx, dy):
 *             x, = ctx.saved_tensors
 *             return my_backward_kernel(x, dy)
 *
 * Worker 0 applies it locally (sr_backward), then asks worker 1 to apply it
 * to a tensor it sends, and runs a distributed backward: SoftsignBackward
 * runs on worker 1. Both gradients must be 1 / (1 + |x|)^2. */
#include <errno.h>
#include <stdio.h>

#include <shmrpc/shmrpc.h>

static double softsign(double x, double dy)
{
    (void)dy;
    return x / (1 + (x < 0 ? -x : x));
}

static double softsign_grad(double x, double dy)
{
    double d = 1 + (x < 0 ? -x : x);
    return dy / (d * d);
}

/* A new f64 tensor of f(x[i], dy[i]) (dy NULL: 0), the kernels' loop. They
 * read contiguous copies: sr_tensor_data of a strided view would not be. */
static sr_tensor *kernel(double (*f)(double, double), sr_tensor *x, sr_tensor *dy)
{
    sr_tensor *xc = sr_contiguous(x), *dc = dy ? sr_contiguous(dy) : NULL;
    sr_tensor *y = xc ? sr_empty(SR_F64, sr_tensor_ndim(xc), sr_tensor_shape(xc), 0) : NULL;
    double *out = y ? sr_tensor_mutable_data(y) : NULL;
    const double *in = xc ? sr_tensor_data(xc) : NULL, *d = dc ? sr_tensor_data(dc) : NULL;
    for (size_t i = 0; out && in && (d || !dy) && i < sr_tensor_numel(xc); i++)
        out[i] = f(in[i], d ? d[i] : 0);
    int ok = out && in && (d || !dy);
    sr_tensor_unref(xc);
    sr_tensor_unref(dc);
    if (!ok) {
        sr_tensor_unref(y);
        return NULL;
    }
    return y;
}

static int softsign_forward(sr_function_ctx *ctx, sr_tensor *const *in, size_t n, sr_tensor **out, size_t nout)
{
    (void)n;
    (void)nout;
    if (sr_tensor_dtype(in[0]) != SR_F64)
        return -EINVAL; /* these kernels are f64 only */
    int rc = sr_function_ctx_save_for_backward(ctx, in, 1);
    if (rc)
        return rc;
    out[0] = kernel(softsign, in[0], NULL); /* apply takes this reference over */
    return out[0] ? 0 : -ENOMEM;
}

static int softsign_backward(sr_function_ctx *ctx, sr_tensor *const *dy, size_t nout, sr_tensor **dx, size_t n)
{
    (void)nout;
    (void)n;
    sr_tensor *x; /* a new reference: the values x had in forward */
    int rc = sr_function_ctx_saved(ctx, 0, &x);
    if (rc)
        return rc;
    dx[0] = kernel(softsign_grad, x, dy[0]); /* the engine takes this reference over */
    sr_tensor_unref(x);
    return dx[0] ? 0 : -ENOMEM;
}

static const sr_autograd_function SOFTSIGN = {"Softsign", softsign_forward, softsign_backward, NULL};

/* Worker 1: softsign of the argument, returned (it keeps its history). */
static int remote_softsign(sr_call *c)
{
    sr_tensor *x = sr_value_tensor(sr_call_arg(c, 0)), *y;
    int rc = sr_function_apply(&SOFTSIGN, &x, 1, &y, 1);
    if (rc)
        return rc;
    sr_value *v = sr_value_from_tensor(y);
    sr_tensor_unref(y);
    return sr_call_return(c, v);
}

/* g[i] == 1 / (1 + |x[i]|)^2 to rounding. */
static int is_grad_of(const sr_tensor *g, const double *x)
{
    double got[4];
    int ok = g && !sr_tensor_to_f64(g, got, 4);
    for (int i = 0; ok && i < 4; i++) {
        double e = got[i] - softsign_grad(x[i], 1);
        ok = e < 1e-12 && e > -1e-12;
    }
    return ok;
}

static int driver(void)
{
    const double xv[4] = {-2, -0.5, 1, 3};
    sr_tensor *x = sr_from_data(SR_F64, 1, (const int64_t[]){4}, xv, SR_REQUIRES_GRAD), *y;

    /* local autograd: y = Softsign(x), loss = sum(y), into x's .grad */
    if (sr_function_apply(&SOFTSIGN, &x, 1, &y, 1))
        return fprintf(stderr, "apply: %s\n", sr_last_error()), 1;
    printf("y.grad_fn = %s\n", sr_tensor_grad_fn_name(y)); /* SoftsignBackward */
    sr_tensor *loss = sr_sum(y);
    if (sr_backward(loss, false))
        return fprintf(stderr, "backward: %s\n", sr_last_error()), 1;
    int ok = is_grad_of(sr_tensor_grad(x), xv);
    sr_tensor_unref(loss);
    sr_tensor_unref(y);

    /* distributed: worker 1 applies it, the pass runs its backward there */
    int64_t ctx;
    if (sr_dist_autograd_context_begin(&ctx))
        return fprintf(stderr, "context: %s\n", sr_last_error()), 1;
    sr_value *a = sr_value_from_tensor(x), *out = NULL;
    if (sr_rpc_sync(1, "softsign", SR_ARGS(a), 0, &out))
        return fprintf(stderr, "softsign: %s\n", sr_last_error()), 1;
    loss = sr_sum(sr_value_tensor(out));
    sr_tensor *g = NULL;
    if (sr_dist_autograd_backward(ctx, &loss, 1, false) || sr_dist_autograd_get_gradient(ctx, x, &g))
        return fprintf(stderr, "dist backward: %s\n", sr_last_error()), 1;
    ok = ok && is_grad_of(g, xv);
    double v[4];
    sr_tensor_to_f64(g, v, 4);
    printf("d loss / d x = [%.6f, %.6f, %.6f, %.6f] (1 / (1 + |x|)^2: %s)\n", v[0], v[1], v[2], v[3],
           ok ? "yes" : "NO");
    sr_dist_autograd_context_end(ctx);

    sr_tensor_unref(g);
    sr_tensor_unref(loss);
    sr_value_unref(out);
    sr_value_unref(a);
    sr_tensor_unref(x);
    return ok ? 0 : 1;
}

int main(void)
{
    sr_register("softsign", remote_softsign); /* every worker registers, before sr_init */
    if (sr_init(NULL))
        return fprintf(stderr, "sr_init: %s\n", sr_last_error()), 1;
    int rc = sr_rank() == 0 ? driver() : 0;
    if (sr_shutdown(true, 0))
        rc = 1;
    return rc;
}
