// LoRA: low-rank adapters beside linear nodes, as PEFT's LoraLayer defines them
// (docs/model-graph.md, "LoRA adapters").
//
// Contract
// - apply_lora() rewrites a ModelSpec: every linear node n whose name a target glob matches (an
//   fnmatch glob over node names, "*" also crossing dots, or a plain name) gets, right after it,
//     n.lora_dropout  dropout p = dropout (only when dropout > 0), reading n's input
//     n.lora_A        linear in → r, no bias, PyTorch's nn.Linear init (kaiming_uniform, a = √5:
//                     U(-1/√in, 1/√in), PEFT's)
//     n.lora_B        linear r → out, no bias, zero init, scale alpha / r (the GEMMs' alpha)
//     n.lora_sum      add of n and n.lora_B; every node that read n reads it instead
//   so the model computes n(x) + lora_B(lora_A(dropout(x)))·alpha/r, PEFT's
//   `result += lora_B(lora_A(dropout(x))) * scaling`. Parameters are n.lora_A.weight and
//   n.lora_B.weight: PEFT's names under its base_model.model prefix. A sequential model
//   becomes the equivalent graph.
// - The adapters train and nothing else does (PEFT's default): their node names join
//   freeze.trainable, so with train.trainable empty every other parameter is frozen; nodes
//   train.trainable names train beside them, and train.frozen still removes from the result.
// - Errors are sdk::ConfigError at the glob's file:line:col: a glob that matches no linear node
//   (listing the linear nodes it could match), and a model with an adapter name already taken.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/core/graph/freezing.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::core {

struct ModelSpec;

struct LoraSpec {
  std::int64_t r = 0;  // 0: no LoRA
  double alpha = 0.0;
  double dropout = 0.0;
  std::vector<ParameterPattern> targets;
  sdk::SourceLocation where;  // [model.lora]
  bool enabled() const { return r > 0; }
  double scale() const { return alpha / static_cast<double>(r); }
};

// The adapter nodes' suffixes, appended to their target's name.
inline constexpr std::string_view kLoraA = ".lora_A", kLoraB = ".lora_B";
inline constexpr std::string_view kLoraDropout = ".lora_dropout", kLoraSum = ".lora_sum";
// Every node the rewrite adds beside a target (the dropout only when dropout > 0).
inline constexpr std::string_view kLoraNodeSuffixes[] = {kLoraDropout, kLoraA, kLoraB, kLoraSum};

void apply_lora(ModelSpec& spec, const LoraSpec& lora);

// The linear nodes the rewrite put adapters beside, in model order (empty without LoRA).
std::vector<std::string> lora_targets(const ModelSpec& spec);

// A parameter of an adapter (n.lora_A.weight, n.lora_B.weight), by its name.
bool is_lora_parameter(std::string_view name);

// The settings as one line, r, alpha, dropout and the targets' globs, which a resume compares
// with the checkpoint's: the adapters' shapes, scale and places all follow from them.
std::string lora_terms(const LoraSpec& lora);

}  // namespace mixtrain::core
