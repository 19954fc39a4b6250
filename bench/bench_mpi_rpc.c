/* SPDX-License-Identifier: MIT */
/* Across hosts: shmrpc over the MPI transport next to raw MPI, in one run.
 *
 *   mpirun -n 2 -x SHMRPC_HOSTS=2 --mca btl self,tcp bench_mpi_rpc [--rounds R]
 *
 * Two ranks on two (pretend) hosts. Each round measures, one after the
 * other in the same processes over the same BTL:
 *   - raw MPI: a ping-pong of the no-op request's frame size (64 bytes),
 *     with the calls our transport makes (MPI_Isend, then MPI_Improbe and
 *     MPI_Mrecv polled), and a 64 MiB transfer answered by one byte;
 *   - shmrpc (sr_init .. sr_shutdown inside the round): sr_rpc_sync of the
 *     built-in no-op, hot (both sides polling, as raw MPI does: a fixed
 *     spin budget) and under the default spin policy (which refuses to spin
 *     while the machine has more runnable threads than cores, and then
 *     sleeps until the MPI poll interval); and of a function given a
 *     64 MiB tensor.
 * The line per figure: medians over rounds of each side's p50, and the
 * median of the per-round ratios (a round's two figures share its noise).
 * Targets: no-op <= 1.5x the ping-pong, 64 MiB <= 1.2x. */
#include <errno.h>
#include <stdlib.h>
#include <mpi.h>
#include <sys/resource.h>
#include <time.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "shmrpc/shmrpc.h"

#define NOOP_CALLS 20000
#define NOOP_WARM 2000
#define BIG_BYTES (64u << 20)
#define BIG_CALLS 12
#define BIG_WARM 2
#define FRAME_BYTES 64 /* a no-op request's frame: the head and no part (lib/transport/mpi/mpi_tport.c) */

static int rank;

static void die(const char *what)
{
    fprintf(stderr, "bench_mpi_rpc: rank %d: %s: %s\n", rank, what, sr_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Rank 0 sends n bytes with MPI_Isend; rank 1 polls with MPI_Improbe, takes
 * it with MPI_Mrecv and answers `reply` bytes the same way. */
static void poll_recv(void *buf, int n, int from)
{
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    while (!flag)
        MPI_Improbe(from, 0, MPI_COMM_WORLD, &flag, &msg, &st);
    MPI_Mrecv(buf, n, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
}

static void isend(const void *buf, int n, int to)
{
    MPI_Request r;
    MPI_Isend(buf, n, MPI_BYTE, to, 0, MPI_COMM_WORLD, &r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
}

static bench_lat raw_pingpong(uint8_t *buf, int n, int reply, int iters, int warm, int64_t *lat)
{
    for (int i = 0; i < warm + iters; i++) {
        int64_t t0 = bench_now_ns();
        if (rank == 0) {
            isend(buf, n, 1);
            poll_recv(buf, reply, 1);
        } else {
            poll_recv(buf, n, 0);
            isend(buf, reply, 0);
        }
        if (i >= warm)
            lat[i - warm] = bench_now_ns() - t0;
    }
    return bench_lat_of(lat, (size_t)iters);
}

static int consume(sr_call *c)
{
    return sr_call_return(c, sr_none());
}

static void start(void)
{
    if (sr_init(NULL))
        die("sr_init");
}

static void stop(void)
{
    if (sr_shutdown(true, 60))
        die("sr_shutdown");
}

/* What an idle worker costs while it has peers on another host: the CPU
 * time this process used over `secs` seconds of idleness (its progress
 * thread polls MPI at the backed-off interval, mpi_tport.h), in percent of
 * one core. */
static double idle_cpu_percent(double secs)
{
    struct rusage a, b;
    getrusage(RUSAGE_SELF, &a);
    int64_t t0 = bench_now_ns();
    struct timespec ts = {.tv_sec = (time_t)secs, .tv_nsec = (long)((secs - (double)(time_t)secs) * 1e9)};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
    getrusage(RUSAGE_SELF, &b);
    double wall = (double)(bench_now_ns() - t0) / 1e9;
    double cpu = (double)(b.ru_utime.tv_sec - a.ru_utime.tv_sec + b.ru_stime.tv_sec - a.ru_stime.tv_sec) +
                 (double)(b.ru_utime.tv_usec - a.ru_utime.tv_usec + b.ru_stime.tv_usec - a.ru_stime.tv_usec) / 1e6;
    return 100 * cpu / wall;
}

static bench_lat ours_noop(int64_t *lat)
{
    for (int i = 0; i < NOOP_WARM + NOOP_CALLS; i++) {
        int64_t t0 = bench_now_ns();
        if (sr_rpc_sync(1, "noop", SR_NOARGS, 0, NULL))
            die("rpc_sync noop");
        if (i >= NOOP_WARM)
            lat[i - NOOP_WARM] = bench_now_ns() - t0;
    }
    return bench_lat_of(lat, NOOP_CALLS);
}

static bench_lat ours_big(sr_value *t, int64_t *lat)
{
    for (int i = 0; i < BIG_WARM + BIG_CALLS; i++) {
        int64_t t0 = bench_now_ns();
        if (sr_rpc_sync(1, "consume", SR_ARGS(t), 0, NULL))
            die("rpc_sync consume(64 MiB)");
        if (i >= BIG_WARM)
            lat[i - BIG_WARM] = bench_now_ns() - t0;
    }
    return bench_lat_of(lat, BIG_CALLS);
}

int main(int argc, char **argv)
{
    int rounds = 5, world = 0, provided = 0;
    bool idle_only = false;
    bench_cli cli = {.prog = "bench_mpi_rpc", .flags = {"--idle-only"}, .opts = {"--rounds"},
                     .usage = "  --rounds R   rounds of every figure (default 5)\n"
                              "  --idle-only  only the idle CPU figure\n"
                              "Run it as: mpirun -n 2 -x SHMRPC_HOSTS=2 --mca btl self,tcp bench_mpi_rpc\n"};
    bench_cli_parse(&cli, argc, argv);
    idle_only = cli.flag[0];
    if (cli.opt[0])
        rounds = (int)bench_cli_int(&cli, "--rounds", cli.opt[0], 1, BENCH_MAX_ROUNDS);
    if (rounds < 1 || rounds > BENCH_MAX_ROUNDS)
        rounds = 5;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != 2 || provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "bench_mpi_rpc: needs 2 ranks (got %d) and MPI_THREAD_MULTIPLE\n", world);
        MPI_Finalize();
        return 2;
    }
    sr_register("consume", consume);
    uint8_t *buf = malloc(BIG_BYTES);
    int64_t *lat = malloc(sizeof(int64_t) * NOOP_CALLS);
    if (!buf || !lat)
        die("malloc");
    memset(buf, 1, BIG_BYTES);
    bench_rounds noop = {0}, noop_hot = {0}, big = {0};
    double idle[2] = {0, 0};
    for (int r = 0; r < rounds; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (idle_only) {
            start();
            MPI_Barrier(MPI_COMM_WORLD);
            idle[rank] = idle_cpu_percent(2.0);
            stop();
            break;
        }
        bench_lat raw_small = raw_pingpong(buf, FRAME_BYTES, FRAME_BYTES, NOOP_CALLS, NOOP_WARM, lat);
        bench_lat raw_big = raw_pingpong(buf, BIG_BYTES, 1, BIG_CALLS, BIG_WARM, lat);
        /* hot: both sides poll, as raw MPI always does (SHMRPC_SPIN_NS fixes
         * the spin budget; the default policy refuses to spin whenever the
         * machine has more runnable threads than cores) */
        setenv("SHMRPC_SPIN_NS", "50000", 1);
        start();
        bench_lat hot = rank == 0 ? ours_noop(lat) : (bench_lat){0, 0};
        stop();
        unsetenv("SHMRPC_SPIN_NS");
        start();
        if (rank == 0) {
            bench_lat small = ours_noop(lat);
            bench_rounds_add(&noop_hot, hot, raw_small);
            sr_tensor *t = sr_full(SR_F32, 1, (int64_t[]){BIG_BYTES / 4}, 1.0, 0);
            sr_value *v = t ? sr_value_from_tensor(t) : NULL;
            if (!v)
                die("a 64 MiB tensor");
            bench_lat large = ours_big(v, lat);
            sr_value_unref(v);
            sr_tensor_unref(t);
            bench_rounds_add(&noop, small, raw_small);
            bench_rounds_add(&big, large, raw_big);
        }
        if (r == rounds - 1) { /* every rank idle for 2 s, calls done, the agents up */
            MPI_Barrier(MPI_COMM_WORLD); /* both done with their calls */
            idle[rank] = idle_cpu_percent(2.0);
        }
        stop();
    }
    double idle1 = 0;
    if (rank == 1)
        MPI_Send(&idle[1], 1, MPI_DOUBLE, 0, 7, MPI_COMM_WORLD);
    else
        MPI_Recv(&idle1, 1, MPI_DOUBLE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (rank == 0) {
        printf("idle across hosts | 2 s with no call, agents up | CPU %.2f %% of a core (rank 0), %.2f %% (rank 1) | "
               "the progress thread polls MPI every <= 1 ms once idle (mpi_tport.h)\n", idle[0], idle1);
        bench_rec rec;
        bench_rec_begin(&rec, "idle across hosts");
        bench_rec_num(&rec, "cpu_percent_rank0", idle[0]);
        bench_rec_num(&rec, "cpu_percent_rank1", idle1);
        bench_rec_emit(&rec);
        if (idle_only) {
            free(lat);
            free(buf);
            MPI_Finalize();
            return 0;
        }
        bench_summary s = bench_summarize(&noop_hot);
        char extra[160];
        snprintf(extra, sizeof(extra), "2 pretend hosts, %d rounds", rounds);
        bench_print("rpc_sync noop across hosts", "hot (both polling, SHMRPC_SPIN_NS=50000)",
                    "raw MPI ping-pong 64 B (Isend/Improbe)", &s, 1.5, extra);
        s = bench_summarize(&noop);
        bench_print("rpc_sync noop across hosts", "default spin policy (no spin when oversubscribed)",
                    "raw MPI ping-pong 64 B (Isend/Improbe)", &s, 0, extra);
        s = bench_summarize(&big);
        snprintf(extra, sizeof(extra), "%.2f GB/s ours, %.2f GB/s raw", BIG_BYTES / s.ours50, BIG_BYTES / s.floor50);
        bench_print("rpc_sync 64 MiB tensor across hosts", "MPI transport, one message, no copy on the sender",
                    "raw MPI 64 MiB + 1 B reply", &s, 1.2, extra);
    }
    free(lat);
    free(buf);
    MPI_Finalize();
    return 0;
}
