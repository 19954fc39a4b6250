#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Every relative link in README.md and docs/ names a file of the repository,
and no page points outside it (the docs must stand alone).

usage: check_doc_links.py SOURCE_ROOT; exits 1 listing each broken link."""
import glob
import os
import re
import sys

LINK = re.compile(r"\]\(([^)\s]+)\)")
OUTSIDE = re.compile(r"\.\./shared/|\.\./\.\./")


def pages(root):
    yield os.path.join(root, "README.md")
    yield from sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))


def broken(root, page):
    text = open(page, encoding="utf-8").read()
    here = os.path.dirname(page)
    for m in LINK.finditer(text):
        target = m.group(1)
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        path = target.split("#", 1)[0]
        full = os.path.normpath(os.path.join(here, path))
        if not full.startswith(root + os.sep) or not os.path.exists(full):
            yield f"{os.path.relpath(page, root)}: link '{target}' does not resolve inside the repository"
    for m in OUTSIDE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        yield f"{os.path.relpath(page, root)}:{line}: names a path outside the repository ('{m.group(0)}')"


def main():
    root = os.path.realpath(sys.argv[1])
    bad = [b for page in pages(root) for b in broken(root, page)]
    for b in bad:
        print(b)
    print(f"{len(bad)} broken links" if bad else "every link resolves")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
