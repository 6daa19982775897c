// Freezing: which parameters train, chosen by [train] trainable / frozen patterns over parameter
// names (docs/model-graph.md, "Freezing parameters").
//
// Contract
// - A pattern is an fnmatch glob ("*" also crosses dots) or a plain name, tested against each
//   parameter's name ("fc1.weight") and its node's name ("fc1"), so a node's name covers all of
//   its parameters. A parameter another node uses (weight tying) has its owner's name.
// - trainable selects what trains (empty: every parameter); frozen then removes from that. Every
//   parameter outside the result is frozen: it gets no weight gradient (its ops skip that work),
//   no FP32 master and no optimizer state, and is stored once, in the dtype its op computes with
//   (graph/layer.h, ModelParameter).
// - resolve_frozen() throws sdk::ConfigError at the pattern's file:line:col when a pattern matches
//   no parameter (naming the closest names), and at the first pattern when nothing is left to
//   train. It returns the frozen parameters' names, sorted.
#pragma once

#include <string>
#include <vector>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

struct ParameterPattern {
  std::string pattern;
  sdk::SourceLocation where;
  std::string key;  // "train.frozen[1]", for messages
};

struct FreezeSpec {
  std::vector<ParameterPattern> trainable, frozen;
  bool empty() const { return trainable.empty() && frozen.empty(); }
};

// A parameter as a built graph names it: its owner node and its full name ("fc1", "fc1.weight").
struct NamedParameter {
  std::string node, name;
};

std::vector<std::string> resolve_frozen(const FreezeSpec& spec,
                                        const std::vector<NamedParameter>& parameters);

}  // namespace mixtrain::core
