/* SPDX-License-Identifier: MIT */
/* The plug-in's side of plugin.h: its entry point, and the internal
 * functions the MPI transport calls, forwarded to the library that loaded
 * it. Linked into libshmrpc-mpi.so only (its version script exports the
 * entry alone). */
#include "plugin.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "error.h"
#include "parse.h"
#include "shmrpc/error.h"
#include "shmrpc/version.h"

/* Set once by the entry, under sr_init's lock, before the driver is
 * returned: every call below comes after it. */
static const struct sr_mpi_host *host;

__attribute__((visibility("default"))) sr_mpi_plugin_entry_fn sr_mpi_plugin_entry;

const struct sr_tport_driver *sr_mpi_plugin_entry(const struct sr_mpi_host *h)
{
    if (h->abi != SR_MPI_PLUGIN_ABI || strcmp(h->version, SR_VERSION_STRING))
        return NULL;
    host = h;
    return &sr__mpi_builtin_driver;
}

int sr__fail(int err, const char *fn, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return host->fail(err, fn, "%s", msg);
}

void sr_logf(sr_log_level level, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    host->logf(level, "%s", msg);
}

const char *sr_last_error(void) { return host->last_error(); }
int64_t sr__now_ns(void) { return host->now_ns(); }
int sr__parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) { return host->parse_int(s, lo, hi, out); }
sr_block *sr__block_alloc(size_t nbytes) { return host->block_alloc(nbytes); }
void *sr__block_data(const sr_block *b) { return host->block_data(b); }
void sr__block_unref(sr_block *b) { host->block_unref(b); }
uint64_t sr__block_send_off(sr_block *b) { return host->block_send_off(b); }
sr_block *sr__block_recv_off(uint64_t off) { return host->block_recv_off(off); }
int sr__segment_create(const sr_segment_opts *o, sr_segment *seg) { return host->segment_create(o, seg); }
void sr__segment_detach(sr_segment *seg, bool close_fd) { host->segment_detach(seg, close_fd); }
void sr__launch_env_set(const struct sr_launch_env *e) { host->launch_env_set(e); }
void sr__launch_env_clear(void) { host->launch_env_clear(); }
