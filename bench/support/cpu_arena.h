// Arena: CPU backend memory filled with uniform random values in any storage dtype, freed with the
// arena (the CPU kernel benchmarks' inputs). make() converts with sdk/float_formats.h's rounding;
// copy() places host bytes as they are (codes, scales), viewed as a 1-D tensor of `dt`.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "cpu_backend.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::bench {

class Arena {
 public:
  explicit Arena(backend_cpu::CpuBackend& be) : be_(be) {}
  ~Arena() {
    for (void* p : owned_) be_.deallocate(p);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  sdk::TensorView make(sdk::DType dt, sdk::Shape shape, unsigned seed, float lo = -1.0f,
                       float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> values(static_cast<std::size_t>(shape.numel()));
    for (auto& v : values) v = dist(rng);
    sdk::TensorView t{nullptr, dt, shape};
    t.data = be_.allocate(t.bytes());
    owned_.push_back(t.data);
    if (dt == sdk::DType::fp32)
      std::memcpy(t.data, values.data(), t.bytes());
    else
      sdk::convert(values, std::span(t.as<std::uint16_t>(), values.size()), dt);
    return t;
  }
  template <class T>
  sdk::TensorView copy(const std::vector<T>& host, sdk::DType dt) {
    sdk::TensorView t{
        be_.allocate(host.size() * sizeof(T)), dt,
        sdk::Shape{static_cast<std::int64_t>(host.size() * sizeof(T) / sdk::dtype_size(dt))}};
    owned_.push_back(t.data);
    std::memcpy(t.data, host.data(), host.size() * sizeof(T));
    return t;
  }

 private:
  backend_cpu::CpuBackend& be_;
  std::vector<void*> owned_;
};

}  // namespace mixtrain::bench
