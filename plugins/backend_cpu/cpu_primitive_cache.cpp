#include "cpu_primitive_cache.h"

#include <functional>

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

void PrimitiveCache::execute(const dnnl::primitive& p,
                             const std::unordered_map<int, dnnl::memory>& args) {
  p.execute(stream_, args);
  stream_.wait();
}

}  // namespace mixtrain::backend_cpu
