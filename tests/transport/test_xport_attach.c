/* SPDX-License-Identifier: MIT */
/* The shared-memory transport's attach (lib/transport/shm/xport.c) on a bad
 * or partial segment: the worker's view of the substrate's checks
 * (tests/shm/test_segment.c), and partial attach as the transport does it:
 * only the marked ranks attach, and its start barrier counts only them.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "error.h"
#include "segment.h"
#include "shm/xport.h"

LEAK_CHECKED_SUITE(xport_attach);
LEAK_CHECKED_SUITE(partial_attach);

#include "segment_fixture.h"

/* The transport on a bad segment: the worker's view of the same checks. */
Test(xport_attach, a_segment_with_a_wrong_version_is_eproto, .init = make_segment, .fini = drop_segment)
{
    seg.hdr->version = 99;
    char fd[16];
    snprintf(fd, sizeof(fd), "%d", dup(seg.fd)); /* the transport closes it on failure */
    set_env(fd, "0", "2");
    sr_xport *x = NULL;
    cr_assert_eq(sr__xport_attach(NULL, &x), -EPROTO, "%s", sr_last_error());
    cr_assert_null(x);
    assert_msg("version 99");
}

Test(xport_attach, a_world_size_that_differs_from_the_segment_is_einval, .init = make_segment, .fini = drop_segment)
{
    char fd[16];
    snprintf(fd, sizeof(fd), "%d", dup(seg.fd));
    set_env(fd, "0", "3");
    sr_xport *x = NULL;
    cr_assert_eq(sr__xport_attach(NULL, &x), -EINVAL, "%s", sr_last_error());
    assert_msg("SHMRPC_WORLD_SIZE is 3 but the segment was made for 2 workers");
}

Test(xport_attach, a_failed_attach_closes_no_unrelated_fd)
{
    /* Regression: the transport closed fd 0 (its zeroed segment fd) when
     * sr__segment_attach failed. */
    int keep = open("/dev/null", O_RDONLY);
    cr_assert(keep >= 0);
    cr_assert_eq(dup2(keep, 0), 0);
    int fd = memfd_create(test_ns("notaseg"), MFD_CLOEXEC);
    cr_assert_eq(ftruncate(fd, 1 << 20), 0);
    char fds[16];
    snprintf(fds, sizeof(fds), "%d", fd);
    set_env(fds, "0", "1");
    sr_xport *x = NULL;
    cr_assert_eq(sr__xport_attach(NULL, &x), -EPROTO, "%s", sr_last_error());
    assert_msg("not a shmrpc segment");
    cr_assert_neq(fcntl(0, F_GETFD), -1, "sr__xport_attach closed fd 0");
    close(keep);
}

/* ---- partial attach (segment.h): only the marked ranks attach ---------- */

#define START_NS (10ll * 1000000000) /* bounds a start barrier that waits for ranks that never come */

/* A segment for `world` workers of which those with mask[r] attach. */
static void make_partial(int world, const uint8_t *mask)
{
    sr_segment_opts o = {.world_size = world, .ring_slots = 64, .name = test_ns("part"), .attaching = mask};
    o.size = sr__segment_fixed_size(world, 64) + (uint64_t)world * SR_HEAP_MIN;
    cr_assert_eq(sr__segment_create(&o, &seg), 0, "sr__segment_create: %s", sr_last_error());
}

/* Attach as `rank` of seg; 0 or the error. */
static int attach_as(int rank, int64_t start_ns, sr_xport **x)
{
    char fd[16], r[16], w[16];
    snprintf(fd, sizeof(fd), "%d", seg.fd);
    snprintf(r, sizeof(r), "%d", rank);
    snprintf(w, sizeof(w), "%u", seg.world);
    set_env(fd, r, w);
    *x = NULL;
    return sr__xport_attach(&(sr_xport_opts){.start_timeout_ns = start_ns}, x);
}

Test(partial_attach, a_rank_that_is_not_marked_cannot_attach, .fini = drop_segment)
{
    make_partial(3, (const uint8_t[]){1, 0, 1});
    sr_xport *x;
    cr_assert_eq(attach_as(1, START_NS, &x), -EINVAL, "%s", sr_last_error());
    cr_assert_null(x);
    assert_msg("rank 1 does not attach");
}

/* The lines of ranks that do not attach are another host's business: the
 * barrier does not wait for them and nothing in them is read (here they are
 * garbage that the transport would refuse in a local rank's line). */
Test(partial_attach, the_start_barrier_counts_only_attaching_ranks_and_ignores_the_other_lines, .fini = drop_segment)
{
    make_partial(4, (const uint8_t[]){0, 0, 1, 0});
    for (int r = 0; r < 4; r += r == 1 ? 2 : 1) {
        struct sr_worker_info *w = sr__seg_worker(&seg, r);
        w->doorbell_kind = 77;
        w->eventfd = 1;
        w->pid = 1;
        memset(w->name, 'x', sizeof(w->name));
    }
    sr_xport *x;
    cr_assert_eq(attach_as(2, START_NS, &x), 0, "%s", sr_last_error());
    cr_assert_eq(x->nlocal, 1);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(sr__xport_local(x, r), r == 2, "rank %d", r);
        if (r != 2)
            cr_assert(!x->peers[r].inbox && !x->peers[r].name[0], "rank %d's line was read", r);
    }
    cr_assert_str_eq(x->peers[2].name, "worker2");
    sr_msg m = {.type = 3};
    cr_assert_eq(sr_xport_send(x, 0, &m), -EINVAL);
    assert_msg("destination rank 0 does not attach");
    cr_assert_eq(sr__xport_probe(x, 3), -EINVAL);
    cr_assert_eq(sr_xport_send(x, 2, &m), 0, "%s", sr_last_error());
    cr_assert_eq(sr__xport_recv_burst(x, &m, 1), 1);
    sr__xport_detach(x);
}

/* Attach as `rank` `times` times, after delay_ms, in a child process, and
 * detach each time; its exit status says how it went (0: every attach
 * worked). */
static pid_t attach_in_child(int rank, int times, int delay_ms)
{
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        struct timespec d = {.tv_sec = delay_ms / 1000, .tv_nsec = (long)(delay_ms % 1000) * 1000000};
        while (delay_ms && nanosleep(&d, &d) && errno == EINTR)
            ;
        for (int i = 0; i < times; i++) {
            sr_xport *x;
            if (attach_as(rank, START_NS, &x)) {
                fprintf(stderr, "child rank %d: %s\n", rank, sr_last_error());
                _exit(1);
            }
            sr__xport_detach(x);
        }
        _exit(0);
    }
    return pid;
}

/* Two of four ranks attach, twice each (init -> shutdown -> init): round r
 * waits for r * 2 arrivals, not r * 4 (that would time out). */
Test(partial_attach, re_attach_rounds_count_attaching_ranks_only, .fini = drop_segment)
{
    make_partial(4, (const uint8_t[]){0, 1, 0, 1});
    pid_t child = attach_in_child(3, 2, 0);
    for (int i = 0; i < 2; i++) {
        sr_xport *x;
        cr_assert_eq(attach_as(1, START_NS, &x), 0, "attach %d: %s", i + 1, sr_last_error());
        sr__xport_detach(x);
    }
    int st;
    cr_assert_eq(waitpid(child, &st, 0), child);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child's attaches failed (status 0x%x)", st);
}

/* A rank that never comes: the error lists the missing attaching ranks, not
 * the ranks of other hosts. */
Test(partial_attach, a_missing_rank_is_named_and_other_hosts_are_not, .fini = drop_segment)
{
    make_partial(4, (const uint8_t[]){1, 0, 0, 1});
    sr_xport *x;
    cr_assert_eq(attach_as(0, 200ll * 1000000, &x), -ETIMEDOUT, "%s", sr_last_error());
    assert_msg("ranks [3] never attached");
}

/* The MPI bootstrap makes a new segment on each sr_init: a process's first
 * attach to a new segment is round 1 there, whatever it attached before. */
Test(partial_attach, an_attach_to_a_new_segment_starts_a_new_round)
{
    for (int i = 0; i < 2; i++) {
        make_partial(2, (const uint8_t[]){1, 0});
        sr_xport *x;
        cr_assert_eq(attach_as(0, START_NS, &x), 0, "segment %d: %s", i + 1, sr_last_error());
        sr__xport_detach(x);
        sr__segment_detach(&seg, true);
    }
    sr_test_no_leaks();
}

/* A large job starts slowly: the start barrier's bound counts from the
 * latest arrival, not from the waiter's own. Rank 0 waits with a 3 s bound;
 * rank 1 comes about 1.5 s later, rank 2 about 3.1 s later (more than the
 * bound after rank 0, less after rank 1). This is the one test here that
 * must let time pass: what it checks is a timeout. */
Test(start_barrier, its_bound_counts_from_the_latest_arrival, .fini = drop_segment)
{
    make_partial(3, (const uint8_t[]){1, 1, 1});
    pid_t one = attach_in_child(1, 1, 1500), two = attach_in_child(2, 1, 3100);
    sr_xport *x;
    int rc = attach_as(0, 3000ll * 1000000, &x);
    cr_expect_eq(rc, 0, "rank 0: %s", sr_last_error());
    if (!rc)
        sr__xport_detach(x);
    for (int i = 0; i < 2; i++) {
        int st;
        pid_t child = i ? two : one;
        cr_assert_eq(waitpid(child, &st, 0), child);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d's attach failed (status 0x%x)", i + 1, st);
    }
}
