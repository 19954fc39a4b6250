/* SPDX-License-Identifier: MIT */
/* xoshiro256** (Blackman and Vigna) seeded through splitmix64 (internal):
 * the one generator behind sr_rand/sr_randn (factory.c, process-wide) and
 * nn.h's seeded sr_generator. Integer arithmetic only, so a seed gives the
 * same stream on every machine. The caller owns and guards the state. */
#ifndef SR_LIB_TENSOR_XOSHIRO_H
#define SR_LIB_TENSOR_XOSHIRO_H

#if !defined(SR__SEES_TENSOR)
#error "xoshiro.h is the seam of the tensor layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#include <stdint.h>

static inline uint64_t sr__splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* splitmix64 never yields four zero words in a row: the state is valid. */
static inline void sr__xoshiro_seed(uint64_t s[4], uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        s[i] = sr__splitmix64(&seed);
}

static inline uint64_t sr__rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t sr__xoshiro_next(uint64_t s[4])
{
    uint64_t result = sr__rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = sr__rotl64(s[3], 45);
    return result;
}

#endif
