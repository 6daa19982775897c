#!/usr/bin/env bash
# The installed SDK works for an out-of-tree author:
#   1. `cmake --install` of the current build into a fresh prefix has the promised layout (with
#      the documentation under share/doc/mixtrain) and no test plugins;
#   2. samples/custom_scaler, custom_policy and embed configure and build against that prefix
#      alone (same compiler, ccache when the main build uses it);
#   3. the installed bin/mixtrain trains the quickstart with the sample scaler (found through
#      [plugins] paths, relative to the config) and the sample policy (through
#      MIXTRAIN_PLUGIN_PATH), writing summary.json;
#   4. the embed sample trains and saves;
#   5. `cmake --install` of a sample puts its plugin where the installed executable finds it,
#      whatever the sample's own libdir (configured as lib64 here);
#   6. samples/custom_optimizer (Lion) builds; its loss falls; a resume from its step-30
#      checkpoint logs the same losses as the uninterrupted run.
# The temporary folder is removed on success and kept (path printed) on failure.
set -euo pipefail

: "${MIXTRAIN_BUILD_DIR:?}" "${MIXTRAIN_SOURCE_DIR:?}"
gen=${MIXTRAIN_TEST_GENERATOR:-Ninja}
build_type=${MIXTRAIN_TEST_BUILD_TYPE:-Release}
[[ -n $build_type ]] || build_type=Release

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mixtrain-install-test.XXXXXX")
ok=0
finish() {
  if [[ $ok == 1 ]]; then rm -rf "$tmp"; else echo "FAILED; files kept in $tmp" >&2; fi
}
trap finish EXIT
prefix=$tmp/prefix
unset MIXTRAIN_PLUGIN_PATH

step() { echo "== $* ($SECONDS s)"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_file() { [[ -f $1 ]] || fail "missing $1"; }

step "install $MIXTRAIN_BUILD_DIR into $prefix"
cmake --install "$MIXTRAIN_BUILD_DIR" --prefix "$prefix" >"$tmp/install.log"
expect_file "$prefix/bin/mixtrain"
expect_file "$prefix/include/mixtrain/sdk/plugin.h"
expect_file "$prefix/include/mixtrain/core/train/trainer.h"
expect_file "$prefix/lib/libmixtrain_sdk.so"
expect_file "$prefix/lib/libmixtrain_core.so"
expect_file "$prefix/lib/mixtrain/plugins/libmixtrain_scalers.so"
expect_file "$prefix/lib/mixtrain/plugins/libmixtrain_backend_cpu.so"
expect_file "$prefix/lib/cmake/mixtrain/mixtrainConfig.cmake"
expect_file "$prefix/lib/cmake/mixtrain/mixtrainConfigVersion.cmake"
expect_file "$prefix/lib/cmake/mixtrain/mixtrainTargets.cmake"
expect_file "$prefix/lib/cmake/mixtrain/MixtrainPlugin.cmake"
# The documentation, as in the source tree (so relative links resolve): docs/, every plugin's
# README, the samples' sources.
docdir=$prefix/share/doc/mixtrain
expect_file "$docdir/README.md"
expect_file "$docdir/configs/quickstart.toml"  # the configs the samples' READMEs run
# The core finds libmixtrain_sdk beside it (a program linked --as-needed names only the core),
# and exports none of the support library's helpers, which each plugin carries for itself.
readelf -d "$prefix/lib/libmixtrain_core.so" | grep -q 'R.*PATH.*\$ORIGIN' ||
  fail "libmixtrain_core.so has no \$ORIGIN run path"
# To a file first: grep -q quitting early would end nm with SIGPIPE, and pipefail would hide a
# match.
nm -D --defined-only "$prefix/lib/libmixtrain_core.so" | c++filt >"$tmp/core-exports.txt"
if grep -q 'mixtrain::sdk::AtomicFileWriter::\|mixtrain::sdk::BackendArgumentChecks::' \
   "$tmp/core-exports.txt"; then
  fail "libmixtrain_core.so exports the support library's helpers"
fi
for f in "$MIXTRAIN_SOURCE_DIR"/docs/*.md "$MIXTRAIN_SOURCE_DIR"/plugins/*/README.md; do
  expect_file "$docdir/${f#"$MIXTRAIN_SOURCE_DIR"/}"
done
for f in $(cd "$MIXTRAIN_SOURCE_DIR" && git ls-files samples 2>/dev/null || find samples -type f); do
  expect_file "$docdir/$f"
done
expect_file "$docdir/samples/custom_scaler/adaptive_loss_scaler.cpp"
[[ -d $docdir/plugins/scalers ]] && [[ ! -e $docdir/plugins/scalers/CMakeLists.txt ]] ||
  fail "plugin sources were installed as documentation"
if compgen -G "$prefix/lib/mixtrain/plugins/libmixtrain_test_*" >/dev/null; then
  fail "test plugins were installed: $(ls "$prefix"/lib/mixtrain/plugins/libmixtrain_test_*)"
fi

cmake_args=(-G "$gen" -DCMAKE_BUILD_TYPE="$build_type" -DCMAKE_PREFIX_PATH="$prefix"
            -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_INSTALL_LIBDIR=lib64)
[[ -n ${MIXTRAIN_TEST_CXX:-} ]] && cmake_args+=(-DCMAKE_CXX_COMPILER="$MIXTRAIN_TEST_CXX")
[[ -n ${MIXTRAIN_TEST_LAUNCHER:-} ]] && cmake_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$MIXTRAIN_TEST_LAUNCHER")
for sample in custom_scaler custom_policy embed; do
  step "build samples/$sample out of tree"
  # A copy, so nothing can reach back into the source tree through relative paths.
  cp -r "$MIXTRAIN_SOURCE_DIR/samples/$sample" "$tmp/src-$sample"
  cmake -S "$tmp/src-$sample" -B "$tmp/build-$sample" "${cmake_args[@]}" >"$tmp/configure-$sample.log" 2>&1 ||
    { cat "$tmp/configure-$sample.log"; fail "configure of $sample"; }
  cmake --build "$tmp/build-$sample" -j2 >"$tmp/build-$sample.log" 2>&1 ||
    { cat "$tmp/build-$sample.log"; fail "build of $sample"; }
done
expect_file "$tmp/build-custom_scaler/libmixtrain_adaptive_scaler.so"
expect_file "$tmp/build-custom_policy/libmixtrain_bf16_except.so"

step "train with the installed mixtrain and both sample plugins"
mkdir -p "$tmp/run"
cp "$MIXTRAIN_SOURCE_DIR/configs/quickstart.toml" "$tmp/run/quickstart.toml"
printf '\n[plugins]\npaths = ["../build-custom_scaler"]\n' >>"$tmp/run/quickstart.toml"
MIXTRAIN_PLUGIN_PATH="$tmp/build-custom_policy" "$prefix/bin/mixtrain" train "$tmp/run/quickstart.toml" \
  --set scaler.type=adaptive --set scaler.min_interval=10 \
  --set precision.policy=bf16-except --set run.steps=60 --set run.eval_every=0 \
  --set backend.threads=2 --run-dir "$tmp/run/out" >"$tmp/train.log" 2>&1 ||
  { cat "$tmp/train.log"; fail "mixtrain train with the sample plugins"; }
expect_file "$tmp/run/out/summary.json"
grep -q 'adaptive' "$tmp/run/out/config.toml" || fail "resolved config does not name the adaptive scaler"
grep -q 'bf16-except' "$tmp/run/out/config.toml" || fail "resolved config does not name bf16-except"
grep -q "layer 'head'.*fp32 (fp32_layers)" "$tmp/train.log" || { cat "$tmp/train.log"; fail "bf16-except did not keep head in fp32"; }

step "run the embed sample"
"$tmp/build-embed/embed_train" "$tmp/run/embed" >"$tmp/embed.log" 2>&1 ||
  { cat "$tmp/embed.log"; fail "embed_train"; }
expect_file "$tmp/run/embed/summary.json"
grep -q '^trained 200 steps' "$tmp/embed.log" || { cat "$tmp/embed.log"; fail "embed_train summary"; }
grep -qE '^[1-9][0-9]* metrics records seen in-process; the last: \{' "$tmp/embed.log" ||
  { cat "$tmp/embed.log"; fail "embed_train's on_record"; }
# A malformed argument is refused (exit 2), not dropped.
set +e
"$tmp/build-embed/embed_train" "$tmp/run/embed-bad" run.steps=5 >"$tmp/embed-bad.log" 2>&1
rc=$?
set -e
[[ $rc -eq 2 ]] && grep -q "is not --set key=value" "$tmp/embed-bad.log" ||
  { cat "$tmp/embed-bad.log"; fail "embed_train took a malformed argument (exit $rc)"; }

step "install the sample scaler next to the built-in plugins"
cmake --install "$tmp/build-custom_scaler" --prefix "$prefix" >/dev/null
expect_file "$prefix/lib/mixtrain/plugins/libmixtrain_adaptive_scaler.so"
"$prefix/bin/mixtrain" plugins >"$tmp/plugins.log" 2>&1 || { cat "$tmp/plugins.log"; fail "mixtrain plugins"; }
grep -q 'adaptive' "$tmp/plugins.log" || { cat "$tmp/plugins.log"; fail "installed adaptive scaler not listed"; }

# samples/custom_optimizer (Lion, the worked example of docs/writing-plugins.md §11): it builds
# out of tree, a short run's loss falls, and a run resumed from its step-30 checkpoint logs the
# same losses as the uninterrupted run at steps 31..60, which needs the momentum restored through
# state_tensors(). Both runs are made here; no number comes from elsewhere.
step "build samples/custom_optimizer out of tree"
cp -r "$MIXTRAIN_SOURCE_DIR/samples/custom_optimizer" "$tmp/src-custom_optimizer"
cmake -S "$tmp/src-custom_optimizer" -B "$tmp/build-custom_optimizer" "${cmake_args[@]}" \
  >"$tmp/configure-custom_optimizer.log" 2>&1 ||
  { cat "$tmp/configure-custom_optimizer.log"; fail "configure of custom_optimizer"; }
cmake --build "$tmp/build-custom_optimizer" -j2 >"$tmp/build-custom_optimizer.log" 2>&1 ||
  { cat "$tmp/build-custom_optimizer.log"; fail "build of custom_optimizer"; }
expect_file "$tmp/build-custom_optimizer/libmixtrain_lion.so"

step "train with the sample Lion optimizer, then resume from its step-30 checkpoint"
mkdir -p "$tmp/lion"
cp "$MIXTRAIN_SOURCE_DIR/configs/quickstart.toml" "$tmp/lion/quickstart.toml"
lion_args=(--set optimizer.type=lion --set optimizer.lr=0.001 --set optimizer.weight_decay=0.1
           --set run.steps=60 --set run.log_every=1 --set run.eval_every=0
           --set checkpoint.every=30 --set checkpoint.keep=5 --set backend.threads=2)
MIXTRAIN_PLUGIN_PATH="$tmp/build-custom_optimizer" "$prefix/bin/mixtrain" train \
  "$tmp/lion/quickstart.toml" "${lion_args[@]}" --run-dir "$tmp/lion/full" >"$tmp/lion-train.log" 2>&1 ||
  { cat "$tmp/lion-train.log"; fail "mixtrain train with the Lion sample"; }
expect_file "$tmp/lion/full/summary.json"
expect_file "$tmp/lion/full/checkpoints/step-00000030.mxt"
grep -q 'lion' "$tmp/lion/full/config.toml" || fail "resolved config does not name the lion optimizer"
MIXTRAIN_PLUGIN_PATH="$tmp/build-custom_optimizer" "$prefix/bin/mixtrain" train \
  "$tmp/lion/quickstart.toml" "${lion_args[@]}" --resume "$tmp/lion/full/checkpoints/step-00000030.mxt" \
  --run-dir "$tmp/lion/resumed" >"$tmp/lion-resume.log" 2>&1 ||
  { cat "$tmp/lion-resume.log"; fail "resuming the Lion run"; }
grep -q 'lion resumes after 30 applied steps' "$tmp/lion-resume.log" ||
  { cat "$tmp/lion-resume.log"; fail "the Lion state was not loaded on resume"; }
# "step loss" per training step record of metrics.jsonl (the records with a "skipped" key).
step_losses() {
  grep '"skipped"' "$1" | sed -n 's/.*"loss":\([^,}]*\).*"step":\([0-9]*\).*/\2 \1/p' | sort -n
}
step_losses "$tmp/lion/full/metrics.jsonl" >"$tmp/lion/full.losses"
step_losses "$tmp/lion/resumed/metrics.jsonl" >"$tmp/lion/resumed.losses"
[[ $(wc -l <"$tmp/lion/full.losses") == 60 ]] || { cat "$tmp/lion/full.losses"; fail "expected 60 logged Lion steps"; }
# The mean loss of the last ten steps is below that of the first ten.
awk 'NR <= 10 { a += $2 } NR > 50 { b += $2 } END { exit !(b < a) }' "$tmp/lion/full.losses" ||
  { cat "$tmp/lion/full.losses"; fail "the loss did not fall under Lion"; }
awk '$1 > 30' "$tmp/lion/full.losses" >"$tmp/lion/full-after-30.losses"
[[ $(wc -l <"$tmp/lion/resumed.losses") == 30 ]] ||
  { cat "$tmp/lion/resumed.losses"; fail "expected the resumed run to log steps 31..60"; }
diff "$tmp/lion/full-after-30.losses" "$tmp/lion/resumed.losses" ||
  fail "the resumed Lion run differs from the uninterrupted one (left: uninterrupted, right: resumed)"

step "done"
ok=1
