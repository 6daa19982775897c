#include "distributed/gradient_buckets.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mixtrain::core {

std::int64_t GradientBucket::shard() const noexcept {
  return padded / world;
}

std::vector<GradientBucket> plan_buckets(std::span<const std::int64_t> numels,
                                         std::int64_t cap_elements, int world) {
  if (cap_elements < 1 || world < 1)
    throw std::invalid_argument("plan_buckets: cap " + std::to_string(cap_elements) +
                                " and world " + std::to_string(world) + " must be at least 1");
  std::vector<GradientBucket> out;
  GradientBucket open;
  auto round_up = [](std::int64_t n, std::int64_t m) { return (n + m - 1) / m * m; };
  auto close = [&] {
    if (open.params.empty()) return;
    open.world = world;
    open.padded = round_up(open.numel, kBucketAlignElements * world);
    out.push_back(std::move(open));
    open = GradientBucket{};
  };
  for (std::size_t i = numels.size(); i-- > 0;) {
    const std::int64_t n = numels[i];
    std::int64_t at = round_up(open.numel, kBucketAlignElements);
    if (!open.params.empty() && at + n > cap_elements) {
      close();
      at = 0;
    }
    open.params.push_back(i);
    open.offsets.push_back(at);
    open.sizes.push_back(n);
    open.numel = at + n;
  }
  close();
  return out;
}

std::vector<ShardPiece> shard_pieces(const GradientBucket& bucket, int rank) {
  std::vector<ShardPiece> out;
  const std::int64_t k = bucket.shard();
  const std::int64_t lo = static_cast<std::int64_t>(rank) * k, hi = lo + k;
  for (std::size_t j = 0; j < bucket.params.size(); ++j) {
    const std::int64_t start = bucket.offsets[j];
    const std::int64_t end = start + bucket.sizes[j];
    const std::int64_t a = std::max(start, lo), b = std::min(end, hi);
    if (a >= b) continue;
    out.push_back({bucket.params[j], a - start, b - a, a - lo});
  }
  return out;
}

}  // namespace mixtrain::core
