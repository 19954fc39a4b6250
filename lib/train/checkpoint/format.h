/* SPDX-License-Identifier: MIT */
/* The on-disk layout of a checkpoint file (docs/CHECKPOINT.md has the
 * picture). Integers are little-endian and are encoded and decoded byte by
 * byte, so the layout never depends on struct padding or host byte order.
 *
 *   [0, 64)                 header, its own CRC32 in the last 4 bytes
 *   [64, 64 + toc_size)     table of contents: ntensors tensor entries,
 *                           nmeta metadata entries, then the name table
 *   [.., data_offset)       zeros up to a multiple of 64
 *   [data_offset, file_size) tensor data, each at a multiple of 64, in
 *                           table order, zero padding after each
 *
 * Trust chain: the header CRC covers toc_crc, the TOC CRC covers every
 * entry, and each entry carries its tensor's CRC. Decoders check each size
 * against the file's real size before using it.
 */
#ifndef SR_LIB_CHECKPOINT_FORMAT_H
#define SR_LIB_CHECKPOINT_FORMAT_H

#if !defined(SR__IN_TRAIN)
#error "format.h is private to the training (train) layer (docs/ARCHITECTURE.md)"
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shmrpc/tensor.h"

#define SR__CKPT_MAGIC "SHMRCKPT" /* 8 bytes, no NUL in the file */
#define SR__CKPT_VERSION 1u
#define SR__CKPT_ALIGN 64u
#define SR__CKPT_MAX_DIMS 8 /* shape slots per entry; fixed by the format */
#define SR__CKPT_HEADER_SIZE 64u
#define SR__CKPT_ENTRY_SIZE 104u /* one tensor entry */
#define SR__CKPT_META_SIZE 16u   /* one metadata entry */

_Static_assert(SR_MAX_DIMS <= SR__CKPT_MAX_DIMS, "a tensor's dims must fit an entry's shape slots");

/* Header byte offsets. */
enum {
    SR__CKPT_H_MAGIC = 0,
    SR__CKPT_H_VERSION = 8,
    SR__CKPT_H_HEADER_SIZE = 12,
    SR__CKPT_H_FILE_SIZE = 16,
    SR__CKPT_H_NTENSORS = 24,
    SR__CKPT_H_NMETA = 28,
    SR__CKPT_H_TOC_SIZE = 32,
    SR__CKPT_H_DATA_OFFSET = 40,
    SR__CKPT_H_TOC_CRC = 48,
    SR__CKPT_H_FLAGS = 52,    /* 0 in version 1 */
    SR__CKPT_H_RESERVED = 56, /* 0 */
    SR__CKPT_H_CRC = 60,      /* CRC32 of bytes [0, 60) */
};

/* Tensor entry byte offsets. */
enum {
    SR__CKPT_E_NAME_OFF = 0, /* u32, into the name table */
    SR__CKPT_E_NAME_LEN = 4, /* u32, bytes, no NUL */
    SR__CKPT_E_DTYPE = 8,    /* u32, sr_dtype */
    SR__CKPT_E_NDIM = 12,    /* u32 */
    SR__CKPT_E_OFFSET = 16,  /* u64, from the start of the file */
    SR__CKPT_E_NBYTES = 24,  /* u64 = numel * dtype size */
    SR__CKPT_E_CRC = 32,     /* u32, CRC32 of the data */
    SR__CKPT_E_RESERVED = 36,
    SR__CKPT_E_SHAPE = 40, /* i64[8], unused slots 0 */
};
_Static_assert(SR__CKPT_E_SHAPE + 8 * SR__CKPT_MAX_DIMS == SR__CKPT_ENTRY_SIZE, "tensor entry layout");

typedef struct sr__ckpt_header {
    uint32_t version, header_size, ntensors, nmeta, toc_crc;
    uint64_t file_size, toc_size, data_offset;
} sr__ckpt_header;

typedef struct sr__ckpt_entry {
    uint32_t name_off, name_len, dtype, ndim, crc;
    uint64_t offset, nbytes;
    int64_t shape[SR__CKPT_MAX_DIMS];
} sr__ckpt_entry;

typedef struct sr__ckpt_meta {
    uint32_t name_off, name_len;
    int64_t value;
} sr__ckpt_meta;

static inline uint64_t sr__ckpt_align(uint64_t x)
{
    return (x + SR__CKPT_ALIGN - 1) & ~(uint64_t)(SR__CKPT_ALIGN - 1);
}

uint32_t sr__ckpt_crc(const void *p, size_t n);

/* Encoders: fill p (all fields, reserved ones zero). put_header also
 * computes the header CRC; toc_crc must already be set in h. */
void sr__ckpt_put_header(uint8_t *p, const sr__ckpt_header *h);
void sr__ckpt_put_entry(uint8_t *p, const sr__ckpt_entry *e);
void sr__ckpt_put_meta(uint8_t *p, const sr__ckpt_meta *m);

/* Decoders: no validation beyond what the layout implies. */
void sr__ckpt_get_header(const uint8_t *p, sr__ckpt_header *h);
void sr__ckpt_get_entry(const uint8_t *p, sr__ckpt_entry *e);
void sr__ckpt_get_meta(const uint8_t *p, sr__ckpt_meta *m);

/* Recompute the TOC checksum (when the TOC lies inside the image) and the
 * header checksum of a file image of len bytes, in place. Tests use it to
 * forge files that pass the checksums but break another rule. */
void sr__ckpt_reseal(uint8_t *file, size_t len);

/* Check the header of a file of file_size bytes whose first
 * SR__CKPT_HEADER_SIZE bytes are p: magic, version, checksum, then the
 * sizes it declares against file_size and against each other.
 * -EBADMSG naming path and the reason, recorded as sr_checkpoint_load's. */
int sr__ckpt_check_header(const uint8_t *p, uint64_t file_size, const char *path, sr__ckpt_header *h);

/* -EBADMSG with "checkpoint <path>: <reason>" as sr_checkpoint_load's error. */
int sr__ckpt_bad(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
