// The CUDA backend's block-scaled ops (fp8-block on sm_90; mxfp8 and nvfp4 on sm_100+) against the
// SDK's reference and the CPU backend's exact simulator: the quantize kernels bit for bit,
// gemm_block_scaled within a bound derived from fp32 accumulation (below), the refusals. Device
// tests: they skip without a GPU, and each recipe's cases skip, saying why, on a GPU (or cuBLASLt)
// that does not run it; the refusal test runs on every GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/float_format_rules.h"

namespace mixtrain::backend_cuda::testing {
namespace {

using sdk::BlockElement;
using sdk::BlockScaledLayout;
using sdk::ReductionAxis;

class backend_cuda_block_scaled : public backend_cuda_vs_cpu {
 protected:
  bool runs(const BlockScaledLayout& layout) {
    return gpu<sdk::GemmFacet>().block_layout_refusal(layout).empty();
  }
};

// The layouts of the three recipes, an activation's (blocks along cols).
const BlockScaledLayout kFp8Block = sdk::fp8_block_layout(ReductionAxis::cols);
const BlockScaledLayout kMxfp8 = sdk::mx_layout(ReductionAxis::cols, BlockElement::e4m3);
const BlockScaledLayout kNvfp4 = sdk::nvfp4_layout(ReductionAxis::cols);

// One block-scaled operand on a backend: codes [rows, cols], fp32 scales of the layout's grid and,
// for NVFP4, the fp32 tensor scale.
struct Quantized {
  Quantized(sdk::DeviceBackend& backend, const BlockScaledLayout& layout, std::int64_t rows,
            std::int64_t cols)
      : grid(sdk::block_grid(layout, rows, cols)),
        codes(backend, DType::fp8_e4m3, Shape{rows, cols}),
        scales(backend, DType::fp32, Shape{grid.rows, grid.cols}),
        tensor_scale(backend, DType::fp32, Shape{1}, std::vector<float>{1.0f}) {
    op.codes = codes.view();
    op.scales = scales.view();
    if (layout.tensor_scale) op.tensor_scale = tensor_scale.view();
    op.layout = layout;
  }
  sdk::BlockExtent grid;
  Tensor codes, scales, tensor_scale;
  sdk::BlockScaledOperand op;
};

std::uint32_t bits(float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

// Values over 2^-20 .. 2^20 by row band, a zero block, a NaN, an infinity.
std::vector<float> awkward(std::int64_t rows, std::int64_t cols, std::uint32_t seed) {
  std::vector<float> v = random_values(static_cast<std::size_t>(rows * cols), seed);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      float& x = v[static_cast<std::size_t>(r * cols + c)];
      x = std::ldexp(x, static_cast<int>((r * 7 + c / 128 * 3) % 41) - 20);
      if (r < 128 && c < 128 && rows > 128 && cols > 128) x = 0.0f;
    }
  v[static_cast<std::size_t>(cols + 5)] = std::nanf("");
  v[v.size() - 3] = INFINITY;
  return v;
}

void expect_like_reference(const Quantized& q, const sdk::BlockScaledTensor& want,
                           const std::string& what) {
  const std::vector<std::uint8_t> codes = q.codes.raw();
  ASSERT_EQ(codes, want.codes) << what;
  const std::vector<float> scales = q.scales.get();
  ASSERT_EQ(static_cast<std::int64_t>(scales.size()), q.grid.rows * q.grid.cols) << what;
  // The op stores decode scales as fp32 for every layout; the reference keeps 8-bit ones as codes.
  for (std::size_t i = 0; i < scales.size(); ++i) {
    const auto bi = static_cast<std::int64_t>(i) / q.grid.cols;
    const auto bj = static_cast<std::int64_t>(i) % q.grid.cols;
    ASSERT_EQ(bits(scales[i]), bits(sdk::block_scale_value(want, bi, bj)))
        << what << " scale " << i;
  }
  if (want.layout.tensor_scale) {
    ASSERT_EQ(bits(q.tensor_scale.get()[0]), bits(want.tensor_scale)) << what << " tensor scale";
  }
}

// Quantizes src [rows, cols] on the GPU into an output stored transposed (gemm facet 1.4) under
// `layout` (src's), and checks it against the SDK's reference of src, transposed.
void expect_transposed_like_reference(sdk::DeviceBackend& gpu, sdk::GemmFacet& gemm,
                                      const Tensor& src, const std::vector<float>& stored,
                                      std::int64_t rows, std::int64_t cols,
                                      const BlockScaledLayout& layout, bool stochastic,
                                      const std::string& what) {
  BlockScaledLayout layout_t = layout;
  std::swap(layout_t.block_rows, layout_t.block_cols);
  Quantized q(gpu, layout_t, cols, rows);
  q.op.transpose = true;
  sdk::BlockQuantizeArgs args;
  args.src = src.view();
  args.outputs[0] = q.op;
  args.stochastic_rounding = stochastic;
  args.seed = 31;
  gemm.quantize_block_scaled(args);
  sdk::BlockQuantizeOptions options;
  if (stochastic) options.stochastic_rounding_seed = 31;
  const auto ref = sdk::quantize_block_scaled(stored, rows, cols, layout, options);
  const std::vector<std::uint8_t> codes = q.codes.raw();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(codes[static_cast<std::size_t>(c * rows + r)],
                ref.codes[static_cast<std::size_t>(r * cols + c)])
          << what << " transposed (" << r << ", " << c << ")";
  const sdk::BlockExtent grid = sdk::block_grid(layout, rows, cols);
  const std::vector<float> scales = q.scales.get();
  for (std::int64_t bi = 0; bi < grid.rows; ++bi)
    for (std::int64_t bj = 0; bj < grid.cols; ++bj)
      ASSERT_EQ(bits(scales[static_cast<std::size_t>(bj * grid.rows + bi)]),
                bits(sdk::block_scale_value(ref, bi, bj)))
          << what << " transposed scale (" << bi << ", " << bj << ")";
  if (layout.tensor_scale) {
    ASSERT_EQ(bits(q.tensor_scale.get()[0]), bits(ref.tensor_scale)) << what;
  }
}

TEST_F(backend_cuda_block_scaled, Fp8BlockQuantizeGivesTheSdkReferenceBitForBit) {
  if (!runs(kFp8Block)) {
    GTEST_SKIP() << "not on this device: " << gpu<sdk::GemmFacet>().block_layout_refusal(kFp8Block);
  }
  // 300 x 260: partial tiles both ways; one call makes both quantizations of an activation.
  constexpr std::int64_t rows = 300, cols = 260;
  const std::vector<float> x = awkward(rows, cols, 3);
  for (DType src_dtype : {DType::fp32, DType::bf16, DType::fp16})
    for (BlockElement e : {BlockElement::e4m3, BlockElement::e5m2})
      for (bool pow2 : {false, true}) {
        Tensor src(gpu(), src_dtype, Shape{rows, cols}, x);
        const std::vector<float> stored = src.get();  // the source as the kernel reads it
        const BlockScaledLayout along_cols = sdk::fp8_block_layout(ReductionAxis::cols, e, pow2);
        const BlockScaledLayout along_rows = sdk::fp8_block_layout(ReductionAxis::rows, e, pow2);
        const BlockScaledLayout weight = sdk::fp8_block_weight_layout(e, pow2);
        Quantized q0(gpu(), along_cols, rows, cols), q1(gpu(), along_rows, rows, cols),
            qw(gpu(), weight, rows, cols);
        sdk::BlockQuantizeArgs args;
        args.src = src.view();
        args.outputs[0] = q0.op;
        args.outputs[1] = q1.op;
        gpu<sdk::GemmFacet>().quantize_block_scaled(args);
        sdk::BlockQuantizeArgs w;
        w.src = src.view();
        w.outputs[0] = qw.op;
        w.stochastic_rounding = true;
        w.seed = 1234;
        gpu<sdk::GemmFacet>().quantize_block_scaled(w);
        const std::string what = std::string(sdk::dtype_name(src_dtype)) + " " +
                                 (e == BlockElement::e5m2 ? "e5m2" : "e4m3") +
                                 (pow2 ? " pow2" : "");
        expect_like_reference(q0, sdk::quantize_block_scaled(stored, rows, cols, along_cols),
                              what + " 1x128");
        expect_like_reference(q1, sdk::quantize_block_scaled(stored, rows, cols, along_rows),
                              what + " 128x1");
        sdk::BlockQuantizeOptions sr;
        sr.stochastic_rounding_seed = 1234;
        expect_like_reference(qw, sdk::quantize_block_scaled(stored, rows, cols, weight, sr),
                              what + " 128x128 stochastic");
        // Stored transposed (facet 1.4): wgrad's operands and dgrad's weight.
        for (const BlockScaledLayout& l : {along_rows, weight})
          expect_transposed_like_reference(gpu(), gpu<sdk::GemmFacet>(), src, stored, rows, cols, l,
                                           pow2, what + " " + sdk::describe(l));
      }
}

TEST_F(backend_cuda_block_scaled, MxAndNvfp4QuantizeGivesTheSdkReferenceBitForBit) {
  // 300 x 260: partial blocks both ways; both quantizations of an activation, stochastic for a
  // gradient's, the 16 x 16 weight blocks.
  constexpr std::int64_t rows = 300, cols = 260;
  const std::vector<float> x = awkward(rows, cols, 4);
  std::vector<std::pair<BlockScaledLayout, bool>> layouts;  // (layout, stochastic)
  for (BlockElement e : {BlockElement::e4m3, BlockElement::e5m2})
    for (ReductionAxis axis : {ReductionAxis::cols, ReductionAxis::rows})
      layouts.push_back({sdk::mx_layout(axis, e), axis == ReductionAxis::rows});
  layouts.push_back(
      {sdk::mx_layout(ReductionAxis::cols, BlockElement::e4m3, sdk::MxScaleRule::round_up), false});
  for (ReductionAxis axis : {ReductionAxis::cols, ReductionAxis::rows})
    layouts.push_back({sdk::nvfp4_layout(axis), axis == ReductionAxis::rows});
  layouts.push_back({sdk::nvfp4_weight_layout(), false});
  int ran = 0;
  for (const auto& [layout, stochastic] : layouts) {
    if (!runs(layout)) continue;
    ++ran;
    for (DType src_dtype : {DType::fp32, DType::bf16}) {
      Tensor src(gpu(), src_dtype, Shape{rows, cols}, x);
      const std::vector<float> stored = src.get();
      Quantized q(gpu(), layout, rows, cols);
      sdk::BlockQuantizeArgs args;
      args.src = src.view();
      args.outputs[0] = q.op;
      args.stochastic_rounding = stochastic;
      args.seed = 77;
      gpu<sdk::GemmFacet>().quantize_block_scaled(args);
      sdk::BlockQuantizeOptions options;
      if (stochastic) options.stochastic_rounding_seed = 77;
      expect_like_reference(q, sdk::quantize_block_scaled(stored, rows, cols, layout, options),
                            std::string(sdk::dtype_name(src_dtype)) + " " + sdk::describe(layout));
      expect_transposed_like_reference(
          gpu(), gpu<sdk::GemmFacet>(), src, stored, rows, cols, layout, stochastic,
          std::string(sdk::dtype_name(src_dtype)) + " " + sdk::describe(layout));
    }
  }
  if (ran == 0) {
    GTEST_SKIP() << "mxfp8 / nvfp4 do not run on this device: "
                 << gpu<sdk::GemmFacet>().block_layout_refusal(kMxfp8);
  }
}

TEST_F(backend_cuda_block_scaled, AnEmptySourceStillWritesNvfp4sTensorScaleAsTheReference) {
  // No blocks, but the tensor scale is an output: a stale value in the caller's buffer must go.
  if (!runs(kNvfp4)) {
    GTEST_SKIP() << "nvfp4 does not run on this device: "
                 << gpu<sdk::GemmFacet>().block_layout_refusal(kNvfp4);
  }
  for (const Shape& shape : {Shape{0, 32}, Shape{16, 0}}) {
    Tensor src(gpu(), DType::fp32, Shape{1, 32});
    src.set(std::vector<float>(32, 1.0f));
    // Buffers of one block, viewed as empty: an output is one with codes.data set (backend_gemm.h),
    // which an allocation of no bytes may not give.
    Quantized q(gpu(), kNvfp4, 1, 32);
    q.tensor_scale.set(std::vector<float>{7.0f});
    const sdk::BlockExtent grid = sdk::block_grid(kNvfp4, shape[0], shape[1]);
    q.op.codes.shape = shape;
    q.op.scales.shape = Shape{grid.rows, grid.cols};
    sdk::BlockQuantizeArgs args;
    args.src = src.view();
    args.src.shape = shape;
    args.outputs[0] = q.op;
    gpu<sdk::GemmFacet>().quantize_block_scaled(args);
    const auto want = sdk::quantize_block_scaled({}, shape[0], shape[1], kNvfp4);
    EXPECT_EQ(bits(q.tensor_scale.get()[0]), bits(want.tensor_scale))
        << shape[0] << " x " << shape[1];
  }
}

// --- gemm_block_scaled against the CPU simulator
// --------------------------------------------------

// The bound. Both backends compute z = alpha * sum_j p_j * (s_a,j * s_b,j) (+ beta C + bias) with
// p_j the dot product of k-block j's element values. The CPU simulator takes p_j exactly and
// rounds it once to fp32, then one rounding for the scale product, one for the multiply and one per
// addition over the L blocks: within (L + 3) * 2^-24 of S = sum_k |a_k| |b_k| (the dequantized
// magnitudes), relative. cuBLASLt's kernels on Hopper accumulate each block's products on the FP8
// Tensor Cores with fewer bits before promoting to fp32 (DeepSeek-V3's report measured about 14
// bits kept; a simulation of these cases truncating to 14 bits per 32-deep step reached 0.65 of
// 2^-13 * S, to 13 bits 1.8 of it): taken as 2^-11 * S, which a wrong scale or layout (errors of
// order S) still far exceeds, then fp32 steps in an order of their own, again (L + 3) * 2^-24
// * S. So |gpu - cpu| <= (2^-11 + (L + 3) * 2^-23) * |alpha| * S, plus one rounding of each
// stored output to its dtype (ulp_rel(C) * |z|, on either side: twice), with GELU's slope (< 1.13)
// on the error of an activated output.
struct GemmCase {
  const char* name;
  std::int64_t m, n, k;
  bool a_t, b_t;             // op(A) = A^T, op(B) = B^T
  BlockScaledLayout la, lb;  // as stored
  DType c;
  bool bias, gelu;
  float alpha, beta;
};

std::vector<GemmCase> cases() {
  const auto cols = sdk::fp8_block_layout(ReductionAxis::cols);
  const auto rows = sdk::fp8_block_layout(ReductionAxis::rows);
  const auto w = sdk::fp8_block_weight_layout();
  const auto w2 = sdk::fp8_block_weight_layout(BlockElement::e4m3, true);
  const auto mx_cols = sdk::mx_layout(ReductionAxis::cols, BlockElement::e4m3);
  const auto mx_rows = sdk::mx_layout(ReductionAxis::rows, BlockElement::e4m3);
  const auto mx_rows_e5m2 = sdk::mx_layout(ReductionAxis::rows, BlockElement::e5m2);
  const auto nv_cols = sdk::nvfp4_layout(ReductionAxis::cols);
  const auto nv_rows = sdk::nvfp4_layout(ReductionAxis::rows);
  const auto nv_w = sdk::nvfp4_weight_layout();
  return {
      // forward y = x W^T: 128-multiples (D is C) and a shape padded on every dim.
      {"forward_aligned", 256, 384, 512, false, true, cols, w, DType::bf16, false, false, 1.0f,
       0.0f},
      {"forward_padded_bias_gelu", 40, 48, 160, false, true, cols, w2, DType::bf16, true, true,
       0.5f, 0.0f},
      // dgrad dx = dy W: W read along its rows (packed).
      {"dgrad", 64, 200, 256, false, false, cols, w, DType::fp32, false, false, 1.0f, 0.0f},
      // wgrad dW (+)= dy^T x: both second quantizations, blocked along the batch.
      {"wgrad_accumulate", 96, 160, 300, true, false, rows, rows, DType::fp32, false, false, 1.0f,
       1.0f},
      // mxfp8: the weight 1 x 32 along its k in forward, 32 x 1 (its second quantization) in
      // dgrad; wgrad with an e5m2 gradient.
      {"mxfp8_forward", 128, 256, 512, false, true, mx_cols, mx_cols, DType::bf16, false, false,
       1.0f, 0.0f},
      {"mxfp8_dgrad_padded_bias_gelu", 40, 72, 96, false, false, mx_cols, mx_rows, DType::fp32,
       true, true, 1.0f, 0.0f},
      {"mxfp8_wgrad_e5m2", 64, 96, 200, true, false, mx_rows_e5m2, mx_rows, DType::fp32, false,
       false, 1.0f, 1.0f},
      // nvfp4: 16 x 16 weight blocks read along either dim, the tensor scales in alpha.
      {"nvfp4_forward", 128, 256, 512, false, true, nv_cols, nv_w, DType::bf16, false, false, 1.0f,
       0.0f},
      {"nvfp4_dgrad_padded_bias", 40, 72, 96, false, false, nv_cols, nv_w, DType::fp32, true, false,
       0.5f, 0.0f},
      {"nvfp4_wgrad", 64, 96, 200, true, false, nv_rows, nv_rows, DType::fp32, false, false, 1.0f,
       1.0f},
  };
}

TEST_F(backend_cuda_block_scaled, GemmMatchesTheCpuSimulatorWithinFp32AccumulationError) {
  sdk::GemmFacet& cpu_gemm = facet_of<sdk::GemmFacet>(cpu());
  int ran = 0;
  for (const GemmCase& g : cases()) {
    if (!runs(g.la) || !runs(g.lb)) continue;
    ++ran;
    const std::int64_t ar = g.a_t ? g.k : g.m, ac = g.a_t ? g.m : g.k;
    const std::int64_t br = g.b_t ? g.n : g.k, bc = g.b_t ? g.k : g.n;
    const std::vector<float> a = random_values(static_cast<std::size_t>(ar * ac), 5, -2.0f, 2.0f);
    const std::vector<float> b = random_values(static_cast<std::size_t>(br * bc), 6, -0.5f, 0.5f);
    const std::vector<float> c0 = random_values(static_cast<std::size_t>(g.m * g.n), 7);
    const std::vector<float> bias = random_values(static_cast<std::size_t>(g.n), 8);
    // Quantized once, on the CPU (the reference); the same bytes go to the GPU.
    Tensor a_src(cpu(), DType::fp32, Shape{ar, ac}, a), b_src(cpu(), DType::fp32, Shape{br, bc}, b);
    Quantized qa(cpu(), g.la, ar, ac), qb(cpu(), g.lb, br, bc);
    for (auto [src, q] : {std::pair{&a_src, &qa}, std::pair{&b_src, &qb}}) {
      sdk::BlockQuantizeArgs args;
      args.src = src->view();
      args.outputs[0] = q->op;
      cpu_gemm.quantize_block_scaled(args);
    }
    Quantized ga(gpu(), g.la, ar, ac), gb(gpu(), g.lb, br, bc);
    gpu().copy_from_host(ga.codes.view(), qa.codes.raw().data());
    gpu().copy_from_host(gb.codes.view(), qb.codes.raw().data());
    ga.scales.set(qa.scales.get());
    gb.scales.set(qb.scales.get());
    ga.tensor_scale.set(qa.tensor_scale.get());
    gb.tensor_scale.set(qb.tensor_scale.get());

    auto run = [&](sdk::DeviceBackend& backend, Quantized& x, Quantized& y, Tensor& c, Tensor& pre,
                   Tensor& bias_t) {
      sdk::BlockScaledGemmArgs args;
      args.a = x.op;
      args.a.transpose = g.a_t;
      args.b = y.op;
      args.b.transpose = g.b_t;
      args.c = c.view();
      args.alpha = g.alpha;
      args.beta = g.beta;
      if (g.bias) args.bias = bias_t.view();
      args.has_activation = g.gelu;
      args.activation = sdk::Activation::gelu;
      if (g.gelu) args.pre_activation = pre.view();
      facet_of<sdk::GemmFacet>(backend).gemm_block_scaled(args);
    };
    Tensor c_cpu(cpu(), g.c, Shape{g.m, g.n}, c0), c_gpu(gpu(), g.c, Shape{g.m, g.n}, c0);
    Tensor p_cpu(cpu(), DType::fp32, Shape{g.m, g.n}), p_gpu(gpu(), DType::fp32, Shape{g.m, g.n});
    Tensor b_cpu(cpu(), DType::fp32, Shape{g.n}, bias), b_gpu(gpu(), DType::fp32, Shape{g.n}, bias);
    run(cpu(), qa, qb, c_cpu, p_cpu, b_cpu);
    run(gpu(), ga, gb, c_gpu, p_gpu, b_gpu);

    // S_ij = sum_k |op(A)_ik| |op(B)_kj| over the dequantized operands.
    const auto deq = [](const Quantized& q, std::int64_t r, std::int64_t cl,
                        const BlockScaledLayout& l) {
      sdk::BlockScaledTensor t;
      t.layout = l;
      t.rows = r;
      t.cols = cl;
      t.codes = q.codes.raw();
      const std::vector<float> scales = q.scales.get();
      if (l.scale == sdk::BlockScale::fp32 || l.scale == sdk::BlockScale::fp32_pow2) {
        t.scales = scales;
      } else {  // the op's fp32 decode scales as the 8-bit codes the reference stores
        const bool e8m0 = l.scale != sdk::BlockScale::e4m3;
        for (float v : scales)
          t.scale_codes.push_back(
              e8m0 ? static_cast<std::uint8_t>(sdk::format_rules::encode_e8m0(v))
                   : static_cast<std::uint8_t>(
                         sdk::format_rules::encode<sdk::format_rules::E4M3>(v, false)));
      }
      if (l.tensor_scale) t.tensor_scale = q.tensor_scale.get()[0];
      return sdk::dequantize_block_scaled(t);
    };
    const std::vector<float> da = deq(qa, ar, ac, g.la), db = deq(qb, br, bc, g.lb);
    // k-blocks: 128 (fp8-block), 32 (mxfp8) or 16 (nvfp4), the operands' common extent along k.
    const std::int64_t k_block = g.a_t ? g.la.block_rows : g.la.block_cols;
    const double L = static_cast<double>((g.k + k_block - 1) / k_block);
    const double gamma = std::ldexp(1.0, -11) + (L + 3) * std::ldexp(1.0, -23);
    const std::vector<float> got = c_gpu.get(), want = c_cpu.get();
    const std::vector<float> got_pre = p_gpu.get(), want_pre = p_cpu.get();
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        double s = 0;
        for (std::int64_t kk = 0; kk < g.k; ++kk) {
          const double x = da[static_cast<std::size_t>(g.a_t ? kk * ac + i : i * ac + kk)];
          const double y = db[static_cast<std::size_t>(g.b_t ? j * bc + kk : kk * bc + j)];
          s += std::fabs(x * y);
        }
        const std::size_t at = static_cast<std::size_t>(i * g.n + j);
        const double acc = gamma * std::fabs(g.alpha) * s;
        if (g.gelu) {
          ASSERT_LE(std::fabs(got_pre[at] - want_pre[at]), acc + 1e-30)
              << g.name << " pre_activation (" << i << ", " << j << ")";
        }
        const double out = (g.gelu ? 1.13 : 1.0) * acc +
                           2 * ulp_rel(g.c) * std::fabs(static_cast<double>(want[at])) + 1e-30;
        ASSERT_LE(std::fabs(static_cast<double>(got[at]) - want[at]), out)
            << g.name << " C (" << i << ", " << j << ") gpu " << got[at] << " cpu " << want[at];
      }
  }
  if (ran == 0) {
    GTEST_SKIP() << "no block-scaled recipe runs on this device: "
                 << gpu<sdk::GemmFacet>().block_layout_refusal(kFp8Block);
  }
}

// --- refusals ------------------------------------------------------------------------------------

TEST_F(backend_cuda_block_scaled, LayoutsThisDeviceDoesNotRunAreRefusedNamingIt) {
  sdk::GemmFacet& gemm = gpu<sdk::GemmFacet>();
  bool any_runs = false;
  for (const BlockScaledLayout& layout : {kFp8Block, kMxfp8, kNvfp4}) {
    const std::string why = gemm.block_layout_refusal(layout);
    if (why.empty()) {
      any_runs = true;
      continue;
    }
    // The device (sm_...) or the library (a cuBLAS before 12.9) is named.
    EXPECT_TRUE(why.find("sm_") != std::string::npos || why.find("cuBLAS") != std::string::npos)
        << why;
    // The quantize op raises the same refusal for an output of such a layout.
    Tensor src(gpu(), DType::fp32, Shape{4, 64}, random_values(256, 1));
    Quantized q(gpu(), layout, 4, 64);
    sdk::BlockQuantizeArgs args;
    args.src = src.view();
    args.outputs[0] = q.op;
    EXPECT_THROW(gemm.quantize_block_scaled(args), sdk::BackendError) << sdk::describe(layout);
  }
  EXPECT_EQ(gemm.supports(sdk::GemmOp::gemm_block_scaled, std::vector<DType>{DType::bf16}),
            any_runs);
}

TEST_F(backend_cuda_block_scaled, OperandsThatDoNotPairUpRaiseBackendError) {
  if (!runs(kFp8Block)) {
    GTEST_SKIP() << "not on this device: " << gpu<sdk::GemmFacet>().block_layout_refusal(kFp8Block);
  }
  const auto w = sdk::fp8_block_weight_layout();
  Quantized a(gpu(), w, 128, 256), b(gpu(), w, 128, 256);
  Tensor c(gpu(), DType::fp32, Shape{128, 128});
  sdk::BlockScaledGemmArgs args;
  args.a = a.op;
  args.b = b.op;
  args.b.transpose = true;
  args.c = c.view();
  try {
    gpu<sdk::GemmFacet>().gemm_block_scaled(args);
    ADD_FAILURE() << "a 128x128 by 128x128 product ran";
  } catch (const sdk::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("128x128"), std::string::npos) << e.what();
  }
  args.b.transpose = false;  // op(B) is [128, 256]: k 256 against 128
  EXPECT_THROW(gpu<sdk::GemmFacet>().gemm_block_scaled(args), sdk::BackendError);
}

}  // namespace
}  // namespace mixtrain::backend_cuda::testing
