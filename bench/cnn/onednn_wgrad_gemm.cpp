// Times the weight gradient of ResNet-50's convolutions (224x224, batch 8) as oneDNN's
// convolution backward-weights against the same sum as one oneDNN matmul: dw [O, KH·KW·C] =
// dyᵀ [O, M] · cols [M, KH·KW·C] over the M = N·OH·OW output pixels, where cols is x itself for a
// 1x1 stride-1 convolution and otherwise x's pixels (im2col: each output pixel's KH·KW input
// pixels, zeros in the padding), gathered first and timed apart. bf16 operands, fp32 dw, nhwc,
// best of 7 calls after 2 warm-ups, milliseconds, with oneDNN's implementation names. What
// cpu_conv_algorithm.h's conv_gemm rule was decided from (bench/RESULTS.md, session 63).
// Not part of the CMake build (a measurement aid; oneDNN 2.6's API):
//   g++ -O2 -fopenmp -std=c++17 bench/cnn/onednn_wgrad_gemm.cpp -ldnnl -o /tmp/wgrad_gemm
//   OMP_NUM_THREADS=2 /tmp/wgrad_gemm [f32]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "onednn_aid.h"
using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;

using onednn_aid::best_ms;

int main(int argc, char** argv) {
  const dt d = argc > 1 && std::string(argv[1]) == "f32" ? dt::f32 : dt::bf16;
  const std::size_t esize = d == dt::f32 ? 4 : 2;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  struct Shape {
    int c, h, o, k, stride;
  };
  // ResNet-50's distinct convolutions: the stem, the 3x3s and the 1x1s.
  const Shape shapes[] = {{3, 224, 64, 7, 2},     {64, 56, 64, 3, 1},    {128, 56, 128, 3, 2},
                          {128, 28, 128, 3, 1},   {256, 28, 256, 3, 2},  {256, 14, 256, 3, 1},
                          {512, 14, 512, 3, 2},   {512, 7, 512, 3, 1},   {64, 56, 256, 1, 1},
                          {256, 56, 64, 1, 1},    {256, 56, 512, 1, 2},  {512, 28, 128, 1, 1},
                          {128, 28, 512, 1, 1},   {512, 28, 1024, 1, 2}, {1024, 14, 256, 1, 1},
                          {1024, 14, 2048, 1, 2}, {2048, 7, 512, 1, 1},  {512, 7, 2048, 1, 1}};
  const int n = 8;
  std::printf("%-24s %-34s %-40s\n", "C->O HxW kxk/s", "convolution ms (TF/s) [impl]",
              "gather + matmul ms (TF/s) [impl]");
  for (const Shape& g : shapes) {
    const int pad = g.k / 2, oh = (g.h + 2 * pad - g.k) / g.stride + 1, m = n * oh * oh,
              kc = g.k * g.k * g.c;
    const double flops = 2.0 * m * g.o * kc;
    const memory::desc x_md({n, g.c, g.h, g.h}, d, tag::nhwc),
        dy_md({n, g.o, oh, oh}, d, tag::nhwc), w_md({g.o, g.c, g.k, g.k}, d, tag::any),
        dw_md({g.o, g.c, g.k, g.k}, dt::f32, tag::any);
    const auto fwd = onednn_aid::forward_convolution(eng, x_md, w_md, dy_md, g.stride, pad);
    const convolution_backward_weights::primitive_desc bwd({algorithm::convolution_direct,
                                                            x_md,
                                                            dw_md,
                                                            dy_md,
                                                            {g.stride, g.stride},
                                                            {pad, pad},
                                                            {pad, pad}},
                                                           eng, fwd);
    memory x(bwd.src_desc(), eng), dy(bwd.diff_dst_desc(), eng), dw(bwd.diff_weights_desc(), eng);
    std::memset(x.get_data_handle(), 0, x.get_desc().get_size());
    std::memset(dy.get_data_handle(), 0, dy.get_desc().get_size());
    convolution_backward_weights conv(bwd);
    std::unordered_map<int, memory> conv_args{
        {DNNL_ARG_SRC, x}, {DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_DIFF_WEIGHTS, dw}};
    const double t_conv = onednn_aid::best_call_ms(conv, s, conv_args);
    // cols [M, KH·KW·C]: x itself for 1x1 stride 1, else gathered.
    const bool gather = g.k != 1 || g.stride != 1;
    std::vector<char> cols(gather ? static_cast<std::size_t>(m) * kc * esize : 0);
    const auto* xs = static_cast<const char*>(x.get_data_handle());
    const auto im2col = [&] {
#pragma omp parallel for
      for (int r = 0; r < n * oh; ++r) {
        const int img = r / oh, i = r % oh;
        for (int j = 0; j < oh; ++j)
          for (int kh = 0; kh < g.k; ++kh)
            for (int kw = 0; kw < g.k; ++kw) {
              char* to =
                  cols.data() +
                  ((static_cast<std::size_t>(r) * oh + j) * kc + (kh * g.k + kw) * g.c) * esize;
              const int h = i * g.stride - pad + kh, w = j * g.stride - pad + kw;
              if (h < 0 || h >= g.h || w < 0 || w >= g.h)
                std::memset(to, 0, g.c * esize);
              else
                std::memcpy(
                    to, xs + ((static_cast<std::size_t>(img) * g.h + h) * g.h + w) * g.c * esize,
                    g.c * esize);
            }
      }
    };
    const double t_gather = gather ? best_ms(im2col) : 0.0;
    const memory::desc a_md({g.o, m}, d, tag::ba), b_md({m, kc}, d, tag::ab),
        c_md({g.o, kc}, dt::f32, tag::ab);
    const matmul::primitive_desc mm_pd({a_md, b_md, c_md}, eng);
    matmul mm(mm_pd);
    memory a(a_md, eng, dy.get_data_handle()),
        b(b_md, eng, gather ? static_cast<void*>(cols.data()) : x.get_data_handle()), c(c_md, eng);
    std::unordered_map<int, memory> mm_args{
        {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
    const double t_mm = onednn_aid::best_call_ms(mm, s, mm_args);
    char name[64], conv_col[96], mm_col[96];
    std::snprintf(name, sizeof name, "%d->%d %dx%d %dx%d/%d", g.c, g.o, g.h, g.h, g.k, g.k,
                  g.stride);
    std::snprintf(conv_col, sizeof conv_col, "%.3f (%.2f) [%s]", t_conv, flops / t_conv / 1e9,
                  bwd.impl_info_str());
    std::snprintf(mm_col, sizeof mm_col, "%.3f + %.3f (%.2f) [%s]", t_gather, t_mm,
                  flops / (t_gather + t_mm) / 1e9, mm_pd.impl_info_str());
    std::printf("%-24s %-34s %-40s\n", name, conv_col, mm_col);
  }
}
