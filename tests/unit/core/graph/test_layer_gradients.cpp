// Finite-difference gradient checks for every layer and for the whole model with its loss.
//
// Each check builds the layer on the CPU backend, defines the scalar L = Σ y·r for a fixed
// random r, runs backward with dy = r, and compares every input and parameter gradient with a
// central difference of L computed in double from fp32 forwards.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "cpu_test_backend.h"
#include "graph/ops/activation.h"
#include "graph/ops/dropout.h"
#include "graph/ops/layernorm.h"
#include "graph/ops/linear.h"
#include "layer_gradient_check.h"
#include "mixtrain/core/graph/layer.h"
#include "mixtrain/core/graph/model.h"

namespace mixtrain::core {
namespace {

using sdk::DType;

using test_support::check_layer;
using test_support::cpu;
using test_support::expect_gradient_matches;
using test_support::op;
using test_support::random_vector;
using test_support::read;
using test_support::write;

TEST(LayerGradients, LinearWithBias) {
  LinearLayer l("fc", 5, 3, true);
  check_layer(l, 4);
}

TEST(LayerGradients, LinearWithoutBias) {
  LinearLayer l("fc", 6, 7, false);
  check_layer(l, 3);
}

TEST(LayerGradients, Relu) {
  ActivationLayer l("act", sdk::Activation::relu, 9);
  // Inputs at least 0.05 away from the kink, so ±eps never crosses it.
  l.allocate(cpu(), 4);
  Tensor x(cpu(), DType::fp32, sdk::Shape{4, 9});
  auto xv = random_vector(36, 3);
  for (auto& v : xv) v = v < 0 ? v - 0.05f : v + 0.05f;
  write(x.view(), xv);
  auto r = random_vector(36, 5);
  Tensor dy(cpu(), DType::fp32, sdk::Shape{4, 9});
  write(dy.view(), r);
  Tensor dx(cpu(), DType::fp32, sdk::Shape{4, 9});
  l.forward(x.view(), 4);
  l.backward(x.view(), dy.view(), dx.view(), 4);
  expect_gradient_matches(l, x, 4, r, x.view(), read(dx.view()), "input");
}

TEST(LayerGradients, Gelu) {
  ActivationLayer l("act", sdk::Activation::gelu, 8);
  check_layer(l, 5, -3.f, 3.f);
}

TEST(LayerGradients, LayerNorm) {
  LayerNormLayer l("ln", 7, 1e-5f);
  check_layer(l, 4, -2.f, 2.f);
}

// The mask is a function of the key, fixed within a step, so the finite difference is exact
// through it: kept elements have gradient 1 / (1 - p), dropped ones 0.
TEST(LayerGradients, DropoutInTrainingAndEvaluationMode) {
  for (const bool training : {true, false}) {
    DropoutLayer l("drop", 11, 0.4f);
    l.set_training(training);
    l.begin_micro_batch(1, 17);
    check_layer(l, 6);
  }
}

TEST(LayerGradients, WholeModelThroughSoftmaxCrossEntropy) {
  ModelSpec spec;
  spec.layers = {op("linear", "fc1", {{"out", 6}}), op("gelu", "act"), op("layernorm", "ln"),
                 op("linear", "head", {{"out", 3}})};
  Model m(cpu(), spec, 4, 3);
  for (auto& l : m.layers()) l->set_precision({});
  const std::int64_t rows = 5;
  m.allocate(rows);
  m.init_parameters(3);
  write(m.input(rows), random_vector(static_cast<std::size_t>(rows * 4), 8));
  std::vector<std::int32_t> labels = {0, 2, 1, 1, 0};
  cpu()->copy_from_host(m.labels(rows), labels.data());

  m.forward(rows);
  m.loss(rows, 1.0f, true);
  m.backward(rows);
  for (auto* p : m.parameters()) {
    const auto analytic = read(p->grad.view());
    EXPECT_LT(test_support::finite_difference(m, *p, rows, analytic, 1e-2f).max_err, 2e-3)
        << p->name;
  }
}

TEST(LayerGradients, LossScaleMultipliesTheBackwardSeed) {
  ModelSpec spec;
  spec.layers = {op("linear", "head", {{"out", 3}})};
  Model m(cpu(), spec, 4, 3);
  for (auto& l : m.layers()) l->set_precision({});
  m.allocate(2);
  m.init_parameters(1);
  write(m.input(2), random_vector(8, 2));
  std::vector<std::int32_t> labels = {1, 2};
  cpu()->copy_from_host(m.labels(2), labels.data());
  m.forward(2);
  m.loss(2, 1.0f, true);
  m.backward(2);
  auto g1 = read(m.parameters()[0]->grad.view());
  m.forward(2);
  m.loss(2, 1024.0f, true);
  m.backward(2);
  auto g2 = read(m.parameters()[0]->grad.view());
  for (std::size_t i = 0; i < g1.size(); ++i)
    EXPECT_NEAR(g2[i], 1024.0f * g1[i], 1e-3f * std::abs(g2[i]) + 1e-6f);
}

}  // namespace
}  // namespace mixtrain::core
