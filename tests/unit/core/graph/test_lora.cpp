// LoRA (graph/lora.h): the rewrite's nodes and wiring, the errors of targets that match nothing,
// and what the rewritten model computes: the base model's outputs at the start (B = 0),
// x·Wᵀ + b + (alpha/r)·(x·Aᵀ)·Bᵀ once B moves, gradients that match finite differences, and
// nothing but the adapters training.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "layer_gradient_check.h"
#include "mixtrain/core/graph/lora.h"
#include "mixtrain/core/graph/model.h"
#include "tiny_gpt.h"

namespace mixtrain::core {
namespace {

using test_support::cpu;
using test_support::op;
using test_support::random_vector;
using test_support::read;
using test_support::write;

LoraSpec lora(std::vector<std::string> globs, std::int64_t r = 2, double alpha = 4.0,
              double dropout = 0.0) {
  LoraSpec s;
  s.r = r;
  s.alpha = alpha;
  s.dropout = dropout;
  s.where = {"lora.toml", 3, 1};
  std::uint32_t line = 7;
  for (auto& g : globs) {
    ParameterPattern p;
    p.pattern = g;
    p.where.file = "lora.toml";
    p.where.line = line++;
    p.where.column = 11;
    p.key = "model.lora.targets";
    s.targets.push_back(std::move(p));
  }
  return s;
}

ModelSpec tiny_gpt() {
  return test_support::tiny_gpt_spec();
}

const LayerSpec& node(const ModelSpec& spec, const std::string& name) {
  const auto it = std::find_if(spec.layers.begin(), spec.layers.end(),
                               [&](const LayerSpec& l) { return l.name == name; });
  if (it == spec.layers.end()) throw std::runtime_error("no node " + name);
  return *it;
}

bool has_node(const ModelSpec& spec, const std::string& name) {
  return std::any_of(spec.layers.begin(), spec.layers.end(),
                     [&](const LayerSpec& l) { return l.name == name; });
}

TEST(LoraRewrite, AddsAdaptersBesideEachTargetAndItsReadersReadTheSum) {
  ModelSpec spec = tiny_gpt();
  const std::size_t before = spec.layers.size();
  apply_lora(spec, lora({"h.*.attn.c_attn", "h.1.mlp.c_fc"}, 2, 4.0, 0.1));
  // Three targets: dropout, A, B and the sum each.
  EXPECT_EQ(spec.layers.size(), before + 3 * 4);
  EXPECT_EQ(lora_targets(spec),
            (std::vector<std::string>{"h.0.attn.c_attn", "h.1.attn.c_attn", "h.1.mlp.c_fc"}));
  const auto& d = node(spec, "h.0.attn.c_attn.lora_dropout");
  EXPECT_EQ(d.type, "dropout");
  EXPECT_EQ(d.inputs, std::vector<std::string>{"h.0.ln_1"});  // the target's input
  EXPECT_EQ(node(spec, "h.0.attn.c_attn.lora_A").inputs,
            std::vector<std::string>{"h.0.attn.c_attn.lora_dropout"});
  const auto& b = node(spec, "h.0.attn.c_attn.lora_B");
  EXPECT_EQ(layer_options(b).get_int("out"), 24);
  EXPECT_DOUBLE_EQ(layer_options(b).get_double("scale"), 2.0);
  EXPECT_TRUE(layer_options(b).get_bool("zero_init"));
  EXPECT_FALSE(layer_options(b).get_bool("bias"));
  EXPECT_EQ(layer_options(node(spec, "h.0.attn.c_attn.lora_A")).get_int("out"), 2);
  EXPECT_EQ(node(spec, "h.0.attn.c_attn.lora_sum").inputs,
            (std::vector<std::string>{"h.0.attn.c_attn", "h.0.attn.c_attn.lora_B"}));
  EXPECT_EQ(node(spec, "h.0.attn").inputs, std::vector<std::string>{"h.0.attn.c_attn.lora_sum"});
  EXPECT_EQ(node(spec, "h.1.mlp.gelu").inputs, std::vector<std::string>{"h.1.mlp.c_fc.lora_sum"});
  // Not a target: untouched.
  EXPECT_FALSE(has_node(spec, "h.0.mlp.c_fc.lora_A"));
  EXPECT_EQ(node(spec, "h.0.mlp.gelu").inputs, std::vector<std::string>{"h.0.mlp.c_fc"});
  // The adapters are what trains.
  ASSERT_EQ(spec.freeze.trainable.size(), 6u);
  EXPECT_EQ(spec.freeze.trainable[0].pattern, "h.0.attn.c_attn.lora_A");
  EXPECT_TRUE(spec.freeze.frozen.empty());
}

TEST(LoraRewrite, NoDropoutNodeWithoutDropoutAndASequentialModelBecomesAGraph) {
  ModelSpec spec;
  spec.layers = {op("linear", "fc1", {{"out", 16}}), op("relu", "relu1"),
                 op("linear", "fc2", {{"out", 5}})};
  apply_lora(spec, lora({"fc*"}));
  EXPECT_TRUE(spec.graph);
  EXPECT_FALSE(has_node(spec, "fc1.lora_dropout"));
  EXPECT_EQ(node(spec, "fc1.lora_A").inputs, std::vector<std::string>{"input"});
  EXPECT_EQ(node(spec, "relu1").inputs, std::vector<std::string>{"fc1.lora_sum"});
  EXPECT_EQ(node(spec, "fc2").inputs, std::vector<std::string>{"relu1"});
  // The last target's sum is the model's last node: its output.
  EXPECT_EQ(spec.layers.back().name, "fc2.lora_sum");
}

TEST(LoraRewrite, AGlobThatMatchesNoLinearNamesItAtItsLineAndListsTheLinears) {
  for (const char* glob : {"h.*.attn.q_proj", "h.0.ln_1"}) {
    ModelSpec spec = tiny_gpt();
    try {
      apply_lora(spec, lora({"h.*.attn.c_attn", glob}));
      FAIL() << "no error for " << glob;
    } catch (const sdk::ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("lora.toml:8:11"), std::string::npos) << m;
      EXPECT_NE(m.find("'" + std::string(glob) + "' matches no linear node"), std::string::npos)
          << m;
      EXPECT_NE(e.hint().find("h.0.attn.c_attn, h.0.attn.c_proj, h.0.mlp.c_fc, h.0.mlp.c_proj"),
                std::string::npos)
          << e.hint();
    }
  }
}

TEST(LoraRewrite, TermsNameEverySettingAResumeMustKeep) {
  EXPECT_EQ(lora_terms(LoraSpec{}), "none");
  EXPECT_EQ(lora_terms(lora({"h.*.attn.c_attn", "fc"}, 8, 16.0, 0.05)),
            "r = 8, alpha = 16, dropout = 0.050000000000000003, targets = [\"h.*.attn.c_attn\", "
            "\"fc\"]");
  EXPECT_TRUE(is_lora_parameter("h.0.attn.c_attn.lora_A.weight"));
  EXPECT_TRUE(is_lora_parameter("fc.lora_B.weight"));
  EXPECT_FALSE(is_lora_parameter("h.0.attn.c_attn.weight"));
}

// --- the rewritten model -----------------------------------------------------------------------

void feed_features(Model& m, std::int64_t batch, unsigned seed) {
  write(m.input(batch),
        random_vector(static_cast<std::size_t>(batch * m.input_features()), seed, -2.f, 2.f));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch * m.labels_per_sample()));
  for (std::size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<std::int32_t>((i * 7 + seed) % static_cast<unsigned>(m.classes()));
  cpu()->copy_from_host(m.labels(batch), labels.data());
}

ModelSpec mlp() {
  ModelSpec spec;
  spec.layers = {op("linear", "fc1", {{"out", 16}}), op("gelu", "act"),
                 op("linear", "fc2", {{"out", 5}})};
  return spec;
}

ModelParameter& parameter(Model& m, const std::string& name) {
  for (auto* p : m.parameters())
    if (p->name == name) return *p;
  throw std::runtime_error("no parameter " + name);
}

Layer& layer(Model& m, const std::string& name) {
  for (auto& l : m.layers())
    if (l->name() == name) return *l;
  throw std::runtime_error("no layer " + name);
}

void prepare(Model& m, std::int64_t rows) {
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(rows);
  m.init_parameters(5);
}

TEST(LoraModel, StartsAsTheBaseModelAndOnlyTheAdaptersTrain) {
  ModelSpec spec = mlp();
  apply_lora(spec, lora({"fc1", "fc2"}, 3, 6.0));
  Model base(cpu(), mlp(), 12, 5), adapted(cpu(), spec, 12, 5);
  prepare(base, 8);
  prepare(adapted, 8);
  feed_features(base, 8, 1);
  feed_features(adapted, 8, 1);
  base.forward(8);
  adapted.forward(8);
  const auto want = read(base.logits(8)), got = read(adapted.logits(8));
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  // The base weights are the base model's; B starts at 0, A does not (PyTorch's nn.Linear init,
  // U(-1/√12, 1/√12) for fc1's A).
  EXPECT_EQ(read(parameter(adapted, "fc1.weight").value()),
            read(parameter(base, "fc1.weight").value()));
  for (float v : read(parameter(adapted, "fc1.lora_B.weight").value())) EXPECT_EQ(v, 0.0f);
  const auto a = read(parameter(adapted, "fc1.lora_A.weight").value());
  ASSERT_EQ(a.size(), 3u * 12u);
  const float bound = 1.0f / std::sqrt(12.0f);
  EXPECT_GT(*std::max_element(a.begin(), a.end()), 0.5f * bound);
  for (float v : a) EXPECT_LE(std::abs(v), bound);
  std::vector<std::string> trainable;
  for (auto* p : adapted.trainable_parameters()) trainable.push_back(p->name);
  EXPECT_EQ(trainable, (std::vector<std::string>{"fc1.lora_A.weight", "fc1.lora_B.weight",
                                                 "fc2.lora_A.weight", "fc2.lora_B.weight"}));
  for (auto* p : adapted.parameters()) {
    if (is_lora_parameter(p->name)) continue;
    EXPECT_TRUE(p->frozen) << p->name;
    EXPECT_TRUE(p->master.empty() || p->grad.empty()) << p->name;
  }
}

TEST(LoraModel, AFrozenBStartsAtZeroInItsOneBf16Copy) {
  ModelSpec spec = mlp();
  apply_lora(spec, lora({"fc1", "fc2"}));
  ParameterPattern frozen;
  frozen.pattern = "fc1.lora_B";
  spec.freeze.frozen.push_back(frozen);
  Model m(cpu(), spec, 12, 5);
  sdk::OpPrecision bf16;
  bf16.weight = bf16.gemm_input = bf16.activation = bf16.activation_grad = sdk::DType::bf16;
  for (auto& l : m.layers()) l->set_precision(bf16);
  m.allocate(4);
  // Whatever the arena held before: the init writes the zeros.
  ModelParameter& b = parameter(m, "fc1.lora_B.weight");
  ASSERT_TRUE(b.master.empty());
  cpu()->fill(b.value(), 1.0f);
  m.init_parameters(5);
  for (float v : read(b.value())) EXPECT_EQ(v, 0.0f);
}

TEST(LoraModel, ComputesTheBasePlusTheScaledLowRankProductAndItsGradients) {
  constexpr std::int64_t rows = 4, in = 12, out = 16, r = 3;
  constexpr double alpha = 6.0;
  ModelSpec spec = mlp();
  apply_lora(spec, lora({"fc1"}, r, alpha));
  Model m(cpu(), spec, in, 5);
  prepare(m, rows);
  // B away from 0, so the adapter's path shows.
  write(parameter(m, "fc1.lora_B.weight").master.view(), random_vector(out * r, 3));
  m.refresh_working_copies();
  feed_features(m, rows, 2);
  m.forward(rows);
  const auto x = read(m.input(rows));
  const auto w = read(parameter(m, "fc1.weight").value());
  const auto bias = read(parameter(m, "fc1.bias").value());
  const auto a = read(parameter(m, "fc1.lora_A.weight").value());
  const auto b = read(parameter(m, "fc1.lora_B.weight").value());
  const auto y = read(layer(m, "fc1.lora_sum").output(rows));
  double largest_adapter = 0;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t o = 0; o < out; ++o) {
      double base = bias[o], adapter = 0;
      for (std::int64_t k = 0; k < in; ++k) base += double(x[i * in + k]) * w[o * in + k];
      for (std::int64_t j = 0; j < r; ++j) {
        double h = 0;
        for (std::int64_t k = 0; k < in; ++k) h += double(x[i * in + k]) * a[j * in + k];
        adapter += h * b[o * r + j];
      }
      adapter *= alpha / r;
      largest_adapter = std::max(largest_adapter, std::abs(adapter));
      EXPECT_NEAR(y[i * out + o], base + adapter, 1e-5 * std::max(1.0, std::abs(base + adapter)));
    }
  EXPECT_GT(largest_adapter, 0.1);
  // The adapters' gradients, scale included, against finite differences of the loss.
  m.compute_loss(rows, 1.0f, true);
  m.backward(rows);
  for (const char* name : {"fc1.lora_A.weight", "fc1.lora_B.weight"}) {
    ModelParameter& p = parameter(m, name);
    const auto analytic = read(p.grad.view());
    const auto fd = test_support::finite_difference(m, p, rows, analytic, 2e-3f);
    EXPECT_LT(fd.max_err, 2e-3) << name;
    EXPECT_GT(fd.max_ref, 1e-4) << name << ": a gradient that never moves checks nothing";
  }
}

}  // namespace
}  // namespace mixtrain::core
