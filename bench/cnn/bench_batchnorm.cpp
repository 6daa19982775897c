// bench_batchnorm: the CPU backend's per-channel batch-norm kernels (cpu_batchnorm_kernels.h) on
// ResNet-20's and ResNet-50's shapes: the training forward's statistics, the forward's affine
// (+ ReLU), the backward's two sums Σg and Σg·(x − mean), and the backward's dx, in fp32 and bf16
// storage. The measurement behind the accumulation the backward's sums use, and behind the
// passes' prefetches (bench/RESULTS.md).
//
// Usage: bench_batchnorm [--threads N] [--reps R] [--operands cache|memory]
// Per shape and kernel: 2 warm-up calls, then R (30) calls; the fastest call in ms (on a shared
// machine the fastest call is the best estimate of what the code does with the cores to itself).
// With --operands memory each call takes the next of enough copies of its operands (about 1 GiB
// in all) that they come from memory, as in a training step, and R counts rounds over the copies
// (the fastest round's mean call); the dx pass is also timed in place (dx = dy, which the kernel
// allows).
#include <omp.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../support/best_call_time.h"
#include "cpu_batchnorm_kernels.h"

namespace {

using mixtrain::bench::best_ms;
using mixtrain::backend_cpu::Bf16Bits;
using mixtrain::backend_cpu::ReluMask;

struct Shape {
  const char* net;
  std::int64_t batch, channels, size;
};

template <class T>
std::vector<T> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<T> v(n);
  for (T& e : v) {
    const float f = u(rng);
    if constexpr (std::is_same_v<T, float>)
      e = f;
    else
      e = mixtrain::backend_cpu::bf16_from_float(f);
  }
  return v;
}

// The copies of a case's operands: one, or enough for about kMemoryBytes of x, dy and dx.
constexpr std::size_t kMemoryBytes = std::size_t{1} << 30;

template <class T>
void run(const Shape& s, const char* dtype, int reps, bool from_memory) {
  const std::int64_t rows = s.batch * s.size * s.size, c = s.channels;
  const auto n = static_cast<std::size_t>(rows * c);
  const std::size_t copies =
      from_memory ? std::max<std::size_t>(4, kMemoryBytes / (3 * n * sizeof(T))) : 1;
  std::vector<std::vector<T>> xs, dys, dxs;
  for (std::size_t k = 0; k < copies; ++k) {
    xs.push_back(random_values<T>(n, static_cast<unsigned>(2 * k + 1)));
    dys.push_back(random_values<T>(n, static_cast<unsigned>(2 * k + 2)));
    dxs.emplace_back(n);
  }
  std::vector<T> y(n);
  std::vector<float> mean(c), var(c), scale(c, 1.0f), shift(c, 0.1f), ka(c, 1.0f), kb(c, 0.5f),
      kd(c, 0.25f);
  std::vector<double> sum_g(c), sum_gx(c);
  ReluMask mask;
  mask.kind = ReluMask::Kind::recompute;
  mask.scale = scale.data();
  mask.shift = shift.data();
  using namespace mixtrain::backend_cpu;
  // The fastest round of `body(k)` over every copy, per call.
  auto time = [&](auto&& body) {
    return best_ms(
               [&] {
                 for (std::size_t k = 0; k < copies; ++k) body(k);
               },
               reps) /
           static_cast<double>(copies);
  };
  // The affine's output goes to the copy's dx (y only when the operands stay in the cache).
  auto out = [&](std::size_t k) { return from_memory ? dxs[k].data() : y.data(); };
  const double stats =
      time([&](std::size_t k) { channel_moments(xs[k].data(), rows, c, mean.data(), var.data()); });
  const double affine = time([&](std::size_t k) {
    channel_affine(xs[k].data(), out(k), rows, c, mean.data(), scale.data(), shift.data(), true);
  });
  const double sums = time([&](std::size_t k) {
    channel_grad_sums(xs[k].data(), dys[k].data(), mask, rows, c, mean.data(), sum_g.data(),
                      sum_gx.data());
  });
  const double input = time([&](std::size_t k) {
    channel_grad_input(xs[k].data(), dys[k].data(), mask, dxs[k].data(), rows, c, mean.data(),
                       ka.data(), kb.data(), kd.data());
  });
  std::printf("%-9s %4lld %5lld %3lldx%-3lld %-5s %8.3f %8.3f %8.3f %8.3f", s.net,
              static_cast<long long>(s.batch), static_cast<long long>(c),
              static_cast<long long>(s.size), static_cast<long long>(s.size), dtype, stats, affine,
              sums, input);
  if (from_memory) {
    const double in_place = time([&](std::size_t k) {
      channel_grad_input(xs[k].data(), dys[k].data(), mask, dys[k].data(), rows, c, mean.data(),
                         ka.data(), kb.data(), kd.data());
    });
    std::printf(" %8.3f", in_place);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the CPU backend's batch-norm kernels on ResNet-20's and ResNet-50's shapes"};
  int threads = 2, reps = 30;
  std::string operands = "cache";
  app.add_option("--threads", threads, "OpenMP threads")->check(CLI::Range(1, 1024));
  app.add_option("--reps", reps, "timed calls (rounds over the copies) per case")
      ->check(CLI::Range(1, 100000));
  app.add_option("--operands", operands,
                 "cache: one copy of the operands, called again and again; memory: copies "
                 "enough that each call reads from memory")
      ->check(CLI::IsMember({"cache", "memory"}));
  CLI11_PARSE(app, argc, argv);
  const bool from_memory = operands == "memory";
  omp_set_num_threads(threads);
  std::printf("threads %d, operands from %s, best of %d %s, ms\n", threads, operands.c_str(), reps,
              from_memory ? "rounds (per call)" : "calls");
  std::printf("%-9s %4s %5s %7s %-5s %8s %8s %8s %8s%s\n", "net", "N", "C", "HxW", "dtype", "stats",
              "affine", "sums", "dx", from_memory ? " dx=dy" : "");
  // ResNet-20 at batch 128, ResNet-50 at 32 and at the batch of 8 that bench/RESULTS.md's CPU
  // training runs use.
  const Shape shapes[] = {
      {"resnet20", 128, 16, 32}, {"resnet20", 128, 32, 16}, {"resnet20", 128, 64, 8},
      {"resnet50", 32, 64, 56},  {"resnet50", 32, 256, 14}, {"resnet50", 32, 512, 7},
      {"resnet50", 32, 2048, 7}, {"resnet50", 8, 64, 56},   {"resnet50", 8, 256, 56},
      {"resnet50", 8, 512, 28},  {"resnet50", 8, 1024, 14}, {"resnet50", 8, 2048, 7}};
  for (const Shape& s : shapes) {
    run<float>(s, "fp32", reps, from_memory);
    run<Bf16Bits>(s, "bf16", reps, from_memory);
  }
  return 0;
}
