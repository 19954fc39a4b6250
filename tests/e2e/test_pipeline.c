/* The pipeline-parallel demo, bench/demo_pipeline, under the real shmrun
 * (SHMRUN, DEMO_PIPELINE), on a short run (a few hundred samples):
 *
 * - what ./dev demo pipeline prints: the plan, progress lines, the test
 *   accuracy, the time with samples/s, the loss curve; and the loss goes
 *   down (read from the loss curve its final checkpoint holds);
 * - a run killed with SIGKILL once it saved a checkpoint, then resumed with
 *   --resume, ends with the parameters of an uninterrupted run: the stages
 *   sent their module state and Adam state, and loaded them back by name.
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

static const char *env_path(const char *var)
{
    const char *p = getenv(var);
    cr_assert(p && *p, "%s is not set: run this test through meson", var);
    return p;
}

static void skip_without_data(void)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/train-images-idx3-ubyte.gz", SR_FASHION_MNIST_DIR);
    if (access(path, R_OK))
        cr_skip_test("dataset-fashion-mnist is not installed (%s)", path);
}

/* shmrun -n 3 --name-prefix NS -- demo_pipeline --loss-curve DIR/NAME.svg
 * --checkpoint-dir DIR/NAME args... */
static void start(struct piped_job *j, const char *name, const char *dir, char **args)
{
    snprintf(j->ns, sizeof(j->ns), "%s", test_ns(name));
    static char plot[512], ck[512];
    snprintf(plot, sizeof(plot), "%s/%s.svg", dir, name);
    snprintf(ck, sizeof(ck), "%s/%s", dir, strcmp(name, "resumed") ? name : "killed");
    mkdir(ck, 0700);
    char *argv[40] = {(char *)env_path("SHMRUN"), "-n", "3", "--name-prefix", j->ns, "--",
                      (char *)env_path("DEMO_PIPELINE"), "--loss-curve", plot, "--checkpoint-dir", ck};
    int n = 11;
    for (int i = 0; args[i]; i++) {
        cr_assert_lt(n, 39, "too many arguments");
        argv[n++] = args[i];
    }
    piped_job_start(j, argv, true); /* its own process group: the whole job */
}

static int finish(struct piped_job *j)
{
    cr_assert(piped_job_pump_until(j, piped_job_closed, 6 * WATCH_WAIT_MS),
              "the job (shmrun pid %d) still holds its pipes after %d ms; stderr:\n%s", j->pid, 6 * WATCH_WAIT_MS,
              j->err);
    cr_assert(pidfd_exited(j->pidfd, WATCH_WAIT_MS), "shmrun (pid %d) did not exit", j->pid);
    pid_t p;
    int st;
    while ((p = waitpid(-j->pid, &st, 0)) > 0)
        if (p == j->pid)
            j->status = st;
    cr_assert_eq(errno, ECHILD, "waitpid: %s", strerror(errno));
    close(j->out_fd), close(j->err_fd), close(j->pidfd);
    return j->status;
}

static void run_to_end(struct piped_job *j, const char *name, const char *dir, char **args)
{
    start(j, name, dir, args);
    int st = finish(j);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: shmrun wait status 0x%x; stdout:\n%s\nstderr:\n%s", name, st,
              j->out, j->err);
    assert_segment_gone(j->ns);
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
    run_to_end(&j, "plain", dir, (char *[]){RECIPE, NULL});
    const char *want[] = {"pipeline: CNN (125450 parameters) in 2 stages, batch 32 in 4 micro-batches",
                          "  stage 1 on worker1: layers 0..3\n", "  stage 2 on worker2: layers 4..9\n",
                          "epoch 1/1   batch    12/12   loss ", "test accuracy: ", "(300 test images)\n",
                          " s training (12 steps, ", " samples/s)\n", "loss curve: "};
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

    start(&j, "killed", dir, (char *[]){RECIPE, "--splits", "1", "--save-every", "4", NULL});
    cr_assert(piped_job_pump_until(&j, saved_once, 6 * WATCH_WAIT_MS) && !j.out_eof,
              "no checkpoint was saved; stdout:\n%s\nstderr:\n%s", j.out, j.err);
    cr_assert_eq(kill(-j.pid, SIGKILL), 0, "kill(job): %s", strerror(errno));
    int st = finish(&j);
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
