/* SPDX-License-Identifier: MIT */
/* The leak check under mpirun (tests/mpi/lsan_mpi.sh; sanitizer build
 * only): a program that makes the MPI calls shmrpc makes across hosts, as
 * shmrpc makes them, must end without a leak report under tests/lsan.supp,
 * and a leak of its own must still be reported under the same suppressions.
 *
 *   mpirun -n N lsan_mpi [leak]
 *
 * The calls: MPI_Init_thread (MPI_THREAD_MULTIPLE), the host split
 * (MPI_Comm_split_type SHARED, then MPI_Comm_split into pretend hosts), a
 * duplicated communicator, an all-gather of names, then around a ring of
 * ranks: a 64-byte frame and a 4 MiB part sent with MPI_Isend from one
 * thread while another thread polls MPI_Improbe and takes them with
 * MPI_Mrecv, and a pre-posted MPI_Irecv polled with MPI_Test; the
 * communicators freed, MPI_Finalize. With `leak`, rank 0 also loses a block
 * of its own (leaked_by_lsan_mpi, in the report the script looks for).
 * MPI errors are fatal (the default error handler).
 */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FRAME 64
#define PART (4 << 20)
#define TAG 3

static MPI_Comm comm;
static int rank, world;

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "lsan_mpi: rank %d: out of memory for %zu bytes\n", rank, n);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(p, rank, n);
    return p;
}

/* The receiving thread: the frame and the part from the previous rank. */
static void *receiver(void *arg)
{
    (void)arg;
    int from = (rank + world - 1) % world;
    uint8_t *frame = xmalloc(FRAME), *part = xmalloc(PART);
    for (int k = 0; k < 2; k++) {
        int found = 0;
        MPI_Message msg;
        MPI_Status st;
        while (!found)
            MPI_Improbe(from, TAG, comm, &found, &msg, &st);
        MPI_Mrecv(k ? part : frame, k ? PART : FRAME, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
    }
    int bad = frame[0] != (uint8_t)from || part[PART - 1] != (uint8_t)from;
    free(frame);
    free(part);
    return bad ? (void *)1 : NULL;
}

/* One exchange around the ring; 0 or 1 when the bytes were wrong. */
static int exchange(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, receiver, NULL)) {
        fprintf(stderr, "lsan_mpi: rank %d: pthread_create failed\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int to = (rank + 1) % world, from = (rank + world - 1) % world;
    uint8_t *frame = xmalloc(FRAME), *part = xmalloc(PART), word = 0, got = 0xff;
    MPI_Request req[4];
    MPI_Irecv(&got, 1, MPI_BYTE, from, TAG + 1, comm, &req[0]);
    MPI_Isend(frame, FRAME, MPI_BYTE, to, TAG, comm, &req[1]);
    MPI_Isend(part, PART, MPI_BYTE, to, TAG, comm, &req[2]);
    word = (uint8_t)rank;
    MPI_Isend(&word, 1, MPI_BYTE, to, TAG + 1, comm, &req[3]);
    int done = 0;
    while (!done)
        MPI_Testall(4, req, &done, MPI_STATUSES_IGNORE);
    void *bad;
    pthread_join(t, &bad);
    free(frame);
    free(part);
    return bad != NULL || got != (uint8_t)from;
}

/* A block reachable only through a disguised pointer, which LSan cannot
 * follow: a leak as LSan sees it (lsan_canary.c does the same). */
static volatile uintptr_t hidden; /* volatile: a store never read must not be dropped (-O1 dropped it, and the malloc with it) */
#define HIDE ((uintptr_t)0x5a5a5a5a5a5a5a5a)

__attribute__((noinline)) static void leaked_by_lsan_mpi(void)
{
    char *p = malloc(77);
    if (p)
        memset(p, 0x42, 77);
    hidden = (uintptr_t)p ^ HIDE;
}

/* Overwrite the dead stack below us, where copies of the pointer may remain. */
__attribute__((noinline)) static void scrub_stack(void)
{
    volatile char junk[4096];
    memset((char *)junk, 0, sizeof(junk));
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "lsan_mpi: rank %d: MPI_THREAD_MULTIPLE not provided (%d)\n", rank, provided);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm shared, host;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared);
    MPI_Comm_split(shared, rank % 2, rank, &host); /* two pretend hosts */
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    char name[16] = {0}, *names = xmalloc(sizeof(name) * (size_t)world);
    snprintf(name, sizeof(name), "rank%d", rank);
    MPI_Allgather(name, sizeof(name), MPI_CHAR, names, sizeof(name), MPI_CHAR, comm);
    char last[16];
    snprintf(last, sizeof(last), "rank%d", world - 1);
    int bad = strcmp(names + sizeof(name) * (size_t)(world - 1), last) != 0;
    free(names);
    bad |= exchange();
    MPI_Comm_free(&comm);
    MPI_Comm_free(&host);
    MPI_Comm_free(&shared);
    MPI_Finalize();
    if (bad) {
        fprintf(stderr, "lsan_mpi: rank %d: a message arrived with the wrong bytes\n", rank);
        return 1;
    }
    if (rank == 0 && argc > 1 && !strcmp(argv[1], "leak")) {
        leaked_by_lsan_mpi();
        scrub_stack();
    }
    return 0;
}
