// Small agreements among the ranks, over host collectives (docs/architecture.md, "Data
// parallel"): whether any rank says yes, and which text the lowest rank that has one holds.
// Internal to the core; both are collective (every rank calls them, in the same order).
#pragma once

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

}  // namespace mixtrain::core
