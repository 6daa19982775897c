// Helpers shared by the ops' implementations (internal to the core).
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/data/dataset.h"
#include "mixtrain/core/graph/layer.h"
#include "mixtrain/core/graph/random.h"
#include "mixtrain/core/graph/tensor.h"
#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::core::ops {

// Logs `message` at info under `component` the first time this process sees (component, key):
// a fallback that every node of a model (and every replan of it) takes for the same reason is
// stated once per run.
inline void log_once(const std::string& component, const std::string& key,
                     const std::string& message) {
  static std::mutex mutex;
  static std::set<std::pair<std::string, std::string>> said;
  {
    std::lock_guard lock(mutex);
    if (!said.emplace(component, key).second) return;
  }
  core_logger(component).info(message);
}

// tf32 is fp32 storage rounded inside the GEMM; every other dtype is its own storage.
// dst = src in dst's dtype (a gradient passed through): nothing when dst is src itself, a copy in
// the same dtype, else a cast.
inline void copy_as(sdk::DeviceBackend& backend, sdk::TensorView src, sdk::TensorView dst) {
  if (dst.data == src.data && dst.dtype == src.dtype) return;
  if (dst.dtype == src.dtype)
    backend.copy(dst, src);
  else
    backend.cast(src, dst);
}

inline sdk::DType storage_of(sdk::DType t) {
  return t == sdk::DType::tf32 ? sdk::DType::fp32 : t;
}
inline bool needs_working_copy(sdk::DType weight) {
  return weight != sdk::DType::fp32 && weight != sdk::DType::tf32;
}
// The first n elements of a rank-1 tensor.
inline sdk::TensorView prefix(const Tensor& t, std::int64_t n) {
  return {t.view().data, t.dtype(), sdk::Shape{n}};
}
// A parameter whose draw Model::init_parameters skips (ModelParameter::filled_by_load): zeroed,
// so that it holds defined values until the load, whatever the backend's fresh memory holds.
// Returns whether it did.
inline bool zero_if_filled_by_load(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                   ModelParameter& p) {
  if (!p.filled_by_load) return false;
  if (p.quantized()) {
    const std::vector<float> zeros(static_cast<std::size_t>(p.numel()), 0.0f);
    set_parameter_from_fp32(backend, p, zeros.data());
  } else {
    backend->fill(p.value(), 0.0f);
  }
  return true;
}

// U(-bound, bound) from `seed`, drawn on the host so every backend starts from the same values,
// into a parameter's stored weights (a frozen one's one copy included).
inline void fill_uniform(const std::shared_ptr<sdk::DeviceBackend>& backend, ModelParameter& p,
                         double bound, std::uint64_t seed) {
  if (zero_if_filled_by_load(backend, p)) return;
  SplitMix64 rng(seed);
  std::vector<float> host(static_cast<std::size_t>(p.numel()));
  for (auto& v : host) v = static_cast<float>(rng.uniform(-bound, bound));
  set_parameter_from_fp32(backend, p, host.data());
}

// N(0, std²) from `seed`, drawn on the host (DataRng's portable Box–Muller) for the same reason;
// the transforms on up to 8 of the host's threads (the same values on any count: GPT-2 small's
// 124 M normals were half of `mixtrain sample`'s start on 2 cores, bench/RESULTS.md, session 74).
inline void fill_normal(const std::shared_ptr<sdk::DeviceBackend>& backend, ModelParameter& p,
                        double std, std::uint64_t seed) {
  if (zero_if_filled_by_load(backend, p)) return;
  DataRng rng(seed);
  std::vector<float> host(static_cast<std::size_t>(p.numel()));
  rng.normals(host, std, std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  set_parameter_from_fp32(backend, p, host.data());
}

// Largest size a config may give one dimension (int32 range, as the backends index).
inline constexpr std::int64_t kMaxDim = 2147483647;

inline std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// -1 when the product leaves int64 (a config's reshape can ask for anything): never equal to a
// real element count, so the shape checks reject it.
inline std::int64_t checked_product(const std::vector<std::int64_t>& v) {
  std::int64_t p = 1;
  for (const std::int64_t d : v)
    if (__builtin_mul_overflow(p, d, &p)) return -1;
  return p;
}

}  // namespace mixtrain::core::ops
