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

namespace {

constexpr std::size_t kLentAlignment = 64;

std::size_t round_up(std::size_t bytes) {
  return (bytes + kLentAlignment - 1) / kLentAlignment * kLentAlignment;
}

}  // namespace

PrimitiveCache::Lease::Lease(PrimitiveCache& cache, void* data, std::size_t bytes) : cache_(cache) {
  auto* begin = static_cast<std::byte*>(data);
  cache_.lent_next_ = begin;
  cache_.lent_end_ = begin + bytes;
  cache_.lent_slots_ = {};
}

PrimitiveCache::Lease::~Lease() {
  cache_.lent_next_ = cache_.lent_end_ = nullptr;
  cache_.lent_slots_ = {};
}

std::size_t PrimitiveCache::lent_bytes(std::span<const std::size_t> requests) {
  std::size_t total = 0;
  for (const std::size_t r : requests) total += round_up(r);
  return total == 0 ? 0 : total + kLentAlignment - 1;
}

void* PrimitiveCache::lent(Slot slot, std::size_t bytes) {
  LentSlot& s = lent_slots_[static_cast<std::size_t>(slot)];
  if (s.at != nullptr) return bytes <= s.bytes ? s.at : nullptr;
  if (bytes == 0) return nullptr;
  // In addresses, not pointers: a boundary past the workspace's end points into nothing.
  const std::uintptr_t at = round_up(reinterpret_cast<std::uintptr_t>(lent_next_));
  const auto end = reinterpret_cast<std::uintptr_t>(lent_end_);
  if (at > end || end - at < bytes) return nullptr;
  s = {reinterpret_cast<std::byte*>(at), bytes};
  lent_next_ = s.at + bytes;
  return s.at;
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
