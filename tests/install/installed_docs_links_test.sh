#!/usr/bin/env bash
# The installed documentation's relative links resolve: `cmake --install` of the current build
# into a fresh prefix, then docs_links_resolve.py over <prefix>/share/doc/mixtrain (the install
# points the documents' links into sdk/include/ and core/include/ at <prefix>/include,
# cmake/MixtrainDocLinks.cmake). Run after `cmake --build`, as the install test is.
set -euo pipefail
: "${MIXTRAIN_BUILD_DIR:?}" "${MIXTRAIN_SOURCE_DIR:?}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mixtrain-docs-links.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cmake --install "$MIXTRAIN_BUILD_DIR" --prefix "$tmp/prefix" >"$tmp/install.log"
docdir=$tmp/prefix/share/doc/mixtrain
[[ -f $docdir/docs/writing-plugins.md ]] || { echo "FAIL: no $docdir/docs/writing-plugins.md" >&2; exit 1; }
python3 "$MIXTRAIN_SOURCE_DIR/tests/install/docs_links_resolve.py" "$docdir"
echo "every relative link of the installed documentation resolves"
