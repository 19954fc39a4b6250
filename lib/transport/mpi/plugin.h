/* SPDX-License-Identifier: MIT */
/* The MPI transport as a plug-in (internal to the transport layer).
 *
 * Open MPI is loaded only by a program that runs under mpirun: the MPI
 * transport (boot.c, mpi_tport.c, driver.c) is built into its own shared
 * object, libshmrpc-mpi.so, installed beside libshmrpc, and load.c opens it
 * (dlopen) when sr_init finds mpirun's environment. A single-host program
 * neither links nor loads libmpi.
 *
 * The plug-in does not link libshmrpc: the library exports its public API
 * only (docs/RELEASING.md), and a program linked with libshmrpc.a exports
 * nothing. Instead the loader hands the plug-in the table below: the
 * internal functions the transport calls, from the library that loaded it
 * (so the plug-in's errors land in the caller's sr_last_error() and its
 * blocks in the caller's heap). plugin.c, linked into the plug-in only,
 * defines those functions by forwarding through the table.
 *
 * Both sides must be of one build: the table carries the ABI number below
 * and the library's version, and the entry refuses any other (a plug-in of
 * another version answers NULL and the loader says so, naming the file).
 *
 * Programs that link the transport in themselves (the MPI test runners and
 * benches: sr__mpi_use_comm) link mpi_builtin (lib/meson.build), whose
 * sr__mpi_builtin_driver load.c takes instead of opening the plug-in.
 */
#ifndef SR_MPI_PLUGIN_H
#define SR_MPI_PLUGIN_H

#if !defined(SR__IN_TRANSPORT)
#error "plugin.h is private to the transport layer (docs/ARCHITECTURE.md)"
#endif
#include <stdint.h>

#include "driver.h"
#include "heap.h"
#include "segment.h"
#include "shmrpc/log.h"

/* Bump when struct sr_mpi_host or struct sr_tport_driver changes. */
#define SR_MPI_PLUGIN_ABI 1u
/* The plug-in's one exported symbol, of type sr_mpi_plugin_entry_fn. */
#define SR_MPI_PLUGIN_ENTRY "sr_mpi_plugin_entry"

struct sr_mpi_host {
    unsigned abi;        /* SR_MPI_PLUGIN_ABI */
    const char *version; /* SR_VERSION_STRING of the loading library */
    int (*fail)(int err, const char *fn, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
    void (*logf)(sr_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    const char *(*last_error)(void);
    int64_t (*now_ns)(void);
    int (*parse_int)(const char *s, int64_t lo, int64_t hi, int64_t *out);
    sr_block *(*block_alloc)(size_t nbytes);
    void *(*block_data)(const sr_block *b);
    void (*block_unref)(sr_block *b);
    uint64_t (*block_send_off)(sr_block *b);
    sr_block *(*block_recv_off)(uint64_t off);
    int (*segment_create)(const sr_segment_opts *o, sr_segment *seg);
    void (*segment_detach)(sr_segment *seg, bool close_fd);
    void (*launch_env_set)(const struct sr_launch_env *e);
    void (*launch_env_clear)(void);
};

/* The driver of the plug-in, once host is kept; NULL when host is of
 * another ABI or version. Called once per process, under sr_init's lock. */
typedef const struct sr_tport_driver *sr_mpi_plugin_entry_fn(const struct sr_mpi_host *host);

/* driver.c: the MPI transport's driver, in the plug-in or linked in. Weak:
 * NULL in a library or program without it (hidden: never a dynamic symbol). */
extern const struct sr_tport_driver sr__mpi_builtin_driver __attribute__((weak, visibility("hidden")));

#endif
