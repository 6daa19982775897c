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
#include "mixtrain/core/layer.h"
#include "mixtrain/core/model.h"
#include "ops/activation.h"
#include "ops/layernorm.h"
#include "ops/linear.h"

namespace mixtrain::core {
namespace {

using sdk::DType;

using test_support::cpu;
using test_support::op;
using test_support::read;
using test_support::write;

std::vector<float> random_vector(std::size_t n, unsigned seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Compares analytic gradient `analytic` of L with respect to the values in `target` (a device
// view the forward reads) against central differences.
void expect_gradient_matches(Layer& layer, const Tensor& x, std::int64_t rows,
                             const std::vector<float>& r, const sdk::TensorView& target,
                             const std::vector<float>& analytic, const char* what) {
  auto loss = [&] {
    layer.forward(x.view(), rows);
    auto y = read(layer.output(rows));
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * r[i];
    return s;
  };
  auto values = read(target);
  const float eps = 1e-2f;
  double max_err = 0, max_ref = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    auto saved = values[i];
    values[i] = saved + eps;
    write(target, values);
    double lp = loss();
    values[i] = saved - eps;
    write(target, values);
    double lm = loss();
    values[i] = saved;
    write(target, values);
    double numeric = (lp - lm) / (2.0 * eps);
    max_err = std::max(max_err, std::abs(numeric - analytic[i]));
    max_ref = std::max(max_ref, std::abs(numeric));
  }
  EXPECT_LE(max_err, 2e-3 * std::max(1.0, max_ref))
      << what << ": max |numeric - analytic| = " << max_err;
}

void check_layer(Layer& layer, std::int64_t rows, float x_lo = -1.f, float x_hi = 1.f) {
  layer.allocate(cpu(), rows);
  layer.init_parameters(7);
  // Perturb the parameters away from their initial values (LayerNorm starts at 1 / 0).
  for (auto& p : layer.parameters()) {
    auto v = read(p.master.view());
    auto noise = random_vector(v.size(), 11, -0.5f, 0.5f);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] += noise[i];
    write(p.master.view(), v);
  }
  Tensor x(cpu(), DType::fp32, sdk::Shape{rows, layer.in_features()});
  write(x.view(), random_vector(static_cast<std::size_t>(x.shape().numel()), 3, x_lo, x_hi));
  auto r = random_vector(static_cast<std::size_t>(rows * layer.out_features()), 5);
  Tensor dy(cpu(), DType::fp32, sdk::Shape{rows, layer.out_features()});
  write(dy.view(), r);
  Tensor dx(cpu(), DType::fp32, sdk::Shape{rows, layer.in_features()});

  layer.forward(x.view(), rows);
  layer.backward(x.view(), dy.view(), dx.view(), rows);
  auto dx_host = read(dx.view());
  std::vector<std::vector<float>> grads;
  for (auto& p : layer.parameters()) grads.push_back(read(p.grad.view()));

  expect_gradient_matches(layer, x, rows, r, x.view(), dx_host, "input");
  for (std::size_t i = 0; i < layer.parameters().size(); ++i)
    expect_gradient_matches(layer, x, rows, r, layer.parameters()[i].master.view(), grads[i],
                            layer.parameters()[i].name.c_str());
}

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
