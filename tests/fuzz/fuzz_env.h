/* SPDX-License-Identifier: MIT */
/* The in-process world the decoder fuzzer (fuzz_decode.c) and its corpus
 * generator (gen_corpus.c) share: no job, no agent, no other process.
 *
 *   - a one-worker segment whose heap this process attaches (rank 0), so
 *     that tensor descriptors and payload blocks name real shared blocks;
 *   - fixture blocks: the storages of a few tensors, and one payload block
 *     that the harness fills with the tail of a message input; each holds
 *     FZ_BLOCK_REFS references, topped up after every input, so no input can
 *     free one (an input holds at most len / 153 descriptors);
 *   - one object value, kept in flight (inflight.h) for self-call decoding;
 *   - an RRef context of rank 0 in a world of FZ_WORLD, started and torn
 *     down around every input (sr__rref_init / sr__rref_fini), holding one
 *     OwnerRRef (rref id (0,0)) forked once (fork id (0,1)), and a UserRRef
 *     of rank 1's rref (1,5) (fork id (1,6)) forked once (child (0,2)): an
 *     input that names them reaches the owner's and the parent's paths, one
 *     naming other ids the user's. Messages the RRef layer sends fail at
 *     once (no agent), which it tolerates;
 *   - a distributed autograd context, also around every input, so that a
 *     result's autograd extension naming it records its tensors (the f64
 *     fixture requires grad).
 *
 * Markers. What differs from run to run (the pid, the object's address, the
 * blocks' offsets, which depend on the heap's layout) is written into the
 * corpus as fixed markers: the generator replaces the real values by them
 * (fz_mark), the harness puts the real ones back before decoding
 * (fz_unmark), so a committed seed keeps naming live fixtures. */
#ifndef SR_TESTS_FUZZ_ENV_H
#define SR_TESTS_FUZZ_ENV_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "segment.h"
#include "shmrpc/tensor.h"
#include "shmrpc/value.h"

#define FZ_WORLD 3
#define FZ_BLOCK_REFS 1000
#define FZ_NTENSORS 4
#define FZ_PAYLOAD_BYTES 65536

/* Input selector (the first byte of an input, low 2 bits). */
enum fz_mode {
    FZ_VALUES = 0,  /* the rest is a value list: sr__codec_decode */
    FZ_RELEASE = 1, /* the rest is a value list: sr__codec_release */
    FZ_MSG = 2,     /* u8 type, 56 slot bytes, then the payload block's bytes */
    FZ_RREF_CTRL = 3, /* u8 source rank, 56 slot bytes: an RRef control message */
};
#define FZ_SLOT_BYTES 56
#define FZ_OWNER_RID 0 /* (0,0): the OwnerRRef of either world */
#define FZ_USER_RID ((UINT64_C(1) << 48) | 5)
#define FZ_USER_FID ((UINT64_C(1) << 48) | 6)

struct fz_env {
    sr_tensor *tensors[FZ_NTENSORS]; /* f32[2,3], its transpose, f64[4], i64[3,2] */
    sr_value *object;                /* type "Net" */
    uint64_t payload_off;            /* the payload block */
    int64_t dctx_id;                 /* this input's distributed autograd context */
};
extern struct fz_env fz;

/* Once per process; exits with a message on failure. fz_env_init: the world
 * above (fuzz_decode.c). fz_env_init_agent: instead of the bare heap and
 * the per-input RRef and autograd contexts, a one-worker job whose RPC agent
 * runs in this process (sr_init: progress thread, executors, every module),
 * with the same fixtures in its heap (fuzz_dispatch.c), and one OwnerRRef
 * (FZ_OWNER_RID) of a scalar that requires grad, for RRef backward requests. */
void fz_env_init(void);
void fz_env_init_agent(void);
/* The object in flight once, and the fixture blocks' references topped up
 * (what fz_iter_begin and fz_iter_end do besides the contexts). */
void fz_objects_in_flight(void);
void fz_top_up(void);
/* Around every input: the RRef round, the object in flight, the block
 * references topped up. */
void fz_iter_begin(void);
void fz_iter_end(void);
/* Where a harness's oracles report: stderr as it was at start, unbuffered
 * (run_fuzz.sh's timed run has libFuzzer close stderr, to silence the
 * library's messages about the bad input; libFuzzer initialises the harness
 * before it does that). Call from LLVMFuzzerInitialize. */
FILE *fz_report_open(void);
/* The segment fuzzer's segments (fuzz_segment.c, gen_corpus.c): the
 * options of a segment of `world` workers (1 to 4), and its image, the
 * bytes an input writes over it in order: the header's creator lines, the
 * worker table, rank 0's inbox ring, the area table (fuzzers read at most
 * 4096 bytes of an input: the last of those may be left as created). _overlay writes up to len bytes of p over
 * s's image and returns how many it wrote; _image copies s's image into
 * out (at most cap bytes) and returns its length. */
sr_segment_opts fz_segment_opts(int world);
size_t fz_segment_overlay(sr_segment *s, const uint8_t *p, size_t len);
size_t fz_segment_image(const sr_segment *s, uint8_t *out, size_t cap);

/* The payload block's data (FZ_PAYLOAD_BYTES). */
uint8_t *fz_payload(void);
/* Real values -> markers (generator), markers -> real values (harness). */
void fz_mark(uint8_t *buf, size_t len);
void fz_unmark(uint8_t *buf, size_t len);

#endif
