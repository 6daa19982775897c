// The CPU backend's block-scaled ops (GemmFacet 1.2), the exact simulator: quantize_block_scaled
// bit for bit against the SDK's reference quantizer (both outputs of one call), and
// gemm_block_scaled against a double-precision GEMM of the dequantized operands, within the fp32
// accumulation bound, for every recipe's layouts, transposes and a partial last block.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "backend_test_util.h"
#include "isa_variants.h"
#include "mixtrain/sdk/error.h"
#include "mixtrain/sdk/support/block_scaling.h"

namespace mixtrain::backend_cpu::testing {
namespace {

using sdk::BlockScaledLayout;
using sdk::ReductionAxis;

// A device block-scaled tensor of `layout` for a [rows, cols] source.
struct DeviceBlocks {
  DeviceBlocks(CpuBackend& be, const BlockScaledLayout& layout, std::int64_t rows,
               std::int64_t cols)
      : grid(sdk::block_grid(layout, rows, cols)),
        codes(be, DType::fp8_e4m3, Shape{rows, cols}),
        scales(be, DType::fp32, Shape{grid.rows, grid.cols}),
        tensor_scale(be, DType::fp32, Shape{1}) {
    op.codes = codes.view();
    op.scales = scales.view();
    if (layout.tensor_scale) op.tensor_scale = tensor_scale.view();
    op.layout = layout;
  }
  sdk::BlockExtent grid;
  DeviceTensor codes, scales, tensor_scale;
  sdk::BlockScaledOperand op;
};

std::vector<std::uint8_t> code_bytes(const DeviceBlocks& d) {
  const auto* p = static_cast<const std::uint8_t*>(d.op.codes.data);
  return {p, p + d.op.codes.numel()};
}

// Values with a wide spread of magnitudes per block, so scales differ from block to block.
std::vector<float> spread_values(std::size_t n, std::uint32_t seed) {
  auto v = random_values(n, seed);
  for (std::size_t i = 0; i < n; ++i) v[i] *= std::ldexp(1.0f, static_cast<int>(i % 7) * 3 - 9);
  return v;
}

void expect_matches_reference(const DeviceBlocks& d, const std::vector<float>& x, std::int64_t rows,
                              std::int64_t cols, std::optional<std::uint64_t> seed) {
  sdk::BlockQuantizeOptions options;
  options.stochastic_rounding_seed = seed;
  const auto ref = sdk::quantize_block_scaled(x, rows, cols, d.op.layout, options);
  EXPECT_EQ(code_bytes(d), ref.codes) << sdk::describe(d.op.layout);
  const auto scales = d.scales.get();
  for (std::int64_t r = 0; r < d.grid.rows; ++r) {
    for (std::int64_t c = 0; c < d.grid.cols; ++c) {
      const float want = sdk::block_scale_value(ref, r, c);
      const float got = scales[static_cast<std::size_t>(r * d.grid.cols + c)];
      EXPECT_TRUE(got == want || (std::isnan(got) && std::isnan(want)))
          << sdk::describe(d.op.layout) << " block " << r << "," << c;
    }
  }
  if (d.op.layout.tensor_scale) {
    EXPECT_EQ(d.tensor_scale.get()[0], ref.tensor_scale);
  }
}

struct LayoutPair {
  const char* name;
  BlockScaledLayout along_cols, along_rows;
};

std::vector<LayoutPair> recipe_layouts() {
  using sdk::BlockElement;
  return {
      {"fp8 block 1x128", sdk::fp8_block_layout(ReductionAxis::cols),
       sdk::fp8_block_layout(ReductionAxis::rows)},
      {"fp8 block pow2", sdk::fp8_block_layout(ReductionAxis::cols, BlockElement::e4m3, true),
       sdk::fp8_block_layout(ReductionAxis::rows, BlockElement::e4m3, true)},
      {"fp8 block 128x128", sdk::fp8_block_weight_layout(), sdk::fp8_block_weight_layout()},
      {"mxfp8 e4m3", sdk::mx_layout(ReductionAxis::cols, BlockElement::e4m3),
       sdk::mx_layout(ReductionAxis::rows, BlockElement::e4m3)},
      {"mxfp8 e5m2", sdk::mx_layout(ReductionAxis::cols, BlockElement::e5m2),
       sdk::mx_layout(ReductionAxis::rows, BlockElement::e5m2)},
      {"nvfp4 1x16", sdk::nvfp4_layout(ReductionAxis::cols),
       sdk::nvfp4_layout(ReductionAxis::rows)},
      {"nvfp4 16x16", sdk::nvfp4_weight_layout(), sdk::nvfp4_weight_layout()},
  };
}

// Quantizes [rows, cols] values into every recipe's two layouts at once, with and without
// stochastic rounding, and checks each output against the SDK's reference bit for bit.
void quantize_every_layout(CpuBackend& be, sdk::GemmFacet& gemm, std::int64_t rows,
                           std::int64_t cols) {
  for (DType src_dtype : {DType::fp32, DType::bf16}) {
    const auto values = representable(spread_values(rows * cols, 11), src_dtype);
    DeviceTensor src(be, src_dtype, Shape{rows, cols}, values);
    for (const auto& pair : recipe_layouts())
      for (std::optional<std::uint64_t> seed :
           {std::optional<std::uint64_t>{}, std::optional<std::uint64_t>{42}}) {
        SCOPED_TRACE(pair.name);
        DeviceBlocks a(be, pair.along_cols, rows, cols), b(be, pair.along_rows, rows, cols);
        sdk::BlockQuantizeArgs args;
        args.src = src.view();
        args.outputs[0] = a.op;
        args.outputs[1] = b.op;
        args.stochastic_rounding = seed.has_value();
        args.seed = seed.value_or(0);
        gemm.quantize_block_scaled(args);
        expect_matches_reference(a, values, rows, cols, seed);
        expect_matches_reference(b, values, rows, cols, seed);
      }
  }
}

TEST(backend_cpu_block_scaled, QuantizeEqualsTheReferenceForBothOutputsOfOneCall) {
  // 37 x 150: partial blocks both ways, on the calling thread; 300 x 260 splits its rows over a
  // team of two (stochastic rounding's bits are keyed by the element, not the thread).
  const std::vector<std::array<std::int64_t, 3>> runs = {{1, 37, 150}, {2, 300, 260}};
  for (const auto& run : runs) {
    CpuBackend be(static_cast<int>(run[0]));
    auto* gemm = sdk::facet<sdk::GemmFacet>(be);
    ASSERT_NE(gemm, nullptr);
    const std::int64_t rows = run[1], cols = run[2];
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    quantize_every_layout(be, *gemm, rows, cols);
  }
}

// A transposed output (gemm facet 1.4) is srcᵀ's quantization: the reference quantization of src
// under the transposed layout, its codes and scale grid transposed, the stochastic bits keyed by
// src's index. 37 x 150: partial blocks both ways.
TEST(backend_cpu_block_scaled, ATransposedOutputIsTheReferenceTransposed) {
  CpuBackend be(1);
  auto* gemm = sdk::facet<sdk::GemmFacet>(be);
  ASSERT_NE(gemm, nullptr);
  constexpr std::int64_t rows = 37, cols = 150;
  const auto values = spread_values(rows * cols, 5);
  DeviceTensor src(be, DType::fp32, Shape{rows, cols}, values);
  for (const auto& pair : recipe_layouts())
    for (std::optional<std::uint64_t> seed :
         {std::optional<std::uint64_t>{}, std::optional<std::uint64_t>{9}}) {
      SCOPED_TRACE(pair.name);
      // srcᵀ [cols, rows] blocked as the source's `along_rows` layout transposed.
      BlockScaledLayout layout_t = pair.along_rows;
      std::swap(layout_t.block_rows, layout_t.block_cols);
      DeviceBlocks t(be, layout_t, cols, rows);
      t.op.transpose = true;
      sdk::BlockQuantizeArgs args;
      args.src = src.view();
      args.outputs[0] = t.op;
      args.stochastic_rounding = seed.has_value();
      args.seed = seed.value_or(0);
      gemm->quantize_block_scaled(args);
      sdk::BlockQuantizeOptions options;
      options.stochastic_rounding_seed = seed;
      const auto ref = sdk::quantize_block_scaled(values, rows, cols, pair.along_rows, options);
      const auto codes = code_bytes(t);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(codes[static_cast<std::size_t>(c * rows + r)],
                    ref.codes[static_cast<std::size_t>(r * cols + c)])
              << "(" << r << ", " << c << ")";
      const sdk::BlockExtent grid = sdk::block_grid(pair.along_rows, rows, cols);
      const auto scales = t.scales.get();
      for (std::int64_t bi = 0; bi < grid.rows; ++bi)
        for (std::int64_t bj = 0; bj < grid.cols; ++bj)
          ASSERT_EQ(scales[static_cast<std::size_t>(bj * grid.rows + bi)],
                    sdk::block_scale_value(ref, bi, bj))
              << "block (" << bi << ", " << bj << ")";
      if (layout_t.tensor_scale) {
        EXPECT_EQ(t.tensor_scale.get()[0], ref.tensor_scale);
      }
    }
}

TEST(backend_cpu_block_scaled, QuantizeMarksANonFiniteBlockNaNAndKeepsTheOthers) {
  CpuBackend be(1);
  std::vector<float> x = spread_values(2 * 64, 3);
  x[5] = std::numeric_limits<float>::infinity();
  DeviceTensor src(be, DType::fp32, Shape{2, 64}, x);
  DeviceBlocks q(be, sdk::mx_layout(ReductionAxis::cols, sdk::BlockElement::e4m3), 2, 64);
  sdk::BlockQuantizeArgs args;
  args.src = src.view();
  args.outputs[0] = q.op;
  sdk::facet<sdk::GemmFacet>(be)->quantize_block_scaled(args);
  expect_matches_reference(q, x, 2, 64, std::nullopt);
  EXPECT_TRUE(std::isnan(q.scales.get()[0]));
  EXPECT_FALSE(std::isnan(q.scales.get()[1]));
}

TEST(backend_cpu_block_scaled, AnEmptySourceStillWritesNvfp4sTensorScaleAsTheReference) {
  // The CUDA backend's device test asks the same; the tensor scale is an output with no blocks.
  CpuBackend be(1);
  const BlockScaledLayout nvfp4 = sdk::nvfp4_layout(ReductionAxis::cols);
  for (const Shape& shape : {Shape{0, 32}, Shape{16, 0}}) {
    DeviceTensor src(be, DType::fp32, Shape{1, 32}, std::vector<float>(32, 1.0f));
    DeviceBlocks q(be, nvfp4, 1, 32);  // buffers of one block, viewed as empty below
    q.tensor_scale.set({7.0f});
    const sdk::BlockExtent grid = sdk::block_grid(nvfp4, shape[0], shape[1]);
    q.op.codes.shape = shape;
    q.op.scales.shape = Shape{grid.rows, grid.cols};
    sdk::BlockQuantizeArgs args;
    args.src = src.view();
    args.src.shape = shape;
    args.outputs[0] = q.op;
    sdk::facet<sdk::GemmFacet>(be)->quantize_block_scaled(args);
    const auto want = sdk::quantize_block_scaled({}, shape[0], shape[1], nvfp4);
    EXPECT_EQ(q.tensor_scale.get()[0], want.tensor_scale) << shape[0] << " x " << shape[1];
    EXPECT_EQ(want.tensor_scale, 1.0f);
  }
}

// op(X) [outer, k] of a dequantized stored tensor.
double at(const std::vector<float>& v, bool transpose, std::int64_t stored_cols, std::int64_t outer,
          std::int64_t k) {
  return transpose ? v[static_cast<std::size_t>(k * stored_cols + outer)]
                   : v[static_cast<std::size_t>(outer * stored_cols + k)];
}

struct GemmCase {
  const char* name;
  BlockScaledLayout a_layout, b_layout;
  bool ta, tb;
};

TEST(backend_cpu_block_scaled, GemmMatchesADoubleGemmOfTheDequantizedBlocks) {
  using sdk::BlockElement;
  CpuBackend be(1);
  auto* gemm = sdk::facet<sdk::GemmFacet>(be);
  const auto rows_axis = ReductionAxis::rows, cols_axis = ReductionAxis::cols;
  // The three GEMMs of a linear layer per recipe: y = x·Wᵀ, dx = dy·W, dW = dyᵀ·x.
  const std::vector<GemmCase> cases = {
      {"fp8 forward", sdk::fp8_block_layout(cols_axis), sdk::fp8_block_weight_layout(), false,
       true},
      {"fp8 dgrad", sdk::fp8_block_layout(cols_axis), sdk::fp8_block_weight_layout(), false, false},
      {"fp8 wgrad", sdk::fp8_block_layout(rows_axis), sdk::fp8_block_layout(rows_axis), true,
       false},
      {"mxfp8 forward", sdk::mx_layout(cols_axis, BlockElement::e4m3),
       sdk::mx_layout(cols_axis, BlockElement::e4m3), false, true},
      {"mxfp8 dgrad e5m2 x e4m3", sdk::mx_layout(cols_axis, BlockElement::e5m2),
       sdk::mx_layout(rows_axis, BlockElement::e4m3), false, false},
      {"mxfp8 wgrad", sdk::mx_layout(rows_axis, BlockElement::e5m2),
       sdk::mx_layout(rows_axis, BlockElement::e4m3), true, false},
      {"nvfp4 forward", sdk::nvfp4_layout(cols_axis), sdk::nvfp4_weight_layout(), false, true},
      {"nvfp4 dgrad", sdk::nvfp4_layout(cols_axis), sdk::nvfp4_weight_layout(), false, false},
      {"nvfp4 wgrad", sdk::nvfp4_layout(rows_axis), sdk::nvfp4_layout(rows_axis), true, false},
  };
  const std::int64_t m = 9, n = 20, k = 300;  // k: two full 128-blocks and a partial one
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::int64_t ar = c.ta ? k : m, ac = c.ta ? m : k;
    const std::int64_t br = c.tb ? n : k, bc = c.tb ? k : n;
    const auto av = spread_values(static_cast<std::size_t>(ar * ac), 5);
    const auto bv = spread_values(static_cast<std::size_t>(br * bc), 6);
    DeviceTensor a_src(be, DType::fp32, Shape{ar, ac}, av),
        b_src(be, DType::fp32, Shape{br, bc}, bv);
    DeviceBlocks a(be, c.a_layout, ar, ac), b(be, c.b_layout, br, bc);
    for (auto [src, blocks] : {std::pair{&a_src, &a}, std::pair{&b_src, &b}}) {
      sdk::BlockQuantizeArgs q;
      q.src = src->view();
      q.outputs[0] = blocks->op;
      gemm->quantize_block_scaled(q);
    }
    const auto a_ref =
        sdk::dequantize_block_scaled(sdk::quantize_block_scaled(av, ar, ac, c.a_layout));
    const auto b_ref =
        sdk::dequantize_block_scaled(sdk::quantize_block_scaled(bv, br, bc, c.b_layout));
    const std::vector<float> bias = random_values(static_cast<std::size_t>(n), 9);
    const std::vector<float> c_old = random_values(static_cast<std::size_t>(m * n), 10);
    DeviceTensor out(be, DType::fp32, Shape{m, n}, c_old), bias_t(be, DType::fp32, Shape{n}, bias);
    sdk::BlockScaledGemmArgs g;
    g.a = a.op;
    g.a.transpose = c.ta;
    g.b = b.op;
    g.b.transpose = c.tb;
    g.c = out.view();
    g.alpha = 0.5f;
    g.beta = 1.0f;
    g.bias = bias_t.view();
    gemm->gemm_block_scaled(g);
    const auto got = out.get();
    const double blocks = std::ceil(static_cast<double>(k) / 16.0);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double dot = 0.0, magnitude = 0.0;
        for (std::int64_t kk = 0; kk < k; ++kk) {
          // op(B)[kk][j] is (op(B)ᵀ)[j][kk]: B read with its transpose flipped.
          const double p = at(a_ref, c.ta, ac, i, kk) * at(b_ref, !c.tb, bc, j, kk);
          dot += p;
          magnitude += std::abs(p);
        }
        const auto idx = static_cast<std::size_t>(i * n + j);
        const double want = 0.5 * dot + c_old[idx] + bias[static_cast<std::size_t>(j)];
        // fp32 accumulation over the k-blocks and the dequantized values' own fp32 rounding.
        const double bound =
            (blocks + 6.0) * std::ldexp(1.0, -24) *
            (0.5 * magnitude + std::abs(c_old[idx]) + std::abs(bias[static_cast<std::size_t>(j)]));
        EXPECT_NEAR(got[idx], want, bound) << "at " << i << "," << j;
      }
  }
}

// The contract's sums, written out: per k-block a double dot of element values in ascending k,
// rounded to fp32, times the product of the two block scales, summed over k-blocks in fp32.
// op(A) is A [m, k]; op(B) is B [n, k] transposed (tb) or B [k, n].
std::vector<float> contract_gemm(const sdk::BlockScaledTensor& a, const sdk::BlockScaledTensor& b,
                                 bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                                 std::int64_t block) {
  const auto value = [](const sdk::BlockScaledTensor& t, std::int64_t r, std::int64_t c) {
    const std::uint8_t code = t.codes[static_cast<std::size_t>(r * t.cols + c)];
    return t.layout.element == sdk::BlockElement::e5m2 ? sdk::decode_fp8_e5m2(code)
                                                       : sdk::decode_fp8_e4m3(code);
  };
  const auto scale = [](const sdk::BlockScaledTensor& t, std::int64_t r, std::int64_t c) {
    return sdk::block_scale_value(t, r / t.layout.block_rows, c / t.layout.block_cols);
  };
  std::vector<float> out(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (std::int64_t k0 = 0; k0 < k; k0 += block) {
        double dot = 0.0;
        for (std::int64_t kk = k0; kk < std::min(k, k0 + block); ++kk)
          dot += static_cast<double>(value(a, i, kk)) *
                 static_cast<double>(tb ? value(b, j, kk) : value(b, kk, j));
        const float s = scale(a, i, k0) * (tb ? scale(b, j, k0) : scale(b, k0, j));
        acc += static_cast<float>(dot) * s;
      }
      out[static_cast<std::size_t>(i * n + j)] = acc;
    }
  return out;
}

TEST(backend_cpu_block_scaled, GemmIsTheContractsSumsBitForBitOnOneThreadAndTwo) {
  using sdk::BlockElement;
  // Every k-block (mxfp8's 32 included) holds enough multiply-adds to run on the team; m and n
  // leave ragged tiles (the kernel's 4 x 16).
  const std::int64_t m = 263, n = 259, k = 300;
  const std::vector<GemmCase> cases = {
      {"fp8 forward", sdk::fp8_block_layout(ReductionAxis::cols), sdk::fp8_block_weight_layout(),
       false, true},
      {"mxfp8 dgrad e5m2 x e4m3", sdk::mx_layout(ReductionAxis::cols, BlockElement::e5m2),
       sdk::mx_layout(ReductionAxis::rows, BlockElement::e4m3), false, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::int64_t br = c.tb ? n : k, bc = c.tb ? k : n;
    // Magnitudes spread over 2^18 within a block, so element values and scales vary per block.
    const auto av = spread_values(static_cast<std::size_t>(m * k), 21);
    const auto bv = spread_values(static_cast<std::size_t>(br * bc), 22);
    const auto qa = sdk::quantize_block_scaled(av, m, k, c.a_layout);
    const auto qb = sdk::quantize_block_scaled(bv, br, bc, c.b_layout);
    const std::int64_t block = c.a_layout.block_cols;
    const std::vector<float> want = contract_gemm(qa, qb, c.tb, m, n, k, block);
    // Two threads on the widest ISA variant of the tile kernel (cpu_isa.h), one on each this CPU
    // runs: the same bits from every one.
    for (const auto& [threads, isa] : thread_and_isa_runs()) {
      SCOPED_TRACE(isa_name(isa) + ", " + std::to_string(threads) + " threads");
      const IsaScope as_isa(isa);
      CpuBackend be(threads);
      auto* gemm = sdk::facet<sdk::GemmFacet>(be);
      DeviceTensor a_src(be, DType::fp32, Shape{m, k}, av),
          b_src(be, DType::fp32, Shape{br, bc}, bv);
      DeviceBlocks a(be, c.a_layout, m, k), b(be, c.b_layout, br, bc);
      sdk::BlockQuantizeArgs q;
      q.src = a_src.view();
      q.outputs[0] = a.op;
      gemm->quantize_block_scaled(q);
      q.src = b_src.view();
      q.outputs[0] = b.op;
      gemm->quantize_block_scaled(q);
      DeviceTensor out(be, DType::fp32, Shape{m, n});
      sdk::BlockScaledGemmArgs g;
      g.a = a.op;
      g.b = b.op;
      g.b.transpose = c.tb;
      g.c = out.view();
      gemm->gemm_block_scaled(g);
      const std::vector<float> got = out.get();
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    }
  }
}

TEST(backend_cpu_block_scaled, GemmRefusesOperandsWhoseReductionBlocksDoNotPairUp) {
  CpuBackend be(1);
  auto* gemm = sdk::facet<sdk::GemmFacet>(be);
  DeviceBlocks a(be, sdk::fp8_block_layout(ReductionAxis::cols), 4, 256);
  DeviceBlocks b(be, sdk::mx_layout(ReductionAxis::cols, sdk::BlockElement::e4m3), 8, 256);
  DeviceTensor out(be, DType::fp32, Shape{4, 8});
  sdk::BlockScaledGemmArgs g;
  g.a = a.op;
  g.b = b.op;
  g.b.transpose = true;
  g.c = out.view();
  EXPECT_THROW(gemm->gemm_block_scaled(g), sdk::BackendError);
}

TEST(backend_cpu_block_scaled, OffersTheBlockScaledOpsOnFloatStorage) {
  CpuBackend be(1);
  auto* gemm = sdk::facet<sdk::GemmFacet>(be);
  EXPECT_GE(gemm->version(), (sdk::FacetVersion{1, 2}));
  for (DType t : {DType::fp32, DType::bf16, DType::fp16}) {
    EXPECT_TRUE(gemm->supports(sdk::GemmOp::quantize_block_scaled, std::vector<DType>{t}));
    EXPECT_TRUE(gemm->supports(sdk::GemmOp::gemm_block_scaled, std::vector<DType>{t}));
  }
  EXPECT_FALSE(gemm->supports(sdk::GemmOp::gemm_block_scaled, std::vector<DType>{DType::fp8_e4m3}));
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
