#include "mixtrain/core/distributed/config_agreement.h"

#include <map>
#include <sstream>
#include <vector>

#include "distributed/rank_agreement.h"

namespace mixtrain::core {

namespace {

struct ConfigLine {
  std::string key;   // "run.seed", "model.layers[1].out", or "" for a table header
  std::string text;  // the line itself
  std::size_t number = 0;  // 1-based, in the text it came from
};

// The lines that hold values, each keyed by its table: "[run]" then "seed = 1" gives run.seed;
// the i-th "[[model.layers]]" block's keys are model.layers[i].<key>. Comments and blank lines
// are left out: they are no effective value (the resolved config's first line names the file it
// came from, which ranks may reach by different paths or hold as copies).
std::vector<ConfigLine> config_lines(const std::string& text) {
  std::vector<ConfigLine> out;
  std::map<std::string, int> array_entries;  // per array-of-tables name: entries seen
  std::istringstream in(text);
  std::string line, table;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    ConfigLine l{"", line, number};
    if (line[first] == '[') {
      const bool array = line.compare(first, 2, "[[") == 0;
      const auto open = line.find_first_not_of('[', first);
      const auto close = line.find(']', open);
      table = line.substr(open, close == std::string::npos ? std::string::npos : close - open);
      if (array) table += "[" + std::to_string(array_entries[table]++) + "]";
    } else if (const auto eq = line.find('='); eq != std::string::npos && first != eq) {
      auto key = line.substr(first, eq - first);
      while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
      l.key = table.empty() ? key : table + "." + key;
    }
    out.push_back(std::move(l));
  }
  return out;
}

std::string value_of(const std::string& line) {
  const auto eq = line.find('=');
  auto v = eq == std::string::npos ? line : line.substr(eq + 1);
  const auto first = v.find_first_not_of(" \t");
  return first == std::string::npos ? std::string() : v.substr(first);
}

}  // namespace

std::string first_config_difference(const std::string& a, const std::string& b) {
  if (a == b) return {};
  const auto la = config_lines(a), lb = config_lines(b);
  const std::size_t n = std::max(la.size(), lb.size());
  for (std::size_t i = 0; i < n; ++i) {
    const ConfigLine none{"", "(nothing)", 0};
    const ConfigLine& x = i < la.size() ? la[i] : none;
    const ConfigLine& y = i < lb.size() ? lb[i] : none;
    if (x.text == y.text) continue;
    if (!x.key.empty() && x.key == y.key)
      return x.key + ": `" + value_of(x.text) + "` against `" + value_of(y.text) + "`";
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
      "launch every rank with the same config, --set and --merge arguments and the same "
      "environment (paths resolve per rank: give them the same files)");
}

void check_start_agreement(sdk::Communicator& comm, const std::string& start) {
  const std::string rank0 = rank0_text(comm, start);
  const RankText differs = lowest_rank_text(comm, rank0 == start ? std::string() : start);
  if (differs.rank < 0) return;
  throw ConfigDisagreement(
      "the ranks start from different places: rank 0 has " + rank0 + "; rank " +
          std::to_string(differs.rank) + " has " + differs.text,
      "give every rank the same data files and, to resume, the same checkpoint (one file on "
      "storage every rank reads, or identical copies)");
}

}  // namespace mixtrain::core
