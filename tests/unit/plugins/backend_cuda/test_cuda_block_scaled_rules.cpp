// The CUDA backend's block-scaled pieces that run on the host: which layouts run on which device
// and cuBLASLt (cuda_block_scaled_rules.h, with a fake sm and version), where cuBLASLt reads each
// block scale (cuda_block_scale_layout.h), the exact E8M0 / UE4M3 scale bytes, and the fp8-block
// and MXFP8 / NVFP4 quantize kernels' per-block and per-element math (cuda_block_quantize_math.h)
// compiled for the host, walked in the kernels' partition, against sdk::quantize_block_scaled bit
// for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cuda_block_quantize_math.h"
#include "cuda_block_scale_layout.h"
#include "cuda_block_scaled_rules.h"
#include "mixtrain/sdk/support/block_scaling.h"

namespace mixtrain::backend_cuda {
namespace {

using sdk::BlockElement;
using sdk::BlockScaledLayout;
using sdk::ReductionAxis;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

BlockScaledDevice device(int sm, int version, int headers = 130100) {
  return {sm, "Test GPU", version, headers};
}

// --- the rules -----------------------------------------------------------------------------------

TEST(CudaBlockScaledRules, Fp8BlockRunsOnHopperWithCublas129AndChoosesTheScaleModeByBlockShape) {
  const BlockScaledDevice h200 = device(90, 130100);
  for (bool pow2 : {false, true})
    for (BlockElement e : {BlockElement::e4m3, BlockElement::e5m2}) {
      EXPECT_EQ(block_scaled_route(h200, sdk::fp8_block_layout(ReductionAxis::cols, e, pow2)).mode,
                BlockScaleMode::vec128_fp32);
      EXPECT_EQ(block_scaled_route(h200, sdk::fp8_block_layout(ReductionAxis::rows, e, pow2)).mode,
                BlockScaleMode::vec128_fp32);
      EXPECT_EQ(block_scaled_route(h200, sdk::fp8_block_weight_layout(e, pow2)).mode,
                BlockScaleMode::blk128x128_fp32);
      EXPECT_EQ(block_layout_refusal(h200, sdk::fp8_block_weight_layout(e, pow2)), "");
    }
  EXPECT_TRUE(block_scaled_ops_available(h200));
  EXPECT_TRUE(block_scaled_ops_available(device(90, kCublasFp32BlockScales)));
}

TEST(CudaBlockScaledRules, Fp8BlockIsRefusedOffHopperNamingTheDevice) {
  const BlockScaledLayout l = sdk::fp8_block_layout(ReductionAxis::cols);
  for (int sm : {80, 86, 89, 100, 120}) {
    const std::string why = block_layout_refusal(device(sm, 130100), l);
    EXPECT_TRUE(has(why, "fp8-block") && has(why, "sm_" + std::to_string(sm)) &&
                has(why, "Test GPU") && has(why, "sm_90"))
        << why;
    // Blackwell offers the block-scaled ops for mxfp8 / nvfp4; the GPUs before Hopper none.
    EXPECT_EQ(block_scaled_ops_available(device(sm, 130100)), sm >= 100) << sm;
  }
  EXPECT_TRUE(has(block_layout_refusal(device(100, 130100), l), "mxfp8"));
}

TEST(CudaBlockScaledRules, Fp8BlockNeedsCublas129InTheHeadersAndTheLibrary) {
  const BlockScaledLayout l = sdk::fp8_block_weight_layout();
  const std::string old_library = block_layout_refusal(device(90, 120805, 130100), l);
  EXPECT_TRUE(has(old_library, "12.8.5") && has(old_library, "12.9.0") &&
              has(old_library, "library"))
      << old_library;
  const std::string old_headers = block_layout_refusal(device(90, 130100, 120800), l);
  EXPECT_TRUE(has(old_headers, "12.8.0") && has(old_headers, "rebuild")) << old_headers;
  EXPECT_FALSE(block_scaled_ops_available(device(90, 120800)));
}

TEST(CudaBlockScaledRules, MxAndNvfp4RunOnBlackwellThroughItsModesAndAreRefusedBefore) {
  const BlockScaledLayout mx = sdk::mx_layout(ReductionAxis::cols, BlockElement::e4m3);
  const BlockScaledLayout mx_rows = sdk::mx_layout(ReductionAxis::rows, BlockElement::e5m2);
  const BlockScaledLayout nv = sdk::nvfp4_layout(ReductionAxis::rows);
  const BlockScaledLayout nvw = sdk::nvfp4_weight_layout();
  EXPECT_EQ(block_scaled_route(device(100, 130100), mx).mode, BlockScaleMode::vec32_ue8m0);
  EXPECT_EQ(block_scaled_route(device(100, 130100), mx_rows).mode, BlockScaleMode::vec32_ue8m0);
  EXPECT_EQ(block_scaled_route(device(100, 130100), nv).mode, BlockScaleMode::vec16_ue4m3);
  EXPECT_EQ(block_scaled_route(device(120, 130100), nvw).mode, BlockScaleMode::vec16_ue4m3);
  for (const BlockScaledLayout& l : {mx, mx_rows, nv, nvw}) {
    EXPECT_EQ(block_layout_refusal(device(100, 130100), l), "") << sdk::describe(l);
    // A cuBLASLt of 12.8 has the modes; the engine still needs 12.9 headers to be built.
    EXPECT_EQ(block_layout_refusal(device(100, 120800, 120900), l), "") << sdk::describe(l);
    for (int sm : {80, 90}) {
      const std::string before = block_layout_refusal(device(sm, 130100), l);
      EXPECT_TRUE(has(before, "Blackwell") && has(before, "sm_" + std::to_string(sm))) << before;
      EXPECT_EQ(block_scaled_route(device(sm, 130100), l).mode, BlockScaleMode::none);
    }
  }
  const std::string old = block_layout_refusal(device(100, 120700), mx);
  EXPECT_TRUE(has(old, "12.7.0") && has(old, "12.8.0") && has(old, "library")) << old;
  const std::string old_headers = block_layout_refusal(device(100, 130100, 120800), nv);
  EXPECT_TRUE(has(old_headers, "12.8.0") && has(old_headers, "rebuild")) << old_headers;
  // supports(): some recipe runs. Blackwell runs mxfp8 / nvfp4 though fp8-block is refused there.
  EXPECT_TRUE(block_scaled_ops_available(device(100, 130100)));
  EXPECT_TRUE(block_scaled_ops_available(device(90, 130100)));
  EXPECT_FALSE(block_scaled_ops_available(device(89, 130100)));
  EXPECT_FALSE(block_scaled_ops_available(device(100, 120700)));
}

TEST(CudaBlockScaledRules, LayoutsWithoutACublasModeAreRefusedSayingWhichBlocksItTakes) {
  const BlockScaledDevice h200 = device(90, 130100);
  BlockScaledLayout odd = sdk::fp8_block_layout(ReductionAxis::cols);
  odd.block_cols = 64;
  EXPECT_TRUE(has(block_layout_refusal(h200, odd), "1x128")) << block_layout_refusal(h200, odd);
  BlockScaledLayout mx16 = sdk::mx_layout(ReductionAxis::cols, BlockElement::e4m3);
  mx16.block_cols = 16;
  EXPECT_TRUE(has(block_layout_refusal(device(100, 130100), mx16), "1x32"));
  const BlockScaledLayout mxfp4 = sdk::mx_layout(ReductionAxis::cols, BlockElement::e2m1);
  EXPECT_TRUE(has(block_layout_refusal(device(100, 130100), mxfp4), "mxfp4"));
}

// --- where cuBLASLt reads the scales ------------------------------------------------------------

TEST(CudaBlockScaleLayout, EachLayoutPlacesEveryScaleOnceWithinItsCount) {
  using namespace block_scales;
  for (std::int64_t outer : {1, 4, 5, 130, 257})
    for (std::int64_t L : {1, 3, 4, 9}) {
      std::set<std::int64_t> vec, tiled;
      for (std::int64_t o = 0; o < outer; ++o)
        for (std::int64_t l = 0; l < L; ++l) {
          const std::int64_t v = vec128_offset(o, l, round_up(outer, 4));
          const std::int64_t t = tiled_offset(o, l, L);
          ASSERT_LT(v, vec128_count(outer, L));
          ASSERT_LT(t, tiled_count(outer, L));
          ASSERT_TRUE(vec.insert(v).second);
          ASSERT_TRUE(tiled.insert(t).second);
        }
      std::set<std::int64_t> blk;
      for (std::int64_t ob = 0; ob < (outer + 127) / 128; ++ob)
        for (std::int64_t l = 0; l < L; ++l) {
          ASSERT_LT(blk128_offset(ob, l, L), blk128_count(outer, L));
          ASSERT_TRUE(blk.insert(blk128_offset(ob, l, L)).second);
        }
    }
}

TEST(CudaBlockScaleLayout, OffsetsFollowTheDocumentedFormulas) {
  using namespace block_scales;
  // VEC128: outer-major, the outer extent padded to 4.
  EXPECT_EQ(vec128_offset(5, 2, 8), 2 * 8 + 5);
  // BLK128x128: K-major, columns round_up(L, 4) apart.
  EXPECT_EQ(blk128_offset(3, 2, 5), 3 * 8 + 2);
  // 128x4 tiles: (o % 32) * 16 + (o / 32) * 4 + l within a tile, tiles row-major.
  EXPECT_EQ(tiled_offset(33, 1, 4), 33 % 32 * 16 + 1 * 4 + 1);
  EXPECT_EQ(tiled_offset(33, 5, 8), 512 + 16 + 4 + 1);
  EXPECT_EQ(tiled_offset(130, 0, 8), 2 * 512 + 2 * 16);
}

TEST(CudaBlockScaleLayout, TheSdkScaleOfAnOpFrameElementFollowsTheTranspose) {
  using namespace block_scales;
  // Stored [300, 260] with 128 x 1 blocks: grid [3, 260]; op(X) = X^T reads (kk, o) at (o, kk).
  const ScaleSource rows{260, 128, 1, true};
  EXPECT_EQ(sdk_scale_index(rows, 7, 200), (200 / 128) * 260 + 7);
  // Stored [40, 300] with 1 x 128 blocks: grid [40, 3], read as stored.
  const ScaleSource cols{3, 1, 128, false};
  EXPECT_EQ(sdk_scale_index(cols, 39, 299), 39 * 3 + 2);
  // 128 x 128, either way round.
  const ScaleSource w{2, 128, 128, true};
  EXPECT_EQ(sdk_scale_index(w, 129, 5), 0 * 2 + 1);
}

TEST(CudaBlockScaleLayout, ScaleBytesAreExactOrRefused) {
  using namespace block_scales;
  namespace fr = sdk::format_rules;
  std::uint8_t b = 0;
  for (int k = -127; k <= 127; ++k) {
    ASSERT_TRUE(e8m0_scale_byte(std::ldexp(1.0f, k), b)) << k;
    EXPECT_EQ(b, k + 127);
  }
  EXPECT_TRUE(e8m0_scale_byte(std::nanf(""), b));
  EXPECT_EQ(b, 0xFF);
  EXPECT_FALSE(e8m0_scale_byte(3.0f, b));
  EXPECT_FALSE(e8m0_scale_byte(0.0f, b));
  for (fr::u32 c = 0; c < 0x7F; ++c) {
    const float v = fr::decode<fr::E4M3>(c);
    ASSERT_TRUE(ue4m3_scale_byte(v, b)) << c;
    EXPECT_EQ(b, c);
  }
  EXPECT_TRUE(ue4m3_scale_byte(std::nanf(""), b));
  EXPECT_EQ(b, 0x7F);
  EXPECT_FALSE(ue4m3_scale_byte(0.3f, b));
  EXPECT_FALSE(ue4m3_scale_byte(-2.0f, b));
}

// --- the quantize kernel's math against the SDK reference ----------------------------------------

// What quantize_kernel computes for one output, walked as it walks: 128 x 128 tiles zero-padded,
// row statistics for 1 x 128 blocks, column statistics for 128 x 1, the merge of the columns'
// for 128 x 128.
sdk::BlockScaledTensor kernel_model(const std::vector<float>& x, std::int64_t rows,
                                    std::int64_t cols, const BlockScaledLayout& layout,
                                    bool stochastic, std::uint64_t seed) {
  namespace bq = block_quantize;
  const bool e5m2 = layout.element == BlockElement::e5m2;
  const bool pow2 = layout.scale == sdk::BlockScale::fp32_pow2;
  const sdk::BlockExtent grid = sdk::block_grid(layout, rows, cols);
  sdk::BlockScaledTensor t;
  t.layout = layout;
  t.rows = rows;
  t.cols = cols;
  t.codes.assign(x.size(), 0);
  t.scales.assign(static_cast<std::size_t>(grid.rows * grid.cols), 0.0f);
  auto at = [&](std::int64_t r, std::int64_t c) {
    return r < rows && c < cols ? x[static_cast<std::size_t>(r * cols + c)] : 0.0f;
  };
  for (std::int64_t r0 = 0; r0 < rows; r0 += 128)
    for (std::int64_t c0 = 0; c0 < cols; c0 += 128) {
      bq::BlockStats row[128], col[128];
      for (int i = 0; i < 128; ++i) {
        row[i] = bq::empty_stats();
        col[i] = bq::empty_stats();
        for (int j = 0; j < 128; ++j) {
          bq::add(row[i], at(r0 + i, c0 + j));
          bq::add(col[i], at(r0 + j, c0 + i));
        }
      }
      bq::BlockStats whole = bq::empty_stats();
      for (const bq::BlockStats& s : col) whole = bq::merge(whole, s);
      for (int i = 0; i < 128; ++i)
        for (int j = 0; j < 128; ++j) {
          const std::int64_t r = r0 + i, c = c0 + j;
          if (r >= rows || c >= cols) continue;
          const bq::BlockStats s =
              layout.block_rows == 1 ? row[i] : (layout.block_cols == 1 ? col[j] : whole);
          const bq::Fp32Encoding e = bq::encode_block(s, e5m2, pow2);
          const std::int64_t index = r * cols + c;
          const std::uint32_t bits =
              stochastic ? bq::fr::random_bits(seed, static_cast<std::uint64_t>(index)) : 0u;
          t.codes[static_cast<std::size_t>(index)] =
              bq::element_code(x[static_cast<std::size_t>(index)], e, e5m2, stochastic, bits);
          t.scales[static_cast<std::size_t>((r / layout.block_rows) * grid.cols +
                                            c / layout.block_cols)] = e.decode_scale;
        }
    }
  return t;
}

std::uint32_t bits(float v) {
  std::uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

// 200 x 300: partial tiles both ways. Blocks of wildly different ranges, a zero block, a block
// holding a NaN, one an infinity, fp32 subnormals, values that saturate E4M3 after scaling's
// rounding, and the largest fp32 (its scale is FLT_MAX's neighbour region).
std::vector<float> awkward_tensor(std::int64_t rows, std::int64_t cols) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-40, 40);
  std::vector<float> x(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      float v = std::ldexp(u(rng), (r / 16) % 2 == 0 ? e(rng) / 8 : e(rng));
      if (r < 128 && c < 128) v = 0.0f;                  // a zero tile
      if (r >= 130 && r < 140 && c >= 250) v *= 1e-39f;  // subnormals
      x[static_cast<std::size_t>(r * cols + c)] = v;
    }
  x[static_cast<std::size_t>(3 * cols + 200)] = std::nanf("");
  x[static_cast<std::size_t>(150 * cols + 10)] = -INFINITY;
  x[static_cast<std::size_t>(199 * cols + 299)] = 3.4028235e38f;
  x[static_cast<std::size_t>(5 * cols + 140)] = -0.0f;
  return x;
}

TEST(CudaBlockQuantizeMath, TheKernelsWalkGivesTheSdkReferenceBitForBit) {
  constexpr std::int64_t rows = 200, cols = 300;
  const std::vector<float> x = awkward_tensor(rows, cols);
  for (BlockElement element : {BlockElement::e4m3, BlockElement::e5m2})
    for (bool pow2 : {false, true})
      for (const BlockScaledLayout& layout :
           {sdk::fp8_block_layout(ReductionAxis::cols, element, pow2),
            sdk::fp8_block_layout(ReductionAxis::rows, element, pow2),
            sdk::fp8_block_weight_layout(element, pow2)})
        for (bool stochastic : {false, true}) {
          const std::string what = sdk::describe(layout) + (stochastic ? " stochastic" : "");
          sdk::BlockQuantizeOptions options;
          if (stochastic) options.stochastic_rounding_seed = 99;
          const sdk::BlockScaledTensor want =
              sdk::quantize_block_scaled(x, rows, cols, layout, options);
          const sdk::BlockScaledTensor got = kernel_model(x, rows, cols, layout, stochastic, 99);
          ASSERT_EQ(got.codes, want.codes) << what;
          ASSERT_EQ(got.scales.size(), want.scales.size()) << what;
          for (std::size_t i = 0; i < want.scales.size(); ++i)
            ASSERT_EQ(bits(got.scales[i]), bits(want.scales[i])) << what << " scale " << i;
        }
}

TEST(CudaBlockQuantizeMath, SpecialBlocksEncodeAsTheSdkDefines) {
  namespace bq = block_quantize;
  bq::BlockStats nan = bq::empty_stats();
  bq::add(nan, 1.0f);
  bq::add(nan, std::nanf(""));
  const bq::Fp32Encoding e = bq::encode_block(nan, false, false);
  EXPECT_FALSE(e.finite);
  EXPECT_TRUE(std::isnan(e.decode_scale));
  EXPECT_EQ(bq::element_code(1.0f, e, false, false, 0), 0);
  const bq::Fp32Encoding zero = bq::encode_block(bq::empty_stats(), false, false);
  EXPECT_EQ(zero.encode_scale, 1.0f);
  EXPECT_EQ(zero.decode_scale, 1.0f);
  EXPECT_EQ(bq::element_code(-0.0f, zero, false, false, 0), 0x80);
}

// --- the MXFP8 / NVFP4 quantize kernels' math ---------------------------------------------------

// The three kernels of cuda_byte_scaled_quantize.cu walked on the host: each block's statistics
// into its scale slot (and the finite blocks' amax into the tensor's, an integer max), each
// block's decode scale over them, then every element's code from its block's scale.
sdk::BlockScaledTensor byte_scaled_kernel_model(const std::vector<float>& x, std::int64_t rows,
                                                std::int64_t cols, const BlockScaledLayout& layout,
                                                bool stochastic, std::uint64_t seed) {
  namespace bq = block_quantize;
  const bq::ByteElement element = layout.element == BlockElement::e5m2   ? bq::ByteElement::e5m2
                                  : layout.element == BlockElement::e2m1 ? bq::ByteElement::e2m1
                                                                         : bq::ByteElement::e4m3;
  const bq::ByteScaleRule rule = layout.scale == sdk::BlockScale::e4m3 ? bq::ByteScaleRule::nvfp4
                                 : layout.scale == sdk::BlockScale::e8m0_round_up
                                     ? bq::ByteScaleRule::e8m0_round_up
                                     : bq::ByteScaleRule::e8m0_floor;
  const sdk::BlockExtent grid = sdk::block_grid(layout, rows, cols);
  std::vector<std::uint32_t> stats(static_cast<std::size_t>(grid.rows * grid.cols));
  std::uint32_t global_amax = 0;
  for (std::int64_t b = 0; b < grid.rows * grid.cols; ++b) {
    const std::int64_t r0 = b / grid.cols * layout.block_rows;
    const std::int64_t c0 = b % grid.cols * layout.block_cols;
    bq::BlockStats st = bq::empty_stats();
    for (std::int64_t r = r0; r < std::min(rows, r0 + layout.block_rows); ++r)
      for (std::int64_t c = c0; c < std::min(cols, c0 + layout.block_cols); ++c)
        bq::add(st, x[static_cast<std::size_t>(r * cols + c)]);
    stats[static_cast<std::size_t>(b)] = bq::packed_stats(st);
    if (layout.tensor_scale && st.finite) global_amax = std::max(global_amax, st.amax_bits);
  }
  const float s_enc =
      layout.tensor_scale ? bq::fr::nvfp4_tensor_encode_scale(bq::fr::float_of(global_amax)) : 1.0f;
  sdk::BlockScaledTensor t;
  t.layout = layout;
  t.rows = rows;
  t.cols = cols;
  if (layout.tensor_scale) t.tensor_scale = bq::fr::nvfp4_tensor_decode_scale(s_enc);
  std::vector<float> scales;
  for (std::uint32_t st : stats)
    scales.push_back(bq::byte_scaled_decode_scale(st, element, rule, s_enc));
  for (float v : scales) {
    std::uint8_t byte = 0;
    const bool exact = layout.scale == sdk::BlockScale::e4m3
                           ? block_scales::ue4m3_scale_byte(v, byte)
                           : block_scales::e8m0_scale_byte(v, byte);
    EXPECT_TRUE(exact) << "decode scale " << v << " has no exact scale byte";
    t.scale_codes.push_back(byte);
  }
  t.codes.resize(x.size());
  for (std::int64_t i = 0; i < rows * cols; ++i) {
    const std::int64_t r = i / cols, c = i % cols;
    const float scale =
        scales[static_cast<std::size_t>(r / layout.block_rows * grid.cols + c / layout.block_cols)];
    const std::uint32_t bits =
        stochastic ? bq::fr::random_bits(seed, static_cast<std::uint64_t>(i)) : 0u;
    t.codes[static_cast<std::size_t>(i)] = bq::byte_scaled_element_code(
        x[static_cast<std::size_t>(i)], scale, t.tensor_scale, element, rule, stochastic, bits);
  }
  return t;
}

TEST(CudaByteScaledQuantizeMath, TheKernelsWalkGivesTheSdkReferenceBitForBit) {
  constexpr std::int64_t rows = 200, cols = 300;  // partial blocks both ways for every layout
  const std::vector<float> x = awkward_tensor(rows, cols);
  std::vector<BlockScaledLayout> layouts;
  for (BlockElement element : {BlockElement::e4m3, BlockElement::e5m2})
    for (sdk::MxScaleRule rule : {sdk::MxScaleRule::ocp, sdk::MxScaleRule::round_up})
      for (ReductionAxis axis : {ReductionAxis::cols, ReductionAxis::rows})
        layouts.push_back(sdk::mx_layout(axis, element, rule));
  layouts.push_back(sdk::nvfp4_layout(ReductionAxis::cols));
  layouts.push_back(sdk::nvfp4_layout(ReductionAxis::rows));
  layouts.push_back(sdk::nvfp4_weight_layout());
  for (const BlockScaledLayout& layout : layouts)
    for (bool stochastic : {false, true}) {
      const std::string what = sdk::describe(layout) + (stochastic ? " stochastic" : "");
      sdk::BlockQuantizeOptions options;
      if (stochastic) options.stochastic_rounding_seed = 7;
      const sdk::BlockScaledTensor want =
          sdk::quantize_block_scaled(x, rows, cols, layout, options);
      const sdk::BlockScaledTensor got =
          byte_scaled_kernel_model(x, rows, cols, layout, stochastic, 7);
      ASSERT_EQ(got.codes, want.codes) << what;
      ASSERT_EQ(got.scale_codes, want.scale_codes) << what;
      ASSERT_EQ(bits(got.tensor_scale), bits(want.tensor_scale)) << what;
    }
}

TEST(CudaByteScaledQuantizeMath, TheTensorScaleIgnoresNonFiniteBlocksAndZeroTensorsScaleByOne) {
  // NVFP4: a block holding an infinity is NaN on its own and leaves the other blocks' range alone.
  std::vector<float> x(32, 0.5f);
  x[20] = INFINITY;
  const BlockScaledLayout nv = sdk::nvfp4_layout(ReductionAxis::cols);
  const sdk::BlockScaledTensor got = byte_scaled_kernel_model(x, 1, 32, nv, false, 0);
  EXPECT_EQ(got.scale_codes[1], 0x7F);
  EXPECT_EQ(bits(got.tensor_scale), bits(sdk::quantize_block_scaled(x, 1, 32, nv).tensor_scale));
  EXPECT_EQ(got.tensor_scale, 1.0f / (6.0f * 448.0f / 0.5f));
  const std::vector<float> zeros(32, 0.0f);
  EXPECT_EQ(byte_scaled_kernel_model(zeros, 1, 32, nv, false, 0).tensor_scale, 1.0f);
}

// arrange_bytes_kernel's walk on the host: slot (o, l) of the tiled layout for the padded k the
// GEMM gives cuBLASLt. k = 64 pads to 128: NVFP4 then has 8 k-blocks per row, not ceil(64 / 16) = 4
// rounded up to 4, so the layout has two 4-block tiles per 128 rows and the second holds zeros.
TEST(CudaBlockScaleLayout, TiledScaleBytesCoverThePaddedReductionDim) {
  struct Case {
    BlockScaledLayout layout;
    std::int64_t k_block;
  };
  for (const Case& c :
       {Case{sdk::nvfp4_layout(ReductionAxis::cols), 16}, Case{sdk::nvfp4_weight_layout(), 16},
        Case{sdk::mx_layout(ReductionAxis::cols, BlockElement::e4m3), 32}}) {
    constexpr std::int64_t outer = 40, k = 64, k_pad = 128;
    std::vector<float> x(static_cast<std::size_t>(outer * k));
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    for (float& v : x) v = std::ldexp(u(rng), static_cast<int>(rng() % 9) - 4);
    const sdk::BlockScaledTensor t = sdk::quantize_block_scaled(x, outer, k, c.layout);
    const sdk::BlockExtent grid = sdk::block_grid(c.layout, outer, k);
    std::vector<float> scales;  // the op's fp32 decode scales
    for (std::int64_t i = 0; i < grid.rows * grid.cols; ++i)
      scales.push_back(sdk::block_scale_value(t, i / grid.cols, i % grid.cols));
    const block_scales::ScaleSource source{grid.cols, c.layout.block_rows, c.layout.block_cols,
                                           false};
    const bool e8m0 = c.layout.scale != sdk::BlockScale::e4m3;
    const std::int64_t L = k_pad / c.k_block;
    std::vector<int> slots(static_cast<std::size_t>(block_scales::tiled_count(outer, L)), -1);
    for (std::int64_t o = 0; o < block_scales::round_up(outer, 128); ++o)
      for (std::int64_t l = 0; l < block_scales::round_up(L, 4); ++l)
        slots[static_cast<std::size_t>(block_scales::tiled_offset(o, l, L))] =
            block_scales::tiled_scale_byte(scales.data(), source, c.k_block, e8m0, outer, k, o, l);
    const std::string what = sdk::describe(c.layout);
    for (std::int64_t o = 0; o < outer; ++o)
      for (std::int64_t l = 0; l < L; ++l) {
        const int byte = slots[static_cast<std::size_t>(block_scales::tiled_offset(o, l, L))];
        if (l * c.k_block >= k) {
          ASSERT_EQ(byte, 0) << what << " padding k-block " << l;
          continue;
        }
        const std::uint8_t want = t.scale_codes[static_cast<std::size_t>(
            o / c.layout.block_rows * grid.cols + l * c.k_block / c.layout.block_cols)];
        ASSERT_EQ(byte, want) << what << " (" << o << ", " << l << ")";
      }
    for (int v : slots) ASSERT_GE(v, 0) << what << ": a slot was never written";
  }
}

TEST(CudaBlockScaleLayout, ScaleSlotsAndFp4PairsFollowTheSdksEncodings) {
  EXPECT_EQ(block_scales::scale_byte_or_nan(0.25f, true), 125);  // 2^-2: 127 - 2
  EXPECT_EQ(block_scales::scale_byte_or_nan(3.0f, true), 0xFF);  // no E8M0 value: NaN, not 4
  EXPECT_EQ(block_scales::scale_byte_or_nan(448.0f, false), 0x7E);
  EXPECT_EQ(block_scales::scale_byte_or_nan(0.3f, false), 0x7F);  // not an E4M3 value
  EXPECT_EQ(block_scales::scale_byte_or_nan(std::nanf(""), false), 0x7F);
  const std::vector<std::uint8_t> codes = {1, 2, 15, 0, 7, 9, 3};
  const std::vector<std::uint8_t> want = sdk::pack_e2m1(codes);
  for (std::size_t i = 0; i < want.size(); ++i) {
    const std::uint8_t second = 2 * i + 1 < codes.size() ? codes[2 * i + 1] : 0;
    EXPECT_EQ(block_scales::e2m1_pair(codes[2 * i], second), want[i]) << i;
  }
}

}  // namespace
}  // namespace mixtrain::backend_cuda
