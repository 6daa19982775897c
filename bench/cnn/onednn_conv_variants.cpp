// Times oneDNN's convolutions on ResNet-20's 3x3 stride-1 shapes (batch 128; 16 ch 32x32,
// 32 ch 16x16, 64 ch 8x8), forward / backward-data / backward-weights, in three variants:
// nhwc activations (what the CPU backend passes), format `any` for activations (oneDNN picks,
// blocked nChw16c), and Winograd F(4,3) (convolution_winograd, blocked). fp32 and bf16.
// Best of 15 runs after 2 warm-ups, milliseconds; oneDNN's implementation name in brackets.
// Not part of the CMake build (a measurement aid):
//   g++ -O2 -std=c++17 bench/cnn/onednn_conv_variants.cpp -ldnnl -o /tmp/conv_variants
//   OMP_NUM_THREADS=2 /tmp/conv_variants
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>
using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;
engine eng(engine::kind::cpu, 0);
stream s(eng);
double timeit(primitive& p, std::unordered_map<int, memory>& args, int reps) {
  std::vector<double> t;
  for (int i = 0; i < reps + 2; ++i) {
    auto a = std::chrono::steady_clock::now();
    p.execute(s, args);
    s.wait();
    auto b = std::chrono::steady_clock::now();
    if (i >= 2) t.push_back(std::chrono::duration<double, std::milli>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[0];
}
int main() {
  int reps = 15;
  struct G {
    int c, h;
  } gs[] = {{16, 32}, {32, 16}, {64, 8}};
  for (auto g : gs)
    for (dt d : {dt::f32, dt::bf16})
      for (int mode = 0; mode < 3; ++mode) {
        if (d == dt::bf16 && mode == 2) continue;
        memory::dims src = {128, g.c, g.h, g.h}, wei = {g.c, g.c, 3, 3};
        algorithm alg = mode == 2 ? algorithm::convolution_winograd : algorithm::convolution_direct;
        tag at = mode == 0 ? tag::nhwc : tag::any;
        memory::desc smd(src, d, at), dmd(src, d, at), wmd(wei, d, tag::any),
            bmd({g.c}, dt::f32, tag::a);
        memory::desc wmdf(wei, dt::f32, tag::any);
        try {
          convolution_forward::primitive_desc fpd({prop_kind::forward_training,
                                                   alg,
                                                   smd,
                                                   wmd,
                                                   memory::desc(),
                                                   dmd,
                                                   {1, 1},
                                                   {1, 1},
                                                   {1, 1}},
                                                  eng);
          memory S(fpd.src_desc(), eng), W(fpd.weights_desc(), eng), D(fpd.dst_desc(), eng);
          std::unordered_map<int, memory> fa{
              {DNNL_ARG_SRC, S}, {DNNL_ARG_WEIGHTS, W}, {DNNL_ARG_DST, D}};
          auto fp = convolution_forward(fpd);
          double tf = timeit(fp, fa, reps);
          convolution_backward_data::primitive_desc bdp(
              {alg, smd, wmd, dmd, {1, 1}, {1, 1}, {1, 1}}, eng, fpd);
          memory DS(bdp.diff_src_desc(), eng), W2(bdp.weights_desc(), eng),
              DD(bdp.diff_dst_desc(), eng);
          std::unordered_map<int, memory> ba{
              {DNNL_ARG_DIFF_SRC, DS}, {DNNL_ARG_WEIGHTS, W2}, {DNNL_ARG_DIFF_DST, DD}};
          auto bp = convolution_backward_data(bdp);
          double tb = timeit(bp, ba, reps);
          convolution_backward_weights::primitive_desc bwp(
              {alg, smd, wmdf, bmd, dmd, {1, 1}, {1, 1}, {1, 1}}, eng, fpd);
          memory S3(bwp.src_desc(), eng), DW(bwp.diff_weights_desc(), eng),
              DB(bwp.diff_bias_desc(), eng), DD3(bwp.diff_dst_desc(), eng);
          std::unordered_map<int, memory> wa{{DNNL_ARG_SRC, S3},
                                             {DNNL_ARG_DIFF_WEIGHTS, DW},
                                             {DNNL_ARG_DIFF_BIAS, DB},
                                             {DNNL_ARG_DIFF_DST, DD3}};
          auto wp = convolution_backward_weights(bwp);
          double tw = timeit(wp, wa, reps);
          printf("c%-3d %-4s %-6s fwd %6.2f (%s) bwd_d %6.2f (%s) bwd_w %6.2f (%s)\n", g.c,
                 d == dt::f32 ? "f32" : "bf16",
                 mode == 0   ? "nhwc"
                 : mode == 1 ? "any"
                             : "wino",
                 tf, fpd.impl_info_str(), tb, bdp.impl_info_str(), tw, bwp.impl_info_str());
          fflush(stdout);
        } catch (dnnl::error& e) {
          printf("c%d mode %d: %s\n", g.c, mode, e.what());
        }
      }
}
