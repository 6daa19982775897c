// Run-time choice among per-ISA compilations of one kernel.
//
// Contract
// - best_isa(): the widest of x86-64-v4 (AVX-512 F/BW/VL/DQ + FMA), x86-64-v3 (AVX2 + FMA) and the
//   baseline that this CPU runs, from cpuid (__builtin_cpu_supports); decided once per process,
//   and narrowed by limit_isa().
// - limit_isa(cap): the variants wider than cap are not run from then on, in the whole process
//   (limit_isa(Isa::v4) lifts the cap). For tests: every variant is checked on the CPU at hand,
//   the baseline ones included, which no CPU of today would pick. Returns the ISA now in effect.
// - MIXTRAIN_ISA_VARIANTS(kernel) defines kernel_v4, kernel_v3, kernel_baseline and kernel_best,
//   function templates forwarding their arguments to `kernel`, a template or overload set visible
//   at the expansion; kernel_best calls the variant best_isa() names. Use it in an unnamed
//   namespace.
// - Why explicit variants: the build targets the baseline (the binaries run on any x86-64), and
//   clang 14 has no target_clones for templates. The loops must be inlined into the variants to be
//   compiled for their ISA: mark kernel and the lambdas it calls always_inline.
#pragma once

#include <algorithm>
#include <atomic>

namespace mixtrain::backend_cpu {

enum class Isa { v4, v3, baseline };  // widest first

inline std::atomic<Isa>& isa_cap() {
  static std::atomic<Isa> cap{Isa::v4};
  return cap;
}

inline Isa detected_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma"))
      return Isa::v4;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::v3;
    return Isa::baseline;
  }();
  return isa;
}

inline Isa best_isa() {
  return std::max(detected_isa(), isa_cap().load(std::memory_order_relaxed));
}

inline Isa limit_isa(Isa cap) {
  isa_cap().store(cap, std::memory_order_relaxed);
  return best_isa();
}

}  // namespace mixtrain::backend_cpu

#define MIXTRAIN_ISA_VARIANTS(kernel)                                                           \
  template <class... A>                                                                         \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi2"))) void kernel##_v4( \
      A... a) {                                                                                 \
    kernel(a...);                                                                               \
  }                                                                                             \
  template <class... A>                                                                         \
  __attribute__((target("avx2,fma,bmi2"))) void kernel##_v3(A... a) {                           \
    kernel(a...);                                                                               \
  }                                                                                             \
  template <class... A>                                                                         \
  void kernel##_baseline(A... a) {                                                              \
    kernel(a...);                                                                               \
  }                                                                                             \
  template <class... A>                                                                         \
  void kernel##_best(A... a) {                                                                  \
    switch (::mixtrain::backend_cpu::best_isa()) {                                              \
      case ::mixtrain::backend_cpu::Isa::v4:                                                    \
        kernel##_v4(a...);                                                                      \
        return;                                                                                 \
      case ::mixtrain::backend_cpu::Isa::v3:                                                    \
        kernel##_v3(a...);                                                                      \
        return;                                                                                 \
      case ::mixtrain::backend_cpu::Isa::baseline:                                              \
        kernel##_baseline(a...);                                                                \
        return;                                                                                 \
    }                                                                                           \
  }
