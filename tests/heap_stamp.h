/* SPDX-License-Identifier: MIT */
/* What the heap's tests share (tests/shm/test_heap.c, the single-process
 * suite; tests/transport/test_heap_mp.c, the heap across processes): sizes,
 * stamping the ends of a block and checking them, and the memory a segment
 * holds. */
#ifndef SR_TESTS_HEAP_STAMP_H
#define SR_TESTS_HEAP_STAMP_H

#include <stdint.h>
#include <sys/stat.h>

#include "heap.h"
#include "segment.h"

#define MiB (UINT64_C(1) << 20)
#define GiB (UINT64_C(1) << 30)
#define WAIT_NS (20ll * 1000000000)
#define EDGE 256 /* bytes stamped at each end of a block */

static inline uint8_t pattern(uint64_t stamp, uint64_t i) { return (uint8_t)((stamp * 0x9e3779b97f4a7c15ull + i * 31) >> 7); }

/* Stamp both ends of the block (the whole block when it is small). */
static inline void fill(sr_block *b, uint64_t stamp)
{
    uint8_t *d = sr__block_data(b);
    uint64_t n = sr__block_size(b), edge = n < EDGE ? n : EDGE;
    for (uint64_t i = 0; i < edge; i++) {
        d[i] = pattern(stamp, i);
        d[n - 1 - i] = pattern(stamp, n - 1 - i);
    }
}

/* The first index whose byte is not the stamp's, or -1. */
static inline int64_t first_bad(const sr_block *b, uint64_t stamp)
{
    const uint8_t *d = sr__block_data(b);
    uint64_t n = sr__block_size(b), edge = n < EDGE ? n : EDGE;
    for (uint64_t i = 0; i < edge; i++) {
        if (d[i] != pattern(stamp, i))
            return (int64_t)i;
        if (d[n - 1 - i] != pattern(stamp, n - 1 - i))
            return (int64_t)(n - 1 - i);
    }
    return -1;
}

/* Bytes of memory the memfd holds (pages written and not punched). */
static inline uint64_t memfd_bytes(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 ? (uint64_t)st.st_blocks * 512 : UINT64_MAX;
}

static inline uint64_t seg_size_for(int world, uint64_t heap_each)
{
    return sr__segment_fixed_size(world, SR_RING_SLOTS_DEFAULT) + (uint64_t)world * heap_each;
}

#endif
