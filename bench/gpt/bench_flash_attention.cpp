// bench_flash_attention: the CPU backend's causal flash attention (attention facet 1.1's
// flash_forward and flash_backward) at a GPT shape, fp32 qkv and bf16 qkv with each of the
// backend's tile products (the option flash_products: fp32, bf16), through the facet the model
// calls. Reports each op's fastest call and its rate in GFLOP/s, counting the causal half of the
// score matrix: forward 2 GEMMs (q·kᵀ, P·v), backward 5 (the recomputed q·kᵀ, dv, dP, dq, dk),
// each 2·N·H·(T²/2)·D flops.
//
// Usage: bench_flash_attention [--threads N] [--reps R] [--batch N] [--heads H] [--tokens T]
//                              [--head-dim D] [--cases fp32/fp32 bf16/fp32 bf16/bf16]
// Per case: 2 warm-up calls, then R calls; the fastest call in ms (best_call_time.h).
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../support/best_call_time.h"
#include "../support/cpu_arena.h"
#include "cpu_backend.h"
#include "mixtrain/sdk/backend_attention.h"

namespace {

using mixtrain::backend_cpu::CpuBackend;
using mixtrain::bench::Arena;
using mixtrain::bench::best_ms;
using mixtrain::sdk::DType;
using mixtrain::sdk::TensorView;
namespace sdk = mixtrain::sdk;

void run(CpuBackend& be, const sdk::HeadLayout& l, DType dt, const char* products, int reps) {
  Arena a(be);
  const std::int64_t n = l.batch, t = l.tokens, h = l.heads, d = l.head_dim;
  // qkv [N·T, 3·H·D] as the QKV projection writes it; out, dout [N·T, H·D]; lse [N, H, T].
  const TensorView qkv = a.make(dt, {n * t, 3 * h * d}, 1), dout = a.make(dt, {n * t, h * d}, 2);
  const TensorView out = a.make(dt, {n * t, h * d}, 3), lse = a.make(DType::fp32, {n, h, t}, 4);
  const TensorView dqkv = a.make(dt, {n * t, 3 * h * d}, 5);
  auto* attention = sdk::facet<sdk::AttentionFacet>(be);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const double fwd = best_ms([&] { attention->flash_forward(qkv, l, scale, out, lse); }, reps);
  const double bwd =
      best_ms([&] { attention->flash_backward(qkv, out, dout, lse, l, scale, dqkv); }, reps);
  const double gemm_flops = 2.0 * static_cast<double>(n * h) * (0.5 * t * t) * d;
  std::printf("%-5s %-9s %10.3f %8.1f %10.3f %8.1f\n", sdk::dtype_name(dt).data(), products, fwd,
              2 * gemm_flops / fwd * 1e-6, bwd, 5 * gemm_flops / bwd * 1e-6);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the CPU backend's causal flash attention, forward and backward"};
  int threads = 2, reps = 10;
  sdk::HeadLayout l;
  l.batch = 2;
  l.tokens = 1024;
  l.heads = 4;
  l.head_dim = 64;
  l.parts = 3;
  const auto size = CLI::Range(std::int64_t{1}, std::int64_t{1} << 16);
  app.add_option("--threads", threads, "CPU backend threads")->check(CLI::Range(1, 1024));
  app.add_option("--reps", reps, "timed calls per case")->check(CLI::Range(1, 100000));
  app.add_option("--batch", l.batch, "N, sequences")->check(size);
  app.add_option("--heads", l.heads, "H, heads")->check(size);
  app.add_option("--tokens", l.tokens, "T, tokens per sequence")->check(size);
  app.add_option("--head-dim", l.head_dim, "D, the head dimension")->check(CLI::Range(1, 512));
  std::vector<std::string> cases{"fp32/fp32", "bf16/fp32", "bf16/bf16"};
  app.add_option("--cases", cases, "qkv dtype / tile products, each run in turn")
      ->check(CLI::IsMember({"fp32/fp32", "bf16/fp32", "bf16/bf16"}));
  CLI11_PARSE(app, argc, argv);
  CpuBackend be(threads);
  std::printf("threads %d, N %lld, H %lld, T %lld, D %lld, best of %d calls\n", threads,
              static_cast<long long>(l.batch), static_cast<long long>(l.heads),
              static_cast<long long>(l.tokens), static_cast<long long>(l.head_dim), reps);
  std::printf("%-5s %-9s %10s %8s %10s %8s\n", "qkv", "products", "fwd ms", "GFLOP/s", "bwd ms",
              "GFLOP/s");
  using mixtrain::backend_cpu::FlashProductsChoice;
  for (const std::string& c : cases) {
    const bool bf16_qkv = c.starts_with("bf16"), bf16_products = c.ends_with("bf16");
    be.set_flash_products(bf16_products ? FlashProductsChoice::bf16 : FlashProductsChoice::fp32);
    run(be, l, bf16_qkv ? DType::bf16 : DType::fp32, bf16_products ? "bf16" : "fp32", reps);
  }
  return 0;
}
