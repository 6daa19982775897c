#!/usr/bin/env python3
"""Contracts kept true: every name a header's comments cite as code exists in the source tree.

Usage: cited_names_exist.py [REPO_ROOT]   (default: the repository this script lives in)

The headers are every .h/.hpp/.cuh under sdk/include, core/include and core/src. In their
comments, a citation of code is
  - a qualified name, backticked or not: Model::set_mode, Layer::make_decode_state(), sdk::facet;
  - a backticked identifier or call: `Decoder`, `decode(ids)`, `plan_liveness`;
  - an unbackticked call with empty parentheses: allocate(), end_decode().
Backticked text that is not an identifier (a command line, a shape, a config key with dots, a
string value) is not code and is skipped.

A cited name exists when each of its parts (Model and set_mode) occurs as a word in the tree's
code: C, C++ and CUDA sources with their comments removed (string literals kept: op types and
config keys are strings), and every CMake, Python, shell and TOML file whole. Documentation
(*.md) does not count, so a name that lives on only in comments and docs is reported.

Prints each citation whose name is missing as "path:line: `name`" and exits 1; exits 0 when
every cited name exists. Python 3 standard library only.
"""
import os
import re
import sys

HEADER_ROOTS = ("sdk/include", "core/include", "core/src")
HEADER_EXTS = (".h", ".hpp", ".cuh")
CODE_EXTS = (".h", ".hpp", ".cuh", ".c", ".cc", ".cpp", ".cu")
WHOLE_EXTS = (".cmake", ".py", ".sh", ".toml", ".txt", ".in")
SKIP_DIRS = {".git", "build", "third_party", "_deps"}

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# A::b, A::b::c(), ~A, operator names left out.
QUALIFIED = re.compile(r"(?<![\w:])((?:%s::)+~?%s)(?![\w])" % (IDENT, IDENT))
BACKTICKED = re.compile(r"`([^`\n]+)`")
CODE_IN_TICKS = re.compile(r"^(?:%s::)*~?(%s)(?:\([^()]*\))?$" % (IDENT, IDENT))
EMPTY_CALL = re.compile(r"(?<![\w.:>`/-])(%s)\(\)" % IDENT)
WORD = re.compile(IDENT)

# C++ keywords and standard-library words a comment may cite that are not the project's own.
LANGUAGE = {
    "std", "sdk", "core", "mixtrain", "size_t", "int64_t", "int32_t", "uint64_t", "uint32_t",
    "nullptr", "true", "false", "const", "noexcept", "void", "int", "float", "double", "bool",
}


# Scopes outside the project: their members are not in the tree.
LANGUAGE_SCOPES = {"std"}

# Citations that name what no longer exists on purpose, with the reason.
KNOWN = {
    # The ABI version history lists what each earlier version added or replaced.
    ("sdk/include/mixtrain/sdk/version.h", "convolution_facet"): "a getter of ABI version 7",
}


def strip_c_comments(text):
    """The code of a C-family source: comments removed, string and char literals kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        elif c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            k = text.find("(", i)
            delim = ")" + text[i + 2:k] + '"'
            j = text.find(delim, k)
            j = n if j < 0 else j + len(delim)
            out.append(text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def comments_by_line(text):
    """(line number, comment text) for every // comment and every line of a /* */ comment."""
    found = []
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            found.append((line, text[i + 2:j]))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            for k, part in enumerate(text[i + 2:j].split("\n")):
                found.append((line + k, part))
            line += text.count("\n", i, j)
            i = j + 2
        elif c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return found


SCOPE = re.compile(r"\b(?:class|struct|union|enum\s+class|enum|namespace)\s+"
                   r"(?:MIXTRAIN_\w+\s+)?([\w:]+)[^;{()]*\{")
QUALIFIED_IN_CODE = re.compile(r"(%s)::(~?%s)" % (IDENT, IDENT))


def scopes(code, members):
    """Adds to members[scope] every word inside each class, struct, enum or namespace body."""
    for m in SCOPE.finditer(code):
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        name = m.group(1).split("::")[-1]
        members.setdefault(name, set()).update(WORD.findall(code[m.end():j]))


def citations(comment):
    """The names a comment cites as code, each as the list of its parts."""
    names = []
    masked = comment
    for m in BACKTICKED.finditer(comment):
        body = m.group(1).strip()
        if CODE_IN_TICKS.match(body):
            head = body.split("(", 1)[0]
            names.append([p.lstrip("~") for p in head.split("::")])
        masked = masked.replace(m.group(0), " ")
    for m in QUALIFIED.finditer(masked):
        names.append([p.lstrip("~") for p in m.group(1).split("::")])
    for m in EMPTY_CALL.finditer(masked):
        names.append([m.group(1)])
    return names


def walk(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build")]
        for f in filenames:
            yield os.path.join(dirpath, f)


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    words = set(LANGUAGE)
    members = {}  # scope name -> the words inside its bodies
    qualified = set()  # "A::b" as the code writes it (definitions, calls, enumerators)
    for path in walk(root):
        if path.endswith(CODE_EXTS):
            code = strip_c_comments(read(path))
            words.update(WORD.findall(code))
            scopes(code, members)
            qualified.update(a + "::" + b.lstrip("~") for a, b in QUALIFIED_IN_CODE.findall(code))
        elif path.endswith(WHOLE_EXTS) or os.path.basename(path) == "CMakeLists.txt":
            words.update(WORD.findall(read(path)))
    missing = []
    checked = 0
    for top in HEADER_ROOTS:
        for path in sorted(walk(os.path.join(root, top))):
            if not path.endswith(HEADER_EXTS):
                continue
            for line, comment in comments_by_line(read(path)):
                for parts in citations(comment):
                    checked += 1
                    absent = [p for p in parts if p not in words]
                    if not absent and len(parts) > 1 and parts[0] not in LANGUAGE_SCOPES:
                        # A::b names b as a member of A: declared in A's body, or written A::b.
                        scope, name = parts[-2], parts[-1]
                        written = scope + "::" + name
                        if name not in members.get(scope, ()) and written not in qualified:
                            absent = [written]
                    if (os.path.relpath(path, root), "::".join(parts)) in KNOWN:
                        absent = []
                    if absent:
                        missing.append("%s:%d: `%s` (%s not in the code)" %
                                       (os.path.relpath(path, root), line, "::".join(parts),
                                        ", ".join(absent)))
    for m in missing:
        print(m)
    print("%d citation(s) checked, %d name(s) missing" % (checked, len(missing)))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
