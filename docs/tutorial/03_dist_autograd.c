/* SPDX-License-Identifier: MIT */
/* Tutorial, step 3: distributed autograd (docs/TUTORIAL.md).
 *
 *     shmrun -n 2 ./tutorial_03_dist_autograd
 *
 * PyTorch's example from the torch.distributed.autograd documentation:
 *
 *     with dist_autograd.context() as context_id:
 *         t3 = rpc.rpc_sync("worker1", torch.add, args=(t1, t2))
 *         loss = (t3 * t4).sum()
 *         dist_autograd.backward(context_id, [loss])
 *         grads = dist_autograd.get_gradients(context_id)
 *
 * The add runs on worker 1; the backward pass crosses back to it and the
 * gradients of t1, t2 and t4 land in the context (not in .grad). */
#include <stdio.h>

#include <shmrpc/shmrpc.h>

static const int64_t SHAPE[2] = {2, 2};

static sr_tensor *leaf(const float *v)
{
    return sr_from_data(SR_F32, 2, SHAPE, v, SR_REQUIRES_GRAD);
}

static void print(const char *name, const sr_tensor *t)
{
    double v[4];
    sr_tensor_to_f64(t, v, 4);
    printf("%s = [[%g, %g], [%g, %g]]\n", name, v[0], v[1], v[2], v[3]);
}

static int same(const sr_tensor *a, const sr_tensor *b)
{
    double x[4], y[4];
    sr_tensor_to_f64(a, x, 4);
    sr_tensor_to_f64(b, y, 4);
    for (int i = 0; i < 4; i++)
        if (x[i] != y[i])
            return 0;
    return 1;
}

static int driver(void)
{
    sr_tensor *t1 = leaf((const float[]){1, 2, 3, 4}), *t2 = leaf((const float[]){10, 20, 30, 40});
    sr_tensor *t4 = leaf((const float[]){0.5f, -1, 2, 0});
    int64_t ctx;
    if (sr_dist_autograd_context_begin(&ctx)) /* current on this thread until it ends */
        return fprintf(stderr, "context: %s\n", sr_last_error()), 1;

    /* "add" is a built-in: t1 + t2 computed on worker 1. The call records a
     * send function here and a recv function there, in context ctx. */
    sr_value *a = sr_value_from_tensor(t1), *b = sr_value_from_tensor(t2), *out = NULL;
    if (sr_rpc_sync(1, "add", SR_ARGS(a, b), 0, &out))
        return fprintf(stderr, "add: %s\n", sr_last_error()), 1;
    sr_tensor *t3 = sr_value_tensor(out); /* borrowed from out */
    sr_tensor *t5 = sr_mul(t3, t4), *loss = sr_sum(t5);

    if (sr_dist_autograd_backward(ctx, &loss, 1, false))
        return fprintf(stderr, "backward: %s\n", sr_last_error()), 1;
    sr_tensor *g1 = NULL, *g2 = NULL, *g4 = NULL;
    if (sr_dist_autograd_get_gradient(ctx, t1, &g1) || sr_dist_autograd_get_gradient(ctx, t2, &g2) ||
        sr_dist_autograd_get_gradient(ctx, t4, &g4))
        return fprintf(stderr, "get_gradient: %s\n", sr_last_error()), 1;
    printf("loss = %g\n", sr_tensor_item(loss));
    print("d loss / d t1", g1); /* = t4: the gradient came back from worker 1 */
    print("d loss / d t2", g2); /* = t4 */
    print("d loss / d t4", g4); /* = t3 = t1 + t2 */
    int ok = same(g1, t4) && same(g2, t4) && same(g4, t3) && !sr_tensor_grad(t1);
    sr_dist_autograd_context_end(ctx);

    sr_tensor_unref(g1);
    sr_tensor_unref(g2);
    sr_tensor_unref(g4);
    sr_tensor_unref(loss);
    sr_tensor_unref(t5);
    sr_value_unref(out);
    sr_value_unref(a);
    sr_value_unref(b);
    sr_tensor_unref(t1);
    sr_tensor_unref(t2);
    sr_tensor_unref(t4);
    return ok ? 0 : 1;
}

int main(void)
{
    if (sr_init(NULL))
        return fprintf(stderr, "sr_init: %s\n", sr_last_error()), 1;
    int rc = sr_rank() == 0 ? driver() : 0;
    if (sr_shutdown(true, 0))
        rc = 1;
    return rc;
}
