#!/bin/sh
# SPDX-License-Identifier: MIT
# run.sh COMMAND [ARGS...]: run a program of the ThreadSanitizer build (a
# tests/tsan suite runner, or shmrun with a program) with every TSan report
# of every process it starts written to a fresh folder; the test fails if
# the command fails or if any report is left there. The suite runners take
# their reports test by test (tests/tsan/runner.c, SRT_TSAN_DIR); what is
# left at the end is printed here.
dir=$(mktemp -d "${TMPDIR:-/tmp}/shmrpc-tsan.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
# halt_on_error=0: every report of a run is seen, not only the first.
# second_deadlock_stack=1: lock-order reports show both acquisitions.
# ignore_noninstrumented_modules=1: what the libraries built without TSan
# (jemalloc, OpenBLAS, liburing, zlib) do through the intercepted calls is
# not tracked. jemalloc re-initialises its mutexes in a forked child while
# TSan still counts them held by the parent's thread ("double lock of a
# mutex" on its first lock in a new thread). TSan cannot see inside these
# libraries anyway; the hand-offs of memory through jemalloc are annotated
# in our heap instead (shm/base/tsan.h). No report of our code is suppressed.
# handle_segv=0: a worker that crashes on purpose (the crash-report tests)
# gets the project's own crash report, as in the other builds.
export TSAN_OPTIONS="log_path=$dir/tsan halt_on_error=0 second_deadlock_stack=1 ignore_noninstrumented_modules=1 handle_segv=0 ${TSAN_OPTIONS:-}"
export SRT_TSAN_DIR="$dir"
"$@"
rc=$?
n=0
for f in "$dir"/tsan.*; do
    [ -e "$f" ] || continue
    n=$((n + 1))
    echo "==== ThreadSanitizer report of pid ${f##*.} ====" >&2
    cat "$f" >&2
done
if [ "$n" -gt 0 ]; then
    echo "run.sh: ThreadSanitizer reported in $n process(es) of: $*" >&2
    exit 1
fi
exit $rc
