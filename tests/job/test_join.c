/* Elastic jobs under the real shmrun (shmrun --max-workers, --join):
 * tests/helpers/elastic_prog.c drives the scenario from inside the job (a
 * program joins a free rank, is called by rank and by name, leaves; a join
 * to a full job and a joiner with a name already taken are refused; rank 0
 * leaves too) and the job must end with status 0. And the client's own
 * refusals: a job that does not exist, a job that is not elastic.
 * Each shmrun is waited for on its pidfd, with a bound. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

LEAK_CHECKED_SUITE(join);

#define WAIT_S 60

static const char *env_path(const char *var)
{
    const char *p = getenv(var);
    cr_assert(p && *p, "%s is not set: run this test through meson", var);
    return p;
}

/* Run argv with stderr to `err` (NUL-terminated, up to len); its exit code. */
static int run(char *const argv[], char *err, size_t len)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/%s.err", test_ns("join"));
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 2) != 2)
            _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    struct pollfd p = {.fd = pfd, .events = POLLIN};
    cr_assert_eq(poll(&p, 1, WAIT_S * 1000), 1, "%s did not end within %d s", argv[0], WAIT_S);
    close(pfd);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(err, 1, len - 1, f) : 0;
    err[n] = 0;
    if (f)
        fclose(f);
    unlink(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

Test(join, a_program_joins_a_free_rank_and_leaves, .timeout = 120)
{
    char dir[64], err[16384];
    snprintf(dir, sizeof(dir), "/tmp/%s", test_ns("joindir"));
    cr_assert(mkdir(dir, 0700) == 0 || errno == EEXIST);
    const char *shmrun = env_path("SHMRUN"), *prog = env_path("ELASTIC_PROG");
    char *argv[] = {(char *)shmrun, "-n", "2", "--max-workers", "3", "--name-prefix", (char *)test_ns("join1"),
                    "--shm-size", "256M", "--", (char *)prog, "host", (char *)shmrun, dir, NULL};
    int st = run(argv, err, sizeof(err));
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(st, 0, "the elastic job: %d; its stderr:\n%s", st, err);
}

Test(join, no_such_job, .timeout = 30)
{
    char err[4096];
    char *argv[] = {(char *)env_path("SHMRUN"), "--join", "999999999", "--", (char *)env_path("ELASTIC_PROG"),
                    "joiner", "x", NULL};
    int st = run(argv, err, sizeof(err));
    cr_assert_eq(st, 1, "%d: %s", st, err);
    cr_assert(strstr(err, "shmrun: --join 999999999: no such job"), "%s", err);
}

Test(join, bad_command_lines, .timeout = 30)
{
    char err[4096];
    const char *shmrun = env_path("SHMRUN");
    char *a1[] = {(char *)shmrun, "-n", "2", "--join", "1", "--", "/bin/true", NULL};
    cr_assert_eq(run(a1, err, sizeof(err)), 2, "%s", err);
    cr_assert(strstr(err, "--join runs one worker in a job that exists: -n is not for it"), "%s", err);
    char *a2[] = {(char *)shmrun, "-n", "3", "--max-workers", "2", "--", "/bin/true", NULL};
    cr_assert_eq(run(a2, err, sizeof(err)), 2, "%s", err);
    cr_assert(strstr(err, "--max-workers must be at least -n, not 2"), "%s", err);
    char *a3[] = {(char *)shmrun, "-n", "1", "--rank", "1", "--", "/bin/true", NULL};
    cr_assert_eq(run(a3, err, sizeof(err)), 2, "%s", err);
    cr_assert(strstr(err, "--rank goes with --join"), "%s", err);
}
