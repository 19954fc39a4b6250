/* The heap when a worker's process is replaced (heap.h, "Areas").
 *
 * Suite heap_replace: the parent attaches as rank 0 of a two-rank segment;
 * a forked child attaches as rank 1, allocates stamped blocks, hands
 * references to the parent through a shared page and is SIGKILLed. The
 * parent quarantines the dead area; a new child attaches as rank 1 of the
 * next generation and must get a fresh area: its blocks never overlap the
 * dead area, the parent's blocks keep their contents, and the parent's last
 * unrefs of dead-area blocks go onto the dead area's list (no dead arena is
 * touched). Then: a full pool is -ENOSPC naming the rank and the quarantined
 * areas; two replacements racing for one spare never share it; 100
 * replacements with reclaim leave the memfd no bigger; a detach with live
 * blocks quarantines, one without frees the area.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "error.h"
#include "heap.h"
#include "segment.h"

LEAK_CHECKED_SUITE(heap_replace);

#include "heap_stamp.h"

#define NBLK 6
#define WAIT_MS 20000

/* The page a child hands its blocks over on (MAP_SHARED, made before fork). */
struct handover {
    int rc;                /* the child's attach result */
    char err[256];         /* its sr_last_error() when rc < 0 */
    uint64_t off[NBLK];    /* the blocks, one reference each for the parent */
    uint64_t stamp;
    uint32_t kept;         /* blocks [0, kept) the child also keeps a reference to (the dead's own) */
};

static const size_t sizes[NBLK] = {64, 1000, 100000, 3 * MiB + 5, 9 * MiB, 200};

static sr_segment seg;
static struct handover *ho;

static void setup(int spares)
{
    sr_segment_opts o = {.world_size = 2, .size = seg_size_for(2, 16 * MiB), .name = test_ns("heaprepl"),
                         .heap_spares = spares};
    cr_assert_eq(sr__segment_create(&o, &seg), 0, "%s", sr_last_error());
    cr_assert_eq(sr__heap_attach(&seg, 0), 0, "%s", sr_last_error());
    ho = mmap(NULL, sizeof(*ho), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(ho, MAP_FAILED);
}

static void teardown(void)
{
    sr__heap_detach();
    sr__segment_detach(&seg, true);
    munmap(ho, sizeof(*ho));
}

/* Child: attach as rank 1 generation gen, allocate and stamp the blocks,
 * hand them over, say so on fd, then wait to be killed. */
static void child(uint32_t gen, int fd, uint64_t stamp)
{
    memset(ho, 0, sizeof(*ho));
    ho->rc = sr__heap_attach_gen(&seg, 1, gen);
    if (ho->rc == 0) {
        ho->stamp = stamp;
        ho->kept = NBLK / 2;
        for (int i = 0; i < NBLK; i++) {
            sr_block *b = sr__block_alloc(sizes[i]);
            if (!b) {
                ho->rc = -ENOMEM;
                break;
            }
            fill(b, stamp + (uint64_t)i);
            if ((uint32_t)i < ho->kept)
                sr__block_ref(b); /* one for us, one for the parent */
            ho->off[i] = sr__block_to_off(b);
        }
    }
    if (ho->rc < 0)
        snprintf(ho->err, sizeof(ho->err), "%s", sr_last_error());
    char c = 1;
    if (write(fd, &c, 1) != 1)
        _exit(3);
    for (;;)
        pause();
}

/* Fork a child for generation gen; wait (bounded) until it handed over. */
static pid_t spawn(uint32_t gen, uint64_t stamp)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed assertion in the parent leaves no child behind */
        close(p[0]);
        child(gen, p[1], stamp);
    }
    close(p[1]);
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    int n = poll(&pf, 1, WAIT_MS);
    char c = 0;
    cr_assert(n == 1 && read(p[0], &c, 1) == 1, "child of generation %u did not hand over within %d ms", gen, WAIT_MS);
    close(p[0]);
    return pid;
}

static void kill_child(pid_t pid)
{
    int status = 0;
    cr_assert_eq(kill(pid, SIGKILL), 0);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status 0x%x", status);
}

static bool in_area(uint64_t off, int a)
{
    uint64_t lo = seg.heap_off + (uint64_t)a * seg.heap_stride;
    return off >= lo && off < lo + seg.heap_stride;
}

/* The blocks the child handed over, validated and checked. */
static void take(sr_block **b, int area)
{
    cr_assert_eq(ho->rc, 0, "child attach: %s", ho->err);
    for (int i = 0; i < NBLK; i++) {
        b[i] = sr__block_from_off(ho->off[i]);
        cr_assert_not_null(b[i], "block %d: %s", i, sr_last_error());
        cr_assert(in_area(ho->off[i], area), "block %d at %llu is not in area %d", i,
                  (unsigned long long)ho->off[i], area);
        cr_assert_eq(sr__block_owner(b[i]), 1);
        cr_assert_eq(first_bad(b[i], ho->stamp + (uint64_t)i), -1, "block %d arrived unstamped", i);
    }
}

static int dead_area(uint32_t gen)
{
    int a = sr__heap_area_find(&seg, 1, gen);
    cr_assert_geq(a, 0, "%s", sr_last_error());
    cr_assert_eq(sr__heap_area_quarantine(&seg, a), 0, "%s", sr_last_error());
    sr_heap_area st;
    cr_assert_eq(sr__heap_area_get(&seg, a, &st), 0);
    cr_assert_eq(st.state, SR_AREA_QUARANTINED);
    cr_assert(st.rank == 1 && st.gen == gen, "area %d: rank %d generation %u", a, st.rank, st.gen);
    return a;
}

/* Regression: a second process attaching as rank 1 emptied rank 1's area
 * (MADV_REMOVE) under the blocks the parent still held from the first one,
 * which then read as zeros. */
Test(heap_replace, replacement_gets_a_fresh_area_and_old_blocks_survive, .timeout = 60)
{
    setup(0);
    sr_block *old[NBLK], *fresh[NBLK];
    pid_t pid = spawn(1, 1000);
    take(old, 1);
    uint64_t old_stamp = ho->stamp;
    kill_child(pid);
    int dead = dead_area(1);
    cr_assert_eq(dead, 1, "rank 1's first process had area 1");

    pid = spawn(2, 2000);
    take(fresh, 2); /* the first spare */
    for (int i = 0; i < NBLK; i++) {
        cr_assert_eq(first_bad(old[i], old_stamp + (uint64_t)i), -1,
                     "block %d of the dead process lost its contents when generation 2 attached", i);
        cr_assert(!in_area(ho->off[i], dead), "generation 2 allocated inside the dead area");
    }
    /* The last references to the dead area's blocks: onto its list, never
     * into its (dead) arena. The ones the dead process kept stay live. */
    uint64_t last = 0;
    for (int i = 0; i < NBLK; i++) {
        uint32_t refs = sr__block_refcount(old[i]);
        cr_assert_eq(refs, (uint32_t)i < ho->kept ? 0u + 2 : 1u, "block %d: refcount %u", i, refs);
        if (refs == 1)
            last = sr__block_to_off(old[i]);
        sr__block_unref(old[i]);
    }
    sr_heap_area st;
    cr_assert_eq(sr__heap_area_get(&seg, dead, &st), 0);
    cr_assert_eq(st.state, SR_AREA_QUARANTINED);
    cr_assert_eq(st.remote_free, last, "the last unref went onto the dead area's list");
    cr_assert_eq(sr__heap_drain(), 0, "the parent drains only its own area");
    for (int i = 0; i < NBLK; i++)
        sr__block_unref(fresh[i]); /* generation 2's blocks: onto area 2's list */
    kill_child(pid);
    teardown();
}

/* A full pool: no FREE area is -ENOSPC naming the rank and the quarantine. */
Test(heap_replace, full_pool_is_enospc_naming_the_rank, .timeout = 60)
{
    setup(1);
    cr_assert_eq(seg.heap_areas, 3u);
    sr_block *b[NBLK];
    for (uint32_t gen = 1; gen <= 2; gen++) {
        pid_t pid = spawn(gen, gen * 100);
        take(b, gen == 1 ? 1 : 2);
        for (int i = 0; i < NBLK; i++)
            sr__block_unref(b[i]);
        kill_child(pid);
        dead_area(gen);
    }
    pid_t pid = spawn(3, 300);
    cr_assert_eq(ho->rc, -ENOSPC, "attach with every area quarantined returned %d", ho->rc);
    cr_assert(strstr(ho->err, "rank 1 generation 3") && strstr(ho->err, "2 quarantined"), "%s", ho->err);
    kill_child(pid);
    teardown();
}

static uint32_t areas_not_free(void)
{
    uint32_t n = 0;
    for (uint32_t a = 0; a < seg.heap_areas; a++) {
        sr_heap_area st;
        cr_assert_eq(sr__heap_area_get(&seg, (int)a, &st), 0);
        n += st.state != SR_AREA_FREE;
    }
    return n;
}

/* 100 replacements: the dead area is reclaimed once the parent (the only
 * survivor) released its references, so neither the areas in use nor the
 * memory the memfd holds grow. */
Test(heap_replace, hundred_replacements_do_not_grow, .timeout = 120)
{
    setup(1);
    uint64_t first = 0;
    sr_block *b[NBLK];
    for (uint32_t gen = 1; gen <= 100; gen++) {
        pid_t pid = spawn(gen, gen * 1000);
        cr_assert_eq(ho->rc, 0, "generation %u: %s", gen, ho->err);
        int a = sr__heap_area_find(&seg, 1, gen);
        take(b, a);
        kill_child(pid);
        cr_assert_eq(dead_area(gen), a);
        for (int i = 0; i < NBLK; i++)
            sr__block_unref(b[i]);
        sr_heap_area st;
        cr_assert_eq(sr__heap_area_get(&seg, a, &st), 0);
        cr_assert_neq(st.remote_free, 0, "generation %u: the parent's last unrefs are on the dead area's list", gen);
        cr_assert_eq(sr__heap_area_reclaim(&seg, a), 0, "%s", sr_last_error());
        cr_assert_eq(sr__heap_area_get(&seg, a, &st), 0);
        cr_assert(st.state == SR_AREA_FREE && st.remote_free == 0, "generation %u: area %d reclaimed to state %u, "
                  "list %llu", gen, a, st.state, (unsigned long long)st.remote_free);
        cr_assert_eq(areas_not_free(), 1u, "generation %u: only the parent's area is in use", gen);
        uint64_t bytes = memfd_bytes(seg.fd);
        if (gen == 1)
            first = bytes;
        cr_assert_leq(bytes, first, "generation %u: the memfd holds %llu bytes, %llu after the first", gen,
                      (unsigned long long)bytes, (unsigned long long)first);
    }
    cr_assert_eq(sr__heap_area_reclaim(&seg, 1), -EBUSY, "a FREE area is not reclaimed twice");
    teardown();
}

/* Two replacements race for the one spare: exactly one gets it, the other
 * is -ENOSPC; neither takes area 1, whose dead owner nobody quarantined yet
 * (still OWNED: its blocks may be held). */
Test(heap_replace, two_attachers_never_share_an_area, .timeout = 60)
{
    setup(1);
    sr_block *b[NBLK];
    pid_t pid = spawn(1, 100);
    take(b, 1);
    kill_child(pid); /* not quarantined */
    struct handover *res = mmap(NULL, 2 * sizeof(*res), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(res, MAP_FAILED);
    int go[2], done[2];
    cr_assert(pipe(go) == 0 && pipe(done) == 0);
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        kids[k] = fork();
        cr_assert_geq(kids[k], 0);
        if (kids[k] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            close(go[1]); /* else our own copy keeps go open */
            char c;
            struct pollfd pf = {.fd = go[0], .events = POLLIN};
            if (poll(&pf, 1, WAIT_MS) != 1) /* both start together when the parent closes go */
                _exit(4);
            res[k].rc = sr__heap_attach_gen(&seg, 1, 2 + (uint32_t)k);
            snprintf(res[k].err, sizeof(res[k].err), "%s", res[k].rc ? sr_last_error() : "");
            c = 1;
            if (write(done[1], &c, 1) != 1)
                _exit(3);
            for (;;)
                pause();
        }
    }
    close(go[1]); /* POLLHUP wakes both */
    for (int k = 0; k < 2; k++) {
        struct pollfd pf = {.fd = done[0], .events = POLLIN};
        char c;
        cr_assert(poll(&pf, 1, WAIT_MS) == 1 && read(done[0], &c, 1) == 1, "attacher %d did not finish", k);
    }
    int won = (res[0].rc == 0) + (res[1].rc == 0);
    cr_assert_eq(won, 1, "attach results %d (%s), %d (%s)", res[0].rc, res[0].err, res[1].rc, res[1].err);
    int winner = res[0].rc == 0 ? 0 : 1;
    cr_assert_eq(res[1 - winner].rc, -ENOSPC, "%s", res[1 - winner].err);
    cr_assert_eq(sr__heap_area_find(&seg, 1, 2 + (uint32_t)winner), 2, "the winner took the spare");
    cr_assert_eq(sr__heap_area_find(&seg, 1, 1), 1, "the dead owner's area is still its own");
    for (int i = 0; i < NBLK; i++) {
        cr_assert_eq(first_bad(b[i], 100 + (uint64_t)i), -1, "block %d was wiped", i);
        sr__block_unref(b[i]);
    }
    for (int k = 0; k < 2; k++)
        kill_child(kids[k]);
    close(go[0]);
    close(done[0]);
    close(done[1]);
    munmap(res, 2 * sizeof(*res));
    teardown();
}

/* Detach: with a block still live the area is quarantined (the block stays
 * readable, a new attach takes a spare); with none, it is FREE again. */
Test(heap_replace, detach_quarantines_only_with_live_blocks)
{
    setup(0);
    sr_block *b = sr__block_alloc(5000);
    cr_assert_not_null(b);
    fill(b, 7);
    sr__heap_detach();
    sr_heap_area st;
    cr_assert_eq(sr__heap_area_get(&seg, 0, &st), 0);
    cr_assert_eq(st.state, SR_AREA_QUARANTINED, "area 0 with a live block: state %u", st.state);
    cr_assert_eq(sr__heap_attach(&seg, 0), 0, "%s", sr_last_error());
    cr_assert_eq(sr__heap_area_find(&seg, 0, 1), 2, "the new attach took the first spare");
    cr_assert_eq(first_bad(b, 7), -1, "the quarantined block kept its contents");
    sr__block_unref(b); /* onto area 0's list */
    cr_assert_eq(sr__heap_area_reclaim(&seg, 0), 0, "%s", sr_last_error());
    sr__heap_detach(); /* nothing live: FREE */
    cr_assert_eq(sr__heap_area_get(&seg, 2, &st), 0);
    cr_assert_eq(st.state, SR_AREA_FREE);
    cr_assert_eq(sr__heap_attach(&seg, 0), 0, "%s", sr_last_error());
    cr_assert_eq(sr__heap_area_find(&seg, 0, 1), 0, "area 0 is FREE again and rank 0's first choice");
    teardown();
}

/* Regression (the bug as it was): a second process attaching as rank 1 with
 * sr__heap_attach emptied rank 1's area (MADV_REMOVE) under the blocks the
 * first one allocated, which the parent still held: they read as zeros. The
 * parent reads them by offset without attaching, so that only the old API
 * is used. */
Test(heap_replace, second_attach_as_a_rank_keeps_the_first_ones_blocks, .timeout = 60)
{
    sr_segment_opts o = {.world_size = 2, .size = seg_size_for(2, 16 * MiB), .name = test_ns("heaprepl2")};
    cr_assert_eq(sr__segment_create(&o, &seg), 0, "%s", sr_last_error());
    ho = mmap(NULL, sizeof(*ho), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(ho, MAP_FAILED);
    uint64_t off[NBLK], stamp = 500;
    for (int k = 0; k < 2; k++) {
        int p[2];
        cr_assert_eq(pipe(p), 0);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            ho->rc = sr__heap_attach(&seg, 1);
            for (int i = 0; ho->rc == 0 && i < NBLK; i++) {
                sr_block *b = sr__block_alloc(sizes[i]);
                fill(b, stamp + (uint64_t)i + (uint64_t)k * 100);
                ho->off[i] = sr__block_to_off(b);
            }
            if (ho->rc)
                snprintf(ho->err, sizeof(ho->err), "%s", sr_last_error());
            char c = 1;
            if (write(p[1], &c, 1) != 1)
                _exit(3);
            for (;;)
                pause();
        }
        close(p[1]);
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        char c = 0;
        cr_assert(poll(&pf, 1, WAIT_MS) == 1 && read(p[0], &c, 1) == 1, "child %d did not hand over", k);
        close(p[0]);
        cr_assert_eq(ho->rc, 0, "attach %d: %s", k, ho->err);
        if (k == 0)
            memcpy(off, ho->off, sizeof(off));
        kill(pid, SIGKILL);
        cr_assert_eq(waitpid(pid, NULL, 0), pid);
    }
    for (int i = 0; i < NBLK; i++) {
        const sr_block *b = sr__seg_ptr(&seg, off[i]);
        cr_assert_eq(sr__block_size(b), sizes[i], "block %d's header was wiped by the second attach", i);
        cr_assert_eq(first_bad(b, stamp + (uint64_t)i), -1, "block %d's data was wiped by the second attach", i);
    }
    sr__segment_detach(&seg, true);
    munmap(ho, sizeof(*ho));
}
