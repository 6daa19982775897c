// Precision planning: which dtype each tensor of each layer uses in this run.
//
// Contract
// - plan_precision() asks the policy (adapted to the backend's capabilities first) for every
//   op's plan, given its sdk::OpDescription (Layer::description()).
// - Precision-sensitive ops (Layer::precision_sensitive(): layernorm's statistics; softmax and
//   attention later) are pinned here, and only here: every dtype fp32, whatever the policy
//   planned (logged at debug level when the plan differed). No policy keeps a deny-list.
// - Under a per-tensor FP8 policy (uses_scaled_operands()), the logits node, the linear whose
//   output the loss reads (a classifier, an LM head), computes its GEMMs in the policy's 16-bit
//   activation dtype instead of FP8, as Transformer Engine's recipes keep the output layer
//   (logged at info level). Why: its operands are scaled by one amax over the whole batch, so the
//   chunked loss cannot compute it in blocks and the [rows, classes] logits exist whole; and a
//   class count that is not a multiple of 16 has no FP8 GEMM at all (cuBLASLt answered
//   NOT_SUPPORTED for GPT-2's 50257 on an H200, session 58: the head ran as a 16-bit fallback
//   after FP8 casts that only cost, 19.3 of 43.7 ms a step, at 1.8x bf16's memory). An override
//   naming the node (gemm_input = "fp8_e4m3") puts it back in FP8.
// - Then the user's [[precision.override]] entries apply in config order: each pattern is a
//   layer name or an fnmatch glob, and every field it sets replaces the plan's. A glob ("*",
//   "fc*") skips precision-sensitive ops, so they stay fp32; a pattern without wildcards that
//   names a sensitive op exactly overrides it (the user asked for that op), with a warning. A
//   backslash makes the next character plain: the pattern r\[1\] (in TOML "r\\[1\\]") names the
//   node "r[1]"; exact_pattern() writes a node's name so (calibrate's overrides).
// - Then a pinned op that may (Layer trait output_may_take_readers_gemm_dtype: layernorm), and
//   that no override names exactly, stores its output in bf16 where every reader reads it as a
//   bf16 GEMM operand (trait reads_input_as_gemm_operand: a linear): those readers round it to
//   bf16 on every read anyway, so the stored output is the same bits they read, without their
//   casts and in half the memory. Its statistics, parameters and gradients stay FP32. bf16 only,
//   whose range is FP32's (fp16 could overflow where FP32 did not).
// - An override that matches no layer throws sdk::ConfigError at the override's config line,
//   naming the pattern and the layers that exist; one whose glob matches only sensitive ops
//   throws too, saying how to name one exactly.
// - A policy whose adapt_to() refuses the backend (sdk::BackendError: an FP8 policy on a GPU
//   without FP8 Tensor Cores) is still asked for the plan, overrides included, and the refusal is
//   raised as a ConfigError at the first node whose GEMMs need a dtype the capabilities do not
//   declare, naming the node and the dtype with the policy's message and hint; with no such node
//   the policy's own error stands. Either way nothing has been allocated or run.
// - Layers whose final plan computes their GEMMs in FP8 get the policy as their operand scaler;
//   an override that keeps a layer in 16-bit takes it out of the policy's scaling.
// - A policy with block-scaled operands (sdk/policy_block_scaling.h) is handed likewise to each
//   layer whose final plan keeps its fp8 mark; a layer without a block-scaled path is a
//   ConfigError at its node. One info line names the forward and dgrad reduction dims the blocks
//   do not divide: those GEMMs zero-pad their last block (exact, never a wrong answer).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/logging.h"
#include "mixtrain/sdk/precision_policy.h"

namespace mixtrain::core {

struct PrecisionOverride {
  std::string pattern;  // layer name or glob
  std::optional<sdk::DType> weight, gemm_input, activation, activation_grad;
  sdk::SourceLocation where;
  sdk::SourceLocation layers_where;  // of its layers key: a pattern matching nothing points there
};

std::string exact_pattern(const std::string& name);

void plan_precision(Model& model, sdk::PrecisionPolicy& policy,
                    const sdk::BackendCapabilities& capabilities,
                    const std::vector<PrecisionOverride>& overrides, const sdk::Logger& log = {});

}  // namespace mixtrain::core
