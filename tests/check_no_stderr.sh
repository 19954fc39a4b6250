#!/bin/sh
# SPDX-License-Identifier: MIT
# lib/ and shm/ write to stderr only through the log (shm/base/log.c): one line,
# one write(2), prefixed with the worker. A bare fprintf(stderr, ...) would
# interleave with other threads' lines and name nobody.
# Usage: check_no_stderr.sh SOURCE_ROOT
root=${1:?usage: check_no_stderr.sh SOURCE_ROOT}
hits=$(grep -rnE 'fprintf *\( *stderr|fputs *\(.*stderr|putc *\(.*stderr|perror *\(|dprintf *\( *(2|STDERR_FILENO)|STDERR_FILENO' \
         --include='*.c' --include='*.h' "$root/lib" "$root/shm" | grep -v "^$root/shm/base/log\.c:")
if [ -n "$hits" ]; then
    echo "stderr written outside the log (use sr_logf / sr__log_text, shm/base/log.h):"
    echo "$hits"
    exit 1
fi
# The checker must see the tree: the log itself writes to STDERR_FILENO.
grep -q STDERR_FILENO "$root/shm/base/log.c" || { echo "check_no_stderr.sh: $root/shm/base/log.c not found"; exit 1; }
exit 0
