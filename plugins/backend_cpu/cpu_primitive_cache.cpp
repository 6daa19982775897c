#include "cpu_primitive_cache.h"

#include <algorithm>
#include <functional>

#include "cpu_access.h"

namespace mixtrain::backend_cpu {

PrimitiveCache::PrimitiveCache() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

std::size_t PrimitiveCache::KeyHash::operator()(const Key& key) const noexcept {
  std::size_t h = key.size();
  for (std::int64_t v : key)
    h ^= std::hash<std::int64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

std::size_t PrimitiveCache::scratch_bytes() const {
  std::size_t total = 0;
  for (const auto& s : scratch_) total += s.capacity();
  return total;
}

std::vector<std::string> PrimitiveCache::report() const {
  std::vector<std::string> lines;
  lines.reserve(entries_.size());
  for (const auto& [key, cached] : entries_) lines.push_back(cached.line);
  std::sort(lines.begin(), lines.end());  // the map's order is not stable across runs
  return lines;
}

void PrimitiveCache::execute(const dnnl::primitive& p,
                             const std::unordered_map<int, dnnl::memory>& args) {
  p.execute(stream_, args);
  stream_.wait();
}

const void* as_input(PrimitiveCache& cache, const sdk::TensorView& v, dnnl::memory::data_type dt,
                     PrimitiveCache::Slot slot) {
  if (dt == dnnl::memory::data_type::bf16 || is_fp32_storage(v.dtype)) return v.data;
  const std::int64_t n = v.numel();
  float* out = cache.scratch<float>(slot, static_cast<std::size_t>(n));
  decode_tensor(v, 1.0f, false, out, n);
  return out;
}

void* as_output(PrimitiveCache& cache, const sdk::TensorView& v, dnnl::memory::data_type dt,
                PrimitiveCache::Slot slot) {
  if (dt == dnnl::memory::data_type::bf16 || is_fp32_storage(v.dtype)) return v.data;
  return cache.scratch<float>(slot, static_cast<std::size_t>(v.numel()));
}

}  // namespace mixtrain::backend_cpu
