// bench_max_pool: the CPU backend's max pooling (cpu_max_pool.h) on ResNet's stem pool (3×3, stride
// 2, pad 1 over 112×112×64 maps), forward with its index workspace and backward through it, against
// oneDNN 2.6's pooling on the same tensors (what the backend ran before session 68), fp32 and bf16.
// Operands rotate over `--sets` copies (default 6), so that they come from memory as in training;
// --sets 1 keeps them in the cache.
//
// Usage: bench_max_pool [--batch N] [--threads T] [--reps R] [--sets S]
// Per case: 2 warm-up calls, then R (20) calls; the fastest call in ms.
#include <omp.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "../support/best_call_time.h"
#include "../support/cpu_arena.h"
#include "cpu_backend.h"
#include "cpu_max_pool.h"

namespace {

using mixtrain::backend_cpu::CpuBackend;
using mixtrain::bench::Arena;
using mixtrain::bench::best_ms;
using mixtrain::sdk::DType;
using mixtrain::sdk::Pool2dGeometry;
using mixtrain::sdk::Shape;
using mixtrain::sdk::TensorView;

// One set of a call's operands, the workspace sized for both oneDNN's u8 indices and the loops'.
struct Operands {
  TensorView x, y, dy, dx, ws;
};

void run(CpuBackend& be, const Pool2dGeometry& g, DType dt, int reps, int sets) {
  const Shape x_shape{g.batch, g.height, g.width, g.channels};
  const Shape y_shape{g.batch, g.out_height(), g.out_width(), g.channels};
  const auto ws_bytes = std::max(mixtrain::backend_cpu::max_pool_workspace_bytes(g),
                                 static_cast<std::size_t>(y_shape.numel()));
  const Shape ws_shape{static_cast<std::int64_t>((ws_bytes + 3) / 4)};
  Arena a(be);
  std::vector<Operands> b;
  for (int i = 0; i < sets; ++i) {
    const auto k = static_cast<unsigned>(i);
    b.push_back({a.make(dt, x_shape, 1u + k), a.make(dt, y_shape, 200u + k),
                 a.make(dt, y_shape, 100u + k), a.make(dt, x_shape, 300u + k),
                 a.make(DType::fp32, ws_shape, 400u + k)});
    // Indices of window position 0 until a forward writes the set's own (a backward may run on
    // a set no forward has yet: oneDNN's would follow any other bits out of the window).
    be.fill(b.back().ws, 0.0f);
  }
  int at = 0;
  const double own_fwd = best_ms(
      [&] {
        auto& s = b[static_cast<std::size_t>(at++ % sets)];
        mixtrain::backend_cpu::max_pool_forward(g, s.x, s.y, s.ws.data);
      },
      reps);
  const double own_bwd = best_ms(
      [&] {
        auto& s = b[static_cast<std::size_t>(at++ % sets)];
        mixtrain::backend_cpu::max_pool_backward(g, s.dy, s.ws.data, s.dx);
      },
      reps);

  // oneDNN's pooling, nhwc, its u8 workspace.
  using dnnl::memory;
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const auto t = dt == DType::fp32 ? memory::data_type::f32 : memory::data_type::bf16;
  const memory::desc x_md({g.batch, g.channels, g.height, g.width}, t, memory::format_tag::nhwc);
  const memory::desc y_md({g.batch, g.channels, g.out_height(), g.out_width()}, t,
                          memory::format_tag::nhwc);
  const memory::dims strides{g.stride_h, g.stride_w}, kernel{g.kernel_h, g.kernel_w},
      pad{g.pad_h, g.pad_w};
  const dnnl::pooling_forward::primitive_desc fpd(
      {dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max, x_md, y_md, strides, kernel,
       pad, pad},
      eng);
  const dnnl::pooling_backward::primitive_desc bpd(
      {dnnl::algorithm::pooling_max, x_md, y_md, strides, kernel, pad, pad}, eng, fpd);
  const dnnl::pooling_forward fwd(fpd);
  const dnnl::pooling_backward bwd(bpd);
  const double dnnl_fwd = best_ms(
      [&] {
        auto& s = b[static_cast<std::size_t>(at++ % sets)];
        fwd.execute(stream, {{DNNL_ARG_SRC, memory(x_md, eng, s.x.data)},
                             {DNNL_ARG_DST, memory(y_md, eng, s.y.data)},
                             {DNNL_ARG_WORKSPACE, memory(fpd.workspace_desc(), eng, s.ws.data)}});
        stream.wait();
      },
      reps);
  const double dnnl_bwd = best_ms(
      [&] {
        auto& s = b[static_cast<std::size_t>(at++ % sets)];
        bwd.execute(stream, {{DNNL_ARG_DIFF_DST, memory(y_md, eng, s.dy.data)},
                             {DNNL_ARG_DIFF_SRC, memory(x_md, eng, s.dx.data)},
                             {DNNL_ARG_WORKSPACE, memory(fpd.workspace_desc(), eng, s.ws.data)}});
        stream.wait();
      },
      reps);
  std::printf("%5lld %4lld %3lldx%-3lld %-5s %9.3f %9.3f %9.3f %9.3f  (%s)\n",
              static_cast<long long>(g.batch), static_cast<long long>(g.channels),
              static_cast<long long>(g.height), static_cast<long long>(g.width),
              dt == DType::fp32 ? "fp32" : "bf16", own_fwd, own_bwd, dnnl_fwd, dnnl_bwd,
              fpd.impl_info_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the CPU backend's max pooling on ResNet's stem pool against oneDNN's pooling"};
  int threads = 2, reps = 20, sets = 6;
  std::int64_t batch = 8;
  app.add_option("--batch", batch, "N, images")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{4096}));
  app.add_option("--threads", threads, "OpenMP threads")->check(CLI::Range(1, 1024));
  app.add_option("--reps", reps, "timed calls per case")->check(CLI::Range(1, 100000));
  app.add_option("--sets", sets, "operand copies the calls rotate over (1: in the cache)")
      ->check(CLI::Range(1, 64));
  CLI11_PARSE(app, argc, argv);
  omp_set_num_threads(threads);
  CpuBackend be(threads);  // the operands' memory (bench/support/cpu_arena.h)
  std::printf("threads %d, best of %d calls over %d operand sets, ms\n", threads, reps, sets);
  std::printf("    N    C  HxW     dtype  own fwd   own bwd  oneDNN fwd oneDNN bwd\n");
  Pool2dGeometry g;
  g.kind = mixtrain::sdk::PoolKind::max;
  g.batch = batch;
  g.channels = 64;
  g.height = g.width = 112;
  g.kernel_h = g.kernel_w = 3;
  g.stride_h = g.stride_w = 2;
  g.pad_h = g.pad_w = 1;
  for (DType dt : {DType::fp32, DType::bf16}) run(be, g, dt, reps, sets);
  return 0;
}
