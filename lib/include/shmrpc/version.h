/* SPDX-License-Identifier: MIT */
/* shmrpc: the library's version.
 *
 * The macros are the version of the headers a program was compiled against;
 * sr_version() is the version of the library it runs with. They follow
 * meson.build's project version (the configure step refuses to run when
 * they differ) and the release rules of docs/RELEASING.md: a program built
 * against MAJOR.x runs with any later MAJOR.y of the same SONAME. */
#ifndef SHMRPC_VERSION_H
#define SHMRPC_VERSION_H

#if defined(SR__BUILDING) && !defined(SR__SEES_BASE)
#error "shmrpc/version.h belongs to the base layer, which this layer sits below (docs/ARCHITECTURE.md)"
#endif
#include "error.h" /* SR_API */

#ifdef __cplusplus
extern "C" {
#endif

#define SR_VERSION_MAJOR 0
#define SR_VERSION_MINOR 1
#define SR_VERSION_PATCH 0
#define SR_VERSION_STRING "0.1.0"
/* One number that orders versions: #if SR_VERSION_NUMBER >= SR_VERSION_AT(0, 2, 0). */
#define SR_VERSION_AT(major, minor, patch) ((major) * 10000 + (minor) * 100 + (patch))
#define SR_VERSION_NUMBER SR_VERSION_AT(SR_VERSION_MAJOR, SR_VERSION_MINOR, SR_VERSION_PATCH)

/* The version of the library this program runs with, "MAJOR.MINOR.PATCH"
 * (static storage; SR_VERSION_STRING of the library's own build). */
SR_API const char *sr_version(void);

#ifdef __cplusplus
}
#endif

#endif
