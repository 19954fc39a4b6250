/* SPDX-License-Identifier: MIT */
/* sr_version (shmrpc/version.h): the version this library was built as. */
#include "shmrpc/version.h"

const char *sr_version(void) { return SR_VERSION_STRING; }
