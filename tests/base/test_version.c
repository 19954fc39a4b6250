/* SPDX-License-Identifier: MIT */
/* The version (shmrpc/version.h): the library's sr_version() is the version
 * of the headers, and both are the project's (meson.build passes it in
 * SR_TEST_PROJECT_VERSION). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shmrpc/shmrpc.h"

Test(version, runtime_version_is_the_headers)
{
    cr_assert_str_eq(sr_version(), SR_VERSION_STRING);
}

Test(version, macros_agree_with_the_string)
{
    char s[64];
    snprintf(s, sizeof(s), "%d.%d.%d", SR_VERSION_MAJOR, SR_VERSION_MINOR, SR_VERSION_PATCH);
    cr_assert_str_eq(s, SR_VERSION_STRING);
    cr_assert_eq(SR_VERSION_NUMBER, SR_VERSION_MAJOR * 10000 + SR_VERSION_MINOR * 100 + SR_VERSION_PATCH);
    cr_assert(SR_VERSION_NUMBER >= SR_VERSION_AT(0, 1, 0));
}

Test(version, is_the_project_version)
{
    const char *p = getenv("SR_TEST_PROJECT_VERSION");
    cr_assert(p, "SR_TEST_PROJECT_VERSION is not set (tests/base/meson.build sets it)");
    cr_assert_str_eq(sr_version(), p, "sr_version() is %s, meson.build's project version %s", sr_version(), p);
}
