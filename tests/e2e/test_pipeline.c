/* SPDX-License-Identifier: MIT */
/* The pipeline-parallel demo, bench/demo_pipeline, under the real shmrun
 * (SHMRUN, DEMO_PIPELINE), on a short run (a few hundred samples):
 *
 * - what ./dev demo pipeline prints: the plan, progress lines, the test
 *   accuracy, the time with samples/s, the loss curve; and the loss goes
 *   down (read from the loss curve its final checkpoint holds);
 * - a run killed with SIGKILL once it saved a checkpoint, then resumed with
 *   --resume, ends with the parameters of an uninterrupted run: the stages
 *   sent their module state and Adam state, and loaded them back by name;
 * - with 4 stages, one of which (ReLU and pooling) has no parameters and so
 *   no optimizer, a run saves checkpoints and another resumes from them.
 *
 * Nothing sleeps: the kill waits for the demo's "checkpoint: step N saved"
 * line, and the job's end for a pidfd and end-of-file on its pipes, each
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

LEAK_CHECKED_SUITE(pipeline);

#define STEPS 12
/* 12 batches of 32 in 4 micro-batches through 2 stages. */
#define RECIPE "--limit-batches", "12", "--batch", "32", "--splits", "4", "--epochs", "1", "--seed", "5", \
               "--test-limit", "300", "--lr", "0.002"

static void skip_without_data(void)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/train-images-idx3-ubyte.gz", SR_FASHION_MNIST_DIR);
    if (access(path, R_OK))
        cr_skip_test("dataset-fashion-mnist is not installed (%s)", path);
}

/* shmrun -n N --name-prefix NS -- demo_pipeline --loss-curve DIR/NAME.svg
 * --checkpoint-dir DIR/CK opts... args... (opts, args: NULL-terminated) */
static void start_demo(struct piped_job *j, const char *name, const char *n, const char *dir, const char *ck_name,
                       char **opts, char **args)
{
    static char plot[512], ck[512];
    snprintf(plot, sizeof(plot), "%s/%s.svg", dir, name);
    snprintf(ck, sizeof(ck), "%s/%s", dir, ck_name);
    mkdir(ck, 0700);
    char *head[32] = {"--loss-curve", plot, "--checkpoint-dir", ck};
    size_t k = 4;
    for (; opts && *opts && k < 31; opts++)
        head[k++] = *opts;
    head[k] = NULL;
    piped_job_shmrun(j, name, n, "DEMO_PIPELINE", head, args);
}

/* 2 stages; the run "resumed" continues the checkpoints of "killed". */
static void start(struct piped_job *j, const char *name, const char *dir, char **args)
{
    start_demo(j, name, "3", dir, strcmp(name, "resumed") ? name : "killed", NULL, args);
}

static void run_to_end(struct piped_job *j, const char *name, const char *dir, char **args)
{
    start(j, name, dir, args);
    piped_job_expect_success(j, name);
}

static sr_checkpoint *load_ck(const char *dir, const char *name)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s/pipeline.ckpt", dir, name);
    sr_checkpoint *c = NULL;
    cr_assert_eq(sr_checkpoint_load(path, &c), 0, "%s", sr_last_error());
    return c;
}

static void remove_dir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(pipeline, prints_progress_accuracy_time_and_the_loss_goes_down, .timeout = 280)
{
    skip_without_data();
    char dir[] = "/tmp/sr-pipeline-XXXXXX", svg[600];
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    struct piped_job j;
    run_to_end(&j, "plain", dir, (char *[]){RECIPE, "--warmup", "2", NULL}); /* 12 steps trained, 10 timed */
    const char *want[] = {"pipeline: CNN (125450 parameters) in 2 stages on 2 workers, batch 32 in 4 micro-batches",
                          "  stage 1 on worker1: layers 0..3\n", "  stage 2 on worker2: layers 4..9\n",
                          "epoch 1/1   batch    12/12   loss ", "test accuracy: ", "(300 test images)\n",
                          " s training (10 steps, ", " samples/s)\n", "loss curve: "};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        cr_assert(strstr(j.out, want[i]), "no '%s' in stdout:\n%s", want[i], j.out);
    snprintf(svg, sizeof(svg), "%s/plain.svg", dir);
    struct stat sb;
    cr_assert(stat(svg, &sb) == 0 && sb.st_size > 0, "no loss curve at %s", svg);
    sr_checkpoint *c = load_ck(dir, "plain");
    sr_tensor *curve = sr_checkpoint_tensor(c, "loss_curve");
    cr_assert(curve, "%s", sr_last_error());
    double l[STEPS];
    cr_assert_eq(sr_tensor_numel(curve), STEPS);
    cr_assert_eq(sr_tensor_to_f64(curve, l, STEPS), 0);
    double first = (l[0] + l[1] + l[2]) / 3, last = (l[STEPS - 3] + l[STEPS - 2] + l[STEPS - 1]) / 3;
    cr_assert_lt(last, 0.8 * first, "the loss did not go down: %.4f over the first 3 steps, %.4f over the last 3",
                 first, last);
    sr_checkpoint_destroy(c);
    remove_dir(dir);
}

static bool saved_once(struct piped_job *j) { return strstr(j->out, "checkpoint: step ") || j->out_eof; }

static void assert_same_params(sr_checkpoint *a, sr_checkpoint *b)
{
    size_t nparam = 0;
    for (size_t i = 0; i < sr_checkpoint_count(a); i++) {
        const char *name = sr_checkpoint_name(a, i);
        if (strncmp(name, "param.", 6))
            continue;
        nparam++;
        sr_tensor *x = sr_checkpoint_tensor(a, name), *y = sr_checkpoint_tensor(b, name);
        cr_assert(x && y, "'%s' is missing: %s", name, sr_last_error());
        size_t n = sr_tensor_numel(x);
        cr_assert_eq(n, sr_tensor_numel(y));
        const float *px = sr_tensor_data(x), *py = sr_tensor_data(y);
        for (size_t k = 0; k < n; k++)
            cr_assert(!memcmp(&px[k], &py[k], sizeof(float)), "'%s'[%zu]: %.9g uninterrupted, %.9g resumed", name,
                      k, (double)px[k], (double)py[k]);
    }
    cr_assert_eq(nparam, 10, "the checkpoint holds %zu parameters, the CNN has 10", nparam);
}

/* The losses of the first steps of a run's progress lines ("loss 2.1884",
 * one line per step of a short run without a terminal), into buf. */
static void first_losses(const char *out, int steps, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (const char *p = out; *p && steps > 0 && len < n;) {
        const char *e = strchr(p, '\n'), *l = strstr(p, "loss ");
        int ll = e ? (int)(e - p) : (int)strlen(p);
        if (!strncmp(p, "epoch ", 6) && l && l < p + ll)
            len += (size_t)snprintf(buf + len, n - len, "%.11s\n", l), steps--;
        p = e ? e + 1 : p + ll;
    }
}

/* demo_pipeline --local (the one-process baseline of pipeline_compare.sh)
 * trains the same model as the pipeline: with one micro-batch, the same
 * loss at each of its first LOCAL_STEPS steps as ref_out's run (a short
 * run, to keep this test's time). */
#define LOCAL_STEPS 4
#define LOCAL_STEPS_ARG "4" /* LOCAL_STEPS, as an argument */
static void assert_local_matches(const char *dir, const char *ref_out)
{
    static char want[1024], got[1024], plot[512];
    first_losses(ref_out, LOCAL_STEPS, want, sizeof(want));
    cr_assert_eq(strlen(want), LOCAL_STEPS * 12, "the pipeline's output has no losses:\n%s", ref_out);
    snprintf(plot, sizeof(plot), "%s/local.svg", dir);
    char *argv[] = {(char *)piped_job_env_path("DEMO_PIPELINE"), "--local", RECIPE, "--splits", "1",
                    "--limit-batches", LOCAL_STEPS_ARG, "--test-limit", "32", "--loss-curve", plot, NULL};
    struct piped_job j = {0};
    snprintf(j.ns, sizeof(j.ns), "%s", test_ns("local"));
    piped_job_start(&j, argv, true);
    int st = piped_job_finish(&j);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "--local: wait status 0x%x; stdout:\n%s\nstderr:\n%s", st,
              j.out, j.err);
    first_losses(j.out, LOCAL_STEPS, got, sizeof(got));
    cr_assert_str_eq(got, want, "--local trained otherwise than the 1-split pipeline");
}

Test(pipeline, sigkill_after_a_checkpoint_then_resume_equals_an_uninterrupted_run, .timeout = 280)
{
    skip_without_data();
    cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0, "PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
    char dir[] = "/tmp/sr-pipeline-resume-XXXXXX";
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    struct piped_job j;
    /* One micro-batch: each parameter's gradient is then one sum in a fixed
     * order. With several, a stage adds the micro-batches' gradients in the
     * order their backward messages arrive, so two runs differ in the last
     * bits, resumed or not. */
    run_to_end(&j, "ref", dir, (char *[]){RECIPE, "--splits", "1", NULL});
    assert_local_matches(dir, j.out);

    start(&j, "killed", dir, (char *[]){RECIPE, "--splits", "1", "--save-every", "4", NULL});
    cr_assert(piped_job_pump_until(&j, saved_once, 6 * WATCH_WAIT_MS) && !j.out_eof,
              "no checkpoint was saved; stdout:\n%s\nstderr:\n%s", j.out, j.err);
    cr_assert_eq(kill(-j.pid, SIGKILL), 0, "kill(job): %s", strerror(errno));
    int st = piped_job_finish(&j);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "shmrun wait status 0x%x", st);
    assert_segment_gone(j.ns);
    sr_checkpoint *mid = load_ck(dir, "killed");
    int64_t at = -1;
    cr_assert_eq(sr_checkpoint_meta(mid, "step", &at), 0);
    cr_assert(at >= 4 && at < STEPS, "the checkpoint is at step %lld: not mid-training", (long long)at);
    sr_checkpoint_destroy(mid);

    run_to_end(&j, "resumed", dir, (char *[]){RECIPE, "--splits", "1", "--save-every", "4", "--resume", NULL});
    cr_assert(strstr(j.out, "resumed from"), "the second run did not resume; stdout:\n%s", j.out);
    sr_checkpoint *a = load_ck(dir, "ref"), *b = load_ck(dir, "killed");
    int64_t end = -1;
    cr_assert_eq(sr_checkpoint_meta(b, "step", &end), 0);
    cr_assert_eq(end, STEPS, "the final checkpoint is not at the last step");
    assert_same_params(a, b);
    sr_checkpoint_destroy(a);
    sr_checkpoint_destroy(b);
    remove_dir(dir);
}

/* 4 stages: stage 2 holds layers 2..3 (ReLU, MaxPool2d), no parameters, so
 * the DistributedOptimizer has no optimizer on its worker. Saving and
 * resuming go through the stages with parameters only. Tiny: 2 batches of 8. */
#define TINY "--limit-batches", "2", "--batch", "8", "--splits", "2", "--seed", "5", "--test-limit", "10", \
             "--save-every", "1"

static void run_four_stages(struct piped_job *j, const char *name, const char *dir, char **args)
{
    start_demo(j, name, "5", dir, "ck", (char *[]){TINY, NULL}, args);
    piped_job_expect_success(j, name);
}

Test(pipeline, four_stages_one_without_parameters_save_and_resume, .timeout = 120)
{
    skip_without_data();
    char dir[] = "/tmp/sr-pipeline-four-XXXXXX";
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    struct piped_job j;
    run_four_stages(&j, "four", dir, (char *[]){"--epochs", "1", NULL});
    cr_assert(strstr(j.out, "  stage 2 on worker2: layers 2..3\n"), "stage 2 is not ReLU and pooling:\n%s", j.out);
    cr_assert(strstr(j.out, "checkpoint: step 2 saved"), "no checkpoint at step 2; stdout:\n%s", j.out);
    run_four_stages(&j, "four_resumed", dir, (char *[]){"--epochs", "2", "--resume", NULL});
    cr_assert(strstr(j.out, "resumed from"), "the second run did not resume; stdout:\n%s", j.out);
    sr_checkpoint *c = load_ck(dir, "ck");
    int64_t end = -1;
    cr_assert_eq(sr_checkpoint_meta(c, "step", &end), 0);
    cr_assert_eq(end, 4, "the resumed run's last checkpoint is at step %lld, not 4", (long long)end);
    assert_same_params(c, c); /* all 10 parameters are there */
    sr_checkpoint_destroy(c);
    remove_dir(dir);
}

/* 3 stages on 2 workers (--stages above shmrun's -n minus 1): worker 1
 * holds stages 1 and 3, whose forwards share its one thread and whose
 * parameters share its one Adam. One micro-batch, so that the runs are
 * bit for bit comparable: 4 steps straight, against 2 steps, a checkpoint
 * and 2 more resumed from it. The resumed run matches only if each stage
 * loaded its own layers and worker 1's optimizer state came back whole. */
static void run_three_on_two(struct piped_job *j, const char *name, const char *dir, char **args)
{
    char *opts[] = {"--stages", "3", "--limit-batches", "2", "--batch", "16", "--splits", "1", "--seed", "7",
                    "--test-limit", "10", NULL};
    start_demo(j, name, "3", dir, strcmp(name, "resumed") ? name : "cut", opts, args);
    piped_job_expect_success(j, name);
}

Test(pipeline, three_stages_on_two_workers_resume_equals_an_uninterrupted_run, .timeout = 120)
{
    skip_without_data();
    char dir[] = "/tmp/sr-pipeline-three-XXXXXX";
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    struct piped_job j;
    run_three_on_two(&j, "straight", dir, (char *[]){"--epochs", "2", NULL});
    const char *want[] = {"pipeline: CNN (125450 parameters) in 3 stages on 2 workers",
                          "  stage 1 on worker1: layers 0..3\n", "  stage 2 on worker2: layers 4..4\n",
                          "  stage 3 on worker1: layers 5..9\n"};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        cr_assert(strstr(j.out, want[i]), "no '%s' in stdout:\n%s", want[i], j.out);
    run_three_on_two(&j, "cut", dir, (char *[]){"--epochs", "1", NULL});
    run_three_on_two(&j, "resumed", dir, (char *[]){"--epochs", "2", "--resume", NULL});
    cr_assert(strstr(j.out, "resumed from"), "the third run did not resume; stdout:\n%s", j.out);
    sr_checkpoint *a = load_ck(dir, "straight"), *b = load_ck(dir, "cut");
    int64_t end = -1;
    cr_assert_eq(sr_checkpoint_meta(b, "step", &end), 0);
    cr_assert_eq(end, 4, "the resumed run's last checkpoint is at step %lld, not 4", (long long)end);
    assert_same_params(a, b);
    sr_checkpoint_destroy(a);
    sr_checkpoint_destroy(b);
    remove_dir(dir);
}
