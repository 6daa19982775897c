// The bucket plan of data-parallel gradient averaging (docs/architecture.md, "Data parallel"),
// as PyTorch DDP lays it out: parameters in reverse order — roughly the order backward finishes
// their gradients — packed into flat FP32 buckets of at most `cap_elements`, so that communication
// starts while backward still runs, in few enough messages that latency does not dominate.
// Internal to the core; pure arithmetic, no device.
//
// Contract
// - plan_buckets(numels, cap, world): every parameter lands in exactly one bucket, whole; a
//   parameter larger than the cap gets a bucket of its own. Within a bucket, parameters sit at
//   increasing offsets in the order they were packed. `padded` rounds the bucket up to a multiple
//   of `world` (its shard is padded / world elements; the padding stays zero).
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

struct GradientBucket {
  std::vector<std::size_t> params;      // indices into the numels given, in packing order
  std::vector<std::int64_t> offsets;    // each one's first element in the bucket
  std::int64_t numel = 0;               // sum of their sizes
  std::int64_t padded = 0;              // numel rounded up to a multiple of the world size
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
