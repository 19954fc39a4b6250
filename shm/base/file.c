/* SPDX-License-Identifier: MIT */
/* Opening files that must be regular files, never with a blocking open.
 * See file.h. */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

static const char *file_kind(mode_t m)
{
    return S_ISFIFO(m)  ? "a FIFO"
           : S_ISDIR(m) ? "a directory"
           : S_ISLNK(m) ? "a symbolic link"
           : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m) ? "a character device"
           : S_ISBLK(m) ? "a block device"
                        : "not a regular file";
}

static int not_regular(const char *fn, const char *noun, const char *path, mode_t m)
{
    return sr__fail(-EINVAL, fn, "%s %s is %s, not a regular file", noun, path, file_kind(m));
}

int sr__open_regular(int dirfd, const char *name, int flags, const char *fn, const char *noun, const char *path,
                     struct stat *out)
{
    int fd = openat(dirfd, name, flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0666);
    struct stat st;
    if (fd < 0) {
        int e = errno; /* ENXIO (a FIFO without a reader), ELOOP, EISDIR...: say what is there */
        if (fstatat(dirfd, name, &st, (flags & O_NOFOLLOW) ? AT_SYMLINK_NOFOLLOW : 0) == 0 && !S_ISREG(st.st_mode))
            return not_regular(fn, noun, path, st.st_mode);
        return sr__fail(-e, fn, "%s %s: cannot open: %s", noun, path, strerror(e));
    }
    int rc = fstat(fd, &st) ? sr__fail(-errno, fn, "%s %s: fstat: %s", noun, path, strerror(errno)) : 0;
    if (!rc && !S_ISREG(st.st_mode))
        rc = not_regular(fn, noun, path, st.st_mode);
    int fl = rc ? 0 : fcntl(fd, F_GETFL);
    if (!rc && (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK)))
        rc = sr__fail(-errno, fn, "%s %s: clearing O_NONBLOCK: %s", noun, path, strerror(errno));
    if (rc) {
        close(fd);
        return rc;
    }
    if (out)
        *out = st;
    return fd;
}
