/* SPDX-License-Identifier: MIT */
/* Tutorial, step 4: training with a parameter server (docs/TUTORIAL.md).
 *
 *     shmrun -n 4 ./tutorial_04_train [--steps N] [--min-accuracy A]
 *
 * The parameter-server pattern of PyTorch's RPC tutorial, on Fashion-MNIST
 * (Debian's dataset-fashion-mnist). Worker 0, the server, holds an MLP
 * 784-128-10. Every other worker is a trainer: it takes its share of one
 * shuffled epoch in batches of 64 and, for each batch, inside a distributed
 * autograd context,
 *   1. runs the forward on the server (rpc_sync "forward"),
 *   2. computes the loss locally (cross_entropy),
 *   3. runs the distributed backward: gradients land in the context, on the
 *      server, for the server's parameters,
 *   4. steps the DistributedOptimizer (SGD, lr 0.05), which updates the
 *      parameters on the server with that context's gradients.
 * At the end the server measures the accuracy on the 10000 test images.
 * --steps N stops each trainer after N batches; the program fails if the
 * accuracy is below --min-accuracy. Exit 77 (skip) without the data. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <shmrpc/shmrpc.h>

#define BATCH 64
#define SEED 1

/* ---- the server ---- */

static pthread_once_t model_once = PTHREAD_ONCE_INIT;
static sr_module *model;
static sr_future *all_done;     /* completed when every trainer has called "done" */
static atomic_int trainers_done;

/* The model is made on first use, whichever call comes first (as the
 * tutorial's get_parameter_server() does under a lock). */
static void make_model(void)
{
    static const int64_t sizes[] = {784, 128, 10};
    sr_generator g;
    sr_generator_init(&g, SEED);
    if (sr_mlp_create(sizes, 2, &g, SR_F32, &model))
        fprintf(stderr, "model: %s\n", sr_last_error());
}

static sr_module *the_model(void)
{
    pthread_once(&model_once, make_model);
    return model;
}

/* forward(x): the logits. Called inside the trainer's autograd context, it
 * runs in that context here too, so the backward pass will come back. */
static int forward(sr_call *c)
{
    sr_tensor *y = the_model() ? sr_module_forward(model, sr_value_tensor(sr_call_arg(c, 0))) : NULL;
    if (!y)
        return sr_call_fail(c, -EINVAL, "forward: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(y);
    sr_tensor_unref(y);
    return sr_call_return(c, v);
}

/* parameters(): a list of RRefs to the parameters, for the optimizer. */
static int parameters(sr_call *c)
{
    size_t n;
    sr_tensor *const *p;
    if (!the_model())
        return sr_call_fail(c, -EINVAL, "no model");
    sr_module_params(model, &n, &p, NULL);
    sr_value *items[8];
    for (size_t i = 0; i < n; i++) {
        sr_rref *r = NULL;
        sr_value *t = sr_value_from_tensor(p[i]);
        sr_rref_create(t, &r); /* an RRef owned here, holding the parameter itself */
        items[i] = sr_value_from_rref(r);
        sr_rref_unref(r);
        sr_value_unref(t);
    }
    sr_value *list = sr_list(n, items);
    for (size_t i = 0; i < n; i++)
        sr_value_unref(items[i]);
    return sr_call_return(c, list);
}

static int done(sr_call *c)
{
    if (atomic_fetch_add(&trainers_done, 1) + 1 == sr_world_size() - 1)
        sr_future_set_result(all_done, NULL);
    return sr_call_return(c, NULL);
}

static int server(double min_accuracy)
{
    if (sr_future_wait(all_done, NULL) || !the_model())
        return 1;
    sr_dataset *test;
    if (sr_fashion_mnist_load(NULL, false, &test))
        return fprintf(stderr, "%s\n", sr_last_error()), 1;
    int64_t n = sr_dataset_size(test), *idx = malloc(sizeof(*idx) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        idx[i] = i;
    sr_tensor *x, *y;
    sr_dataset_batch(test, idx, n, &x, &y);
    bool prev = sr_no_grad_enter(); /* evaluation records no graph */
    sr_tensor *logits = sr_module_forward(model, x);
    sr_no_grad_exit(prev);
    double acc = sr_accuracy(logits, y);
    printf("test accuracy %.2f %% on %lld images\n", acc * 100, (long long)n);
    sr_tensor_unref(logits);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    free(idx);
    sr_dataset_destroy(test);
    sr_module_destroy(model);
    return acc >= min_accuracy ? 0 : 1;
}

/* ---- a trainer ---- */

static int trainer(int64_t max_steps)
{
    int rank = sr_rank(), ntrainers = sr_world_size() - 1;
    sr_dataset *train;
    if (sr_fashion_mnist_load(NULL, true, &train))
        return fprintf(stderr, "%s\n", sr_last_error()), 1;
    /* Every trainer draws the same permutation and takes its own slice. */
    int64_t total = sr_dataset_size(train), *perm = malloc(sizeof(*perm) * (size_t)total);
    sr_generator g;
    sr_generator_init(&g, SEED);
    sr_generator_permutation(&g, total, perm);
    int64_t first = (rank - 1) * total / ntrainers, count = rank * total / ntrainers - first;

    /* The DistributedOptimizer over the server's parameters. */
    sr_value *params = NULL;
    if (sr_rpc_sync(0, "parameters", SR_NOARGS, 0, &params))
        return fprintf(stderr, "parameters: %s\n", sr_last_error()), 1;
    size_t np = sr_value_list_len(params);
    sr_rref *rrefs[8];
    for (size_t i = 0; i < np; i++)
        rrefs[i] = sr_value_rref(sr_value_list_at(params, i));
    sr_optim_opts opts;
    sr_optim_opts_default(SR_OPTIM_SGD, &opts);
    opts.lr = 0.05;
    sr_dist_optim *opt = NULL;
    if (sr_dist_optim_create(SR_OPTIM_SGD, &opts, rrefs, np, &opt))
        return fprintf(stderr, "optimizer: %s\n", sr_last_error()), 1;

    int rc = 0;
    for (int64_t at = 0, step = 0; at < count && step < max_steps && !rc; at += BATCH, step++) {
        sr_tensor *x, *y;
        sr_dataset_batch(train, perm + first + at, count - at < BATCH ? count - at : BATCH, &x, &y);
        int64_t ctx;
        sr_value *xv = sr_value_from_tensor(x), *logits = NULL;
        sr_tensor *loss = NULL;
        rc = sr_dist_autograd_context_begin(&ctx);
        if (!rc)
            rc = sr_rpc_sync(0, "forward", SR_ARGS(xv), 0, &logits);                 /* 1 */
        if (!rc && !(loss = sr_cross_entropy(sr_value_tensor(logits), y)))         /* 2 */
            rc = -EINVAL;
        if (!rc)
            rc = sr_dist_autograd_backward(ctx, &loss, 1, false);                    /* 3 */
        if (!rc)
            rc = sr_dist_optim_step(opt, ctx);                                       /* 4 */
        if (rc)
            fprintf(stderr, "trainer %d, step %lld: %s\n", rank, (long long)step, sr_last_error());
        else if (step % 100 == 0) /* flushed: before the server's line, which it prints after our done() */
            printf("trainer %d: step %lld, loss %.3f\n", rank, (long long)step, sr_tensor_item(loss)), fflush(stdout);
        sr_dist_autograd_context_end(ctx);
        sr_tensor_unref(loss);
        sr_value_unref(logits);
        sr_value_unref(xv);
        sr_tensor_unref(x);
        sr_tensor_unref(y);
    }
    if (!rc)
        rc = sr_rpc_sync(0, "done", SR_NOARGS, 0, NULL);
    sr_dist_optim_destroy(opt);
    sr_value_unref(params);
    free(perm);
    sr_dataset_destroy(train);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    int64_t max_steps = INT64_MAX;
    double min_accuracy = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps"))
            max_steps = strtoll(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--min-accuracy"))
            min_accuracy = strtod(argv[i + 1], NULL);
    }
    if (access(SR_FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", R_OK))
        return printf("skipped: no %s (Debian package dataset-fashion-mnist)\n", SR_FASHION_MNIST_DIR), 77;
    sr_register("forward", forward);
    sr_register("parameters", parameters);
    sr_register("done", done);
    all_done = sr_future_new();
    if (sr_init(NULL))
        return fprintf(stderr, "sr_init: %s\n", sr_last_error()), 1;
    if (sr_world_size() < 2)
        return fprintf(stderr, "run with shmrun -n 2 or more\n"), 1;
    int rc = sr_rank() == 0 ? server(min_accuracy) : trainer(max_steps);
    if (sr_shutdown(true, 0))
        rc = 1;
    sr_future_unref(all_done);
    return rc;
}
