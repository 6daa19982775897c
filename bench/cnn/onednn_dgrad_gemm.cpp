// Times ResNet-50's convolutions (224x224, batch 8, bf16 operands, nhwc) in oneDNN's convolution
// primitives against the same sums as oneDNN matmuls, for the directions session 63's
// onednn_wgrad_gemm.cpp left out:
// - the data gradient of the 1x1s, dx [N·H·W, C] = dy [N·OH·OW, O] · w [O, C], an fp32 or bf16
//   dx; past stride 1 the matmul's rows are then added to every stride-th pixel of dx (timed
//   apart), which is what cpu_conv_gemm.h's data_gradient_as_gemm does;
// - the forward of the 1x1s (y = x · wᵀ) and of the 3x3s (x's pixels gathered first, im2col);
// - the data gradient of the 3x3s (the matmul into columns, then a col2im that adds each tap).
// Best of 7 calls after 2 warm-ups, milliseconds (TFLOP/s), with oneDNN's implementation names;
// operands filled (onednn_aid.h). What cpu_conv_algorithm.h's data-gradient rule was decided
// from (bench/RESULTS.md, session 65).
// Not part of the CMake build (a measurement aid; oneDNN 2.6's API):
//   g++ -O2 -fopenmp -std=c++17 bench/cnn/onednn_dgrad_gemm.cpp -ldnnl -o /tmp/dgrad_gemm
//   OMP_NUM_THREADS=2 /tmp/dgrad_gemm
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "onednn_aid.h"

using namespace dnnl;
using onednn_aid::best_ms;
using onednn_aid::dt;
using onednn_aid::tag;
using onednn_aid::Timed;

namespace {

constexpr int kBatch = 8;

struct Shape {
  int c, h, o, k, stride;
};

int out_size(const Shape& g) {
  return (g.h + 2 * (g.k / 2) - g.k) / g.stride + 1;
}

const char* name(dt t) {
  return t == dt::f32 ? "f32" : "bf16";
}

void pointwise_data_gradient(engine& eng, stream& s, const Shape& g, dt dx_type) {
  const int oh = out_size(g), m = kBatch * oh * oh;
  const double flops = 2.0 * m * g.o * g.c;
  memory dy, z;
  const Timed conv =
      onednn_aid::time_backward_data(eng, s, kBatch, g.c, g.h, g.o, 1, g.stride, dx_type, dy);
  // The matmul into fp32 [M, C] (dx itself at stride 1), then the strided write past it.
  const Timed mm = onednn_aid::time_matmul(
      eng, s, {{m, g.o}, dt::bf16, tag::ab}, {{g.o, g.c}, dt::bf16, tag::ab},
      {{m, g.c}, g.stride == 1 ? dx_type : dt::f32, tag::ab}, dy.get_data_handle(), z);
  double t_write = 0.0;
  if (g.stride > 1) {
    std::vector<float> sum(static_cast<std::size_t>(kBatch) * g.h * g.h * g.c, 0.0f);
    const auto* product = static_cast<const float*>(z.get_data_handle());
    t_write = best_ms([&] {
#pragma omp parallel for
      for (int r = 0; r < kBatch * g.h; ++r) {
        const int n = r / g.h, h = r % g.h;
        if (h % g.stride != 0) continue;
        for (int x = 0; x < g.h; x += g.stride) {
          const float* from =
              product + (static_cast<std::size_t>(n * oh + h / g.stride) * oh + x / g.stride) * g.c;
          float* to = sum.data() + (static_cast<std::size_t>(r) * g.h + x) * g.c;
          for (int k = 0; k < g.c; ++k) to[k] += from[k];
        }
      }
    });
  }
  std::printf(
      "dgrad 1x1 %5d->%-5d %3dx%-3d /%d dx %-4s  conv %7.3f (%.2f) [%s]  matmul %7.3f + "
      "%.3f (%.2f) [%s]\n",
      g.c, g.o, g.h, g.h, g.stride, name(dx_type), conv.ms, flops / conv.ms / 1e9,
      conv.implementation.c_str(), mm.ms, t_write, flops / (mm.ms + t_write) / 1e9,
      mm.implementation.c_str());
}

void forward(engine& eng, stream& s, const Shape& g) {
  const int pad = g.k / 2, oh = out_size(g), m = kBatch * oh * oh, kc = g.k * g.k * g.c;
  const double flops = 2.0 * m * g.o * kc;
  const memory::desc x_md({kBatch, g.c, g.h, g.h}, dt::bf16, tag::nhwc),
      w_md({g.o, g.c, g.k, g.k}, dt::bf16, tag::any),
      y_md({kBatch, g.o, oh, oh}, dt::f32, tag::nhwc);
  const auto fwd = onednn_aid::forward_convolution(eng, x_md, w_md, y_md, g.stride, pad);
  memory x(fwd.src_desc(), eng), w(fwd.weights_desc(), eng), y(fwd.dst_desc(), eng);
  onednn_aid::fill_bf16(x);
  onednn_aid::fill_bf16(w);
  convolution_forward conv(fwd);
  const double t_conv = onednn_aid::best_call_ms(
      conv, s, {{DNNL_ARG_SRC, x}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, y}});
  const bool gather = g.k != 1 || g.stride != 1;
  std::vector<std::uint16_t> cols(gather ? static_cast<std::size_t>(m) * kc : 0);
  const auto* xs = static_cast<const std::uint16_t*>(x.get_data_handle());
  const double t_gather = !gather ? 0.0 : best_ms([&] {
#pragma omp parallel for
    for (int r = 0; r < kBatch * oh; ++r) {
      const int n = r / oh, i = r % oh;
      for (int j = 0; j < oh; ++j)
        for (int kh = 0; kh < g.k; ++kh)
          for (int kw = 0; kw < g.k; ++kw) {
            std::uint16_t* to =
                cols.data() + (static_cast<std::size_t>(r) * oh + j) * kc + (kh * g.k + kw) * g.c;
            const int h = i * g.stride - pad + kh, ww = j * g.stride - pad + kw;
            if (h < 0 || h >= g.h || ww < 0 || ww >= g.h)
              std::memset(to, 0, g.c * 2);
            else
              std::memcpy(to, xs + (static_cast<std::size_t>(n * g.h + h) * g.h + ww) * g.c,
                          g.c * 2);
          }
    }
  });
  memory z;
  const Timed mm =
      onednn_aid::time_matmul(eng, s, {{m, kc}, dt::bf16, tag::ab}, {{kc, g.o}, dt::bf16, tag::ba},
                              {{m, g.o}, dt::f32, tag::ab},
                              gather ? static_cast<void*>(cols.data()) : x.get_data_handle(), z);
  std::printf(
      "forward %dx%d %5d->%-5d %3dx%-3d /%d  conv %7.3f (%.2f) [%s]  gather + matmul %.3f + "
      "%7.3f (%.2f) [%s]\n",
      g.k, g.k, g.c, g.o, g.h, g.h, g.stride, t_conv, flops / t_conv / 1e9, fwd.impl_info_str(),
      t_gather, mm.ms, flops / (t_gather + mm.ms) / 1e9, mm.implementation.c_str());
}

void data_gradient_3x3(engine& eng, stream& s, const Shape& g) {
  const int pad = 1, oh = out_size(g), m = kBatch * oh * oh, kc = 9 * g.c;
  const double flops = 2.0 * m * g.o * kc;
  memory dy, z;
  const Timed conv =
      onednn_aid::time_backward_data(eng, s, kBatch, g.c, g.h, g.o, 3, g.stride, dt::f32, dy);
  const Timed mm =
      onednn_aid::time_matmul(eng, s, {{m, g.o}, dt::bf16, tag::ab}, {{g.o, kc}, dt::bf16, tag::ab},
                              {{m, kc}, dt::f32, tag::ab}, dy.get_data_handle(), z);
  std::vector<float> dx(static_cast<std::size_t>(kBatch) * g.h * g.h * g.c);
  const auto* columns = static_cast<const float*>(z.get_data_handle());
  const double t_col2im = best_ms([&] {
#pragma omp parallel for
    for (int n = 0; n < kBatch; ++n) {
      float* image = dx.data() + static_cast<std::size_t>(n) * g.h * g.h * g.c;
      std::memset(image, 0, static_cast<std::size_t>(g.h) * g.h * g.c * 4);
      for (int i = 0; i < oh; ++i)
        for (int j = 0; j < oh; ++j)
          for (int kh = 0; kh < 3; ++kh)
            for (int kw = 0; kw < 3; ++kw) {
              const int h = i * g.stride - pad + kh, ww = j * g.stride - pad + kw;
              if (h < 0 || h >= g.h || ww < 0 || ww >= g.h) continue;
              float* to = image + (static_cast<std::size_t>(h) * g.h + ww) * g.c;
              const float* from = columns + (static_cast<std::size_t>(n * oh + i) * oh + j) * kc +
                                  (kh * 3 + kw) * g.c;
              for (int k = 0; k < g.c; ++k) to[k] += from[k];
            }
    }
  });
  std::printf(
      "dgrad 3x3 %5d->%-5d %3dx%-3d /%d  conv %7.3f (%.2f) [%s]  matmul + col2im %7.3f + "
      "%.3f (%.2f) [%s]\n",
      g.c, g.o, g.h, g.h, g.stride, conv.ms, flops / conv.ms / 1e9, conv.implementation.c_str(),
      mm.ms, t_col2im, flops / (mm.ms + t_col2im) / 1e9, mm.implementation.c_str());
}

}  // namespace

int main() {
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  // ResNet-50's 1x1s: each Bottleneck's conv1 and conv3 (stride 1) and the downsampling
  // shortcuts (stride 1 in layer1, 2 after); its 3x3s.
  const Shape pointwise[] = {{64, 56, 256, 1, 1},   {256, 56, 64, 1, 1},   {128, 28, 512, 1, 1},
                             {512, 28, 128, 1, 1},  {256, 14, 1024, 1, 1}, {1024, 14, 256, 1, 1},
                             {512, 7, 2048, 1, 1},  {2048, 7, 512, 1, 1},  {256, 56, 512, 1, 2},
                             {512, 28, 1024, 1, 2}, {1024, 14, 2048, 1, 2}};
  const Shape three[] = {{64, 56, 64, 3, 1},   {128, 56, 128, 3, 2}, {128, 28, 128, 3, 1},
                         {256, 28, 256, 3, 2}, {256, 14, 256, 3, 1}, {512, 14, 512, 3, 2},
                         {512, 7, 512, 3, 1}};
  for (const Shape& g : pointwise) pointwise_data_gradient(eng, s, g, dt::f32);
  for (const Shape& g : pointwise)
    if (g.stride > 1) pointwise_data_gradient(eng, s, g, dt::bf16);
  for (const Shape& g : pointwise) forward(eng, s, g);
  for (const Shape& g : three) forward(eng, s, g);
  for (const Shape& g : three) data_gradient_3x3(eng, s, g);
  return 0;
}
