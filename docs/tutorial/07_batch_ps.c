/* SPDX-License-Identifier: MIT */
/* Tutorial, step 7: an asynchronous function, a batch-updating parameter
 * server (docs/TUTORIAL.md).
 *
 *     shmrun -n 3 ./tutorial_07_batch_ps
 *
 * PyTorch's "batch-updating parameter server" (@rpc.functions.async_execution):
 * worker 0 holds a model; every other worker is a trainer that computes a
 * gradient on its own data and calls update_and_fetch_model(grad). The
 * server adds the gradient up and answers with a future. When the gradients
 * of all N trainers are in, it steps the model once with their mean and
 * completes that future with the new model: the N waiting calls are all
 * answered then, and no thread of the server was held while they waited.
 *
 * The model is a linear regression, y = x w, w of 4 weights; each trainer
 * draws its own 64 samples of y = x w_true. Every answer carries the
 * model's version, which must be the trainer's step count: a trainer's call
 * returned only after every trainer's gradient of that step was in. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>

#include <shmrpc/shmrpc.h>

#define FEATURES 4
#define SAMPLES 64
#define STEPS 40
#define LR 0.2

/* ---- the server ---- */

static struct {
    pthread_mutex_t lock; /* held for a few operations, never across a wait */
    int trainers;         /* N: gradients per batch */
    int arrived;          /* of this batch so far */
    int64_t version;      /* steps taken */
    sr_tensor *weights;   /* the model; replaced by each step, never written in place */
    sr_tensor *grad_sum;  /* this batch's gradients, added up */
    sr_future *next;      /* completes with the model after this batch */
} ps = {.lock = PTHREAD_MUTEX_INITIALIZER};
static sr_future *all_done; /* completes when every trainer has called "done" */
static int trainers_done;

/* The state is made on first use (under ps.lock): whichever call comes first. */
static int ps_ready(void)
{
    if (ps.weights)
        return 0;
    int64_t n = FEATURES;
    ps.trainers = sr_world_size() - 1;
    ps.weights = sr_zeros(SR_F64, 1, &n, 0);
    ps.next = sr_future_new();
    return ps.weights && ps.next ? 0 : -ENOMEM;
}

/* [version, weights]: a new value; the tensor in it is shared, not copied. */
static sr_value *model_value(void)
{
    sr_value *items[2] = {sr_int(ps.version), sr_value_from_tensor(ps.weights)};
    sr_value *v = items[0] && items[1] ? sr_list(2, items) : NULL;
    sr_value_unref(items[0]);
    sr_value_unref(items[1]);
    return v;
}

/* get_model(): a plain function, the model as it is now. */
static int get_model(sr_call *c)
{
    pthread_mutex_lock(&ps.lock);
    sr_value *v = ps_ready() ? NULL : model_value();
    pthread_mutex_unlock(&ps.lock);
    return v ? sr_call_return(c, v) : sr_call_fail(c, -ENOMEM, "get_model: %s", sr_last_error());
}

/* The batch is complete: w -= lr * (sum of gradients) / N, as a new tensor
 * (trainers may still read the old one), and a fresh future for the next
 * batch. Returns the model, a new value; NULL on error. */
static sr_value *step(void)
{
    sr_tensor *delta = sr_mul_scalar(ps.grad_sum, LR / ps.trainers);
    sr_tensor *w = delta ? sr_sub(ps.weights, delta) : NULL;
    sr_tensor_unref(delta);
    if (!w)
        return NULL;
    sr_tensor_unref(ps.weights);
    ps.weights = w;
    ps.version++;
    return model_value();
}

/* update_and_fetch_model(grad): the async function. It adds grad to the
 * batch and returns the batch's future at once; the last trainer's call
 * steps the model and completes that future, which answers all N calls. */
static int update_and_fetch_model(sr_call *c, sr_future **result)
{
    sr_tensor *grad = sr_value_tensor(sr_call_arg(c, 0)); /* borrowed for the call */
    if (!grad)
        return sr_call_fail(c, -EINVAL, "update_and_fetch_model: argument 0 is not a tensor");
    pthread_mutex_lock(&ps.lock);
    int rc = ps_ready();
    sr_tensor *sum = rc ? NULL : ps.grad_sum ? sr_add(ps.grad_sum, grad) : sr_clone(grad);
    if (!sum) {
        pthread_mutex_unlock(&ps.lock);
        return sr_call_fail(c, rc ? rc : -EINVAL, "update_and_fetch_model: %s", sr_last_error());
    }
    sr_tensor_unref(ps.grad_sum);
    ps.grad_sum = sum;
    /* A new reference for the runtime: it takes it over and releases it once
     * the answer is sent. ps.next keeps our own, to complete it later. */
    *result = sr_future_ref(ps.next);
    sr_future *full = NULL;
    sr_value *model = NULL;
    if (++ps.arrived == ps.trainers) {
        model = step();
        full = ps.next;            /* our reference moves to `full` */
        ps.next = sr_future_new(); /* the next batch's calls wait on this one */
        ps.arrived = 0;
        sr_tensor_unref(ps.grad_sum);
        ps.grad_sum = NULL;
    }
    pthread_mutex_unlock(&ps.lock);
    if (full) {
        /* Completing the future runs its callbacks here, on this thread: the
         * runtime's answers to the N - 1 calls that wait on it go out now;
         * this call's own goes out as soon as we return it. */
        if (model)
            sr_future_set_result(full, model); /* takes its own reference */
        else
            sr_future_set_error(full, -ENOMEM, "step %lld: %s", (long long)ps.version + 1, sr_last_error());
        sr_future_unref(full);
        sr_value_unref(model);
    }
    return 0;
}

static int done(sr_call *c)
{
    pthread_mutex_lock(&ps.lock);
    if (++trainers_done == sr_world_size() - 1)
        sr_future_set_result(all_done, NULL);
    pthread_mutex_unlock(&ps.lock);
    return sr_call_return(c, NULL);
}

static int server(void)
{
    /* Serve the calls on this thread until every trainer is done. */
    int rc = sr_serve_until(all_done, NULL);
    if (rc)
        fprintf(stderr, "server: %s\n", sr_last_error());
    /* Tensors live in the job's segment: release them before sr_shutdown. */
    sr_tensor_unref(ps.weights);
    sr_tensor_unref(ps.grad_sum);
    sr_future_unref(ps.next);
    return rc ? 1 : 0;
}

/* ---- a trainer ---- */

/* This trainer's samples: x uniform in [-1, 1), y = x w_true. */
static int make_data(sr_tensor **x, sr_tensor **y)
{
    static const double w_true[FEATURES] = {1.5, -2.0, 0.5, 3.0};
    int64_t xs[2] = {SAMPLES, FEATURES}, n = FEATURES;
    sr_generator g;
    sr_generator_init(&g, (uint64_t)sr_rank());
    sr_tensor *w = sr_from_data(SR_F64, 1, &n, w_true, 0);
    *x = sr_generator_uniform_tensor(&g, SR_F64, 2, xs, -1, 1, 0);
    *y = *x && w ? sr_matmul(*x, w) : NULL;
    sr_tensor_unref(w);
    return *y ? 0 : -ENOMEM;
}

/* The loss of the model held in `model` ([version, weights], borrowed) on
 * (x, y), and its gradient in *grad (a new reference). */
static double loss_and_grad(sr_value *model, sr_tensor *x, sr_tensor *y, sr_tensor **grad)
{
    sr_tensor *w = sr_clone(sr_value_tensor(sr_value_list_at(model, 1))); /* our own leaf */
    sr_tensor_set_requires_grad(w, true);
    sr_tensor *pred = sr_matmul(x, w), *loss = sr_mse_loss(pred, y);
    double l = loss && !sr_backward(loss, false) ? sr_tensor_item(loss) : NAN;
    *grad = sr_tensor_ref(sr_tensor_grad(w)); /* the gradient is borrowed from w: keep it */
    sr_tensor_unref(loss);
    sr_tensor_unref(pred);
    sr_tensor_unref(w);
    return l;
}

static int trainer(void)
{
    sr_tensor *x = NULL, *y = NULL;
    sr_value *model = NULL;
    if (make_data(&x, &y) || sr_rpc_sync(0, "get_model", SR_NOARGS, 0, &model))
        return fprintf(stderr, "trainer %d: %s\n", sr_rank(), sr_last_error()), 1;
    double first = NAN, last = NAN;
    int rc = 0;
    for (int s = 0; s < STEPS && !rc; s++) {
        sr_tensor *grad = NULL;
        last = loss_and_grad(model, x, y, &grad);
        if (s == 0)
            first = last;
        sr_value *gv = grad ? sr_value_from_tensor(grad) : NULL, *next = NULL;
        /* Returns once every trainer's gradient of this step is in. */
        rc = gv ? sr_rpc_sync(0, "update_and_fetch_model", SR_ARGS(gv), 0, &next) : -ENOMEM;
        if (rc)
            fprintf(stderr, "trainer %d, step %d: %s\n", sr_rank(), s, sr_last_error());
        else if (sr_value_int(sr_value_list_at(next, 0)) != s + 1) {
            fprintf(stderr, "trainer %d: after step %d the model is version %lld\n", sr_rank(), s,
                    (long long)sr_value_int(sr_value_list_at(next, 0)));
            rc = -EPROTO;
        }
        sr_value_unref(gv);
        sr_tensor_unref(grad);
        sr_value_unref(model);
        model = next;
    }
    if (!rc && sr_rank() == 1) {
        double w[FEATURES];
        sr_tensor_to_f64(sr_value_tensor(sr_value_list_at(model, 1)), w, FEATURES);
        printf("trainer 1: loss %.4f at the first step, %.4f at step %d\n", first, last, STEPS);
        printf("model version %lld, each step the mean of %d trainers' gradients\n",
               (long long)sr_value_int(sr_value_list_at(model, 0)), sr_world_size() - 1);
        printf("weights: [%.3f, %.3f, %.3f, %.3f]\n", w[0], w[1], w[2], w[3]);
    }
    if (!rc && !(last < first / 100)) {
        fprintf(stderr, "trainer %d: the loss went from %g to %g only\n", sr_rank(), first, last);
        rc = -EPROTO;
    }
    sr_value_unref(model);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    if (sr_rpc_sync(0, "done", SR_NOARGS, 0, NULL))
        rc = -EPIPE;
    return rc ? 1 : 0;
}

int main(void)
{
    sr_register("get_model", get_model);
    sr_register_async("update_and_fetch_model", update_and_fetch_model);
    sr_register("done", done);
    all_done = sr_future_new();
    if (sr_init(NULL))
        return fprintf(stderr, "sr_init: %s\n", sr_last_error()), 1;
    if (sr_world_size() < 2)
        return fprintf(stderr, "run with shmrun -n 2 or more\n"), 1;
    int rc = sr_rank() == 0 ? server() : trainer();
    if (sr_shutdown(true, 0))
        rc = 1;
    sr_future_unref(all_done);
    return rc;
}
