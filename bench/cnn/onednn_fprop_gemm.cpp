// Times what a training step pays for ResNet-50's convolutions around oneDNN's primitives, for
// the CPU backend's conv_gemm rule (plugins/backend_cpu/cpu_conv_gemm_rule.h; bench/RESULTS.md,
// session 67):
// - the forward of the 1x1s as oneDNN's convolution with the reorder of the caller's OIHW weights
//   into the primitive's blocked layout that every training call makes (the weights change every
//   step), against one matmul reading w [O, C] transposed where it is (past stride 1 after a
//   gather of the strided pixels); session 65's onednn_dgrad_gemm.cpp timed the convolution with
//   its weights already blocked;
// - a 3x3 weight gradient's two column orders: (kh, kw, c), a copy of whole pixels, whose fp32
//   product [O, KH, KW, C] is then reordered into OIHW, against (c, kh, kw), written an element at
//   a time, whose product is OIHW itself.
// Operands are rotated over `sets` copies (default 60), so that they come from memory as in
// training rather than from the cache. Best of 7 calls after 2 warm-ups, milliseconds.
// Not part of the CMake build (a measurement aid; oneDNN 2.6's API):
//   g++ -O2 -fopenmp -std=c++17 bench/cnn/onednn_fprop_gemm.cpp -ldnnl -o /tmp/fprop_gemm
//   OMP_NUM_THREADS=2 /tmp/fprop_gemm [batch ...]          (default: 8 16 32)
//   SETS=6 OMP_NUM_THREADS=2 /tmp/fprop_gemm 8             (operands held by the cache)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "onednn_aid.h"

using namespace dnnl;
using onednn_aid::best_ms;
using onednn_aid::dt;
using onednn_aid::tag;

namespace {

struct Shape {
  int c, o, h, k, stride;
};

int out_size(const Shape& g) {
  return (g.h + 2 * (g.k / 2) - g.k) / g.stride + 1;
}

// cols [N·OH·OW, K·K·C] of bf16 x [N, H, W, C]: each output pixel's taps, in (kh, kw, c) order
// (whole pixels copied) or (c, kh, kw) (one element at a time), zeros in the padding.
void gather(const std::uint16_t* x, std::uint16_t* cols, int n, const Shape& g,
            bool channel_major) {
  const int pad = g.k / 2, oh = out_size(g), taps = g.k * g.k;
  const std::size_t row = static_cast<std::size_t>(taps) * g.c;
#pragma omp parallel for
  for (int r = 0; r < n * oh; ++r) {
    const int b = r / oh, i = r % oh;
    for (int j = 0; j < oh; ++j) {
      std::uint16_t* to = cols + (static_cast<std::size_t>(r) * oh + j) * row;
      for (int kh = 0; kh < g.k; ++kh)
        for (int kw = 0; kw < g.k; ++kw) {
          const int t = kh * g.k + kw, h = i * g.stride - pad + kh, w = j * g.stride - pad + kw;
          const bool in = h >= 0 && h < g.h && w >= 0 && w < g.h;
          const std::uint16_t* from = x + (static_cast<std::size_t>(b * g.h + h) * g.h + w) * g.c;
          if (!channel_major) {
            if (in)
              std::memcpy(to + t * g.c, from, g.c * 2);
            else
              std::memset(to + t * g.c, 0, g.c * 2);
          } else {
            for (int c = 0; c < g.c; ++c) to[c * taps + t] = in ? from[c] : 0;
          }
        }
    }
  }
}

void forward_1x1(engine& eng, stream& s, int n, int sets, const Shape& g) {
  const int oh = out_size(g);
  const memory::dim m = static_cast<memory::dim>(n) * oh * oh;
  const memory::desc x_md({n, g.c, g.h, g.h}, dt::bf16, tag::nhwc),
      w_any({g.o, g.c, 1, 1}, dt::bf16, tag::any), w_md({g.o, g.c, 1, 1}, dt::bf16, tag::oihw),
      y_md({n, g.o, oh, oh}, dt::bf16, tag::nhwc);
  const auto fwd = onednn_aid::forward_convolution(eng, x_md, w_any, y_md, g.stride, 0);
  convolution_forward conv(fwd);
  memory blocked(fwd.weights_desc(), eng);
  std::vector<memory> x, w, y;
  for (int i = 0; i < sets; ++i) {
    x.emplace_back(x_md, eng);
    w.emplace_back(w_md, eng);
    y.emplace_back(y_md, eng);
    onednn_aid::fill_bf16(x.back());
    onednn_aid::fill_bf16(w.back());
    onednn_aid::fill_bf16(y.back());  // touched, so that no timed call takes its page faults
  }
  reorder to_blocked(w[0], blocked);
  int at = 0;
  const double t_conv = best_ms([&] {
    at = (at + 1) % sets;
    to_blocked.execute(s, w[at], blocked);
    conv.execute(s, {{DNNL_ARG_SRC, x[at]}, {DNNL_ARG_WEIGHTS, blocked}, {DNNL_ARG_DST, y[at]}});
    s.wait();
  });
  const double t_reorder = best_ms([&] {
    at = (at + 1) % sets;
    to_blocked.execute(s, w[at], blocked);
    s.wait();
  });
  // y [M, O] = cols [M, C] · wᵀ, w [O, C] read transposed (tag ba of [C, O]).
  const memory::desc a_md({m, g.c}, dt::bf16, tag::ab), b_md({g.c, g.o}, dt::bf16, tag::ba),
      c_md({m, g.o}, dt::bf16, tag::ab);
  const matmul::primitive_desc mpd({a_md, b_md, c_md}, eng);
  matmul mm(mpd);
  const bool strided = g.stride != 1;
  std::vector<std::uint16_t> cols(strided ? static_cast<std::size_t>(m) * g.c : 0);
  const double t_gemm = best_ms([&] {
    at = (at + 1) % sets;
    void* a = x[at].get_data_handle();
    if (strided) {
      gather(static_cast<const std::uint16_t*>(a), cols.data(), n, g, false);
      a = cols.data();
    }
    mm.execute(s, {{DNNL_ARG_SRC, memory(a_md, eng, a)},
                   {DNNL_ARG_WEIGHTS, memory(b_md, eng, w[at].get_data_handle())},
                   {DNNL_ARG_DST, y[at]}});
    s.wait();
  });
  std::printf(
      "forward 1x1 %5d->%-5d %3dx%-3d /%d batch %2d  convolution + reorder %7.3f (reorder %.3f) "
      "[%s]  %sGEMM %7.3f [%s]\n",
      g.c, g.o, g.h, g.h, g.stride, n, t_conv, t_reorder, fwd.impl_info_str(),
      strided ? "gather + " : "", t_gemm, mpd.impl_info_str());
}

void wgrad_columns(engine& eng, stream& s, int n, int sets, const Shape& g) {
  const int oh = out_size(g), taps = g.k * g.k;
  const std::size_t m = static_cast<std::size_t>(n) * oh * oh;
  std::vector<std::vector<std::uint16_t>> x(static_cast<std::size_t>(sets));
  for (auto& v : x) {
    v.resize(static_cast<std::size_t>(n) * g.h * g.h * g.c);
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<std::uint16_t>(0x3f80u ^ (i & 0x7f));
  }
  std::vector<std::uint16_t> cols(m * taps * g.c, 0);
  int at = 0;
  const double t_pixels = best_ms([&] {
    at = (at + 1) % sets;
    gather(x[static_cast<std::size_t>(at)].data(), cols.data(), n, g, false);
  });
  const double t_channels = best_ms([&] {
    at = (at + 1) % sets;
    gather(x[static_cast<std::size_t>(at)].data(), cols.data(), n, g, true);
  });
  // The (kh, kw, c) order's product [O, KH, KW, C] fp32 into dw's OIHW, as the backend reorders it.
  const memory::dims dims{g.o, g.c, g.k, g.k};
  const memory::desc ohwi(dims, dt::f32, tag::ohwi), oihw(dims, dt::f32, tag::oihw);
  std::vector<memory> product;
  for (int i = 0; i < sets; ++i) {
    product.emplace_back(ohwi, eng);
    std::memset(product.back().get_data_handle(), 0, ohwi.get_size());
  }
  memory dw(oihw, eng);
  std::memset(dw.get_data_handle(), 0, oihw.get_size());
  reorder to_oihw(product[0], dw);
  const double t_reorder = best_ms([&] {
    at = (at + 1) % sets;
    to_oihw.execute(s, product[static_cast<std::size_t>(at)], dw);
    s.wait();
  });
  std::printf(
      "wgrad %dx%d %5d->%-5d %3dx%-3d /%d batch %2d  M %6zu  (kh, kw, c) gather %.3f + product "
      "reorder %.3f = %.3f   (c, kh, kw) gather %.3f\n",
      g.k, g.k, g.c, g.o, g.h, g.h, g.stride, n, m, t_pixels, t_reorder, t_pixels + t_reorder,
      t_channels);
}

}  // namespace

int main(int argc, char** argv) {
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const char* sets_env = std::getenv("SETS");
  const int sets = sets_env != nullptr ? std::atoi(sets_env) : 60;
  std::vector<int> batches;
  for (int i = 1; i < argc; ++i) batches.push_back(std::atoi(argv[i]));
  if (batches.empty()) batches = {8, 16, 32};
  // ResNet-50's 1x1 convolutions at 14x14 and 7x7 output maps, and its strided shortcuts.
  const Shape pointwise[] = {{512, 2048, 7, 1, 1},  {2048, 512, 7, 1, 1},  {1024, 512, 14, 1, 1},
                             {1024, 256, 14, 1, 1}, {256, 1024, 14, 1, 1}, {1024, 2048, 14, 1, 2},
                             {512, 1024, 28, 1, 2}, {256, 512, 56, 1, 2}};
  // ResNet-50's 3x3 weight gradients that the rule runs as GEMMs.
  const Shape three[] = {{512, 512, 7, 3, 1}, {512, 512, 14, 3, 2}, {256, 256, 28, 3, 2}};
  for (const int n : batches) {
    for (const Shape& g : pointwise) forward_1x1(eng, s, n, sets, g);
    for (const Shape& g : three) wgrad_columns(eng, s, n, sets, g);
  }
}
