# Sourced by tests/sanitize/run.sh and tests/fuzz/run.sh: the sanitizers' run-time options.
# Every finding stops the process with a non-zero exit. Needs clang-14 (for the LSan probe).
#
# allocator_may_return_null=1: tests ask for impossible sizes on purpose (2^63 bytes) and expect
# std::bad_alloc; by default ASan reports such a request as an error and aborts.
asan_options="halt_on_error=1:abort_on_error=1:allocator_may_return_null=1"

# LeakSanitizer stops the world through ptrace; in a container without ptrace (seccomp, no
# CAP_SYS_PTRACE) its tracer dies with "LeakSanitizer has encountered a fatal error" and every
# test would fail for that. Probe it once: leaks stay checked wherever LSan can run.
probe_dir=$(mktemp -d)
printf 'int main() { return 0; }\n' >"$probe_dir/probe.c"
if clang-14 -fsanitize=address "$probe_dir/probe.c" -o "$probe_dir/probe" 2>/dev/null &&
   ! ASAN_OPTIONS=detect_leaks=1 "$probe_dir/probe" >/dev/null 2>&1; then
  echo "sanitize: LeakSanitizer cannot run here (no ptrace); leak checks off (detect_leaks=0)" >&2
  asan_options+=":detect_leaks=0"
fi
rm -rf "$probe_dir"

# Ours come last, so options already in the environment cannot drop them (the last one wins).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}$asan_options"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}halt_on_error=1:abort_on_error=1:print_stacktrace=1"
if command -v llvm-symbolizer-14 >/dev/null; then
  export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer-14)}
fi
