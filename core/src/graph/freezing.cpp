// Which parameters train; see graph/freezing.h for the contract.
#include "mixtrain/core/graph/freezing.h"

#include <fnmatch.h>

#include <algorithm>
#include <cstddef>

namespace mixtrain::core {

namespace {

bool matches(const ParameterPattern& p, const NamedParameter& param) {
  return fnmatch(p.pattern.c_str(), param.name.c_str(), 0) == 0 ||
         fnmatch(p.pattern.c_str(), param.node.c_str(), 0) == 0;
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The parameter names nearest to what the pattern spells, its wildcards left out: what a typo
// most likely meant.
std::string closest_names(const std::string& pattern,
                          const std::vector<NamedParameter>& parameters) {
  std::string literal;
  for (char c : pattern)
    if (c != '*' && c != '?' && c != '[' && c != ']') literal += c;
  std::vector<std::pair<std::size_t, std::string>> ranked;
  for (const auto& p : parameters)
    ranked.emplace_back(
        std::min(edit_distance(literal, p.name), edit_distance(literal, p.node) + 1), p.name);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  constexpr std::size_t kShown = 6;
  std::string out;
  for (std::size_t i = 0; i < ranked.size() && i < kShown; ++i)
    out += (i ? ", " : "") + ranked[i].second;
  if (ranked.size() > kShown)
    out +=
        " (" + std::to_string(ranked.size()) + " parameters in all; `mixtrain check` lists them)";
  return out;
}

// Which parameters the patterns match; a pattern that matches none is a ConfigError at its line.
std::vector<bool> match_all(const std::vector<ParameterPattern>& patterns,
                            const std::vector<NamedParameter>& parameters, const char* role) {
  std::vector<bool> hit(parameters.size(), false);
  for (const auto& p : patterns) {
    bool any = false;
    for (std::size_t i = 0; i < parameters.size(); ++i)
      if (matches(p, parameters[i])) hit[i] = any = true;
    if (!any)
      throw sdk::ConfigError(
          p.where, p.key,
          "'" + p.pattern + "' matches no parameter of the model, so it " + role + " nothing",
          parameters.empty()
              ? std::string("the model has no parameters")
              : "patterns match \"<node>.<param>\" names or node names (fnmatch globs); the "
                "closest: " +
                    closest_names(p.pattern, parameters));
  }
  return hit;
}

}  // namespace

std::vector<std::string> resolve_frozen(const FreezeSpec& spec,
                                        const std::vector<NamedParameter>& parameters) {
  if (spec.empty()) return {};
  const std::vector<bool> selected = match_all(spec.trainable, parameters, "selects");
  const std::vector<bool> removed = match_all(spec.frozen, parameters, "freezes");
  std::vector<std::string> frozen;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const bool trains = (spec.trainable.empty() || selected[i]) && !removed[i];
    if (!trains) frozen.push_back(parameters[i].name);
  }
  if (frozen.size() == parameters.size()) {
    // trainable alone always leaves what it matched: only frozen can take everything.
    const ParameterPattern& first = spec.frozen.front();
    throw sdk::ConfigError(
        first.where, first.key, "every parameter of the model is frozen: nothing would train",
        spec.trainable.empty() ? "narrow train.frozen so that some parameter trains"
                               : "train.frozen removes everything train.trainable selects; "
                                 "narrow train.frozen");
  }
  std::sort(frozen.begin(), frozen.end());
  return frozen;
}

std::string frozen_format_name(FrozenFormat format) {
  switch (format) {
    case FrozenFormat::compute:
      return "compute";
    case FrozenFormat::nf4:
      return "nf4";
    case FrozenFormat::fp8_block:
      return "fp8-block";
    case FrozenFormat::mxfp8:
      return "mxfp8";
  }
  return "?";
}

std::string frozen_format_terms(const FreezeSpec& spec) {
  if (spec.format == FrozenFormat::nf4) return "nf4 (blocks of " + std::to_string(spec.block) + ")";
  return frozen_format_name(spec.format);
}

}  // namespace mixtrain::core
