// bench_bn_add_join: the end of a ResNet-50 Bottleneck on the CPU backend, fused against unfused,
// through the facets the model calls (docs/model-graph.md, "BN + add + ReLU"):
// - forward: batchnorm_forward_training into its own output, then the residual add with its ReLU
//   (unfused), against batchnorm_add_forward (one pass after the statistics);
// - backward of the join: one activation_backward per input (the shortcut's FP32 gradient and
//   batch norm's gradient in the activation dtype), against add_backward (both from one read of dy
//   and y).
// Shapes: batch 32 at each stage's output (56²×256, 28²×512, 14²×1024, 7²×2048), bf16 and fp32
// activations; dy, the residual stream's gradient, is FP32 as the executor keeps it.
//
// Usage: bench_bn_add_join [--threads N] [--reps R]
// Per shape: 2 warm-up calls, then R (20) calls; the fastest call in ms (best_call_time.h).
#include <omp.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "../support/best_call_time.h"
#include "../support/cpu_arena.h"
#include "cpu_backend.h"
#include "mixtrain/sdk/backend_activation.h"
#include "mixtrain/sdk/backend_batch_norm.h"
#include "mixtrain/sdk/backend_residual.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace {

using mixtrain::backend_cpu::CpuBackend;
using mixtrain::bench::Arena;
using mixtrain::bench::best_ms;
using mixtrain::sdk::DType;
using mixtrain::sdk::Shape;
using mixtrain::sdk::TensorView;
namespace sdk = mixtrain::sdk;

struct Stage {
  std::int64_t size, channels;
};

void run(CpuBackend& be, const Stage& s, DType dt, int reps) {
  const std::int64_t rows = 32 * s.size * s.size, c = s.channels;
  const Shape flat{rows, c}, vec{c};
  Arena a(be);
  const TensorView x = a.make(dt, flat, 1, -1.0f, 3.0f), r = a.make(dt, flat, 2);
  const TensorView bn_out = a.make(dt, flat, 3), y = a.make(dt, flat, 4);
  const TensorView gamma = a.make(DType::fp32, vec, 5, 0.5f, 1.5f);
  const TensorView beta = a.make(DType::fp32, vec, 6, -0.5f, 0.5f);
  const TensorView mean = a.make(DType::fp32, vec, 7), var = a.make(DType::fp32, vec, 8);
  const TensorView rm = a.make(DType::fp32, vec, 9), rv = a.make(DType::fp32, vec, 10, 0.5f, 1.f);
  const TensorView dy = a.make(DType::fp32, flat, 11);
  const TensorView d_short = a.make(DType::fp32, flat, 12), d_bn = a.make(dt, flat, 13);
  auto* bn = sdk::facet<sdk::BatchNormFacet>(be);
  auto* join = sdk::facet<sdk::ResidualFacet>(be);
  auto* act = sdk::facet<sdk::ActivationFacet>(be);
  const sdk::BatchNormShape plain{rows, c, 1e-5f, false};

  const double unfused_fwd = best_ms(
      [&] {
        bn->batchnorm_forward_training(x, gamma, beta, plain, 0.1f, bn_out, mean, var, rm, rv, {});
        const TensorView xs[] = {bn_out, r};
        join->add(xs, true, y);
      },
      reps);
  sdk::BatchNormAddArgs args;
  args.x = x;
  args.residual = r;
  args.gamma = gamma;
  args.beta = beta;
  args.shape = {rows, c, 1e-5f, true};
  args.y = y;
  args.save_mean = mean;
  args.save_var = var;
  args.running_mean = rm;
  args.running_var = rv;
  const double fused_fwd = best_ms([&] { bn->batchnorm_add_forward(args); }, reps);

  const double unfused_bwd = best_ms(
      [&] {
        act->activation_backward(sdk::Activation::relu, y, dy, d_short);
        act->activation_backward(sdk::Activation::relu, y, dy, d_bn);
      },
      reps);
  const TensorView dxs[] = {d_short, d_bn};
  const double one_pass_bwd = best_ms([&] { join->add_backward(dy, y, true, dxs); }, reps);
  std::printf("%3lldx%-3lld %5lld %-5s %9.3f %9.3f %6.2fx %9.3f %9.3f %6.2fx\n",
              static_cast<long long>(s.size), static_cast<long long>(s.size),
              static_cast<long long>(c), sdk::dtype_name(dt).data(), unfused_fwd, fused_fwd,
              unfused_fwd / fused_fwd, unfused_bwd, one_pass_bwd, unfused_bwd / one_pass_bwd);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a ResNet-50 Bottleneck's end on the CPU backend, fused against unfused"};
  int threads = 2, reps = 20;
  app.add_option("--threads", threads, "CPU backend threads")->check(CLI::Range(1, 1024));
  app.add_option("--reps", reps, "timed calls per case")->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  CpuBackend be(threads);
  std::printf("threads %d, batch 32, best of %d calls, ms\n", threads, reps);
  std::printf("%-7s %5s %-5s %9s %9s %7s %9s %9s %7s\n", "HxW", "C", "dtype", "bn+add", "fused",
              "gain", "2x dReLU", "one pass", "gain");
  for (const Stage& s : {Stage{56, 256}, Stage{28, 512}, Stage{14, 1024}, Stage{7, 2048}})
    for (DType dt : {DType::bf16, DType::fp32}) run(be, s, dt, reps);
  return 0;
}
