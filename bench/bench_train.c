/* SPDX-License-Identifier: MIT */
/* Training benchmark: the parameter-server pattern of PyTorch's RPC tutorial
 * on Fashion-MNIST, next to the local compute floor and to PyTorch, all in
 * one run.
 *
 *   bench_train [--json] [--no-torch] [--seed S]
 *
 * The job: a parameter server (rank 0) holds an MLP 784-128-10; each trainer
 * takes its share of one shuffled epoch of the 60000 training images in
 * batches of 64, and per batch, inside a distributed autograd context:
 * rpc_sync to the server for the forward, cross_entropy locally, a
 * distributed backward, sr_dist_optim_step (SGD, lr 0.05), context end.
 * After the epoch the server measures the accuracy on the 10000 test images.
 *
 *   1 trainer     step p50 and samples/s. THE FLOOR is the same step (forward,
 *                 cross_entropy, backward, SGD step) on a local copy of the
 *                 model in the trainer's process, no RPC: the epoch is cut in
 *                 ROUNDS chunks, and before each chunk the trainer times
 *                 FLOOR_STEPS local steps on that chunk's first batches. The
 *                 ratio is the median of the per-round p50 ratios.
 *   3 trainers    concurrent, no lock: samples/s from the first trainer's
 *                 start to the last one's end, against the 1-trainer figure
 *                 of the same round (PAIRS rounds of both jobs, medians);
 *                 then, for reference, serialised by a lock on the server
 *                 around each whole step (PyTorch's working form).
 *   PyTorch       bench/compare/torch_ps_fashion.py (Debian's python3-torch)
 *                 runs the same job after ours: 1 trainer, 3 serialised by a
 *                 lock (its only working form). Without python3-torch the
 *                 bench says so and prints ours only.
 *
 * BENCH_TRAIN_PHASES=1 also prints the p50 of each phase of both steps and
 * the messages, wake-ups and sleeps per step of trainer and server;
 * BENCH_TRAIN_PYTHON names the interpreter for PyTorch (/usr/bin/python3);
 * BENCH_TRAIN_TRAINER_SPIN_NS sets SHMRPC_SPIN_NS in the trainers only.
 *
 * A step is what the trainer times from context begin to context end;
 * building the batch is outside it (in samples/s, inside). Targets are
 * printed as met / NOT met, never asserted. The bench exits 1 only when the
 * 1-trainer job fails (a failed call, a NaN loss); a failed 3-trainer run is
 * reported on its line, with the error.
 */
#include <errno.h>
#include <math.h>
#include <semaphore.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "shmrpc/shmrpc.h"

#ifndef TORCH_PS_SCRIPT
#define TORCH_PS_SCRIPT "bench/compare/torch_ps_fashion.py"
#endif

#define BATCH 64
#define LR 0.05
#define HIDDEN 128
#define ROUNDS 7
#define FLOOR_STEPS 100
#define MAX_TRAINERS 3
#define CONCURRENT_TRIES 3
#define PAIRS 5 /* rounds of (1 trainer, 3 trainers): the target is on the median of 5 */
#define MAX_STEPS 1024 /* steps of one trainer: ceil(60000 / 64) = 938 */
#define WAIT_NS (300ll * 1000000000)

/* The counts, or --smoke's (main): a few batches per trainer, and figures
 * that are not measurements. */
static int rounds = ROUNDS, floor_steps = FLOOR_STEPS, pairs = PAIRS;
static int64_t share_cap = INT64_MAX; /* samples of a trainer's share */

static const int64_t SIZES[3] = {784, HIDDEN, 10};

/* How the trainers' steps are ordered on the server. */
enum mode {
    FREE,         /* not at all: forward, backward and step of all trainers overlap */
    SERIALISED    /* a lock on the server around each whole step (PyTorch's working form) */
};

/* Filled by the workers, read by the parent: shared memory. */
struct shared {
    bench_barrier all, trainers;
    int64_t start_ns[MAX_TRAINERS + 1], end_ns[MAX_TRAINERS + 1], steps[MAX_TRAINERS + 1];
    int64_t step_p50[MAX_TRAINERS + 1];
    double last_loss[MAX_TRAINERS + 1];
    bench_rounds rounds; /* 1 trainer: ours (step) next to the floor, per round */
    double train_s;      /* 1 trainer: the epoch's time, floor rounds left out */
    double acc;          /* the server's test accuracy after the epoch */
    double cpu_s[MAX_TRAINERS + 1]; /* CPU time of each worker (all its threads) over the epoch */
    sr_debug_info dbg[MAX_TRAINERS + 1]; /* message and wake-up counters over the epoch, per worker */
    enum mode mode;      /* how the trainers' steps are ordered on the server */
    int errors;
    char error[512];     /* the first failure's text */
};

static struct shared *sh;

/* CPU seconds used so far by this process, every thread. */
static double cpu_now(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 + (double)u.ru_stime.tv_sec +
           (double)u.ru_stime.tv_usec / 1e6;
}

static sr_dataset *train_set, *test_set; /* loaded by the parent, inherited */
static uint64_t seed = 1;

/* A worker that fails records the first failure for the report and leaves
 * at once: the others would wait out their barriers. */
#define FAIL(...)                                                                                                   \
    do {                                                                                                            \
        char what_[160];                                                                                            \
        snprintf(what_, sizeof(what_), __VA_ARGS__);                                                                \
        if (!sh->errors++)                                                                                          \
            snprintf(sh->error, sizeof(sh->error), "rank %d: %s: %s", sr_rank(), what_, sr_last_error());          \
        _exit(1);                                                                                                   \
    } while (0)

static void debug_delta(sr_debug_info *out, const sr_debug_info *a, const sr_debug_info *b)
{
    out->messages_sent = b->messages_sent - a->messages_sent;
    out->messages_received = b->messages_received - a->messages_received;
    out->wakes_issued = b->wakes_issued - a->wakes_issued;
    out->sleeps_taken = b->sleeps_taken - a->sleeps_taken;
}

/* ---- the parameter server (rank 0) ---- */

static sr_module *ps_model;
static sr_rref *ps_param_rrefs[4];
static sr_future *ps_done;
static sem_t ps_lock; /* serialised mode: taken by ps.forward_locked, given back by ps.release */

/* ps.forward(x): the logits, recorded in the caller's autograd context. */
static int ps_forward(sr_call *c)
{
    sr_tensor *y = sr_module_forward(ps_model, sr_value_tensor(sr_call_arg(c, 0)));
    if (!y)
        return sr_call_fail(c, -EINVAL, "ps.forward: %s", sr_last_error());
    sr_value *v = sr_value_from_tensor(y);
    sr_tensor_unref(y);
    return sr_call_return(c, v);
}

/* ps.forward_locked(x): the same after taking the server's lock, which the
 * trainer gives back with ps.release after its optimizer step (PyTorch's
 * only working form with several trainers). A semaphore, since another
 * executor thread releases it. */
static int ps_forward_locked(sr_call *c)
{
    while (sem_wait(&ps_lock))
        if (errno != EINTR)
            return sr_call_fail(c, -errno, "ps.forward_locked: sem_wait: %s", strerror(errno));
    return ps_forward(c);
}

static int ps_release(sr_call *c)
{
    sem_post(&ps_lock);
    return sr_call_return(c, NULL);
}

/* ps.params(): the parameters as RRefs, for the distributed optimizer. */
static int ps_params(sr_call *c)
{
    sr_value *items[4];
    for (int i = 0; i < 4; i++)
        items[i] = sr_value_from_rref(ps_param_rrefs[i]);
    sr_value *l = sr_list(4, items);
    for (int i = 0; i < 4; i++)
        sr_value_unref(items[i]);
    return sr_call_return(c, l);
}

/* ps.done(): every trainer has finished its share (trainer 1 calls it after
 * the trainers' end barrier). */
static int ps_done_fn(sr_call *c)
{
    sr_future_set_result(ps_done, NULL);
    return sr_call_return(c, NULL);
}

static double test_accuracy(sr_module *m)
{
    enum { CHUNK = 1000 };
    static int64_t idx[CHUNK];
    double correct = 0;
    int64_t n = sr_dataset_size(test_set);
    bool prev = sr_no_grad_enter();
    for (int64_t at = 0; at < n; at += CHUNK) {
        int64_t k = n - at < CHUNK ? n - at : CHUNK;
        for (int64_t i = 0; i < k; i++)
            idx[i] = at + i;
        sr_tensor *x, *y;
        if (sr_dataset_batch(test_set, idx, k, &x, &y)) {
            correct = NAN;
            break;
        }
        sr_tensor *logits = sr_module_forward(m, x);
        correct += sr_accuracy(logits, y) * (double)k;
        sr_tensor_unref(logits);
        sr_tensor_unref(x);
        sr_tensor_unref(y);
    }
    sr_no_grad_exit(prev);
    return correct / (double)n;
}

static sr_module *new_model(void)
{
    sr_generator g;
    sr_generator_init(&g, seed);
    sr_module *m = NULL;
    return sr_mlp_create(SIZES, 2, &g, SR_F32, &m) ? NULL : m;
}

static int run_server(int world)
{
    ps_done = sr_future_new();
    sem_init(&ps_lock, 0, 1);
    if (!(ps_model = new_model()))
        FAIL("model");
    size_t n;
    sr_tensor *const *p;
    sr_module_params(ps_model, &n, &p, NULL);
    for (size_t i = 0; i < 4; i++) {
        sr_value *v = sr_value_from_tensor(p[i]);
        if (sr_rref_create(v, &ps_param_rrefs[i]))
            FAIL("rref of parameter %zu", i);
        sr_value_unref(v);
    }
    bench_barrier_wait(&sh->all, (uint32_t)world, WAIT_NS); /* the model exists */
    double cpu0 = cpu_now();
    sr_debug_info d0, d1;
    sr_debug_info_get(&d0);
    /* The server's thread has nothing else to do until the trainers are
     * done: it serves (as PyTorch's server does from rpc.shutdown()), so a
     * call it reads runs on it, without a hop to an executor thread; calls
     * that arrive while it computes (several trainers) still go to the
     * executors, in parallel. */
    if (sr_serve_until(ps_done, NULL))
        FAIL("waiting for the trainers");
    sh->cpu_s[0] = cpu_now() - cpu0; /* the trainers' setup included: small */
    sr_debug_info_get(&d1);
    debug_delta(&sh->dbg[0], &d0, &d1);
    sh->acc = test_accuracy(ps_model);
    for (int i = 0; i < 4; i++)
        sr_rref_unref(ps_param_rrefs[i]);
    sr_module_destroy(ps_model);
    sr_future_unref(ps_done);
    return 0;
}

/* ---- the trainers ---- */

struct trainer {
    int rank, ntrainers;
    int64_t *perm, first, count; /* this trainer's share: perm[first .. first + count) */
    sr_dist_optim *opt;
};

static void make_batch(struct trainer *t, int64_t step, sr_tensor **x, sr_tensor **y)
{
    int64_t at = step * BATCH, k = t->count - at < BATCH ? t->count - at : BATCH;
    if (sr_dataset_batch(train_set, t->perm + t->first + at, k, x, y))
        FAIL("batch");
}

static int64_t nsteps(const struct trainer *t)
{
    return (t->count + BATCH - 1) / BATCH;
}

/* BENCH_TRAIN_PHASES=1: where a step's time goes, p50 of each phase, for the
 * distributed step (forward RPC, loss, backward, optimizer step, context
 * end) and for the floor's (forward, loss, backward, SGD + zero_grad). */
enum { PH_FWD, PH_LOSS, PH_BWD, PH_STEP, PH_END, NPHASES };
static bool phases_on;
static int64_t phase_ns[2][NPHASES][MAX_STEPS];
static int64_t phase_n[2];

static void phase_mark(int which, int ph, int64_t *t)
{
    if (!phases_on)
        return;
    int64_t now = bench_now_ns();
    if (phase_n[which] < MAX_STEPS)
        phase_ns[which][ph][phase_n[which]] = now - *t;
    *t = now;
    if (ph == NPHASES - 1 || (which == 1 && ph == PH_STEP))
        phase_n[which]++;
}

static const char *const mode_name[] = {"no lock", "serialised"};

static void phases_print(const char *who)
{
    static const char *names[NPHASES] = {"forward", "loss", "backward", "step", "ctx end"};
    for (int w = 0; phases_on && w < 2; w++) {
        size_t n = (size_t)(phase_n[w] < MAX_STEPS ? phase_n[w] : MAX_STEPS);
        if (!n)
            continue;
        printf("# phases, %s (p50 of %zu steps):", w ? "floor" : who, n);
        for (int ph = 0; ph < (w ? PH_END : NPHASES); ph++)
            printf(" %s %.0f us", names[ph], (double)bench_lat_of(phase_ns[w][ph], n).p50 / 1e3);
        printf("\n");
    }
    fflush(stdout);
}

/* One distributed step; returns its loss. */
static double dist_step(struct trainer *t, sr_tensor *x, sr_tensor *y)
{
    int64_t ctx, tp = bench_now_ns();
    sr_value *xv = sr_value_from_tensor(x), *out = NULL;
    if (sr_dist_autograd_context_begin(&ctx))
        FAIL("context");
    static const char *const fwd[] = {"ps.forward", "ps.forward_locked"};
    if (sr_rpc_sync(0, fwd[sh->mode], SR_ARGS(xv), 0, &out))
        FAIL("forward");
    phase_mark(0, PH_FWD, &tp);
    sr_tensor *loss = sr_cross_entropy(sr_value_tensor(out), y);
    phase_mark(0, PH_LOSS, &tp);
    if (!loss || sr_dist_autograd_backward(ctx, &loss, 1, false))
        FAIL("backward");
    phase_mark(0, PH_BWD, &tp);
    if (sr_dist_optim_step(t->opt, ctx))
        FAIL("step");
    if (sh->mode == SERIALISED && sr_rpc_sync(0, "ps.release", SR_NOARGS, 0, NULL))
        FAIL("release");
    phase_mark(0, PH_STEP, &tp);
    if (sr_dist_autograd_context_end(ctx))
        FAIL("context end");
    phase_mark(0, PH_END, &tp);
    double l = sr_tensor_item(loss);
    sr_tensor_unref(loss);
    sr_value_unref(out);
    sr_value_unref(xv);
    return l;
}

/* One local step, the floor: forward, loss, backward, SGD, zero_grad. */
static void local_step(sr_module *m, sr_optim *o, sr_tensor *x, sr_tensor *y)
{
    int64_t tp = bench_now_ns();
    sr_tensor *logits = sr_module_forward(m, x);
    phase_mark(1, PH_FWD, &tp);
    sr_tensor *loss = logits ? sr_cross_entropy(logits, y) : NULL;
    phase_mark(1, PH_LOSS, &tp);
    if (!loss || sr_backward(loss, false))
        FAIL("local backward");
    phase_mark(1, PH_BWD, &tp);
    if (sr_optim_step(o) || sr_optim_zero_grad(o, true))
        FAIL("local step");
    phase_mark(1, PH_STEP, &tp);
    sr_tensor_unref(loss);
    sr_tensor_unref(logits);
}

/* The 1-trainer epoch in ROUNDS chunks, each after FLOOR_STEPS local steps. */
static void epoch_with_floor(struct trainer *t)
{
    static int64_t lat[MAX_STEPS], all[MAX_STEPS], fl[FLOOR_STEPS];
    sr_module *m = new_model();
    size_t np;
    sr_tensor *const *p;
    sr_optim_opts oo;
    sr_optim *lo = NULL;
    sr_optim_opts_default(SR_OPTIM_SGD, &oo);
    oo.lr = LR;
    if (!m)
        FAIL("floor model");
    sr_module_params(m, &np, &p, NULL);
    if (sr_optim_create(SR_OPTIM_SGD, &oo, p, np, &lo))
        FAIL("floor optimizer");
    int64_t n = nsteps(t), done = 0, train_ns = 0;
    for (int r = 0; r < rounds; r++) {
        int64_t end = n * (r + 1) / rounds, k = 0;
        for (int i = 0; i < floor_steps + (r == 0 ? 10 : 0); i++) { /* round 0 warms up first */
            sr_tensor *x, *y;
            make_batch(t, done + i % (end - done), &x, &y);
            int64_t t0 = bench_now_ns();
            local_step(m, lo, x, y);
            int64_t dt = bench_now_ns() - t0;
            if (i >= (r == 0 ? 10 : 0))
                fl[k++] = dt;
            sr_tensor_unref(x);
            sr_tensor_unref(y);
        }
        bench_lat floor = bench_lat_of(fl, (size_t)k);
        int64_t c0 = bench_now_ns(), m0 = done;
        for (; done < end; done++) {
            sr_tensor *x, *y;
            make_batch(t, done, &x, &y);
            int64_t t0 = bench_now_ns();
            sh->last_loss[t->rank] = dist_step(t, x, y);
            all[done] = lat[done - m0] = bench_now_ns() - t0;
            sr_tensor_unref(x);
            sr_tensor_unref(y);
        }
        train_ns += bench_now_ns() - c0;
        bench_rounds_add(&sh->rounds, bench_lat_of(lat, (size_t)(done - m0)), floor);
    }
    sh->train_s = (double)train_ns / 1e9;
    phases_print("distributed, 1 trainer");
    sh->steps[t->rank] = n;
    sh->step_p50[t->rank] = bench_lat_of(all, (size_t)n).p50;
    sr_optim_destroy(lo);
    sr_module_destroy(m);
}

/* A share of the epoch, timed as a whole and step by step. */
static void epoch_share(struct trainer *t)
{
    static int64_t lat[MAX_STEPS];
    int64_t n = nsteps(t);
    sh->start_ns[t->rank] = bench_now_ns();
    for (int64_t s = 0; s < n; s++) {
        sr_tensor *x, *y;
        make_batch(t, s, &x, &y);
        int64_t t0 = bench_now_ns();
        sh->last_loss[t->rank] = dist_step(t, x, y);
        lat[s] = bench_now_ns() - t0;
        sr_tensor_unref(x);
        sr_tensor_unref(y);
    }
    sh->end_ns[t->rank] = bench_now_ns();
    if (t->rank == 1) {
        char who[96];
        snprintf(who, sizeof(who), "distributed, trainer 1 of %d, %s", t->ntrainers, mode_name[sh->mode]);
        phases_print(who);
    }
    sh->steps[t->rank] = n;
    sh->step_p50[t->rank] = bench_lat_of(lat, (size_t)n).p50;
}

static int run_trainer(int rank, int world)
{
    struct trainer t = {.rank = rank, .ntrainers = world - 1};
    int64_t total = sr_dataset_size(train_set);
    sr_generator g;
    sr_generator_init(&g, seed ^ 0x5eed);
    t.perm = malloc(sizeof(*t.perm) * (size_t)total);
    if (!t.perm || sr_generator_permutation(&g, total, t.perm))
        FAIL("permutation");
    t.first = (rank - 1) * total / t.ntrainers;
    t.count = rank * total / t.ntrainers - t.first;
    t.count = t.count < share_cap ? t.count : share_cap;
    bench_barrier_wait(&sh->all, (uint32_t)world, WAIT_NS);
    sr_value *pl = NULL;
    if (sr_rpc_sync(0, "ps.params", SR_NOARGS, 0, &pl) || sr_value_list_len(pl) != 4)
        FAIL("params");
    sr_rref *prefs[4];
    for (size_t i = 0; i < 4; i++)
        prefs[i] = sr_value_rref(sr_value_list_at(pl, i));
    sr_optim_opts oo;
    sr_optim_opts_default(SR_OPTIM_SGD, &oo);
    oo.lr = LR;
    if (sr_dist_optim_create(SR_OPTIM_SGD, &oo, prefs, 4, &t.opt))
        FAIL("DistributedOptimizer");
    bench_barrier_wait(&sh->trainers, (uint32_t)t.ntrainers, WAIT_NS); /* start together */
    double cpu0 = cpu_now();
    sr_debug_info d0, d1;
    sr_debug_info_get(&d0);
    if (t.ntrainers == 1)
        epoch_with_floor(&t);
    else
        epoch_share(&t);
    sh->cpu_s[rank] = cpu_now() - cpu0;
    sr_debug_info_get(&d1);
    debug_delta(&sh->dbg[rank], &d0, &d1);
    bench_barrier_wait(&sh->trainers, (uint32_t)t.ntrainers, WAIT_NS); /* all done */
    if (rank == 1 && sr_rpc_sync(0, "ps.done", SR_NOARGS, 0, NULL))
        FAIL("done");
    sr_dist_optim_destroy(t.opt);
    sr_value_unref(pl);
    free(t.perm);
    return 0;
}

static int job(int rank, int world, void *arg)
{
    (void)arg;
    sr_register("ps.forward", ps_forward);
    sr_register("ps.params", ps_params);
    sr_register("ps.forward_locked", ps_forward_locked);
    sr_register("ps.release", ps_release);
    sr_register("ps.done", ps_done_fn);
    /* An experiment knob: the trainers' spin budget alone (the server keeps
     * the default), e.g. BENCH_TRAIN_TRAINER_SPIN_NS=1000000. */
    const char *spin = getenv("BENCH_TRAIN_TRAINER_SPIN_NS");
    if (rank > 0 && spin && *spin)
        setenv("SHMRPC_SPIN_NS", spin, 1);
    if (sr_init(NULL))
        FAIL("sr_init");
    int rc = rank == 0 ? run_server(world) : run_trainer(rank, world);
    if (sr_shutdown(true, 120))
        FAIL("shutdown");
    if (rank == 0)
        sem_destroy(&ps_lock);
    return rc;
}

/* 0, or 1 with the failure in sh->error. */
static int run_job(int ntrainers, enum mode mode)
{
    memset(sh, 0, sizeof(*sh));
    sh->mode = mode;
    sr_spawn_opts o = {.name_prefix = "bench-train", .shm_size = (uint64_t)(ntrainers + 1) * (256u << 20)};
    int rc = sr_spawn(ntrainers + 1, job, NULL, &o);
    if (rc && !sh->error[0])
        snprintf(sh->error, sizeof(sh->error), "%s", sr_last_error());
    for (int r = 1; !rc && r <= ntrainers; r++)
        if (!isfinite(sh->last_loss[r]))
            rc = snprintf(sh->error, sizeof(sh->error), "trainer %d ended with loss %f", r, sh->last_loss[r]);
    return rc ? 1 : 0;
}

/* " | CPU: server 1.62 cores, trainers 0.31": CPU seconds over the epoch's
 * wall time, the server's and the trainers' together. */
static void cpu_note(char *buf, size_t n, int ntrainers, double wall_s)
{
    double tr = 0;
    for (int r = 1; r <= ntrainers; r++)
        tr += sh->cpu_s[r];
    snprintf(buf, n, " | CPU: server %.2f cores, trainers %.2f", sh->cpu_s[0] / wall_s, tr / wall_s);
}

/* The samples one epoch of ntrainers trains on: the whole set, or their
 * shares as --smoke cut them. */
static double epoch_samples(int ntrainers)
{
    int64_t n = sr_dataset_size(train_set);
    return share_cap < n / ntrainers ? (double)share_cap * ntrainers : (double)n;
}

/* samples/s of a multi-trainer job, its slowest trainer's step p50 */
static double job_sps(int ntrainers, int64_t *p50)
{
    int64_t t0 = INT64_MAX, t1 = 0;
    *p50 = 0;
    for (int r = 1; r <= ntrainers; r++) {
        t0 = sh->start_ns[r] < t0 ? sh->start_ns[r] : t0;
        t1 = sh->end_ns[r] > t1 ? sh->end_ns[r] : t1;
        *p50 = sh->step_p50[r] > *p50 ? sh->step_p50[r] : *p50;
    }
    return epoch_samples(ntrainers) / ((double)(t1 - t0) / 1e9);
}

/* ---- PyTorch: bench/compare/torch_ps_fashion.py, run after ours ---- */

struct torch_line {
    bool ok;
    double step_ms, sps, acc;
};
struct torch_res {
    bool ran;
    char version[64]; /* from the script's "# PyTorch VERSION ..." line */
    double local_ms;
    struct torch_line one, ser;
    char why[256];
};

static double field(const char *line, const char *key)
{
    const char *p = strstr(line, key);
    return p ? strtod(p + strlen(key), NULL) : NAN;
}

static void run_torch(struct torch_res *tr)
{
    char cmd[512];
    const char *py = getenv("BENCH_TRAIN_PYTHON"); /* Debian's python3 has python3-torch */
    py = py && *py ? py : "/usr/bin/python3";
    snprintf(cmd, sizeof(cmd), "%s %s --seed %llu 2>&1", py, TORCH_PS_SCRIPT, (unsigned long long)seed);
    FILE *f = popen(cmd, "r");
    if (!f) {
        snprintf(tr->why, sizeof(tr->why), "cannot run %s: %s", py, strerror(errno));
        return;
    }
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        struct torch_line *t = NULL;
        if (!strncmp(line, "torch_local ", 12))
            tr->local_ms = field(line, "step_p50_ms=");
        else if (strstr(line, "torch_ps trainers=1 mode=single"))
            t = &tr->one;
        else if (strstr(line, "torch_ps trainers=3 mode=serialised"))
            t = &tr->ser;
        else if (line[0] != '#') {
            if (strstr(line, "python3-torch is not installed") || strstr(line, "No module named 'torch'"))
                snprintf(tr->why, sizeof(tr->why), "torch not installed (apt-get install python3-torch)");
            else if (strstr(line, "Error"))
                snprintf(tr->why, sizeof(tr->why), "%.200s", line);
            continue;
        } else if (!strncmp(line, "# PyTorch ", 10)) {
            sscanf(line + 10, "%63s", tr->version);
        }
        printf("%s\n", line);
        fflush(stdout);
        if (t) {
            t->step_ms = field(line, "step_p50_ms=");
            t->sps = field(line, "samples_per_s=");
            t->acc = field(line, "test_acc=");
            t->ok = isfinite(t->step_ms) && isfinite(t->sps) && isfinite(t->acc);
        }
    }
    int st = pclose(f);
    tr->ran = tr->one.ok || tr->ser.ok;
    if (!tr->ran && !tr->why[0])
        snprintf(tr->why, sizeof(tr->why), "%s exited with status %d", TORCH_PS_SCRIPT, st);
}

static const char *verdict(bool met) { return bench_verdict(met); }

/* One JSON object (--json) for a line of the summary. */
static void rec_train(const char *name, const char *config, double step_p50_ns, double ratio, double target,
                      bool met, double sps, double acc)
{
    bench_rec r;
    bench_rec_begin(&r, name);
    bench_rec_str(&r, "config", config);
    bench_rec_num(&r, "step_p50_ns", step_p50_ns);
    bench_rec_num(&r, "ratio", ratio);
    if (target > 0) {
        bench_rec_num(&r, "target_ratio", target);
        bench_rec_bool(&r, "target_met", met);
    }
    bench_rec_num(&r, "samples_per_s", sps);
    bench_rec_num(&r, "test_acc", acc);
    bench_rec_emit(&r);
}

int main(int argc, char **argv)
{
    bench_cli cli = {.prog = "bench_train", .flags = {"--no-torch"}, .opts = {"--seed"},
                     .usage = "  --no-torch  skip PyTorch (bench/compare/torch_ps_fashion.py, run after ours)\n"
                              "  --seed S    the data order and initial weights (default 1)",
                     .smoke_what = "6 batches per trainer, 1 round"};
    bench_cli_parse(&cli, argc, argv);
    bool torch = !cli.flag[0] && !cli.smoke;
    if (cli.smoke)
        rounds = 2, floor_steps = 3, pairs = 1, share_cap = 6 * BATCH;
    if (cli.opt[0])
        seed = (uint64_t)bench_cli_int(&cli, "--seed", cli.opt[0], 0, INT64_MAX);
    sh = bench_shared_alloc(sizeof(*sh));
    if (!sh)
        return 1;
    phases_on = getenv("BENCH_TRAIN_PHASES") != NULL;
    if (sr_fashion_mnist_load(NULL, true, &train_set) || sr_fashion_mnist_load(NULL, false, &test_set)) {
        printf("bench_train: skipped, no Fashion-MNIST: %s (Debian package dataset-fashion-mnist)\n", sr_last_error());
        return 0;
    }
    double load[1] = {NAN};
    getloadavg(load, 1);
    printf("# bench_train: parameter server + trainers, MLP 784-%d-10, batch %d, SGD lr %.2f, one epoch of "
           "Fashion-MNIST (%lld images), seed %llu; matmul %s; %ld CPUs online, load average %.1f\n",
           HIDDEN, BATCH, LR, (long long)sr_dataset_size(train_set), (unsigned long long)seed, sr_matmul_backend(),
           sysconf(_SC_NPROCESSORS_ONLN), load[0]);
    fflush(stdout);

    /* PAIRS rounds of (1 trainer with the floor, 3 concurrent trainers):
     * the machine is shared, so the 3-trainer figure is compared with the
     * 1-trainer one measured just before it, and the verdicts use the
     * medians of the per-round ratios. */
    double r_floor[PAIRS], r_scale[PAIRS], p50s1[PAIRS], sps1s[PAIRS], sps3s_[PAIRS], fl50[PAIRS];
    double acc1 = NAN, acc3 = NAN, loss1 = NAN;
    int failed = 0, n3 = 0;
    char first_error[sizeof(sh->error)] = "", cpu3[96] = "";
    int64_t p50_3 = 0;
    for (int r = 0; r < pairs; r++) {
        if (run_job(1, FREE)) {
            printf("train 1 trainer  | FAILED: %s\n", sh->error);
            return 1;
        }
        bench_summary s = bench_summarize(&sh->rounds);
        r_floor[r] = s.ratio50;
        fl50[r] = s.floor50;
        p50s1[r] = (double)sh->step_p50[1];
        sps1s[r] = epoch_samples(1) / sh->train_s;
        acc1 = sh->acc;
        loss1 = sh->last_loss[1];
        printf("  round %d: 1 trainer  | step p50 %.0f us p99 %.0f us | floor p50 %.0f us p99 %.0f us | ratio p50 %.2f | "
               "%.0f samples/s | CPU: server %.2f cores\n",
               r + 1, p50s1[r] / 1e3, s.ours99 / 1e3, s.floor50 / 1e3, s.floor99 / 1e3, s.ratio50, sps1s[r],
               sh->cpu_s[0] / sh->train_s);
        if (phases_on) {
            double n = (double)sh->steps[1];
            printf("# per step, 1 trainer: trainer sent %.1f received %.1f messages, woke others %.1f times, slept "
                   "%.1f times; server sent %.1f received %.1f, woke %.1f, slept %.1f\n",
                   (double)sh->dbg[1].messages_sent / n, (double)sh->dbg[1].messages_received / n,
                   (double)sh->dbg[1].wakes_issued / n, (double)sh->dbg[1].sleeps_taken / n,
                   (double)sh->dbg[0].messages_sent / n, (double)sh->dbg[0].messages_received / n,
                   (double)sh->dbg[0].wakes_issued / n, (double)sh->dbg[0].sleeps_taken / n);
        }
        fflush(stdout);
        /* A failed run is reported and tried again, up to CONCURRENT_TRIES
         * times (before sr_linear read its parameters through a snapshot,
         * about half of these runs ended in a NaN loss). */
        bool ok = false;
        for (int i = 0; i < CONCURRENT_TRIES && !ok; i++) {
            ok = !run_job(MAX_TRAINERS, FREE);
            if (!ok) {
                printf("  round %d: 3 trainers | FAILED: %s\n", r + 1, sh->error);
                if (!failed++)
                    snprintf(first_error, sizeof(first_error), "%s", sh->error);
            }
        }
        if (!ok) {
            r_scale[r] = 0;
            continue;
        }
        double sps = job_sps(MAX_TRAINERS, &p50_3);
        sps3s_[n3++] = sps;
        r_scale[r] = sps / sps1s[r];
        acc3 = sh->acc;
        cpu_note(cpu3, sizeof(cpu3), MAX_TRAINERS, epoch_samples(MAX_TRAINERS) / sps);
        printf("  round %d: 3 trainers | step p50 %.0f us (slowest trainer) | %.0f samples/s = %.2fx the 1 trainer "
               "before%s\n",
               r + 1, (double)p50_3 / 1e3, sps, r_scale[r], cpu3);
        fflush(stdout);
    }
    double ratio1 = bench_median(r_floor, (size_t)pairs), p50_1 = bench_median(p50s1, (size_t)pairs);
    double floor50 = bench_median(fl50, (size_t)pairs), sps1 = bench_median(sps1s, (size_t)pairs);
    double scale = bench_median(r_scale, (size_t)pairs), sps3 = n3 ? bench_median(sps3s_, (size_t)n3) : NAN;
    printf("train 1 trainer  | step p50 %.0f us | floor local fwd+bwd+SGD, no RPC: p50 %.0f us | ratio p50 %.2f "
           "(median of %d rounds) | target p50 <= 1.3x %s | %.0f samples/s | test acc %.2f %% | loss %.3f\n",
           p50_1 / 1e3, floor50 / 1e3, ratio1, pairs, verdict(ratio1 <= 1.3), sps1, acc1 * 100, loss1);
    rec_train("train 1 trainer", "step vs floor local fwd+bwd+SGD, no RPC", p50_1, ratio1, 1.3, ratio1 <= 1.3, sps1,
              acc1);
    rec_train("train 3 trainers", "concurrent, no lock; ratio: samples/s vs 1 trainer", (double)p50_3, scale, 1.5,
              scale >= 1.5, sps3, acc3);
    if (n3)
        printf("train 3 trainers | concurrent, no lock | %.0f samples/s = %.2fx 1 trainer (median of per-round ratios) | "
               "target >= 1.5x %s | test acc %.2f %%%s%s\n",
               sps3, scale, verdict(scale >= 1.5), acc3 * 100, failed ? " | failed runs: " : "",
               failed ? first_error : "");
    else
        printf("train 3 trainers | concurrent, no lock | FAILED in every run: %s | target >= 1.5x NOT met\n",
               first_error);
    fflush(stdout);

    /* 3 trainers serialised by a lock on the server: PyTorch's form, for reference */
    int64_t p50_3s = 0;
    double sps3s = NAN, acc3s = NAN;
    if (run_job(MAX_TRAINERS, SERIALISED)) {
        printf("train 3 trainers | serialised by a lock on the server | FAILED: %s\n", sh->error);
    } else {
        sps3s = job_sps(MAX_TRAINERS, &p50_3s);
        acc3s = sh->acc;
        char cpu[96];
        cpu_note(cpu, sizeof(cpu), MAX_TRAINERS, epoch_samples(MAX_TRAINERS) / sps3s);
        printf("train 3 trainers | serialised by a lock on the server (informational) | step p50 %.0f us | %.0f "
               "samples/s = %.2fx 1 trainer | test acc %.2f %%%s\n",
               (double)p50_3s / 1e3, sps3s, sps3s / sps1, acc3s * 100, cpu);
        rec_train("train 3 trainers serialised", "a lock on the server; ratio: samples/s vs 1 trainer", (double)p50_3s,
                  sps3s / sps1, 0, true, sps3s, acc3s);
    }
    fflush(stdout);

    struct torch_res tr = {0};
    if (torch)
        run_torch(&tr);
    else
        snprintf(tr.why, sizeof(tr.why), "%s", cli.smoke ? "--smoke" : "--no-torch");
    if (!tr.ran) {
        printf("PyTorch: not measured (%s); ours only\n", tr.why);
        bench_rec r;
        bench_rec_begin(&r, "train PyTorch");
        bench_rec_str(&r, "torch", tr.why);
        bench_rec_emit(&r);
        return 0;
    }
    {
        bench_rec r;
        bench_rec_begin(&r, "train PyTorch");
        bench_rec_str(&r, "torch_version", tr.version);
        bench_rec_num(&r, "local_step_p50_ns", tr.local_ms * 1e6);
        if (tr.one.ok) {
            bench_rec_num(&r, "one_trainer_step_p50_ns", tr.one.step_ms * 1e6);
            bench_rec_num(&r, "one_trainer_samples_per_s", tr.one.sps);
            bench_rec_num(&r, "one_trainer_test_acc", tr.one.acc);
        }
        if (tr.ser.ok) {
            bench_rec_num(&r, "three_serialised_samples_per_s", tr.ser.sps);
            bench_rec_num(&r, "three_serialised_test_acc", tr.ser.acc);
        }
        bench_rec_emit(&r);
    }
    printf("# side by side, this run      | shmrpc                  | PyTorch %s (TensorPipe)\n",
           tr.version[0] ? tr.version : "?");
    printf("local step, no RPC (floor)    | p50 %7.3f ms           | p50 %7.3f ms\n", floor50 / 1e6, tr.local_ms);
    if (tr.one.ok) {
        printf("1 trainer step                | p50 %7.3f ms           | p50 %7.3f ms  | %.1fx faster\n",
               p50_1 / 1e6, tr.one.step_ms, tr.one.step_ms * 1e6 / p50_1);
        printf("1 trainer throughput          | %7.0f samples/s       | %7.0f samples/s | %.1fx\n", sps1,
               tr.one.sps, sps1 / tr.one.sps);
        bool met_acc = fabs(acc1 - tr.one.acc) * 100 <= 1.0;
        printf("1 trainer test accuracy       | %6.2f %%                | %6.2f %%         | |diff| %.2f points, "
               "target <= 1 %s\n",
               acc1 * 100, tr.one.acc * 100, fabs(acc1 - tr.one.acc) * 100, verdict(met_acc));
    }
    if (tr.ser.ok) {
        printf("3 trainers throughput         | %7.0f samples/s concurrent, %.0f serialised | %7.0f samples/s "
               "serialised (concurrent fails) | %.1fx\n",
               sps3, sps3s, tr.ser.sps, sps3 / tr.ser.sps);
        printf("3 trainers test accuracy      | %6.2f %% concurrent, %.2f %% serialised | %6.2f %% serialised\n",
               acc3 * 100, acc3s * 100, tr.ser.acc * 100);
    }
    return 0;
}
