// The model graph: finite-difference gradients through fan-out (a residual, add(h, h)), reshape and
// flatten; FP32 accumulation of several readers' gradients under a 16-bit plan; the gradient arena
// and the gradient-ready hook; construction errors at the node.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "cpu_test_backend.h"
#include "mixtrain/core/graph/model.h"

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
  l.where = {"graph.toml", line, 3};
  if (out > 0) l.options.push_back({"out", out, l.where});
  return l;
}

// input [6] -> fc1 [6] -> relu -> fc2 [6] -> res = add(fc2, input, fc1)
//   -> twice = add(res, res) -> ln -> tokens = reshape [2, 3] -> mix (linear on the last dim)
//   -> flat [6] -> head [3]
// fc1's output is read by relu and by res; res twice by the same add; input by fc1 and res.
ModelSpec residual_graph() {
  ModelSpec spec;
  spec.graph = true;
  spec.layers = {node("linear", "fc1", {"input"}, 6),  node("relu", "relu1", {"fc1"}),
                 node("linear", "fc2", {"relu1"}, 6),  node("add", "res", {"fc2", "input", "fc1"}),
                 node("add", "twice", {"res", "res"}), node("layernorm", "ln", {"twice"}),
                 node("reshape", "tokens", {"ln"}),    node("linear", "mix", {"tokens"}, 3),
                 node("flatten", "flat", {"mix"}),     node("linear", "head", {"flat"}, 3)};
  spec.layers[6].shape = {2, -1};
  return spec;
}

void feed(Model& m, std::int64_t rows, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> x(static_cast<std::size_t>(rows * m.input_features()));
  for (auto& v : x) v = d(rng);
  write(m.input(rows), x);
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 3);
  cpu()->copy_from_host(m.labels(rows), labels.data());
}

TEST(ModelGraph, FiniteDifferencesThroughFanOutReshapeAndFlatten) {
  Model m(cpu(), residual_graph(), 6, 3);
  for (auto& l : m.layers()) l->set_precision({});
  const std::int64_t rows = 4;
  m.allocate(rows);
  m.init_parameters(11);
  feed(m, rows, 5);
  EXPECT_EQ(m.plan().node(6).shape, (std::vector<std::int64_t>{2, 3}));  // tokens, in forward order

  m.forward(rows);
  m.loss(rows, 1.0f, true);
  m.backward(rows);
  int checked = 0;
  for (auto* p : m.parameters()) {
    const auto analytic = read(p->grad.view());
    // eps small enough that no relu input crosses zero (a kink makes the difference
    // meaningless), large enough that fp32 loss rounding (~1e-7) stays far below the tolerance.
    const auto fd = test_support::finite_difference(m, *p, rows, analytic, 2e-3f);
    EXPECT_LT(fd.max_err, 2e-3) << p->name;
    EXPECT_GT(fd.max_ref, 1e-4) << p->name << ": a gradient that never moves checks nothing";
    ++checked;
  }
  EXPECT_EQ(checked, 10);  // fc1, fc2, ln, mix, head: weight and bias each
}

// GraphPlan::readers: each node's readers in forward order, a node that reads an output twice
// listed once, the logits read by none (the memory plans' single-reader test relies on it).
TEST(ModelGraph, ReadersListEachReadingNodeOnceInForwardOrder) {
  Model m(cpu(), residual_graph(), 6, 3);
  const GraphPlan& plan = m.plan();
  ASSERT_EQ(plan.size(), 10u);
  EXPECT_EQ(plan.readers(0), (std::vector<std::size_t>{1, 3}));  // fc1: relu1 and res
  EXPECT_EQ(plan.readers(2), (std::vector<std::size_t>{3}));     // fc2: res
  EXPECT_EQ(plan.readers(3), (std::vector<std::size_t>{4}));     // res: twice, read twice
  EXPECT_EQ(plan.readers(4), (std::vector<std::size_t>{5}));
  EXPECT_TRUE(plan.readers(9).empty());  // the logits
  for (std::size_t q = 0; q < plan.size(); ++q)
    for (const TensorId t : plan.node(q).inputs)
      if (t.is_node()) {
        const auto& r = plan.readers(t.position());
        EXPECT_EQ(std::count(r.begin(), r.end(), q), 1) << "node " << q;
      }
}

TEST(ModelGraph, SeveralReadersAccumulateInFp32UnderA16BitPlan) {
  // The same graph with bf16 activation gradients everywhere: each reader's contribution is
  // rounded to bf16, and the sum of them is kept in FP32. The gradients stay within bf16's
  // rounding of the FP32 plan's.
  auto grads = [](bool bf16) {
    Model m(cpu(), residual_graph(), 6, 3);
    for (auto& l : m.layers()) {
      sdk::OpPrecision p;
      if (bf16 && l->type() != "layernorm") p.activation_grad = DType::bf16;
      l->set_precision(p);
    }
    m.allocate(4);
    m.init_parameters(11);
    feed(m, 4, 5);
    m.forward(4);
    m.loss(4, 1.0f, true);
    m.backward(4);
    std::vector<std::vector<float>> out;
    for (auto* p : m.parameters()) out.push_back(read(p->grad.view()));
    return out;
  };
  const auto ref = grads(false), low = grads(true);
  ASSERT_EQ(ref.size(), low.size());
  for (std::size_t k = 0; k < ref.size(); ++k) {
    double max_ref = 0, max_err = 0;
    for (std::size_t i = 0; i < ref[k].size(); ++i) {
      max_ref = std::max(max_ref, static_cast<double>(std::abs(ref[k][i])));
      max_err = std::max(max_err, static_cast<double>(std::abs(ref[k][i] - low[k][i])));
    }
    EXPECT_LT(max_err, 0x1p-6 * max_ref + 1e-6) << "parameter " << k;
  }
}

TEST(ModelGraph, GradientArenaReusesDeadBuffersAndTheHookSeesEveryParameterOnce) {
  // A 20-block residual MLP: h = h + fc2(relu(fc1(h))), 20 times.
  ModelSpec spec;
  spec.graph = true;
  std::string h = "input";
  std::vector<std::string> names;
  for (int b = 0; b < 20; ++b) {
    const std::string p = "b" + std::to_string(b);
    names.insert(names.end(), {p + ".fc1", p + ".relu", p + ".fc2", p + ".add"});
  }
  for (int b = 0; b < 20; ++b) {
    const std::size_t k = static_cast<std::size_t>(b) * 4;
    spec.layers.push_back(node("linear", names[k].c_str(), {h}, 32));
    spec.layers.push_back(node("relu", names[k + 1].c_str(), {names[k]}));
    spec.layers.push_back(node("linear", names[k + 2].c_str(), {names[k + 1]}, 16));
    spec.layers.push_back(node("add", names[k + 3].c_str(), {names[k + 2], h}));
    h = names[k + 3];
  }
  spec.layers.push_back(node("linear", "head", {h}, 3));
  Model m(cpu(), spec, 16, 3);
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(8);
  m.init_parameters(1);
  EXPECT_EQ(m.fused_pairs(), 20);
  EXPECT_LT(m.gradient_plan().arena_bytes * 4, m.gradient_plan().sum_bytes)
      << m.gradient_plan().arena_bytes << " of " << m.gradient_plan().sum_bytes;
  // Activations: fc1's z is never stored (the relu is its epilogue); relu and add outputs are
  // kept for the backward (fc2 and the next fc1 read them); each fc2 output dies when its add has
  // run, so the 20 of them share one buffer (and the logits fit in a dead one too).
  const std::size_t fc2_out = aligned_buffer_bytes(8 * 16 * 4, kDefaultBufferAlignment);
  EXPECT_GE(m.activation_plan().sum_bytes - m.activation_plan().arena_bytes, 19 * fc2_out)
      << m.activation_plan().arena_bytes << " of " << m.activation_plan().sum_bytes;
  std::map<std::string, int> seen;
  m.set_gradient_ready_hook([&](ModelParameter& p) { ++seen[p.name]; });
  feed(m, 8, 2);
  m.forward(8);
  m.loss(8, 1.0f, true);
  m.backward(8);
  EXPECT_EQ(seen.size(), m.parameters().size());
  for (const auto& [name, n] : seen) EXPECT_EQ(n, 1) << name;
}

TEST(ModelGraph, ErrorsNameTheNodeAndItsLine) {
  auto error_of = [](ModelSpec spec, std::int64_t features = 6) {
    try {
      Model m(cpu(), spec, features, 3);
    } catch (const sdk::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ModelSpec add_one;
  add_one.graph = true;
  add_one.layers = {node("add", "sum", {"input"}, 0, 4), node("linear", "head", {"sum"}, 3, 5)};
  EXPECT_NE(error_of(add_one).find("graph.toml:4:3"), std::string::npos) << error_of(add_one);
  EXPECT_NE(error_of(add_one).find("two or more inputs"), std::string::npos);

  ModelSpec logits_shape;
  logits_shape.graph = true;
  logits_shape.layers = {node("reshape", "r", {"input"}, 0, 7),
                         node("linear", "head", {"r"}, 3, 8)};
  logits_shape.layers[0].shape = {2, 3};
  const auto e = error_of(logits_shape);
  EXPECT_NE(e.find("graph.toml:8:3"), std::string::npos) << e;
  EXPECT_NE(e.find("[2, 3]"), std::string::npos) << e;

  ModelSpec huge = logits_shape;  // a product past int64 is refused, not wrapped
  huge.layers[0].shape = {std::int64_t{1} << 40, std::int64_t{1} << 40, -1};
  EXPECT_NE(error_of(huge).find("cannot reshape"), std::string::npos) << error_of(huge);

  ModelSpec relu_two;
  relu_two.graph = true;
  relu_two.layers = {node("relu", "act", {"input", "input"}, 0, 2),
                     node("linear", "head", {"act"}, 3, 3)};
  EXPECT_NE(error_of(relu_two).find("takes one input"), std::string::npos) << error_of(relu_two);
}

}  // namespace
}  // namespace mixtrain::core
