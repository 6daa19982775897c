// summarize_model: the per-node rows and totals `mixtrain check` prints, counted by hand for a
// small graph, and the planned activation memory against the model's own plan in two dtypes.
#include <gtest/gtest.h>

#include "cpu_test_backend.h"
#include "mixtrain/core/graph/model_summary.h"

namespace mixtrain::core {
namespace {

using test_support::cpu;
using test_support::op;

ModelSpec residual_spec() {
  // input [12] -> fc1 [12] -> relu -> add(relu, input) -> head [5]
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {op("linear", "fc1", {{"out", 12}}, {"input"}), op("relu", "act", {}, {"fc1"}),
                 op("add", "sum", {}, {"act", "input"}),
                 op("linear", "head", {{"out", 5}, {"bias", false}}, {"sum"})};
  return spec;
}

TEST(ModelSummary, CountsParametersFlopsAndShapesPerNode) {
  Model m(cpu(), residual_spec(), 12, 5);
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(9);
  const auto s = summarize_model(m, 9);
  ASSERT_EQ(s.nodes.size(), 4u);
  EXPECT_EQ(s.nodes[0].name, "fc1");
  EXPECT_EQ(s.nodes[0].parameters, 12 * 12 + 12);
  EXPECT_EQ(s.nodes[0].forward_flops_per_sample, 2 * 12 * 12 + 12);
  EXPECT_EQ(s.nodes[2].op, "add");
  ASSERT_EQ(s.nodes[2].input_shapes.size(), 2u);
  EXPECT_EQ(s.nodes[2].input_shapes[1], (std::vector<std::int64_t>{12}));
  EXPECT_EQ(s.nodes[2].forward_flops_per_sample, 12);
  EXPECT_EQ(s.nodes[3].parameters, 12 * 5);  // no bias
  EXPECT_EQ(s.nodes[3].output_shape, (std::vector<std::int64_t>{5}));
  EXPECT_EQ(s.parameters, m.parameter_count());
  const std::int64_t forward = (2 * 144 + 12) + 12 + 12 + 2 * 60;
  EXPECT_EQ(s.forward_flops_per_sample, forward);
  // fc1's input is the data: its weights' gradient, no input gradient. The others: head both
  // GEMMs, act and sum (no weights) twice their forward.
  EXPECT_EQ(s.training_flops_per_step, ((2 * 144 + 12) * 2 + 12 * 3 + 12 * 3 + 2 * 60 * 3) * 9);
  EXPECT_EQ(summarize_model(m, 9, 4).training_flops_per_step, 4 * s.training_flops_per_step);
  EXPECT_EQ(s.parameter_bytes, static_cast<std::size_t>(m.parameter_count()) * 8);
}

// A frozen weight whose bias trains (BitFit) runs no weight-gradient GEMM: fc1 and head count
// their forward and, head, its input's gradient (fc1's input is the data); act and sum still pass
// the gradient down to fc1's bias.
TEST(ModelSummary, AFrozenWeightWithATrainingBiasRunsNoWeightGradient) {
  ModelSpec spec = residual_spec();
  for (const char* weight : {"fc1.weight", "head.weight"})
    spec.freeze.frozen.push_back({weight, {"train.toml", 1, 11}, "train.frozen"});
  Model m(cpu(), spec, 12, 5);
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(9);
  EXPECT_EQ(summarize_model(m, 9).training_flops_per_step,
            ((2 * 144 + 12) + 12 * 3 + 12 * 3 + 2 * 60 * 2) * 9);
}

TEST(ModelSummary, PlannedActivationMemoryFollowsThePolicy) {
  Model fp32(cpu(), residual_spec(), 12, 5);
  for (auto& l : fp32.layers()) l->set_precision({});
  Model bf16(cpu(), residual_spec(), 12, 5);
  for (auto& l : bf16.layers()) {
    sdk::OpPrecision p;
    p.activation = p.activation_grad = sdk::DType::bf16;
    l->set_precision(p);
  }
  fp32.allocate(64);
  bf16.allocate(64);
  const auto a = summarize_model(fp32, 64);
  const auto b = summarize_model(bf16, 64);
  EXPECT_EQ(a.activation_bytes, fp32.plan_activations(64).arena_bytes);
  EXPECT_EQ(a.activation_bytes, a.activation_bytes_fp32);
  EXPECT_EQ(b.activation_bytes_fp32, a.activation_bytes);
  EXPECT_EQ(b.activation_bytes * 2, a.activation_bytes);  // 64-row buffers: no alignment slack
  EXPECT_LE(a.activation_bytes, a.activation_bytes_unplanned);
  const auto text = render_model_summary(b);
  EXPECT_NE(text.find("fc1"), std::string::npos) << text;
  EXPECT_NE(text.find("fp32/fp32/bf16/bf16"), std::string::npos) << text;
  EXPECT_NE(text.find("50% saved"), std::string::npos) << text;
}

}  // namespace
}  // namespace mixtrain::core
