// The bucket plan of data-parallel gradient averaging (docs/architecture.md, "Data parallel"),
// as PyTorch DDP lays it out: parameters in reverse order — roughly the order backward finishes
// their gradients — packed into flat FP32 buckets of at most `cap_elements`, so that communication
// starts while backward still runs, in few enough messages that latency does not dominate.
// Internal to the core; pure arithmetic, no device.
//
// Contract
// - plan_buckets(numels, cap, world): every parameter lands in exactly one bucket, whole; a
//   parameter larger than the cap gets a bucket of its own. Within a bucket, parameters sit at
//   increasing offsets in the order they were packed, each offset a multiple of
//   kBucketAlignElements (64 bytes of fp32: gradients, which live in the bucket, start on a cache
//   line, as vectorised CPU loops and 16-byte device loads want). `numel` is the last one's end;
//   `padded` rounds it up to a multiple of world · kBucketAlignElements, so every rank's shard
//   (padded / world elements) starts aligned too. Gaps and padding hold no parameter and stay
//   zero.
// - shard_pieces(bucket, world, rank): the parts of the bucket's parameters that fall in rank's
//   shard [rank·k, (rank+1)·k), k = padded / world, as (parameter, offset in it, count, offset in
//   the shard); empty pieces are left out.
// - Errors: cap < 1 or world < 1 is std::invalid_argument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace mixtrain::core {

inline constexpr std::int64_t kBucketAlignElements = 16;

struct GradientBucket {
  std::vector<std::size_t> params;      // indices into the numels given, in packing order
  std::vector<std::int64_t> offsets;    // each one's first element in the bucket (aligned)
  std::vector<std::int64_t> sizes;      // each one's elements
  std::int64_t numel = 0;               // the last one's end: sizes plus alignment gaps
  std::int64_t padded = 0;              // numel rounded up to world · kBucketAlignElements
  std::int64_t shard() const noexcept;  // padded / world (set by plan_buckets)
  int world = 1;
};

struct ShardPiece {
  std::size_t param = 0;
  std::int64_t param_offset = 0;  // first element of the piece within the parameter
  std::int64_t count = 0;
  std::int64_t shard_offset = 0;  // where it sits in the rank's shard of the bucket
};

std::vector<GradientBucket> plan_buckets(std::span<const std::int64_t> numels,
                                         std::int64_t cap_elements, int world);
std::vector<ShardPiece> shard_pieces(const GradientBucket& bucket, int rank);

}  // namespace mixtrain::core
