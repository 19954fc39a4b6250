#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/summarize.py, which ends ./dev test, on made-up test logs: the
sums (Criterion's Synthesis lines, an MPI runner's PASS/FAIL lines, a test
without either), the exit status, the failed tests' last lines printed
before the sums (Criterion's routine lines left out), and a skipped test
counted neither way but named with its last lines."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def build_dir(root, name, tests):
    d = os.path.join(root, name)
    os.makedirs(os.path.join(d, "meson-logs"))
    with open(os.path.join(d, "meson-logs", "testlog.json"), "w") as f:
        for t in tests:
            f.write(json.dumps(t) + "\n")
    return d


def run(*dirs):
    p = subprocess.run([sys.executable, os.path.join(HERE, "summarize.py"), *dirs], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def expect(cond, what):
    if not cond:
        print("check_summarize: FAILED:", what)
        sys.exit(1)


def main():
    syn = "[====] Synthesis: Tested: {} | Passing: {} | Failing: {} | Crashing: 0\n"
    with tempfile.TemporaryDirectory() as root:
        good = build_dir(root, "good", [
            {"name": "s / a", "result": "OK", "stdout": "", "stderr": syn.format(3, 3, 0)},
            {"name": "s / mpi", "result": "OK", "stdout": "PASS rpc/x\nPASS rpc/y\n", "stderr": ""},
            {"name": "s / script", "result": "OK", "stdout": "fine\n", "stderr": ""},
        ])
        rc, out, err = run(good)
        expect(rc == 0, f"all passing: exit status {rc}")
        expect(out.splitlines()[-1] == "6 passed, 0 failed", f"all passing: last line {out!r}")
        expect("its last lines" not in err, "all passing: an excerpt was printed")

        bad = build_dir(root, "bad", [
            {"name": "s / b", "result": "FAIL", "stdout": "",
             "stderr": "[RUN ] s::one\n[PASS] s::one\nworker check failed at x.c:3: boom\n"
                       "[----] x.c:9: Assertion Failed\n" + syn.format(2, 1, 1)},
            {"name": "s / crash", "result": "FAIL", "stdout": "", "stderr": "Segmentation fault\n"},
            {"name": "s / mpi", "result": "FAIL", "stdout": "PASS rpc/x\nFAIL rpc/y\nFAIL rpc/y\n", "stderr": ""},
        ])
        rc, out, err = run(good, bad)
        expect(rc == 1, f"with failures: exit status {rc}")
        expect(out.splitlines()[-1] == "8 passed, 3 failed", f"with failures: last line {out!r}")
        for line in ("s / b: FAIL; its last lines:", "| worker check failed at x.c:3: boom",
                     "| [----] x.c:9: Assertion Failed", "| Segmentation fault", "| FAIL rpc/y"):
            expect(line in err, f"the excerpt lacks {line!r}: {err!r}")
        expect("[RUN ]" not in err and "[PASS]" not in err, f"routine lines in the excerpt: {err!r}")
        skip = build_dir(root, "skip", [
            {"name": "f / fuzz-run", "result": "SKIP", "stdout": "", "stderr": "==1==ERROR: LeakSanitizer\n"},
        ])
        rc, out, err = run(good, skip)
        expect(rc == 0, f"a skip: exit status {rc}")
        expect(out.splitlines()[-1] == "6 passed, 0 failed", f"a skip: last line {out!r}")
        for line in ("f / fuzz-run: SKIP; its last lines:", "| ==1==ERROR: LeakSanitizer", "1 meson tests skipped"):
            expect(line in err, f"a skip: stderr lacks {line!r}: {err!r}")
    print("check_summarize: ok")


if __name__ == "__main__":
    main()
