#include "mixtrain/core/distributed/config_agreement.h"

#include <algorithm>
#include <vector>

#include "config/resolved_values.h"
#include "distributed/rank_agreement.h"

namespace mixtrain::core {

std::string first_config_difference(const std::string& a, const std::string& b) {
  if (a == b) return {};
  const auto la = resolved_values(a), lb = resolved_values(b);
  const std::size_t n = std::max(la.size(), lb.size());
  for (std::size_t i = 0; i < n; ++i) {
    const ResolvedValue none{"", "(nothing)", 0};
    const ResolvedValue& x = i < la.size() ? la[i] : none;
    const ResolvedValue& y = i < lb.size() ? lb[i] : none;
    if (x.text == y.text) continue;
    if (!x.key.empty() && x.key == y.key)
      return x.key + ": `" + value_text(x.text) + "` against `" + value_text(y.text) + "`";
    return "line " + std::to_string(x.number != 0 ? x.number : y.number) + ": `" + x.text +
           "` against `" + y.text + "`";
  }
  return {};  // they differ in comments or blank lines only
}

void check_config_agreement(sdk::Communicator& comm, const std::string& resolved) {
  const std::string rank0 = rank0_text(comm, resolved);
  const std::string mine = first_config_difference(rank0, resolved);
  // The lowest differing rank tells everyone what differs.
  const RankText differs = lowest_rank_text(comm, mine);
  if (differs.rank < 0) return;
  throw ConfigDisagreement(
      "the ranks run different configs: rank " + std::to_string(differs.rank) +
          "'s differs from rank 0's at " + differs.text + " (rank 0's value first)",
      "launch every rank with the same config, --set and --merge arguments, the same "
      "environment and the same plugin builds ([loaded] names each component's plugin and "
      "version; paths resolve per rank: give them the same files)");
}

void check_start_agreement(sdk::Communicator& comm, const std::string& start) {
  const std::string rank0 = rank0_text(comm, start);
  const RankText differs = lowest_rank_text(comm, rank0 == start ? std::string() : start);
  if (differs.rank < 0) return;
  throw ConfigDisagreement(
      "the ranks start from different places: rank 0 has " + rank0 + "; rank " +
          std::to_string(differs.rank) + " has " + differs.text,
      "give every rank the same data files and the same checkpoint to resume or init_from "
      "(one file on storage every rank reads, or identical copies)");
}

}  // namespace mixtrain::core
