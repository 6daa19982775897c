// Add + layer norm (layernorm.h, add.h; layer norm 1.2's layernorm_add_forward): a residual add
// runs the layer norm that reads its sum in its own pass, on a pre-norm residual stack. Against
// the ops apart from the same weights: the same bits in FP32 and in bf16 (the sum is normalised
// as stored), the same gradients, the layer norm's output kept apart from what the add reads, a
// backend without the op, the non-finite replay, and finite differences through the fused pass.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/core/graph/model.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using sdk::TensorView;
using test_support::op;

// The CPU backend's layer norm facet, refusing layernorm_add_forward (an older backend's).
class LayerNormWithoutAdd final : public sdk::LayerNormFacet {
 public:
  explicit LayerNormWithoutAdd(sdk::LayerNormFacet& in) : in_(in) {}
  bool supports(sdk::LayerNormOp op, std::span<const DType> d) const override {
    return op != sdk::LayerNormOp::layernorm_add_forward && in_.supports(op, d);
  }
  void layernorm_forward(TensorView x, TensorView g, TensorView b, float eps, TensorView y,
                         TensorView mean, TensorView rstd) override {
    in_.layernorm_forward(x, g, b, eps, y, mean, rstd);
  }
  void layernorm_backward(TensorView dy, TensorView x, TensorView g, TensorView mean,
                          TensorView rstd, TensorView dx, TensorView dg, TensorView db,
                          bool acc) override {
    in_.layernorm_backward(dy, x, g, mean, rstd, dx, dg, db, acc);
  }
  void layernorm_backward_accumulate(TensorView dy, TensorView x, TensorView g, TensorView mean,
                                     TensorView rstd, TensorView dx, TensorView dg, TensorView db,
                                     bool acc) override {
    in_.layernorm_backward_accumulate(dy, x, g, mean, rstd, dx, dg, db, acc);
  }

 private:
  sdk::LayerNormFacet& in_;
};

// A pre-norm residual stack in small, as GPT-2's: two blocks and the final norm. block1's sum is
// read by ln2 and block2's add; block2's sum by ln_f alone.
ModelSpec stack(bool fuse) {
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {op("linear", "embed", {{"out", 24}}, {"input"}),
                 op("layernorm", "ln1", {}, {"embed"}),
                 op("linear", "mix", {{"out", 24}}, {"ln1"}),
                 op("add", "block1", {}, {"embed", "mix"}),
                 op("layernorm", "ln2", {}, {"block1"}),
                 op("linear", "mlp", {{"out", 24}}, {"ln2"}),
                 op("gelu", "act", {}, {"mlp"}),
                 op("add", "block2", {}, {"block1", "act"}),
                 op("layernorm", "ln_f", {}, {"block2"}),
                 op("linear", "head", {{"out", 5}}, {"ln_f"})};
  spec.fuse_epilogues = fuse;
  return spec;
}

constexpr std::int64_t kRows = 11;

struct Trained {
  // The layer norm facet without the op, which a backend without it finds (outlives the model).
  std::unique_ptr<LayerNormWithoutAdd> without;
  std::shared_ptr<test_support::CallCountingBackend> backend;
  std::unique_ptr<Model> model;
  std::map<std::string, int> forward_calls;
  std::vector<float> values;  // the losses of two steps, then every parameter gradient
};

void feed(Trained& r, int step) {
  std::vector<float> x(kRows * 12);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = 3.0f + std::sin(0.41f * static_cast<float>(i) + static_cast<float>(step)) * 2.0f;
  std::vector<std::int32_t> y = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0};
  r.backend->copy_from_host(r.model->input(kRows), x.data());
  r.backend->copy_from_host(r.model->labels(kRows), y.data());
}

// The stack on a backend with or without the op, allocated and initialised from seed 3; in bf16,
// the precision-sensitive ops stay FP32 as the planner pins them (the layer norms write fp32 from
// a bf16 stream).
Trained built(bool fuse, bool offer_add, bool bf16) {
  Trained r;
  r.backend = std::make_shared<test_support::CallCountingBackend>();
  r.backend->counting = true;
  if (!offer_add) {
    r.without = std::make_unique<LayerNormWithoutAdd>(
        *sdk::facet<sdk::LayerNormFacet>(*test_support::cpu()));
    r.backend->stand_ins[sdk::LayerNormFacet::kName] = r.without.get();
  }
  r.model = std::make_unique<Model>(r.backend, stack(fuse), 12, 5);
  for (auto& l : r.model->layers())
    l->set_precision(bf16 && !l->precision_sensitive()
                         ? test_support::uniform_precision(DType::bf16)
                         : sdk::OpPrecision{});
  r.model->allocate(kRows);
  r.model->init_parameters(3);
  return r;
}

Trained fused_fp32_model() {
  return built(true, true, false);
}

// Two steps of forward, loss and backward.
Trained train(bool fuse, bool offer_add, bool bf16) {
  Trained r = built(fuse, offer_add, bf16);
  for (int step = 0; step < 2; ++step) {
    feed(r, step);
    r.backend->calls.clear();
    r.model->forward(kRows);
    if (step == 0) r.forward_calls = r.backend->calls;
    r.values.push_back(r.model->loss(kRows, 1.0f, true).loss);
    r.model->backward(kRows);
  }
  const auto g = test_support::all_gradients(*r.model);
  r.values.insert(r.values.end(), g.begin(), g.end());
  return r;
}

TEST(AddLayerNorm, RunsInTheAddsPassAndWritesTheSameBitsAsTheOpsApart) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 stream" : "fp32");
    const Trained fused = train(true, true, bf16);
    // The baseline differs only there: the same rewrites, on a backend without the op.
    const Trained apart = train(true, false, bf16);
    ASSERT_EQ(fused.values.size(), apart.values.size());
    EXPECT_EQ(fused.values, apart.values);
    // ln2 and ln_f run in their adds' pass (ln1 reads a linear and runs alone), beside mlp's gelu
    // epilogue.
    EXPECT_EQ(fused.model->fused_pairs(), 2 + 1);
    EXPECT_EQ(apart.model->fused_pairs(), 1) << "the backend lacks the op: the pairs run apart";
    EXPECT_EQ(fused.forward_calls.at("layernorm_add_forward"), 2);
    EXPECT_EQ(fused.forward_calls.at("layernorm_forward"), 1);
    EXPECT_EQ(fused.forward_calls.count("add"), 0u);
    EXPECT_EQ(apart.forward_calls.count("layernorm_add_forward"), 0u);
    EXPECT_EQ(apart.forward_calls.at("layernorm_forward"), 3);
    EXPECT_EQ(apart.forward_calls.at("add"), 2);
  }
  // In FP32 every rewrite is bit-exact: fuse_epilogues = false gives the same numbers.
  const Trained fused = train(true, true, false);
  const Trained none = train(false, true, false);
  EXPECT_EQ(none.model->fused_pairs(), 0);
  EXPECT_EQ(fused.values, none.values);
}

TEST(AddLayerNorm, TheLayerNormOutputSharesNoByteWithWhatTheAddReads) {
  const Trained fused = train(true, true, false);
  Model& m = *fused.model;
  std::map<std::string, TensorView> out;
  for (auto& l : m.layers()) out[l->name()] = l->output(kRows);
  auto overlap = [](const TensorView& a, const TensorView& b) {
    const auto* a0 = static_cast<const char*>(a.data);
    const auto* b0 = static_cast<const char*>(b.data);
    return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
  };
  // ln2 is written while block1 reads embed and mix; ln_f while block2 reads block1 and act.
  for (const char* input : {"embed", "mix", "block1"})
    EXPECT_FALSE(overlap(out.at("ln2"), out.at(input))) << "ln2 over " << input;
  for (const char* input : {"block1", "act", "block2"})
    EXPECT_FALSE(overlap(out.at("ln_f"), out.at(input))) << "ln_f over " << input;
}

TEST(AddLayerNorm, TheNonfiniteReplayRunsThePairApartAndTheNextStepFusedAgain) {
  Trained r = fused_fp32_model();
  Model& m = *r.model;
  feed(r, 0);
  auto calls = test_support::replay_between_steps(m, kRows, *r.backend);
  EXPECT_EQ(calls.replay["layernorm_add_forward"], 0) << "the replay runs every op alone";
  EXPECT_EQ(calls.replay["layernorm_forward"], 3);
  EXPECT_EQ(calls.step_after["layernorm_add_forward"], 2) << "fused again after the replay";
}

TEST(AddLayerNorm, GradientsThroughTheFusedPassMatchFiniteDifferences) {
  Trained r = fused_fp32_model();
  Model& m = *r.model;
  ASSERT_EQ(m.fused_pairs(), 3);
  feed(r, 0);
  m.forward(kRows);
  m.loss(kRows, 1.0f, true);
  m.backward(kRows);
  test_support::expect_finite_differences(
      m, kRows, {"mix.weight", "ln2.weight", "ln_f.bias", "embed.bias"}, 1e-2f, 2e-3);
}

}  // namespace
}  // namespace mixtrain::core
