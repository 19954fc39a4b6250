/* SPDX-License-Identifier: MIT */
/* The fuzzer's in-process world. See fuzz_env.h. */
#include "fuzz_env.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "context.h"
#include "error.h"
#include "heap.h"
#include "job.h"
#include "codec.h"
#include "inflight.h"
#include "hooks.h"
#include "ring.h"
#include "segment.h"
#include "shmrpc/rpc.h"
#include "shmrpc/rref.h"
#include "tensor_impl.h"

struct fz_env fz;

/* Every fixture block: the tensors' storages (the transpose shares the
 * first), then the payload block. */
#define FZ_NBLOCKS (FZ_NTENSORS + 1)
static sr_block *blocks[FZ_NBLOCKS];
static uint64_t offs[FZ_NBLOCKS];
static int nblocks;
static sr_segment seg;
static sr_rref *owner_rref; /* this input's OwnerRRef (rref id 0, forked once: fork id 1) */
static sr_dctx *dctx;       /* this input's distributed autograd context */
static sr_rref *user_rref;  /* this input's UserRRef of rank 1's rref (1,5), forked once: child (0,2) */

#define MARK_BLOCK(i) (UINT64_C(0xF0F0B10C00000000) | (uint64_t)(i))
#define MARK_OBJECT UINT64_C(0xF0F00B1EC7000000)
#define MARK_PID UINT32_C(0xF0F0D1D0)

static void die(const char *what)
{
    fprintf(stderr, "fuzz_env: %s: %s\n", what, sr_last_error());
    exit(1);
}

static sr_tensor *counting(sr_dtype dt, int nd, const int64_t *shape)
{
    sr_tensor *t = sr_empty(dt, nd, shape, 0);
    if (!t)
        die("sr_empty");
    size_t n = sr_tensor_numel(t);
    void *p = sr_tensor_mutable_data(t);
    for (size_t i = 0; i < n; i++) {
        if (dt == SR_F32)
            ((float *)p)[i] = (float)i + 0.5f;
        else if (dt == SR_F64)
            ((double *)p)[i] = (double)i + 0.5;
        else
            ((int64_t *)p)[i] = (int64_t)i;
    }
    return t;
}

static void add_block(sr_block *b)
{
    for (int i = 0; i < nblocks; i++)
        if (blocks[i] == b)
            return;
    blocks[nblocks] = b;
    offs[nblocks++] = sr__block_to_off(b);
}

static void top_up(void)
{
    for (int i = 0; i < nblocks; i++)
        while (sr__block_refcount(blocks[i]) < FZ_BLOCK_REFS) /* references messages carry (heap.h) */
            sr__block_send_off(sr__block_ref(blocks[i]));
}

static void nop_destroy(void *p) { (void)p; }

/* Fixtures in whichever heap this process has attached. */
static void fixtures(void)
{
    fz.tensors[0] = counting(SR_F32, 2, (int64_t[]){2, 3});
    fz.tensors[1] = sr_t(fz.tensors[0]);
    fz.tensors[2] = counting(SR_F64, 1, (int64_t[]){4});
    if (fz.tensors[2])
        fz.tensors[2]->requires_grad = true; /* a leaf: received, it gets a recv function */
    fz.tensors[3] = counting(SR_I64, 2, (int64_t[]){3, 2});
    for (int i = 0; i < FZ_NTENSORS; i++) {
        if (!fz.tensors[i])
            die("a fixture tensor");
        add_block(fz.tensors[i]->storage->block);
    }
    sr_block *p = sr__block_alloc(FZ_PAYLOAD_BYTES);
    if (!p)
        die("sr__block_alloc");
    add_block(p);
    fz.payload_off = sr__block_to_off(p);
    top_up();
    fz.object = sr_object(&fz, nop_destroy, "Net");
    if (!fz.object)
        die("sr_object");
}

void fz_env_init(void)
{
    char name[40];
    snprintf(name, sizeof(name), "fuzz-%d", (int)getpid());
    sr_segment_opts o = {.world_size = 1, .size = sr__segment_fixed_size(1, 0) + (64u << 20), .name = name};
    if (sr__segment_create(&o, &seg))
        die("sr__segment_create");
    if (sr__heap_attach(&seg, 0))
        die("sr__heap_attach");
    fixtures();
}

static void fork_once(sr_rref *r);

/* The agent's OwnerRRef (0,0): the sum of the f64 fixture, a scalar that
 * requires grad, so that an RRef backward request naming it runs a real
 * backward pass (dist_autograd/rref_backward.c). Held for the process's
 * life, and forked twice (fork ids (0,1) and (0,2)), as sending it to
 * itself would: a message naming fork (0,1) arrives as that send, the
 * other fork keeps the owner in the RRef context after it. */
static void agent_owner_rref(void)
{
    static sr_rref *r;
    sr_tensor *sum = sr_sum(fz.tensors[2]);
    sr_value *v = sum ? sr_value_from_tensor(sum) : NULL;
    sr_tensor_unref(sum);
    if (!v || sr_rref_create(v, &r))
        die("the OwnerRRef fixture");
    sr_value_unref(v);
    fork_once(r);
    fork_once(r);
    if (sr_rref_id(r) != FZ_OWNER_RID) {
        fprintf(stderr, "fuzz_env: the OwnerRRef fixture got id %#llx; the corpus names %#llx\n",
                (unsigned long long)sr_rref_id(r), (unsigned long long)FZ_OWNER_RID);
        exit(1);
    }
}

void fz_env_init_agent(void)
{
    static sr_job job;
    char name[40];
    snprintf(name, sizeof(name), "fuzz-agent-%d", (int)getpid());
    sr_segment_opts o = {.world_size = 1, .size = sr__segment_fixed_size(1, 0) + (64u << 20), .name = name};
    if (sr__job_create(&job, &o, "fuzz"))
        die("sr__job_create");
    sr__launch_env_set(&(struct sr_launch_env){.fd = job.seg.fd, .rank = 0, .world_size = 1});
    sr_rref_set_ignore_leak(true);
    if (sr_init(NULL))
        die("sr_init");
    fixtures();
    agent_owner_rref();
}

void fz_objects_in_flight(void)
{
    if (!sr__inflight_count(fz.object) && sr__inflight_add(sr_value_ref(fz.object)))
        die("sr__inflight_add");
}

void fz_top_up(void) { top_up(); }

uint8_t *fz_payload(void) { return sr__block_data(blocks[nblocks - 1]); }

FILE *fz_report_open(void)
{
    int fd = dup(2);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f)
        f = stderr;
    setvbuf(f, NULL, _IONBF, 0); /* written just before an abort */
    return f;
}

/* Fork r once, as an encode for a send does. */
static void fork_once(sr_rref *r)
{
    sr_value *v = sr_value_from_rref(r), *one[1] = {v};
    uint8_t buf[64];
    if (!v || sr__codec_encode(1, one, 0, buf, sizeof(buf)) < 0)
        die("encoding a fixture RRef");
    sr_value_unref(v);
}

void fz_iter_begin(void)
{
    if (sr__rref_init(0, FZ_WORLD, true))
        die("sr__rref_init");
    sr_value *seven = sr_int(7);
    if (!seven || sr_rref_create(seven, &owner_rref))
        die("sr_rref_create");
    sr_value_unref(seven); /* the RRef's value holds its own reference */
    fork_once(owner_rref); /* fork id (0,1) */
    /* A user received from its owner (confirmed at once), then passed on:
     * a child (0,2) waiting for the owner's CHILD_ACCEPT. */
    if (sr__rref_from_wire(FZ_USER_RID, FZ_USER_FID, 1, 0, &user_rref)) /* owner worker1, generation 0 */
        die("sr__rref_from_wire");
    fork_once(user_rref);
    if (sr__dctx_container_init(0, FZ_WORLD) || sr__dctx_new(&dctx))
        die("the distributed autograd context");
    fz.dctx_id = dctx->id;
    fz_objects_in_flight();
}

void fz_iter_end(void)
{
    sr_rref_unref(owner_rref);
    sr_rref_unref(user_rref);
    owner_rref = user_rref = NULL;
    sr__rref_fini();
    sr__dctx_unref(dctx);
    dctx = NULL;
    sr__dctx_container_fini();
    top_up();
}

/* Replace every 8-byte `from[i]` by `to[i]`, and the 4-byte pid `pfrom` by `pto`. */
static void swap_words(uint8_t *buf, size_t len, const uint64_t *from, const uint64_t *to, int n, uint32_t pfrom,
                       uint32_t pto)
{
    for (size_t i = 0; i + 4 <= len; i++) {
        uint64_t w8 = 0;
        uint32_t w4;
        memcpy(&w4, buf + i, 4);
        if (i + 8 <= len)
            memcpy(&w8, buf + i, 8);
        for (int k = 0; i + 8 <= len && k < n; k++) {
            if (w8 == from[k]) {
                memcpy(buf + i, &to[k], 8);
                i += 7;
                goto next;
            }
        }
        if (w4 == pfrom) {
            memcpy(buf + i, &pto, 4);
            i += 3;
        }
    next:;
    }
}

static int word_tables(uint64_t *real, uint64_t *mark)
{
    for (int i = 0; i < nblocks; i++) {
        real[i] = offs[i];
        mark[i] = MARK_BLOCK(i);
    }
    real[nblocks] = (uint64_t)(uintptr_t)fz.object;
    mark[nblocks] = MARK_OBJECT;
    return nblocks + 1;
}

void fz_mark(uint8_t *buf, size_t len)
{
    uint64_t real[FZ_NBLOCKS + 1], mark[FZ_NBLOCKS + 1];
    int n = word_tables(real, mark);
    swap_words(buf, len, real, mark, n, (uint32_t)getpid(), MARK_PID);
}

void fz_unmark(uint8_t *buf, size_t len)
{
    uint64_t real[FZ_NBLOCKS + 1], mark[FZ_NBLOCKS + 1];
    int n = word_tables(real, mark);
    swap_words(buf, len, mark, real, n, MARK_PID, (uint32_t)getpid());
}

sr_segment_opts fz_segment_opts(int world)
{
    return (sr_segment_opts){.world_size = world, .ring_slots = 8, .name = "fuzz-segment",
                             .size = sr__segment_fixed_size(world, 8) + (uint64_t)world * SR_HEAP_MIN};
}

struct seg_part {
    uint64_t off, len;
};

/* The image's parts, in order (fuzz_env.h). */
static size_t seg_parts(const sr_segment *s, struct seg_part *p)
{
    p[0] = (struct seg_part){0, offsetof(struct sr_seg_header, attached)};
    p[1] = (struct seg_part){s->table_off, (uint64_t)s->world * s->table_stride};
    p[2] = (struct seg_part){s->inbox_off, sr__ring_bytes(s->ring_slots)};
    p[3] = (struct seg_part){s->area_off, (uint64_t)s->heap_areas * s->area_stride};
    return 4;
}

/* Copy between s's image and buf, len bytes at most; to_seg: into s. */
static size_t seg_copy(const sr_segment *s, uint8_t *buf, size_t len, bool to_seg)
{
    struct seg_part parts[4];
    size_t n = seg_parts(s, parts), used = 0;
    for (size_t i = 0; i < n && used < len; i++) {
        size_t k = len - used < parts[i].len ? len - used : (size_t)parts[i].len;
        char *at = (char *)s->base + parts[i].off;
        to_seg ? memcpy(at, buf + used, k) : memcpy(buf + used, at, k);
        used += k;
    }
    return used;
}

size_t fz_segment_overlay(sr_segment *s, const uint8_t *p, size_t len) { return seg_copy(s, (uint8_t *)p, len, true); }

size_t fz_segment_image(const sr_segment *s, uint8_t *out, size_t cap) { return seg_copy(s, out, cap, false); }
