// bench_conv_algorithm: CpuBackend's fp32 conv2d per direction (forward, backward-data,
// backward-weights), each call as the trainer makes it: nhwc activations and OIHW weights in, so a
// blocked layout's time includes the reorders of its activations to and from oneDNN's blocked
// layout and the weight reorders. Two comparisons, the measurements behind the static rules in
// plugins/backend_cpu/cpu_conv_algorithm.h:
// - `--compare winograd` (default): the direct convolution (conv_algorithm = direct, as the trainer
//   runs it) against Winograd F(4,3) on 3x3 stride-1 shapes. The Winograd backend is
//   ConvAlgorithm::winograd_everywhere, which skips the rule, so shapes the rule leaves direct are
//   timed too.
// - `--compare blocked`: the direct convolution in nhwc (ConvAlgorithm::direct_nhwc) against the
//   same in oneDNN's blocked layout (ConvAlgorithm::blocked_everywhere) on 3x3 shapes, strided
//   ones included.
// `--shapes resnet20` (default): ResNet-20's stride-1 stages and the neighbours that place the
// Winograd threshold; `--shapes resnet50`: ResNet-50's 3x3 convolutions, stride 1 and 2.
//
// Usage: bench_conv_algorithm [--threads N] [--reps R] [--batch N] [--compare winograd|blocked]
//                             [--shapes resnet20|resnet50]
// Per shape and direction: 2 warm-up calls, then R (15) calls; the fastest call in ms (on a
// shared machine the fastest call is the best estimate of what the code does with the cores to
// itself) and oneDNN's implementation name.
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
#include "cpu_backend.h"

namespace {

using mixtrain::bench::best_ms;
using mixtrain::backend_cpu::Bf16ConvPath;
using mixtrain::backend_cpu::Bf16GemmPath;
using mixtrain::backend_cpu::ConvAlgorithm;
using mixtrain::backend_cpu::CpuBackend;
using mixtrain::sdk::Conv2dGeometry;
using mixtrain::sdk::DType;
using mixtrain::sdk::Shape;
using mixtrain::sdk::TensorView;

struct Tensors {
  CpuBackend& be;
  std::vector<void*> owned;
  TensorView make(Shape shape, unsigned seed) {
    TensorView v{nullptr, DType::fp32, shape};
    v.data = be.allocate(v.bytes());
    owned.push_back(v.data);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto* p = v.as<float>();
    for (std::int64_t i = 0; i < v.numel(); ++i) p[i] = u(rng);
    return v;
  }
  ~Tensors() {
    for (void* p : owned) be.deallocate(p);
  }
};

struct Times {
  double fwd, bwd_d, bwd_w;
  std::string impl_fwd, impl_bwd_d, impl_bwd_w;
};

Times run(CpuBackend& be, const Conv2dGeometry& g, int reps) {
  Tensors t{be, {}};
  const TensorView x = t.make(Shape{g.batch, g.height, g.width, g.in_channels}, 1);
  const TensorView w = t.make(Shape{g.out_channels, g.in_channels, 3, 3}, 2);
  const TensorView y = t.make(Shape{g.batch, g.out_height(), g.out_width(), g.out_channels}, 3);
  const TensorView dy = t.make(Shape{g.batch, g.out_height(), g.out_width(), g.out_channels}, 4);
  const TensorView dx = t.make(Shape{g.batch, g.height, g.width, g.in_channels}, 5);
  const TensorView dw = t.make(Shape{g.out_channels, g.in_channels, 3, 3}, 6);
  // ResNet-20's convolutions have no bias (batch norm follows); the backward-weights call
  // accumulates as the trainer's does not: plain overwrite.
  mixtrain::sdk::Conv2dForwardArgs f;
  f.geometry = g;
  f.x.view = x;
  f.w.view = w;
  f.y = y;
  mixtrain::sdk::Conv2dBackwardDataArgs bd;
  bd.geometry = g;
  bd.dy.view = dy;
  bd.w.view = w;
  bd.dx = dx;
  mixtrain::sdk::Conv2dBackwardWeightsArgs bw;
  bw.geometry = g;
  bw.x.view = x;
  bw.dy.view = dy;
  bw.dw = dw;
  Times r{};
  r.fwd = best_ms(
      [&] { mixtrain::sdk::facet<mixtrain::sdk::ConvolutionFacet>(be)->conv2d_forward(f); }, reps);
  r.impl_fwd = be.last_conv_implementation();
  r.bwd_d = best_ms(
      [&] { mixtrain::sdk::facet<mixtrain::sdk::ConvolutionFacet>(be)->conv2d_backward_data(bd); },
      reps);
  r.impl_bwd_d = be.last_conv_implementation();
  r.bwd_w = best_ms(
      [&] {
        mixtrain::sdk::facet<mixtrain::sdk::ConvolutionFacet>(be)->conv2d_backward_weights(bw);
      },
      reps);
  r.impl_bwd_w = be.last_conv_implementation();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CpuBackend's conv2d, direct against Winograd or oneDNN's blocked layout"};
  int threads = 2, reps = 15;
  std::int64_t batch = 128;
  std::string compare = "winograd", shapes = "resnet20";
  app.add_option("--threads", threads, "CPU backend threads")->check(CLI::Range(1, 1024));
  app.add_option("--reps", reps, "timed calls per case")->check(CLI::Range(1, 100000));
  app.add_option("--batch", batch, "N, images")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{65536}));
  app.add_option("--compare", compare, "the algorithm set against the direct convolution")
      ->check(CLI::IsMember({"winograd", "blocked"}));
  app.add_option("--shapes", shapes, "the network whose 3x3 shapes run")
      ->check(CLI::IsMember({"resnet20", "resnet50"}));
  CLI11_PARSE(app, argc, argv);
  const bool blocked = compare == "blocked";
  CpuBackend base(threads, Bf16GemmPath::automatic, Bf16ConvPath::automatic,
                  blocked ? ConvAlgorithm::direct_nhwc : ConvAlgorithm::direct);
  CpuBackend other(
      threads, Bf16GemmPath::automatic, Bf16ConvPath::automatic,
      blocked ? ConvAlgorithm::blocked_everywhere : ConvAlgorithm::winograd_everywhere);
  std::printf("# %s\n# threads %d, batch %lld, best of %d, ms per call (%s)\n",
              other.conv_algorithm_note().c_str(), threads, static_cast<long long>(batch), reps,
              blocked ? "nhwc / blocked" : "direct / winograd");
  std::printf("# %-20s %-20s %-20s %-20s\n", "C->O HxW stride", "forward", "backward-data",
              "backward-weights");
  struct S {
    std::int64_t c, o, hw, stride;
  };
  // ResNet-20's three stride-1 stages, then the neighbours that place the Winograd threshold; or
  // ResNet-50's 3x3 convolutions.
  const std::vector<S> resnet20 = {S{16, 16, 32, 1},  S{32, 32, 16, 1}, S{64, 64, 8, 1},
                                   S{16, 32, 32, 1},  S{32, 16, 32, 1}, S{16, 16, 16, 1},
                                   S{32, 32, 8, 1},   S{32, 32, 32, 1}, S{64, 64, 16, 1},
                                   S{128, 128, 8, 1}, S{128, 128, 4, 1}};
  const std::vector<S> resnet50 = {S{64, 64, 56, 1},   S{128, 128, 56, 2}, S{128, 128, 28, 1},
                                   S{256, 256, 28, 2}, S{256, 256, 14, 1}, S{512, 512, 14, 2},
                                   S{512, 512, 7, 1}};
  for (const S s : shapes == "resnet20" ? resnet20 : resnet50) {
    Conv2dGeometry g;
    g.batch = batch;
    g.in_channels = s.c;
    g.out_channels = s.o;
    g.height = g.width = s.hw;
    g.kernel_h = g.kernel_w = 3;
    g.stride_h = g.stride_w = s.stride;
    g.pad_h = g.pad_w = 1;
    const Times a = run(base, g, reps), b = run(other, g, reps);
    std::printf(
        "  %3lld->%-3lld %3lldx%-3lld %lld  %6.2f / %6.2f       %6.2f / %6.2f       %6.2f / "
        "%6.2f\n",
        static_cast<long long>(s.c), static_cast<long long>(s.o), static_cast<long long>(s.hw),
        static_cast<long long>(s.hw), static_cast<long long>(s.stride), a.fwd, b.fwd, a.bwd_d,
        b.bwd_d, a.bwd_w, b.bwd_w);
    std::printf("    %s route: %s | %s | %s\n", compare.c_str(), b.impl_fwd.c_str(),
                b.impl_bwd_d.c_str(), b.impl_bwd_w.c_str());
  }
  return 0;
}
