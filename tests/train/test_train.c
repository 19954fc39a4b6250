/* SPDX-License-Identifier: MIT */
/* A sanity run of everything training needs together: the 784-128-10 MLP
 * learns Fashion-MNIST with plain SGD from a fixed seed. 200 steps of 64
 * samples drawn from the first 4096 training images must take the accuracy
 * on 2000 test images from chance (about 0.1) to clearly better (PyTorch
 * reaches about 0.75 with this recipe). Skipped without the data package. */
#include <errno.h>

#include "shmrpc/data.h"
#include "shmrpc/nn.h"
#include "tensor_util.h"
#include "common.h"

LEAK_CHECKED_SUITE(train);

enum { POOL = 4096, BATCH = 64, STEPS = 200, EVAL = 2000 };
#define LR 0.1

static sr_dataset *load(bool train)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/train-images-idx3-ubyte.gz", SR_FASHION_MNIST_DIR);
    if (access(path, R_OK))
        cr_skip_test("dataset-fashion-mnist is not installed (%s)", path);
    sr_dataset *ds;
    cr_assert_eq(sr_fashion_mnist_load(NULL, train, &ds), 0, "%s", sr_last_error());
    return ds;
}

static double evaluate(sr_module *m, const sr_dataset *test)
{
    static int64_t idx[EVAL];
    for (int i = 0; i < EVAL; i++)
        idx[i] = i;
    sr_tensor *x, *y;
    cr_assert_eq(sr_dataset_batch(test, idx, EVAL, &x, &y), 0);
    bool prev = sr_no_grad_enter();
    sr_tensor *logits = sr_module_forward(m, x);
    sr_no_grad_exit(prev);
    double acc = sr_accuracy(logits, y);
    cr_assert(!isnan(acc), "%s", sr_last_error());
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    sr_tensor_unref(logits);
    return acc;
}

/* One SGD step on the batch; returns its loss. */
static double step(sr_module *m, const sr_dataset *train, const int64_t *idx)
{
    sr_tensor *x, *y;
    cr_assert_eq(sr_dataset_batch(train, idx, BATCH, &x, &y), 0);
    sr_tensor *logits = sr_module_forward(m, x), *loss = sr_cross_entropy(logits, y);
    cr_assert(loss, "%s", sr_last_error());
    cr_assert_eq(sr_backward(loss, false), 0, "%s", sr_last_error());
    double v = sr_tensor_item(loss);
    size_t n;
    sr_tensor *const *p;
    sr_module_params(m, &n, &p, NULL);
    bool prev = sr_no_grad_enter();
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(sr_add_(p[i], sr_tensor_grad(p[i]), -LR), 0, "%s", sr_last_error());
    sr_no_grad_exit(prev);
    sr_module_zero_grad(m);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    sr_tensor_unref(logits);
    sr_tensor_unref(loss);
    return v;
}

Test(train, mlp_learns_fashion_mnist_with_sgd, .timeout = 60)
{
    sr_dataset *train = load(true), *test = load(false);
    sr_generator g;
    sr_generator_init(&g, 0);
    sr_module *m;
    cr_assert_eq(sr_mlp_create(SHAPE(784, 128, 10), 2, &g, SR_F32, &m), 0, "%s", sr_last_error());
    double before = evaluate(m, test), first = 0, last = 0;
    static int64_t order[POOL];
    for (int s = 0; s < STEPS; s++) {
        int at = (s * BATCH) % POOL;
        if (at == 0)
            cr_assert_eq(sr_generator_permutation(&g, POOL, order), 0); /* a new epoch */
        double l = step(m, train, order + at);
        first = s < 10 ? first + l / 10 : first;
        last = s >= STEPS - 10 ? last + l / 10 : last;
    }
    double after = evaluate(m, test);
    cr_log_info("accuracy %.3f -> %.3f, loss %.3f -> %.3f", before, after, first, last);
    cr_assert_lt(before, 0.3, "an untrained model should be near chance, got %.3f", before);
    cr_assert_gt(after, 0.6, "accuracy after %d steps is only %.3f", STEPS, after);
    cr_assert_lt(last, 0.6 * first, "loss went from %.3f to %.3f", first, last);
    sr_module_destroy(m);
    sr_dataset_destroy(train);
    sr_dataset_destroy(test);
}
