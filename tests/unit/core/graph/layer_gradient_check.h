// Finite-difference checks of one layer on the core tests' CPU backend: the scalar L = Σ y·r for
// a fixed random r, backward with dy = r, and every input and parameter gradient compared with a
// central difference of L computed in double from fp32 forwards.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cpu_test_backend.h"
#include "mixtrain/core/graph/layer.h"

namespace mixtrain::core::test_support {

inline std::vector<float> random_vector(std::size_t n, unsigned seed, float lo = -1.f,
                                        float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Compares analytic gradient `analytic` of L with respect to the values in `target` (a device
// view the forward reads) against central differences.
inline void expect_gradient_matches(Layer& layer, const Tensor& x, std::int64_t rows,
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

inline void check_layer(Layer& layer, std::int64_t rows, float x_lo = -1.f, float x_hi = 1.f) {
  layer.allocate(cpu(), rows);
  layer.init_parameters(7);
  // Perturb the parameters away from their initial values (LayerNorm starts at 1 / 0).
  for (auto& p : layer.parameters()) {
    auto v = read(p.master.view());
    auto noise = random_vector(v.size(), 11, -0.5f, 0.5f);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] += noise[i];
    write(p.master.view(), v);
  }
  Tensor x(cpu(), sdk::DType::fp32, sdk::Shape{rows, layer.in_features()});
  write(x.view(), random_vector(static_cast<std::size_t>(x.shape().numel()), 3, x_lo, x_hi));
  auto r = random_vector(static_cast<std::size_t>(rows * layer.out_features()), 5);
  Tensor dy(cpu(), sdk::DType::fp32, sdk::Shape{rows, layer.out_features()});
  write(dy.view(), r);
  Tensor dx(cpu(), sdk::DType::fp32, sdk::Shape{rows, layer.in_features()});

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

}  // namespace mixtrain::core::test_support
