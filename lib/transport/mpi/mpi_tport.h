/* SPDX-License-Identifier: MIT */
/* The MPI transport (internal; built with SR_HAVE_MPI): the seam's
 * (transport.h) instance that reaches the ranks of other hosts.
 *
 * Wire: one message is a frame (tag SR_MPI_TAG_FRAME): the 64-byte head,
 * the count and lengths of its parts, and the bytes of the small parts; each
 * large part follows as a message of its own (tag SR_MPI_TAG_PART), sent
 * straight from the sender's shared heap (no copy) and received straight
 * into a new block of the receiver's heap. MPI keeps the order of messages
 * between two ranks with one tag; a message's frame and its large parts are
 * posted under one lock, so two senders' parts never interleave.
 *
 * Threads: any thread sends (MPI_THREAD_MULTIPLE); the consumer (recv_burst,
 * pending, poll_ns) completes the sends in flight, dropping their parts
 * (marshal->sent), and receives. Nothing rings
 * a doorbell across hosts: poll_ns tells the consumer how soon to poll again
 * (0 while a send is in flight or a frame waits; idle, it backs off from
 * SR_MPI_POLL_MIN_NS to SR_MPI_POLL_MAX_NS in proportion to the time since
 * the last message).
 *
 * Liveness: a rank on another host that dies ends the job (mpirun's abort,
 * docs/MULTIHOST.md): the instance has no liveness group.
 *
 * Lifetime: created by the driver (driver.c) after the shared-memory transport attached
 * (a collective over the job's communicator: the names are exchanged),
 * destroyed in sr_shutdown after the RPC layer's threads stopped, before the
 * job's communicator is freed.
 */
#ifndef SR_MPI_TPORT_H
#define SR_MPI_TPORT_H

#if !defined(SR__IN_TRANSPORT)
#error "mpi_tport.h is private to the transport layer (docs/ARCHITECTURE.md)"
#endif
#include "mpi_job.h"
#include "transport.h"

#define SR_MPI_TAG_FRAME 1
#define SR_MPI_TAG_PART 2
#define SR_MPI_POLL_MIN_NS 5000   /* idle poll interval right after a message */
#define SR_MPI_POLL_MAX_NS 1000000 /* and at most */

int sr__mpi_tport_create(struct sr_mpi_job *job, const char *name, sr_tport **out);
void sr__mpi_tport_destroy(sr_tport *t);

#endif
