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
#include <chrono>
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

// The data gradient of a 3x3, stride-2, pad-1 convolution over an even map by dx's parity
// classes: the pixels (2a + ph, 2b + pw) of class (ph, pw) take the kernel rows kh = 1 (ph = 0)
// or kh = 0, 2 (ph = 1, from dy rows a + 1 and a), the columns alike, so each class is one
// matmul of dy's pixels gathered per tap, [N·OH·OW, taps·O], by the taps' weights [taps·O, C]
// into fp32 rows, then written to its pixels of dx (the classes' pixels are disjoint: no adds).
void data_gradient_3x3_parity(engine& eng, stream& s, const Shape& g) {
  const int oh = out_size(g), m = kBatch * oh * oh;
  const double flops = 2.0 * m * g.o * 9.0 * g.c;
  memory dy_conv;
  const Timed conv =
      onednn_aid::time_backward_data(eng, s, kBatch, g.c, g.h, g.o, 3, g.stride, dt::f32, dy_conv);
  // dy [N, OH, OW, O] and w [O, 3, 3, C] (OHWI), filled.
  memory dy(memory::desc({m, g.o}, dt::bf16, tag::ab), eng),
      w(memory::desc({g.o, 9 * g.c}, dt::bf16, tag::ab), eng);
  onednn_aid::fill_bf16(dy);
  onednn_aid::fill_bf16(w);
  const auto* dys = static_cast<const std::uint16_t*>(dy.get_data_handle());
  const auto* ws = static_cast<const std::uint16_t*>(w.get_data_handle());
  struct Tap {
    int k, d;  // kernel row (column), dy row (column) offset
  };
  const std::vector<Tap> taps_of[2] = {{{1, 0}}, {{0, 1}, {2, 0}}};
  std::vector<std::vector<std::uint16_t>> a(4), b(4);
  std::vector<memory> out(4);
  std::vector<matmul> mms;
  for (int cls = 0; cls < 4; ++cls) {
    const int t = static_cast<int>(taps_of[cls / 2].size() * taps_of[cls % 2].size());
    a[cls].resize(static_cast<std::size_t>(m) * t * g.o);
    b[cls].resize(static_cast<std::size_t>(t) * g.o * g.c);
    const memory::desc a_md({m, t * g.o}, dt::bf16, tag::ab), b_md({t * g.o, g.c}, dt::bf16, tag::ab),
        c_md({m, g.c}, dt::f32, tag::ab);
    mms.emplace_back(matmul::primitive_desc({a_md, b_md, c_md}, eng));
    out[cls] = memory(c_md, eng);
  }
  std::vector<float> dx(static_cast<std::size_t>(kBatch) * g.h * g.h * g.c);
  double t_gather = 0, t_mm = 0, t_write = 0;
  const double total = onednn_aid::best_ms([&] {
    auto t0 = std::chrono::steady_clock::now();
    for (int cls = 0; cls < 4; ++cls) {
      const auto& rt = taps_of[cls / 2];
      const auto& ct = taps_of[cls % 2];
      const int t = static_cast<int>(rt.size() * ct.size());
      std::uint16_t* ac = a[cls].data();
#pragma omp parallel for
      for (int r = 0; r < m; ++r) {
        const int n = r / (oh * oh), i = (r / oh) % oh, j = r % oh;
        std::uint16_t* to = ac + static_cast<std::size_t>(r) * t * g.o;
        for (const Tap& x : rt)
          for (const Tap& y : ct) {
            const int ii = i + x.d, jj = j + y.d;
            if (ii >= oh || jj >= oh)
              std::memset(to, 0, g.o * 2);
            else
              std::memcpy(to, dys + (static_cast<std::size_t>(n * oh + ii) * oh + jj) * g.o, g.o * 2);
            to += g.o;
          }
      }
      std::uint16_t* bc = b[cls].data();
      int row = 0;
      for (const Tap& x : rt)
        for (const Tap& y : ct) {
#pragma omp parallel for
          for (int o = 0; o < g.o; ++o)
            std::memcpy(bc + static_cast<std::size_t>(row + o) * g.c,
                        ws + static_cast<std::size_t>(o) * 9 * g.c + (x.k * 3 + y.k) * g.c, g.c * 2);
          row += g.o;
        }
    }
    auto t1 = std::chrono::steady_clock::now();
    for (int cls = 0; cls < 4; ++cls) {
      const int t = static_cast<int>(taps_of[cls / 2].size() * taps_of[cls % 2].size());
      memory am(memory::desc({m, t * g.o}, dt::bf16, tag::ab), eng, a[cls].data()),
          bm(memory::desc({t * g.o, g.c}, dt::bf16, tag::ab), eng, b[cls].data());
      mms[cls].execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, out[cls]}});
    }
    s.wait();
    auto t2 = std::chrono::steady_clock::now();
    for (int cls = 0; cls < 4; ++cls) {
      const int ph = cls / 2, pw = cls % 2;
      const auto* z = static_cast<const float*>(out[cls].get_data_handle());
#pragma omp parallel for
      for (int r = 0; r < m; ++r) {
        const int n = r / (oh * oh), i = (r / oh) % oh, j = r % oh;
        std::memcpy(dx.data() + (static_cast<std::size_t>(n * g.h + 2 * i + ph) * g.h + 2 * j + pw) * g.c,
                    z + static_cast<std::size_t>(r) * g.c, g.c * 4);
      }
    }
    auto t3 = std::chrono::steady_clock::now();
    t_gather = std::chrono::duration<double, std::milli>(t1 - t0).count();
    t_mm = std::chrono::duration<double, std::milli>(t2 - t1).count();
    t_write = std::chrono::duration<double, std::milli>(t3 - t2).count();
  });
  std::printf(
      "dgrad 3x3 %5d->%-5d %3dx%-3d /%d  conv %7.3f (%.2f)  parity classes %7.3f (%.2f): gathers "
      "%.3f, matmuls %.3f, writes %.3f (the last call's)\n",
      g.c, g.o, g.h, g.h, g.stride, conv.ms, flops / conv.ms / 1e9, total, flops / total / 1e9,
      t_gather, t_mm, t_write);
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
  for (const Shape& g : three)
    if (g.stride == 2) data_gradient_3x3_parity(eng, s, g);
  return 0;
}
