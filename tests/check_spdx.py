#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Every source, build and script file the repository tracks says its
licence in its first lines (`SPDX-License-Identifier: MIT`, as LICENSE
says), so that a packager's scan and a copied file carry it. Data files
(fuzz corpora, suppressions) and the docs' Markdown are left out."""
import os
import subprocess
import sys

TAG = "SPDX-License-Identifier: MIT"
CODE = ('.c', '.h', '.py', '.sh', '.build', '.1.in', '.map')
NAMED = ('dev', 'meson_options.txt', 'run')


def wanted(path):
    base = os.path.basename(path)
    return base.endswith(CODE) or base in NAMED


def main():
    root = sys.argv[1]
    files = subprocess.run(['git', '-C', root, 'ls-files'], capture_output=True, text=True)
    if files.returncode != 0:
        print("check_spdx: not a git checkout (%s); nothing to check" % files.stderr.strip())
        return 77
    missing = []
    for rel in files.stdout.split():
        if not wanted(rel):
            continue
        with open(os.path.join(root, rel), encoding='utf-8', errors='replace') as f:
            head = f.read(400)
        if TAG not in head:
            missing.append(rel)
    if missing:
        print("%d files without '%s' in their first lines:\n  %s" % (len(missing), TAG, "\n  ".join(missing)))
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
