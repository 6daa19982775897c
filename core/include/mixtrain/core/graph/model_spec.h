// ModelSpec: a model as the config describes it — its nodes, their inputs and options — before
// any op is built; and InputSpec, what the data feeds it. Plain data, no device.
//
// Contract
// - A node reads named inputs (other nodes, or kGraphInput, the batch). In the sequential form
//   (graph = false, `model.layers`) each node reads the one before; in the graph form
//   (`model.nodes`) each names its inputs.
// - layer_options() resolves a node's options against its op's schema (defaults filled in) and
//   throws sdk::ConfigError at the node's line for an unknown type, an unknown key or a value out
//   of range.
#pragma once

#include <cstdint>
#include <optional>
#include <map>
#include <string>
#include <vector>

#include "mixtrain/core/graph/freezing.h"
#include "mixtrain/core/graph/lora.h"
#include "mixtrain/sdk/dtype.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/options.h"

namespace mixtrain::core {

struct LayerSpec {
  std::string type;  // an op of core/src/graph/ops/op_registry.cpp: linear, relu, add, ...
  std::string name;  // defaults to "<type><index>"
  sdk::SourceLocation where;
  std::string table;  // the config entry, for messages ("model.blocks.res.nodes[1]"); empty:
                      // "model.nodes[i]" / "model.layers[i]" by position
  std::vector<std::string> inputs;  // graph form: node names or "input"; sequential form: empty
  std::vector<std::int64_t> shape;  // reshape only: per-sample shape, one entry may be -1
  // The op's own options ("out", "bias", "eps"), validated against its schema when the model
  // is built (and by the config before that, with file:line:col).
  std::vector<sdk::RawOption> options;
  // A preset's node: option -> the preset key it is made from ("vocab" -> "model.gpt.vocab_size"),
  // so a message about the option names the key the user sets (preset_key()).
  std::map<std::string, std::string> preset_keys;
  // The key a message tells the user to set for `option`: the preset's, else the option's name.
  std::string preset_key(const std::string& option) const {
    const auto it = preset_keys.find(option);
    return it == preset_keys.end() ? option : it->second;
  }
};

sdk::Options layer_options(const LayerSpec& layer, const std::string& table = "model.layers");

inline constexpr const char* kGraphInput = "input";

inline constexpr std::int64_t kLossChunkRows = 1024, kLossChunkClasses = 4096;
// The block on a backend whose GEMMs reach their rate at a few hundred rows
// (sdk::kFeatureGemmFullRateAtFewRows: the CPU's). 512, not 256: GPT-2 small's LM head GEMMs
// (50257 classes, 768 wide) ran 7 % faster in 512-row blocks than in 256- or 1024-row ones on an
// AMX Xeon (oneDNN's bf16 weight gradient, dW += dlᵀ·x, at 1.1 TFLOP/s against 0.86), and the
// step 2.8 % faster, for 49 MiB more peak; with the bf16 GEMMs emulated in fp32, 1.4 % faster
// for 147 MiB more (bench/RESULTS.md, session 68).
inline constexpr std::int64_t kLossChunkRowsFewRows = 512;
// llm.c's padded vocabulary: GPT-2's 50257 classes in blocks of 50304.
inline constexpr std::int64_t kLossPadClasses = 64;

struct ModelSpec {
  std::vector<LayerSpec> layers;  // the nodes, in declaration order
  bool graph = false;             // true: each node names its inputs (model.nodes)
  std::string loss = "softmax_cross_entropy";
  // The training objective's label smoothing ε in [0, 1] (torch.nn.CrossEntropyLoss's): targets
  // (1 - ε)·onehot + ε / classes. Evaluation reports plain cross-entropy whatever ε is.
  double label_smoothing = 0.0;
  bool fuse_epilogues = true;  // Linear + relu/gelu as one GEMM with an activation epilogue
  // [model] fp32_gradient_sums: a tensor read by several ops sums its gradient in FP32 (true), or
  // in its readers' gradient dtype when they all contribute in one (false: PyTorch AMP's bf16
  // sums; graph/memory_plan.h).
  bool fp32_gradient_sums = true;
  // [model] loss_chunk_rows: the logits node and the loss run this many rows at a time (graph/
  // chunked_loss.h); 0 computes the logits whole. Unset: kLossChunkRows (kLossChunkRowsFewRows on
  // a backend declaring sdk::kFeatureGemmFullRateAtFewRows) for a model of at least
  // kLossChunkClasses classes (a language model's vocabulary), else 0: the logits of a few
  // classes are small, and blocks would only change the order of the weight gradient's sums.
  std::optional<std::int64_t> loss_chunk_rows;
  // [model] loss_pad_classes: the chunked loss's logits blocks padded to a multiple of this many
  // classes (llm.c's padded vocabulary; 0 or 1: none), so that a GEMM's rows are 16 bytes apart
  // for an odd vocabulary (50257: cuBLASLt's align-1 kernels took GPT-2's LM head 16.6 ms a step
  // on an H200). The padded classes' logits are the dtype's lowest finite value (probability 0):
  // the loss and its gradients are the unpadded ones. Not with label smoothing (padded classes
  // would take a share): Model drops it then. Unset: kLossPadClasses where the backend declares
  // kFeatureGemmWantsAlignedRows (sdk/support/backend_features.h) and the classes are not a
  // multiple of 8, else 0. On an AMX CPU (oneDNN 2.6) padding sped the logits GEMM (25-27 against
  // 34-37 ms a 512-row block of GPT-2 small's head) but slowed its data gradient, whose k became
  // 50304 (34-56 against 26-32 ms), and the padded dW's copy cost 22 ms a step: the step was
  // slower, with 232 MB more peak (bench/RESULTS.md, session 71).
  std::optional<std::int64_t> loss_pad_classes;
  // [model] recompute: the op types (OpDefinition::recomputable: gelu, layernorm) whose outputs
  // are not kept for the backward but computed again from their inputs just before the first
  // backward that reads them (llm.c's -r, Megatron's selective recomputation): GPT-2's gelu and
  // layer norm outputs, a sixth of what its blocks keep, for a few element-wise passes more
  // (graph/memory_plan.h). Empty: every output is kept.
  std::vector<std::string> recompute;
  sdk::SourceLocation recompute_where;
  // [train] trainable / frozen (graph/freezing.h): the plan resolves them, since which nodes need
  // a gradient follows from what trains.
  FreezeSpec freeze;
  // [model.lora] (graph/lora.h), as apply_lora() put it into `layers` and `freeze`; kept for the
  // resume's comparison and the PEFT export.
  LoraSpec lora;
  sdk::SourceLocation where;
};

// What the data feeds the model besides the feature count and the classes.
struct InputSpec {
  sdk::DType dtype = sdk::DType::fp32;  // fp32 features or int32 token ids
  std::int64_t labels_per_sample = 1;
  // Images: the per-sample shape [C, H, W] (channels first, as the data holds them; the product
  // is the feature count). Ops that read images see the batch with this shape; the others see it
  // flattened to [C·H·W]. Empty: [features].
  std::vector<std::int64_t> sample_shape;
  // Where the class count comes from, for the message of a head of another width: the labels
  // (empty) or the data's named classes (an image folder's class folders).
  std::vector<std::string> class_names;
};

}  // namespace mixtrain::core
