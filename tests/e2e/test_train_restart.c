/* SPDX-License-Identifier: MIT */
/* The training demo (bench/demo_train) under the real shmrun --max-restarts
 * (SHMRUN, DEMO_TRAIN), losing workers to SIGKILL: seeded trials
 * (SHMRPC_RESTART_TRIALS, default 2 (1 under ASan): seed 1 kills a trainer then the server,
 * seed 2 the server twice; SHMRPC_RESTART_SEED, the first seed),
 * each killing one or two random ranks — the parameter server included —
 * each after a random number of the demo's checkpoints. The job restarts
 * by itself, resumes from its checkpoint without --resume, and ends:
 *   - exit 0, one "restarting the job" line per kill naming the rank and pid;
 *   - the final parameters equal, bit for bit, those of an uninterrupted run
 *     (one trainer: the order of updates is deterministic, as in
 *     test_train_resume.c);
 *   - no process of the job, no segment, and nothing in the checkpoint
 *     directory but the checkpoint and the parameter dump (no temporary
 *     file of a save the kill interrupted).
 * And the same demo under shmrun --restart rank (killed_ranks_are_replaced...):
 * one server and three trainers, random ranks killed after random
 * checkpoints and replaced in place, the run ending with the test accuracy
 * of an uninterrupted one within 1 point.
 * Nothing sleeps: kills follow the "checkpoint: step N saved" lines, read
 * through a pipe; the end is end-of-file of the pipes every worker holds and
 * shmrun's pidfd, each wait bounded. Reads the real Fashion-MNIST (skipped
 * without the package).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "helpers/piped_job.h"
#include "helpers/watch.h"
#include "shmrpc/checkpoint.h"
#include "shmrpc/data.h"

LEAK_CHECKED_SUITE(train_restart);

/* 6 checkpoints (every 40 of 240 steps): kills follow one of the first 4. */
#define STEPS "240"
#define SAVE_EVERY "40"
#define RECIPE "--limit-batches", STEPS, "--seed", "7", "--momentum", "0.9"
#define MAX_KILLS 2
/* Under ASan a trial takes four times as long: one trial of each kind there
 * (the plain build runs more), to keep ./dev test within its time. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

static const char *env_path(const char *var)
{
    const char *p = getenv(var);
    cr_assert(p && *p, "%s is not set: run this test through meson", var);
    return p;
}

static long env_long(const char *name, long def)
{
    const char *s = getenv(name);
    return s && *s ? atol(s) : def;
}

static void start_with(struct piped_job *j, const char *name, const char *dir, char **shmrun_args, char **recipe,
                       char **args);

/* shmrun -n 2 --name-prefix NS --max-restarts 3 -- demo_train --plot DIR/NAME.svg RECIPE args... */
static void start(struct piped_job *j, const char *name, const char *dir, char **args)
{
    start_with(j, name, dir, (char *[]){"-n", "2", "--max-restarts", "3", NULL},
               (char *[]){RECIPE, NULL}, args);
}

/* shmrun SHMRUN_ARGS --name-prefix NS -- demo_train --plot DIR/NAME.svg RECIPE args... */
static void start_with(struct piped_job *j, const char *name, const char *dir, char **shmrun_args, char **recipe,
                       char **args)
{
    snprintf(j->ns, sizeof(j->ns), "%s", test_ns(name));
    static char plot[512];
    snprintf(plot, sizeof(plot), "%s/%s.svg", dir, name);
    char *argv[40] = {(char *)env_path("SHMRUN"), "--name-prefix", j->ns};
    int n = 3;
    for (int i = 0; shmrun_args[i]; i++)
        argv[n++] = shmrun_args[i];
    argv[n++] = "--";
    argv[n++] = (char *)env_path("DEMO_TRAIN");
    argv[n++] = "--plot";
    argv[n++] = plot;
    for (int i = 0; recipe[i]; i++)
        argv[n++] = recipe[i];
    for (int i = 0; args[i]; i++) {
        cr_assert_lt(n, 39, "too many arguments");
        argv[n++] = args[i];
    }
    piped_job_start(j, argv, false);
}

static int want_saves;
static int count(const char *s, const char *what)
{
    int n = 0;
    for (; (s = strstr(s, what)); s += strlen(what))
        n++;
    return n;
}
static bool saves_seen(struct piped_job *j) { return count(j->out, "checkpoint: step ") >= want_saves || j->out_eof; }

/* The pid of shmrun's child that runs `rank` of the current attempt (its
 * exec'd environment says so); 0 if none. */
static pid_t rank_pid(pid_t shmrun, int rank)
{
    char path[64], kids[512], want[32];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)shmrun, (int)shmrun);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(kids, 1, sizeof(kids) - 1, f) : 0;
    if (f)
        fclose(f);
    kids[n] = 0;
    snprintf(want, sizeof(want), "SHMRPC_RANK=%d", rank);
    for (char *save = NULL, *t = strtok_r(kids, " \n", &save); t; t = strtok_r(NULL, " \n", &save)) {
        char env[8192];
        snprintf(path, sizeof(path), "/proc/%s/environ", t);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t len = fd >= 0 ? read(fd, env, sizeof(env) - 1) : -1;
        if (fd >= 0)
            close(fd);
        for (ssize_t i = 0; i < len; i += (ssize_t)strlen(env + i) + 1) {
            env[len] = 0;
            if (!strcmp(env + i, want))
                return (pid_t)atoi(t);
        }
    }
    return 0;
}

/* rank_pid, waiting until that process has exec'd: a rank shmrun has
 * forked (a replacement, or a restarted attempt's) shows shmrun's own
 * environment until then. No event says so: look again after each pump of
 * the job's pipes, at most 1 ms each, within WATCH_WAIT_MS. */
static pid_t rank_pid_wait(struct piped_job *j, int rank)
{
    int64_t deadline = watch_now_ms() + WATCH_WAIT_MS;
    pid_t pid;
    while (!(pid = rank_pid(j->pid, rank)) && watch_now_ms() < deadline && !j->out_eof)
        piped_job_pump(j, 1);
    return pid;
}

static int finish(struct piped_job *j)
{
    cr_assert(piped_job_pump_until(j, piped_job_closed, 6 * WATCH_WAIT_MS),
              "the job (shmrun pid %d) still holds its pipes after %d ms; stderr:\n%s",
              j->pid, 6 * WATCH_WAIT_MS, j->err);
    int st;
    cr_assert_eq(waitpid(j->pid, &st, 0), j->pid, "waitpid(shmrun): %s", strerror(errno));
    close(j->out_fd), close(j->err_fd), close(j->pidfd);
    return st;
}

static void assert_same_params(const char *a, const char *b, uint32_t seed)
{
    sr_checkpoint *ca, *cb;
    cr_assert_eq(sr_checkpoint_load(a, &ca), 0, "%s", sr_last_error());
    cr_assert_eq(sr_checkpoint_load(b, &cb), 0, "%s", sr_last_error());
    cr_assert_eq(sr_checkpoint_count(ca), sr_checkpoint_count(cb));
    for (size_t i = 0; i < sr_checkpoint_count(ca); i++) {
        const char *name = sr_checkpoint_name(ca, i);
        sr_tensor *x = sr_checkpoint_tensor(ca, name), *y = sr_checkpoint_tensor(cb, name);
        cr_assert(x && y, "'%s' is missing: %s", name, sr_last_error());
        size_t n = sr_tensor_numel(x);
        cr_assert_eq(n, sr_tensor_numel(y));
        const float *px = sr_tensor_data(x), *py = sr_tensor_data(y);
        for (size_t k = 0; k < n; k++)
            cr_assert(!memcmp(&px[k], &py[k], sizeof(float)), "seed %u: '%s'[%zu]: %.9g uninterrupted, %.9g restarted",
                      seed, name, k, (double)px[k], (double)py[k]);
    }
    sr_checkpoint_destroy(ca);
    sr_checkpoint_destroy(cb);
}

/* Names in dir, sorted, joined with spaces. */
static const char *listing(const char *dir)
{
    static char buf[1024];
    struct dirent **list;
    int n = scandir(dir, &list, NULL, alphasort);
    cr_assert(n >= 0);
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        if (list[i]->d_name[0] != '.')
            snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "%s%s", buf[0] ? " " : "", list[i]->d_name);
        free(list[i]);
    }
    free(list);
    return buf;
}

static void remove_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

static uint32_t next(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* The seed's kills: `kills` random ranks of `world`, the k-th after one of
 * the first saves, later than the last kill's; then the job's end, which
 * must be exit 0. */
static void kill_and_finish(struct piped_job *j, uint32_t seed, uint32_t *rng, int kills, int world, int *rank,
                            pid_t *victim)
{
    int after = 0;
    for (int k = 0; k < kills; k++) {
        rank[k] = (int)(next(rng) % (uint32_t)world);
        after += 1 + (int)(next(rng) % 2);
        want_saves = after;
        cr_assert(piped_job_pump_until(j, saves_seen, 6 * WATCH_WAIT_MS) && !j->out_eof,
                  "seed %u: %d checkpoints never came; stdout:\n%s\nstderr:\n%s",
                  seed, after, j->out, j->err);
        victim[k] = rank_pid_wait(j, rank[k]);
        cr_assert_neq(victim[k], 0, "seed %u: no process of rank %d under shmrun within %d ms", seed, rank[k],
                      WATCH_WAIT_MS);
        cr_assert_eq(kill(victim[k], SIGKILL), 0, "kill: %s", strerror(errno));
    }
    int st = finish(j);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "seed %u: shmrun wait status 0x%x; stdout:\n%s\nstderr:\n%s", seed,
              st, j->out, j->err);
}

static void run_trial(uint32_t seed, const char *ref)
{
    char dir[] = "/tmp/sr-train-restart-XXXXXX", dump[600], name[32];
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    snprintf(dump, sizeof(dump), "%s/restarted.params", dir);
    snprintf(name, sizeof(name), "rs%u", seed);
    uint32_t rng = seed;
    int kills = 1 + (int)(next(&rng) % MAX_KILLS), rank[MAX_KILLS];
    pid_t victim[MAX_KILLS];
    struct piped_job j;
    start(&j, name, dir, (char *[]){"--checkpoint-dir", dir, "--save-every", SAVE_EVERY, "--dump-params", dump, NULL});
    kill_and_finish(&j, seed, &rng, kills, 2, rank, victim);
    char line[200];
    for (int k = 0; k < kills; k++) {
        snprintf(line, sizeof(line),
                 "shmrun: rank %d (pid %d) was killed by signal SIGKILL; restarting the job (restart %d of 3)\n",
                 rank[k], (int)victim[k], k + 1);
        cr_assert(strstr(j.err, line), "seed %u: no line '%s' in stderr:\n%s", seed, line, j.err);
    }
    cr_assert_eq(count(j.err, "restarting the job"), kills, "seed %u: stderr:\n%s", seed, j.err);
    cr_assert_eq(count(j.out, "resumed from"), kills, "seed %u: each restart resumes; stdout:\n%s", seed, j.out);
    assert_same_params(ref, dump, seed);
    assert_segment_gone(j.ns);
    for (int k = 0; k < kills; k++)
        cr_assert(kill(victim[k], 0) == -1 && errno == ESRCH, "seed %u: pid %d still exists", seed, (int)victim[k]);
    /* PR_SET_CHILD_SUBREAPER: every process of the job came back to us. */
    cr_assert(waitpid(-1, NULL, WNOHANG) == -1 && errno == ECHILD, "seed %u: a process of the job is left", seed);
    snprintf(line, sizeof(line), "restarted.params %s.svg train.ckpt", name); /* sorted: "re" < "rs" */
    const char *left = listing(dir);
    cr_assert_str_eq(left, line, "seed %u: the checkpoint directory holds '%s', not '%s'", seed, left, line);
    remove_dir(dir);
}

Test(train_restart, killed_ranks_restart_the_job_which_ends_as_an_uninterrupted_run, .timeout = 600)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/train-images-idx3-ubyte.gz", SR_FASHION_MNIST_DIR);
    if (access(path, R_OK))
        cr_skip_test("dataset-fashion-mnist is not installed (%s)", path);
    cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0, "PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
    char dir[] = "/tmp/sr-train-restart-ref-XXXXXX", ref[600];
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    snprintf(ref, sizeof(ref), "%s/uninterrupted.params", dir);
    struct piped_job j;
    start(&j, "rsref", dir, (char *[]){"--dump-params", ref, NULL});
    int st = finish(&j);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "reference run: wait status 0x%x; stderr:\n%s", st, j.err);
    long trials = env_long("SHMRPC_RESTART_TRIALS", SANITIZED ? 1 : 2);
    uint32_t first = (uint32_t)env_long("SHMRPC_RESTART_SEED", 1);
    for (long i = 0; i < trials; i++)
        run_trial(first + (uint32_t)i, ref);
    remove_dir(dir);
}

/* ---- replacement in place: --restart rank ---- */

/* One server and three trainers, 600 steps (three unserialised trainers
 * end 300 steps between 74 and 76 % here, 600 within half a point of 79.7 %),
 * a checkpoint every 25: kills follow one of the first 4 saves (or skipped
 * saves: one is skipped while a trainer is being replaced), by step 100.
 * A rank is replaced only outside sr_shutdown (docs/LAUNCHER.md), and a
 * trainer reaches it after its share, 200 steps: even one that took every
 * step since its start is 100 steps short of it when the kill is sent. (At
 * a save every 80 a kill could come at step 320, after a trainer whose
 * peers had been slowed finished its share: the job then ended, as the
 * policy says, and the test failed one run in 20 under load.) */
#define REPLACE_WORLD 4
#define REPLACE_RECIPE "--limit-batches", "600", "--seed", "7"
#define REPLACE_SAVE_EVERY "25"

static double accuracy(const struct piped_job *j)
{
    const char *p = strstr(j->out, "test accuracy: ");
    return p ? atof(p + strlen("test accuracy: ")) : -1.0;
}

static void run_replace_trial(uint32_t seed, double ref)
{
    char dir[] = "/tmp/sr-train-replace-XXXXXX", name[32];
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    snprintf(name, sizeof(name), "rp%u", seed);
    uint32_t rng = seed;
    int kills = 1 + (int)(next(&rng) % MAX_KILLS), rank[MAX_KILLS];
    pid_t victim[MAX_KILLS];
    struct piped_job j;
    start_with(&j, name, dir, (char *[]){"-n", "4", "--max-restarts", "3", "--restart", "rank", NULL},
               (char *[]){REPLACE_RECIPE, NULL}, (char *[]){"--checkpoint-dir", dir, "--save-every", REPLACE_SAVE_EVERY, NULL});
    kill_and_finish(&j, seed, &rng, kills, REPLACE_WORLD, rank, victim);
    char line[200];
    for (int k = 0; k < kills; k++) {
        snprintf(line, sizeof(line), "rank %d (pid %d) was killed by signal SIGKILL; replaced by pid", rank[k],
                 (int)victim[k]);
        cr_assert(strstr(j.err, line), "seed %u: no line '%s' in stderr:\n%s", seed, line, j.err);
    }
    cr_assert_eq(count(j.err, "replaced by pid"), kills, "seed %u: stderr:\n%s", seed, j.err);
    double acc = accuracy(&j);
    /* One-sided: a replacement must not cost accuracy. The reference is one
     * run of three unserialised trainers, whose accuracy moves with how
     * their steps interleave (78.3 % once under load, against 79.7 % most
     * runs): a replaced run above it by more than a point is no failure. */
    cr_assert(acc >= 0 && acc >= ref - 1.0, "seed %u: test accuracy %.2f %%, uninterrupted %.2f %%; stdout:\n%s",
              seed, acc, ref, j.out);
    assert_segment_gone(j.ns);
    for (int k = 0; k < kills; k++)
        cr_assert(kill(victim[k], 0) == -1 && errno == ESRCH, "seed %u: pid %d still exists", seed, (int)victim[k]);
    cr_assert(waitpid(-1, NULL, WNOHANG) == -1 && errno == ECHILD, "seed %u: a process of the job is left", seed);
    snprintf(line, sizeof(line), "%s.svg train.ckpt", name);
    const char *left = listing(dir);
    cr_assert_str_eq(left, line, "seed %u: the checkpoint directory holds '%s', not '%s'", seed, left, line);
    remove_dir(dir);
}

/* Seeded trials (SHMRPC_REPLACE_TRIALS, default 3, 1 under ASan; SHMRPC_REPLACE_SEED the
 * first seed), each SIGKILLing one or two random ranks, the server
 * included, after a random checkpoint: the ranks are replaced in place (a
 * trainer fetches the parameters and its step from the server, a server
 * resumes from its checkpoint and the trainers join it again), and the run
 * ends with the test accuracy of an uninterrupted run, or better, less 1
 * point at most. */
Test(train_restart, killed_ranks_are_replaced_and_the_run_ends_as_accurate, .timeout = 600)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/train-images-idx3-ubyte.gz", SR_FASHION_MNIST_DIR);
    if (access(path, R_OK))
        cr_skip_test("dataset-fashion-mnist is not installed (%s)", path);
    cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0, "PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
    char dir[] = "/tmp/sr-train-replace-ref-XXXXXX";
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    struct piped_job j;
    start_with(&j, "rpref", dir, (char *[]){"-n", "4", NULL}, (char *[]){REPLACE_RECIPE, NULL}, (char *[]){NULL});
    int st = finish(&j);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "reference run: wait status 0x%x; stderr:\n%s", st, j.err);
    double ref = accuracy(&j);
    cr_assert(ref > 0, "reference run: no accuracy; stdout:\n%s", j.out);
    remove_dir(dir);
    long trials = env_long("SHMRPC_REPLACE_TRIALS", SANITIZED ? 1 : 3);
    uint32_t first = (uint32_t)env_long("SHMRPC_REPLACE_SEED", 1);
    for (long i = 0; i < trials; i++)
        run_replace_trial(first + (uint32_t)i, ref);
}
