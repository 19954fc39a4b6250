/* SPDX-License-Identifier: MIT */
/* The MPI bootstrap under mpirun (lib/transport/mpi/boot.c, mpi_job.h). Run by
 * tests/meson.build as `mpirun -n 4 boot_check MODE`:
 *
 *   rpc       sr_init as an ordinary program does, with SHMRPC_HOSTS=k
 *             pretend hosts (unset: 1, every rank in one segment): rpc_sync
 *             to every rank, a graceful sr_shutdown; twice.
 *   boot      the bootstrap and the shared-memory attach alone, with
 *             SHMRPC_HOSTS=k pretend hosts (unset: 1): each rank's host_of is
 *             r * k / world, each host has its own segment, only its ranks
 *             attach (their lines are filled, the others' stay empty), and
 *             messages go through the rings of the host; twice.
 *   badhosts  SHMRPC_HOSTS holds a bad value: sr_init fails with -EINVAL and
 *             a message naming the variable and the value, on every rank.
 *
 * After each round, nothing of the segment is left in this process (no fd,
 * no mapping): once every rank has finished, the kernel frees the memfd.
 * Every failure prints what was seen and exits 1 (mpirun then fails). Waits
 * are bounded: the start barrier by the transport, ring waits by a deadline.
 * In the sanitizer build, leaks are checked at the end of main.
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "mpi/mpi_job.h"
#include "agent.h"
#include "shmrpc/shmrpc.h"
#include "shm/xport.h"

#define WAIT_NS (30ll * 1000000000)

static int me = -1;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "boot_check rank %d: ", me);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

#define CHECK(cond, ...) \
    do { \
        if (!(cond)) \
            fail(__VA_ARGS__); \
    } while (0)

/* No fd and no mapping of an MPI segment ("shmrpc-mpi-...") is left. */
static void assert_nothing_left(const char *when)
{
    DIR *d = opendir("/proc/self/fd");
    CHECK(d, "opendir /proc/self/fd: %s", strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[300], link[256];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof(link) - 1);
        if (n > 0) {
            link[n] = 0;
            CHECK(!strstr(link, "shmrpc-mpi-"), "%s: fd %s still holds %s", when, e->d_name, link);
        }
    }
    closedir(d);
    FILE *f = fopen("/proc/self/maps", "r");
    CHECK(f, "fopen /proc/self/maps: %s", strerror(errno));
    char line[512];
    while (fgets(line, sizeof(line), f))
        CHECK(!strstr(line, "shmrpc-mpi-"), "%s: a mapping is left: %s", when, line);
    fclose(f);
}

/* --- rpc: an ordinary program, every rank on one host --- */

static void rpc_round(int k, int round)
{
    int rc = sr_init(NULL);
    CHECK(rc == 0, "round %d: sr_init: %s", round, sr_last_error());
    int rank = sr_rank(), world = sr_world_size();
    me = rank;
    sr_agent *a = sr__agent_get("boot_check");
    const struct sr_mpi_job *job = a ? sr__transport_job(a->tports, "mpi") : NULL;
    const sr_xport *x = a ? sr__transport_xport(a->tports) : NULL;
    CHECK(job, "round %d: the agent was not booted through MPI", round);
    int local = 0;
    for (int r = 0; r < world; r++)
        local += r * k / world == rank * k / world;
    CHECK(job->nhosts == k && x->nlocal == local, "round %d: %d hosts (expected %d), %d of %d ranks local "
          "(expected %d)", round, job->nhosts, k, x->nlocal, world, local);
    sr__agent_put(a);
    for (int r = 0; r < world; r++) {
        sr_value *x = sr_int(100 * rank), *y = sr_int(r), *sum = NULL;
        rc = sr_rpc_sync(r, "add", SR_ARGS(x, y), 30, &sum);
        CHECK(rc == 0, "round %d: rpc_sync add to rank %d: %s", round, r, sr_last_error());
        CHECK(sr_value_int(sum) == 100 * rank + r, "round %d: add(%d, %d) = %lld", round, 100 * rank, r,
              (long long)sr_value_int(sum));
        sr_value_unref(sum), sr_value_unref(x), sr_value_unref(y);
    }
    rc = sr_shutdown(true, 60);
    CHECK(rc == 0, "round %d: sr_shutdown: %s", round, sr_last_error());
    assert_nothing_left("after sr_shutdown");
}

/* --- boot: the bootstrap and the attach, with pretend hosts --- */

struct rank_info {
    int pid;
    unsigned long long ino;
};

/* Each host has its own segment: same inode exactly for the same host. */
static void check_segments(const struct sr_mpi_job *job, const sr_xport *x, const struct rank_info *all)
{
    for (int r = 0; r < job->world; r++) {
        bool same = job->host_of[r] == job->host;
        CHECK(same == (all[r].ino == all[job->rank].ino), "rank %d (host %d) has segment inode %llu, we (host %d) %llu",
              r, job->host_of[r], all[r].ino, job->host, all[job->rank].ino);
        CHECK(sr__xport_local(x, r) == same && sr__seg_attaches(&x->seg, r) == same,
              "rank %d (host %d): local %d, attaches %d; our host is %d", r, job->host_of[r], sr__xport_local(x, r),
              sr__seg_attaches(&x->seg, r), job->host);
        const struct sr_worker_info *w = sr__seg_worker(&x->seg, r);
        /* acquire: the start barrier ordered the peers' lines before us */
        uint32_t st = atomic_load_explicit(&((struct sr_worker_info *)w)->state, memory_order_acquire);
        char want[32];
        snprintf(want, sizeof(want), "worker%d", r);
        if (same)
            CHECK(w->pid == all[r].pid && sr__worker_state_attached(st) && !strcmp(x->peers[r].name, want),
                  "rank %d's line in our segment: pid %d (it is %d), state %u, name '%s'", r, w->pid, all[r].pid, st,
                  x->peers[r].name);
        else
            CHECK(w->pid == 0 && st == SR_WORKER_EMPTY && !w->name[0] && !x->peers[r].name[0],
                  "rank %d of another host has a line in our segment: pid %d, state %u, name '%.16s'", r, w->pid, st,
                  w->name);
    }
    char tag[24];
    snprintf(tag, sizeof(tag), "-h%d-", job->host);
    CHECK(strstr(x->seg.name, tag), "segment '%s' does not name host %d", x->seg.name, job->host);
}

/* One message to every local rank (ourselves included) through its ring,
 * and one from each; a send to another host's rank is refused. */
static void exchange(const struct sr_mpi_job *job, sr_xport *x)
{
    sr_msg m = {.type = 7};
    for (int r = 0; r < job->world; r++) {
        memcpy(m.data, &job->rank, sizeof(int));
        int rc = sr__xport_send_wait(x, r, &m, sr__now_ns() + WAIT_NS);
        if (job->host_of[r] == job->host)
            CHECK(rc == 0, "send to local rank %d: %s", r, sr_last_error());
        else
            CHECK(rc == -EINVAL && strstr(sr_last_error(), "does not attach"),
                  "send to rank %d of another host returned %d (%s)", r, rc, sr_last_error());
    }
    int64_t deadline = sr__now_ns() + WAIT_NS;
    for (int got = 0; got < x->nlocal;) {
        sr_msg in[8];
        unsigned n = sr__xport_recv_burst(x, in, 8);
        for (unsigned i = 0; i < n; i++) {
            int from;
            memcpy(&from, in[i].data, sizeof(int));
            CHECK(in[i].type == 7 && from == in[i].src && job->host_of[from] == job->host,
                  "received type %u from %d claiming %d", in[i].type, in[i].src, from);
        }
        got += (int)n;
        if (!n) {
            CHECK(sr__now_ns() < deadline, "received %d of %d messages in 30 s", got, x->nlocal);
            int ev = sr__xport_wait(x, deadline);
            CHECK(ev >= 0, "sr__xport_wait: %d (%s)", ev, sr_last_error());
        }
    }
}

static void boot_round(int k, int round)
{
    struct sr_mpi_job job;
    int rc = sr__mpi_boot(&job);
    CHECK(rc == 0, "round %d: sr__mpi_boot: %s", round, sr_last_error());
    me = job.rank;
    int wrank, wsize;
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    CHECK(job.rank == wrank && job.world == wsize, "job rank %d of %d, world rank %d of %d", job.rank, job.world,
          wrank, wsize);
    CHECK(job.nhosts == k, "round %d: %d hosts, SHMRPC_HOSTS asks for %d", round, job.nhosts, k);
    for (int r = 0; r < job.world; r++)
        CHECK(job.host_of[r] == r * k / job.world, "round %d: host_of[%d] = %d, expected %d", round, r, job.host_of[r],
              r * k / job.world);
    sr_xport *x = NULL;
    rc = sr__xport_attach(NULL, &x);
    CHECK(rc == 0, "round %d: sr__xport_attach: %s", round, sr_last_error());
    int local = 0;
    for (int r = 0; r < job.world; r++)
        local += job.host_of[r] == job.host;
    CHECK(x->nlocal == local && x->rank == job.rank && x->world == job.world,
          "round %d: %d local ranks (expected %d), rank %d of %d", round, x->nlocal, local, x->rank, x->world);
    struct rank_info mine = {(int)getpid(), (unsigned long long)x->seg.ino}, *all = calloc((size_t)job.world, sizeof(*all));
    CHECK(all, "calloc");
    rc = MPI_Allgather(&mine, (int)sizeof(mine), MPI_BYTE, all, (int)sizeof(mine), MPI_BYTE, job.comm);
    CHECK(rc == MPI_SUCCESS, "MPI_Allgather: %d", rc);
    check_segments(&job, x, all);
    free(all);
    exchange(&job, x);
    MPI_Barrier(job.comm); /* every rank has read its messages before anyone detaches */
    x->graceful = true;
    sr__xport_detach(x);
    sr__mpi_job_fini(&job);
    assert_nothing_left("after sr__mpi_job_fini");
}

/* --- badhosts --- */

static void bad_hosts(void)
{
    const char *v = getenv("SHMRPC_HOSTS");
    CHECK(v, "badhosts needs SHMRPC_HOSTS set");
    int rc = sr_init(NULL);
    char want[64];
    snprintf(want, sizeof(want), "SHMRPC_HOSTS=\"%s\"", v);
    CHECK(rc == -EINVAL && strstr(sr_last_error(), want) && strstr(sr_last_error(), "[1, "),
          "sr_init with SHMRPC_HOSTS=%s returned %d (%s); expected -EINVAL naming %s", v, rc, sr_last_error(), want);
    if (getenv("OMPI_COMM_WORLD_RANK") && !strcmp(getenv("OMPI_COMM_WORLD_RANK"), "0"))
        printf("boot_check badhosts: sr_init says: %s\n", sr_last_error());
    assert_nothing_left("after the failed sr_init");
    CHECK(sr_rank() == -SR_ESHUTDOWN, "sr_rank after a failed sr_init: %d", sr_rank());
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "rpc")) {
        const char *k = getenv("SHMRPC_HOSTS");
        rpc_round(k ? atoi(k) : 1, 1);
        rpc_round(k ? atoi(k) : 1, 2);
    } else if (!strcmp(mode, "boot")) {
        const char *k = getenv("SHMRPC_HOSTS");
        boot_round(k ? atoi(k) : 1, 1);
        boot_round(k ? atoi(k) : 1, 2);
    } else if (!strcmp(mode, "badhosts")) {
        bad_hosts();
    } else {
        fprintf(stderr, "usage: mpirun -n N boot_check rpc|boot|badhosts\n");
        return 2;
    }
    printf("boot_check %s: rank %d ok\n", mode, me);
#if defined(__SANITIZE_ADDRESS__)
    /* Our leaks, now: MPI is still initialised, so its own state is
     * reachable. This also skips the check at exit, which would see what
     * Open MPI leaves in MPI_Finalize (at exit, after this) and in the
     * components it unloads there, where no suppression can name them. */
    __lsan_do_leak_check();
#endif
    return 0;
}
