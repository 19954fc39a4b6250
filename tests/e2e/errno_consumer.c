/* SPDX-License-Identifier: MIT */
/* A consumer of the public API that includes nothing but shmrpc/shmrpc.h:
 * the -errno values the API returns are named with errno.h's constants, so
 * the header brings them (this file does not compile otherwise). A timeout
 * that is negative is refused with -EINVAL before anything else is done. */
#include <shmrpc/shmrpc.h>

int main(void)
{
    int rc = sr_shutdown(true, -1.0);
    return rc == -EINVAL && ENOENT != EINVAL && ETIMEDOUT > 0 ? 0 : 1;
}
