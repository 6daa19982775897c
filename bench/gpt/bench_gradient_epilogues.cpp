// bench_gradient_epilogues: GPT-2 small's MLP backward (c_fc → gelu → c_proj, C = 768) on the
// CPU backend, unfused against gemm facet 1.5's gemm_gradient (docs/model-graph.md, "Backward
// epilogues"), through the facets the model calls, with c_fc's forward for comparison:
// - c_fc's forward: the gemm alone (bias only), then activation_forward (gelu), against one gemm
//   with the activation epilogue (pre-activation kept);
// - c_proj's dgrad (and the gemm alone): gemm into dh [rows, 4C], activation_backward (gelu) into dz, bias_grad of dz
//   (c_fc's bias), against one gemm_gradient with gelu's gradient and the column sums;
// - c_proj's wgrad: gemm into dW [C, 4C], bias_grad of dy (c_proj's bias), against one
//   gemm_gradient with the row sums of dyᵀ.
// bf16 (GEMM operands and activations) and fp32.
//
// Usage: bench_gradient_epilogues [--threads N] [--reps R] [--rows B·T] [--width C]
// Per case: 2 warm-up calls, then R calls; the fastest call in ms (best_call_time.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "../support/best_call_time.h"
#include "../support/cpu_arena.h"
#include "cpu_backend.h"
#include "mixtrain/sdk/backend_activation.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace {

using mixtrain::backend_cpu::CpuBackend;
using mixtrain::bench::Arena;
using mixtrain::bench::best_ms;
using mixtrain::sdk::DType;
using mixtrain::sdk::Shape;
using mixtrain::sdk::TensorView;
namespace sdk = mixtrain::sdk;

void run(CpuBackend& be, std::int64_t rows, std::int64_t c, DType dt, int reps) {
  const std::int64_t h = 4 * c;
  Arena a(be);
  // dy [rows, C]: c_proj's output gradient; W [C, 4C]: c_proj's weight; z [rows, 4C]: c_fc's
  // output (gelu's input); x [rows, 4C]: gelu's output, c_proj's input.
  const TensorView dy = a.make(dt, {rows, c}, 1), w = a.make(dt, {c, h}, 2);
  const TensorView z = a.make(dt, {rows, h}, 3), x = a.make(dt, {rows, h}, 4);
  const TensorView dh = a.make(dt, {rows, h}, 5), dz = a.make(dt, {rows, h}, 6);
  const TensorView dw = a.make(DType::fp32, {c, h}, 7);
  const TensorView fc_bias = a.make(DType::fp32, {h}, 8), proj_bias = a.make(DType::fp32, {c}, 9);
  auto* gemm = sdk::facet<sdk::GemmFacet>(be);
  auto* act = sdk::facet<sdk::ActivationFacet>(be);

  // c_fc's forward: z[rows, 4C] = xin[rows, C] · W_fcᵀ + b, then h = gelu(z), z kept for the
  // backward; the GEMM alone, the GEMM then activation_forward, and the GEMM's epilogue.
  const TensorView xin = a.make(dt, {rows, c}, 10), w_fc = a.make(dt, {h, c}, 11);
  sdk::GemmArgs fc;
  fc.a.view = xin;
  fc.b.view = w_fc;
  fc.b.transpose = true;
  fc.c = z;
  fc.bias = fc_bias;
  fc.compute = dt;
  const double bare_fwd = best_ms([&] { gemm->gemm(fc); }, reps);
  const double unfused_fwd = best_ms(
      [&] {
        gemm->gemm(fc);
        act->activation_forward(sdk::Activation::gelu, z, x);
      },
      reps);
  sdk::GemmArgs fc_gelu = fc;
  fc_gelu.c = x;
  fc_gelu.has_activation = true;
  fc_gelu.activation = sdk::Activation::gelu;
  fc_gelu.pre_activation = z;
  const double fused_fwd = best_ms([&] { gemm->gemm(fc_gelu); }, reps);

  sdk::GemmArgs dgrad;  // dh[rows, 4C] = dy[rows, C] · W[C, 4C]
  dgrad.a.view = dy;
  dgrad.b.view = w;
  dgrad.c = dh;
  dgrad.compute = dt;
  const double unfused_dgrad = best_ms(
      [&] {
        gemm->gemm(dgrad);
        act->activation_backward(sdk::Activation::gelu, z, dh, dz);
        act->bias_grad(dz, fc_bias, false);
      },
      reps);
  const double bare_dgrad = best_ms([&] { gemm->gemm(dgrad); }, reps);
  sdk::GemmGradientArgs fused;
  fused.gemm = dgrad;
  fused.gemm.c = dz;
  fused.has_activation_grad = true;
  fused.pre_activation = z;
  fused.c_column_sums = fc_bias;
  const double fused_dgrad = best_ms([&] { gemm->gemm_gradient(fused); }, reps);

  sdk::GemmArgs wgrad;  // dW[C, 4C] = dyᵀ[C, rows] · x[rows, 4C]
  wgrad.a.view = dy;
  wgrad.a.transpose = true;
  wgrad.b.view = x;
  wgrad.c = dw;
  wgrad.compute = dt;
  const double unfused_wgrad = best_ms(
      [&] {
        gemm->gemm(wgrad);
        act->bias_grad(dy, proj_bias, false);
      },
      reps);
  sdk::GemmGradientArgs summed;
  summed.gemm = wgrad;
  summed.a_row_sums = proj_bias;
  const double fused_wgrad = best_ms([&] { gemm->gemm_gradient(summed); }, reps);
  std::printf("%6lld %-5s %8.2f %8.2f %8.2f %6.3fx %8.2f %8.2f %8.2f %6.3fx %8.2f %8.2f %6.3fx\n",
              static_cast<long long>(rows), sdk::dtype_name(dt).data(), bare_fwd, unfused_fwd,
              fused_fwd, unfused_fwd / fused_fwd, bare_dgrad, unfused_dgrad, fused_dgrad,
              unfused_dgrad / fused_dgrad, unfused_wgrad, fused_wgrad, unfused_wgrad / fused_wgrad);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPT-2 small's MLP backward, unfused against gemm_gradient's epilogues"};
  int threads = 2, reps = 10;
  std::int64_t rows = 2048, width = 768;
  app.add_option("--threads", threads, "CPU backend threads")->check(CLI::Range(1, 1024));
  app.add_option("--reps", reps, "timed calls per case")->check(CLI::Range(1, 100000));
  app.add_option("--rows", rows, "B·T, the rows of the MLP's activations")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--width", width, "C, the model's width (GPT-2 small: 768); the MLP is 4C wide")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
  CLI11_PARSE(app, argc, argv);
  CpuBackend be(threads);
  std::printf("threads %d, C %lld, best of %d calls, ms\n", threads, static_cast<long long>(width),
              reps);
  std::printf("%6s %-5s %8s %8s %8s %7s %8s %8s %8s %7s %8s %8s %7s\n", "rows", "dtype", "fc gemm",
              "+gelu", "fused", "gain", "dgrad", "+3", "fused", "gain", "wgrad+1", "fused",
              "gain");
  for (DType dt : {DType::bf16, DType::fp32}) run(be, rows, width, dt, reps);
  return 0;
}
