// Convolution (cuDNN), pooling, the permutes and batch norm (and batch norm + add + ReLU) on the
// CUDA backend against the CPU reference. Skipped without a device (cuda_test_util.h's fixture).
// Tolerances: conv outputs accumulate in FP32 in another order (and with TF32 only where allowed),
// so fp32 results agree to ~1e-4 relative of the sum's magnitude, 16-bit outputs to one unit of
// their format, a tf32 dbias to the tf32 rounding of its terms; pooling's max forward is exact and
// its backward is the fp32 window-order sum rounded once; batch norm's statistics are FP32 from
// double sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_convolution.h"
#include "cuda_element_math.h"
#include "cuda_test_util.h"
#include "mixtrain/sdk/backend_plan_report.h"

namespace mixtrain::backend_cuda::testing {
namespace {

sdk::Conv2dGeometry geometry(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                             std::int64_t o, std::int64_t k, std::int64_t stride, std::int64_t pad,
                             std::int64_t groups = 1) {
  sdk::Conv2dGeometry g;
  g.batch = n;
  g.in_channels = c;
  g.height = h;
  g.width = w;
  g.out_channels = o;
  g.kernel_h = g.kernel_w = k;
  g.stride_h = g.stride_w = stride;
  g.pad_h = g.pad_w = pad;
  g.groups = groups;
  return g;
}

// |a - b| <= tol * (max |b| + 1e-3) over the tensor: accumulation-order differences scale with
// the magnitude of the sums, not of each element.
void expect_close_norm(const std::vector<float>& got, const std::vector<float>& want, double tol,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1e-3;
  for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), tol * scale)
        << what << ": element " << i << " gpu " << got[i] << " cpu " << want[i];
}

double conv_tol(DType out) {
  return out == DType::bf16 ? 1.0 / 64 : out == DType::fp16 ? 1.0 / 512 : 1e-4;
}

class backend_cuda_layers : public backend_cuda_vs_cpu {
 protected:
  void batch_norm_matches_the_cpu(std::int64_t rows, std::int64_t c,
                                  std::initializer_list<DType> dtypes);
};

#ifdef MIXTRAIN_HAVE_CUDNN
TEST_F(backend_cuda_layers, ConvolutionFacetIsOfferedWithoutFp8) {
  auto* conv = sdk::facet<sdk::ConvolutionFacet>(gpu());
  ASSERT_NE(conv, nullptr);
  using C = sdk::ConvolutionOp;
  EXPECT_TRUE(
      conv->supports(C::conv2d_forward, std::vector<DType>{DType::bf16, DType::bf16, DType::bf16}));
  EXPECT_FALSE(conv->supports(C::conv2d_forward,
                              std::vector<DType>{DType::fp8_e4m3, DType::fp8_e4m3, DType::fp32}));
}

// Every convolution op of `gpu` against the CPU backend: four geometries, every storage dtype, fp32
// and tf32 compute; prints the plans cuDNN chose.
// `wgrad_rounded`: the backend takes a 16-bit operand's weight gradient in that dtype
// (conv_wgrad_in_operand_dtype), one more rounding of dw: its unit roundoff, relative (2^-8 for
// bf16, 2^-11 for fp16; the accumulating call adds two such dw, still within it of their sum).
void convolutions_match_the_cpu(CudaBackend& gpu, backend_cpu::CpuBackend& cpu,
                                bool wgrad_rounded = false) {
  struct Case {
    const char* name;
    sdk::Conv2dGeometry g;
  };
  const std::vector<Case> cases = {
      {"3x3 stride 1 pad 1", geometry(2, 16, 9, 9, 24, 3, 1, 1)},
      {"1x1", geometry(2, 32, 8, 8, 16, 1, 1, 0)},
      {"7x7 stride 2 pad 3", geometry(2, 3, 20, 20, 16, 7, 2, 3)},
      {"3x3 groups 4", geometry(2, 16, 7, 7, 8, 3, 1, 1, 4)},
  };
  for (const Case& cs : cases)
    for (DType dt : {DType::fp32, DType::bf16, DType::fp16})
      for (DType compute : {DType::fp32, DType::tf32}) {
        if (compute == DType::tf32 && dt != DType::fp32) continue;
        const auto& g = cs.g;
        const std::string what = std::string(cs.name) + " " + std::string(sdk::dtype_name(dt)) +
                                 (compute == DType::tf32 ? " tf32" : "");
        const Shape xs{g.batch, g.height, g.width, g.in_channels};
        const Shape ys{g.batch, g.out_height(), g.out_width(), g.out_channels};
        const Shape ws{g.out_channels, g.in_channels / g.groups, g.kernel_h, g.kernel_w};
        const auto xv = random_values(static_cast<std::size_t>(xs.numel()), 1);
        const auto wv = random_values(static_cast<std::size_t>(ws.numel()), 2);
        const auto dyv = random_values(static_cast<std::size_t>(ys.numel()), 3);
        const auto bv = random_values(static_cast<std::size_t>(g.out_channels), 4);
        const double tol = compute == DType::tf32 ? 4e-3 : conv_tol(dt);
        Tensor xg(gpu, dt, xs, xv), xc(cpu, dt, xs, xv);
        Tensor wg(gpu, dt, ws, wv), wc(cpu, dt, ws, wv);
        Tensor dyg(gpu, dt, ys, dyv), dyc(cpu, dt, ys, dyv);
        Tensor bg(gpu, DType::fp32, Shape{g.out_channels}, bv),
            bc(cpu, DType::fp32, Shape{g.out_channels}, bv);
        // forward with bias
        Tensor yg(gpu, dt, ys), yc(cpu, dt, ys);
        sdk::Conv2dForwardArgs f;
        f.geometry = g;
        f.compute = compute;
        f.x = {xg, false, 1.0f};
        f.w = {wg, false, 1.0f};
        f.bias = bg;
        f.y = yg;
        facet_of<sdk::ConvolutionFacet>(gpu).conv2d_forward(f);
        f.x = {xc, false, 1.0f};
        f.w = {wc, false, 1.0f};
        f.bias = bc;
        f.y = yc;
        sdk::facet<sdk::ConvolutionFacet>(cpu)->conv2d_forward(f);
        expect_close_norm(yg.get(), yc.get(), tol, "fprop " + what);
        // backward data
        Tensor dxg(gpu, dt, xs), dxc(cpu, dt, xs);
        sdk::Conv2dBackwardDataArgs d;
        d.geometry = g;
        d.compute = compute;
        d.dy = {dyg, false, 1.0f};
        d.w = {wg, false, 1.0f};
        d.dx = dxg;
        facet_of<sdk::ConvolutionFacet>(gpu).conv2d_backward_data(d);
        d.dy = {dyc, false, 1.0f};
        d.w = {wc, false, 1.0f};
        d.dx = dxc;
        sdk::facet<sdk::ConvolutionFacet>(cpu)->conv2d_backward_data(d);
        expect_close_norm(dxg.get(), dxc.get(), tol, "dgrad " + what);
        // backward data into an fp32 sum (convolution 1.1; the CPU's implementation, which it
        // does not offer, is the reference)
        const auto sum0 = random_values(static_cast<std::size_t>(xs.numel()), 5);
        Tensor sumg(gpu, DType::fp32, xs, sum0), sumc(cpu, DType::fp32, xs, sum0);
        d.dy = {dyg, false, 1.0f};
        d.w = {wg, false, 1.0f};
        d.dx = sumg;
        facet_of<sdk::ConvolutionFacet>(gpu).conv2d_backward_data_accumulate(d);
        d.dy = {dyc, false, 1.0f};
        d.w = {wc, false, 1.0f};
        d.dx = sumc;
        sdk::facet<sdk::ConvolutionFacet>(cpu)->conv2d_backward_data_accumulate(d);
        expect_close_norm(sumg.get(), sumc.get(), tol, "dgrad into a sum " + what);
        // backward weights, twice: overwrite then accumulate
        Tensor dwg(gpu, DType::fp32, ws), dwc(cpu, DType::fp32, ws);
        Tensor dbg(gpu, DType::fp32, Shape{g.out_channels}),
            dbc(cpu, DType::fp32, Shape{g.out_channels});
        for (bool acc : {false, true}) {
          sdk::Conv2dBackwardWeightsArgs b;
          b.geometry = g;
          b.compute = compute;
          b.accumulate = acc;
          b.x = {xg, false, 1.0f};
          b.dy = {dyg, false, 1.0f};
          b.dw = dwg;
          b.dbias = dbg;
          facet_of<sdk::ConvolutionFacet>(gpu).conv2d_backward_weights(b);
          b.x = {xc, false, 1.0f};
          b.dy = {dyc, false, 1.0f};
          b.dw = dwc;
          b.dbias = dbc;
          sdk::facet<sdk::ConvolutionFacet>(cpu)->conv2d_backward_weights(b);
          const double rounding = !wgrad_rounded      ? 0.0
                                  : dt == DType::bf16 ? 0x1p-8
                                  : dt == DType::fp16 ? 0x1p-11
                                                      : 0.0;
          const double wtol = (compute == DType::tf32 ? 4e-3 : 1e-4) + rounding;
          expect_close_norm(dwg.get(), dwc.get(), wtol,
                            "wgrad " + what + (acc ? " accumulate" : ""));
          if (compute != DType::tf32) {
            expect_close_norm(dbg.get(), dbc.get(), 1e-5, "dbias " + what);
            continue;
          }
          // Under tf32 cuDNN may sum dy as tf32 operands: each dy then loses up to one tf32 unit
          // (2^-10 relative, truncated), so dbias_c moves by up to 2^-10·Σ|dy_c|, plus FP32
          // accumulation over the N·OH·OW terms; twice that after the accumulating call.
          const auto got_g = dbg.get(), got_c = dbc.get();
          const auto dy_vals = dyc.get();
          const auto terms = static_cast<double>(g.batch * g.out_height() * g.out_width());
          for (std::int64_t c = 0; c < g.out_channels; ++c) {
            double abs_sum = 0;
            for (std::size_t i = static_cast<std::size_t>(c); i < dy_vals.size();
                 i += static_cast<std::size_t>(g.out_channels))
              abs_sum += std::fabs(dy_vals[i]);
            const double bound = (acc ? 2 : 1) * (0x1p-10 + terms * 0x1p-24) * abs_sum;
            const auto k = static_cast<std::size_t>(c);
            EXPECT_LE(std::fabs(static_cast<double>(got_g[k]) - got_c[k]), bound)
                << "dbias " << what << (acc ? " accumulate" : "") << ": channel " << c;
          }
        }
      }
  const auto report = gpu.conv_plan_report();
  EXPECT_FALSE(report.empty());
  for (const auto& line : report) std::printf("  %s\n", line.c_str());
  // The plan_report facet, what `train --profile` prints, lists the same plans.
  const auto* plans = sdk::facet<sdk::PlanReportFacet>(gpu);
  ASSERT_NE(plans, nullptr);
  int sections = 0;
  for (const sdk::PlanReport& r : plans->plan_reports())
    if (r.library == "cuDNN convolution") {
      ++sections;
      EXPECT_EQ(r.plans, report);
    }
  EXPECT_EQ(sections, 1);
}

TEST_F(backend_cuda_layers, Conv2dForwardBackwardMatchTheCpu) {
  convolutions_match_the_cpu(gpu(), cpu());
}

// deterministic_convolutions = false: cuDNN's heuristic order, non-deterministic engines
// included, within the same bounds.
TEST_F(backend_cuda_layers, Conv2dWithoutDeterminismMatchesTheCpuToo) {
  CudaBackend fastest(CudaOptions{.device = 0, .deterministic_convolutions = false});
  convolutions_match_the_cpu(fastest, cpu());
}

// conv_wgrad_in_operand_dtype: dw from cuDNN in the 16-bit operands' dtype where an engine takes
// it, within one rounding of it; the plan report says which keys ran so.
TEST_F(backend_cuda_layers, Conv2dWithTheWeightGradientInTheOperandDtypeMatchesTheCpu) {
  CudaBackend wgrad16(CudaOptions{.device = 0, .conv_wgrad_in_operand_dtype = true});
  convolutions_match_the_cpu(wgrad16, cpu(), true);
  int sixteen_bit_dw = 0;
  for (const auto& line : wgrad16.conv_plan_report())
    if (line.starts_with("wgrad") && line.find("declined") == std::string::npos &&
        (line.find("out bf16") != std::string::npos || line.find("out f16") != std::string::npos))
      ++sixteen_bit_dw;
  std::printf("  %d weight-gradient plans write the operands' 16-bit dtype\n", sixteen_bit_dw);
}

// conv_autotune = 4: every shape's fastest of its first 4 engines, within the same bounds; each
// plan's report line says what was measured.
TEST_F(backend_cuda_layers, Conv2dWithAutotuningMatchesTheCpuAndReportsItsTimings) {
  CudaBackend tuned(CudaOptions{.device = 0, .conv_autotune = 4});
  convolutions_match_the_cpu(tuned, cpu());
  for (const auto& line : tuned.conv_plan_report()) {
    if (line.find("declined") != std::string::npos) continue;
    EXPECT_TRUE(line.find("autotuned over") != std::string::npos ||
                line.find("one candidate") != std::string::npos)
        << line;
  }
}

TEST_F(backend_cuda_layers, Fp32ComputeRunsNoTensorCoreEngine) {
  const auto g = geometry(2, 16, 8, 8, 16, 3, 1, 1);
  const Shape xs{2, 8, 8, 16}, ws{16, 16, 3, 3}, ys{2, 8, 8, 16};
  Tensor x(gpu(), DType::fp32, xs, random_values(xs.numel(), 5));
  Tensor w(gpu(), DType::fp32, ws, random_values(ws.numel(), 6));
  Tensor y(gpu(), DType::fp32, ys);
  sdk::Conv2dForwardArgs f;
  f.geometry = g;
  f.x = {x, false, 1.0f};
  f.w = {w, false, 1.0f};
  f.y = y;
  gpu<sdk::ConvolutionFacet>().conv2d_forward(f);
  gpu().synchronize();
  for (const auto& line : gpu().conv_plan_report()) {
    if (line.find("no tf32") != std::string::npos && line.find("declined") == std::string::npos) {
      EXPECT_EQ(line.find("TENSOR_CORE"), std::string::npos) << line;
    }
  }
}

// Pooling's dx. Max: each input element gets the dy of every window whose first maximum
// (row-major window order, in-image elements only) it is. Average: each in-image element gets
// dy / count of every window holding it (count: KH·KW with count_include_pad, else the window's
// in-image elements; element::pool_average, the kernel's division). In double, and in fp32 in
// window order (oh, then ow: the CUDA kernel's order). Also Σ|term| and the number of terms per
// element, for the rounding bound of a backend that accumulates in the storage format.
struct PoolGradient {
  std::vector<double> dx, abs_sum;
  std::vector<float> dx32;
  std::vector<int> terms;
};
PoolGradient pool_gradient(const sdk::Pool2dGeometry& p, const std::vector<float>& x,
                           const std::vector<float>& dy) {
  const std::int64_t oh_n = p.out_height(), ow_n = p.out_width(), c_n = p.channels;
  PoolGradient r;
  r.dx.assign(x.size(), 0.0);
  r.dx32.assign(x.size(), 0.0f);
  r.abs_sum.assign(x.size(), 0.0);
  r.terms.assign(x.size(), 0);
  const auto add = [&](std::int64_t i, float term) {
    const auto b = static_cast<std::size_t>(i);
    r.dx[b] += term;
    r.dx32[b] += term;
    r.abs_sum[b] += std::fabs(term);
    ++r.terms[b];
  };
  for (std::int64_t n = 0; n < p.batch; ++n)
    for (std::int64_t oh = 0; oh < oh_n; ++oh)
      for (std::int64_t ow = 0; ow < ow_n; ++ow)
        for (std::int64_t c = 0; c < c_n; ++c) {
          std::vector<std::int64_t> in_image;
          for (std::int64_t kh = 0; kh < p.kernel_h; ++kh)
            for (std::int64_t kw = 0; kw < p.kernel_w; ++kw) {
              const std::int64_t h = oh * p.stride_h - p.pad_h + kh;
              const std::int64_t w = ow * p.stride_w - p.pad_w + kw;
              if (h < 0 || h >= p.height || w < 0 || w >= p.width) continue;
              in_image.push_back(((n * p.height + h) * p.width + w) * c_n + c);
            }
          const float g = dy[static_cast<std::size_t>(((n * oh_n + oh) * ow_n + ow) * c_n + c)];
          if (p.kind == sdk::PoolKind::max) {
            std::int64_t best = -1;
            for (std::int64_t i : in_image)
              if (best < 0 || x[static_cast<std::size_t>(i)] > x[static_cast<std::size_t>(best)])
                best = i;
            add(best, g);
          } else {
            const int count = p.count_include_pad ? static_cast<int>(p.kernel_h * p.kernel_w)
                                                  : static_cast<int>(in_image.size());
            for (std::int64_t i : in_image) add(i, element::pool_average(g, count));
          }
        }
  return r;
}

// The pooling kernels' index width (host only): 32-bit where every index fits, ResNet-50's
// first max pool at batch 128 among them; 64-bit past 2^31 elements.
TEST(cuda_pool_index, ThirtyTwoBitIndicesOnlyWhereEveryIndexFits) {
  kernels::PoolShape p{128, 64, 112, 112, 56, 56, 3, 3, 2, 2, 1, 1, true, false};
  EXPECT_TRUE(kernels::pool_index_fits(p));
  p.n = 2048;  // 1.64e9 input elements (1.73e9 with the window margin)
  EXPECT_TRUE(kernels::pool_index_fits(p));
  p.n = 2600;  // 2.09e9 elements, past 2^31 - 1 with the margin
  EXPECT_FALSE(kernels::pool_index_fits(p));
  p.n = 4096;
  EXPECT_FALSE(kernels::pool_index_fits(p));
}

// 5 channels take the backward's one-element kernel, 16 its packs of 8 channels.
TEST_F(backend_cuda_layers, PoolingMatchesTheCpu) {
  // A 3x3 window keeps the max pool's argmax in bytes; a 16x16 one (256 positions, max only, the
  // windows apart so each input gets one term) in int32 (kernels::pool_argmax_in_bytes).
  for (std::int64_t kernel : {3, 16})
    for (std::int64_t channels : {5, 16})
      for (DType dt : {DType::fp32, DType::bf16, DType::fp16})
        for (int kind = 0; kind < (kernel == 3 ? 3 : 1); ++kind) {
          sdk::Pool2dGeometry p;
          p.kind = kind == 0 ? sdk::PoolKind::max : sdk::PoolKind::average;
          p.count_include_pad = kind != 2;
          p.batch = 2;
          p.channels = channels;
          p.height = p.width = kernel == 3 ? 9 : 32;
          p.kernel_h = p.kernel_w = kernel;
          p.stride_h = p.stride_w = kernel == 3 ? 2 : 16;
          p.pad_h = p.pad_w = kernel == 3 ? 1 : 0;
          const Shape xs{2, p.height, p.width, channels},
              ys{2, p.out_height(), p.out_width(), channels};
          const auto xv = random_values(xs.numel(), 7), dyv = random_values(ys.numel(), 8);
          Tensor xg(gpu(), dt, xs, xv), xc(cpu(), dt, xs, xv);
          Tensor dyg(gpu(), dt, ys, dyv), dyc(cpu(), dt, ys, dyv);
          Tensor yg(gpu(), dt, ys), yc(cpu(), dt, ys), dxg(gpu(), dt, xs), dxc(cpu(), dt, xs);
          const auto wsb_g = gpu<sdk::ConvolutionFacet>().pool2d_workspace_bytes(p, dt);
          const auto wsb_c =
              sdk::facet<sdk::ConvolutionFacet>(cpu())->pool2d_workspace_bytes(p, dt);
          Tensor wsg(gpu(), DType::int32, Shape{std::max<std::int64_t>(1, (wsb_g + 3) / 4)});
          Tensor wsc(cpu(), DType::int32, Shape{std::max<std::int64_t>(1, (wsb_c + 3) / 4)});
          for (bool with_ws : {true, false}) {
            const std::string what = std::string(sdk::dtype_name(dt)) + " kind " +
                                     std::to_string(kind) + ", window " + std::to_string(kernel) +
                                     (with_ws ? " workspace" : " recompute") + ", " +
                                     std::to_string(channels) + " channels";
            const TensorView wg = with_ws && wsb_g > 0 ? wsg.view() : TensorView{};
            const TensorView wc = with_ws && wsb_c > 0 ? wsc.view() : TensorView{};
            gpu<sdk::ConvolutionFacet>().pool2d_forward(p, xg, yg, wg);
            sdk::facet<sdk::ConvolutionFacet>(cpu())->pool2d_forward(p, xc, yc, wc);
            // Max is exact. An average of up to 9 inputs in [-1, 1] summed in another order
            // (oneDNN's kernel per ISA) differs by up to 8 roundings of partial sums at most 9,
            // over the count: under one ulp of 1 in absolute terms, which a window that cancels
            // needs.
            expect_close(yg.get(), yc.get(), kind == 0 ? 0.0 : ulp_rel(dt),
                         kind == 0 ? 0.0 : ulp_rel(dt), "pool fwd " + what);
            gpu<sdk::ConvolutionFacet>().pool2d_backward(p, dyg, xg, yg, wg, dxg);
            sdk::facet<sdk::ConvolutionFacet>(cpu())->pool2d_backward(p, dyc, xc, yc, wc, dxc);
            // An input element of overlapping windows sums up to four terms (dy, or dy / count).
            // The CUDA kernel sums in fp32 in window order and rounds once into the format: bit for
            // bit that computation. oneDNN's native bf16 backward may round after each addition: up
            // to terms − 1 roundings of a partial sum and the final one, each within u·Σ|term| (u =
            // 2^-8 bf16, 2^-11 fp16, 2^-24 fp32) of the exact sum; where the terms cancel that is
            // far from the exact value in relative terms, so the bound is absolute.
            const auto ref = pool_gradient(p, xg.get(), dyg.get());
            const auto once = decode(encode(ref.dx32, dt), dt);
            const auto got_g = dxg.get(), got_c = dxc.get();
            const double u = dt == DType::bf16 ? 0x1p-8 : dt == DType::fp16 ? 0x1p-11 : 0x1p-24;
            int reported = 0;
            for (std::size_t i = 0; i < once.size() && reported < 5; ++i) {
              const double per_rounding = u * ref.abs_sum[i];
              const bool gpu_ok = got_g[i] == once[i];
              const double cpu_bound = ref.terms[i] * per_rounding;
              const bool cpu_ok = std::fabs(got_c[i] - ref.dx[i]) <= cpu_bound;
              if (!gpu_ok || !cpu_ok) {
                ++reported;
                ADD_FAILURE() << "pool bwd " << what << ": element " << i << " (" << ref.terms[i]
                              << " windows) gpu " << got_g[i] << " cpu " << got_c[i]
                              << " fp32 sum rounded once " << once[i] << " exact " << ref.dx[i];
              }
            }
            // An fp32 dy into a 16-bit dx (the sum of several readers' gradients, not cast
            // first): offered, and the fp32 terms summed in window order and rounded once, bit
            // for bit.
            if (dt == DType::fp32) continue;
            ASSERT_TRUE(gpu<sdk::ConvolutionFacet>().supports(sdk::ConvolutionOp::pool2d_backward,
                                                              std::vector<DType>{DType::fp32, dt}));
            Tensor dy32(gpu(), DType::fp32, ys, dyv);
            gpu<sdk::ConvolutionFacet>().pool2d_backward(p, dy32, xg, yg, wg, dxg);
            const auto once32 = decode(encode(pool_gradient(p, xg.get(), dyv).dx32, dt), dt);
            EXPECT_EQ(dxg.get(), once32) << "pool bwd from an fp32 dy, " << what;
          }
        }
}

TEST_F(backend_cuda_layers, PermutesMatchTheCpuExactly) {
  const std::int64_t n = 3, c = 37, h = 5, w = 11;
  const auto v = random_values(n * c * h * w, 9, -100.0f, 100.0f);
  for (DType from : {DType::fp32, DType::bf16, DType::fp16})
    for (DType to : {DType::fp32, DType::bf16, DType::fp16}) {
      Tensor sg(gpu(), from, Shape{n, c, h, w}, v), sc(cpu(), from, Shape{n, c, h, w}, v);
      Tensor dg(gpu(), to, Shape{n, h, w, c}), dc(cpu(), to, Shape{n, h, w, c});
      gpu<sdk::ConvolutionFacet>().to_channels_last(sg, c, h, w, dg);
      sdk::facet<sdk::ConvolutionFacet>(cpu())->to_channels_last(sc, c, h, w, dc);
      expect_same_values(dg.get(), dc.get(), "to_channels_last");
      Tensor bg(gpu(), from, Shape{n, c, h, w}), bc(cpu(), from, Shape{n, c, h, w});
      gpu<sdk::ConvolutionFacet>().to_channels_first(dg, c, h, w, bg);
      sdk::facet<sdk::ConvolutionFacet>(cpu())->to_channels_first(dc, c, h, w, bc);
      expect_same_values(bg.get(), bc.get(), "to_channels_first");
    }
}
#endif  // MIXTRAIN_HAVE_CUDNN

// Batch norm's training forward, inference forward and backward (written and accumulated) at
// [rows, c] in each of `dtypes`, every output against the CPU's.
void backend_cuda_layers::batch_norm_matches_the_cpu(std::int64_t rows, std::int64_t c,
                                                     std::initializer_list<DType> dtypes) {
  const auto xv = random_values(rows * c, 10, -1.0f, 3.0f);
  const auto dyv = random_values(rows * c, 11);
  const auto gv = random_values(c, 12, 0.5f, 1.5f), bv = random_values(c, 13, -0.5f, 0.5f);
  const auto rm0 = random_values(c, 14, -0.1f, 0.1f), rv0 = random_values(c, 15, 0.5f, 1.5f);
  for (DType dt : dtypes)
    for (bool relu : {false, true}) {
      const sdk::BatchNormShape s{rows, c, 1e-5f, relu};
      const std::string what = std::string(sdk::dtype_name(dt)) + (relu ? " relu" : "") + " at [" +
                               std::to_string(rows) + ", " + std::to_string(c) + "]";
      Tensor xg(gpu(), dt, Shape{rows, c}, xv), xc(cpu(), dt, Shape{rows, c}, xv);
      Tensor yg(gpu(), dt, Shape{rows, c}), yc(cpu(), dt, Shape{rows, c});
      Tensor gg(gpu(), DType::fp32, Shape{c}, gv), gc(cpu(), DType::fp32, Shape{c}, gv);
      Tensor bg(gpu(), DType::fp32, Shape{c}, bv), bc(cpu(), DType::fp32, Shape{c}, bv);
      Tensor mg(gpu(), DType::fp32, Shape{c}), mc(cpu(), DType::fp32, Shape{c});
      Tensor vg(gpu(), DType::fp32, Shape{c}), vc(cpu(), DType::fp32, Shape{c});
      Tensor rmg(gpu(), DType::fp32, Shape{c}, rm0), rmc(cpu(), DType::fp32, Shape{c}, rm0);
      Tensor rvg(gpu(), DType::fp32, Shape{c}, rv0), rvc(cpu(), DType::fp32, Shape{c}, rv0);
      Tensor wsg(gpu(), DType::fp32, Shape{2 * c}), wsc(cpu(), DType::fp32, Shape{2 * c});
      EXPECT_EQ(gpu<sdk::BatchNormFacet>().batchnorm_workspace_bytes(s, dt),
                sdk::facet<sdk::BatchNormFacet>(cpu())->batchnorm_workspace_bytes(s, dt));
      gpu<sdk::BatchNormFacet>().batchnorm_forward_training(xg, gg, bg, s, 0.1f, yg, mg, vg, rmg,
                                                            rvg, relu ? wsg.view() : TensorView{});
      sdk::facet<sdk::BatchNormFacet>(cpu())->batchnorm_forward_training(
          xc, gc, bc, s, 0.1f, yc, mc, vc, rmc, rvc, relu ? wsc.view() : TensorView{});
      expect_close(mg.get(), mc.get(), 1e-6, 1e-7, "save_mean " + what);
      expect_close(vg.get(), vc.get(), 1e-5, 1e-7, "save_var " + what);
      expect_close(rmg.get(), rmc.get(), 1e-6, 1e-7, "running_mean " + what);
      expect_close(rvg.get(), rvc.get(), 1e-6, 1e-7, "running_var " + what);
      expect_close(yg.get(), yc.get(), 2 * ulp_rel(dt), 1e-5, "training y " + what);
      Tensor yig(gpu(), dt, Shape{rows, c}), yic(cpu(), dt, Shape{rows, c});
      gpu<sdk::BatchNormFacet>().batchnorm_forward_inference(xg, gg, bg, rmg, rvg, s, yig);
      sdk::facet<sdk::BatchNormFacet>(cpu())->batchnorm_forward_inference(xc, gc, bc, rmc, rvc, s,
                                                                          yic);
      expect_close(yig.get(), yic.get(), 2 * ulp_rel(dt), 1e-5, "inference y " + what);
      Tensor dyg(gpu(), dt, Shape{rows, c}, dyv), dyc(cpu(), dt, Shape{rows, c}, dyv);
      // The backward from the same statistics on both sides: the fused ReLU's mask is recomputed
      // from x, the mean and the workspace, and a mean one ulp apart (the GPU's from double sums,
      // the CPU's from fp32 blocks; both within save_mean's bound) flips an element near 0 at
      // 100,003 rows, moving its dx and its channel's sums by far more than any bound.
      mc.set(mg.get());
      vc.set(vg.get());
      wsc.set(wsg.get());
      for (bool acc : {false, true}) {
        Tensor dxg(gpu(), dt, Shape{rows, c}), dxc(cpu(), dt, Shape{rows, c});
        Tensor dgg(gpu(), DType::fp32, Shape{c}, gv), dgc(cpu(), DType::fp32, Shape{c}, gv);
        Tensor dbg(gpu(), DType::fp32, Shape{c}, bv), dbc(cpu(), DType::fp32, Shape{c}, bv);
        gpu<sdk::BatchNormFacet>().batchnorm_backward(
            dyg, xg, yg, gg, mg, vg, s, relu ? wsg.view() : TensorView{}, dxg, dgg, dbg, acc);
        sdk::facet<sdk::BatchNormFacet>(cpu())->batchnorm_backward(
            dyc, xc, yc, gc, mc, vc, s, relu ? wsc.view() : TensorView{}, dxc, dgc, dbc, acc);
        expect_close_norm(dxg.get(), dxc.get(), 4 * ulp_rel(dt) + 1e-5, "dx " + what);
        expect_close(dgg.get(), dgc.get(), 1e-4, 1e-5, "dgamma " + what);
        expect_close(dbg.get(), dbc.get(), 1e-4, 1e-5, "dbeta " + what);
      }
    }
}

// The GPU reads x's rows 16 at a time per thread within a split of the rows, then the tail; its
// element passes take 4 grid-stride elements a round, past 2,097,152 elements (8192 blocks of
// 256). So beside the small shape: one split's unrolled rows and tail with a channel count that
// is no multiple of 32 or of a vector (200 x 33), and every split and grid-stride round
// (100,003 x 100: 10 M elements).
TEST_F(backend_cuda_layers, BatchNormMatchesTheCpu) {
  batch_norm_matches_the_cpu(2 * 6 * 7, 24, {DType::fp32, DType::bf16, DType::fp16});
  batch_norm_matches_the_cpu(200, 33, {DType::fp32, DType::bf16});
  batch_norm_matches_the_cpu(100003, 100, {DType::fp32, DType::bf16});
}

// More channels than one round of 8192 blocks of 256 threads: the per-channel coefficient kernels
// of the inference forward and of synchronized batch norm's elementwise backward walk the grid,
// so the last channel is computed too (before, channels from 2,097,152 kept stale scratch).
TEST_F(backend_cuda_layers, BatchNormComputesChannelsPastOneRoundOfTheGrid) {
  const std::int64_t rows = 2, c = 2 * 1024 * 1024 + 2900;
  const auto xv = random_values(rows * c, 30, -1.0f, 3.0f), dyv = random_values(rows * c, 31);
  const auto gv = random_values(c, 32, 0.5f, 1.5f), bv = random_values(c, 33, -0.5f, 0.5f);
  const auto mv = random_values(c, 34, -0.1f, 0.1f), vv = random_values(c, 35, 0.5f, 1.5f);
  const auto mdy = random_values(c, 36, -0.2f, 0.2f), mdyx = random_values(c, 37, -0.2f, 0.2f);
  auto& bn = gpu<sdk::BatchNormFacet>();
  auto& ref = *sdk::facet<sdk::BatchNormFacet>(cpu());
  const sdk::BatchNormShape s{rows, c, 1e-5f, false};
  Tensor xg(gpu(), DType::fp32, Shape{rows, c}, xv), xc(cpu(), DType::fp32, Shape{rows, c}, xv);
  Tensor dyg(gpu(), DType::fp32, Shape{rows, c}, dyv), dyc(cpu(), DType::fp32, Shape{rows, c}, dyv);
  Tensor gg(gpu(), DType::fp32, Shape{c}, gv), gc(cpu(), DType::fp32, Shape{c}, gv);
  Tensor bg(gpu(), DType::fp32, Shape{c}, bv), bc(cpu(), DType::fp32, Shape{c}, bv);
  Tensor mg(gpu(), DType::fp32, Shape{c}, mv), mc(cpu(), DType::fp32, Shape{c}, mv);
  Tensor vg(gpu(), DType::fp32, Shape{c}, vv), vc(cpu(), DType::fp32, Shape{c}, vv);
  Tensor mdyg(gpu(), DType::fp32, Shape{c}, mdy), mdyc(cpu(), DType::fp32, Shape{c}, mdy);
  Tensor mdyxg(gpu(), DType::fp32, Shape{c}, mdyx), mdyxc(cpu(), DType::fp32, Shape{c}, mdyx);
  Tensor yg(gpu(), DType::fp32, Shape{rows, c}), yc(cpu(), DType::fp32, Shape{rows, c});
  bn.batchnorm_forward_inference(xg, gg, bg, mg, vg, s, yg);
  ref.batchnorm_forward_inference(xc, gc, bc, mc, vc, s, yc);
  expect_close(yg.get(), yc.get(), 2 * ulp_rel(DType::fp32), 1e-5, "inference y");
  Tensor dxg(gpu(), DType::fp32, Shape{rows, c}), dxc(cpu(), DType::fp32, Shape{rows, c});
  bn.batchnorm_backward_elementwise(dyg, xg, TensorView{}, gg, mg, vg, mdyg, mdyxg, s, dxg);
  ref.batchnorm_backward_elementwise(dyc, xc, TensorView{}, gc, mc, vc, mdyc, mdyxc, s, dxc);
  expect_close_norm(dxg.get(), dxc.get(), 4 * ulp_rel(DType::fp32) + 1e-5, "elementwise dx");
}

// Batch norm + add + ReLU against the CPU's, training (the batch's statistics, the running ones
// moved) and evaluation, the residual its own tensor or y itself; a NaN and a -inf residual pass
// through as on the CPU. The batch-norm test's tolerances.
TEST_F(backend_cuda_layers, BatchNormAddForwardMatchesTheCpu) {
  const std::int64_t rows = 2 * 6 * 7, c = 24;
  const auto xv = random_values(rows * c, 20, -1.0f, 3.0f);
  auto resv = random_values(rows * c, 21, -2.0f, 2.0f);
  resv[7] = NAN;
  resv[30] = -INFINITY;
  const auto gv = random_values(c, 22, 0.5f, 1.5f), bv = random_values(c, 23, -0.5f, 0.5f);
  const auto rm0 = random_values(c, 24, -0.1f, 0.1f), rv0 = random_values(c, 25, 0.5f, 1.5f);
  for (DType dt : {DType::fp32, DType::bf16, DType::fp16})
    for (bool training : {true, false})
      for (bool relu : {false, true})
        for (bool in_place : {false, true}) {
          const std::string what = std::string(sdk::dtype_name(dt)) +
                                   (training ? " training" : " evaluation") +
                                   (relu ? " relu" : "") + (in_place ? " residual = y" : "");
          Tensor xg(gpu(), dt, Shape{rows, c}, xv), xc(cpu(), dt, Shape{rows, c}, xv);
          Tensor rg(gpu(), dt, Shape{rows, c}, resv), rc(cpu(), dt, Shape{rows, c}, resv);
          Tensor yg(gpu(), dt, Shape{rows, c}, resv), yc(cpu(), dt, Shape{rows, c}, resv);
          Tensor gg(gpu(), DType::fp32, Shape{c}, gv), gc(cpu(), DType::fp32, Shape{c}, gv);
          Tensor bg(gpu(), DType::fp32, Shape{c}, bv), bc(cpu(), DType::fp32, Shape{c}, bv);
          Tensor mg(gpu(), DType::fp32, Shape{c}), mc(cpu(), DType::fp32, Shape{c});
          Tensor vg(gpu(), DType::fp32, Shape{c}), vc(cpu(), DType::fp32, Shape{c});
          Tensor rmg(gpu(), DType::fp32, Shape{c}, rm0), rmc(cpu(), DType::fp32, Shape{c}, rm0);
          Tensor rvg(gpu(), DType::fp32, Shape{c}, rv0), rvc(cpu(), DType::fp32, Shape{c}, rv0);
          auto args = [&](const Tensor& x, const Tensor& r, const Tensor& y, const Tensor& g,
                          const Tensor& b, const Tensor& m, const Tensor& v, const Tensor& rm,
                          const Tensor& rv) {
            sdk::BatchNormAddArgs a;
            a.x = x;
            a.residual = in_place ? y.view() : r.view();
            a.gamma = g;
            a.beta = b;
            a.shape = {rows, c, 1e-5f, relu};
            a.training = training;
            a.momentum = 0.1f;
            a.y = y;
            if (training) {
              a.save_mean = m;
              a.save_var = v;
            }
            a.running_mean = rm;
            a.running_var = rv;
            return a;
          };
          gpu<sdk::BatchNormFacet>().batchnorm_add_forward(
              args(xg, rg, yg, gg, bg, mg, vg, rmg, rvg));
          sdk::facet<sdk::BatchNormFacet>(cpu())->batchnorm_add_forward(
              args(xc, rc, yc, gc, bc, mc, vc, rmc, rvc));
          if (training) {
            expect_close(mg.get(), mc.get(), 1e-6, 1e-7, "save_mean " + what);
            expect_close(vg.get(), vc.get(), 1e-5, 1e-7, "save_var " + what);
          }
          expect_close(rmg.get(), rmc.get(), 1e-6, 1e-7, "running_mean " + what);
          expect_close(rvg.get(), rvc.get(), 1e-6, 1e-7, "running_var " + what);
          expect_close(yg.get(), yc.get(), 2 * ulp_rel(dt), 1e-5, "y " + what);
          if (!in_place) expect_same_values(rg.get(), rc.get(), "residual untouched " + what);
        }
}

}  // namespace
}  // namespace mixtrain::backend_cuda::testing
