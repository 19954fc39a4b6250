/* SPDX-License-Identifier: MIT */
/* Encoding, decoding and the header check of the checkpoint format. */
#include "format.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

#include "error.h"

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

uint32_t sr__ckpt_crc(const void *p, size_t n)
{
    /* crc32_z takes a size_t length, so tensors over 4 GiB need no loop. */
    return (uint32_t)crc32_z(crc32_z(0, Z_NULL, 0), (const Bytef *)p, n);
}

void sr__ckpt_put_header(uint8_t *p, const sr__ckpt_header *h)
{
    memset(p, 0, SR__CKPT_HEADER_SIZE);
    memcpy(p + SR__CKPT_H_MAGIC, SR__CKPT_MAGIC, 8);
    put32(p + SR__CKPT_H_VERSION, h->version);
    put32(p + SR__CKPT_H_HEADER_SIZE, h->header_size);
    put64(p + SR__CKPT_H_FILE_SIZE, h->file_size);
    put32(p + SR__CKPT_H_NTENSORS, h->ntensors);
    put32(p + SR__CKPT_H_NMETA, h->nmeta);
    put64(p + SR__CKPT_H_TOC_SIZE, h->toc_size);
    put64(p + SR__CKPT_H_DATA_OFFSET, h->data_offset);
    put32(p + SR__CKPT_H_TOC_CRC, h->toc_crc);
    put32(p + SR__CKPT_H_CRC, sr__ckpt_crc(p, SR__CKPT_H_CRC));
}

void sr__ckpt_get_header(const uint8_t *p, sr__ckpt_header *h)
{
    h->version = get32(p + SR__CKPT_H_VERSION);
    h->header_size = get32(p + SR__CKPT_H_HEADER_SIZE);
    h->file_size = get64(p + SR__CKPT_H_FILE_SIZE);
    h->ntensors = get32(p + SR__CKPT_H_NTENSORS);
    h->nmeta = get32(p + SR__CKPT_H_NMETA);
    h->toc_size = get64(p + SR__CKPT_H_TOC_SIZE);
    h->data_offset = get64(p + SR__CKPT_H_DATA_OFFSET);
    h->toc_crc = get32(p + SR__CKPT_H_TOC_CRC);
}

void sr__ckpt_put_entry(uint8_t *p, const sr__ckpt_entry *e)
{
    memset(p, 0, SR__CKPT_ENTRY_SIZE);
    put32(p + SR__CKPT_E_NAME_OFF, e->name_off);
    put32(p + SR__CKPT_E_NAME_LEN, e->name_len);
    put32(p + SR__CKPT_E_DTYPE, e->dtype);
    put32(p + SR__CKPT_E_NDIM, e->ndim);
    put64(p + SR__CKPT_E_OFFSET, e->offset);
    put64(p + SR__CKPT_E_NBYTES, e->nbytes);
    put32(p + SR__CKPT_E_CRC, e->crc);
    for (int i = 0; i < SR__CKPT_MAX_DIMS; i++)
        put64(p + SR__CKPT_E_SHAPE + 8 * i, (uint64_t)e->shape[i]);
}

void sr__ckpt_get_entry(const uint8_t *p, sr__ckpt_entry *e)
{
    e->name_off = get32(p + SR__CKPT_E_NAME_OFF);
    e->name_len = get32(p + SR__CKPT_E_NAME_LEN);
    e->dtype = get32(p + SR__CKPT_E_DTYPE);
    e->ndim = get32(p + SR__CKPT_E_NDIM);
    e->offset = get64(p + SR__CKPT_E_OFFSET);
    e->nbytes = get64(p + SR__CKPT_E_NBYTES);
    e->crc = get32(p + SR__CKPT_E_CRC);
    for (int i = 0; i < SR__CKPT_MAX_DIMS; i++)
        e->shape[i] = (int64_t)get64(p + SR__CKPT_E_SHAPE + 8 * i);
}

void sr__ckpt_put_meta(uint8_t *p, const sr__ckpt_meta *m)
{
    put32(p, m->name_off);
    put32(p + 4, m->name_len);
    put64(p + 8, (uint64_t)m->value);
}

void sr__ckpt_get_meta(const uint8_t *p, sr__ckpt_meta *m)
{
    m->name_off = get32(p);
    m->name_len = get32(p + 4);
    m->value = (int64_t)get64(p + 8);
}

void sr__ckpt_reseal(uint8_t *file, size_t len)
{
    if (len < SR__CKPT_HEADER_SIZE)
        return;
    uint64_t toc_size = get64(file + SR__CKPT_H_TOC_SIZE);
    if (toc_size <= len - SR__CKPT_HEADER_SIZE)
        put32(file + SR__CKPT_H_TOC_CRC, sr__ckpt_crc(file + SR__CKPT_HEADER_SIZE, (size_t)toc_size));
    put32(file + SR__CKPT_H_CRC, sr__ckpt_crc(file, SR__CKPT_H_CRC));
}

int sr__ckpt_bad(const char *path, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    return sr__fail(-EBADMSG, "sr_checkpoint_load", "checkpoint %s: %s", path, why);
}

/* Identity first: magic, then version (a later version may lay the rest out
 * differently, so nothing else is read before it), then the checksum. */
static int check_identity(const uint8_t *p, const char *path)
{
    if (memcmp(p + SR__CKPT_H_MAGIC, SR__CKPT_MAGIC, 8))
        return sr__ckpt_bad(path, "not a shmrpc checkpoint (bad magic)");
    uint32_t version = get32(p + SR__CKPT_H_VERSION);
    if (version != SR__CKPT_VERSION)
        return sr__ckpt_bad(path, "unsupported format version %u (this build reads version %u)", version,
                            SR__CKPT_VERSION);
    uint32_t stored = get32(p + SR__CKPT_H_CRC), computed = sr__ckpt_crc(p, SR__CKPT_H_CRC);
    if (stored != computed)
        return sr__ckpt_bad(path, "header checksum mismatch (stored 0x%08x, computed 0x%08x)", stored, computed);
    if (get32(p + SR__CKPT_H_FLAGS) || get32(p + SR__CKPT_H_RESERVED))
        return sr__ckpt_bad(path, "corrupt header: flags 0x%08x and reserved 0x%08x must be 0",
                            get32(p + SR__CKPT_H_FLAGS), get32(p + SR__CKPT_H_RESERVED));
    return 0;
}

int sr__ckpt_check_header(const uint8_t *p, uint64_t file_size, const char *path, sr__ckpt_header *h)
{
    if (file_size < SR__CKPT_HEADER_SIZE)
        return sr__ckpt_bad(path, "truncated: header needs %u bytes, file has %llu", SR__CKPT_HEADER_SIZE,
                            (unsigned long long)file_size);
    int rc = check_identity(p, path);
    if (rc)
        return rc;
    sr__ckpt_get_header(p, h);
    if (h->header_size != SR__CKPT_HEADER_SIZE)
        return sr__ckpt_bad(path, "corrupt header: header size %u, expected %u", h->header_size,
                            SR__CKPT_HEADER_SIZE);
    if (h->toc_size > file_size - SR__CKPT_HEADER_SIZE) {
        uint64_t need = h->toc_size > UINT64_MAX - SR__CKPT_HEADER_SIZE ? UINT64_MAX
                                                                        : SR__CKPT_HEADER_SIZE + h->toc_size;
        return sr__ckpt_bad(path, "truncated: table of contents needs %llu bytes, file has %llu",
                            (unsigned long long)need, (unsigned long long)file_size);
    }
    /* Both products fit in 64 bits: the counts are 32-bit. */
    uint64_t fixed = (uint64_t)h->ntensors * SR__CKPT_ENTRY_SIZE + (uint64_t)h->nmeta * SR__CKPT_META_SIZE;
    if (fixed > h->toc_size)
        return sr__ckpt_bad(path, "corrupt header: %u tensors and %u metadata entries need %llu bytes of table "
                            "of contents, it has %llu", h->ntensors, h->nmeta, (unsigned long long)fixed,
                            (unsigned long long)h->toc_size);
    if (h->data_offset != sr__ckpt_align(SR__CKPT_HEADER_SIZE + h->toc_size))
        return sr__ckpt_bad(path, "corrupt header: data offset %llu, expected %llu",
                            (unsigned long long)h->data_offset,
                            (unsigned long long)sr__ckpt_align(SR__CKPT_HEADER_SIZE + h->toc_size));
    return 0;
}
