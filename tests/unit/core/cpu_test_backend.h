// The core tests' CPU backend (one thread, shared by every test of a binary) and host copies of
// its tensors.
#pragma once

#include <memory>
#include <vector>

#include "cpu_backend.h"
#include "mixtrain/core/model.h"
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

// A model node written in code: `op("linear", "fc1", {{"out", 6}})`.
struct OptionValueArg {
  std::string key;
  sdk::OptionValue value;
  OptionValueArg(std::string k, int v) : key(std::move(k)), value(std::int64_t{v}) {}
  OptionValueArg(std::string k, std::int64_t v) : key(std::move(k)), value(v) {}
  OptionValueArg(std::string k, double v) : key(std::move(k)), value(v) {}
  OptionValueArg(std::string k, bool v) : key(std::move(k)), value(v) {}
};
inline LayerSpec op(std::string type, std::string name, std::vector<OptionValueArg> options = {},
                    std::vector<std::string> inputs = {}, sdk::SourceLocation where = {}) {
  LayerSpec l;
  l.type = std::move(type);
  l.name = std::move(name);
  l.where = where;
  l.inputs = std::move(inputs);
  for (auto& o : options) l.options.push_back({o.key, o.value, where});
  return l;
}

}  // namespace mixtrain::core::test_support
