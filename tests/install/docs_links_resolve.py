#!/usr/bin/env python3
"""Every relative link of the documentation resolves, in the source tree and in an install.

Usage: docs_links_resolve.py ROOT [ROOT...]

Each ROOT is a folder whose *.md files are checked, recursively (folders named build*, hidden
ones such as .git or the GPU kit's .debs, and third_party are passed over): a source tree, or an installed <docdir> (share/doc/mixtrain). A
link is a markdown target `](target)` that names no scheme (http:, mailto:) and is not an anchor
alone; it must name a file or folder relative to the document (its #anchor aside). The install
rewrites the links into the source tree's headers to the installed ones (cmake/MixtrainDocLinks.cmake),
so the same documents must resolve in both places.

Prints "path: target" per broken link and exits 1; exits 0 when every link resolves. Python 3
standard library only.
"""
import os
import re
import sys

LINK = re.compile(r"\]\(([^()\s]+)\)")
SKIP = re.compile(r"^(build.*|\..*|third_party|_deps)$")


def broken_links(root):
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not SKIP.match(d)]
        for name in sorted(files):
            if not name.endswith(".md"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for m in LINK.finditer(text):
                target = m.group(1)
                if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("#"):
                    continue
                target = target.split("#")[0]
                if not os.path.exists(os.path.normpath(os.path.join(folder, target))):
                    yield os.path.relpath(path, root), m.group(1)


def main(roots):
    if not roots:
        print(__doc__, file=sys.stderr)
        return 2
    bad = [(root, p, t) for root in roots for p, t in broken_links(root)]
    for root, path, target in bad:
        print(f"{os.path.join(root, path)}: {target}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
