/* SPDX-License-Identifier: MIT */
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
static void (*child_extra)(uint32_t gen); /* run by the child right after its attach */

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
    if (ho->rc == 0 && child_extra)
        child_extra(gen);
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
            ho->off[i] = sr__block_send_off(b); /* the parent's, moved as through a message */
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
        b[i] = sr__block_recv_off(ho->off[i]);
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
     * into its (dead) arena. The ones the dead process kept stay live (they
     * do not count: it is gone). */
    uint64_t last = 0;
    sr_heap_area st;
    for (int i = 0; i < NBLK - 1; i++) {
        uint32_t refs = sr__block_refcount(old[i]);
        cr_assert_eq(refs, (uint32_t)i < ho->kept ? 0u + 2 : 1u, "block %d: refcount %u", i, refs);
        if (refs == 1)
            last = sr__block_to_off(old[i]);
        sr__block_unref(old[i]);
        cr_assert_eq(sr__heap_area_get(&seg, dead, &st), 0);
        cr_assert_eq(st.foreign, (uint64_t)(NBLK - 1 - i), "the parent's references to the dead area are counted");
    }
    cr_assert_eq(st.state, SR_AREA_QUARANTINED, "the parent still holds block %d", NBLK - 1);
    cr_assert_eq(st.remote_free, last, "the last unref went onto the dead area's list");
    cr_assert_eq(sr__heap_drain(), 0, "the parent drains only its own area");
    /* The parent's last reference to the area: it is reclaimed by that unref. */
    sr__block_unref(old[NBLK - 1]);
    cr_assert_eq(sr__heap_area_get(&seg, dead, &st), 0);
    cr_assert(st.state == SR_AREA_FREE && st.remote_free == 0 && st.foreign == 0,
              "area %d after the last foreign reference went: state %u, list %llu, foreign %llu", dead, st.state,
              (unsigned long long)st.remote_free, (unsigned long long)st.foreign);
    for (int i = 0; i < NBLK; i++)
        sr__block_unref(fresh[i]); /* generation 2's blocks: onto area 2's list */
    kill_child(pid);
    teardown();
}

/* A full pool: no FREE area is -ENOSPC naming the rank and the quarantine
 * (the parent holds blocks of both dead areas); once it lets them go, the
 * areas are FREE again and the next attach succeeds. */
Test(heap_replace, full_pool_is_enospc_naming_the_rank, .timeout = 60)
{
    setup(1);
    cr_assert_eq(seg.heap_areas, 3u);
    sr_block *b[2][NBLK];
    for (uint32_t gen = 1; gen <= 2; gen++) {
        pid_t pid = spawn(gen, gen * 100);
        take(b[gen - 1], gen == 1 ? 1 : 2);
        kill_child(pid);
        dead_area(gen);
    }
    pid_t pid = spawn(3, 300);
    cr_assert_eq(ho->rc, -ENOSPC, "attach with every area quarantined returned %d", ho->rc);
    cr_assert(strstr(ho->err, "rank 1 generation 3") && strstr(ho->err, "2 quarantined"), "%s", ho->err);
    kill_child(pid);
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < NBLK; i++)
            sr__block_unref(b[g][i]);
    pid = spawn(4, 400);
    cr_assert_eq(ho->rc, 0, "attach once the dead areas' blocks were let go: %s", ho->err);
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

/* 100 replacements: the dead area is reclaimed by the parent's (the only
 * survivor's) last unref of its blocks, with no call to reclaim, so neither
 * the areas in use nor the memory the memfd holds grow. One spare: without
 * the reclaim, generation 3 has no area. */
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
        sr_heap_area st;
        for (int i = 0; i < NBLK - 1; i++)
            sr__block_unref(b[i]);
        cr_assert_eq(sr__heap_area_get(&seg, a, &st), 0);
        cr_assert(st.state == SR_AREA_QUARANTINED && st.foreign == 1, "generation %u: with one block still held, "
                  "area %d is in state %u, foreign %llu", gen, a, st.state, (unsigned long long)st.foreign);
        cr_assert_neq(st.remote_free, 0, "generation %u: the parent's last unrefs are on the dead area's list", gen);
        sr__block_unref(b[NBLK - 1]);
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


/* ---- who holds what: the foreign count and the table of held references ---- */

#define NGIVE 4

/* What the parent gives a child, and what comes back (MAP_SHARED). */
struct holding {
    uint64_t in[NGIVE];   /* the parent's blocks, one reference each moved to the child */
    uint64_t back;        /* in[NGIVE - 1], moved back to the parent by the child */
    uint64_t held, lost;  /* the child's table, as it sees it */
    uint32_t nmany;       /* the child also takes a reference to each of many[0, nmany) */
    uint64_t many[];      /* offsets of the parent's blocks */
};
static struct holding *hd;
static size_t hd_len;

/* Child (child_extra): take the parent's references, one more of in[0],
 * move in[NGIVE - 1] back, take one of each of many[]. */
static void hold_parents(uint32_t gen)
{
    sr_block *in[NGIVE];
    for (int i = 0; i < NGIVE; i++)
        in[i] = sr__block_recv_off(hd->in[i]);
    sr__block_ref(in[0]);
    hd->back = sr__block_send_off(in[NGIVE - 1]);
    for (uint32_t i = 0; i < hd->nmany; i++)
        sr__block_ref(sr__block_from_off(hd->many[i])); /* a look, then a reference of our own */
    (void)sr__heap_area_held(&seg, sr__heap_area_find(&seg, 1, gen), &hd->held, &hd->lost);
}

static void holding_setup(uint32_t nmany)
{
    setup(0);
    hd_len = sizeof(*hd) + nmany * sizeof(uint64_t);
    hd = mmap(NULL, hd_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(hd, MAP_FAILED);
    hd->nmany = nmany;
    child_extra = hold_parents;
}

static void holding_teardown(void)
{
    child_extra = NULL;
    munmap(hd, hd_len);
    teardown();
}

static uint64_t foreign_of_area(int a)
{
    sr_heap_area st;
    cr_assert_eq(sr__heap_area_get(&seg, a, &st), 0);
    return st.foreign;
}

/* The parent's blocks a child held are counted (area 0's foreign count:
 * the child's references and those in messages) and listed (the child's
 * table); the child's death drops them, so the parent's blocks are freed
 * to the parent when it lets its own go, and its heap returns to its
 * baseline. Regression: the dead's references were never dropped. */
Test(heap_replace, what_the_dead_held_of_a_survivor_is_let_go, .timeout = 60)
{
    holding_setup(0);
    size_t base = sr__heap_allocated();
    sr_block *mine[NGIVE];
    for (int i = 0; i < NGIVE; i++) {
        mine[i] = sr__block_alloc(sizes[i]);
        cr_assert_not_null(mine[i]);
        fill(mine[i], 70 + (uint64_t)i);
        hd->in[i] = sr__block_send_off(sr__block_ref(mine[i])); /* one for the child, in "a message" */
    }
    cr_assert_eq(foreign_of_area(0), NGIVE, "references in messages count");
    pid_t pid = spawn(1, 100);
    cr_assert_eq(ho->rc, 0, "%s", ho->err);
    /* The child holds in[0] twice, in[1], in[2]; in[3] is in a message back. */
    cr_assert_eq(foreign_of_area(0), NGIVE + 1, "the child's references and the one in flight back");
    cr_assert_eq(hd->held, NGIVE, "the child's table lists what it holds of ours, not what it sent");
    cr_assert_eq(hd->lost, 0);
    sr_block *back = sr__block_recv_off(hd->back);
    cr_assert_eq(back, mine[NGIVE - 1]);
    cr_assert_eq(foreign_of_area(0), NGIVE, "back with its owner: no longer counted");
    sr__block_unref(back);
    sr_block *theirs[NBLK];
    take(theirs, 1);
    cr_assert_eq(foreign_of_area(1), NBLK, "the parent's references to the child's blocks");
    kill_child(pid);
    int dead = dead_area(1);
    cr_assert_eq(foreign_of_area(0), 0, "the dead's references to our blocks were dropped");
    for (int i = 0; i < NGIVE; i++) {
        cr_assert_eq(sr__block_refcount(mine[i]), 1u, "block %d: only our own reference is left", i);
        sr__block_unref(mine[i]);
    }
    cr_assert_eq(sr__heap_allocated(), base, "our heap is back at its baseline");
    for (int i = 0; i < NBLK; i++) {
        cr_assert_eq(first_bad(theirs[i], ho->stamp + (uint64_t)i), -1, "the dead's block %d is still readable", i);
        sr__block_unref(theirs[i]);
    }
    sr_heap_area st;
    cr_assert_eq(sr__heap_area_get(&seg, dead, &st), 0);
    cr_assert_eq(st.state, SR_AREA_FREE, "the dead area once nobody holds its blocks");
    holding_teardown();
}

/* The other order: every foreign reference went while the owner lived, so
 * the quarantine itself finds the count at 0 and reclaims, once. The next
 * generation takes the area again and its blocks are never punched by a
 * second reclaim. */
Test(heap_replace, quarantine_after_the_last_unref_reclaims_at_once, .timeout = 60)
{
    setup(0);
    sr_block *b[NBLK];
    pid_t pid = spawn(1, 100);
    take(b, 1);
    for (int i = 0; i < NBLK; i++)
        sr__block_unref(b[i]);
    cr_assert_eq(foreign_of_area(1), 0);
    sr_heap_area st;
    cr_assert_eq(sr__heap_area_get(&seg, 1, &st), 0);
    cr_assert_eq(st.state, SR_AREA_OWNED, "a living owner's area is never reclaimed");
    kill_child(pid);
    cr_assert_eq(sr__heap_area_quarantine(&seg, 1), 0, "%s", sr_last_error());
    cr_assert_eq(sr__heap_area_get(&seg, 1, &st), 0);
    cr_assert(st.state == SR_AREA_FREE && st.remote_free == 0, "state %u list %llu", st.state,
              (unsigned long long)st.remote_free);
    pid = spawn(2, 200);
    take(b, 1); /* area 1 again: FREE, rank 1's first choice */
    cr_assert_eq(sr__heap_area_reclaim(&seg, 1), -EBUSY, "generation 2's area is OWNED, not reclaimed again");
    for (int i = 0; i < NBLK; i++) {
        cr_assert_eq(first_bad(b[i], 200 + (uint64_t)i), -1, "generation 2's block %d was punched", i);
        sr__block_unref(b[i]);
    }
    kill_child(pid);
    teardown();
}

/* More distinct blocks than the table has entries: the rest are counted as
 * lost; at the death the listed ones are dropped and the lost ones leak,
 * with a warning (bounded and said, never a wrong free). */
Test(heap_replace, full_table_counts_what_it_cannot_list, .timeout = 60)
{
    enum { EXTRA = 5 };
    uint32_t n = SR_HEAP_HELD_SLOTS + EXTRA;
    holding_setup(n);
    sr_block **blk = malloc(n * sizeof(*blk));
    cr_assert_not_null(blk);
    for (uint32_t i = 0; i < n; i++) {
        blk[i] = sr__block_alloc(64);
        cr_assert_not_null(blk[i]);
        hd->many[i] = sr__block_to_off(blk[i]);
    }
    for (int i = 0; i < NGIVE; i++)
        hd->in[i] = sr__block_send_off(sr__block_alloc(64));
    pid_t pid = spawn(1, 100);
    cr_assert_eq(ho->rc, 0, "%s", ho->err);
    cr_assert_eq(hd->held + hd->lost, (uint64_t)n + NGIVE, "listed %llu, lost %llu", (unsigned long long)hd->held,
                 (unsigned long long)hd->lost);
    cr_assert_geq(hd->lost, EXTRA, "a full table counts the rest");
    sr__block_unref(sr__block_recv_off(hd->back));
    kill_child(pid);
    int dead = dead_area(1);
    uint32_t still = 0;
    for (uint32_t i = 0; i < n; i++)
        still += sr__block_refcount(blk[i]) == 2;
    cr_assert_eq(still, hd->lost, "%u blocks still held twice: the unlisted references leak, no more", still);
    cr_assert_eq(foreign_of_area(0), hd->lost, "area 0's count keeps exactly the leaked references");
    for (uint32_t i = 0; i < n; i++)
        sr__block_unref(blk[i]);
    free(blk);
    sr_block *theirs[NBLK];
    take(theirs, dead);
    for (int i = 0; i < NBLK; i++)
        sr__block_unref(theirs[i]);
    holding_teardown();
}
