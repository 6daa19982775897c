// Weights stored in a compressed format and decoded for a GEMM: NF4 and the block-scaled formats,
// against the SDK's reference decoders rounded once.
#include "conformance_fixture.h"
#include "mixtrain/conformance/weight_layouts.h"

namespace mixtrain::conformance {
namespace internal {
void link_weight_formats() {}  // see link_all_test_files()
}  // namespace internal

namespace {

using namespace internal;

TEST_P(Conformance, Nf4DequantizeIsTheSdkReferenceRoundedOnce) {
  MIXTRAIN_FACETS(quantized_weight, QuantizedWeightFacet);
  // Odd block sizes start blocks on a low nibble; [300, 130] is large enough to run in parallel.
  for (const std::int64_t block : {64, 48, 63, 1})
    for (const Shape shape : {Shape{24, 40}, Shape{7, 37}, Shape{1, 1}, Shape{300, 130}}) {
      auto x = random_values(static_cast<std::size_t>(shape.numel()), 62, -0.1f, 0.1f);
      for (std::size_t i = 0; i < x.size() && i < 64; ++i) x[i] = 0.0f;  // a zero block
      const auto q = sdk::nf4_quantize(x, block);
      const auto want = sdk::nf4_dequantize(q);
      DeviceTensor codes(*tested_, DType::fp8_e4m3,
                         Shape{static_cast<std::int64_t>(q.codes.size())});
      tested_->copy_from_host(codes.view(), q.codes.data());
      auto absmax = make_on(*tested_, q.absmax, Shape{static_cast<std::int64_t>(q.absmax.size())},
                            DType::fp32, 1.0f);
      for (DType dt : kStorageFloats) {
        if (!tested_quantized_weight->supports(sdk::QuantizedWeightOp::dequantize_nf4,
                                               std::vector<DType>{DType::fp32, dt}))
          continue;
        const auto expected = upload(want, shape, dt);
        DeviceTensor out(*tested_, dt, shape);
        tested_quantized_weight->dequantize_nf4(codes.view().data, absmax->view(), block,
                                                out.view());
        const auto got = download(*tested_, out.view());
        const auto ref = ref_values(expected);
        EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0)
            << sdk::dtype_name(dt) << " " << shape.numel() << " elements, block " << block;
      }
    }
  DeviceTensor codes(*tested_, DType::fp8_e4m3, Shape{50});
  DeviceTensor absmax(*tested_, DType::fp32, Shape{1});  // 100 elements in blocks of 64 need 2
  DeviceTensor out(*tested_, DType::fp32, Shape{10, 10});
  EXPECT_THROW(
      tested_quantized_weight->dequantize_nf4(codes.view().data, absmax.view(), 64, out.view()),
      sdk::BackendError);
  EXPECT_THROW(tested_quantized_weight->dequantize_nf4(nullptr, absmax.view(), 128, out.view()),
               sdk::BackendError);
}

// Byte images (image_input facet): each byte decoded through its channel's row of the table and
// rounded once into y's dtype, bit for bit, for every storage dtype the backend declares: planes
// of odd length, one row, a table holding RNE ties and a value fp16 cannot hold; the host buffer
// is the caller's again when the call returns. An empty batch needs no pixels; a table of the
// wrong shape or null pixels are BackendErrors.

TEST_P(Conformance, BlockScaledWeightDequantizeIsTheSdkReferenceRoundedOnce) {
  MIXTRAIN_FACETS(quantized_weight, QuantizedWeightFacet);
  const sdk::QuantizedWeightOp op = sdk::QuantizedWeightOp::dequantize_block_scaled;
  const std::vector<sdk::BlockScaledLayout> layouts = conformance::block_scaled_weight_layouts();
  auto bytes_on = [&](const std::vector<std::uint8_t>& v) {
    auto t = std::make_unique<DeviceTensor>(*tested_, DType::fp8_e4m3,
                                            Shape{static_cast<std::int64_t>(v.size())});
    tested_->copy_from_host(t->view(), v.data());
    return t;
  };
  for (const auto& layout : layouts)
    for (const Shape shape : {Shape{130, 70}, Shape{7, 37}, Shape{1, 1}}) {
      auto x = random_values(static_cast<std::size_t>(shape.numel()), 63, -3.0f, 3.0f);
      for (std::size_t i = 0; i < x.size() && i < 16; ++i) x[i] = 0.0f;  // a zero 1x16 block
      if (x.size() > 40) x[40] = 900.0f;                                 // an outlier
      const auto q = sdk::quantize_block_scaled(x, shape[0], shape[1], layout);
      const auto want = sdk::dequantize_block_scaled(q);
      const bool packed = layout.element == sdk::BlockElement::e2m1;
      const auto codes = bytes_on(packed ? sdk::pack_e2m1(q.codes) : q.codes);
      const sdk::BlockExtent grid = sdk::block_grid(layout, shape[0], shape[1]);
      std::unique_ptr<DeviceTensor> scales;
      if (q.scales.empty())
        scales = bytes_on(q.scale_codes);
      else
        scales = make_on(*tested_, q.scales, Shape{grid.rows * grid.cols}, DType::fp32, 1.0f);
      const auto tensor_scale =
          make_on(*tested_, std::vector<float>{q.tensor_scale}, Shape{1}, DType::fp32, 1.0f);
      sdk::BlockScaledWeight w{codes->view(), scales->view(), {}, layout};
      if (layout.tensor_scale) w.tensor_scale = tensor_scale->view();
      for (DType dt : kStorageFloats) {
        if (!tested_quantized_weight->supports(op, std::vector<DType>{dt})) continue;
        const auto expected = upload(want, shape, dt);
        DeviceTensor out(*tested_, dt, shape);
        tested_quantized_weight->dequantize_block_scaled(w, out.view());
        const auto got = download(*tested_, out.view());
        const auto ref = ref_values(expected);
        ASSERT_EQ(got.size(), ref.size());
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(ref[i]))
              << sdk::describe(layout) << " " << shape.to_string() << " " << sdk::dtype_name(dt)
              << " element " << i;
      }
    }
  if (!tested_quantized_weight->supports(op, std::vector<DType>{DType::fp32})) return;
  const auto layout = sdk::mx_layout(sdk::ReductionAxis::cols, sdk::BlockElement::e4m3);
  DeviceTensor codes(*tested_, DType::fp8_e4m3, Shape{64 * 64});
  DeviceTensor short_codes(*tested_, DType::fp8_e4m3, Shape{64 * 63});
  DeviceTensor scales(*tested_, DType::fp8_e4m3, Shape{64 * 2});
  DeviceTensor short_scales(*tested_, DType::fp8_e4m3, Shape{64});
  DeviceTensor out(*tested_, DType::fp32, Shape{64, 64});
  DeviceTensor flat(*tested_, DType::fp32, Shape{64 * 64});
  auto refuses = [&](const sdk::BlockScaledWeight& w, const sdk::TensorView& o) {
    EXPECT_THROW(tested_quantized_weight->dequantize_block_scaled(w, o), sdk::BackendError)
        << sdk::describe(w.layout) << " into " << o.shape.to_string();
  };
  refuses({short_codes.view(), scales.view(), {}, layout}, out.view());
  refuses({codes.view(), short_scales.view(), {}, layout}, out.view());
  refuses({codes.view(), scales.view(), {}, layout}, flat.view());
  // NVFP4 with its codes (packed) and 16x16 block scales right, but no tensor scale.
  DeviceTensor packed(*tested_, DType::fp8_e4m3, Shape{64 * 64 / 2});
  DeviceTensor block_scales(*tested_, DType::fp8_e4m3, Shape{4 * 4});
  refuses({packed.view(), block_scales.view(), {}, sdk::nvfp4_weight_layout()}, out.view());
}

// The scratch facet reports the part of memory_stats() the backend keeps for itself: with every
// tensor a caller allocated freed again, what stays counted beyond the caller's is that scratch,
// and it never exceeds the count. GEMMs in every declared input format (the emulated ones keep
// decoded copies on the CPU backend) and a 16-bit output give it something to keep.

}  // namespace
}  // namespace mixtrain::conformance
