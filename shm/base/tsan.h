/* SPDX-License-Identifier: MIT */
/* ThreadSanitizer annotations at the hand-offs it cannot see.
 *
 * TSan follows happens-before inside one process. Two kinds of edge in
 * shmrpc run where it cannot look:
 *   - through another process: a worker's thread writes a block and sends
 *     it; a peer uses it and sends it back or frees it remotely; another
 *     thread of the first worker then reads it or frees it. The edge runs
 *     through the peer's ring accesses, which this process's TSan never
 *     sees.
 *   - through jemalloc, which is not instrumented (and whose mutexes TSan is
 *     told to ignore: tests/tsan/run.sh): a block one thread frees into the
 *     arena and another thread gets back from it.
 * Each is made visible where the hand-off happens, and nowhere else:
 *   sr__tsan_release(p)  the calling thread is done with the object at p
 *                        (it sends it, frees it remotely, frees it);
 *   sr__tsan_acquire(p)  the calling thread takes over the object at p
 *                        (it received it, drained it, allocated it);
 * pairing on the address p, as a release store and an acquire load of one
 * atomic would. Outside a TSan build both are nothing. */
#ifndef SR_SHM_TSAN_H
#define SR_SHM_TSAN_H

#if !defined(SR__SEES_BASE)
#error "tsan.h is the seam of the base layer, for it and the layers above it only (docs/ARCHITECTURE.md)"
#endif
#if defined(__SANITIZE_THREAD__)
#define SR_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SR_TSAN 1
#endif
#endif

#ifdef SR_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define sr__tsan_acquire(p) __tsan_acquire((void *)(p))
#define sr__tsan_release(p) __tsan_release((void *)(p))
#else
#define sr__tsan_acquire(p) ((void)(p))
#define sr__tsan_release(p) ((void)(p))
#endif

#endif
