// The transformer ops (embedding, position_embedding, attention) and the gpt preset: finite-
// difference gradients, causality, the tied LM head, and the plan-time errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "config/model_presets.h"
#include "cpu_test_backend.h"
#include "graph/ops/attention.h"
#include "graph/ops/embedding.h"
#include "layer_gradient_check.h"
#include "mixtrain/core/graph/model.h"
#include "tiny_gpt.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using test_support::check_layer;
using test_support::cpu;
using test_support::op;
using test_support::random_vector;
using test_support::read;
using test_support::write;

TEST(TransformerOps, AttentionGradientsMatchFiniteDifferences) {
  // 2 sequences of 5 tokens, width 8 in 2 heads: qkv [10, 24] -> [10, 8].
  AttentionLayer attn("attn", 5, 8, 2);
  check_layer(attn, 10, -2.f, 2.f);
}

TEST(TransformerOps, UnfusedAttentionGradientsMatchFiniteDifferences) {
  AttentionLayer attn("attn", 5, 8, 2, /*fused=*/false);
  check_layer(attn, 10, -2.f, 2.f);
  EXPECT_FALSE(attn.flash());
}

TEST(TransformerOps, FlashAttentionGradientsMatchFiniteDifferencesOverTwoTiles) {
  // 140 tokens: the CPU backend's full tile of 128 and a partial one.
  AttentionLayer attn("attn", 140, 4, 2);
  check_layer(attn, 140, -2.f, 2.f);
  EXPECT_TRUE(attn.flash());
}

// Forward output and input gradient of one attention layer on `backend`, fp32.
struct AttentionPass {
  std::vector<float> y, dx;
};
AttentionPass attention_pass(AttentionLayer& attn, const std::shared_ptr<sdk::DeviceBackend>& be,
                             std::int64_t rows) {
  attn.allocate(be, rows);
  Tensor x(be, DType::fp32, sdk::Shape{rows, attn.in_features()});
  Tensor dy(be, DType::fp32, sdk::Shape{rows, attn.out_features()});
  Tensor dx(be, DType::fp32, sdk::Shape{rows, attn.in_features()});
  write(x.view(), random_vector(static_cast<std::size_t>(x.shape().numel()), 21, -2.f, 2.f));
  write(dy.view(), random_vector(static_cast<std::size_t>(dy.shape().numel()), 22));
  attn.forward(x.view(), rows);
  attn.backward(x.view(), dy.view(), dx.view(), rows);
  return {read(attn.output(rows)), read(dx.view())};
}

void expect_near_all(const std::vector<float>& a, const std::vector<float>& b, double tol,
                     const char* what) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  EXPECT_LE(worst, tol) << what;
}

TEST(TransformerOps, FlashAndUnfusedAttentionAgree) {
  // 2 sequences of 80 tokens, width 48 in 3 heads (D = 16).
  AttentionLayer flash("attn", 80, 48, 3), unfused("attn", 80, 48, 3, false);
  const AttentionPass a = attention_pass(flash, cpu(), 160);
  const AttentionPass b = attention_pass(unfused, cpu(), 160);
  ASSERT_TRUE(flash.flash());
  ASSERT_FALSE(unfused.flash());
  expect_near_all(a.y, b.y, 1e-5, "output");
  expect_near_all(a.dx, b.dx, 1e-5, "input gradient");
}

// A bf16 attention whose output's gradient arrives as an FP32 sum (the output read by two nodes,
// as LoRA's adapter and its base read it) into a bf16 input gradient takes that gradient rounded
// into bf16 first: the bits of the same backward given the rounded gradient. Into an FP32 input
// gradient (the underflow measurement's all-FP32 pass) it keeps the FP32 gradient as it is.
TEST(TransformerOps, FlashBackwardRoundsAnFp32GradientSumIntoItsSixteenBitInputGradient) {
  const std::int64_t rows = 2 * 40;
  AttentionLayer attn("attn", 40, 32, 2);
  attn.set_precision({DType::bf16, DType::bf16, DType::bf16, DType::bf16});
  const auto be = cpu();
  attn.allocate(be, rows);
  ASSERT_TRUE(attn.flash());
  // fp32 values into a tensor of `dtype` (rounded once), and a tensor's values as fp32.
  const auto tensor = [&](DType dtype, std::int64_t cols, const std::vector<float>& values) {
    Tensor wide(be, DType::fp32, sdk::Shape{rows, cols});
    write(wide.view(), values);
    Tensor t(be, dtype, sdk::Shape{rows, cols});
    be->cast(wide.view(), t.view());
    return t;
  };
  const auto values = [&](const Tensor& t) {
    Tensor wide(be, DType::fp32, t.shape());
    be->cast(t.view(), wide.view());
    return read(wide.view());
  };
  const Tensor x =
      tensor(DType::bf16, attn.in_features(),
             random_vector(static_cast<std::size_t>(rows * attn.in_features()), 31, -2.f, 2.f));
  const auto dyv = random_vector(static_cast<std::size_t>(rows * attn.out_features()), 32);
  const Tensor dy32 = tensor(DType::fp32, attn.out_features(), dyv);
  const Tensor dy16 = tensor(DType::bf16, attn.out_features(), dyv);
  const Tensor dy16_as32 = tensor(DType::fp32, attn.out_features(), values(dy16));
  const auto backward = [&](const Tensor& dy, DType dx_dtype) {
    Tensor dx(be, dx_dtype, sdk::Shape{rows, attn.in_features()});
    attn.forward(x.view(), rows);
    attn.backward(x.view(), dy.view(), dx.view(), rows);
    return values(dx);
  };
  const auto from32 = backward(dy32, DType::bf16);
  EXPECT_EQ(from32, backward(dy16, DType::bf16));
  EXPECT_TRUE(std::all_of(from32.begin(), from32.end(), [](float v) { return std::isfinite(v); }));
  EXPECT_NE(backward(dy32, DType::fp32), backward(dy16_as32, DType::fp32))
      << "an FP32 input gradient is computed from the FP32 dy, not its bf16 rounding";
}

// An attention facet that forwards the 1.0 ops to `in` and keeps the SDK's defaults for the rest:
// on its own, a backend that predates flash attention (supports() false for it).
class UnfusedAttention : public sdk::AttentionFacet {
 public:
  explicit UnfusedAttention(sdk::AttentionFacet& in) : in_(in) {}
  void split_heads(sdk::TensorView x, const sdk::HeadLayout& l, sdk::TensorView y) override {
    in_.split_heads(x, l, y);
  }
  void merge_heads(sdk::TensorView y, const sdk::HeadLayout& l, sdk::TensorView x) override {
    in_.merge_heads(y, l, x);
  }
  void softmax_forward(sdk::TensorView s, const sdk::SoftmaxShape& shape, float scale,
                       sdk::TensorView p) override {
    in_.softmax_forward(s, shape, scale, p);
  }
  void softmax_backward(sdk::TensorView p, sdk::TensorView dp, const sdk::SoftmaxShape& shape,
                        float scale, sdk::TensorView ds) override {
    in_.softmax_backward(p, dp, shape, scale, ds);
  }

 protected:
  sdk::AttentionFacet& in_;
};
class NoFlashBackend final : public test_support::ForwardingBackend {
 public:
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::AttentionFacet::kName ? &facet_ : in_->find_facet(name);
  }

 private:
  UnfusedAttention facet_{*sdk::facet<sdk::AttentionFacet>(*cpu())};
};

TEST(TransformerOps, AttentionRunsUnfusedOnABackendWithoutFlash) {
  auto be = std::make_shared<NoFlashBackend>();
  const std::vector<DType> fp32{DType::fp32};
  EXPECT_FALSE(
      sdk::facet<sdk::AttentionFacet>(*be)->supports(sdk::AttentionOp::flash_forward, fp32));
  EXPECT_THROW(sdk::facet<sdk::AttentionFacet>(*be)->flash_forward({}, {}, 1.0f, {}, {}),
               sdk::BackendError);
  AttentionLayer fallback("attn", 7, 8, 2), unfused("attn", 7, 8, 2, false);
  const AttentionPass a = attention_pass(fallback, be, 14);
  const AttentionPass b = attention_pass(unfused, cpu(), 14);
  EXPECT_FALSE(fallback.flash());
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.dx, b.dx);
  // The memory plans keep qkv and the output for a flash backward only: the kernels are chosen
  // before them (choose_kernels), so a fallback keeps nothing it does not read.
  EXPECT_FALSE(fallback.backward_reads_inputs());
  EXPECT_FALSE(fallback.backward_reads_output());
  AttentionLayer flash("attn", 7, 8, 2);
  flash.choose_kernels(*cpu());
  EXPECT_TRUE(flash.flash());
  EXPECT_TRUE(flash.backward_reads_inputs());
  EXPECT_TRUE(flash.backward_reads_output());
}

// The CPU backend whose flash attention (attention facet 1.2) has no kernel for a head dimension
// above 4: a fused kernel with a shape limit, as cuDNN's has.
class HeadDimLimitedAttention final : public UnfusedAttention {
 public:
  using UnfusedAttention::UnfusedAttention;
  bool supports(sdk::AttentionOp op, std::span<const DType> dtypes) const override {
    return in_.supports(op, dtypes);
  }
  void flash_forward(sdk::TensorView qkv, const sdk::HeadLayout& l, float scale,
                     sdk::TensorView out, sdk::TensorView lse) override {
    in_.flash_forward(qkv, l, scale, out, lse);
  }
  void flash_backward(sdk::TensorView qkv, sdk::TensorView out, sdk::TensorView dout,
                      sdk::TensorView lse, const sdk::HeadLayout& l, float scale,
                      sdk::TensorView dqkv) override {
    in_.flash_backward(qkv, out, dout, lse, l, scale, dqkv);
  }
  std::string flash_refusal(const sdk::HeadLayout& l, DType dtype) const override {
    asked.push_back(l);
    asked_dtype = dtype;
    return l.head_dim > 4 ? "no kernel for a head dimension above 4" : "";
  }
  mutable std::vector<sdk::HeadLayout> asked;
  mutable DType asked_dtype = DType::bf16;
};
class HeadDimLimitedBackend final : public test_support::ForwardingBackend {
 public:
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::AttentionFacet::kName ? &facet : in_->find_facet(name);
  }
  HeadDimLimitedAttention facet{*sdk::facet<sdk::AttentionFacet>(*cpu())};
};

TEST(TransformerOps, AShapeTheFlashKernelRefusesRunsUnfused) {
  auto be = std::make_shared<HeadDimLimitedBackend>();
  // Width 8 in 2 heads (D = 4): fused. Width 16 in 2 heads (D = 8): refused, so unfused, with the
  // same values as the unfused path.
  AttentionLayer fits("attn", 7, 8, 2);
  fits.choose_kernels(*be);
  EXPECT_TRUE(fits.flash());
  ASSERT_EQ(be->facet.asked.size(), 1u);
  const sdk::HeadLayout asked = be->facet.asked[0];
  EXPECT_EQ(asked.batch, 0);  // any batch: the plan has no batch yet
  EXPECT_EQ(asked.tokens, 7);
  EXPECT_EQ(asked.heads, 2);
  EXPECT_EQ(asked.head_dim, 4);
  EXPECT_EQ(asked.parts, 3);
  EXPECT_EQ(be->facet.asked_dtype, DType::fp32);
  AttentionLayer refused("attn", 7, 16, 2), unfused("attn", 7, 16, 2, false);
  const AttentionPass a = attention_pass(refused, be, 14);
  const AttentionPass b = attention_pass(unfused, cpu(), 14);
  EXPECT_FALSE(refused.flash());
  EXPECT_FALSE(refused.backward_reads_inputs());
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.dx, b.dx);
  // A node that asks for the unfused path never asks the backend.
  be->facet.asked.clear();
  AttentionLayer off("attn", 7, 8, 2, false);
  off.choose_kernels(*be);
  EXPECT_TRUE(be->facet.asked.empty());
}

TEST(TransformerOps, AttentionWithOneHeadAndOneToken) {
  AttentionLayer attn("attn", 1, 4, 1);
  check_layer(attn, 3);
}

TEST(TransformerOps, AttentionIsCausalAndSequencesAreIndependent) {
  const std::int64_t t = 6, c = 8, n = 2, rows = n * t;
  AttentionLayer attn("attn", t, c, 4);
  attn.allocate(cpu(), rows);
  Tensor x(cpu(), DType::fp32, sdk::Shape{rows, 3 * c});
  auto xv = random_vector(static_cast<std::size_t>(rows * 3 * c), 3, -2.f, 2.f);
  write(x.view(), xv);
  attn.forward(x.view(), rows);
  const auto before = read(attn.output(rows));
  // Change token 3 of sequence 0 (its q, k and v): tokens 0..2 of it and all of sequence 1 keep
  // their outputs bit for bit; token 3 onwards of sequence 0 change.
  for (std::int64_t j = 0; j < 3 * c; ++j) xv[static_cast<std::size_t>(3 * 3 * c + j)] += 0.5f;
  write(x.view(), xv);
  attn.forward(x.view(), rows);
  const auto after = read(attn.output(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    bool same = true;
    for (std::int64_t j = 0; j < c; ++j)
      same = same && before[static_cast<std::size_t>(r * c + j)] ==
                         after[static_cast<std::size_t>(r * c + j)];
    const bool affected = r >= 3 && r < t;
    EXPECT_EQ(same, !affected) << "row " << r;
  }
  // Token 0 attends only to itself: its output is its own v.
  for (std::int64_t j = 0; j < c; ++j)
    EXPECT_FLOAT_EQ(after[static_cast<std::size_t>(j)], xv[static_cast<std::size_t>(2 * c + j)]);
}

TEST(TransformerOps, PositionEmbeddingGradientsMatchFiniteDifferences) {
  PositionEmbeddingLayer pos("wpe", 4, 6, 3, 1.0);
  check_layer(pos, 8);
}

TEST(TransformerOps, EmbeddingGathersRowsAndScattersGradientsOfRepeatedIds) {
  const std::int64_t vocab = 5, dim = 3, rows = 6;
  EmbeddingLayer emb("wte", rows, vocab, dim, 1.0);
  emb.allocate(cpu(), rows);
  emb.init_parameters(4);
  const auto table = read(emb.parameters()[0].master.view());
  Tensor ids(cpu(), DType::int32, sdk::Shape{1, rows});
  const std::vector<std::int32_t> id = {4, 0, 4, 2, 4, 0};
  cpu()->copy_from_host(ids.view(), id.data());
  emb.forward(ids.view(), rows);
  const auto y = read(emb.output(rows));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < dim; ++j)
      EXPECT_EQ(y[static_cast<std::size_t>(r * dim + j)],
                table[static_cast<std::size_t>(id[static_cast<std::size_t>(r)] * dim + j)]);
  // L = Σ y·dy is linear in the table: dL/dW[v] = Σ of dy over the rows with id v; ids 1 and 3
  // appear nowhere, so their gradient is 0 (overwritten, not left over).
  const auto dyv = random_vector(static_cast<std::size_t>(rows * dim), 9);
  Tensor dy(cpu(), DType::fp32, sdk::Shape{rows, dim});
  write(dy.view(), dyv);
  write(emb.parameters()[0].grad.view(), std::vector<float>(vocab * dim, 7.0f));
  emb.backward(ids.view(), dy.view(), {}, rows);
  const auto g = read(emb.parameters()[0].grad.view());
  for (std::int64_t v = 0; v < vocab; ++v)
    for (std::int64_t j = 0; j < dim; ++j) {
      double want = 0;
      for (std::int64_t r = 0; r < rows; ++r)
        if (id[static_cast<std::size_t>(r)] == v)
          want += dyv[static_cast<std::size_t>(r * dim + j)];
      EXPECT_NEAR(g[static_cast<std::size_t>(v * dim + j)], want, 1e-6) << v << "," << j;
    }
}

// A 2-layer GPT from the preset: vocab 11, T 5, width 8 in 2 heads.
ModelSpec tiny_gpt(std::int64_t n_layer = 2, std::int64_t n_head = 2, std::int64_t n_embd = 8) {
  return test_support::tiny_gpt_spec(n_layer, n_head, n_embd);
}

const InputSpec kTokens{DType::int32, 5, {}, {}};

void feed_tokens(Model& m, std::int64_t batch, unsigned seed) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(batch * 5)), next(ids.size());
  std::uint32_t s = seed;
  for (auto& v : ids) v = static_cast<std::int32_t>((s = s * 1664525u + 1013904223u) >> 28) % 11;
  for (std::size_t i = 0; i < ids.size(); ++i) next[i] = ids[(i + 1) % ids.size()];
  cpu()->copy_from_host(m.input(batch), ids.data());
  cpu()->copy_from_host(m.labels(batch), next.data());
}

TEST(TransformerOps, GptPresetNamesItsParametersAsHuggingFaceGpt2) {
  Model m(cpu(), tiny_gpt(), 5, 11, kTokens);
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(2);
  std::vector<std::string> names;
  for (auto* p : m.parameters()) names.push_back(p->name);
  const std::vector<std::string> want = {"wte.weight",
                                         "wpe.weight",
                                         "h.0.ln_1.weight",
                                         "h.0.ln_1.bias",
                                         "h.0.attn.c_attn.weight",
                                         "h.0.attn.c_attn.bias",
                                         "h.0.attn.c_proj.weight",
                                         "h.0.attn.c_proj.bias",
                                         "h.0.ln_2.weight",
                                         "h.0.ln_2.bias",
                                         "h.0.mlp.c_fc.weight",
                                         "h.0.mlp.c_fc.bias",
                                         "h.0.mlp.c_proj.weight",
                                         "h.0.mlp.c_proj.bias"};
  ASSERT_GE(names.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(names[i], want[i]);
  EXPECT_EQ(names.back(), "ln_f.bias");  // lm_head is tied to wte: no parameter of its own
  // 11·8 + 5·8 + 2·(2·8 + 8·24 + 24 + 8·8 + 8 + 2·8 + 8·32 + 32 + 32·8 + 8) + 2·8
  EXPECT_EQ(m.parameter_count(),
            88 + 40 + 2 * (16 + 192 + 24 + 64 + 8 + 16 + 256 + 32 + 256 + 8) + 16);
}

TEST(TransformerOps, WholeGptGradientsMatchFiniteDifferencesIncludingTheTiedHead) {
  Model m(cpu(), tiny_gpt(), 5, 11, kTokens);
  for (auto& l : m.layers()) l->set_precision({});
  const std::int64_t batch = 2;
  m.allocate(batch);
  m.init_parameters(5);
  // Larger weights than GPT-2's 0.02 so every path carries a measurable gradient.
  for (auto* p : m.parameters()) {
    auto v = read(p->master.view());
    auto noise = random_vector(v.size(), 13, -0.3f, 0.3f);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] += noise[i];
    write(p->master.view(), v);
  }
  feed_tokens(m, batch, 1);
  m.forward(batch);
  const auto lv = m.loss(batch, 1.0f, true);
  EXPECT_TRUE(std::isfinite(lv.loss));
  m.backward(batch);
  for (auto* p : m.parameters()) {
    const auto analytic = read(p->grad.view());
    const auto fd = test_support::finite_difference(m, *p, batch, analytic, 1e-2f);
    EXPECT_LT(fd.max_err, 2e-3 * std::max(1.0, fd.max_ref)) << p->name;
    EXPECT_GT(fd.max_ref, 1e-4) << p->name << ": a gradient check of nothing";
  }
}

TEST(TransformerOps, PlanTimeErrorsNameTheNode) {
  // n_embd not divisible by n_head.
  try {
    Model m(cpu(), tiny_gpt(1, 3, 8), 5, 11, kTokens);
    FAIL() << "no error";
  } catch (const sdk::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("h.0.attn"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not divisible by heads = 3"), std::string::npos)
        << e.what();
  }
  // Token ids fed to a linear.
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {op("linear", "fc", {{"out", 11}}, {"input"})};
  EXPECT_THROW(Model(cpu(), spec, 5, 11, kTokens), sdk::ConfigError);
  // An embedding fed float features.
  spec.layers = {op("embedding", "wte", {{"vocab", 11}, {"dim", 4}}, {"input"}),
                 op("flatten", "flat", {}, {"wte"}), op("linear", "head", {{"out", 3}}, {"flat"})};
  EXPECT_THROW(Model(cpu(), spec, 5, 3), sdk::ConfigError);
  // An embedding fed another node's output (floats, read as ids, were it allowed).
  spec.layers = {op("embedding", "wte", {{"vocab", 11}, {"dim", 4}}, {"input"}),
                 op("embedding", "again", {{"vocab", 11}, {"dim", 4}}, {"wte"}),
                 op("linear", "head", {{"out", 11}}, {"again"})};
  try {
    Model m(cpu(), spec, 5, 11, kTokens);
    FAIL() << "no error";
  } catch (const sdk::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("node 'again'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("its input must be the batch"), std::string::npos)
        << e.what();
  }
  // Logits that are not one prediction per position.
  spec.layers = {op("embedding", "wte", {{"vocab", 11}, {"dim", 4}}, {"input"}),
                 op("flatten", "flat", {}, {"wte"}), op("linear", "head", {{"out", 11}}, {"flat"})};
  try {
    Model m(cpu(), spec, 5, 11, kTokens);
    FAIL() << "no error";
  } catch (const sdk::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("one prediction per position"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mixtrain::core
