#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Sum every test that ran in the given meson build directories (./dev test:
build, build-asan, build-fuzz, whose suite 'fuzz' is the decoder fuzzer's
corpus replay and timed run: one test each, and build-tsan, whose suite
runners of tests/tsan print Criterion-style lines).

Each Criterion binary prints a 'Synthesis' line; its counts are added up
(the suite runners of tests/mpi and tests/tsan print one too). An MPI suite runner
whose job was ended early (a timeout, a worker that left, a crash) has none:
its 'PASS suite/name' and 'FAIL suite/name' lines are counted instead, plus
one failure for the end itself if no test was named failed. Another meson
test without a Synthesis line (a crash, a timeout, a non-Criterion test)
counts as one test, passed or failed according to meson's verdict. The last line
printed is exactly 'N passed, M failed'; the exit status is 1 if M > 0.

For each failed meson test, the last lines of its output that say why (not
Criterion's RUN/PASS/SKIP lines) are printed to stderr just before the sums,
so the tail of a CI log, which is often all that is kept, names the cause.
A meson test that skipped itself (exit 77) counts neither way, but is named
the same way with its last lines, and each build's line on stderr counts the
skips: a runner that exits 77 for a failure (libFuzzer's default for a
finding was one) cannot pass unseen.
"""
import json
import re
import sys

SYN = re.compile(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)")
RUNNER = re.compile(r"^(PASS|FAIL) ([\w-]+/[\w-]+)", re.M)


def runner_lines(text):
    """(passed, failed) from an MPI suite runner's lines; None if it printed none.
    Several ranks may name the same failed test: each test counts once."""
    seen = {}
    for verdict, test in RUNNER.findall(text):
        if seen.get(test) != "FAIL":
            seen[test] = verdict
    if not seen:
        return None
    failed = sum(v == "FAIL" for v in seen.values())
    return len(seen) - failed, failed


EXCERPT_LINES = 30
ROUTINE = re.compile(r"^\[(RUN |PASS|SKIP)\]|^\[====\] Running")


def why_failed(builddir, t, text):
    """The tail of a failed test's output, routine progress lines left out."""
    lines = [l for l in text.splitlines() if l.strip() and not ROUTINE.match(l)]
    print(f"summarize: {builddir}: {t['name']}: {t['result']}; its last lines:", file=sys.stderr)
    for l in lines[-EXCERPT_LINES:]:
        print(f"  | {l[:300]}", file=sys.stderr)


def tally(builddir):
    passed = failed = skipped = 0
    try:
        lines = open(f"{builddir}/meson-logs/testlog.json").read().splitlines()
    except OSError:
        print(f"summarize: no test log in {builddir}", file=sys.stderr)
        return 0, 1, 0
    for line in lines:
        t = json.loads(line)
        ok = t["result"] in ("OK", "EXPECTEDFAIL", "SKIP")
        text = (t.get("stdout") or "") + (t.get("stderr") or "")
        m = SYN.findall(text)
        r = None if m else runner_lines(text)
        if r:
            passed += r[0]
            failed += r[1] + (not ok and r[1] == 0)
        elif m:
            tested, passing, failing, crashing = map(int, m[-1])
            passed += passing
            failed += tested - passing
            if not ok and tested == passing:
                failed += 1  # the binary itself failed after its tests (leak, timeout)
        elif t["result"] != "SKIP":
            passed += ok
            failed += not ok
        if not ok or t["result"] == "SKIP":
            why_failed(builddir, t, text)
        skipped += t["result"] == "SKIP"
    return passed, failed, skipped


def main():
    passed = failed = 0
    for d in sys.argv[1:]:
        p, f, k = tally(d)
        print(f"{d}: {p} passed, {f} failed" + (f", {k} meson tests skipped" if k else ""), file=sys.stderr)
        passed += p
        failed += f
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
