/* SPDX-License-Identifier: MIT */
/* IDX files through zlib's gz* interface (see idx.h). The body is read into
 * a buffer that grows with what actually arrives, so a header that declares
 * a huge count costs memory only as far as the file really goes. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "idx.h"
#include "error.h"
#include "file.h"

#define FN "sr_mnist_load"
#define CHUNK ((size_t)1 << 20)

/* The error behind a failed gzread: -errno from the OS, or -EBADMSG. */
static int gz_fail(gzFile f, const char *path, int saved_errno)
{
    int zerr;
    const char *msg = gzerror(f, &zerr);
    size_t plen = strlen(path);
    if (!strncmp(msg, path, plen) && !strncmp(msg + plen, ": ", 2))
        msg += plen + 2; /* zlib prefixes the path, which ours already names */
    if (zerr == Z_ERRNO)
        return sr__fail(saved_errno ? -saved_errno : -EIO, FN, "%s: read error: %s", path,
                        strerror(saved_errno ? saved_errno : EIO));
    if (zerr == Z_BUF_ERROR)
        return sr__fail(-EBADMSG, FN, "%s: truncated: the gzip stream ends early, before its end and its "
                        "CRC-32 and length trailer (%s)", path, msg);
    return sr__fail(-EBADMSG, FN, "%s: corrupt gzip data (%s)", path, msg);
}

/* gzread returned 0. zlib then takes a gzip stream cut short (before its
 * final block, or anywhere in its CRC-32 and length trailer) for the end of
 * the file, leaving only Z_BUF_ERROR behind: without this check the data
 * of a file missing its trailer would load unchecked. A stream that ended
 * with its trailer verified (every member's, for concatenated members) and
 * a plain file leave Z_OK. */
static int gz_end(gzFile f, const char *path)
{
    int zerr;
    gzerror(f, &zerr);
    return zerr == Z_OK ? 0 : gz_fail(f, path, 0);
}

/* Up to n bytes into buf; *got < n only at the end of the file. */
static int gz_fill(gzFile f, const char *path, uint8_t *buf, size_t n, size_t *got)
{
    *got = 0;
    while (*got < n) {
        size_t ask = n - *got < CHUNK ? n - *got : CHUNK;
        errno = 0;
        int r = gzread(f, buf + *got, (unsigned)ask);
        if (r < 0)
            return gz_fail(f, path, errno);
        if (r == 0) /* the end; or a stream cut short, which zlib reports only through gzerror */
            return gz_end(f, path);
        *got += (size_t)r;
    }
    return 0;
}

/* A regular file only: gzopen's own open would block on a FIFO. */
static int open_gz(const char *path, gzFile *f)
{
    int fd = sr__open_regular(AT_FDCWD, path, O_RDONLY, FN, "data file", path, NULL);
    if (fd < 0)
        return fd;
    errno = 0;
    *f = gzdopen(fd, "rb"); /* owns fd from here, gzclose closes it */
    if (*f)
        return 0;
    int e = errno ? errno : ENOMEM;
    close(fd);
    return sr__fail(-e, FN, "%s: cannot open: %s", path, strerror(e));
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The magic number and the 4-byte sizes that follow it (ndim of them). */
static int read_header(gzFile f, const char *path, uint32_t magic, int ndim, uint32_t *dims)
{
    uint8_t h[16];
    size_t want = 4 + 4 * (size_t)ndim, got;
    int rc = gz_fill(f, path, h, want, &got);
    if (rc)
        return rc;
    if (got < 4 || be32(h) != magic)
        return sr__fail(-EBADMSG, FN, "%s: bad magic number 0x%08x, expected 0x%08x (IDX %s)", path,
                        got < 4 ? 0u : be32(h), magic, magic == SR__IDX_IMAGES_MAGIC ? "images" : "labels");
    if (got < want)
        return sr__fail(-EBADMSG, FN, "%s: truncated: the header ends after %zu of %zu bytes", path, got, want);
    for (int i = 0; i < ndim; i++)
        dims[i] = be32(h + 4 + 4 * i);
    return 0;
}

/* Doubles *cap (up to n) by realloc; *buf stays valid on failure. */
static int grow(const char *path, uint8_t **buf, size_t *cap, size_t n)
{
    size_t c = n - *cap < *cap ? n : 2 * *cap;
    uint8_t *p = realloc(*buf, c);
    if (!p)
        return sr__fail(-ENOMEM, FN, "%s: out of memory for %zu bytes", path, c);
    *buf = p;
    *cap = c;
    return 0;
}

/* Exactly n body bytes, then the end of the file. */
static int read_body(gzFile f, const char *path, size_t n, uint8_t **out)
{
    size_t cap = n < CHUNK ? n : CHUNK, have = 0, got = 0;
    uint8_t *buf = malloc(cap + 1), extra;
    int rc = buf ? 0 : sr__fail(-ENOMEM, FN, "%s: out of memory", path);
    while (!rc && have < n) {
        if (have == cap && (rc = grow(path, &buf, &cap, n)))
            break;
        size_t room = cap - have;
        if (!(rc = gz_fill(f, path, buf + have, room, &got)) && got < room)
            rc = sr__fail(-EBADMSG, FN, "%s: truncated: %zu of the %zu data bytes the header declares", path,
                          have + got, n);
        have += got;
    }
    if (!rc && !(rc = gz_fill(f, path, &extra, 1, &got)) && got)
        rc = sr__fail(-EBADMSG, FN, "%s: more data than the %zu bytes the header declares", path, n);
    if (rc)
        free(buf);
    else
        *out = buf;
    return rc;
}

/* Open, check the magic, take the dims, read the body, close. */
static int read_idx(const char *path, uint32_t magic, int ndim, uint32_t *dims,
                    int (*check)(const char *, const uint32_t *, const void *), const void *arg, uint8_t **data)
{
    gzFile f;
    int rc = open_gz(path, &f);
    if (rc)
        return rc;
    if (!(rc = read_header(f, path, magic, ndim, dims)) && !(rc = check(path, dims, arg))) {
        size_t n = 1;
        for (int i = 0; i < ndim; i++)
            n *= dims[i];
        rc = read_body(f, path, n, data);
    }
    gzclose(f);
    return rc;
}

static int check_image_dims(const char *path, const uint32_t *dims, const void *arg)
{
    const int64_t *want = arg;
    if (dims[1] != want[0] || dims[2] != want[1])
        return sr__fail(-EBADMSG, FN, "%s: images are %ux%u, expected %lldx%lld", path, dims[1], dims[2],
                        (long long)want[0], (long long)want[1]);
    return 0;
}

int sr__idx_read_images(const char *path, int64_t rows, int64_t cols, struct sr__idx *out)
{
    uint32_t dims[3] = {0, 0, 0};
    int rc = read_idx(path, SR__IDX_IMAGES_MAGIC, 3, dims, check_image_dims, (const int64_t[]){rows, cols},
                      &out->data);
    if (!rc) {
        out->count = dims[0];
        out->rows = rows;
        out->cols = cols;
    }
    return rc;
}

static int no_check(const char *path, const uint32_t *dims, const void *arg)
{
    (void)path, (void)dims, (void)arg;
    return 0;
}

int sr__idx_read_labels(const char *path, int classes, struct sr__idx *out)
{
    uint32_t count = 0;
    out->data = NULL;
    int rc = read_idx(path, SR__IDX_LABELS_MAGIC, 1, &count, no_check, NULL, &out->data);
    for (uint32_t i = 0; !rc && i < count; i++)
        if (out->data[i] >= classes)
            rc = sr__fail(-EBADMSG, FN, "%s: label %u at index %u is outside 0..%d", path, out->data[i], i,
                          classes - 1);
    if (rc) {
        free(out->data);
        out->data = NULL;
    }
    if (!rc) {
        out->count = count;
        out->rows = out->cols = 0;
    }
    return rc;
}
