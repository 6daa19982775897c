// bench_add_layer_norm: GPT-2 small's residual add and the layer norm that reads its sum (C = 768)
// on the CPU backend, apart (the residual facet's add, then layernorm_forward of the sum) against
// layer norm 1.2's layernorm_add_forward (docs/model-graph.md, "Add + layer norm"), through the
// facets the model calls. The stream in bf16 or fp32; the layer norm writes fp32, as the
// precision plan pins it.
//
// The last column is the layer norm's backward as a block runs it (layernorm_backward_accumulate:
// dx added into the fp32 gradient sum).
// Usage: bench_add_layer_norm [--threads N] [--reps R] [--rows B·T] [--width C]
// Per case: 2 warm-up calls, then R calls; the fastest call in ms (best_call_time.h).
#include <CLI/CLI.hpp>

#include <cstdio>

#include "../support/best_call_time.h"
#include "../support/cpu_arena.h"
#include "cpu_backend.h"
#include "mixtrain/sdk/backend_layer_norm.h"
#include "mixtrain/sdk/backend_residual.h"

namespace {

using mixtrain::backend_cpu::CpuBackend;
using mixtrain::bench::Arena;
using mixtrain::bench::best_ms;
using mixtrain::sdk::DType;
using mixtrain::sdk::TensorView;
namespace sdk = mixtrain::sdk;

void run(CpuBackend& be, std::int64_t rows, std::int64_t c, DType dt, int reps) {
  Arena a(be);
  // x: the residual stream, h: the block's output, s: their sum; y: the layer norm of s.
  const TensorView x = a.make(dt, {rows, c}, 1), h = a.make(dt, {rows, c}, 2);
  const TensorView s = a.make(dt, {rows, c}, 3), y = a.make(DType::fp32, {rows, c}, 4);
  const TensorView gamma = a.make(DType::fp32, {c}, 5), beta = a.make(DType::fp32, {c}, 6);
  const TensorView mean = a.make(DType::fp32, {rows}, 7), rstd = a.make(DType::fp32, {rows}, 8);
  auto* residual = sdk::facet<sdk::ResidualFacet>(be);
  auto* norm = sdk::facet<sdk::LayerNormFacet>(be);
  const TensorView xs[2] = {x, h};
  const double add = best_ms([&] { residual->add(xs, false, s); }, reps);
  const double norm_alone =
      best_ms([&] { norm->layernorm_forward(s, gamma, beta, 1e-5f, y, mean, rstd); }, reps);
  const double apart = best_ms(
      [&] {
        residual->add(xs, false, s);
        norm->layernorm_forward(s, gamma, beta, 1e-5f, y, mean, rstd);
      },
      reps);
  sdk::LayerNormAddArgs args;
  args.a = x;
  args.b = h;
  args.sum = s;
  args.gamma = gamma;
  args.beta = beta;
  args.y = y;
  args.mean = mean;
  args.rstd = rstd;
  const double fused = best_ms([&] { norm->layernorm_add_forward(args); }, reps);
  // The backward as the block runs it: dy in the stream's dtype, dx added into the fp32 gradient
  // sum of the residual stream, dgamma and dbeta accumulated.
  const TensorView dy = a.make(dt, {rows, c}, 9), dsum = a.make(DType::fp32, {rows, c}, 10);
  const TensorView dgamma = a.make(DType::fp32, {c}, 11), dbeta = a.make(DType::fp32, {c}, 12);
  const double backward = best_ms(
      [&] {
        norm->layernorm_backward_accumulate(dy, s, gamma, mean, rstd, dsum, dgamma, dbeta, true);
      },
      reps);
  std::printf("%6lld %-5s %10.3f %10.3f %10.3f %10.3f %6.3fx %10.3f\n",
              static_cast<long long>(rows), sdk::dtype_name(dt).data(), add, norm_alone, apart,
              fused, apart / fused, backward);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPT-2 small's residual add + layer norm, apart against layernorm_add_forward"};
  int threads = 2, reps = 20;
  std::int64_t rows = 8192, width = 768;
  app.add_option("--threads", threads, "CPU backend threads")->check(CLI::Range(1, 1024));
  app.add_option("--reps", reps, "timed calls per case")->check(CLI::Range(1, 100000));
  app.add_option("--rows", rows, "B·T, the rows of the residual stream")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 22));
  app.add_option("--width", width, "C, the model's width (GPT-2 small: 768)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
  CLI11_PARSE(app, argc, argv);
  CpuBackend be(threads);
  std::printf("threads %d, C %lld, best of %d calls, ms\n", threads, static_cast<long long>(width),
              reps);
  std::printf("%6s %-5s %10s %10s %10s %10s %7s %10s\n", "rows", "dtype", "add", "ln", "add+ln",
              "fused", "gain", "backward");
  for (DType dt : {DType::bf16, DType::fp32}) run(be, rows, width, dt, reps);
  return 0;
}
