// The effective values of a resolved config (the TOML text resolved_toml() writes), keyed, for
// comparing two of them: the ranks of one launch (distributed/config_agreement.h), a checkpoint's
// run and the config that evaluates it. Internal to the core.
//
// Contract
// - resolved_values(text): the lines that hold values, each keyed by its table ("[run]" then
//   "seed = 1" gives run.seed; the i-th "[[model.layers]]" block's keys are
//   model.layers[i].<key>), and table headers with an empty key, in order. Comments and blank
//   lines are left out: they are no effective value (the first line names the file the config
//   came from). The text is resolved_toml()'s: one key per line, no multi-line values.
// - value_text(line): what follows the '=' of a line, leading blanks dropped.
// - changed_values(a, b, wanted, one_sided): each key `wanted` accepts whose value differs between
//   a and b, and with one_sided each that only one has, as "key = a's -> b's" ("(none)" for the
//   missing side), in a's order then b's; empty when they agree.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace mixtrain::core {

struct ResolvedValue {
  std::string key;         // "run.seed", "model.layers[1].out", or "" for a table header
  std::string text;        // the line itself
  std::size_t number = 0;  // 1-based, in the text it came from
};

std::vector<ResolvedValue> resolved_values(const std::string& text);
std::string value_text(const std::string& line);
std::vector<std::string> changed_values(const std::string& a, const std::string& b,
                                        const std::function<bool(std::string_view)>& wanted,
                                        bool one_sided = true);

}  // namespace mixtrain::core
