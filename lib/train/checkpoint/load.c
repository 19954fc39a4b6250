/* SPDX-License-Identifier: MIT */
/* sr_checkpoint_load: read a checkpoint and check every part of it.
 *
 * Nothing read from the file is used before it is checked: a size or an
 * offset is compared with the file's real size (from fstat) before memory
 * is allocated for it or a read is issued at it, so a corrupt or hostile
 * file costs at most about its own size in memory and fails cleanly.
 *
 * Order of the checks, cheapest first: header (magic, version, CRC, sizes),
 * table of contents (CRC, then every name, dtype, rank, shape, size and
 * offset), names unique, the file's total size, and last each tensor's data
 * against its CRC as it is read.
 *
 * Reads are plain pread, not io_uring: a load is one pass at startup that
 * reads each tensor once, straight into its shared-heap block, and must
 * check every read's length anyway. Large sequential reads of the page
 * cache (or of readahead) cost the same through either; the ring would add
 * its setup and no overlap worth having before the CRC, which is the
 * CPU-bound part.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_impl.h"
#include "format.h"
#include "error.h"

typedef struct reader {
    const char *path;
    int fd;
    uint64_t size; /* the file's real size */
    sr__ckpt_header h;
    uint8_t *toc;
    uint64_t table_size; /* bytes of the name table at the end of the TOC */
    sr__ckpt_entry *entries;
    sr_checkpoint *c;
} reader;

/* 0, -errno, or 1 when the file ends first. */
static int pread_all(int fd, void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return 1;
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

static int read_at(reader *r, void *buf, size_t len, uint64_t off, const char *what)
{
    int rc = pread_all(r->fd, buf, len, off);
    if (rc < 0)
        return sr__fail(rc, "sr_checkpoint_load", "checkpoint %s: reading %s: %s", r->path, what, strerror(-rc));
    if (rc > 0) /* the file shrank since fstat */
        return sr__ckpt_bad(r->path, "truncated while reading %s", what);
    return 0;
}

static int open_file(reader *r)
{
    /* Symbolic links are followed: "latest" pointing at a checkpoint is usual. */
    struct stat st;
    r->fd = sr__open_regular(AT_FDCWD, r->path, O_RDONLY, "sr_checkpoint_load", "checkpoint", r->path, &st);
    if (r->fd < 0)
        return r->fd;
    r->size = (uint64_t)st.st_size;
    return 0;
}

static int read_head(reader *r)
{
    uint8_t head[SR__CKPT_HEADER_SIZE];
    size_t len = r->size < sizeof(head) ? (size_t)r->size : sizeof(head);
    int rc = read_at(r, head, len, 0, "the header");
    if (!rc)
        rc = sr__ckpt_check_header(head, r->size, r->path, &r->h);
    if (rc)
        return rc;
    /* toc_size <= file size - 64 now, so this allocation is bounded. */
    r->toc = malloc(r->h.toc_size ? r->h.toc_size : 1);
    if (!r->toc)
        return sr__fail(-ENOMEM, "sr_checkpoint_load", "checkpoint %s: no memory for a %llu-byte table of contents",
                        r->path, (unsigned long long)r->h.toc_size);
    rc = read_at(r, r->toc, r->h.toc_size, SR__CKPT_HEADER_SIZE, "the table of contents");
    if (rc)
        return rc;
    uint32_t crc = sr__ckpt_crc(r->toc, r->h.toc_size);
    if (crc != r->h.toc_crc)
        return sr__ckpt_bad(r->path, "table of contents checksum mismatch (stored 0x%08x, computed 0x%08x)",
                            r->h.toc_crc, crc);
    r->table_size = r->h.toc_size - (uint64_t)r->h.ntensors * SR__CKPT_ENTRY_SIZE -
                    (uint64_t)r->h.nmeta * SR__CKPT_META_SIZE;
    return 0;
}

static int check_name(reader *r, const char *what, size_t i, uint32_t off, uint32_t len)
{
    if (!len || len > SR_CHECKPOINT_NAME_MAX)
        return sr__ckpt_bad(r->path, "corrupt table of contents: %s %zu has a name of %u bytes", what, i, len);
    if ((uint64_t)off + len > r->table_size)
        return sr__ckpt_bad(r->path, "corrupt table of contents: %s %zu name at [%u, %llu) lies outside the "
                            "%llu-byte name table", what, i, off, (unsigned long long)off + len,
                            (unsigned long long)r->table_size);
    const uint8_t *table = r->toc + (r->h.toc_size - r->table_size);
    if (memchr(table + off, 0, len))
        return sr__ckpt_bad(r->path, "corrupt table of contents: %s %zu name contains a NUL byte", what, i);
    return 0;
}

/* Decode every entry, check its name, and copy the names out. */
static int read_names(reader *r)
{
    const uint8_t *meta = r->toc + (uint64_t)r->h.ntensors * SR__CKPT_ENTRY_SIZE;
    sr_checkpoint *c = r->c;
    size_t total = 0;
    int rc = 0;
    for (size_t i = 0; i < c->n && !rc; i++) {
        sr__ckpt_get_entry(r->toc + i * SR__CKPT_ENTRY_SIZE, &r->entries[i]);
        rc = check_name(r, "tensor", i, r->entries[i].name_off, r->entries[i].name_len);
        total += r->entries[i].name_len + 1u;
    }
    sr__ckpt_meta *m = malloc((c->nmeta ? c->nmeta : 1) * sizeof(*m));
    if (!m && !rc)
        rc = sr__fail(-ENOMEM, "sr_checkpoint_load", "checkpoint %s: no memory for the metadata", r->path);
    for (size_t i = 0; i < c->nmeta && !rc; i++) {
        sr__ckpt_get_meta(meta + i * SR__CKPT_META_SIZE, &m[i]);
        rc = check_name(r, "metadata entry", i, m[i].name_off, m[i].name_len);
        total += m[i].name_len + 1u;
    }
    if (!rc && !(c->names = malloc(total ? total : 1)))
        rc = sr__fail(-ENOMEM, "sr_checkpoint_load", "checkpoint %s: no memory for names", r->path);
    const uint8_t *table = r->toc + (r->h.toc_size - r->table_size);
    char *at = c->names;
    for (size_t i = 0; i < c->n && !rc; i++) {
        c->items[i].name = memcpy(at, table + r->entries[i].name_off, r->entries[i].name_len);
        at += r->entries[i].name_len;
        *at++ = '\0';
    }
    for (size_t i = 0; i < c->nmeta && !rc; i++) {
        c->meta[i] = (struct sr__ckpt_mitem){memcpy(at, table + m[i].name_off, m[i].name_len), m[i].value};
        at += m[i].name_len;
        *at++ = '\0';
    }
    free(m);
    return rc;
}

static int check_shape(reader *r, const char *name, const sr__ckpt_entry *e)
{
    if (!sr_dtype_size((sr_dtype)e->dtype))
        return sr__ckpt_bad(r->path, "tensor '%s' has unknown dtype %u", name, e->dtype);
    if (e->ndim > SR_MAX_DIMS)
        return sr__ckpt_bad(r->path, "tensor '%s' has %u dims, at most %d", name, e->ndim, SR_MAX_DIMS);
    uint64_t bytes = sr_dtype_size((sr_dtype)e->dtype);
    for (int d = 0; d < SR__CKPT_MAX_DIMS; d++) {
        if (e->shape[d] < 0 || (d >= (int)e->ndim && e->shape[d]))
            return sr__ckpt_bad(r->path, "tensor '%s' has a bad size %lld in slot %d", name,
                                (long long)e->shape[d], d);
        if (d < (int)e->ndim && __builtin_mul_overflow(bytes, (uint64_t)e->shape[d], &bytes))
            return sr__ckpt_bad(r->path, "tensor '%s' has a shape too large to address", name);
    }
    if (bytes != e->nbytes)
        return sr__ckpt_bad(r->path, "tensor '%s' has %llu bytes, its shape and dtype need %llu", name,
                            (unsigned long long)e->nbytes, (unsigned long long)bytes);
    return 0;
}

/* Data lies at a multiple of 64, in table order, without overlap, inside
 * the file. *end is where the previous tensor's data ended. */
static int check_place(reader *r, const char *name, const sr__ckpt_entry *e, uint64_t *end)
{
    if (e->offset % SR__CKPT_ALIGN || e->offset < *end)
        return sr__ckpt_bad(r->path, "tensor '%s' has a bad data offset %llu (must be a multiple of %u, at or "
                            "after %llu)", name, (unsigned long long)e->offset, SR__CKPT_ALIGN,
                            (unsigned long long)*end);
    if (e->offset > r->size || e->nbytes > r->size - e->offset)
        return sr__ckpt_bad(r->path, "truncated: tensor '%s' needs %llu bytes at offset %llu, file has %llu",
                            name, (unsigned long long)e->nbytes, (unsigned long long)e->offset,
                            (unsigned long long)r->size);
    *end = e->offset + e->nbytes;
    return 0;
}

static int check_entries(reader *r)
{
    uint64_t end = r->h.data_offset;
    for (size_t i = 0; i < r->c->n; i++) {
        const char *name = r->c->items[i].name;
        int rc = check_shape(r, name, &r->entries[i]);
        if (!rc)
            rc = check_place(r, name, &r->entries[i], &end);
        if (rc)
            return rc;
    }
    if (r->h.file_size != r->size)
        return sr__ckpt_bad(r->path, "%s: header says %llu bytes, file has %llu",
                            r->size < r->h.file_size ? "truncated" : "trailing bytes",
                            (unsigned long long)r->h.file_size, (unsigned long long)r->size);
    return 0;
}

/* Sort the pointers to items by name; a name twice is corruption. */
static int index_names(reader *r, void **sorted, void *items, size_t n, size_t stride, const char *what)
{
    for (size_t i = 0; i < n; i++)
        sorted[i] = (char *)items + i * stride;
    qsort(sorted, n, sizeof(*sorted), sr__ckpt_cmp_items);
    for (size_t i = 1; i < n; i++)
        if (!sr__ckpt_cmp_items(&sorted[i - 1], &sorted[i]))
            return sr__ckpt_bad(r->path, "%s name '%s' appears twice", what, *(const char **)sorted[i]);
    return 0;
}

static int read_tensor(reader *r, size_t i)
{
    const sr__ckpt_entry *e = &r->entries[i];
    struct sr__ckpt_item *it = &r->c->items[i];
    it->t = sr_empty((sr_dtype)e->dtype, (int)e->ndim, e->shape, 0);
    void *data = it->t && e->nbytes ? sr_tensor_mutable_data(it->t) : NULL;
    if (!it->t || (e->nbytes && !data))
        return sr__fail(-ENOMEM, "sr_checkpoint_load", "checkpoint %s: no memory for tensor '%s' (%llu bytes)",
                        r->path, it->name, (unsigned long long)e->nbytes);
    if (!e->nbytes)
        return 0;
    char what[SR_CHECKPOINT_NAME_MAX + 16];
    snprintf(what, sizeof(what), "tensor '%s'", it->name);
    int rc = read_at(r, data, e->nbytes, e->offset, what);
    if (rc)
        return rc;
    uint32_t crc = sr__ckpt_crc(data, e->nbytes);
    if (crc != e->crc)
        return sr__ckpt_bad(r->path, "tensor '%s' checksum mismatch (stored 0x%08x, computed 0x%08x)", it->name,
                            e->crc, crc);
    return 0;
}

static int alloc_checkpoint(reader *r)
{
    sr_checkpoint *c = r->c = calloc(1, sizeof(*c));
    if (!c)
        return sr__fail(-ENOMEM, "sr_checkpoint_load", "checkpoint %s: no memory", r->path);
    c->n = r->h.ntensors;
    c->nmeta = r->h.nmeta;
    /* Both counts are bounded by toc_size / 16, itself bounded by the file. */
    c->path = strdup(r->path);
    c->items = calloc(c->n ? c->n : 1, sizeof(*c->items));
    c->meta = calloc(c->nmeta ? c->nmeta : 1, sizeof(*c->meta));
    c->by_name = calloc(c->n ? c->n : 1, sizeof(*c->by_name));
    c->meta_by_name = calloc(c->nmeta ? c->nmeta : 1, sizeof(*c->meta_by_name));
    r->entries = calloc(c->n ? c->n : 1, sizeof(*r->entries));
    if (!c->path || !c->items || !c->meta || !c->by_name || !c->meta_by_name || !r->entries)
        return sr__fail(-ENOMEM, "sr_checkpoint_load", "checkpoint %s: no memory for %zu tensors", r->path, c->n);
    return 0;
}

static int load(reader *r)
{
    int rc = open_file(r);
    if (!rc)
        rc = read_head(r);
    if (!rc)
        rc = alloc_checkpoint(r);
    if (!rc)
        rc = read_names(r);
    if (!rc)
        rc = check_entries(r);
    if (!rc)
        rc = index_names(r, r->c->by_name, r->c->items, r->c->n, sizeof(*r->c->items), "tensor");
    if (!rc)
        rc = index_names(r, r->c->meta_by_name, r->c->meta, r->c->nmeta, sizeof(*r->c->meta),
                         "metadata");
    for (size_t i = 0; !rc && i < r->c->n; i++)
        rc = read_tensor(r, i);
    return rc;
}

SR_API int sr_checkpoint_load(const char *path, sr_checkpoint **out)
{
    if (out)
        *out = NULL;
    if (!path || !out)
        return sr__fail(-EINVAL, "sr_checkpoint_load", "%s is NULL", !path ? "path" : "out");
    /* A restarted job loads before it saves: what a writer killed mid-save
     * left beside path goes now (tmpfile.c; a live writer's file stays). */
    sr__ckpt_tmp_clean_path(path);
    reader r = {.path = path, .fd = -1};
    int rc = load(&r);
    if (r.fd >= 0)
        close(r.fd);
    free(r.toc);
    free(r.entries);
    if (rc)
        sr_checkpoint_destroy(r.c);
    else
        *out = r.c;
    return rc;
}
