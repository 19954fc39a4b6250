#!/bin/sh
# SPDX-License-Identifier: MIT
# selftest.sh PROGRAM: the MPI suite runner's lines for its own tests
# (selftest.c) under mpirun -n 4 are the expected ones, a hung test and a
# worker that leaves its job each end the MPI job with a line naming the
# test, and the summary counts what ran.
set -u
here=$(dirname "$0")
prog=$1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
show() { # the runner's lines, quoted: tests/summarize.py must not count them as this test's
  sed 's/^/  | /; s/Synthesis:/Synthesis (of the self-test):/' "$out"
}
expect() { # expect LINE: the run printed exactly this line (file:line as selftest.c)
  if ! sed 's|[^ ]*selftest\.c:[0-9]*: |selftest.c: |' "$out" | grep -qxF -- "$1"; then
    echo "missing line: $1"
    status=1
  fi
}
"$here/run_suite.sh" 1 "$prog" --filter='selftest/*' >"$out" 2>/dev/null
rc=$?
show
[ $rc -ne 0 ] || { echo "exit status 0 despite failing tests"; status=1; }
expect "FAIL selftest/fatal_check_stops_the_test: selftest.c: 1 + 1 == 3: arithmetic fails (rank 0)"
expect "FAIL selftest/expect_goes_on: selftest.c: 0: first (rank 0)"
expect "FAIL selftest/one_rank_fails: selftest.c: rank_() != 3: only here (rank 3)"
expect "FAIL selftest/worker_failure_names_the_rank: selftest.c: sr_spawn(4, fail_on_2, NULL, &o) == 0: sr_spawn: job 'fail2': worker 2 of 4 returned 7 (its report is above) (rank 0)"
expect "SKIP selftest/job_larger_than_the_world: job 'spawn' needs 5 ranks and mpirun gave 4"
expect "SKIP selftest/disabled: disabled"
grep -q "^4 passed, 4 failed, 2 skipped (0 excluded under MPI) on 4 ranks in " "$out" || { echo "missing: the summary"; status=1; }
expect "[====] Synthesis: Tested: 8 | Passing: 4 | Failing: 4 | Crashing: 0"
for t in passes shared_page_and_jobs_on_the_first_ranks shared_pipe_crosses_ranks what_the_checks_let_run; do
  grep -q "^PASS selftest/$t (" "$out" || { echo "missing: PASS selftest/$t"; status=1; }
done
bound() { # bound TEST LINE-REGEX: TEST alone ends the MPI job with a line naming it
  "$here/run_suite.sh" 1 "$prog" --filter="selftest_bounds/$1" >"$out" 2>/dev/null
  rc=$?
  show
  [ $rc -ne 0 ] || { echo "selftest_bounds/$1: exit status 0"; status=1; }
  grep -q -- "$2" "$out" || { echo "selftest_bounds/$1: no line matching '$2'"; status=1; }
}
bound hang "^FAIL selftest_bounds/hang: rank [0-3]: timed out after 2 s (the test's bound); ending the MPI job$"
bound exit_in_a_job "^FAIL selftest_bounds/exit_in_a_job: rank 1: left its job with _exit(3) (its report is above); ending the MPI job$"
exit $status
