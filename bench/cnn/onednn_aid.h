// What the standalone oneDNN measurement aids of bench/cnn share (onednn_wgrad_gemm.cpp,
// onednn_dgrad_gemm.cpp; each is built by hand with g++, this header found beside it): the best
// call's time, bf16 operands filled with values (untouched zero pages would flatter a kernel), and
// the two primitives both time: a convolution's backward-data and a plain matmul.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace onednn_aid {

using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;

// The fastest of 7 calls after 2 warm-ups, in ms.
template <class F>
double best_ms(F&& f) {
  std::vector<double> t;
  for (int i = 0; i < 9; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    const auto b = std::chrono::steady_clock::now();
    if (i >= 2) t.push_back(std::chrono::duration<double, std::milli>(b - a).count());
  }
  return *std::min_element(t.begin(), t.end());
}

// A primitive's best call, each call waited for.
inline double best_call_ms(const dnnl::primitive& p, dnnl::stream& s,
                           const std::unordered_map<int, memory>& args) {
  return best_ms([&] {
    p.execute(s, args);
    s.wait();
  });
}

// bf16 codes of values near ±1 (sign and low mantissa bits random) over the whole buffer.
inline void fill_bf16(memory& m) {
  auto* p = static_cast<std::uint16_t*>(m.get_data_handle());
  std::mt19937 rng(1);
  for (std::size_t i = 0; i < m.get_desc().get_size() / 2; ++i)
    p[i] = static_cast<std::uint16_t>(0x3f80u ^ (rng() & 0x807fu));
}

// A square-strided, square-padded direct convolution's forward: timed itself, or the hint that
// its backward primitives ask for.
inline dnnl::convolution_forward::primitive_desc forward_convolution(dnnl::engine& eng,
                                                                     const memory::desc& x,
                                                                     const memory::desc& w,
                                                                     const memory::desc& y,
                                                                     int stride, int pad) {
  return dnnl::convolution_forward::primitive_desc({dnnl::prop_kind::forward_training,
                                                    dnnl::algorithm::convolution_direct,
                                                    x,
                                                    w,
                                                    y,
                                                    {stride, stride},
                                                    {pad, pad},
                                                    {pad, pad}},
                                                   eng);
}

struct Timed {
  double ms;
  std::string implementation;
};

// x [N, C, H, W] (nhwc) convolved by an O×C×k×k kernel: dx = its backward-data from a filled
// dy, into a `dx_type` dx, timed. `dy` is left filled for a matmul to read.
inline Timed time_backward_data(dnnl::engine& eng, dnnl::stream& s, int n, int c, int h, int o,
                                int k, int stride, dt dx_type, memory& dy) {
  const int pad = k / 2, oh = (h + 2 * pad - k) / stride + 1;
  const memory::desc x_md({n, c, h, h}, dt::bf16, tag::nhwc),
      w_md({o, c, k, k}, dt::bf16, tag::any), dy_md({n, o, oh, oh}, dt::bf16, tag::nhwc),
      dx_md({n, c, h, h}, dx_type, tag::nhwc);
  const memory::dims strides{stride, stride}, pads{pad, pad};
  const auto hint = forward_convolution(eng, x_md, w_md, dy_md, stride, pad);
  const dnnl::convolution_backward_data::primitive_desc bwd(
      {dnnl::algorithm::convolution_direct, dx_md, w_md, dy_md, strides, pads, pads}, eng, hint);
  dy = memory(bwd.diff_dst_desc(), eng);
  memory w(bwd.weights_desc(), eng), dx(bwd.diff_src_desc(), eng);
  fill_bf16(dy);
  fill_bf16(w);
  dnnl::convolution_backward_data conv(bwd);
  const double ms = best_call_ms(
      conv, s, {{DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DIFF_SRC, dx}});
  return {ms, bwd.impl_info_str()};
}

// C = A · B for the given descriptors, A read from `a_data` (nullptr: a filled buffer of its own),
// B filled; `c` is left holding the product.
inline Timed time_matmul(dnnl::engine& eng, dnnl::stream& s, const memory::desc& a_md,
                         const memory::desc& b_md, const memory::desc& c_md, void* a_data,
                         memory& c) {
  const dnnl::matmul::primitive_desc pd({a_md, b_md, c_md}, eng);
  dnnl::matmul mm(pd);
  memory a = a_data != nullptr ? memory(a_md, eng, a_data) : memory(a_md, eng), b(b_md, eng);
  if (a_data == nullptr) fill_bf16(a);
  fill_bf16(b);
  c = memory(c_md, eng);
  const double ms =
      best_call_ms(mm, s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  return {ms, pd.impl_info_str()};
}

}  // namespace onednn_aid
