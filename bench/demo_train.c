/* SPDX-License-Identifier: MIT */
/* Demo: train a real model with a parameter server, the pattern of PyTorch's
 * official RPC tutorial ("Implementing a Parameter Server Using Distributed
 * RPC Framework"), on Fashion-MNIST.
 *
 *   shmrun -n 4 ./demo_train [options]     (1 parameter server + 3 trainers)
 *
 * Rank 0, the parameter server, holds an MLP 784-128-10 (seeded), offers its
 * parameters as RRefs it owns ("ps_params") and runs the forward pass
 * ("ps_forward"). Every other rank is a trainer: for each batch of its share
 * of the epoch it begins a distributed autograd context, gets the logits by
 * RPC (so the graph spans both workers), computes the cross-entropy, runs the
 * distributed backward and steps its DistributedOptimizer (SGD) with the
 * context. The trainers run concurrently and unserialised: no lock is held
 * around forward, backward or step, and every gradient is exact for the
 * weights its own forward used, whatever steps other trainers made since
 * (ps_forward says how; docs/TENSORS.md has the snapshot rule).
 *
 * The server shows one live progress line, then the test accuracy on the
 * 10k test images, the time, and the loss curve written as an SVG.
 * Checkpoints (--checkpoint-dir): the server saves the parameters, each
 * trainer's optimizer state and the training position every --save-every
 * steps, crash-safe (docs/CHECKPOINT.md); --resume continues from the last,
 * and so does a run restarted by shmrun --max-restarts (SHMRPC_RESTART_COUNT
 * above 0) when the directory holds a checkpoint.
 * With one trainer a resumed run ends with the same parameters, bit for bit,
 * as an uninterrupted one (tests/e2e/test_train_resume.c). With several, the
 * order of their updates is not deterministic, and a checkpoint may count a
 * trainer's last step as not done while the parameters already hold it: on
 * resume that batch is trained again.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "demo_cli.h"
#include "loss_svg.h"
#include "shmrpc/shmrpc.h"

#define NLAYERS 2
#define NPARAMS (2 * NLAYERS)
#define MAX_WORKERS 64
#define CKPT_NAME "train.ckpt"
#define WAIT_S 120 /* bound of every wait for another worker */
/* The training set's size, which the server (that does not load it) plans
 * the epochs with; each trainer checks its copy has it. */
#define TRAIN_SAMPLES 60000

static const int64_t SIZES[NLAYERS + 1] = {784, 128, 10};

static struct opts {
    int epochs, trainers;
    int64_t batch, save_every, limit;
    double lr, momentum;
    uint64_t seed;
    const char *ckpt_dir, *plot, *dump, *data;
    bool resume;
} opt = {.epochs = 1, .batch = 64, .lr = 0.05, .plot = "train_loss.svg"};

static int fail(int rc, const char *what)
{
    fprintf(stderr, "demo_train: worker%d: %s: %s\n", sr_rank(), what, sr_last_error());
    return rc ? rc : -EINVAL;
}

/* ---- the schedule: which batches a trainer trains, in which order ---- */

/* Batches per epoch: ceil(samples / batch), at most --limit-batches. */
static int64_t batches_per_epoch(int64_t samples)
{
    int64_t nb = (samples + opt.batch - 1) / opt.batch;
    return opt.limit > 0 && opt.limit < nb ? opt.limit : nb;
}

/* Trainer t (0-based) trains batches t, t + T, t + 2T, ... of each epoch. */
static int64_t share_of(int64_t nb, int t)
{
    return t < nb ? (nb - t + opt.trainers - 1) / opt.trainers : 0;
}

/* The data order of an epoch: a permutation drawn from (seed, epoch) alone. */
static int epoch_order(int64_t epoch, int64_t n, int64_t *perm)
{
    sr_generator g;
    sr_generator_init(&g, opt.seed ^ (UINT64_C(0x9E3779B97F4A7C15) * (uint64_t)(epoch + 1)));
    return sr_generator_permutation(&g, n, perm);
}

/* ======================= the parameter server (rank 0) ===================== */

static struct ps {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool ready, failed;
    sr_module *model;
    sr_tensor *const *params;
    const char *const *names;
    sr_rref *rrefs[NPARAMS];
    sr_checkpoint *resume; /* the checkpoint resumed from, until every trainer took its state */
    int64_t nb, total;     /* batches per epoch; steps of the whole run */
    int64_t step, first_step;
    int64_t pos[MAX_WORKERS]; /* steps done by each trainer, by rank */
    sr_rref *optim[MAX_WORKERS]; /* each trainer's local optimizer, kept here */
    int64_t optim_gen[MAX_WORKERS]; /* the trainer's generation that said hello with it */
    bool greeted[MAX_WORKERS];   /* the trainer said hello once (a replacement says it again) */
    double *loss;            /* loss[i]: the loss of step i + 1 */
    int64_t samples;         /* trained in this run */
    int hellos, done;
    sr_future *finished;     /* completed by the last ps_done; the main thread serves until then */
    double t_train, t_print;
    int64_t saved;           /* last step saved */
    bool tty;
} ps = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* Wait until pred() holds (ps.mu held), at most WAIT_S seconds. */
static int ps_wait(bool (*pred)(void), const char *what)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += WAIT_S;
    while (!pred() && !ps.failed)
        if (pthread_cond_timedwait(&ps.cv, &ps.mu, &dl) == ETIMEDOUT)
            return sr_errorf(-ETIMEDOUT, "waited %d s for %s", WAIT_S, what);
    return ps.failed ? sr_errorf(-ECANCELED, "the parameter server failed to start") : 0;
}

static bool is_ready(void) { return ps.ready; }

static int ps_wait_ready(void)
{
    pthread_mutex_lock(&ps.mu);
    int rc = ps_wait(is_ready, "the parameter server to start");
    pthread_mutex_unlock(&ps.mu);
    return rc;
}

/* ps_forward(x) -> logits = MLP(x) with the server's parameters.
 *
 * No lock against the other trainers' steps: every op pins the parameter
 * blocks it reads (docs/TENSORS.md), so a step that lands meanwhile moves
 * the parameter onto a copy instead of writing under the reader, and the
 * tensors the forward saves for backward keep the values it read. Each
 * gradient is exact for the weights its own forward used. */
static int ps_forward(sr_call *c)
{
    sr_tensor *x = sr_call_nargs(c) == 1 ? sr_value_tensor(sr_call_arg(c, 0)) : NULL;
    if (!x)
        return sr_call_fail(c, -EINVAL, "ps_forward takes one tensor");
    sr_tensor *logits = sr_mlp_apply(x, ps.params, NLAYERS);
    if (!logits)
        return sr_call_fail(c, -EINVAL, "ps_forward: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(logits);
    sr_tensor_unref(logits);
    return v ? sr_call_return(c, v) : sr_call_fail(c, -ENOMEM, "ps_forward: %s", sr_last_error());
}

/* ps_params() -> [RRef(param) ...] in sr_module_params order. */
static int ps_params(sr_call *c)
{
    int rc = ps_wait_ready();
    if (rc)
        return sr_call_fail(c, rc, "%s", sr_last_error());
    sr_value *items[NPARAMS] = {0}, *list = NULL;
    for (int i = 0; i < NPARAMS; i++)
        items[i] = sr_value_from_rref(ps.rrefs[i]);
    list = sr_list(NPARAMS, items);
    for (int i = 0; i < NPARAMS; i++)
        sr_value_unref(items[i]);
    return list ? sr_call_return(c, list) : sr_call_fail(c, -ENOMEM, "%s", sr_last_error());
}

/* ---- checkpoints ---- */

struct entries {
    size_t n, cap;
    char **names;
    sr_tensor **ts;
};

static int entries_add(struct entries *e, const char *prefix, const char *name, sr_tensor *t)
{
    if (e->n == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 16;
        char **nn = realloc(e->names, cap * sizeof(*nn));
        if (nn)
            e->names = nn;
        sr_tensor **nt = realloc(e->ts, cap * sizeof(*nt));
        if (nt)
            e->ts = nt;
        if (!nn || !nt)
            return sr_errorf(-ENOMEM, "out of memory for checkpoint entries");
        e->cap = cap;
    }
    size_t len = strlen(prefix) + strlen(name) + 1;
    if (!(e->names[e->n] = malloc(len)))
        return sr_errorf(-ENOMEM, "out of memory for checkpoint entries");
    snprintf(e->names[e->n], len, "%s%s", prefix, name);
    e->ts[e->n++] = sr_tensor_ref(t);
    return 0;
}

static void entries_free(struct entries *e)
{
    for (size_t i = 0; i < e->n; i++) {
        free(e->names[i]);
        sr_tensor_unref(e->ts[i]);
    }
    free(e->names);
    free(e->ts);
}

/* Optimizer i's state as "optim.<rank>.<name>". */
static int add_optim_state(struct entries *e, sr_optim *o, int rank)
{
    size_t n;
    char **names;
    sr_tensor **ts;
    int rc = sr_optim_state_export(o, &n, &names, &ts);
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "optim.%d.", rank);
    for (size_t i = 0; !rc && i < n; i++)
        rc = entries_add(e, prefix, names[i], ts[i]);
    if (!rc || n)
        sr_optim_state_free(n, names, ts);
    return rc;
}

static int add_loss_curve(struct entries *e)
{
    if (!ps.step)
        return 0;
    int64_t shape[1] = {ps.step};
    sr_tensor *t = sr_from_data(SR_F64, 1, shape, ps.loss, 0);
    int rc = t ? entries_add(e, "", "loss_curve", t) : -ENOMEM;
    sr_tensor_unref(t);
    return rc;
}

static int64_t double_bits(double d)
{
    int64_t v;
    memcpy(&v, &d, sizeof(v));
    return v;
}

enum { META_FIXED = 7 };
static const char *const META_NAMES[META_FIXED] = {"step", "epoch", "seed", "trainers", "batch", "limit_batches",
                                                   "lr_bits"};

static int save_meta(const char *path, struct entries *e)
{
    const char *names[META_FIXED + MAX_WORKERS];
    int64_t vals[META_FIXED + MAX_WORKERS];
    char posn[MAX_WORKERS][16];
    memcpy(names, META_NAMES, sizeof(META_NAMES));
    int64_t fixed[META_FIXED] = {ps.step, ps.step / ps.nb, (int64_t)opt.seed, opt.trainers, opt.batch, opt.limit,
                                 double_bits(opt.lr)};
    memcpy(vals, fixed, sizeof(fixed));
    for (int r = 1; r <= opt.trainers; r++) {
        snprintf(posn[r - 1], sizeof(posn[0]), "pos.%d", r);
        names[META_FIXED + r - 1] = posn[r - 1];
        vals[META_FIXED + r - 1] = ps.pos[r];
    }
    return sr_checkpoint_save(path, e->n, (const char *const *)e->names, e->ts, META_FIXED + (size_t)opt.trainers,
                              names, vals);
}

/* The optimizers a save covers: those of the trainers that said hello. */
struct save_job {
    const char *path;
    int rank[MAX_WORKERS]; /* rank of optims[i] */
};

/* A trainer that has not said hello yet has not stepped in this run: its
 * state is the one it was resumed with, if any (none: the initial state). */
static int add_resumed_state(struct entries *e, int rank)
{
    char prefix[32];
    size_t plen = (size_t)snprintf(prefix, sizeof(prefix), "optim.%d.", rank);
    int rc = 0;
    for (size_t i = 0; ps.resume && i < sr_checkpoint_count(ps.resume) && !rc; i++) {
        const char *nm = sr_checkpoint_name(ps.resume, i);
        sr_tensor *t = strncmp(nm, prefix, plen) ? NULL : sr_checkpoint_tensor(ps.resume, nm);
        rc = t ? entries_add(e, "", nm, t) : 0;
    }
    return rc;
}

/* Under the step lock: no trainer's step changes a parameter or an
 * optimizer state while they are read. */
static int save_locked(sr_optim *const *optims, size_t n, void *arg)
{
    struct save_job *job = arg;
    struct entries e = {0};
    int rc = 0;
    for (int i = 0; i < NPARAMS && !rc; i++)
        rc = entries_add(&e, "param.", ps.names[i], ps.params[i]);
    for (size_t i = 0; i < n && !rc; i++)
        rc = add_optim_state(&e, optims[i], job->rank[i]);
    for (int r = 1; r <= opt.trainers && !rc; r++)
        rc = ps.optim[r] ? 0 : add_resumed_state(&e, r);
    if (!rc)
        rc = add_loss_curve(&e);
    if (!rc)
        rc = save_meta(job->path, &e);
    entries_free(&e);
    return rc;
}

static void ckpt_path(char *buf, size_t n)
{
    snprintf(buf, n, "%s/%s", opt.ckpt_dir, CKPT_NAME);
}

/* A trainer replaced since it said hello (shmrun --restart rank): its
 * optimizer's state is not here until its successor says hello; 0: none. */
static int replaced_trainer(void)
{
    for (int r = 1; r <= opt.trainers; r++)
        if (ps.optim[r] && sr_worker_generation(r) != ps.optim_gen[r])
            return r;
    return 0;
}

/* Save a checkpoint now (ps.mu held); skipped while a trainer is being
 * replaced (the next save point tries again). */
static int ps_save(void)
{
    char path[4096];
    ckpt_path(path, sizeof(path));
    int gone = replaced_trainer();
    if (gone) {
        printf("checkpoint: step %" PRId64 " skipped: worker%d is being replaced\n", ps.step, gone);
        fflush(stdout);
        return 0;
    }
    struct save_job job = {.path = path};
    sr_rref *optims[MAX_WORKERS];
    size_t n = 0;
    for (int r = 1; r <= opt.trainers; r++)
        if (ps.optim[r]) {
            job.rank[n] = r;
            optims[n++] = ps.optim[r];
        }
    double t0 = demo_now_s();
    int rc = sr_dist_optim_with_locals(optims, n, save_locked, &job);
    if (rc)
        return fail(rc, "saving the checkpoint");
    ps.saved = ps.step;
    if (!ps.tty) { /* the time: what a save costs the training, which waits for it */
        printf("checkpoint: step %" PRId64 " saved to %s (%.1f ms)\n", ps.step, path, (demo_now_s() - t0) * 1e3);
        fflush(stdout);
    }
    return 0;
}

/* ---- progress ---- */

static void progress(void)
{
    double t = demo_now_s();
    bool last = ps.step == ps.total;
    if (!demo_progress_due(ps.tty, t, ps.t_print, ps.step, ps.total))
        return;
    ps.t_print = t;
    int64_t epoch = ps.step == ps.total ? ps.step / ps.nb : ps.step / ps.nb + 1;
    int64_t in_epoch = ps.step - (epoch - 1) * ps.nb;
    double rate = ps.samples / (t - ps.t_train > 1e-9 ? t - ps.t_train : 1e-9);
    char ck[48] = "";
    if (opt.ckpt_dir && ps.tty)
        snprintf(ck, sizeof(ck), "   checkpoint @ %" PRId64, ps.saved);
    printf("%sepoch %" PRId64 "/%d   batch %5" PRId64 "/%" PRId64 "   loss %.4f   %6.0f samples/s%s%s",
           ps.tty ? "\r" : "", epoch, opt.epochs, in_epoch, ps.nb, demo_running_loss(ps.loss, ps.step), rate, ck,
           ps.tty ? (last ? "\n" : "") : "\n");
    fflush(stdout);
}

/* ps_report(rank, loss, samples): a trainer finished a step. */
static int ps_report(sr_call *c)
{
    int rank = (int)sr_value_int(sr_call_arg(c, 0));
    if (sr_call_nargs(c) != 3 || rank < 1 || rank > opt.trainers)
        return sr_call_fail(c, -EINVAL, "ps_report takes (rank, loss, samples)");
    pthread_mutex_lock(&ps.mu);
    int rc = 0;
    if (ps.step < ps.total) {
        ps.pos[rank]++;
        ps.loss[ps.step++] = sr_value_double(sr_call_arg(c, 1));
        ps.samples += sr_value_int(sr_call_arg(c, 2));
        progress();
        if (demo_ckpt_due(opt.ckpt_dir, ps.step, opt.save_every, ps.total))
            rc = ps_save();
    }
    pthread_mutex_unlock(&ps.mu);
    return rc ? sr_call_fail(c, rc, "%s", sr_last_error()) : sr_call_return(c, NULL);
}

/* Give trainer `rank`'s optimizer the state it had in the checkpoint. */
static int import_locked(sr_optim *const *optims, size_t n, void *arg)
{
    (void)n;
    int rank = *(int *)arg;
    char prefix[32];
    int plen = snprintf(prefix, sizeof(prefix), "optim.%d.", rank);
    size_t cnt = sr_checkpoint_count(ps.resume), k = 0;
    const char **names = calloc(cnt ? cnt : 1, sizeof(*names));
    sr_tensor **ts = calloc(cnt ? cnt : 1, sizeof(*ts));
    int rc = names && ts ? 0 : sr_errorf(-ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < cnt; i++) {
        const char *nm = sr_checkpoint_name(ps.resume, i);
        if (!strncmp(nm, prefix, (size_t)plen)) {
            names[k] = nm + plen;
            ts[k++] = sr_checkpoint_tensor(ps.resume, nm);
        }
    }
    if (!rc)
        rc = sr_optim_state_import(optims[0], k, names, ts);
    free(names);
    free(ts);
    return rc;
}

/* ps_hello(rank, RRef(local optimizer)) -> steps this trainer has done. */
static int ps_hello(sr_call *c)
{
    int rank = (int)sr_value_int(sr_call_arg(c, 0));
    sr_rref *r = sr_call_nargs(c) == 2 ? sr_value_rref(sr_call_arg(c, 1)) : NULL;
    if (!r || rank < 1 || rank > opt.trainers)
        return sr_call_fail(c, -EINVAL, "ps_hello takes (rank, optimizer RRef)");
    int rc = ps_wait_ready();
    pthread_mutex_lock(&ps.mu);
    if (!rc && ps.resume)
        rc = sr_dist_optim_with_locals(&r, 1, import_locked, &rank);
    if (!rc) {
        sr_rref_unref(ps.optim[rank]); /* a replaced trainer's: its owner is gone */
        ps.optim[rank] = sr_rref_ref(r);
        ps.optim_gen[rank] = sr_worker_generation(rank);
        if (!ps.greeted[rank] && ps.hellos++ == 0)
            ps.t_train = demo_now_s();
        if (!ps.greeted[rank] && ps.hellos == opt.trainers) {
            sr_checkpoint_destroy(ps.resume);
            ps.resume = NULL;
        }
        ps.greeted[rank] = true;
    }
    int64_t pos = ps.pos[rank];
    pthread_mutex_unlock(&ps.mu);
    return rc ? sr_call_fail(c, rc, "ps_hello: %s", sr_last_error()) : sr_call_return(c, sr_int(pos));
}

/* ps_done(): a trainer has finished its share. */
static int ps_done(sr_call *c)
{
    pthread_mutex_lock(&ps.mu);
    if (++ps.done == opt.trainers && ps.finished)
        sr_future_set_result(ps.finished, NULL);
    pthread_cond_broadcast(&ps.cv);
    pthread_mutex_unlock(&ps.mu);
    return sr_call_return(c, NULL);
}

/* ---- the server's main line ---- */

static int meta_expect(const sr_checkpoint *ck, const char *name, int64_t want, const char *path)
{
    int64_t v;
    int rc = sr_checkpoint_meta(ck, name, &v);
    if (rc)
        return sr_errorf(rc, "%s has no '%s'", path, name);
    if (v != want)
        return sr_errorf(-EINVAL, "%s was written with %s %" PRId64 ", this run has %" PRId64
                                  " (resume with the same settings)", path, name, v, want);
    return 0;
}

static int restore_position(const sr_checkpoint *ck)
{
    for (int r = 1; r <= opt.trainers; r++) {
        char name[16];
        snprintf(name, sizeof(name), "pos.%d", r);
        int rc = sr_checkpoint_meta(ck, name, &ps.pos[r]);
        if (rc)
            return sr_errorf(rc, "the checkpoint has no '%s'", name);
        ps.step += ps.pos[r];
    }
    if (ps.step > ps.total)
        return sr_errorf(-EINVAL, "the checkpoint is at step %" PRId64 ", past this run's %" PRId64, ps.step,
                         ps.total);
    sr_tensor *curve = ps.step ? sr_checkpoint_tensor(ck, "loss_curve") : NULL;
    if (ps.step && (!curve || (int64_t)sr_tensor_numel(curve) != ps.step))
        return sr_errorf(-EBADMSG, "the checkpoint's loss curve does not have %" PRId64 " steps", ps.step);
    return curve ? sr_tensor_to_f64(curve, ps.loss, (size_t)ps.step) : 0;
}

static int ps_resume(void)
{
    char path[4096];
    ckpt_path(path, sizeof(path));
    sr_checkpoint *ck;
    int rc = sr_checkpoint_load(path, &ck);
    if (rc)
        return fail(rc, "--resume");
    const char *pnames[NPARAMS];
    char buf[NPARAMS][64];
    for (int i = 0; i < NPARAMS; i++) {
        snprintf(buf[i], sizeof(buf[i]), "param.%s", ps.names[i]);
        pnames[i] = buf[i];
    }
    if (!(rc = meta_expect(ck, "seed", (int64_t)opt.seed, path)) &&
        !(rc = meta_expect(ck, "trainers", opt.trainers, path)) &&
        !(rc = meta_expect(ck, "batch", opt.batch, path)) && !(rc = meta_expect(ck, "limit_batches", opt.limit, path)) &&
        !(rc = meta_expect(ck, "lr_bits", double_bits(opt.lr), path)) && !(rc = restore_position(ck)))
        rc = sr_checkpoint_restore_into(ck, NPARAMS, pnames, ps.params);
    if (rc) {
        sr_checkpoint_destroy(ck);
        return fail(rc, "--resume");
    }
    ps.resume = ck;
    ps.saved = ps.step;
    printf("resumed from %s at step %" PRId64 "\n", path, ps.step);
    return 0;
}

/* Restarted by shmrun --max-restarts (SHMRPC_RESTART_COUNT > 0), or this
 * server replaced by shmrun --restart rank (SHMRPC_GENERATION > 0), with a
 * checkpoint in --checkpoint-dir: resume from it, as --resume would. A
 * restart before the first save starts from the beginning again. */
static bool restarted_with_checkpoint(void)
{
    const char *n = getenv("SHMRPC_RESTART_COUNT"), *g = getenv("SHMRPC_GENERATION");
    char path[4096];
    if (!opt.ckpt_dir || ((!n || atoi(n) <= 0) && (!g || atoi(g) <= 0)))
        return false;
    ckpt_path(path, sizeof(path));
    return access(path, F_OK) == 0;
}

static int ps_setup(int64_t train_samples)
{
    sr_generator g;
    sr_generator_init(&g, opt.seed);
    int rc = sr_mlp_create(SIZES, NLAYERS, &g, SR_F32, &ps.model);
    if (rc)
        return fail(rc, "sr_mlp_create");
    size_t n;
    sr_module_params(ps.model, &n, &ps.params, &ps.names);
    for (int i = 0; i < NPARAMS; i++) {
        sr_value *v = sr_value_from_tensor(ps.params[i]);
        rc = v ? sr_rref_create(v, &ps.rrefs[i]) : -ENOMEM;
        sr_value_unref(v);
        if (rc)
            return fail(rc, "sr_rref_create");
    }
    ps.nb = batches_per_epoch(train_samples);
    ps.total = ps.nb * opt.epochs;
    if (!(ps.loss = calloc((size_t)ps.total + 1, sizeof(*ps.loss))))
        return fail(-ENOMEM, "the loss curve");
    rc = opt.resume || restarted_with_checkpoint() ? ps_resume() : 0;
    ps.first_step = ps.step;
    return rc;
}

static double test_accuracy(const sr_dataset *test)
{
    int64_t n = sr_dataset_size(test), *idx = malloc((size_t)n * sizeof(*idx));
    sr_tensor *x = NULL, *y = NULL, *logits = NULL;
    for (int64_t i = 0; idx && i < n; i++)
        idx[i] = i;
    double acc = NAN;
    if (idx && !sr_dataset_batch(test, idx, n, &x, &y)) {
        bool prev = sr_no_grad_enter();
        logits = sr_module_forward(ps.model, x);
        sr_no_grad_exit(prev);
        acc = logits ? sr_accuracy(logits, y) : NAN;
    }
    free(idx);
    sr_tensor_unref(x);
    sr_tensor_unref(y);
    sr_tensor_unref(logits);
    return acc;
}

static int dump_params(const char *path)
{
    int rc = sr_checkpoint_save(path, NPARAMS, ps.names, ps.params, 0, NULL, NULL);
    return rc ? fail(rc, "--dump-params") : 0;
}

static int ps_finish(const sr_dataset *test, double t0)
{
    int rc = 0;
    if (opt.ckpt_dir && ps.saved != ps.step)
        rc = ps_save();
    if (!rc && opt.dump)
        rc = dump_params(opt.dump);
    double train_s = demo_now_s() - ps.t_train, acc = test_accuracy(test);
    if (isnan(acc))
        return fail(-EINVAL, "test accuracy");
    printf("test accuracy: %.2f %% (%" PRId64 " test images)\n", 100 * acc, sr_dataset_size(test));
    printf("time: %.1f s in all, %.1f s training (%" PRId64 " steps, %.0f samples/s)\n", demo_now_s() - t0, train_s,
           ps.step - ps.first_step, (double)ps.samples / train_s);
    char title[160];
    snprintf(title, sizeof(title), "MLP 784-128-10 on Fashion-MNIST: %d trainer%s, batch %" PRId64 ", SGD lr %g",
             opt.trainers, opt.trainers > 1 ? "s" : "", opt.batch, opt.lr);
    if (!rc && !(rc = loss_svg_write(opt.plot, title, ps.loss, (size_t)ps.step))) {
        char *abs = realpath(opt.plot, NULL);
        printf("loss curve: %s\n", abs ? abs : opt.plot);
        free(abs);
    }
    return rc;
}

static void ps_release(void)
{
    for (int r = 0; r < MAX_WORKERS; r++)
        sr_rref_unref(ps.optim[r]);
    for (int i = 0; i < NPARAMS; i++)
        sr_rref_unref(ps.rrefs[i]);
    sr_checkpoint_destroy(ps.resume);
    sr_module_destroy(ps.model);
    free(ps.loss);
}

/* Until every trainer is done (ps.mu held): bounded by progress, not by the
 * length of the training: it fails only after WAIT_S seconds without a step.
 * The thread serves meanwhile (sr_serve_until_timeout), without ps.mu, which
 * the served functions take: a call it reads runs here, with no hop to an
 * executor thread (three a step: ps_forward, the optimizer's step,
 * ps_report). */
static int wait_training(void)
{
    int64_t seen;
    int rc;
    do {
        seen = ps.step;
        pthread_mutex_unlock(&ps.mu);
        rc = sr_serve_until_timeout(ps.finished, WAIT_S, NULL);
        pthread_mutex_lock(&ps.mu);
    } while (rc == -ETIMEDOUT && ps.step != seen);
    if (rc == -ETIMEDOUT)
        return sr_errorf(-ETIMEDOUT, "waited %d s for the trainers' next step or their end", WAIT_S);
    return rc;
}

static int server(double t0)
{
    sr_dataset *test = NULL;
    ps.tty = isatty(1);
    int rc = sr_fashion_mnist_load(opt.data, false, &test);
    if (rc)
        fail(rc, "loading the test set");
    else if ((rc = ps_setup(TRAIN_SAMPLES)) == 0)
        printf("parameter server: MLP 784-128-10 (%zu parameters), %d trainer%s, %" PRId64 " batches of %" PRId64
               " per epoch, %d epoch%s\n", sr_module_numel(ps.model), opt.trainers, opt.trainers > 1 ? "s" : "",
               ps.nb, opt.batch, opt.epochs, opt.epochs > 1 ? "s" : "");
    fflush(stdout);
    if (!rc && !(ps.finished = sr_future_new())) /* before ready: no trainer is done before it */
        rc = fail(-ENOMEM, "the training's future");
    pthread_mutex_lock(&ps.mu);
    ps.ready = !rc;
    ps.failed = rc != 0;
    pthread_cond_broadcast(&ps.cv);
    if (!rc && (rc = wait_training()))
        fail(rc, "training");
    pthread_mutex_unlock(&ps.mu);
    if (!rc)
        rc = ps_finish(test, t0);
    ps_release();
    sr_future_unref(ps.finished);
    sr_dataset_destroy(test);
    return rc;
}

/* ============================== a trainer ================================= */

struct trainer {
    const sr_dataset *data;
    sr_rref *params[NPARAMS];
    sr_dist_optim *optim;
    int64_t *perm;
    int64_t server_gen; /* the server's generation the parameters above are from */
};

/* One step on the samples idx[0..n): forward on the server, backward, step. */
static int train_step(struct trainer *t, const int64_t *idx, int64_t n, double *loss_out)
{
    sr_tensor *x = NULL, *y = NULL, *loss = NULL;
    sr_value *xv = NULL, *out = NULL;
    int64_t ctx = SR_NO_CONTEXT;
    int rc = sr_dataset_batch(t->data, idx, n, &x, &y);
    if (!rc && !(rc = sr_dist_autograd_context_begin(&ctx))) {
        xv = sr_value_from_tensor(x);
        if (!(rc = sr_rpc_sync(0, "ps_forward", SR_ARGS(xv), 0, &out))) {
            loss = sr_cross_entropy(sr_value_tensor(out), y);
            rc = loss ? sr_dist_autograd_backward(ctx, &loss, 1, false) : -EINVAL;
        }
        if (!rc)
            rc = sr_dist_optim_step(t->optim, ctx);
        int end = sr_dist_autograd_context_end(ctx);
        rc = rc ? rc : end;
    }
    if (!rc)
        *loss_out = sr_tensor_item(loss);
    sr_tensor_unref(loss), sr_tensor_unref(x), sr_tensor_unref(y);
    sr_value_unref(xv), sr_value_unref(out);
    return rc ? fail(rc, "training step") : 0;
}

static int report(double loss, int64_t n)
{
    sr_value *r = sr_int(sr_rank()), *l = sr_double(loss), *s = sr_int(n);
    int rc = sr_rpc_sync(0, "ps_report", SR_ARGS(r, l, s), 0, NULL);
    sr_value_unref(r), sr_value_unref(l), sr_value_unref(s);
    return rc ? fail(rc, "ps_report") : 0;
}

/* Train this trainer's share, from its done-step count `from` on. */
static int train_loop(struct trainer *t, int64_t from)
{
    int64_t N = sr_dataset_size(t->data), nb = batches_per_epoch(N), T = opt.trainers, me = sr_rank() - 1;
    int64_t share = share_of(nb, (int)me), epoch = -1;
    for (int64_t k = from; k < share * opt.epochs; k++) {
        if (k / share != epoch && epoch_order(epoch = k / share, N, t->perm))
            return fail(-EINVAL, "the data order");
        int64_t b = me + (k % share) * T, at = b * opt.batch;
        int64_t n = N - at < opt.batch ? N - at : opt.batch;
        double loss = NAN; /* set by train_step on success; gcc -O3 cannot see it (maybe-uninitialized) */
        int rc = train_step(t, t->perm + at, n, &loss);
        if (rc || (rc = report(loss, n)))
            return rc;
    }
    return 0;
}

static int get_params(struct trainer *t)
{
    sr_value *list = NULL;
    int rc = sr_rpc_sync(0, "ps_params", SR_NOARGS, 0, &list);
    if (rc)
        return fail(rc, "ps_params");
    for (int i = 0; i < NPARAMS; i++) {
        sr_rref *r = sr_value_rref(sr_value_list_at(list, (size_t)i));
        t->params[i] = r ? sr_rref_ref(r) : NULL;
        rc = r ? rc : -EPROTO;
    }
    sr_value_unref(list);
    return rc ? fail(rc, "ps_params returned no RRef") : 0;
}

static int hello(struct trainer *t, int64_t *from)
{
    sr_value *r = sr_int(sr_rank()), *o = sr_value_from_rref(sr_dist_optim_local_rref(t->optim, 0)), *out = NULL;
    int rc = sr_rpc_sync(0, "ps_hello", SR_ARGS(r, o), 0, &out);
    *from = sr_value_int(out);
    sr_value_unref(r), sr_value_unref(o), sr_value_unref(out);
    return rc ? fail(rc, "ps_hello") : 0;
}

/* The parameters from the server, a DistributedOptimizer over them, and
 * hello: the step this trainer resumes from. */
static int join_server(struct trainer *t, const sr_optim_opts *o, int64_t *from)
{
    t->server_gen = sr_worker_generation(0);
    int rc = get_params(t);
    if (!rc && (rc = sr_dist_optim_create(SR_OPTIM_SGD, o, t->params, NPARAMS, &t->optim)))
        fail(rc, "sr_dist_optim_create");
    return rc ? rc : hello(t, from);
}

static void leave_server(struct trainer *t)
{
    sr_dist_optim_destroy(t->optim);
    t->optim = NULL;
    for (int i = 0; i < NPARAMS; i++) {
        sr_rref_unref(t->params[i]);
        t->params[i] = NULL;
    }
}

/* After a failed step: was the server replaced (shmrun --restart rank)?
 * Then wait for its successor, which resumed from the last checkpoint,
 * and join it again: true. Else the failure is the trainer's: false. */
static bool server_replaced(struct trainer *t, const sr_optim_opts *o, int64_t *from)
{
    if (sr_worker_generation(0) == t->server_gen && t->server_gen >= 0)
        return false;
    if (sr_wait_for_worker(0, WAIT_S)) {
        fail(-ETIMEDOUT, "waiting for the parameter server's replacement");
        return false;
    }
    printf("worker%d: the parameter server was replaced (generation %" PRId64 "): joining it again\n", sr_rank(),
           sr_worker_generation(0));
    fflush(stdout);
    leave_server(t);
    return join_server(t, o, from) == 0;
}

static int trainer(void)
{
    struct trainer t = {0};
    sr_dataset *ds = NULL;
    int rc = sr_fashion_mnist_load(opt.data, true, &ds);
    if (rc)
        return fail(rc, "loading the training set");
    t.data = ds;
    if (sr_dataset_size(ds) != TRAIN_SAMPLES) {
        sr_errorf(-EINVAL, "%" PRId64 " samples, not the %d of Fashion-MNIST", sr_dataset_size(ds), TRAIN_SAMPLES);
        sr_dataset_destroy(ds);
        return fail(-EINVAL, "the training set");
    }
    sr_optim_opts o;
    sr_optim_opts_default(SR_OPTIM_SGD, &o);
    o.lr = opt.lr;
    o.momentum = opt.momentum;
    int64_t from = 0;
    if (!(t.perm = malloc((size_t)sr_dataset_size(ds) * sizeof(*t.perm))))
        rc = fail(-ENOMEM, "the data order");
    if (!rc)
        rc = join_server(&t, &o, &from);
    for (bool again = !rc; again;) { /* again after the server was replaced */
        if (!(rc = train_loop(&t, from)) && (rc = sr_rpc_sync(0, "ps_done", SR_NOARGS, 0, NULL)))
            fail(rc, "ps_done");
        again = rc && server_replaced(&t, &o, &from);
    }
    leave_server(&t);
    free(t.perm);
    sr_dataset_destroy(ds);
    return rc;
}

/* ============================ command line ================================ */

static const char usage[] =
    "usage: shmrun -n N demo_train [options]      (rank 0: parameter server; ranks 1..N-1: trainers)\n"
    "  --epochs E            epochs to train (default 1)\n"
    "  -n, --trainers T      the number of trainers: shmrun's -n minus 1 (given here, it is only checked)\n"
    "  --batch B             samples per batch (default 64)\n"
    "  --lr LR               SGD learning rate (default 0.05)\n"
    "  --momentum M          SGD momentum (default 0)\n"
    "  --seed S              seed of the initial weights and of the data order (default 0)\n"
    "  --checkpoint-dir DIR  save checkpoints to DIR/" CKPT_NAME "\n"
    "  --save-every N        save every N steps (default 100, with --checkpoint-dir)\n"
    "  --resume              continue from the checkpoint in --checkpoint-dir (implied when\n"
    "                        shmrun --max-restarts restarted the job and a checkpoint exists)\n"
    "  --limit-batches K     train only the first K batches of each epoch (short runs, tests)\n"
    "  --dump-params FILE    write the final parameters to FILE (a checkpoint file)\n"
    "  --plot FILE           the loss curve, SVG (default train_loss.svg)\n"
    "  --data DIR            Fashion-MNIST directory (default " SR_FASHION_MNIST_DIR ")\n";

static const struct demo_cli CLI = {"demo_train", usage};

static int bad(const char *what, const char *val) { return demo_bad(&CLI, what, val); }
static bool num(const char *s, double lo, double hi, double *out) { return demo_num(s, lo, hi, out); }

enum { O_EPOCHS = 256, O_BATCH, O_LR, O_MOM, O_SEED, O_DIR, O_EVERY, O_RESUME, O_LIMIT, O_DUMP, O_PLOT, O_DATA };

static int set_opt(int c, const char *arg, int world)
{
    double v;
    switch (c) {
    case O_EPOCHS: return num(arg, 1, 1000, &v) ? (opt.epochs = (int)v, 0) : bad("--epochs takes 1..1000", arg);
    case 'n':
        return num(arg, 1, MAX_WORKERS - 1, &v) && (world < 2 || (int)v == world - 1)
                   ? 0 : bad("--trainers must be shmrun's -n minus 1", arg);
    case O_BATCH: return num(arg, 1, 60000, &v) ? (opt.batch = (int64_t)v, 0) : bad("--batch takes 1..60000", arg);
    case O_LR: return num(arg, 1e-9, 100, &v) ? (opt.lr = v, 0) : bad("--lr takes a positive number", arg);
    case O_MOM: return num(arg, 0, 1, &v) ? (opt.momentum = v, 0) : bad("--momentum takes 0..1", arg);
    case O_SEED: return num(arg, 0, 1e15, &v) ? (opt.seed = (uint64_t)v, 0) : bad("--seed takes a number", arg);
    case O_DIR: return opt.ckpt_dir = arg, 0;
    case O_EVERY: return num(arg, 1, 1e12, &v) ? (opt.save_every = (int64_t)v, 0) : bad("--save-every takes N >= 1", arg);
    case O_RESUME: return opt.resume = true, 0;
    case O_LIMIT: return num(arg, 1, 1e12, &v) ? (opt.limit = (int64_t)v, 0) : bad("--limit-batches takes K >= 1", arg);
    case O_DUMP: return opt.dump = arg, 0;
    case O_PLOT: return opt.plot = arg, 0;
    case O_DATA: return opt.data = arg, 0;
    case 'h': {
        const char *rank = getenv("SHMRPC_RANK");
        if (!rank || !strcmp(rank, "0")) /* once, not once per worker */
            fputs(usage, stdout);
        return 1;
    }
    default: return bad("unknown option", arg);
    }
}

static int parse(int argc, char **argv, int world)
{
    static const struct option longs[] = {
        {"epochs", 1, 0, O_EPOCHS}, {"trainers", 1, 0, 'n'}, {"batch", 1, 0, O_BATCH},
        {"lr", 1, 0, O_LR}, {"momentum", 1, 0, O_MOM}, {"seed", 1, 0, O_SEED},
        {"checkpoint-dir", 1, 0, O_DIR}, {"save-every", 1, 0, O_EVERY}, {"resume", 0, 0, O_RESUME},
        {"limit-batches", 1, 0, O_LIMIT}, {"dump-params", 1, 0, O_DUMP}, {"plot", 1, 0, O_PLOT},
        {"data", 1, 0, O_DATA}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int rc = demo_parse(&CLI, argc, argv, "n:h", longs, set_opt, world);
    if (rc || (rc = demo_ckpt_opts(&CLI, opt.resume, opt.ckpt_dir, &opt.save_every)))
        return rc;
    return 0;
}

int main(int argc, char **argv)
{
    double t0 = demo_now_s();
    int world = demo_world_from_env();
    int rc = parse(argc, argv, world);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (world < 2 || world > MAX_WORKERS) {
        fprintf(stderr, "demo_train: run it under shmrun (or mpirun) with 2 to %d workers: shmrun -n 4 %s\n", MAX_WORKERS,
                argv[0]);
        return 2;
    }
    opt.trainers = world - 1;
    sr_register("ps_forward", ps_forward);
    sr_register("ps_params", ps_params);
    sr_register("ps_hello", ps_hello);
    sr_register("ps_report", ps_report);
    sr_register("ps_done", ps_done);
    if ((rc = sr_init(NULL)))
        return fail(rc, "sr_init"), 1;
    int rank = sr_rank();
    rc = rank == 0 ? server(t0) : trainer();
    /* A failed worker leaves at once (shmrun then stops the job); the
     * others wait for one another, then shut down together. */
    int sd = sr_shutdown(rc == 0, 60);
    if (sd)
        fprintf(stderr, "demo_train: worker%d: sr_shutdown: %s\n", rank, sr_last_error());
    return rc || sd ? 1 : 0;
}
