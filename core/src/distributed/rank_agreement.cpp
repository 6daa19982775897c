#include "distributed/rank_agreement.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace mixtrain::core {

bool any_rank(sdk::Communicator& comm, bool mine) {
  double v[1] = {mine ? 1.0 : 0.0};
  comm.all_reduce_host(v, sdk::ReduceOp::max);
  return v[0] > 0.0;
}

RankText lowest_rank_text(sdk::Communicator& comm, const std::string& mine) {
  // world − rank is largest for the lowest rank: one max finds it, one broadcast sends its text.
  const int world = comm.world_size(), rank = comm.rank();
  double v[1] = {mine.empty() ? 0.0 : static_cast<double>(world - rank)};
  comm.all_reduce_host(v, sdk::ReduceOp::max);
  if (v[0] == 0.0) return {};
  RankText out;
  out.rank = world - static_cast<int>(v[0]);
  std::vector<std::byte> bytes;
  if (rank == out.rank) {
    bytes.resize(mine.size());
    std::memcpy(bytes.data(), mine.data(), mine.size());
  }
  comm.broadcast_host(bytes, out.rank);
  out.text.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return out;
}

std::string rank0_text(sdk::Communicator& comm, const std::string& text) {
  std::vector<std::byte> bytes(text.size());
  // An empty text (no --run-dir) has no buffer: memcpy's pointers must not be null, even for 0.
  if (!text.empty()) std::memcpy(bytes.data(), text.data(), text.size());
  comm.broadcast_host(bytes, 0);
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

std::uint32_t crc32_of(std::span<const std::byte> bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (std::size_t at = 0; at < bytes.size();) {  // zlib takes uInt lengths
    const auto n = static_cast<uInt>(std::min<std::size_t>(bytes.size() - at, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + at), n);
    at += n;
  }
  return static_cast<std::uint32_t>(crc);
}

}  // namespace mixtrain::core
