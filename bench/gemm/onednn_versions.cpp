// A standalone measurement aid (not in the CMake build): GPT-2 small's matmuls and ResNet-50's
// convolutions (bf16, the shapes the CPU backend runs) timed on whichever oneDNN it is compiled
// against, 2.x (Debian 12's 2.6.3) or 3.x, so two builds of it compare the versions side by side
// on one CPU. bench/RESULTS.md, session 71, has the figures and why nothing changed.
//
//   g++ -O2 -std=c++17 bench/gemm/onednn_versions.cpp -ldnnl -o /tmp/dnnl26
//   # oneDNN 3.2 with GNU OpenMP, from PyPI (onednn-cpu-gomp, onednn-devel-cpu-gomp 2023.2.0),
//   # both wheels unzipped into /tmp/d32 (I = its include folder, L = its lib folder):
//   g++ -O2 -std=c++17 bench/gemm/onednn_versions.cpp -I$I -L$L -l:libdnnl.so.3 -Wl,-rpath,$L
//     -o /tmp/dnnl32
//   OMP_NUM_THREADS=2 /tmp/dnnl26; OMP_NUM_THREADS=2 /tmp/dnnl32      (alternate them)
//
// Each call takes the next of 6 sets of operands; the best of 5 rounds' mean call, in ms.
#include <dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;

namespace {

engine eng(engine::kind::cpu, 0);
stream strm(eng);

double best_ms(const std::function<void(int)>& call, int sets) {
  for (int s = 0; s < sets; ++s) call(s);
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < sets; ++s) call(s);
    strm.wait();
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - t0;
    best = std::min(best, took.count() / sets);
  }
  return best;
}

memory filled(const memory::desc& md) {
  memory m(md, eng);
  std::memset(m.get_data_handle(), 0x3c, md.get_size());  // bf16 0x3c3c: about 0.0115
  return m;
}

// C [m, n] (+)= op(A) [m, k] · op(B) [k, n], A and B bf16, as the backend's GEMMs call it.
struct Gemm {
  const char* name;
  memory::dim m, n, k;
  bool a_transposed, b_transposed;
  dt c_type;
  bool accumulate;  // a sum post-op: the weight gradient's dW +=
};

void time_gemm(const Gemm& g) {
  const memory::desc a({g.m, g.k}, dt::bf16, g.a_transposed ? tag::ba : tag::ab);
  const memory::desc b({g.k, g.n}, dt::bf16, g.b_transposed ? tag::ba : tag::ab);
  const memory::desc c({g.m, g.n}, g.c_type, tag::ab);
  primitive_attr attr;
  if (g.accumulate) {
    post_ops sum;
    sum.append_sum(1.0f);
    attr.set_post_ops(sum);
  }
#if DNNL_VERSION_MAJOR >= 3
  const matmul::primitive_desc pd(eng, a, b, c, attr);
#else
  const matmul::primitive_desc pd(matmul::desc(a, b, c), attr, eng);
#endif
  const matmul mm(pd);
  constexpr int kSets = 6;
  std::vector<memory> as, bs, cs;
  for (int s = 0; s < kSets; ++s) {
    as.push_back(filled(a));
    bs.push_back(filled(b));
    cs.push_back(filled(c));
  }
  const double ms = best_ms(
      [&](int s) {
        mm.execute(strm, {{DNNL_ARG_SRC, as[s]}, {DNNL_ARG_WEIGHTS, bs[s]}, {DNNL_ARG_DST, cs[s]}});
      },
      kSets);
  std::printf("%-26s %8.3f ms %5.2f TFLOP/s\n", g.name, ms,
              2.0 * static_cast<double>(g.m * g.n * g.k) / ms / 1e9);
}

// A k×k convolution of batch 8, NHWC bf16, padding k/2: forward, data and weight gradients (fp32
// dW), each with oneDNN's own weight layout.
struct Conv {
  const char* name;
  memory::dim in, hw, out, k, stride;
};

void time_conv(const Conv& c) {
  constexpr memory::dim kBatch = 8;
  const memory::dim pad = c.k / 2, ohw = (c.hw + 2 * pad - c.k) / c.stride + 1;
  const memory::desc x({kBatch, c.in, c.hw, c.hw}, dt::bf16, tag::nhwc);
  const memory::desc y({kBatch, c.out, ohw, ohw}, dt::bf16, tag::nhwc);
  const memory::desc w({c.out, c.in, c.k, c.k}, dt::bf16, tag::any);
  const memory::desc dw({c.out, c.in, c.k, c.k}, dt::f32, tag::any);
  const memory::dims strides{c.stride, c.stride}, pads{pad, pad};
  const auto direct = algorithm::convolution_direct;
#if DNNL_VERSION_MAJOR >= 3
  const convolution_forward::primitive_desc fwd(eng, prop_kind::forward_training, direct, x, w, y,
                                                strides, pads, pads);
  const convolution_backward_data::primitive_desc bwd_data(eng, direct, x, w, y, strides, pads,
                                                           pads, fwd);
  const convolution_backward_weights::primitive_desc bwd_weights(eng, direct, x, dw, y, strides,
                                                                 pads, pads, fwd);
#else
  const convolution_forward::primitive_desc fwd(
      {prop_kind::forward_training, direct, x, w, y, strides, pads, pads}, eng);
  const convolution_backward_data::primitive_desc bwd_data({direct, x, w, y, strides, pads, pads},
                                                           eng, fwd);
  const convolution_backward_weights::primitive_desc bwd_weights(
      {direct, x, dw, y, strides, pads, pads}, eng, fwd);
#endif
  memory xs = filled(x), ys = filled(y), wf = filled(fwd.weights_desc()),
         wd = filled(bwd_data.weights_desc()), dws = filled(bwd_weights.diff_weights_desc());
  const convolution_forward f(fwd);
  const convolution_backward_data d(bwd_data);
  const convolution_backward_weights g(bwd_weights);
  const double flop = 2.0 * static_cast<double>(kBatch * c.out * ohw * ohw * c.in * c.k * c.k);
  const double tf = best_ms(
      [&](int) {
        f.execute(strm, {{DNNL_ARG_SRC, xs}, {DNNL_ARG_WEIGHTS, wf}, {DNNL_ARG_DST, ys}});
      },
      3);
  const double td = best_ms(
      [&](int) {
        d.execute(strm, {{DNNL_ARG_DIFF_SRC, xs}, {DNNL_ARG_WEIGHTS, wd}, {DNNL_ARG_DIFF_DST, ys}});
      },
      3);
  const double tw = best_ms(
      [&](int) {
        g.execute(strm,
                  {{DNNL_ARG_SRC, xs}, {DNNL_ARG_DIFF_WEIGHTS, dws}, {DNNL_ARG_DIFF_DST, ys}});
      },
      3);
  std::printf("%-26s forward %6.3f (%4.2f)  data %6.3f (%4.2f)  weights %6.3f (%4.2f)  %s\n",
              c.name, tf, flop / tf / 1e9, td, flop / td / 1e9, tw, flop / tw / 1e9,
              bwd_weights.impl_info_str());
}

}  // namespace

int main() {
  std::printf("oneDNN %d.%d.%d (ms, TFLOP/s)\n", dnnl_version()->major, dnnl_version()->minor,
              dnnl_version()->patch);
  // GPT-2 small at 1024 rows: W stored [out, in], so the forward reads it transposed; dW += dyᵀ·x.
  const Gemm gemms[] = {
      {"qkv forward", 1024, 2304, 768, false, true, dt::bf16, false},
      {"c_fc forward", 1024, 3072, 768, false, true, dt::bf16, false},
      {"c_proj (mlp) forward", 1024, 768, 3072, false, true, dt::bf16, false},
      {"qkv data gradient", 1024, 768, 2304, false, false, dt::bf16, false},
      {"c_fc data gradient", 1024, 768, 3072, false, false, dt::bf16, false},
      {"c_proj data gradient", 1024, 3072, 768, false, false, dt::bf16, false},
      {"qkv weight gradient", 2304, 768, 1024, true, false, dt::f32, true},
      {"c_fc weight gradient", 3072, 768, 1024, true, false, dt::f32, true},
      {"c_proj weight gradient", 768, 3072, 1024, true, false, dt::f32, true},
      {"LM head logits (512 rows)", 512, 50257, 768, false, true, dt::bf16, false},
      {"LM head data gradient", 512, 768, 50257, false, false, dt::bf16, false},
      {"LM head weight gradient", 50257, 768, 512, true, false, dt::f32, true},
  };
  for (const Gemm& g : gemms) time_gemm(g);
  // ResNet-50 at batch 8, 224 px: a layer of each kind.
  const Conv convs[] = {
      {"1x1 256->64 at 56", 256, 56, 64, 1, 1},     {"3x3 64 at 56", 64, 56, 64, 3, 1},
      {"3x3 s2 128 56->28", 128, 56, 128, 3, 2},    {"3x3 256 at 14", 256, 14, 256, 3, 1},
      {"3x3 s2 512 14->7", 512, 14, 512, 3, 2},     {"3x3 512 at 7", 512, 7, 512, 3, 1},
      {"1x1 1024->256 at 14", 1024, 14, 256, 1, 1}, {"7x7 s2 stem 3->64", 3, 224, 64, 7, 2},
  };
  for (const Conv& c : convs) time_conv(c);
}
