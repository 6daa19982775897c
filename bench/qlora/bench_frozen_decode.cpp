// bench_frozen_decode: the CPU backend's quantized_weight facet decoding one frozen base weight,
// as a LoRA step does before each GEMM that reads it (train.frozen_format): NF4 in QLoRA's blocks
// of 64, fp8-block (E4M3 in 128 x 128 blocks, fp32 scales) and mxfp8 (E4M3 in 1 x 32 blocks, E8M0
// scale codes), into the compute dtype. The weight is drawn from N(0, 0.02), as GPT-2's are
// initialised, so the scales spread as a real base's do. Reports each format's fastest call and
// its rate in elements a nanosecond.
//
// Usage: bench_frozen_decode [--threads N] [--reps R] [--rows R] [--cols C] [--dtype
// bf16|fp16|fp32] Per format: 2 warm-up calls, then R calls; the fastest call in ms
// (best_call_time.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../support/best_call_time.h"
#include "../support/cpu_arena.h"
#include "cpu_backend.h"
#include "mixtrain/sdk/backend_quantized_weight.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/nf4.h"

namespace {

using mixtrain::backend_cpu::CpuBackend;
using mixtrain::bench::Arena;
using mixtrain::bench::best_ms;
using mixtrain::sdk::DType;
using mixtrain::sdk::TensorView;
namespace sdk = mixtrain::sdk;

void report(const char* format, double ms, std::int64_t n) {
  std::printf("%-10s %10.3f %10.2f\n", format, ms, static_cast<double>(n) / ms * 1e-6);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the CPU backend's frozen-base decodes (quantized_weight facet)"};
  int threads = 2, reps = 50;
  std::int64_t rows = 768, cols = 3072;
  std::string dtype_name = "bf16";
  const auto size = CLI::Range(std::int64_t{1}, std::int64_t{1} << 16);
  app.add_option("--threads", threads, "CPU backend threads")->check(CLI::Range(1, 1024));
  app.add_option("--reps", reps, "timed calls per format")->check(CLI::Range(1, 100000));
  app.add_option("--rows", rows, "the weight's rows")->check(size);
  app.add_option("--cols", cols, "the weight's columns")->check(size);
  app.add_option("--dtype", dtype_name, "the decode's output dtype")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}));
  CLI11_PARSE(app, argc, argv);
  const DType dtype = *sdk::parse_dtype(dtype_name);
  const std::int64_t n = rows * cols;

  CpuBackend be(threads);
  auto* facet = sdk::facet<sdk::QuantizedWeightFacet>(be);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(static_cast<std::size_t>(n));
  for (float& v : w) v = normal(rng);
  Arena arena(be);
  const TensorView out = arena.make(dtype, sdk::Shape{rows, cols}, 2);

  std::printf("threads %d, [%lld, %lld] into %s, best of %d calls\n", threads,
              static_cast<long long>(rows), static_cast<long long>(cols), dtype_name.c_str(), reps);
  std::printf("%-10s %10s %10s\n", "format", "ms", "elem/ns");
  const sdk::Nf4Tensor nf4 = sdk::nf4_quantize(w);
  const TensorView nf4_codes = arena.copy(nf4.codes, DType::fp8_e4m3);
  const TensorView absmax = arena.copy(nf4.absmax, DType::fp32);
  report("nf4",
         best_ms([&] { facet->dequantize_nf4(nf4_codes.data, absmax, nf4.block, out); }, reps), n);
  const std::pair<const char*, sdk::BlockScaledLayout> formats[] = {
      {"fp8-block", sdk::fp8_block_weight_layout()},
      {"mxfp8", sdk::mx_layout(sdk::ReductionAxis::cols, sdk::BlockElement::e4m3)}};
  for (const auto& [name, layout] : formats) {
    const sdk::BlockScaledTensor q = sdk::quantize_block_scaled(w, rows, cols, layout);
    sdk::BlockScaledWeight weight{.codes = arena.copy(q.codes, DType::fp8_e4m3),
                                  .scales = q.scale_codes.empty()
                                                ? arena.copy(q.scales, DType::fp32)
                                                : arena.copy(q.scale_codes, DType::fp8_e4m3),
                                  .tensor_scale = {},
                                  .layout = layout};
    report(name, best_ms([&] { facet->dequantize_block_scaled(weight, out); }, reps), n);
  }
  return 0;
}
