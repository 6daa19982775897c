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
// - format (train.frozen_format): how frozen linear weights are stored. compute (the default):
//   in the dtype their op computes with, as above. nf4: QLoRA's 4-bit NormalFloat
//   (sdk/support/nf4.h), blocks of `block` elements with one fp32 absmax each. fp8_block, mxfp8:
//   the FP8 block formats (graph/quantized_weight.h has their layouts). Each is decoded by the
//   backend into the compute dtype right before each GEMM (graph/layer.h, ModelParameter). Only a
//   linear node's own weight takes one: biases, layer norms, embeddings and a weight another node
//   ties to stay in the compute dtype. The graph's build throws sdk::ConfigError at format_where
//   when the format finds no frozen linear weight to store.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

struct ParameterPattern {
  std::string pattern;
  sdk::SourceLocation where;
  std::string key;  // "train.frozen[1]", for messages
};

enum class FrozenFormat : std::uint8_t { compute, nf4, fp8_block, mxfp8 };

struct FreezeSpec {
  std::vector<ParameterPattern> trainable, frozen;
  FrozenFormat format = FrozenFormat::compute;
  std::int64_t block = 64;           // NF4's block (train.frozen_block_size)
  sdk::SourceLocation format_where;  // train.frozen_format
  bool empty() const { return trainable.empty() && frozen.empty(); }
};

// "compute", "nf4", "fp8-block", "mxfp8": train.frozen_format's spelling.
std::string frozen_format_name(FrozenFormat format);
// "compute", "nf4 (blocks of 64)", "fp8-block" or "mxfp8": what a resume compares with the
// checkpoint's.
std::string frozen_format_terms(const FreezeSpec& spec);

// A parameter as a built graph names it: its owner node and its full name ("fc1", "fc1.weight").
struct NamedParameter {
  std::string node, name;
};

std::vector<std::string> resolve_frozen(const FreezeSpec& spec,
                                        const std::vector<NamedParameter>& parameters);

}  // namespace mixtrain::core
