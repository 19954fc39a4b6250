/* SPDX-License-Identifier: MIT */
/* Tutorial, step 6: model parallelism, a pipeline of stages (docs/TUTORIAL.md).
 *
 *     shmrun -n 3 ./tutorial_06_pipeline
 *
 * PyTorch's tutorial "Distributed Pipeline Parallelism Using RPC", small:
 *
 *     class Stage(nn.Module):                     # one per worker
 *         def forward(self, x_rref):
 *             return self.seq(x_rref.to_here())
 *     stages = [rpc.remote("worker1", Stage, ...), rpc.remote("worker2", Stage, ...)]
 *     for x in xs.chunk(4):                       # micro-batches, all in flight
 *         y_rref = stages[0].remote().forward(RRef(x))
 *         futs.append(stages[1].rpc_async().forward(y_rref))
 *     out = torch.cat(torch.futures.wait_all(futs))
 *
 * The model, Linear(8, 16)-ReLU-Linear(16, 4), is split in two: worker 1
 * holds layers 0..1, worker 2 layer 2, each an object its worker owns and
 * worker 0 holds through an RRef. Worker 0 trains it with distributed
 * autograd and a DistributedOptimizer, then fetches each stage's module
 * state (state_dict) and loads both into a whole local model, which must
 * compute what the pipeline computes. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <shmrpc/shmrpc.h>

#define SPLITS 4
static const int64_t N = 16;

/* The whole model, from one seed: every stage builds it and keeps a range. */
static sr_module *whole_model(void)
{
    sr_layer_spec layers[3] = {SR_LINEAR(8, 16), SR_RELU(), SR_LINEAR(16, 4)};
    sr_generator g;
    sr_generator_init(&g, 1);
    sr_module *m = NULL;
    sr_sequential_create(layers, 3, SR_F32, &g, &m);
    return m;
}

/* ---- a stage, on workers 1 and 2 ---- */

struct stage {
    sr_module *m;
    int from, to;
};

static void stage_free(void *p)
{
    sr_module_destroy(((struct stage *)p)->m);
    free(p);
}

static struct stage *stage_of(sr_call *c)
{
    return sr_value_object(sr_call_arg(c, 0)); /* the RRef's value: argument 0 of a proxy call */
}

/* stage_new(from, to): Stage(...) on this worker, kept by the RRef. */
static int stage_new(sr_call *c)
{
    struct stage *st = calloc(1, sizeof(*st));
    st->from = (int)sr_value_int(sr_call_arg(c, 0));
    st->to = (int)sr_value_int(sr_call_arg(c, 1));
    st->m = whole_model();
    return sr_call_return(c, sr_object(st, stage_free, "stage"));
}

/* stage_forward(stage, x or RRef(x)): to_here, then its layers. */
static int stage_forward(sr_call *c)
{
    sr_value *in = sr_call_arg(c, 1), *fetched = NULL;
    if (sr_value_rref(in) && sr_rref_to_here(sr_value_rref(in), 0, &fetched))
        return sr_call_fail(c, -EIO, "to_here: %s", sr_last_error());
    struct stage *st = stage_of(c);
    sr_tensor *y = sr_sequential_forward_range(st->m, sr_value_tensor(fetched ? fetched : in), st->from, st->to);
    sr_value_unref(fetched);
    sr_value *v = sr_value_from_tensor(y);
    sr_tensor_unref(y);
    return sr_call_return(c, v);
}

/* stage_params(stage): [RRef(p) for p in its layers' parameters]. */
static int stage_params(sr_call *c)
{
    struct stage *st = stage_of(c);
    size_t first, n;
    sr_tensor *const *p;
    sr_sequential_param_range(st->m, st->from, st->to, &first, &n);
    sr_module_params(st->m, NULL, &p, NULL);
    sr_value *items[4];
    for (size_t i = 0; i < n; i++) {
        sr_value *t = sr_value_from_tensor(p[first + i]);
        sr_rref *r;
        sr_rref_create(t, &r);
        items[i] = sr_value_from_rref(r);
        sr_rref_unref(r);
        sr_value_unref(t);
    }
    sr_value *list = sr_list(n, items);
    for (size_t i = 0; i < n; i++)
        sr_value_unref(items[i]);
    return sr_call_return(c, list);
}

/* stage_state(stage): its layers' part of state_dict(), as [name, tensor, ...]. */
static int stage_state(sr_call *c)
{
    struct stage *st = stage_of(c);
    size_t first, count, n;
    char **names;
    sr_tensor **ts;
    sr_sequential_param_range(st->m, st->from, st->to, &first, &count);
    sr_module_state_dict(st->m, NULL, &n, &names, &ts); /* references to the parameters themselves */
    sr_value *items[8];
    for (size_t i = 0; i < count; i++) {
        items[2 * i] = sr_str(names[first + i]);
        items[2 * i + 1] = sr_value_from_tensor(ts[first + i]);
    }
    sr_value *list = sr_list(2 * count, items);
    for (size_t i = 0; i < 2 * count; i++)
        sr_value_unref(items[i]);
    sr_module_state_free(n, names, ts);
    return sr_call_return(c, list);
}

/* ---- the master, worker 0 ---- */

/* The pipeline's output: SPLITS micro-batches in flight at once. */
static sr_tensor *pipeline(sr_rref *const *stages, sr_tensor *x)
{
    sr_future *futs[SPLITS];
    for (int k = 0; k < SPLITS; k++) {
        sr_tensor *xk = sr_narrow(x, 0, k * (N / SPLITS), N / SPLITS);
        sr_value *xv = sr_value_from_tensor(xk), *yv;
        sr_rref *y1;
        sr_rref_remote(stages[0], "stage_forward", SR_ARGS(xv), 0, &y1); /* stays on worker 1 */
        yv = sr_value_from_rref(y1);
        sr_rref_rpc_async(stages[1], "stage_forward", SR_ARGS(yv), 0, &futs[k]);
        sr_value_unref(yv), sr_value_unref(xv), sr_rref_unref(y1), sr_tensor_unref(xk);
    }
    sr_value *outs = NULL;
    int rc = sr_future_wait_all(futs, SPLITS, &outs);
    sr_tensor *parts[SPLITS], *out = NULL;
    for (int k = 0; k < SPLITS; k++) {
        parts[k] = rc ? NULL : sr_value_tensor(sr_value_list_at(outs, (size_t)k));
        sr_future_unref(futs[k]);
    }
    if (!rc)
        out = sr_cat(parts, SPLITS, 0); /* torch.cat(wait_all(futs)) */
    sr_value_unref(outs);
    return out;
}

static double train_step(sr_rref *const *stages, sr_dist_optim *opt, sr_tensor *x, sr_tensor *y)
{
    int64_t ctx;
    sr_dist_autograd_context_begin(&ctx);
    sr_tensor *out = pipeline(stages, x), *loss = out ? sr_cross_entropy(out, y) : NULL;
    double l = loss ? sr_tensor_item(loss) : NAN;
    if (!loss || sr_dist_autograd_backward(ctx, &loss, 1, false) || sr_dist_optim_step(opt, ctx))
        l = NAN;
    sr_dist_autograd_context_end(ctx);
    sr_tensor_unref(out), sr_tensor_unref(loss);
    return l;
}

/* Both stages' state, loaded into one local model (load_state_dict). */
static sr_module *gather(sr_rref *const *stages)
{
    const char *names[8];
    sr_tensor *ts[8];
    sr_value *states[2];
    size_t n = 0;
    for (int s = 0; s < 2; s++) {
        sr_rref_rpc_sync(stages[s], "stage_state", SR_NOARGS, 0, &states[s]);
        for (size_t i = 0; i + 1 < sr_value_list_len(states[s]); i += 2, n++) {
            names[n] = sr_value_str(sr_value_list_at(states[s], i));
            ts[n] = sr_value_tensor(sr_value_list_at(states[s], i + 1));
        }
    }
    sr_module *m = whole_model();
    if (sr_module_load_state_dict(m, n, names, ts, true)) { /* strict: every parameter, checked */
        fprintf(stderr, "load_state_dict: %s\n", sr_last_error());
        sr_module_destroy(m);
        m = NULL;
    }
    sr_value_unref(states[0]), sr_value_unref(states[1]);
    return m;
}

static double max_diff(sr_tensor *a, sr_tensor *b)
{
    double x[64], y[64], d = 0;
    sr_tensor_to_f64(a, x, 64);
    sr_tensor_to_f64(b, y, 64);
    for (int i = 0; i < 64; i++)
        if (x[i] - y[i] > d || y[i] - x[i] > d)
            d = x[i] > y[i] ? x[i] - y[i] : y[i] - x[i];
    return d;
}

static int master(void)
{
    sr_rref *stages[2], *params[4];
    size_t np = 0;
    for (int s = 0; s < 2; s++) {
        sr_value *from = sr_int(s == 0 ? 0 : 2), *to = sr_int(s == 0 ? 2 : 3), *list = NULL;
        sr_remote(s + 1, "stage_new", SR_ARGS(from, to), 0, &stages[s]); /* rpc.remote("workerN", Stage) */
        sr_rref_rpc_sync(stages[s], "stage_params", SR_NOARGS, 0, &list);
        for (size_t i = 0; i < sr_value_list_len(list); i++)
            params[np++] = sr_rref_ref(sr_value_rref(sr_value_list_at(list, i)));
        sr_value_unref(from), sr_value_unref(to), sr_value_unref(list);
    }
    sr_optim_opts o;
    sr_optim_opts_default(SR_OPTIM_ADAM, &o);
    o.lr = 0.05;
    sr_dist_optim *opt = NULL;
    if (sr_dist_optim_create(SR_OPTIM_ADAM, &o, params, np, &opt))
        return fprintf(stderr, "DistributedOptimizer: %s\n", sr_last_error()), 1;

    sr_generator g;
    sr_generator_init(&g, 2);
    int64_t labels[16];
    for (int i = 0; i < N; i++)
        labels[i] = i % 4;
    sr_tensor *x = sr_generator_uniform_tensor(&g, SR_F32, 2, (const int64_t[]){N, 8}, -1, 1, 0);
    sr_tensor *y = sr_from_data(SR_I64, 1, &N, labels, 0);
    double first = train_step(stages, opt, x, y), last = first;
    for (int step = 1; step < 60; step++)
        last = train_step(stages, opt, x, y);
    printf("loss: %.4f at the first step, %.4f after 60\n", first, last);

    sr_module *local = gather(stages);
    sr_tensor *piped = pipeline(stages, x), *here = local ? sr_module_forward(local, x) : NULL;
    double d = piped && here ? max_diff(piped, here) : INFINITY;
    printf("the stages' state in one local model: output differs by %.1e\n", d);
    int ok = last < first / 2 && d < 1e-4; /* float rounding: micro-batches of 4 rows, one batch of 16 */

    sr_tensor_unref(piped), sr_tensor_unref(here), sr_tensor_unref(x), sr_tensor_unref(y);
    sr_module_destroy(local);
    sr_dist_optim_destroy(opt);
    for (size_t i = 0; i < np; i++)
        sr_rref_unref(params[i]);
    sr_rref_unref(stages[0]), sr_rref_unref(stages[1]);
    return ok ? 0 : 1;
}

int main(void)
{
    sr_register("stage_new", stage_new);
    sr_register("stage_forward", stage_forward);
    sr_register("stage_params", stage_params);
    sr_register("stage_state", stage_state);
    if (sr_init(NULL))
        return fprintf(stderr, "sr_init: %s\n", sr_last_error()), 1;
    int rc = sr_rank() == 0 ? master() : 0; /* workers 1 and 2 serve until shutdown */
    if (sr_shutdown(true, 0))
        rc = 1;
    return rc;
}
