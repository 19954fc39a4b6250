#!/bin/sh
# SPDX-License-Identifier: MIT
# run_fuzz.sh HARNESS CORPUS [SECONDS]
#   SECONDS 0: replay every input of CORPUS once (each must pass);
#   otherwise fuzz for SECONDS (default: $FUZZ_SECONDS, else 60) starting
#   from CORPUS, which is only read: new inputs go to $FUZZ_WORK (kept
#   between runs) or to a scratch directory.
# A crashing input is kept in $FUZZ_ARTIFACTS (default: ./fuzz-artifacts);
# replay it with: HARNESS FILE. The harness's own stderr (the library's
# messages about the bad input, thousands a second) is closed during the
# timed run; the fuzzer's and the sanitizers' reports still show.
set -eu
# libFuzzer's default exit code for a finding (77) is meson's "skipped":
# a finding must fail the test, so every run exits 1 on one.
fail='-error_exitcode=1 -timeout_exitcode=1'
harness=$1 corpus=$2 secs=${3:-${FUZZ_SECONDS:-60}}
art=${FUZZ_ARTIFACTS:-fuzz-artifacts}
mkdir -p "$art"
if [ "$secs" = 0 ]; then
  exec "$harness" $fail -artifact_prefix="$art/" "$corpus"/*
fi
if [ -n "${FUZZ_WORK:-}" ]; then
  work=$FUZZ_WORK
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
rc=0
"$harness" $fail -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=4096 -use_value_profile=1 \
  -close_fd_mask=2 -print_final_stats=1 -artifact_prefix="$art/" "$work" "$corpus" || rc=$?
[ $rc -eq 0 ] || echo "run_fuzz.sh: the fuzzer failed (exit $rc); the input is in $art/" >&2
exit $rc
