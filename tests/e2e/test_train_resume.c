/* SPDX-License-Identifier: MIT */
/* The training demo, bench/demo_train, under the real shmrun (SHMRUN,
 * DEMO_TRAIN).
 *
 * It survives a crash: run with one trainer, it is killed with SIGKILL —
 * the whole job, every process at once — after it saved a checkpoint, then
 * run again with --resume to the end. Its final parameters must equal, bit
 * for bit, those of an uninterrupted run with the same seed. One trainer
 * makes the order of the updates deterministic; SGD with momentum makes the
 * optimizer state matter.
 *
 * And it does what ./dev demo promises: 3 concurrent trainers, one epoch,
 * about 81 % test accuracy (as PyTorch's same setup), at least 77 %. The
 * trainers are not serialised, so the order of the last updates, and with
 * it the accuracy, moves with the scheduling: 144 runs on two cores (the
 * demo before and after its server served its calls itself) read 79.9-81.5 %
 * quiet, 78.1-81.5 % beside a busy loop (the demo before: 79.8 % at worst);
 * a bound of 80 % failed in CI at 79.83 %. A training that does not learn
 * ends far below 77 %.
 *
 * Nothing sleeps: the test waits for the checkpoint as an event (the demo's
 * "checkpoint: step N saved" line, read through a pipe), and for the job's
 * end on a pidfd and on end-of-file of the pipes every worker holds, each
 * wait bounded. Reads the real Fashion-MNIST (skipped without the package).
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "helpers/piped_job.h"
#include "helpers/watch.h"
#include "shmrpc/checkpoint.h"
#include "shmrpc/data.h"

LEAK_CHECKED_SUITE(train_resume);

#define STEPS "240"
#define SAVE_EVERY "40"
/* The short run of the resume test: one trainer, momentum for a state. */
#define RECIPE "--limit-batches", STEPS, "--seed", "7", "--momentum", "0.9"

static void skip_without_data(void)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/train-images-idx3-ubyte.gz", SR_FASHION_MNIST_DIR);
    if (access(path, R_OK))
        cr_skip_test("dataset-fashion-mnist is not installed (%s)", path);
}

/* shmrun -n WORLD --name-prefix NS -- demo_train --plot DIR/NAME.svg args... */
static void start(struct piped_job *j, const char *name, const char *dir, const char *world, char **args)
{
    static char plot[512];
    snprintf(plot, sizeof(plot), "%s/%s.svg", dir, name);
    char *head[] = {"--plot", plot, NULL};
    piped_job_shmrun(j, name, world, "DEMO_TRAIN", head, args);
}

static bool saved_once(struct piped_job *j) { return strstr(j->out, "checkpoint: step ") || j->out_eof; }

static void run_to_end(struct piped_job *j, const char *name, const char *dir, const char *world, char **args)
{
    start(j, name, dir, world, args);
    piped_job_expect_success(j, name);
}

/* No process of the process group pgid is left (a zombie counts). */
static void assert_group_gone(pid_t pgid)
{
    DIR *d = opendir("/proc");
    cr_assert(d, "cannot list /proc");
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[300], line[1024];
        snprintf(path, sizeof(path), "/proc/%.20s/stat", e->d_name);
        FILE *f = e->d_name[0] >= '0' && e->d_name[0] <= '9' ? fopen(path, "r") : NULL;
        if (!f)
            continue;
        int pgrp = 0;
        const char *rp = fgets(line, sizeof(line), f) ? strrchr(line, ')') : NULL;
        fclose(f);
        if (rp && sscanf(rp + 1, " %*c %*d %d", &pgrp) == 1)
            cr_assert_neq(pgrp, pgid, "process %s of the killed job (group %d) is still there", e->d_name, pgid);
    }
    closedir(d);
}

static int64_t checkpoint_step(const char *path)
{
    sr_checkpoint *c;
    cr_assert_eq(sr_checkpoint_load(path, &c), 0, "%s", sr_last_error());
    int64_t step = -1;
    cr_assert_eq(sr_checkpoint_meta(c, "step", &step), 0, "%s", sr_last_error());
    sr_checkpoint_destroy(c);
    return step;
}

static void assert_same_params(const char *a, const char *b)
{
    sr_checkpoint *ca, *cb;
    cr_assert_eq(sr_checkpoint_load(a, &ca), 0, "%s", sr_last_error());
    cr_assert_eq(sr_checkpoint_load(b, &cb), 0, "%s", sr_last_error());
    cr_assert_eq(sr_checkpoint_count(ca), 4, "%s holds %zu tensors", a, sr_checkpoint_count(ca));
    cr_assert_eq(sr_checkpoint_count(cb), 4);
    for (size_t i = 0; i < 4; i++) {
        const char *name = sr_checkpoint_name(ca, i);
        sr_tensor *x = sr_checkpoint_tensor(ca, name), *y = sr_checkpoint_tensor(cb, name);
        cr_assert(x && y, "'%s' is missing: %s", name, sr_last_error());
        size_t n = sr_tensor_numel(x);
        cr_assert_eq(n, sr_tensor_numel(y), "'%s' has %zu and %zu elements", name, n, sr_tensor_numel(y));
        const float *px = sr_tensor_data(x), *py = sr_tensor_data(y);
        for (size_t k = 0; k < n; k++)
            cr_assert(!memcmp(&px[k], &py[k], sizeof(float)), "'%s'[%zu]: %.9g uninterrupted, %.9g resumed", name,
                      k, (double)px[k], (double)py[k]);
    }
    sr_checkpoint_destroy(ca);
    sr_checkpoint_destroy(cb);
}

static void remove_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(train_resume, sigkill_mid_training_then_resume_equals_an_uninterrupted_run, .timeout = 280)
{
    skip_without_data();
    /* Workers orphaned by the kill come to us, to be reaped and checked. */
    cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0, "PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
    char dir[] = "/tmp/sr-train-resume-XXXXXX", ref[600], resumed[600], ck[600];
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    snprintf(ref, sizeof(ref), "%s/uninterrupted.params", dir);
    snprintf(resumed, sizeof(resumed), "%s/resumed.params", dir);
    snprintf(ck, sizeof(ck), "%s/train.ckpt", dir);
    struct piped_job j;

    run_to_end(&j, "ref", dir, "2", (char *[]){RECIPE, "--dump-params", ref, NULL});

    /* Killed once the first checkpoint is on disk. */
    start(&j, "killed", dir, "2", (char *[]){RECIPE, "--checkpoint-dir", dir, "--save-every", SAVE_EVERY, NULL});
    cr_assert(piped_job_pump_until(&j, saved_once, 6 * WATCH_WAIT_MS) && !j.out_eof,
              "no checkpoint was saved; stdout:\n%s\nstderr:\n%s", j.out,
              j.err);
    cr_assert_eq(kill(-j.pid, SIGKILL), 0, "kill(job): %s", strerror(errno));
    int st = piped_job_finish(&j);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "shmrun wait status 0x%x", st);
    assert_group_gone(j.pid);
    assert_segment_gone(j.ns);
    int64_t at = checkpoint_step(ck);
    cr_assert(at >= 40 && at < 240, "the checkpoint is at step %lld: the job was not killed mid-training",
              (long long)at);

    run_to_end(&j, "resumed", dir, "2",
               (char *[]){RECIPE, "--checkpoint-dir", dir, "--save-every", SAVE_EVERY, "--resume", "--dump-params",
                          resumed, NULL});
    cr_assert(strstr(j.out, "resumed from"), "the second run did not resume; stdout:\n%s", j.out);
    cr_assert_eq(checkpoint_step(ck), 240, "the final checkpoint is not at the last step");
    assert_same_params(ref, resumed);
    remove_dir(dir);
}

/* ./dev demo's run: 1 server + 3 concurrent trainers, one epoch, defaults. */
Test(train_resume, the_demo_reaches_77_percent_in_one_epoch_with_3_trainers, .timeout = 280)
{
    skip_without_data();
    char dir[] = "/tmp/sr-train-demo-XXXXXX";
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    struct piped_job j;
    run_to_end(&j, "demo", dir, "4", (char *[]){NULL});
    const char *acc = strstr(j.out, "test accuracy: ");
    double pct = 0;
    cr_assert(acc && sscanf(acc, "test accuracy: %lf", &pct) == 1, "no accuracy line; stdout:\n%s", j.out);
    cr_assert_geq(pct, 77.0, "test accuracy %.2f %% after one epoch; stdout:\n%s", pct, j.out);
    cr_assert(strstr(j.out, "loss curve: "), "no loss curve; stdout:\n%s", j.out);
    remove_dir(dir);
}
