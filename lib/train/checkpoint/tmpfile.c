/* SPDX-License-Identifier: MIT */
/* Temporary files of a save, and the cleanup of those a crash left behind.
 *
 * A writer holds an exclusive flock on its temporary file from creation to
 * rename (or unlink). The kernel drops the lock when the writer dies, so an
 * unlocked temporary file is stale whatever its name says: the pid in the
 * name is for people, and pid reuse (a restarted container whose job gets
 * the same pid) is harmless. Cleanup takes the lock itself before removing
 * a file, so it never removes one that a live writer is filling.
 *
 * Lock and name can drift apart: between a writer's open and its flock, a
 * cleaner may lock and unlink the file. So after locking, both sides check
 * that the name still leads to the inode they locked, and a writer that
 * lost the race opens again.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_impl.h"
#include "error.h"

bool sr__ckpt_is_tmp_name(const char *name, const char *base)
{
    size_t n = strlen(base);
    if (strncmp(name, base, n) || strncmp(name + n, ".tmp.", 5))
        return false;
    const char *pid = name + n + 5;
    if (!*pid)
        return false;
    for (; *pid; pid++)
        if (*pid < '0' || *pid > '9')
            return false;
    return true;
}

/* The regular file at name in dirfd is the one open as fd. */
static bool same_file(int dirfd, const char *name, int fd)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && fstatat(dirfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(a.st_mode) &&
           a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static int lock_wait(int fd)
{
    while (flock(fd, LOCK_EX))
        if (errno != EINTR)
            return -errno;
    return 0;
}

/* Blocking lock: another thread of this process saving the same path holds
 * it for the whole of its save; we then find the name gone (renamed) and
 * start a fresh file, so the two saves take turns. */
int sr__ckpt_tmp_open(int dirfd, const char *name, const char *path)
{
    for (;;) {
        /* Something else at our name (a FIFO would block the open, or take
         * the checkpoint's bytes) was not made by a save: refused, left alone. */
        int fd = sr__open_regular(dirfd, name, O_WRONLY | O_CREAT | O_NOFOLLOW, "sr_checkpoint_save",
                                       "temporary file", path, NULL);
        if (fd < 0)
            return fd;
        int rc = lock_wait(fd);
        if (rc) {
            close(fd);
            return sr__fail(rc, "sr_checkpoint_save", "flock of %s: %s", path, strerror(-rc));
        }
        if (!same_file(dirfd, name, fd)) {
            close(fd);
            continue;
        }
        if (ftruncate(fd, 0)) { /* stale contents of a crashed writer with our pid */
            rc = -errno;
            unlinkat(dirfd, name, 0); /* while we hold its lock */
            close(fd);
            return sr__fail(rc, "sr_checkpoint_save", "truncating %s: %s", path, strerror(-rc));
        }
        return fd;
    }
}

static void clean_one(int dirfd, const char *name)
{
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && same_file(dirfd, name, fd))
        unlinkat(dirfd, name, 0);
    close(fd); /* drops the lock, after the unlink */
}

void sr__ckpt_tmp_clean(int dirfd, const char *base)
{
    /* A description of our own: readdir moves its offset. */
    int dfd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0)
            close(dfd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)))
        if (sr__ckpt_is_tmp_name(de->d_name, base))
            clean_one(dirfd, de->d_name);
    closedir(d);
}

void sr__ckpt_tmp_clean_path(const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    char *dir = !slash ? strdup(".") : slash == path ? strdup("/") : strndup(path, (size_t)(slash - path));
    int dirfd = dir && *base ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dirfd >= 0) {
        sr__ckpt_tmp_clean(dirfd, base);
        close(dirfd);
    }
    free(dir);
}
