// ModelSummary: what `mixtrain check` prints about a model before it trains: per node its op,
// shapes, parameters, forward FLOPs and the dtypes the precision plan chose; then the totals and
// the planned memory, under the chosen policy and in fp32, so a user sees whether the model fits
// and what a 16-bit policy saves.
//
// Contract
// - summarize_model() reads a built, planned and allocated model (parameters exist only then).
//   Shapes are per sample (batch first, omitted). FLOPs count a multiply-add as 2; element-wise
//   ops one per element (layernorm five). A training step is the forward and the backward the
//   executor runs: none for a node no trainable parameter lies upstream of or at (a frozen
//   prefix); for a node with weights, one forward's worth for its weights' gradient where one
//   trains (a weight, its own or a tied one it reads; a bias alone costs no GEMM) and one for its
//   input's where a node upstream trains; for a node without, twice its
//   forward where its input needs a gradient (attention's backward is four GEMMs to its two);
//   times the batch and `micro_batches` (run.accumulate).
// - Memory is bytes for `batch_rows` rows: the activation arena from the liveness plan
//   (Model::plan_activations), parameters with their FP32 masters and gradients plus working
//   copies, a frozen one (graph/freezing.h) its one stored copy. Optimizer state is not included
//   (it depends on the optimizer; frozen parameters have none).
// - With frozen parameters the summary also splits them from the trainable ones: names, counts
//   and bytes of each, which render_model_summary() prints after the totals (and leaves out when
//   everything trains).
// - render_model_summary() formats it as '#'-prefixed text lines (TOML comments).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mixtrain/core/graph/model.h"

namespace mixtrain::core {

struct NodeSummary {
  std::string name, op;
  std::vector<std::vector<std::int64_t>> input_shapes;  // per sample
  std::vector<std::int64_t> output_shape;               // per sample
  std::int64_t parameters = 0;
  std::int64_t forward_flops_per_sample = 0;
  sdk::OpPrecision precision;
};

struct ModelSummary {
  std::vector<NodeSummary> nodes;
  std::int64_t parameters = 0;
  std::int64_t batch_rows = 0, micro_batches = 1;
  std::int64_t forward_flops_per_sample = 0;
  std::int64_t training_flops_per_sample = 0;  // the forward and the backward that runs
  std::int64_t training_flops_per_step = 0;    // x batch_rows x micro_batches
  std::size_t activation_bytes = 0;            // planned arena under the policy
  std::size_t activation_bytes_fp32 = 0;       // the same plan with every output in fp32
  std::size_t activation_bytes_unplanned = 0;  // every stored output, no reuse
  std::size_t parameter_bytes = 0;             // masters + gradients (fp32) + working copies
  // The outputs computed again for the backward (model.recompute; graph/memory_plan.h), their op
  // types in table order, and their bytes at batch_rows: what the step no longer keeps past its
  // forward reads (their recomputation's FLOPs are in training_flops_per_sample).
  std::vector<std::string> recomputed, recomputed_types;
  std::size_t recomputed_bytes = 0;
  // What trains and what is frozen: parameter tensors by name, elements, and their bytes as
  // parameter_bytes counts them.
  struct Share {
    std::vector<std::string> names;
    std::int64_t parameters = 0;
    std::size_t bytes = 0;
  };
  Share trainable, frozen;
  // Of the frozen ones, those stored quantized (train.frozen_format), and the format's label.
  std::int64_t quantized_parameters = 0;
  std::string quantized_label;
};

ModelSummary summarize_model(const Model& model, std::int64_t batch_rows,
                             std::int64_t micro_batches = 1);
std::string render_model_summary(const ModelSummary& summary);
// A node's inputs and output per sample as render_model_summary() prints them: "[64, 56, 56] ->
// [256, 56, 56]" (inputs separated by spaces).
std::string node_shapes_text(const NodeSummary& node);
// 1234567 -> "1.23M", as the summary prints FLOPs and parameter counts (they span many orders of
// magnitude).
std::string count_text(double v);

}  // namespace mixtrain::core
