#!/usr/bin/env python3
"""Contracts kept true: the installed headers (sdk/include, core/include) include only the C++
standard library, Boost, and each other, so a plugin or an embedding program builds against the
installed SDK with no other package than the ones mixtrainConfig.cmake finds (Boost). A JSON, TOML
or logging header there would be a dependency the package does not declare.

Usage: installed_headers_include.py [REPO_ROOT]   (default: the repository this script lives in)

Allowed: `#include <name>` of a standard header (no slash and no extension, or one of the C/POSIX
headers listed below), `#include <boost/...>`, and `#include "mixtrain/..."` that names a header
in the same two trees. Prints each other include as "path:line: include" and exits 1; exits 0
when there is none. Python 3 standard library only.
"""
import os
import re
import sys

ROOTS = ("sdk/include", "core/include")
C_HEADERS = {"unistd.h", "signal.h", "sys/types.h", "fcntl.h"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def main(root):
    headers = {}
    for tree in ROOTS:
        base = os.path.join(root, tree)
        for folder, _, files in os.walk(base):
            for f in files:
                if f.endswith((".h", ".hpp")):
                    path = os.path.join(folder, f)
                    headers[os.path.relpath(path, base)] = path
    bad = []
    for rel, path in sorted(headers.items()):
        with open(path, encoding="utf-8") as text:
            for number, line in enumerate(text, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                kind, name = m.groups()
                if kind == "<":
                    standard = "/" not in name and "." not in name
                    ok = standard or name in C_HEADERS or name.startswith("boost/")
                else:
                    ok = name.startswith("mixtrain/") and name in headers
                if not ok:
                    bad.append("%s:%d: %s" % (os.path.relpath(path, root), number, line.strip()))
    for b in bad:
        print(b)
    print("%d header(s) checked, %d foreign include(s)" % (len(headers), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else
                  os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")))
