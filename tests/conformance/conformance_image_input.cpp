// Images on their way in: byte images decoded by table lookup, and the channels-first /
// channels-last permutes in every dtype pair.
#include "conformance_fixture.h"

namespace mixtrain::conformance {
namespace internal {
void link_image_input() {}  // see link_all_test_files()
}  // namespace internal

namespace {

using namespace internal;

TEST_P(Conformance, DecodeImagesIsTheTableLookupRoundedOnce) {
  MIXTRAIN_FACETS(image_input, ImageInputFacet);
  const std::int64_t C = 3;
  auto values = random_values(static_cast<std::size_t>(C * 256), 71, -3.f, 3.f);
  values[1] = 1.0f + 0x1p-8f;         // a bf16 tie: rounds down to even
  values[2] = 1.0f + 3 * 0x1p-8f;     // a bf16 tie: rounds up to even
  values[256 + 3] = 1.0f + 0x1p-11f;  // an fp16 tie
  values[512 + 4] = 70000.0f;         // beyond fp16: infinity
  auto table = make_on(*tested_, values, Shape{C, 256}, DType::fp32, 1.0f);
  int decoded = 0;
  for (const auto& [rows, plane] : {std::pair<std::int64_t, std::int64_t>{4, 37}, {1, 64}}) {
    std::vector<std::uint8_t> pixels(static_cast<std::size_t>(rows * C * plane));
    const auto noise = random_values(pixels.size(), 72, 0.f, 256.f);
    for (std::size_t i = 0; i < pixels.size(); ++i)
      pixels[i] = static_cast<std::uint8_t>(std::min(255.f, noise[i]));
    pixels[0] = 1;
    pixels[1] = 2;
    pixels[static_cast<std::size_t>(plane)] = 3;
    pixels[static_cast<std::size_t>(2 * plane)] = 4;
    std::vector<float> want(pixels.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      want[i] = values[(i / static_cast<std::size_t>(plane)) % C * 256 + pixels[i]];
    const Shape shape{rows, C * plane};
    for (DType dt : kStorageFloats) {
      if (!tested_image_input->supports(sdk::ImageInputOp::decode_images,
                                        std::vector<DType>{DType::fp32, dt}))
        continue;
      // Each value rounded once, RNE, overflowing to infinity (upload() would saturate).
      std::vector<float> ref(want.size());
      for (std::size_t i = 0; i < ref.size(); ++i)
        ref[i] = dt == DType::bf16   ? sdk::decode_bf16(sdk::encode_bf16(want[i]))
                 : dt == DType::fp16 ? sdk::decode_fp16(sdk::encode_fp16(want[i]))
                                     : want[i];
      DeviceTensor out(*tested_, dt, shape);
      std::vector<std::uint8_t> buffer = pixels;
      tested_image_input->decode_images({buffer.data(), rows, C, plane}, table->view(), out.view());
      std::fill(buffer.begin(), buffer.end(), std::uint8_t{0});  // free on return
      const auto got = download(*tested_, out.view());
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0)
          << sdk::dtype_name(dt) << " " << rows << " rows of " << plane << " pixels";
      if (dt == DType::fp16) {
        EXPECT_TRUE(std::isinf(got[static_cast<std::size_t>(2 * plane)]));
      }
      ++decoded;
    }
  }
  EXPECT_GT(decoded, 0) << "the image_input facet must decode into some storage dtype";
  DeviceTensor none(*tested_, DType::fp32, Shape{0, C * 5});
  EXPECT_NO_THROW(
      tested_image_input->decode_images({nullptr, 0, C, 5}, table->view(), none.view()));
  DeviceTensor out(*tested_, DType::fp32, Shape{2, C * 5});
  const std::vector<std::uint8_t> pixels(static_cast<std::size_t>(2 * C * 5), 9);
  auto narrow =
      make_on(*tested_, std::vector<float>(C * 255, 0.f), Shape{C, 255}, DType::fp32, 1.f);
  EXPECT_THROW(
      tested_image_input->decode_images({pixels.data(), 2, C, 5}, narrow->view(), out.view()),
      sdk::BackendError);
  EXPECT_THROW(tested_image_input->decode_images({nullptr, 2, C, 5}, table->view(), out.view()),
               sdk::BackendError);
  EXPECT_THROW(
      tested_image_input->decode_images({pixels.data(), 3, C, 5}, table->view(), out.view()),
      sdk::BackendError);
}

// Block-scaled weight decoding (quantized_weight 1.1): the SDK reference quantizer's codes and
// scales in every layout it has, stored as BlockScaledWeight stores them (E2M1 packed two per
// byte, E8M0 / E4M3 scales as one byte each, NVFP4's tensor scale), decoded into every storage
// dtype the backend declares, equal the reference's fp32 values rounded once into that dtype, bit
// for bit: partial blocks at both edges, a zero block, one element. Codes or scales of the wrong
// size, a 1-D out and a missing tensor scale are BackendErrors.

TEST_P(Conformance, ImagePermutesEveryDtypePair) {
  MIXTRAIN_FACETS(convolution, ConvolutionFacet);
  using C = sdk::ConvolutionOp;
  if (!tested_convolution->supports(C::to_channels_last, std::vector<DType>(2, DType::fp32)))
    ADD_FAILURE() << "the convolution facet must support to_channels_last in fp32";
  // Odd sizes, one image wider than a 32x32 tile in both directions, and RGB images (a side of
  // 3, which the CUDA backend moves a line per thread instead of by tiles).
  for (const auto& [n, ch, h, w] :
       {std::array<std::int64_t, 4>{2, 5, 3, 7}, std::array<std::int64_t, 4>{1, 40, 9, 9},
        std::array<std::int64_t, 4>{2, 3, 33, 35}}) {
    const Shape first{n, ch, h, w}, last{n, h, w, ch};
    const auto values = random_values(static_cast<std::size_t>(first.numel()), 90, -3.f, 3.f);
    for (DType st : kStorageFloats)
      for (DType dt : kStorageFloats) {
        const std::vector<DType> pair{st, dt};
        if (!tested_convolution->supports(C::to_channels_last, pair) ||
            !tested_convolution->supports(C::to_channels_first, std::vector<DType>{dt, st}))
          continue;
        const std::string what = dtypes_text({st, dt}) + " " + first.to_string();
        auto x = upload(values, first, st);
        auto y = zeros(last, dt);
        tested_convolution->to_channels_last(x.tested->view(), ch, h, w, y.tested->view());
        auto back = zeros(first, st);
        tested_convolution->to_channels_first(y.tested->view(), ch, h, w, back.tested->view());
        std::vector<float> want_y(values.size()), want_back(values.size());
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t c = 0; c < ch; ++c)
            for (std::int64_t p = 0; p < h * w; ++p) {
              const auto fi = static_cast<std::size_t>((i * ch + c) * h * w + p);
              const auto li = static_cast<std::size_t>((i * h * w + p) * ch + c);
              want_y[li] = stored(stored(values[fi], st), dt);
              want_back[fi] = stored(want_y[li], st);
            }
        EXPECT_EQ(tested_values(y), want_y) << "to_channels_last " << what;
        EXPECT_EQ(tested_values(back), want_back) << "to_channels_first " << what;
      }
  }
}

}  // namespace
}  // namespace mixtrain::conformance
