// Model state and modes: a tied parameter (finite differences, one entry in parameters(), the
// hook after its last user, errors at the node, the working copy a bf16 head reads), gradient
// accumulation over micro-batches against the full batch, the train/eval mode reaching every op,
// and an op's non-trainable buffers.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cpu_test_backend.h"
#include "graph/ops/op_registry.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/support/float_formats.h"
#include "tiny_gpt.h"

namespace mixtrain::core {
namespace {

using sdk::DType;
using test_support::cpu;
using test_support::read;
using test_support::write;

LayerSpec node(const char* type, const char* name, std::vector<std::string> inputs,
               std::int64_t out = 0, std::uint32_t line = 1) {
  LayerSpec l;
  l.type = type;
  l.name = name;
  l.inputs = std::move(inputs);
  l.where = {"tied.toml", line, 3};
  if (out > 0) l.options.push_back({"out", out, l.where});
  return l;
}

LayerSpec tied(LayerSpec l, const std::string& source, std::uint32_t line) {
  l.options.push_back({"tie_weight", source, {"tied.toml", line, 20}});
  return l;
}

// input [6] -> fc1 [6] -> relu -> fc2 [6] (fc1's weight) -> gelu -> head [3]
ModelSpec tied_graph() {
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {node("linear", "fc1", {"input"}, 6), node("relu", "relu1", {"fc1"}),
                 tied(node("linear", "fc2", {"relu1"}, 6, 3), "fc1.weight", 3),
                 node("gelu", "act2", {"fc2"}), node("linear", "head", {"act2"}, 3)};
  return spec;
}

void feed(Model& m, std::int64_t rows, unsigned seed, std::int64_t offset = 0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> all(static_cast<std::size_t>((offset + rows) * m.input_features()));
  for (auto& v : all) v = d(rng);
  std::vector<float> x(all.begin() + offset * m.input_features(), all.end());
  write(m.input(rows), x);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<std::int32_t>((i + static_cast<std::size_t>(offset)) % 3);
  cpu()->copy_from_host(m.labels(rows), labels.data());
}

TEST(ModelState, TiedParameterIsListedOnceAndItsGradientSumsBothUses) {
  Model m(cpu(), tied_graph(), 6, 3);
  for (auto& l : m.layers()) l->set_precision({});
  const std::int64_t rows = 4;
  m.allocate(rows);
  m.init_parameters(3);
  std::vector<std::string> names;
  for (auto* p : m.parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.bias", "head.weight",
                                             "head.bias"}));
  EXPECT_EQ(m.parameter_count(), 36 + 6 + 6 + 18 + 3);

  std::map<std::string, int> seen;
  m.set_gradient_ready_hook([&](ModelParameter& p) { ++seen[p.name]; });
  feed(m, rows, 7);
  m.forward(rows);
  m.loss(rows, 1.0f, true);
  m.backward(rows);
  EXPECT_EQ(seen.size(), 5u);
  for (const auto& [name, n] : seen) EXPECT_EQ(n, 1) << name;

  // Finite differences on every parameter, the tied one included: its gradient is the sum of
  // both uses, which only the two contributions together match.
  int checked = 0;
  for (auto* p : m.parameters()) {
    const auto analytic = read(p->grad.view());
    const auto fd = test_support::finite_difference(m, *p, rows, analytic, 2e-3f);
    EXPECT_LT(fd.max_err, 2e-3) << p->name;
    EXPECT_GT(fd.max_ref, 1e-4) << p->name << ": a gradient that never moves checks nothing";
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

// The shared CPU backend with its bf16 GEMMs declared native or decoded, whatever this CPU's are,
// counting the casts that read one watched tensor.
class Bf16GemmRouteBackend final : public test_support::ForwardingBackend {
 public:
  explicit Bf16GemmRouteBackend(bool native) : native_(native) {}
  sdk::BackendCapabilities capabilities() const override {
    auto caps = ForwardingBackend::capabilities();
    for (auto& d : caps.gemm_inputs)
      if (d.dtype == DType::bf16) d.native = native_;
    return caps;
  }
  void cast(sdk::TensorView s, sdk::TensorView d, const sdk::CastArgs& a) override {
    if (s.data == watched) ++watched_casts;
    ForwardingBackend::cast(s, d, a);
  }
  const void* watched = nullptr;
  int watched_casts = 0;

 private:
  bool native_;
};

// GPT's LM head reads the embedding's FP32 table in bf16. Where the backend's bf16 GEMMs take it
// as stored, the table gets a bf16 working copy (the optimizer refreshes it with the update) and
// the loss pass rounds no master: the same loss and gradients as the pass that rounds the whole
// table itself, bit for bit. Where the GEMMs decode bf16, or the table is frozen, no copy.
TEST(ModelState, ATiedHeadReadingBf16GetsAWorkingCopyWhereTheGemmsTakeBf16) {
  const sdk::OpPrecision bf16{DType::bf16, DType::bf16, DType::bf16, DType::bf16};
  const std::int64_t tokens = 6, vocab = 11, batch = 2;
  for (const bool native : {true, false}) {
    SCOPED_TRACE(native ? "bf16 GEMMs native" : "bf16 GEMMs decoded");
    auto backend = std::make_shared<Bf16GemmRouteBackend>(native);
    auto m = test_support::tiny_gpt_model(test_support::tiny_gpt_spec(2, 2, 8, vocab), tokens,
                                          vocab, batch, 0.3f, bf16, false, {}, backend);
    ModelParameter* wte = nullptr;
    for (auto* p : m->parameters())
      if (p->name == "wte.weight") wte = p;
    ASSERT_NE(wte, nullptr);
    if (!native) {
      EXPECT_TRUE(wte->working.empty());
      continue;
    }
    ASSERT_FALSE(wte->working.empty());
    EXPECT_EQ(wte->working.dtype(), DType::bf16);
    const auto master = read(wte->master.view());
    std::vector<std::uint16_t> copy(master.size());
    backend->copy_to_host(copy.data(), wte->working.view());
    for (std::size_t i = 0; i < master.size(); ++i)
      ASSERT_EQ(copy[i], sdk::encode_bf16(master[i])) << i;

    std::vector<std::int32_t> ids(static_cast<std::size_t>(batch * tokens));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i * 7 % vocab);
    auto pass = [&] {
      backend->copy_from_host(m->input(batch), ids.data());
      backend->copy_from_host(m->labels(batch), ids.data());
      m->begin_micro_batch(0, 1);
      m->forward(batch);
      const float loss = m->loss(batch, 1.0f, true).loss;
      m->backward(batch);
      std::vector<std::vector<float>> grads;
      for (auto* p : m->parameters()) grads.push_back(read(p->grad.view()));
      return std::pair(loss, grads);
    };
    backend->watched = wte->master.view().data;
    const auto with_copy = pass();
    EXPECT_EQ(backend->watched_casts, 0) << "the head rounded the master it has a copy of";
    // Without the copy the head rounds the whole table itself, once a pass.
    wte->working = Tensor();
    const auto rounded_each_pass = pass();
    EXPECT_GE(backend->watched_casts, 1);
    EXPECT_EQ(with_copy.first, rounded_each_pass.first);
    EXPECT_EQ(with_copy.second, rounded_each_pass.second);

    // A frozen table stays stored once (ModelParameter): no copy, the head rounds it.
    ModelSpec frozen = test_support::tiny_gpt_spec(2, 2, 8, vocab);
    frozen.freeze.frozen.push_back({"wte", {"train.toml", 1, 11}, "train.frozen"});
    auto still =
        test_support::tiny_gpt_model(frozen, tokens, vocab, batch, 0.3f, bf16, false, {}, backend);
    for (auto* p : still->parameters())
      if (p->name == "wte.weight") {
        EXPECT_TRUE(p->frozen);
        EXPECT_TRUE(p->working.empty());
      }
  }
}

TEST(ModelState, TieErrorsNameBothNodesAndTheLine) {
  auto error_of = [](ModelSpec spec) {
    try {
      Model m(cpu(), spec, 6, 3);
    } catch (const sdk::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ModelSpec missing = tied_graph();
  missing.layers[2] = tied(node("linear", "fc2", {"relu1"}, 6, 3), "fc9.weight", 3);
  const auto a = error_of(missing);
  EXPECT_NE(a.find("tied.toml:3:20"), std::string::npos) << a;
  EXPECT_NE(a.find("fc9.weight"), std::string::npos) << a;
  EXPECT_NE(a.find("tie_weight"), std::string::npos) << a;

  ModelSpec shape = tied_graph();
  shape.layers[2] = tied(node("linear", "fc2", {"relu1"}, 4, 3), "fc1.weight", 3);
  shape.layers[3] = node("gelu", "act2", {"fc2"});
  const auto b = error_of(shape);
  EXPECT_NE(b.find("tied.toml:3:20"), std::string::npos) << b;
  EXPECT_NE(b.find("'fc2'"), std::string::npos) << b;
  EXPECT_NE(b.find("'fc1'"), std::string::npos) << b;
  EXPECT_NE(b.find("[4, 6]"), std::string::npos) << b;
  EXPECT_NE(b.find("[6, 6]"), std::string::npos) << b;

  ModelSpec chain = tied_graph();  // a tie to a tied weight: fc2 owns no weight
  chain.layers[4] = tied(node("linear", "head", {"act2"}, 3, 5), "fc2.weight", 5);
  const auto c = error_of(chain);
  EXPECT_NE(c.find("tied.toml:5:20"), std::string::npos) << c;
}

// K micro-batches of B rows, each seeded with 1/K, equal one batch of K*B rows within FP32
// reassociation: the parameter gradients of both, under an FP32 and a bf16 plan.
TEST(ModelState, MicroBatchesAccumulateToTheFullBatchGradient) {
  for (const bool bf16 : {false, true}) {
    auto make = [&](std::int64_t rows) {
      auto m = std::make_unique<Model>(cpu(), tied_graph(), 6, 3);
      for (auto& l : m->layers()) {
        sdk::OpPrecision p;
        if (bf16) p.activation = p.activation_grad = p.gemm_input = p.weight = DType::bf16;
        l->set_precision(p);
      }
      m->allocate(rows);
      m->init_parameters(5);
      return m;
    };
    const std::int64_t B = 4, K = 4;
    auto full = make(B * K);
    feed(*full, B * K, 9);
    full->forward(B * K);
    full->loss(B * K, 1024.0f, true);
    full->backward(B * K);

    auto micro = make(B);
    for (std::int64_t k = 0; k < K; ++k) {
      micro->begin_micro_batch(k, K);
      feed(*micro, B, 9, k * B);
      micro->forward(B);
      micro->loss(B, 1024.0f / K, true);
      micro->backward(B);
    }
    const auto a = full->parameters(), b = micro->parameters();
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto ga = read(a[i]->grad.view()), gb = read(b[i]->grad.view());
      double max_ref = 0, max_err = 0;
      for (std::size_t j = 0; j < ga.size(); ++j) {
        max_ref = std::max(max_ref, static_cast<double>(std::abs(ga[j])));
        max_err = std::max(max_err, static_cast<double>(std::abs(ga[j] - gb[j])));
      }
      EXPECT_GT(max_ref, 0.0) << a[i]->name;
      EXPECT_LE(max_err, 1e-5 * max_ref) << a[i]->name << (bf16 ? " (bf16)" : " (fp32)");
    }
  }
}

TEST(ModelState, ABackwardWithoutMicroBatchesOverwritesAndTheHookWaitsForTheLast) {
  Model m(cpu(), tied_graph(), 6, 3);
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(4);
  m.init_parameters(3);
  int hooks = 0;
  m.set_gradient_ready_hook([&](ModelParameter&) { ++hooks; });
  feed(m, 4, 7);
  m.forward(4);
  m.loss(4, 1.0f, true);
  m.backward(4);
  const auto once = read(m.parameters()[0]->grad.view());
  m.forward(4);  // a step of its own: the same gradient, not twice it
  m.loss(4, 1.0f, true);
  m.backward(4);
  EXPECT_EQ(read(m.parameters()[0]->grad.view()), once);
  hooks = 0;
  for (std::int64_t k = 0; k < 3; ++k) {
    m.begin_micro_batch(k, 3);
    m.forward(4);
    m.loss(4, 1.0f, true);
    m.backward(4);
    EXPECT_EQ(hooks, k < 2 ? 0 : 5) << "micro-batch " << k;
  }
  const auto thrice = read(m.parameters()[0]->grad.view());
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(thrice[i], 3 * once[i], 1e-5);
}

// A test-only op with a buffer and a mode: in training it keeps a running mean of its input's
// columns (momentum 0.5) and passes the input through; in evaluation it subtracts that mean.
class RunningMeanLayer final : public Layer {
 public:
  RunningMeanLayer(std::string name, std::int64_t features)
      : Layer(std::move(name), "running_mean", features, features) {}
  static inline std::map<std::string, int> train_calls, eval_calls;
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t rows) override {
    Layer::allocate(backend, rows);
    buffers_.clear();
    buffers_.push_back(make_buffer("mean", sdk::Shape{in_}, 0.0f));
  }
  void forward(sdk::TensorView x, std::int64_t rows) override {
    ++(training() ? train_calls : eval_calls)[name_];
    std::vector<float> h(static_cast<std::size_t>(rows * in_));
    backend_->copy_to_host(h.data(), x);
    std::vector<float> mean(static_cast<std::size_t>(in_));
    backend_->copy_to_host(mean.data(), buffers_[0].value.view());
    if (training()) {
      for (std::int64_t c = 0; c < in_; ++c) {
        double s = 0;
        for (std::int64_t r = 0; r < rows; ++r) s += h[static_cast<std::size_t>(r * in_ + c)];
        auto& m = mean[static_cast<std::size_t>(c)];
        m = 0.5f * m + 0.5f * static_cast<float>(s / static_cast<double>(rows));
      }
      backend_->copy_from_host(buffers_[0].value.view(), mean.data());
    } else {
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < in_; ++c)
          h[static_cast<std::size_t>(r * in_ + c)] -= mean[static_cast<std::size_t>(c)];
    }
    backend_->copy_from_host(output(rows), h.data());
  }
  void backward(sdk::TensorView, sdk::TensorView dy, sdk::TensorView dx, std::int64_t) override {
    if (!dx.empty()) backend_->cast(dy, dx);
  }
};

OpDefinition running_mean_op() {
  OpDefinition op;
  op.type = "running_mean";
  op.summary = "test only: a running mean of the columns, kept as a buffer";
  op.build = [](const OpNode& n) {
    return BuiltOp{std::make_unique<RunningMeanLayer>(n.name, n.inputs[0].back()), n.inputs[0]};
  };
  return op;
}

TEST(ModelState, ModeReachesEveryOpAndBuffersAreListed) {
  register_op(running_mean_op());
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {node("running_mean", "rm", {"input"}), node("linear", "fc1", {"rm"}, 6),
                 node("relu", "relu1", {"fc1"}), node("linear", "head", {"relu1"}, 3)};
  Model m(cpu(), spec, 6, 3);
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(4);
  m.init_parameters(1);
  ASSERT_EQ(m.buffers().size(), 1u);
  EXPECT_EQ(m.buffers()[0]->name, "rm.mean");
  EXPECT_EQ(m.buffers()[0]->value.dtype(), DType::fp32);
  for (const auto* p : m.parameters()) EXPECT_NE(p->name, "rm.mean");  // not trainable

  EXPECT_EQ(m.mode(), Model::Mode::train);
  for (auto& l : m.layers()) EXPECT_TRUE(l->training()) << l->name();
  feed(m, 4, 2);
  m.forward(4);
  const auto mean = read(m.buffers()[0]->value.view());
  EXPECT_NE(mean, std::vector<float>(6, 0.0f));

  m.set_mode(Model::Mode::eval);
  for (auto& l : m.layers()) EXPECT_FALSE(l->training()) << l->name();
  m.forward(4);
  EXPECT_EQ(read(m.buffers()[0]->value.view()), mean) << "evaluation leaves the buffer alone";
  EXPECT_EQ(RunningMeanLayer::eval_calls["rm"], 1);
  m.set_mode(Model::Mode::train);
  for (auto& l : m.layers()) EXPECT_TRUE(l->training()) << l->name();
}

}  // namespace
}  // namespace mixtrain::core
