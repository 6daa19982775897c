// Freezing parameters (graph/freezing.h): which patterns freeze what, the errors of patterns that
// match nothing or leave nothing to train, and what a frozen parameter costs a step: its weight
// gradient's kernels are not called (counted through a call observer), nodes with nothing to
// learn upstream run no backward, and the gradients that do flow are the unfrozen model's, bit
// for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "layer_gradient_check.h"
#include "mixtrain/core/graph/freezing.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/core/graph/quantized_weight.h"
#include "mixtrain/sdk/backend_call_observer.h"
#include "mixtrain/sdk/backend_quantized_weight.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/nf4.h"
#include "tiny_gpt.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using test_support::cpu;
using test_support::op;
using test_support::random_vector;
using test_support::read;
using test_support::write;

// --- resolve_frozen ------------------------------------------------------------------------------

const std::vector<NamedParameter> kParams = {{"fc1", "fc1.weight"},   {"fc1", "fc1.bias"},
                                             {"fc2", "fc2.weight"},   {"fc2", "fc2.bias"},
                                             {"head", "head.weight"}, {"head", "head.bias"}};

ParameterPattern at(std::string pattern, std::uint32_t line, const char* key) {
  return {std::move(pattern), {"train.toml", line, 11}, key};
}

FreezeSpec freeze(std::vector<std::string> frozen, std::vector<std::string> trainable = {}) {
  FreezeSpec spec;
  std::uint32_t line = 1;
  for (auto& p : trainable) spec.trainable.push_back(at(p, line++, "train.trainable[0]"));
  for (auto& p : frozen) spec.frozen.push_back(at(p, line++, "train.frozen[0]"));
  return spec;
}

TEST(Freezing, PatternsMatchParameterNamesNodeNamesAndGlobs) {
  EXPECT_EQ(resolve_frozen({}, kParams), std::vector<std::string>{});
  EXPECT_EQ(resolve_frozen(freeze({"fc1"}), kParams),
            (std::vector<std::string>{"fc1.bias", "fc1.weight"}));
  EXPECT_EQ(resolve_frozen(freeze({"fc2.weight"}), kParams),
            std::vector<std::string>{"fc2.weight"});
  EXPECT_EQ(resolve_frozen(freeze({"fc*"}), kParams),
            (std::vector<std::string>{"fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"}));
  EXPECT_EQ(resolve_frozen(freeze({"*.bias"}), kParams),
            (std::vector<std::string>{"fc1.bias", "fc2.bias", "head.bias"}));
}

TEST(Freezing, TrainableSelectsAndFrozenSubtractsFromIt) {
  // trainable alone: everything it does not match is frozen.
  EXPECT_EQ(resolve_frozen(freeze({}, {"head"}), kParams),
            (std::vector<std::string>{"fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"}));
  // Both: frozen takes out of what trainable selects.
  EXPECT_EQ(resolve_frozen(freeze({"fc1.bias"}, {"fc*"}), kParams),
            (std::vector<std::string>{"fc1.bias", "head.bias", "head.weight"}));
}

TEST(Freezing, APatternThatMatchesNothingNamesItsLineAndTheClosestParameters) {
  try {
    resolve_frozen(freeze({"fc1", "fc3.weight"}), kParams);
    FAIL() << "no error";
  } catch (const sdk::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("train.toml:2:11"), std::string::npos) << m;
    EXPECT_NE(m.find("'fc3.weight' matches no parameter"), std::string::npos) << m;
    // The closest names first: what "fc3.weight" most likely meant.
    EXPECT_EQ(e.hint().find("the closest: fc1.weight, fc2.weight"), e.hint().find("the closest"))
        << e.hint();
    EXPECT_NE(e.hint().find("the closest: fc1.weight, fc2.weight"), std::string::npos) << e.hint();
  }
  // A trainable pattern is checked the same way.
  EXPECT_THROW(resolve_frozen(freeze({}, {"hed"}), kParams), sdk::ConfigError);
}

TEST(Freezing, FreezingEverythingIsAnErrorAtTheFirstFrozenPattern) {
  for (const auto& spec : {freeze({"*"}), freeze({"fc1", "head"}, {"fc1", "head"})}) {
    try {
      resolve_frozen(spec, kParams);
      FAIL() << "no error";
    } catch (const sdk::ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("nothing would train"), std::string::npos) << m;
      EXPECT_NE(m.find("train.toml:" + std::to_string(spec.trainable.size() + 1)),
                std::string::npos)
          << m;
    }
  }
}

// --- what a frozen parameter costs a step -----------------------------------------------------

using test_support::CallCountingBackend;

ModelSpec mlp(std::vector<std::string> frozen) {
  ModelSpec spec;
  spec.layers = {op("linear", "fc1", {{"out", 16}}), op("relu", "relu1"),
                 op("linear", "fc2", {{"out", 16}}), op("relu", "relu2"),
                 op("linear", "fc3", {{"out", 5}})};
  for (auto& p : frozen) spec.freeze.frozen.push_back(at(p, 1, "train.frozen"));
  return spec;
}

void feed_features(Model& m, std::int64_t batch, unsigned seed) {
  write(m.input(batch),
        random_vector(static_cast<std::size_t>(batch * m.input_features()), seed, -2.f, 2.f));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(batch * m.labels_per_sample()));
  for (std::size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<std::int32_t>((i * 7 + seed) % static_cast<unsigned>(m.classes()));
  cpu()->copy_from_host(m.labels(batch), labels.data());
}

// One forward, loss and backward; the calls each facet op got in backward.
std::map<std::string, int> backward_calls(const ModelSpec& spec, const sdk::OpPrecision& p = {}) {
  auto backend = std::make_shared<CallCountingBackend>();
  Model m(backend, spec, 12, 5);
  for (auto& l : m.layers()) l->set_precision(p);
  m.allocate(8);
  m.init_parameters(3);
  feed_features(m, 8, 1);
  m.forward(8);
  m.compute_loss(8, 1.0f, true);
  backend->counting = true;
  m.backward(8);
  return backend->calls;
}

// GEMMs and bias reductions of a backward. On the CPU backend (gemm facet 1.5) a wgrad whose
// linear has a bias is one gemm_gradient that also sums the bias gradient (linear.h); this MLP
// has no gelu, so every gemm_gradient is such a wgrad.
int gemms(std::map<std::string, int> calls) {
  return calls["gemm"] + calls["gemm_gradient"];
}
int bias_sums(std::map<std::string, int> calls) {
  return calls["bias_grad"] + calls["gemm_gradient"];
}

TEST(Freezing, AFrozenLinearSkipsItsWeightGradientGemmAndBiasReduction) {
  // Unfrozen: fc3 and fc2 run dW and dx, fc1 dW only (its input is the batch); one bias
  // reduction each, each in its dW's call.
  auto all = backward_calls(mlp({}));
  EXPECT_EQ(gemms(all), 5);
  EXPECT_EQ(bias_sums(all), 3);
  EXPECT_EQ(all["gemm_gradient"], 3);
  // fc2 frozen: its dx still flows to fc1, its dW and bias reduction are not run.
  auto frozen = backward_calls(mlp({"fc2"}));
  EXPECT_EQ(gemms(frozen), 4);
  EXPECT_EQ(bias_sums(frozen), 2);
  // Only fc2's bias frozen: the dW GEMM runs (a plain one), one reduction fewer.
  auto bias_only = backward_calls(mlp({"fc2.bias"}));
  EXPECT_EQ(gemms(bias_only), 5);
  EXPECT_EQ(bias_sums(bias_only), 2);
  EXPECT_EQ(bias_only["gemm_gradient"], 2);
  // The same in bf16: the GEMMs are the plan's, the count the same.
  sdk::OpPrecision bf16;
  bf16.weight = bf16.gemm_input = bf16.activation = bf16.activation_grad = DType::bf16;
  EXPECT_EQ(gemms(backward_calls(mlp({"fc2"}), bf16)), 4);
}

TEST(Freezing, NodesWithNothingToLearnUpstreamRunNoBackward) {
  // fc1 and fc2 frozen: only fc3's dW is computed; no activation gradient goes below fc3.
  auto calls = backward_calls(mlp({"fc1", "fc2"}));
  EXPECT_EQ(gemms(calls), 1);
  EXPECT_EQ(bias_sums(calls), 1);
  EXPECT_EQ(calls["activation_backward"], 0);
  Model frozen(cpu(), mlp({"fc1", "fc2"}), 12, 5), all(cpu(), mlp({}), 12, 5);
  for (Model* m : {&frozen, &all}) {
    for (auto& l : m->layers()) l->set_precision({});
    m->allocate(8);
  }
  EXPECT_FALSE(frozen.plan().node(2).needs_grad);  // fc2
  EXPECT_TRUE(frozen.plan().node(4).needs_grad);   // fc3
  EXPECT_LT(frozen.gradient_plan().arena_bytes, all.gradient_plan().arena_bytes);
}

// Every trainable parameter's gradient after one step, by name.
std::map<std::string, std::vector<float>> gradients(Model& m) {
  std::map<std::string, std::vector<float>> out;
  for (auto* p : m.trainable_parameters()) out[p->name] = read(p->grad.view());
  return out;
}

std::map<std::string, std::vector<float>> step_gradients(Model& m, const sdk::OpPrecision& p,
                                                         std::int64_t batch,
                                                         void (*feed)(Model&, std::int64_t,
                                                                      unsigned)) {
  for (auto& l : m.layers()) l->set_precision(p);
  m.allocate(batch);
  m.init_parameters(7);
  feed(m, batch, 2);
  m.forward(batch);
  m.compute_loss(batch, 4.0f, true);
  m.backward(batch);
  return gradients(m);
}

// Frozen or not, the gradients of what trains are the same numbers: a frozen op's input gradient
// is computed as before, only its own parameters' sums are left out.
void expect_trainable_gradients_unchanged(const ModelSpec& frozen_spec, const ModelSpec& spec,
                                          std::int64_t features, std::int32_t classes,
                                          const InputSpec& input, const sdk::OpPrecision& p,
                                          void (*feed)(Model&, std::int64_t, unsigned),
                                          std::size_t expected_frozen) {
  Model frozen(cpu(), frozen_spec, features, classes, input);
  Model all(cpu(), spec, features, classes, input);
  const auto got = step_gradients(frozen, p, 4, feed);
  const auto want = step_gradients(all, p, 4, feed);
  std::size_t frozen_count = 0;
  for (auto* param : frozen.parameters()) {
    if (!param->frozen) continue;
    ++frozen_count;
    EXPECT_TRUE(param->grad.empty()) << param->name;
  }
  EXPECT_EQ(frozen_count, expected_frozen);
  ASSERT_FALSE(got.empty());
  for (const auto& [name, g] : got) {
    ASSERT_TRUE(want.count(name)) << name;
    EXPECT_EQ(g, want.at(name)) << name;
  }
}

ModelSpec with_frozen(ModelSpec spec, std::vector<std::string> frozen) {
  for (auto& p : frozen) spec.freeze.frozen.push_back(at(p, 1, "train.frozen"));
  return spec;
}

ModelSpec norm_mlp() {
  ModelSpec spec;
  spec.layers = {op("linear", "fc1", {{"out", 16}}),
                 op("layernorm", "ln"),
                 op("gelu", "act"),
                 op("linear", "fc2", {{"out", 16}}),
                 op("relu", "relu2"),
                 op("linear", "head", {{"out", 5}})};
  return spec;
}

TEST(Freezing, GradientsFlowThroughFrozenLinearsAndLayerNormsUnchanged) {
  const ModelSpec spec = norm_mlp();
  expect_trainable_gradients_unchanged(with_frozen(spec, {"ln", "fc2"}), spec, 12, 5, {}, {},
                                       feed_features, 4);
  expect_trainable_gradients_unchanged(with_frozen(spec, {"ln.weight"}), spec, 12, 5, {}, {},
                                       feed_features, 1);
  sdk::OpPrecision bf16;
  bf16.weight = bf16.gemm_input = bf16.activation = bf16.activation_grad = DType::bf16;
  expect_trainable_gradients_unchanged(with_frozen(spec, {"fc2"}), spec, 12, 5, {}, bf16,
                                       feed_features, 2);
}

TEST(Freezing, AFrozenWeightIsStoredOnceInTheDtypeItsOpComputesWith) {
  sdk::OpPrecision bf16;
  bf16.weight = bf16.gemm_input = bf16.activation = bf16.activation_grad = DType::bf16;
  Model frozen(cpu(), with_frozen(norm_mlp(), {"fc2", "ln"}), 12, 5);
  Model all(cpu(), norm_mlp(), 12, 5);
  for (Model* m : {&frozen, &all}) {
    for (auto& l : m->layers()) l->set_precision(bf16);
    m->allocate(4);
    m->init_parameters(7);
  }
  const auto f = frozen.parameters(), a = all.parameters();
  ASSERT_EQ(f.size(), a.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    const ModelParameter &p = *f[i], &q = *a[i];
    if (p.name == "fc2.weight") {
      // No FP32 master and no gradient: the bf16 copy alone, the bits the trained model's working
      // copy holds.
      EXPECT_TRUE(p.master.empty());
      EXPECT_TRUE(p.grad.empty());
      ASSERT_EQ(p.value().dtype, DType::bf16);
      EXPECT_EQ(read(p.value()), read(q.working.view()));
    } else if (p.frozen) {
      // A bias or a norm's scale is read in FP32 by its kernels: that is its one copy.
      EXPECT_TRUE(p.grad.empty()) << p.name;
      EXPECT_TRUE(p.working.empty()) << p.name;
      EXPECT_EQ(p.value().dtype, DType::fp32) << p.name;
      EXPECT_EQ(read(p.value()), read(q.master.view())) << p.name;
    } else {
      EXPECT_FALSE(p.master.empty()) << p.name;
      EXPECT_FALSE(p.grad.empty()) << p.name;
    }
  }
  EXPECT_EQ(frozen.parameter_count(), all.parameter_count());
  EXPECT_EQ(frozen.trainable_parameters().size(), a.size() - 4);
}

// --- train.frozen_format = "nf4" ----------------------------------------------------------------

ModelSpec as_nf4(ModelSpec spec, std::int64_t block = 64) {
  spec.freeze.format = FrozenFormat::nf4;
  spec.freeze.block = block;
  spec.freeze.format_where = {"train.toml", 3, 17};
  return spec;
}

ModelParameter& parameter(Model& m, const std::string& name) {
  for (auto* p : m.parameters())
    if (p->name == name) return *p;
  throw std::logic_error("no parameter " + name);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One step's gradients of the frozen norm MLP whose fc2 holds `fc2` as plain weights: the
// reference a quantized fc2 is held to.
std::map<std::string, std::vector<float>> gradients_with_plain_fc2(
    const sdk::OpPrecision& precision, const std::vector<float>& fc2) {
  Model r(cpu(), with_frozen(norm_mlp(), {"fc2", "ln"}), 12, 5);
  for (auto& l : r.layers()) l->set_precision(precision);
  r.allocate(4);
  r.init_parameters(7);
  set_parameter_from_fp32(cpu(), parameter(r, "fc2.weight"), fc2.data());
  feed_features(r, 4, 2);
  r.forward(4);
  r.compute_loss(4, 4.0f, true);
  r.backward(4);
  return gradients(r);
}

// An NF4 weight holds the SDK's quantization of the weight it would have had (codes and absmax
// alone), and the step reads it decoded: the model's gradients are those of the same model whose
// fc2 holds the decoded values as plain weights, bit for bit, under fp32 and under bf16.
TEST(Freezing, AnNf4WeightIsItsQuantizationDecodedBeforeEachGemm) {
  sdk::OpPrecision bf16;
  bf16.weight = bf16.gemm_input = bf16.activation = bf16.activation_grad = DType::bf16;
  for (const sdk::OpPrecision& precision : {sdk::OpPrecision{}, bf16})
    for (const std::int64_t block : {64, 100}) {  // 16·16 = 256 elements: 100 leaves 56
      Model q(cpu(), as_nf4(with_frozen(norm_mlp(), {"fc2", "ln"}), block), 12, 5);
      Model plain(cpu(), with_frozen(norm_mlp(), {"fc2", "ln"}), 12, 5);
      for (Model* m : {&q, &plain}) {
        for (auto& l : m->layers()) l->set_precision({});  // fp32 masters to read the init from
        m->allocate(4);
        m->init_parameters(7);
      }
      ModelParameter& w = parameter(q, "fc2.weight");
      ASSERT_TRUE(w.quantized());
      EXPECT_TRUE(w.master.empty() && w.working.empty() && w.grad.empty());
      EXPECT_EQ(w.stored_bytes(), 128u + 4u * static_cast<std::size_t>((256 + block - 1) / block));
      EXPECT_FALSE(parameter(q, "fc2.bias").quantized()) << "a bias keeps its dtype";
      EXPECT_FALSE(parameter(q, "fc1.weight").quantized()) << "fc1 trains";
      const auto init = read(parameter(plain, "fc2.weight").value());
      const auto decoded = sdk::nf4_dequantize(sdk::nf4_quantize(init, block));
      EXPECT_TRUE(same_bits(parameter_to_host_fp32(cpu(), w), decoded));
      EXPECT_FALSE(same_bits(decoded, init)) << "4 bits cannot hold the fp32 init";

      // The same models again under `precision`, the reference's fc2 set to the decoded values.
      Model q2(cpu(), as_nf4(with_frozen(norm_mlp(), {"fc2", "ln"}), block), 12, 5);
      const auto got = step_gradients(q2, precision, 4, feed_features);
      const auto want = gradients_with_plain_fc2(precision, decoded);
      ASSERT_EQ(got.size(), want.size());
      for (const auto& [name, g] : got) EXPECT_EQ(g, want.at(name)) << name << " block " << block;
    }
}

// Model::init_parameters' filled_by_load (a checkpoint's load overwrites those parameters next):
// they are zeroed, not drawn, an NF4 one included, and every other parameter holds the bits of
// the full initialisation, since each draw is seeded by its parameter's own name.
TEST(Freezing, ParametersALoadFillsAreZeroedAndTheOthersDrawAsBefore) {
  const ModelSpec spec = as_nf4(with_frozen(norm_mlp(), {"fc2", "ln"}));
  Model all(cpu(), spec, 12, 5), some(cpu(), spec, 12, 5);
  for (Model* m : {&all, &some}) {
    for (auto& l : m->layers()) l->set_precision({});
    m->allocate(4);
  }
  // Garbage where the skipped weights live: zeroing must overwrite it, not find zeros.
  const std::vector<float> junk(static_cast<std::size_t>(parameter(some, "fc1.weight").numel()),
                                std::numeric_limits<float>::quiet_NaN());
  write(parameter(some, "fc1.weight").master.view(), junk);
  all.init_parameters(7);
  const std::set<std::string> loaded = {"fc1.weight", "fc2.weight"};
  some.init_parameters(7, [&](const ModelParameter& p) { return loaded.count(p.name) > 0; });
  ASSERT_TRUE(parameter(some, "fc2.weight").quantized());
  std::size_t drawn = 0;
  for (auto* p : some.parameters()) {
    const auto got = parameter_to_host_fp32(cpu(), *p);
    EXPECT_FALSE(p->filled_by_load) << p->name << ": the mark lasts only the call";
    if (loaded.count(p->name)) {
      EXPECT_TRUE(same_bits(got, std::vector<float>(got.size(), 0.0f))) << p->name;
    } else {
      EXPECT_TRUE(same_bits(got, parameter_to_host_fp32(cpu(), parameter(all, p->name))))
          << p->name;
      ++drawn;
    }
  }
  EXPECT_EQ(drawn, some.parameters().size() - loaded.size());
  EXPECT_FALSE(same_bits(parameter_to_host_fp32(cpu(), parameter(all, "fc1.weight")),
                         parameter_to_host_fp32(cpu(), parameter(some, "fc1.weight"))))
      << "the full initialisation draws fc1.weight";
}

TEST(Freezing, Nf4WithoutAFrozenLinearWeightIsAnErrorAtTheKey) {
  for (const auto& frozen : std::vector<std::vector<std::string>>{{}, {"ln", "fc2.bias"}}) {
    try {
      Model m(cpu(), as_nf4(with_frozen(norm_mlp(), frozen)), 12, 5);
      FAIL() << "nf4 with nothing to store was accepted";
    } catch (const sdk::ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("train.toml:3:17"), std::string::npos) << what;
      EXPECT_NE(what.find("no frozen parameter is a linear node's weight"), std::string::npos)
          << what;
    }
  }
}

// A backend with every facet of the CPU's but quantized_weight (the CUDA backend, today): an NF4
// model stops at plan time naming the node, the op and the way out.
class NoQuantizedWeightBackend final : public test_support::ForwardingBackend {
 public:
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::QuantizedWeightFacet::kName ? nullptr : in_->find_facet(name);
  }
};

TEST(Freezing, ABackendWithoutNf4DecodingStopsAtPlanTime) {
  auto backend = std::make_shared<NoQuantizedWeightBackend>();
  Model m(backend, as_nf4(with_frozen(norm_mlp(), {"fc2"})), 12, 5);
  for (auto& l : m.layers()) l->set_precision({});
  try {
    m.allocate(4);
    FAIL() << "the plan accepted a backend that cannot decode NF4";
  } catch (const sdk::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("node 'fc2' (linear) stores its frozen weight as NF4"), std::string::npos)
        << what;
    EXPECT_NE(what.find("quantized_weight.dequantize_nf4"), std::string::npos) << what;
    EXPECT_NE(e.hint().find("train.frozen_format = \"compute\""), std::string::npos) << e.hint();
  }
}

// --- train.frozen_format = "fp8-block" / "mxfp8" ----------------------------------------------

ModelSpec as_format(ModelSpec spec, FrozenFormat format) {
  spec.freeze.format = format;
  spec.freeze.format_where = {"train.toml", 3, 17};
  return spec;
}

// The SDK's quantize-then-decode of [rows, cols] values in a base format's layout.
std::vector<float> block_decoded(const std::vector<float>& x, std::int64_t rows, std::int64_t cols,
                                 FrozenFormat format) {
  return sdk::dequantize_block_scaled(
      sdk::quantize_block_scaled(x, rows, cols, base_layout(format)));
}

// A weight in an FP8 block format holds the SDK's block quantization of the weight it would have
// had (a code byte per element, a scale per block: fc2 is 16x16, one partial 128x128 block, or 16
// rows of one partial 1x32 block), and the step reads it decoded: the gradients equal those of a
// model whose fc2 holds the decoded values as plain weights, bit for bit, under fp32 and bf16.
TEST(Freezing, ABlockFormatWeightIsItsQuantizationDecodedBeforeEachGemm) {
  sdk::OpPrecision bf16;
  bf16.weight = bf16.gemm_input = bf16.activation = bf16.activation_grad = DType::bf16;
  for (const FrozenFormat format : {FrozenFormat::fp8_block, FrozenFormat::mxfp8})
    for (const sdk::OpPrecision& precision : {sdk::OpPrecision{}, bf16}) {
      const std::string what = frozen_format_name(format);
      Model q(cpu(), as_format(with_frozen(norm_mlp(), {"fc2", "ln"}), format), 12, 5);
      Model plain(cpu(), with_frozen(norm_mlp(), {"fc2", "ln"}), 12, 5);
      for (Model* m : {&q, &plain}) {
        for (auto& l : m->layers()) l->set_precision({});
        m->allocate(4);
        m->init_parameters(7);
      }
      ModelParameter& w = parameter(q, "fc2.weight");
      ASSERT_TRUE(w.quantized()) << what;
      EXPECT_TRUE(w.master.empty() && w.working.empty() && w.grad.empty()) << what;
      // 256 code bytes; fp8-block: one fp32 scale; mxfp8: an E8M0 byte for each of 16 rows.
      EXPECT_EQ(w.stored_bytes(), 256u + (format == FrozenFormat::fp8_block ? 4u : 16u)) << what;
      EXPECT_FALSE(parameter(q, "fc2.bias").quantized()) << what;
      const auto init = read(parameter(plain, "fc2.weight").value());
      const auto decoded = block_decoded(init, 16, 16, format);
      EXPECT_TRUE(same_bits(parameter_to_host_fp32(cpu(), w), decoded)) << what;
      EXPECT_FALSE(same_bits(decoded, init)) << what << ": E4M3 cannot hold the fp32 init";

      Model q2(cpu(), as_format(with_frozen(norm_mlp(), {"fc2", "ln"}), format), 12, 5);
      const auto got = step_gradients(q2, precision, 4, feed_features);
      const auto want = gradients_with_plain_fc2(precision, decoded);
      ASSERT_EQ(got.size(), want.size());
      for (const auto& [name, g] : got) EXPECT_EQ(g, want.at(name)) << name << " " << what;
    }
}

// A checkpoint holds the decoded weights and a resume quantizes them again
// (graph/quantized_weight.h, "Round trip"): the decoded values come back bit for bit, for
// weights over twelve decades, with zero rows, exact powers of two, and the edge where a block's
// largest code is 224 (fp8-block's 128x128 block (1, 0) and mxfp8's 1x32 block at row 130: the
// scale moves by 2, no value does). A non-finite weight is refused naming its index.
TEST(Freezing, ABlockFormatBaseSurvivesTheCheckpointRoundTrip) {
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-20, 20), sign(0, 1);
  const std::int64_t rows = 150, cols = 200;  // partial blocks along both dims
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  for (auto& v : x) v = (sign(gen) ? -1.0f : 1.0f) * std::ldexp(mantissa(gen), exponent(gen));
  for (std::int64_t c = 0; c < cols; ++c) x[static_cast<std::size_t>(3 * cols + c)] = 0.0f;
  x[7] = 0.25f;
  // Block (1, 0) of the 128x128 grid: its amax·s lands just above 224, so its largest code is 224.
  for (std::int64_t r = 128; r < rows; ++r)
    for (std::int64_t c = 0; c < 128; ++c)
      x[static_cast<std::size_t>(r * cols + c)] = 0.001f * static_cast<float>((r * 7 + c) % 13);
  x[static_cast<std::size_t>(130 * cols + 5)] = 224.2f / 256.0f;  // s = 256: amax·s = 224.2
  for (const FrozenFormat format : {FrozenFormat::fp8_block, FrozenFormat::mxfp8}) {
    const std::string what = frozen_format_name(format);
    auto w = make_quantized_weight(cpu(), format, sdk::Shape{rows, cols}, 0);
    quantize_from_host(*cpu(), w, x.data());
    const auto once = dequantize_to_host(*cpu(), w);
    EXPECT_TRUE(same_bits(once, block_decoded(x, rows, cols, format))) << what;
    quantize_from_host(*cpu(), w, once.data());
    EXPECT_TRUE(same_bits(dequantize_to_host(*cpu(), w), once)) << what;
    auto bad = x;
    bad[1234] = std::numeric_limits<float>::infinity();
    try {
      quantize_from_host(*cpu(), w, bad.data());
      ADD_FAILURE() << what << " stored an infinity";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("element 1234"), std::string::npos) << e.what();
    }
  }
  // The fp32 scales left out of the base formats do drift (the reason they are left out): among
  // one-element blocks 1 + k/1024, some decode to another value after a round trip (1/s and
  // 448·(1/s) each round in fp32; about 3% of amax values move).
  const auto fp32_layout = sdk::fp8_block_weight_layout();
  auto round_trip = [&](float v) {
    return sdk::dequantize_block_scaled(
        sdk::quantize_block_scaled(std::vector<float>{v}, 1, 1, fp32_layout))[0];
  };
  bool drifted = false;
  for (int k = 0; k < 1000 && !drifted; ++k) {
    const float once = round_trip(1.0f + static_cast<float>(k) / 1024.0f);
    drifted = round_trip(once) != once;
  }
  EXPECT_TRUE(drifted) << "fp32 block scales round-trip exactly after all";
}

TEST(Freezing, ABackendWithoutBlockDecodingStopsAtPlanTime) {
  auto backend = std::make_shared<NoQuantizedWeightBackend>();
  Model m(backend, as_format(with_frozen(norm_mlp(), {"fc2"}), FrozenFormat::mxfp8), 12, 5);
  for (auto& l : m.layers()) l->set_precision({});
  try {
    m.allocate(4);
    FAIL() << "the plan accepted a backend that cannot decode mxfp8";
  } catch (const sdk::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("node 'fc2' (linear) stores its frozen weight as an FP8 block format"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("quantized_weight.dequantize_block_scaled"), std::string::npos) << what;
  }
}

// Images: conv, batch norm (+ relu) and pooling.
InputSpec image() {
  InputSpec in;
  in.sample_shape = {3, 6, 6};
  return in;
}

ModelSpec cnn() {
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {op("conv2d", "conv1", {{"out", 8}, {"kernel", 3}, {"padding", 1}}, {"input"}),
                 op("batchnorm2d", "bn1", {}, {"conv1"}),
                 op("relu", "relu1", {}, {"bn1"}),
                 op("conv2d", "conv2", {{"out", 8}, {"kernel", 3}, {"padding", 1}}, {"relu1"}),
                 op("global_avgpool", "pool", {}, {"conv2"}),
                 op("linear", "head", {{"out", 5}}, {"pool"})};
  return spec;
}

TEST(Freezing, GradientsFlowThroughFrozenConvolutionsAndBatchNormsUnchanged) {
  expect_trainable_gradients_unchanged(with_frozen(cnn(), {"bn1", "conv2"}), cnn(), 108, 5, image(),
                                       {}, feed_features, 4);
  // A frozen conv weight beside a trainable bias: the bias alone is summed, by bias_grad
  // instead of the weight-gradient kernel, so it is compared within rounding.
  Model frozen(cpu(), with_frozen(cnn(), {"conv2.weight"}), 108, 5, image());
  Model all(cpu(), cnn(), 108, 5, image());
  const auto got = step_gradients(frozen, {}, 4, feed_features);
  const auto want = step_gradients(all, {}, 4, feed_features);
  ASSERT_EQ(got.count("conv2.weight"), 0u);
  const auto& bias = got.at("conv2.bias");
  const auto& ref = want.at("conv2.bias");
  ASSERT_EQ(bias.size(), ref.size());
  double largest = 0;
  for (std::size_t i = 0; i < bias.size(); ++i) {
    EXPECT_NEAR(bias[i], ref[i], 1e-5 * std::max(1.0f, std::abs(ref[i]))) << i;
    largest = std::max(largest, static_cast<double>(std::abs(ref[i])));
  }
  EXPECT_GT(largest, 1e-4);  // a gradient that is not all zeros
  EXPECT_EQ(got.at("conv1.weight"), want.at("conv1.weight"));
}

// Tokens: a 2-layer GPT from the preset, vocab 11, T 5, its LM head tied to wte.
ModelSpec tiny_gpt() {
  return test_support::tiny_gpt_spec();
}

void feed_tokens(Model& m, std::int64_t batch, unsigned seed) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(batch * 5)), next(ids.size());
  std::uint32_t s = seed;
  for (auto& v : ids) v = static_cast<std::int32_t>((s = s * 1664525u + 1013904223u) >> 28) % 11;
  for (std::size_t i = 0; i < ids.size(); ++i) next[i] = ids[(i + 1) % ids.size()];
  cpu()->copy_from_host(m.input(batch), ids.data());
  cpu()->copy_from_host(m.labels(batch), next.data());
}

TEST(Freezing, GradientsFlowThroughFrozenEmbeddingsAndTheTiedHeadUnchanged) {
  const InputSpec tokens{DType::int32, 5, {}, {}};
  // wte frozen: neither the LM head (tied to it) nor the embedding adds to its gradient.
  expect_trainable_gradients_unchanged(with_frozen(tiny_gpt(), {"wte"}), tiny_gpt(), 5, 11, tokens,
                                       {}, feed_tokens, 1);
  // Everything but the attention frozen.
  ModelSpec attention_only = tiny_gpt();
  attention_only.freeze.trainable.push_back(at("h.*.attn.*", 1, "train.trainable"));
  expect_trainable_gradients_unchanged(attention_only, tiny_gpt(), 5, 11, tokens, {}, feed_tokens,
                                       2 + 2 * 8 + 2);
  auto backend = std::make_shared<CallCountingBackend>();
  Model m(backend, with_frozen(tiny_gpt(), {"wte", "wpe"}), 5, 11, tokens);
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(4);
  m.init_parameters(1);
  feed_tokens(m, 4, 3);
  m.forward(4);
  m.compute_loss(4, 1.0f, true);
  backend->counting = true;
  m.backward(4);
  EXPECT_EQ(backend->calls["scatter_add"], 0);
}

}  // namespace
}  // namespace mixtrain::core
