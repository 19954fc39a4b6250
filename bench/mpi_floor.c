/* SPDX-License-Identifier: MIT */
/* The raw Open MPI floor of shmrpc across hosts: what MPI alone
 * costs over the BTL mpirun was given, measured in the same run as our
 * figures (bench/mpi_bench.sh runs it next to bench_mpi_rpc).
 *
 *   mpirun -n 2 --mca btl self,tcp mpi_floor [--json] [--size BYTES] [--iters N]
 *          [--rounds R] [--big-iters N] [pingpong] [transfer]
 *
 * pingpong  round trip of --size bytes (default 64: a no-op request's frame
 *           across hosts, its 64-byte head and no part, lib/transport/mpi/mpi_tport.c)
 *           and of 64 B, the ways a nonblocking transport can make it:
 *             isend+improbe  MPI_Isend completed by polling MPI_Test; the
 *                            receiver polls MPI_Improbe, then MPI_Mrecv
 *                            (what our MPI transport does)
 *             irecv+test     the same send; the receive is an MPI_Irecv
 *                            posted beforehand and polled with MPI_Test
 *           each printed next to plain MPI_Send / MPI_Recv (the floor
 *           column), measured in the same round.
 * transfer  64 MiB from rank 0 into a preallocated, touched buffer of rank
 *           1, which answers 1 byte: time per transfer and GB/s, the same
 *           three ways.
 *
 * Method (bench_util.h): every round runs each way after a warm-up (send/recv
 * first, so that it is the floor "measured just before"); a line gives the
 * medians over rounds of each round's p50 and p99 and of the per-round
 * ratios. Rank 0 times and prints; rank 1 echoes. Every message carries its
 * iteration number at both ends, checked on arrival after it was timed.
 *
 * MPI runs at MPI_THREAD_MULTIPLE, the level shmrpc asks for: Open MPI
 * takes locks at that level, so they belong to the floor. MPI errors are
 * fatal (MPI_ERRORS_ARE_FATAL): a failed call ends the job, never a figure.
 * The command line is parsed before MPI_Init, so the check of every bench's
 * command line (tests/packaging) runs this one without mpirun.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define FRAME_BYTES 64         /* a no-op request's frame across hosts: the head, no part */
#define BIG_BYTES (64 << 20)   /* the transfer */
#define TAG 7

enum way { W_SENDRECV, W_IMPROBE, W_IRECV, W_COUNT };
static const char *const way_name[W_COUNT] = {"send/recv", "isend+improbe", "irecv+test"};

static int rank;
static long long errors; /* messages that arrived without their iteration's stamp */

/* ---- one message each way ---- */

static void poll_request(MPI_Request *r)
{
    int done = 0;
    while (!done)
        MPI_Test(r, &done, MPI_STATUS_IGNORE);
}

static void send_msg(enum way w, const uint8_t *buf, int n, int peer)
{
    if (w == W_SENDRECV) {
        MPI_Send(buf, n, MPI_BYTE, peer, TAG, MPI_COMM_WORLD);
        return;
    }
    MPI_Request r;
    MPI_Isend(buf, n, MPI_BYTE, peer, TAG, MPI_COMM_WORLD, &r);
    poll_request(&r);
}

/* W_IRECV: *posted is the receive posted beforehand. */
static void recv_msg(enum way w, uint8_t *buf, int n, int peer, MPI_Request *posted)
{
    if (w == W_SENDRECV) {
        MPI_Recv(buf, n, MPI_BYTE, peer, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (w == W_IRECV) {
        poll_request(posted);
    } else {
        int found = 0;
        MPI_Message msg;
        while (!found)
            MPI_Improbe(peer, TAG, MPI_COMM_WORLD, &found, &msg, MPI_STATUS_IGNORE);
        MPI_Mrecv(buf, n, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
    }
}

/* The iteration number at the start of a message and, when there is room
 * for both, at its end (a transfer cut short or overtaken shows). */
static void stamp(uint8_t *buf, int n, uint64_t i)
{
    size_t k = n < 8 ? (size_t)n : 8;
    memcpy(buf, &i, k);
    if (n >= 16)
        memcpy(buf + n - 8, &i, 8);
}

static void check_stamp(const uint8_t *buf, int n, uint64_t i)
{
    uint8_t want[8];
    memcpy(want, &i, 8);
    size_t k = n < 8 ? (size_t)n : 8;
    if (memcmp(buf, want, k) || (n >= 16 && memcmp(buf + n - 8, want, 8)))
        errors++;
}

/* ---- a timed run ---- */

struct run {
    enum way w;
    int n, reply;   /* bytes rank 0 sends, and rank 1 answers */
    int warm, iters;
    int64_t *lat;   /* [iters], rank 0 */
    uint8_t *out, *in;
};

/* Rank 0: one round trip, timed. */
static int64_t trip0(const struct run *r, uint64_t i)
{
    MPI_Request posted = MPI_REQUEST_NULL;
    stamp(r->out, r->n, i);
    if (r->w == W_IRECV) /* posted before the clock starts, as a transport keeps one posted */
        MPI_Irecv(r->in, r->reply, MPI_BYTE, 1, TAG, MPI_COMM_WORLD, &posted);
    int64_t t0 = bench_now_ns();
    send_msg(r->w, r->out, r->n, 1);
    recv_msg(r->w, r->in, r->reply, 1, &posted);
    int64_t t = bench_now_ns() - t0;
    check_stamp(r->in, r->reply, i);
    return t;
}

/* Rank 1: one echo. */
static void trip1(const struct run *r, uint64_t i)
{
    MPI_Request posted = MPI_REQUEST_NULL;
    if (r->w == W_IRECV)
        MPI_Irecv(r->in, r->n, MPI_BYTE, 0, TAG, MPI_COMM_WORLD, &posted);
    recv_msg(r->w, r->in, r->n, 0, &posted);
    check_stamp(r->in, r->n, i);
    stamp(r->out, r->reply, i);
    send_msg(r->w, r->out, r->reply, 0);
}

/* Both ranks run it; rank 0 gets p50 and p99. */
static bench_lat run_way(const struct run *r)
{
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < r->warm + r->iters; i++) {
        if (rank == 1) {
            trip1(r, (uint64_t)i);
            continue;
        }
        int64_t t = trip0(r, (uint64_t)i);
        if (i >= r->warm)
            r->lat[i - r->warm] = t;
    }
    return rank == 0 ? bench_lat_of(r->lat, (size_t)r->iters) : (bench_lat){0};
}

/* ---- the workloads ---- */

static const char *btl; /* as mpirun was given it (OMPI_MCA_btl), for the lines */

/* Rounds of send/recv, then each nonblocking way; one line per nonblocking
 * way, named `name`, its configuration starting with `label`. */
static void measure(const char *name, const char *label, struct run *r, int rounds,
                    const char *(*extra)(const bench_summary *, char *, size_t))
{
    bench_rounds got[W_COUNT] = {0};
    for (int k = 0; k < rounds; k++) {
        r->w = W_SENDRECV;
        bench_lat floor = run_way(r);
        for (enum way w = W_IMPROBE; w < W_COUNT; w++) {
            r->w = w;
            bench_rounds_add(&got[w], run_way(r), floor);
        }
    }
    if (rank)
        return;
    for (enum way w = W_IMPROBE; w < W_COUNT; w++) {
        char config[96], buf[128];
        snprintf(config, sizeof(config), "%s %s, btl %s", label, way_name[w], btl);
        bench_summary s = bench_summarize(&got[w]);
        bench_print(name, config, way_name[W_SENDRECV], &s, 0, extra ? extra(&s, buf, sizeof(buf)) : NULL);
    }
}

static const char *gbps(const bench_summary *s, char *buf, size_t len)
{
    snprintf(buf, len, "%.2f GB/s, send/recv %.2f GB/s", BIG_BYTES / s->ours50, BIG_BYTES / s->floor50);
    return buf;
}

static void pingpong(int size, int iters, int rounds)
{
    int sizes[2] = {size, FRAME_BYTES}, nsizes = size == FRAME_BYTES ? 1 : 2;
    for (int k = 0; k < nsizes; k++) {
        struct run r = {.n = sizes[k], .reply = sizes[k], .iters = iters, .warm = iters / 10 + 100};
        r.lat = malloc(sizeof(*r.lat) * (size_t)iters);
        r.out = calloc(1, (size_t)sizes[k]);
        r.in = calloc(1, (size_t)sizes[k]);
        if (!r.lat || !r.out || !r.in) {
            fprintf(stderr, "mpi_floor: rank %d: out of memory for %d-byte messages\n", rank, sizes[k]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        char label[32];
        snprintf(label, sizeof(label), "%d B", sizes[k]);
        measure("mpi pingpong", label, &r, rounds, NULL);
        free(r.lat);
        free(r.out);
        free(r.in);
    }
}

static void transfer(int iters, int rounds)
{
    struct run r = {.n = BIG_BYTES, .reply = 1, .iters = iters, .warm = 2};
    size_t out = rank == 0 ? BIG_BYTES : 1, in = rank == 0 ? 1 : BIG_BYTES;
    r.lat = malloc(sizeof(*r.lat) * (size_t)iters);
    r.out = malloc(out);
    r.in = malloc(in);
    if (!r.lat || !r.out || !r.in) {
        fprintf(stderr, "mpi_floor: rank %d: out of memory for the 64 MiB transfer\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(r.out, 0x5a, out); /* touched: no page fault is timed */
    memset(r.in, 0, in);
    measure("mpi transfer", "64 MiB", &r, rounds, gbps);
    free(r.lat);
    free(r.out);
    free(r.in);
}

/* ---- main ---- */

static bench_cli cli = {
    .prog = "mpi_floor",
    .names = {"pingpong", "transfer", NULL},
    .opts = {"--size", "--iters", "--rounds", "--big-iters", NULL},
    .usage = "  run as: mpirun -n 2 --mca btl self,tcp|self,vader mpi_floor ...\n"
             "  --size BYTES     the ping-pong's message (default 64, a no-op request's frame); 64 B is also run\n"
             "  --iters N        timed round trips per way and round (default 10000)\n"
             "  --rounds R       rounds (default 5)\n"
             "  --big-iters N    timed 64 MiB transfers per way and round (default 20)",
};

/* Rank 0: the library, the BTL, the hosts and the thread level. */
static void header(int provided)
{
    char lib[MPI_MAX_LIBRARY_VERSION_STRING], name[2][MPI_MAX_PROCESSOR_NAME] = {{0}};
    int len;
    MPI_Get_library_version(lib, &len);
    lib[strcspn(lib, ",\n")] = 0;
    MPI_Get_processor_name(name[rank], &len);
    if (rank == 1)
        MPI_Send(name[1], MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, TAG, MPI_COMM_WORLD);
    else
        MPI_Recv(name[1], MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 1, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (rank == 0)
        printf("# mpi_floor: %s, btl %s, ranks on %s and %s, thread level %s\n", lib, btl, name[0], name[1],
               provided == MPI_THREAD_MULTIPLE ? "MPI_THREAD_MULTIPLE" : "below MPI_THREAD_MULTIPLE (shmrpc refuses that)");
}

int main(int argc, char **argv)
{
    bench_cli_parse(&cli, argc, argv);
    int size = cli.opt[0] ? (int)bench_cli_int(&cli, "--size", cli.opt[0], 1, 1 << 26) : FRAME_BYTES;
    int iters = cli.opt[1] ? (int)bench_cli_int(&cli, "--iters", cli.opt[1], 1, 10000000) : 10000;
    int rounds = cli.opt[2] ? (int)bench_cli_int(&cli, "--rounds", cli.opt[2], 1, BENCH_MAX_ROUNDS) : 5;
    int big_iters = cli.opt[3] ? (int)bench_cli_int(&cli, "--big-iters", cli.opt[3], 1, 10000) : 20;

    int provided, world;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != 2) {
        if (rank == 0)
            fprintf(stderr, "mpi_floor: needs 2 ranks (mpirun -n 2 --mca btl self,tcp mpi_floor), got %d\n", world);
        MPI_Finalize();
        return 2;
    }
    btl = getenv("OMPI_MCA_btl") ? getenv("OMPI_MCA_btl") : "default";
    header(provided);
    if (bench_cli_wants(&cli, "pingpong"))
        pingpong(size, iters, rounds);
    if (bench_cli_wants(&cli, "transfer"))
        transfer(big_iters, rounds);

    long long all = 0;
    MPI_Reduce(&errors, &all, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    if (rank == 0 && all) {
        fprintf(stderr, "mpi_floor: %lld messages arrived without their iteration's stamp\n", all);
        return 1;
    }
    return 0;
}
