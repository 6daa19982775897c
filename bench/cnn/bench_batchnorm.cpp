// bench_batchnorm: the CPU backend's per-channel batch-norm kernels (cpu_batchnorm_kernels.h) on
// ResNet-20's and ResNet-50's shapes: the training forward's statistics, the forward's affine
// (+ ReLU), the backward's two sums Σg and Σg·(x − mean), and the backward's dx, in fp32 and bf16
// storage. The measurement behind the accumulation the backward's sums use (bench/RESULTS.md).
//
// Usage: bench_batchnorm [--threads N] [--reps R]
// Per shape and kernel: 2 warm-up calls, then R (30) calls; the fastest call in ms (on a shared
// machine the fastest call is the best estimate of what the code does with the cores to itself).
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

template <class T>
void run(const Shape& s, const char* dtype, int reps) {
  const std::int64_t rows = s.batch * s.size * s.size, c = s.channels;
  const auto n = static_cast<std::size_t>(rows * c);
  auto x = random_values<T>(n, 1), dy = random_values<T>(n, 2);
  std::vector<T> y(n), dx(n);
  std::vector<float> mean(c), var(c), scale(c, 1.0f), shift(c, 0.1f), ka(c, 1.0f), kb(c, 0.5f),
      kd(c, 0.25f);
  std::vector<double> sum_g(c), sum_gx(c);
  ReluMask mask;
  mask.kind = ReluMask::Kind::recompute;
  mask.scale = scale.data();
  mask.shift = shift.data();
  using namespace mixtrain::backend_cpu;
  const double stats =
      best_ms([&] { channel_moments(x.data(), rows, c, mean.data(), var.data()); }, reps);
  const double affine = best_ms(
      [&] {
        channel_affine(x.data(), y.data(), rows, c, mean.data(), scale.data(), shift.data(), true);
      },
      reps);
  const double sums = best_ms(
      [&] {
        channel_grad_sums(x.data(), dy.data(), mask, rows, c, mean.data(), sum_g.data(),
                          sum_gx.data());
      },
      reps);
  const double input = best_ms(
      [&] {
        channel_grad_input(x.data(), dy.data(), mask, dx.data(), rows, c, mean.data(), ka.data(),
                           kb.data(), kd.data());
      },
      reps);
  std::printf("%-9s %4lld %5lld %3lldx%-3lld %-5s %8.3f %8.3f %8.3f %8.3f\n", s.net,
              static_cast<long long>(s.batch), static_cast<long long>(c),
              static_cast<long long>(s.size), static_cast<long long>(s.size), dtype, stats, affine,
              sums, input);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the CPU backend's batch-norm kernels on ResNet-20's and ResNet-50's shapes"};
  int threads = 2, reps = 30;
  app.add_option("--threads", threads, "OpenMP threads")->check(CLI::Range(1, 1024));
  app.add_option("--reps", reps, "timed calls per case")->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);
  omp_set_num_threads(threads);
  std::printf("threads %d, best of %d calls, ms\n", threads, reps);
  std::printf("%-9s %4s %5s %7s %-5s %8s %8s %8s %8s\n", "net", "N", "C", "HxW", "dtype", "stats",
              "affine", "sums", "dx");
  const Shape shapes[] = {{"resnet20", 128, 16, 32}, {"resnet20", 128, 32, 16},
                          {"resnet20", 128, 64, 8},  {"resnet50", 32, 64, 56},
                          {"resnet50", 32, 256, 14}, {"resnet50", 32, 512, 7},
                          {"resnet50", 32, 2048, 7}};
  for (const Shape& s : shapes) {
    run<float>(s, "fp32", reps);
    run<Bf16Bits>(s, "bf16", reps);
  }
  return 0;
}
