// The per-element math of the CUDA backend's batch-norm, pooling and permute kernels
// (cuda_element_math.h: the same source the device compiles, built here with -ffp-contract=off
// like nvcc's --fmad=false) checked on the host, bit for bit, against what the CPU backend
// writes. No GPU needed.
// - Batch norm: the inference forward and the training forward's y, workspace (scale, shift) and
//   running statistics from the CPU's own saved statistics; batch norm + add + ReLU's y
//   (training and evaluation, the residual in y itself) and running statistics; the backward's
//   dx, dgamma and dbeta (with the fused ReLU's recomputed mask and accumulation) where the
//   per-channel sums are exact in any order (dyadic data), so the only difference left would be
//   the per-element formula.
// - Average pooling: the CPU's output equals pool_average(window sum, divisor) where the window
//   sums are exact (dyadic data): one fp32 division, as oneDNN's (checked, not assumed).
// - Permutes: each value decoded and encoded once (element::convert), as the CPU's.
// - The batch-norm kernels' channel index (ChannelWalk) against i % C.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu_backend.h"
#include "cuda_channel_walk.h"
#include "cuda_element_math.h"
#include "cuda_pool_windows.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace {

namespace el = mixtrain::backend_cuda::element;
namespace st = mixtrain::backend_cuda::element::storage;
namespace sdk = mixtrain::sdk;
using sdk::DType;
using sdk::Shape;
using sdk::TensorView;

// A CPU-backend tensor (host memory) read and written as the stored values.
struct HostTensor {
  mixtrain::backend_cpu::CpuBackend* be;
  TensorView v;
  HostTensor(mixtrain::backend_cpu::CpuBackend& b, DType dt, Shape s) : be(&b) {
    v.dtype = dt;
    v.shape = s;
    v.data = b.allocate(std::max<std::size_t>(v.bytes(), 1));
    std::memset(v.data, 0, v.bytes());
  }
  HostTensor(const HostTensor&) = delete;
  ~HostTensor() { be->deallocate(v.data); }
  // Stores values rounded once into the dtype.
  void set(const std::vector<float>& x) {
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (v.dtype == DType::bf16)
        static_cast<std::uint16_t*>(v.data)[i] = sdk::encode_bf16(x[i]);
      else if (v.dtype == DType::fp16)
        static_cast<std::uint16_t*>(v.data)[i] = sdk::encode_fp16(x[i]);
      else
        static_cast<float*>(v.data)[i] = x[i];
    }
  }
  float at(std::size_t i) const {
    if (v.dtype == DType::bf16) return sdk::decode_bf16(static_cast<std::uint16_t*>(v.data)[i]);
    if (v.dtype == DType::fp16) return sdk::decode_fp16(static_cast<std::uint16_t*>(v.data)[i]);
    return static_cast<float*>(v.data)[i];
  }
  std::uint32_t bits(std::size_t i) const {
    if (v.dtype == DType::bf16 || v.dtype == DType::fp16)
      return static_cast<std::uint16_t*>(v.data)[i];
    return std::bit_cast<std::uint32_t>(static_cast<float*>(v.data)[i]);
  }
};

// The host's encode of v into dt's stored bits (what a kernel's store writes).
std::uint32_t store_bits(float v, DType dt) {
  if (dt == DType::bf16) return st::Bf16::store(v, false);
  if (dt == DType::fp16) return st::F16::store(v, false);
  return std::bit_cast<std::uint32_t>(v);
}

std::vector<float> uniform(std::size_t n, std::uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Multiples of 1/8 in [-2, 2]: sums of them are exact in any order.
std::vector<float> dyadic(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(static_cast<int>(rng() % 33) - 16) / 8.0f;
  return v;
}

class cuda_layer_math : public ::testing::Test {
 protected:
  mixtrain::backend_cpu::CpuBackend cpu{1};
};

constexpr DType kDtypes[] = {DType::fp32, DType::bf16, DType::fp16};

TEST_F(cuda_layer_math, BatchNormInferenceMatchesTheCpuBitForBit) {
  const std::int64_t rows = 97, c = 13;
  const auto xv = uniform(rows * c, 1, -3.0f, 5.0f);
  for (DType dt : kDtypes)
    for (bool relu : {false, true})
      for (bool affine : {false, true}) {
        HostTensor x(cpu, dt, {rows, c}), y(cpu, dt, {rows, c});
        HostTensor g(cpu, DType::fp32, {c}), b(cpu, DType::fp32, {c});
        HostTensor rm(cpu, DType::fp32, {c}), rv(cpu, DType::fp32, {c});
        x.set(xv);
        g.set(uniform(c, 2, 0.5f, 1.5f));
        b.set(uniform(c, 3, -0.5f, 0.5f));
        rm.set(uniform(c, 4, -0.2f, 0.2f));
        rv.set(uniform(c, 5, 0.3f, 2.0f));
        const sdk::BatchNormShape s{rows, c, 1e-5f, relu};
        sdk::facet<sdk::BatchNormFacet>(cpu)->batchnorm_forward_inference(
            x.v, affine ? g.v : TensorView{}, affine ? b.v : TensorView{}, rm.v, rv.v, s, y.v);
        for (std::int64_t i = 0; i < rows * c; ++i) {
          const auto j = static_cast<std::size_t>(i % c);
          const auto ss = el::bn_scale_shift(rv.at(j), s.eps, affine, g.at(j), b.at(j));
          const float v =
              el::bn_forward(x.at(static_cast<std::size_t>(i)), rm.at(j), ss.scale, ss.shift, relu);
          ASSERT_EQ(store_bits(v, dt), y.bits(static_cast<std::size_t>(i)))
              << sdk::dtype_name(dt) << " relu " << relu << " affine " << affine << " element "
              << i;
        }
      }
}

TEST_F(cuda_layer_math, BatchNormTrainingYWorkspaceAndRunningStatsMatchTheCpu) {
  const std::int64_t rows = 120, c = 7;
  const float momentum = 0.1f;
  for (DType dt : kDtypes)
    for (bool relu : {false, true}) {
      HostTensor x(cpu, dt, {rows, c}), y(cpu, dt, {rows, c});
      HostTensor g(cpu, DType::fp32, {c}), b(cpu, DType::fp32, {c});
      HostTensor mean(cpu, DType::fp32, {c}), var(cpu, DType::fp32, {c});
      HostTensor rm(cpu, DType::fp32, {c}), rv(cpu, DType::fp32, {c});
      HostTensor ws(cpu, DType::fp32, {2 * c});
      x.set(uniform(rows * c, 6, -1.0f, 3.0f));
      g.set(uniform(c, 7, 0.5f, 1.5f));
      b.set(uniform(c, 8, -0.5f, 0.5f));
      const auto rm0 = uniform(c, 9, -0.1f, 0.1f), rv0 = uniform(c, 10, 0.5f, 1.5f);
      rm.set(rm0);
      rv.set(rv0);
      const sdk::BatchNormShape s{rows, c, 1e-5f, relu};
      sdk::facet<sdk::BatchNormFacet>(cpu)->batchnorm_forward_training(
          x.v, g.v, b.v, s, momentum, y.v, mean.v, var.v, rm.v, rv.v, relu ? ws.v : TensorView{});
      const double unbiased = static_cast<double>(rows) / static_cast<double>(rows - 1);
      for (std::int64_t j = 0; j < c; ++j) {
        const auto k = static_cast<std::size_t>(j);
        const auto ss = el::bn_scale_shift(var.at(k), s.eps, true, g.at(k), b.at(k));
        if (relu) {
          EXPECT_EQ(std::bit_cast<std::uint32_t>(ss.scale), ws.bits(k)) << "scale " << j;
          EXPECT_EQ(std::bit_cast<std::uint32_t>(ss.shift), ws.bits(k + c)) << "shift " << j;
        }
        EXPECT_EQ(el::bn_running_mean(rm0[k], momentum, mean.at(k)), rm.at(k)) << j;
        EXPECT_EQ(el::bn_running_var(rv0[k], momentum, unbiased, var.at(k)), rv.at(k)) << j;
        for (std::int64_t r = 0; r < rows; ++r) {
          const auto i = static_cast<std::size_t>(r * c + j);
          const float v = el::bn_forward(x.at(i), mean.at(k), ss.scale, ss.shift, relu);
          ASSERT_EQ(store_bits(v, dt), y.bits(i)) << sdk::dtype_name(dt) << " element " << i;
        }
      }
    }
}

// Batch norm + add + ReLU: with the statistics the CPU used (its save_mean / save_var when
// training, the running ones in evaluation), every y is bn_add_forward rounded once, bit for bit,
// with NaN, infinite and negative residuals, and the residual in y itself; the running statistics
// move as bn_running_mean / bn_running_var say.
TEST_F(cuda_layer_math, BatchNormAddForwardMatchesTheCpuBitForBit) {
  const std::int64_t rows = 90, c = 7;
  const float momentum = 0.1f;
  const auto xv = uniform(rows * c, 21, -1.0f, 3.0f);
  auto res = uniform(rows * c, 22, -3.0f, 2.0f);
  res[5] = NAN;
  res[11] = -INFINITY;
  res[17] = INFINITY;
  res[23] = -0.0f;
  const auto rm0 = uniform(c, 23, -0.2f, 0.2f), rvar0 = uniform(c, 24, 0.3f, 2.0f);
  for (DType dt : kDtypes)
    for (bool training : {true, false})
      for (bool relu : {false, true})
        for (bool affine : {false, true})
          for (bool in_place : {false, true}) {
            HostTensor x(cpu, dt, {rows, c}), y(cpu, dt, {rows, c}), r(cpu, dt, {rows, c});
            HostTensor g(cpu, DType::fp32, {c}), b(cpu, DType::fp32, {c});
            HostTensor mean(cpu, DType::fp32, {c}), var(cpu, DType::fp32, {c});
            HostTensor rm(cpu, DType::fp32, {c}), rvar(cpu, DType::fp32, {c});
            x.set(xv);
            (in_place ? y : r).set(res);
            g.set(uniform(c, 25, 0.5f, 1.5f));
            b.set(uniform(c, 26, -0.5f, 0.5f));
            rm.set(rm0);
            rvar.set(rvar0);
            std::vector<float> residual(static_cast<std::size_t>(rows * c));
            for (std::size_t i = 0; i < residual.size(); ++i)
              residual[i] = in_place ? y.at(i) : r.at(i);
            sdk::BatchNormAddArgs a;
            a.x = x.v;
            a.residual = in_place ? y.v : r.v;
            if (affine) {
              a.gamma = g.v;
              a.beta = b.v;
            }
            a.shape = {rows, c, 1e-5f, relu};
            a.training = training;
            a.momentum = momentum;
            a.y = y.v;
            if (training) {
              a.save_mean = mean.v;
              a.save_var = var.v;
            }
            a.running_mean = rm.v;
            a.running_var = rvar.v;
            sdk::facet<sdk::BatchNormFacet>(cpu)->batchnorm_add_forward(a);
            const std::string what =
                std::string(sdk::dtype_name(dt)) + (training ? " training" : " evaluation") +
                (relu ? " relu" : "") + (affine ? " affine" : "") + (in_place ? " in place" : "");
            const double unbiased = static_cast<double>(rows) / static_cast<double>(rows - 1);
            for (std::int64_t j = 0; j < c; ++j) {
              const auto k = static_cast<std::size_t>(j);
              const float m = training ? mean.at(k) : rm0[k];
              const float v = training ? var.at(k) : rvar0[k];
              if (training) {
                EXPECT_EQ(el::bn_running_mean(rm0[k], momentum, m), rm.at(k)) << what << j;
                EXPECT_EQ(el::bn_running_var(rvar0[k], momentum, unbiased, v), rvar.at(k))
                    << what << j;
              } else {
                EXPECT_EQ(rm0[k], rm.at(k)) << what << j;
                EXPECT_EQ(rvar0[k], rvar.at(k)) << what << j;
              }
              const auto ss = el::bn_scale_shift(v, 1e-5f, affine, g.at(k), b.at(k));
              for (std::int64_t row = 0; row < rows; ++row) {
                const auto i = static_cast<std::size_t>(row * c + j);
                const float out =
                    el::bn_add_forward(x.at(i), residual[i], m, ss.scale, ss.shift, relu);
                ASSERT_EQ(store_bits(out, dt), y.bits(i)) << what << " element " << i;
              }
            }
          }
}

TEST_F(cuda_layer_math, BatchNormBackwardMatchesTheCpuWhereTheSumsAreExact) {
  const std::int64_t rows = 64, c = 5;  // mean = Σx / 64: exact for multiples of 1/8
  for (DType dt : kDtypes)
    for (bool relu : {false, true})
      for (bool accumulate : {false, true}) {
        HostTensor x(cpu, dt, {rows, c}), y(cpu, dt, {rows, c}), dy(cpu, dt, {rows, c}),
            dx(cpu, dt, {rows, c});
        HostTensor g(cpu, DType::fp32, {c}), b(cpu, DType::fp32, {c});
        HostTensor mean(cpu, DType::fp32, {c}), var(cpu, DType::fp32, {c});
        HostTensor ws(cpu, DType::fp32, {2 * c}), dg(cpu, DType::fp32, {c}),
            db(cpu, DType::fp32, {c});
        x.set(dyadic(rows * c, 11));
        dy.set(dyadic(rows * c, 12));
        g.set(uniform(c, 13, 0.5f, 1.5f));
        b.set(uniform(c, 14, -0.5f, 0.5f));
        const auto dg0 = uniform(c, 15, -1.0f, 1.0f), db0 = uniform(c, 16, -1.0f, 1.0f);
        dg.set(dg0);
        db.set(db0);
        const sdk::BatchNormShape s{rows, c, 1e-5f, relu};
        sdk::facet<sdk::BatchNormFacet>(cpu)->batchnorm_forward_training(
            x.v, g.v, b.v, s, 0.1f, y.v, mean.v, var.v, {}, {}, relu ? ws.v : TensorView{});
        sdk::facet<sdk::BatchNormFacet>(cpu)->batchnorm_backward(dy.v, x.v, y.v, g.v, mean.v, var.v,
                                                                 s, relu ? ws.v : TensorView{},
                                                                 dx.v, dg.v, db.v, accumulate);
        for (std::int64_t j = 0; j < c; ++j) {
          const auto k = static_cast<std::size_t>(j);
          auto masked = [&](std::size_t i) {
            return relu ? el::bn_relu_mask(x.at(i), dy.at(i), mean.at(k), ws.at(k), ws.at(k + c))
                        : dy.at(i);
          };
          double sum_g = 0.0, sum_gx = 0.0;
          for (std::int64_t r = 0; r < rows; ++r) {
            const auto i = static_cast<std::size_t>(r * c + j);
            sum_g += masked(i);
            sum_gx += static_cast<double>(masked(i)) * static_cast<double>(x.at(i) - mean.at(k));
          }
          const auto co = el::bn_grad_coefficients(var.at(k), s.eps, g.at(k), sum_g, sum_gx,
                                                   static_cast<double>(rows));
          EXPECT_EQ(accumulate ? dg0[k] + co.dgamma : co.dgamma, dg.at(k))
              << sdk::dtype_name(dt) << " dgamma " << j;
          EXPECT_EQ(accumulate ? db0[k] + co.dbeta : co.dbeta, db.at(k))
              << sdk::dtype_name(dt) << " dbeta " << j;
          for (std::int64_t r = 0; r < rows; ++r) {
            const auto i = static_cast<std::size_t>(r * c + j);
            const float v = el::bn_grad_input(masked(i), x.at(i), mean.at(k), co.a, co.b, co.d);
            ASSERT_EQ(store_bits(v, dt), dx.bits(i))
                << sdk::dtype_name(dt) << " relu " << relu << " dx element " << i;
          }
        }
      }
}

// BatchNormFacet v2 (synchronized batch norm): the reduce's sums are the fused backward's
// finish (bn_grad_coefficients' dgamma and dbeta) and the elementwise dx is bn_sync_coefficients
// then bn_grad_input, the ReLU mask from y; the CPU writes the same bits where the sums are exact.
TEST_F(cuda_layer_math, BatchNormSplitOpsMatchTheCpuWhereTheSumsAreExact) {
  const std::int64_t rows = 64, c = 5;
  for (DType dt : kDtypes)
    for (bool relu : {false, true}) {
      HostTensor x(cpu, dt, {rows, c}), y(cpu, dt, {rows, c}), dy(cpu, dt, {rows, c}),
          dx(cpu, dt, {rows, c});
      HostTensor g(cpu, DType::fp32, {c}), b(cpu, DType::fp32, {c});
      HostTensor mean(cpu, DType::fp32, {c}), var(cpu, DType::fp32, {c});
      HostTensor sdy(cpu, DType::fp32, {c}), sdyx(cpu, DType::fp32, {c});
      HostTensor mdy(cpu, DType::fp32, {c}), mdyx(cpu, DType::fp32, {c});
      x.set(dyadic(rows * c, 21));
      dy.set(dyadic(rows * c, 22));
      g.set(uniform(c, 23, 0.5f, 1.5f));
      b.set(uniform(c, 24, -0.5f, 0.5f));
      // Global means as another rank's sums would make them: any fp32 values.
      mdy.set(uniform(c, 25, -0.2f, 0.2f));
      mdyx.set(uniform(c, 26, -0.2f, 0.2f));
      const sdk::BatchNormShape s{rows, c, 1e-5f, relu};
      sdk::facet<sdk::BatchNormFacet>(cpu)->batchnorm_statistics(x.v, s, mean.v, var.v);
      sdk::facet<sdk::BatchNormFacet>(cpu)->batchnorm_forward_inference(x.v, g.v, b.v, mean.v,
                                                                        var.v, s, y.v);
      sdk::facet<sdk::BatchNormFacet>(cpu)->batchnorm_backward_reduce(
          dy.v, x.v, relu ? y.v : TensorView{}, mean.v, var.v, s, sdy.v, sdyx.v);
      sdk::facet<sdk::BatchNormFacet>(cpu)->batchnorm_backward_elementwise(
          dy.v, x.v, relu ? y.v : TensorView{}, g.v, mean.v, var.v, mdy.v, mdyx.v, s, dx.v);
      for (std::int64_t j = 0; j < c; ++j) {
        const auto k = static_cast<std::size_t>(j);
        auto masked = [&](std::size_t i) { return relu && !(y.at(i) > 0.0f) ? 0.0f : dy.at(i); };
        double sum_g = 0.0, sum_gx = 0.0;
        for (std::int64_t r = 0; r < rows; ++r) {
          const auto i = static_cast<std::size_t>(r * c + j);
          sum_g += masked(i);
          sum_gx += static_cast<double>(masked(i)) * static_cast<double>(x.at(i) - mean.at(k));
        }
        const auto sums = el::bn_grad_coefficients(var.at(k), s.eps, 1.0f, sum_g, sum_gx,
                                                   static_cast<double>(rows));
        EXPECT_EQ(sums.dbeta, sdy.at(k)) << sdk::dtype_name(dt) << " sum_dy " << j;
        EXPECT_EQ(sums.dgamma, sdyx.at(k)) << sdk::dtype_name(dt) << " sum_dy_xhat " << j;
        const auto co = el::bn_sync_coefficients(var.at(k), s.eps, g.at(k), mdy.at(k), mdyx.at(k));
        for (std::int64_t r = 0; r < rows; ++r) {
          const auto i = static_cast<std::size_t>(r * c + j);
          const float v = el::bn_grad_input(masked(i), x.at(i), mean.at(k), co.a, co.b, co.d);
          ASSERT_EQ(store_bits(v, dt), dx.bits(i))
              << sdk::dtype_name(dt) << " relu " << relu << " dx element " << i;
        }
      }
    }
}

TEST_F(cuda_layer_math, AveragePoolIsOneDivideOfTheWindowSum) {
  sdk::Pool2dGeometry p;
  p.kind = sdk::PoolKind::average;
  p.batch = 2;
  p.channels = 3;
  p.height = p.width = 7;
  p.kernel_h = p.kernel_w = 3;
  p.stride_h = p.stride_w = 2;
  p.pad_h = p.pad_w = 1;
  for (bool include_pad : {true, false}) {
    p.count_include_pad = include_pad;
    const std::int64_t oh = p.out_height(), ow = p.out_width();
    HostTensor x(cpu, DType::fp32, {2, 7, 7, 3}), y(cpu, DType::fp32, {2, oh, ow, 3});
    x.set(dyadic(2 * 7 * 7 * 3, 17));
    sdk::facet<sdk::ConvolutionFacet>(cpu)->pool2d_forward(p, x.v, y.v, {});
    for (std::int64_t n = 0; n < 2; ++n)
      for (std::int64_t a = 0; a < oh; ++a)
        for (std::int64_t b = 0; b < ow; ++b)
          for (std::int64_t ch = 0; ch < 3; ++ch) {
            float sum = 0.0f;
            int count = 0;
            for (std::int64_t i = 0; i < 3; ++i)
              for (std::int64_t j = 0; j < 3; ++j) {
                const std::int64_t h = a * 2 - 1 + i, w = b * 2 - 1 + j;
                if (h < 0 || h >= 7 || w < 0 || w >= 7) continue;
                sum += x.at(static_cast<std::size_t>(((n * 7 + h) * 7 + w) * 3 + ch));
                ++count;
              }
            const float want = el::pool_average(sum, include_pad ? 9 : count);
            const auto o = static_cast<std::size_t>(((n * oh + a) * ow + b) * 3 + ch);
            ASSERT_EQ(std::bit_cast<std::uint32_t>(want), y.bits(o))
                << "include_pad " << include_pad << " output " << o << ": " << want << " vs "
                << y.at(o);
          }
  }
}

TEST_F(cuda_layer_math, PermutesRoundEachValueOnceAsTheCpu) {
  const std::int64_t n = 2, ch = 3, h = 4, w = 5;
  const auto values = uniform(n * ch * h * w, 18, -70000.0f, 70000.0f);
  for (DType from : kDtypes)
    for (DType to : kDtypes) {
      HostTensor src(cpu, from, {n, ch, h, w}), dst(cpu, to, {n, h, w, ch});
      src.set(values);
      sdk::facet<sdk::ConvolutionFacet>(cpu)->to_channels_last(src.v, ch, h, w, dst.v);
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t c = 0; c < ch; ++c)
          for (std::int64_t p = 0; p < h * w; ++p) {
            const auto s = static_cast<std::size_t>((i * ch + c) * h * w + p);
            const auto d = static_cast<std::size_t>((i * h * w + p) * ch + c);
            std::uint32_t want = 0;
            const float v = src.at(s);
            // element::convert<Src, Dst> on the stored bits of src.
            if (to == DType::bf16)
              want = from == DType::fp16
                         ? el::convert<st::F16, st::Bf16>(static_cast<std::uint16_t>(src.bits(s)))
                         : st::Bf16::store(v, false);
            else if (to == DType::fp16)
              want = from == DType::bf16
                         ? el::convert<st::Bf16, st::F16>(static_cast<std::uint16_t>(src.bits(s)))
                         : st::F16::store(v, false);
            else
              want = std::bit_cast<std::uint32_t>(v);
            ASSERT_EQ(want, dst.bits(d))
                << sdk::dtype_name(from) << " -> " << sdk::dtype_name(to) << " element " << s;
          }
    }
}

// The batch-norm kernels' channel index (cuda_channel_walk.h) is i % C at every step of a
// grid-stride walk: strides below, equal to and far above C, C = 1, and a start past C.
TEST(cuda_channel_walk, EveryStepIsTheElementsChannel) {
  for (std::int64_t ch : {1, 3, 64, 2048})
    for (std::int64_t stride : {1, 7, 64, 256, 132 * 2048, 1000003})
      for (std::int64_t first : {std::int64_t{0}, std::int64_t{5}, stride - 1, 3 * ch + 2}) {
        mixtrain::backend_cuda::ChannelWalk walk(first, stride, ch);
        for (std::int64_t i = first, k = 0; k < 500; i += stride, ++k, walk.advance())
          ASSERT_EQ(walk.c, i % ch) << "C " << ch << ", stride " << stride << ", first " << first;
      }
}

// The pooling backward's windows holding an input position (cuda_pool_windows.h) are those a scan
// of every window finds, in 32 and 64 bits: ResNet's 3x3/2 pad 1, the 7x7 global pool, a window
// smaller than its stride (positions in no window), and strides up to the type's maximum (where
// first + stride - 1 overflowed 32 bits).
template <class I>
void pool_windows_match_a_scan() {
  struct Axis {
    std::int64_t size;
    int k, stride, pad;
  };
  const Axis axes[] = {{112, 3, 2, 1},           {7, 7, 7, 0},        {10, 2, 5, 1}, {9, 3, 1, 1},
                       {4, 1, INT32_MAX - 1, 0}, {5, 3, INT32_MAX, 1}};
  for (const Axis& a : axes) {
    const std::int64_t out = (a.size + 2 * a.pad - a.k) / a.stride + 1;
    for (std::int64_t pos = 0; pos < a.size; ++pos) {
      std::int64_t want_lo = out, want_hi = -1;
      for (std::int64_t o = 0; o < out; ++o) {
        const std::int64_t start = o * a.stride - a.pad;
        if (start <= pos && pos < start + a.k) {
          want_lo = std::min(want_lo, o);
          want_hi = std::max(want_hi, o);
        }
      }
      I lo = 0, hi = 0;
      mixtrain::backend_cuda::pool_windows_of<I>(static_cast<I>(pos), a.pad, a.k, a.stride,
                                                 static_cast<I>(out), &lo, &hi);
      const std::string what = std::to_string(sizeof(I) * 8) + "-bit, size " +
                               std::to_string(a.size) + " k " + std::to_string(a.k) + " stride " +
                               std::to_string(a.stride) + " pad " + std::to_string(a.pad) +
                               ", position " + std::to_string(pos);
      if (want_hi < 0) {
        EXPECT_GT(lo, hi) << what << ": in no window";
      } else {
        EXPECT_EQ(lo, want_lo) << what;
        EXPECT_EQ(hi, want_hi) << what;
      }
    }
  }
}

TEST(cuda_pool_windows, TheWindowsHoldingAPositionAreTheScansInBothWidths) {
  pool_windows_match_a_scan<std::int32_t>();
  pool_windows_match_a_scan<std::int64_t>();
}

}  // namespace
