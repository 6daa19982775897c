// Small agreements among the ranks, over host collectives (docs/architecture.md, "Data
// parallel"): whether any rank says yes, which text the lowest rank that has one holds, and rank
// 0's text. Internal to the core; these are collective (every rank calls them, in the same
// order); crc32_of is a plain function, for what the ranks then compare.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "mixtrain/sdk/communicator.h"

namespace mixtrain::core {

// True on every rank when `mine` is true on any.
bool any_rank(sdk::Communicator& comm, bool mine);

// The lowest rank whose `mine` is not empty, and its text, on every rank (rank −1 and "" when no
// rank has one).
struct RankText {
  int rank = -1;
  std::string text;
};
RankText lowest_rank_text(sdk::Communicator& comm, const std::string& mine);

// Rank 0's `text`, on every rank (the others' own `text` is not read).
std::string rank0_text(sdk::Communicator& comm, const std::string& text);

// The CRC-32 (zlib's) of `bytes`: what ranks compare of their states and data, not a collective.
std::uint32_t crc32_of(std::span<const std::byte> bytes);

}  // namespace mixtrain::core
