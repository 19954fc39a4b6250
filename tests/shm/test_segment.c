/* SPDX-License-Identifier: MIT */
/* Segment creation and attach: every way a segment or a launch environment
 * can be wrong gives the documented -errno and a message naming the value.
 *
 * A bad segment is made by creating a valid one and then breaking one field
 * of its header (or of a copy of it, for the file-size cases). The shared-
 * memory transport's attach on such segments, and its partial attach, are
 * tests/transport/test_xport_attach.c.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "error.h"
#include "segment.h"

LEAK_CHECKED_SUITE(launch_env);
LEAK_CHECKED_SUITE(segment_create);

#define MIB (UINT64_C(1) << 20)

#include "segment_fixture.h"

/* Attach to seg.fd must fail with err and a message naming want. */
static void assert_attach_fails(int err, const char *want)
{
    sr_segment other = {.fd = -1};
    int rc = sr__segment_attach(seg.fd, &other);
    cr_assert_eq(rc, err, "attach returned %d (%s), expected %d", rc, sr_last_error(), err);
    cr_assert_null(other.base, "a failed attach left a mapping");
    assert_msg("sr__segment_attach");
    assert_msg(want);
}

TestSuite(segment_attach, .init = make_segment, .fini = drop_segment);

Test(segment_attach, a_valid_segment_attaches)
{
    sr_segment other;
    cr_assert_eq(sr__segment_attach(seg.fd, &other), 0, "%s", sr_last_error());
    cr_assert_eq(other.hdr->world_size, 2);
    cr_assert_eq(other.size, seg.size);
    sr__segment_detach(&other, false);
}

Test(segment_attach, wrong_magic_is_eproto)
{
    seg.hdr->magic = UINT64_C(0x1122334455667788);
    assert_attach_fails(-EPROTO, "magic 0x1122334455667788");
}

Test(segment_attach, wrong_layout_format_is_eproto)
{
    seg.hdr->layout_format = SR_SEG_LAYOUT_FORMAT + 6;
    char want[64];
    snprintf(want, sizeof(want), "layout format %u", SR_SEG_LAYOUT_FORMAT + 6);
    assert_attach_fails(-EPROTO, want);
}

Test(segment_attach, wrong_version_is_eproto)
{
    seg.hdr->version = SR_SEG_VERSION + 41;
    char want[64];
    snprintf(want, sizeof(want), "version %u", SR_SEG_VERSION + 41);
    assert_attach_fails(-EPROTO, want);
}

Test(segment_attach, world_size_0_is_einval)
{
    seg.hdr->world_size = 0;
    assert_attach_fails(-EINVAL, "world size 0");
}

Test(segment_attach, world_size_too_large_is_einval)
{
    seg.hdr->world_size = SR_MAX_WORKERS + 1;
    assert_attach_fails(-EINVAL, "world size 4097");
}

Test(segment_attach, ring_slots_not_a_power_of_two_is_einval)
{
    seg.hdr->ring_slots = 48;
    assert_attach_fails(-EINVAL, "inconsistent");
}

Test(segment_attach, heap_past_the_end_of_the_file_is_einval)
{
    seg.hdr->heap_stride += SR_HEAP_ALIGN;
    assert_attach_fails(-EINVAL, "inconsistent");
}

/* Regression (found by fuzz_segment): offsets and strides off the
 * alignment the creator gives them were accepted, and the worker lines
 * (atomics among their fields) were read misaligned. */
Test(segment_attach, a_misaligned_worker_table_is_einval)
{
    seg.hdr->table_off += 4;
    assert_attach_fails(-EINVAL, "table_off 4100 is misaligned");
}

Test(segment_attach, misaligned_inboxes_and_heaps_are_einval)
{
    seg.hdr->inbox_stride += SR_CACHELINE;
    assert_attach_fails(-EINVAL, "inbox_stride");
    seg.hdr->inbox_stride -= SR_CACHELINE;
    seg.hdr->heap_off += 4096;
    assert_attach_fails(-EINVAL, "heap_off");
}

Test(segment_attach, fewer_heap_areas_than_ranks_is_einval)
{
    seg.hdr->heap_areas = seg.hdr->world_size - 1;
    assert_attach_fails(-EINVAL, "inconsistent");
}

Test(segment_attach, area_table_past_the_end_of_the_file_is_einval)
{
    seg.hdr->area_off = seg.size - seg.hdr->area_stride;
    assert_attach_fails(-EINVAL, "inconsistent");
}

/* A plain memfd holding a copy of seg's header page, `size` bytes long. */
static int copy_header(uint64_t size)
{
    int fd = memfd_create(test_ns("copy"), MFD_CLOEXEC);
    cr_assert(fd >= 0, "memfd_create: %s", strerror(errno));
    cr_assert_eq(ftruncate(fd, (off_t)size), 0, "ftruncate: %s", strerror(errno));
    cr_assert_eq(pwrite(fd, seg.base, SR_SEG_HEADER_SIZE, 0), (ssize_t)SR_SEG_HEADER_SIZE, "pwrite");
    return fd;
}

static void assert_copy_fails(uint64_t size, int err, const char *want)
{
    int fd = copy_header(size);
    sr_segment other = {.fd = -1};
    int rc = sr__segment_attach(fd, &other);
    cr_assert_eq(rc, err, "attach of %llu bytes returned %d (%s)", (unsigned long long)size, rc, sr_last_error());
    assert_msg(want);
    close(fd);
}

Test(segment_attach, a_file_larger_than_the_header_says_is_einval)
{
    char want[96];
    snprintf(want, sizeof(want), "header says %llu bytes, file has %llu", (unsigned long long)seg.size,
             (unsigned long long)(seg.size + 2 * MIB));
    assert_copy_fails(seg.size + 2 * MIB, -EINVAL, want);
}

Test(segment_attach, a_file_smaller_than_the_header_says_is_einval)
{
    char want[96];
    snprintf(want, sizeof(want), "header says %llu bytes, file has %llu", (unsigned long long)seg.size,
             (unsigned long long)(seg.size - 2 * MIB));
    assert_copy_fails(seg.size - 2 * MIB, -EINVAL, want);
}

Test(segment_attach, a_file_smaller_than_a_header_is_eproto)
{
    int fd = memfd_create(test_ns("tiny"), MFD_CLOEXEC);
    cr_assert(fd >= 0);
    cr_assert_eq(ftruncate(fd, 100), 0);
    sr_segment other;
    cr_assert_eq(sr__segment_attach(fd, &other), -EPROTO, "%s", sr_last_error());
    assert_msg("100 bytes is too small");
    close(fd);
}

Test(segment_attach, an_empty_file_is_eproto)
{
    int fd = memfd_create(test_ns("empty"), MFD_CLOEXEC);
    cr_assert(fd >= 0);
    sr_segment other;
    cr_assert_eq(sr__segment_attach(fd, &other), -EPROTO, "%s", sr_last_error());
    assert_msg("0 bytes is too small");
    close(fd);
}

Test(segment_attach, a_closed_fd_is_ebadf)
{
    int fd = dup(seg.fd);
    close(fd);
    sr_segment other;
    cr_assert_eq(sr__segment_attach(fd, &other), -EBADF, "%s", sr_last_error());
    char want[32];
    snprintf(want, sizeof(want), "fd %d", fd);
    assert_msg(want);
    cr_assert_eq(sr__segment_attach(-1, &other), -EBADF, "%s", sr_last_error());
    assert_msg("fd -1");
}

/* Regression: the heap's attach read its geometry from the shared header,
 * not from the copy that sr__segment_attach validated, so a peer that
 * scribbled on the header after the attach moved (or refused) the heap
 * areas. The header is scribbled here between the segment's attach and
 * the heap's: the heap must lie where the validated geometry says. */
Test(segment_attach, the_heap_attaches_where_the_validated_header_said)
{
    sr_segment other;
    cr_assert_eq(sr__segment_attach(seg.fd, &other), 0, "%s", sr_last_error());
    seg.hdr->heap_stride *= 2;
    seg.hdr->heap_off += SR_HEAP_ALIGN;
    seg.hdr->area_off = 0;
    seg.hdr->world_size = 1;
    cr_assert_eq(sr__heap_attach(&other, 1), 0, "the heap refused the validated segment: %s", sr_last_error());
    sr_block *b = sr__block_alloc(64);
    cr_assert_not_null(b, "%s", sr_last_error());
    uint64_t off = sr__block_to_off(b), lo = other.heap_off + other.heap_stride, hi = lo + other.heap_stride;
    cr_assert(off >= lo && off < hi, "a block of rank 1 at offset %#llx, outside its area [%#llx, %#llx)",
              (unsigned long long)off, (unsigned long long)lo, (unsigned long long)hi);
    sr__block_unref(b);
    sr__heap_detach();
    sr__segment_detach(&other, false);
}

/* Regression: messages named the segment with the header's name, which a
 * scribbling peer (or a foreign creator) may leave unterminated; printed
 * with %s it ran on into the next fields. The name is copied at attach,
 * terminated, and only the copy is printed. */
Test(segment_attach, an_unterminated_name_is_printed_bounded)
{
    memset(seg.hdr->name, 'n', sizeof(seg.hdr->name));
    sr_segment other;
    cr_assert_eq(sr__segment_attach(seg.fd, &other), 0, "%s", sr_last_error());
    char want[sizeof(seg.hdr->name) + 3] = "'";
    memset(want + 1, 'n', sizeof(seg.hdr->name));
    strcat(want, "'");
    cr_assert_eq(strlen(other.name), sizeof(seg.hdr->name), "the name's copy: '%s'", other.name);
    cr_assert_eq(sr__heap_attach(&other, 0), 0, "%s", sr_last_error());
    cr_assert_eq(sr__heap_attach(&other, 1), -EBUSY, "%s", sr_last_error());
    assert_msg(want); /* "... of segment 'nnn...n'; detach first" */
    sr__heap_detach();
    sr__segment_detach(&other, false);
}

/* sr__segment_create's option checks. */
static void assert_create_fails(sr_segment_opts o, const char *want)
{
    sr_segment s = {.fd = -1};
    o.name = test_ns("bad");
    int rc = sr__segment_create(&o, &s);
    cr_assert_eq(rc, -EINVAL, "sr__segment_create returned %d (%s), expected -EINVAL", rc, sr_last_error());
    cr_assert_null(s.base, "a failed create left a mapping");
    assert_msg("sr__segment_create");
    assert_msg(want);
}

Test(segment_create, world_size_0) { assert_create_fails((sr_segment_opts){.world_size = 0}, "world size 0"); }
Test(segment_create, world_size_negative) { assert_create_fails((sr_segment_opts){.world_size = -3}, "world size -3"); }
Test(segment_create, world_size_too_large)
{
    assert_create_fails((sr_segment_opts){.world_size = SR_MAX_WORKERS + 1}, "world size 4097");
}
Test(segment_create, ring_slots_not_a_power_of_two)
{
    assert_create_fails((sr_segment_opts){.world_size = 2, .ring_slots = 1000}, "ring size 1000");
}
Test(segment_create, ring_slots_1) { assert_create_fails((sr_segment_opts){.world_size = 2, .ring_slots = 1}, "ring size 1"); }
Test(segment_create, size_too_small_for_the_workers)
{
    uint64_t need = sr__segment_fixed_size(3, 64) + 3 * SR_HEAP_MIN;
    char want[96];
    snprintf(want, sizeof(want), "size %llu bytes is too small for 3 workers (need at least %llu",
             (unsigned long long)(need - 1), (unsigned long long)need);
    assert_create_fails((sr_segment_opts){.world_size = 3, .ring_slots = 64, .size = need - 1}, want);
}

Test(segment_create, the_smallest_size_is_accepted)
{
    uint64_t need = sr__segment_fixed_size(3, 64) + 3 * SR_HEAP_MIN;
    sr_segment s;
    sr_segment_opts o = {.world_size = 3, .ring_slots = 64, .size = need, .name = test_ns("min")};
    cr_assert_eq(sr__segment_create(&o, &s), 0, "%s", sr_last_error());
    cr_assert_geq(s.hdr->heap_stride, SR_HEAP_MIN, "heap stride %llu", (unsigned long long)s.hdr->heap_stride);
    sr__segment_detach(&s, true);
}

/* The spare heap areas come on top of size, heap_stride bytes each, and the
 * area table after them; every area starts FREE. */
static void assert_spares(int world, int spares, uint32_t want)
{
    uint64_t need = sr__segment_fixed_size(world, 64) + (uint64_t)world * SR_HEAP_MIN;
    sr_segment s;
    sr_segment_opts o = {.world_size = world, .ring_slots = 64, .size = need, .name = test_ns("spares"),
                         .heap_spares = spares};
    cr_assert_eq(sr__segment_create(&o, &s), 0, "%s", sr_last_error());
    cr_assert_eq(s.heap_areas, (uint32_t)world + want, "spares %d: %u areas", spares, s.heap_areas);
    cr_assert_eq(s.heap_stride, SR_HEAP_MIN, "the ranks' heaps keep their size");
    cr_assert_geq(s.area_off, s.heap_off + s.heap_areas * s.heap_stride);
    cr_assert_geq(s.size, s.area_off + s.heap_areas * s.area_stride);
    for (uint32_t a = 0; a < s.heap_areas; a++)
        cr_assert_eq(atomic_load(&sr__seg_area(&s, (int)a)->state), 0, "area %u not FREE", a);
    sr_segment other;
    cr_assert_eq(sr__segment_attach(s.fd, &other), 0, "%s", sr_last_error());
    cr_assert_eq(other.heap_areas, s.heap_areas);
    sr__segment_detach(&other, false);
    sr__segment_detach(&s, true);
}

Test(segment_create, spare_heap_areas)
{
    assert_spares(3, 0, 3);   /* default: one per rank */
    assert_spares(3, -1, 0);  /* none */
    assert_spares(2, 5, 5);
    assert_spares(100, 0, SR_HEAP_SPARES_DEFAULT_MAX);
    assert_create_fails((sr_segment_opts){.world_size = 2, .heap_spares = SR_MAX_WORKERS + 1}, "spare heap areas");
}

/* An elastic segment (segment.h, "Elastic jobs", E1): the ranks past the
 * launched ones read as exits of free ranks, counted in header.exits, and
 * the header's launched count is checked at attach. */
Test(segment_create, elastic_free_ranks)
{
    uint64_t need = sr__segment_fixed_size(4, 64) + 4 * SR_HEAP_MIN;
    sr_segment s;
    sr_segment_opts o = {.world_size = 4, .ring_slots = 64, .size = need, .name = test_ns("elastic"),
                         .flags = SR_SEG_F_ELASTIC, .launched = 2};
    cr_assert_eq(sr__segment_create(&o, &s), 0, "%s", sr_last_error());
    cr_assert_eq(s.launched, 2);
    cr_assert_eq(atomic_load(&s.hdr->exits), 2, "the free ranks' exits are counted");
    char how[128];
    for (int r = 0; r < 4; r++) {
        struct sr_worker_info *w = sr__seg_worker(&s, r);
        cr_assert_eq(atomic_load(&w->exited), r >= 2, "rank %d exited %u", r, atomic_load(&w->exited));
        if (r >= 2)
            cr_assert_str_eq(sr__seg_exit_text(w, how, sizeof(how)), "is free: no worker has joined it");
    }
    sr_segment other;
    cr_assert_eq(sr__segment_attach(s.fd, &other), 0, "%s", sr_last_error());
    cr_assert_eq(other.launched, 2);
    sr__segment_detach(&other, false);
    s.hdr->launched = 5; /* more than the world */
    cr_assert_eq(sr__segment_attach(s.fd, &other), -EINVAL);
    assert_msg("5 ranks launched of 4");
    s.hdr->launched = 2;
    s.hdr->flags = 0; /* fewer launched than the world, in a job that is not elastic */
    cr_assert_eq(sr__segment_attach(s.fd, &other), -EINVAL);
    assert_msg("in a non-elastic job");
    sr__segment_detach(&s, true);
    assert_create_fails((sr_segment_opts){.world_size = 4, .launched = 2}, "but the job is not elastic");
    assert_create_fails((sr_segment_opts){.world_size = 4, .launched = 5, .flags = SR_SEG_F_ELASTIC},
                        "5 ranks launched of 4");
}

static void assert_env_fails(int err, const char *want)
{
    struct sr_launch_env e;
    int rc = sr__launch_env_get(&e);
    cr_assert_eq(rc, err, "sr__launch_env_get returned %d (%s), expected %d", rc, sr_last_error(), err);
    assert_msg(want);
}

Test(launch_env, fd_unset_is_enoent)
{
    set_env(NULL, "0", "2");
    assert_env_fails(-ENOENT, "SHMRPC_FD is not set");
}
Test(launch_env, fd_garbage)
{
    set_env("abc", "0", "2");
    assert_env_fails(-EINVAL, "SHMRPC_FD=\"abc\"");
}
Test(launch_env, fd_trailing_garbage)
{
    set_env("7x", "0", "2");
    assert_env_fails(-EINVAL, "SHMRPC_FD=\"7x\"");
}
Test(launch_env, fd_negative)
{
    set_env("-1", "0", "2");
    assert_env_fails(-EINVAL, "SHMRPC_FD=\"-1\"");
}
Test(launch_env, fd_out_of_range)
{
    set_env("99999999999", "0", "2");
    assert_env_fails(-EINVAL, "SHMRPC_FD=\"99999999999\"");
}
Test(launch_env, world_size_0)
{
    set_env("5", "0", "0");
    assert_env_fails(-EINVAL, "SHMRPC_WORLD_SIZE=\"0\"");
}
Test(launch_env, world_size_missing)
{
    set_env("5", "0", NULL);
    assert_env_fails(-EINVAL, "missing");
}
Test(launch_env, rank_equal_to_world_size)
{
    set_env("5", "4", "4");
    assert_env_fails(-EINVAL, "SHMRPC_RANK=\"4\"");
}
Test(launch_env, rank_missing)
{
    set_env("5", NULL, "4");
    assert_env_fails(-EINVAL, "missing");
}
Test(launch_env, valid_values_are_returned)
{
    set_env("5", "3", "4");
    struct sr_launch_env e;
    cr_assert_eq(sr__launch_env_get(&e), 0, "%s", sr_last_error());
    cr_assert(e.fd == 5 && e.rank == 3 && e.world_size == 4, "got fd %d rank %d world %d", e.fd, e.rank, e.world_size);
}
Test(launch_env, sr_spawn_values_win_over_the_environment)
{
    set_env("abc", NULL, NULL);
    sr__launch_env_set(&(struct sr_launch_env){.fd = 9, .rank = 1, .world_size = 2});
    struct sr_launch_env e;
    cr_assert_eq(sr__launch_env_get(&e), 0, "%s", sr_last_error());
    cr_assert(e.fd == 9 && e.rank == 1 && e.world_size == 2, "got fd %d rank %d world %d", e.fd, e.rank, e.world_size);
}

/* ---- partial attach (segment.h): only the marked ranks attach ---------- */

LEAK_CHECKED_SUITE(partial_attach);

/* A segment for `world` workers of which those with mask[r] attach. */
static void make_partial(int world, const uint8_t *mask)
{
    sr_segment_opts o = {.world_size = world, .ring_slots = 64, .name = test_ns("part"), .attaching = mask};
    o.size = sr__segment_fixed_size(world, 64) + (uint64_t)world * SR_HEAP_MIN;
    cr_assert_eq(sr__segment_create(&o, &seg), 0, "sr__segment_create: %s", sr_last_error());
}

Test(partial_attach, the_header_counts_and_the_lines_mark_the_attaching_ranks, .fini = drop_segment)
{
    make_partial(5, (const uint8_t[]){0, 1, 0, 1, 1});
    cr_assert_eq(seg.hdr->attaching, 3, "header count %u", seg.hdr->attaching);
    for (int r = 0; r < 5; r++)
        cr_assert_eq(sr__seg_attaches(&seg, r), r == 1 || r >= 3, "rank %d", r);
    cr_assert(!sr__seg_attaches(&seg, -1) && !sr__seg_attaches(&seg, 5), "out of range ranks attach nowhere");
    sr_segment other;
    cr_assert_eq(sr__segment_attach(seg.fd, &other), 0, "%s", sr_last_error());
    cr_assert_eq(other.attaching, 3);
    sr__segment_detach(&other, false);
}

Test(partial_attach, without_a_mask_every_rank_attaches, .init = make_segment, .fini = drop_segment)
{
    cr_assert_eq(seg.hdr->attaching, 2);
    cr_assert(sr__seg_attaches(&seg, 0) && sr__seg_attaches(&seg, 1));
}

Test(partial_attach, a_mask_with_no_rank_is_einval)
{
    assert_create_fails((sr_segment_opts){.world_size = 3, .attaching = (const uint8_t[]){0, 0, 0}},
                        "no rank of 3 attaches");
}

Test(partial_attach, a_flag_other_than_0_or_1_is_einval, .fini = drop_segment)
{
    make_partial(3, (const uint8_t[]){1, 0, 1});
    sr__seg_worker(&seg, 1)->attaches = 2;
    assert_attach_fails(-EINVAL, "the worker line of rank 1 says attaches = 2");
}

Test(partial_attach, a_count_that_disagrees_with_the_lines_is_einval, .fini = drop_segment)
{
    make_partial(3, (const uint8_t[]){1, 0, 1});
    seg.hdr->attaching = 3;
    assert_attach_fails(-EINVAL, "the header says 3 ranks attach, the worker lines say 2");
}
