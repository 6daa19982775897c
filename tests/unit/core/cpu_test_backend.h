// The core tests' CPU backend (one thread, shared by every test of a binary) and host copies of
// its tensors.
#pragma once

#include <memory>
#include <vector>

#include "cpu_backend.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::core::test_support {

inline std::shared_ptr<sdk::DeviceBackend> cpu() {
  static auto b = std::make_shared<backend_cpu::CpuBackend>(1);
  return b;
}

// The values of a device view, read as fp32.
inline std::vector<float> read(const sdk::TensorView& v) {
  std::vector<float> h(static_cast<std::size_t>(v.numel()));
  cpu()->copy_to_host(h.data(), v);
  return h;
}

inline void write(const sdk::TensorView& v, const std::vector<float>& h) {
  cpu()->copy_from_host(v, h.data());
}

}  // namespace mixtrain::core::test_support
