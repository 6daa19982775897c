// The dropout facet of CpuBackend: the SDK's mask element by element in every dtype pair (one
// rounding of x · 1 / (1 - p)), the same bits for one, two and four threads, in place equal to
// out of place, and the argument errors.
#include <cstring>
#include <functional>
#include <string>

#include "backend_test_util.h"
#include "mixtrain/sdk/error.h"

namespace mixtrain::backend_cpu::testing {
namespace {

constexpr DType kFloats[] = {DType::fp32, DType::bf16, DType::fp16};
constexpr sdk::DropoutKey kKey{0xfeedface'0badf00dull, (12ull << 32) | 1u};

std::vector<std::uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

TEST(CpuDropout, EveryDtypePairIsTheSdkMaskTimesTheScaleRoundedOnce) {
  CpuBackend b(2);
  const std::int64_t n = 5003;  // over two chunks, not a multiple of one
  const auto xv = random_values(static_cast<std::size_t>(n), 7, -4.f, 4.f);
  const float p = 0.3f;
  for (DType xt : kFloats)
    for (DType yt : kFloats) {
      DeviceTensor x(b, xt, Shape{n}, xv), y(b, yt, Shape{n}), dx(b, yt, Shape{n});
      sdk::facet<sdk::DropoutFacet>(b)->dropout_forward(x, y, p, kKey);
      sdk::facet<sdk::DropoutFacet>(b)->dropout_backward(x, dx, p, kKey);
      const auto in = x.get(), got = y.get(), grad = dx.get();
      std::int64_t bad = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        const bool keep = sdk::dropout_keeps(kKey, k, sdk::dropout_threshold(p));
        const float want = keep ? stored_value(in[k] * sdk::dropout_scale(p), yt) : 0.0f;
        bad += got[k] != want || grad[k] != want;
      }
      EXPECT_EQ(bad, 0) << sdk::dtype_name(xt) << " -> " << sdk::dtype_name(yt);
    }
}

TEST(CpuDropout, TheMaskDoesNotDependOnTheThreadCount) {
  const std::int64_t n = 1 << 20;  // far above kParallelMin: the pass runs threaded
  const auto xv = random_values(static_cast<std::size_t>(n), 8);
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 2, 4}) {
    CpuBackend b(threads);
    DeviceTensor x(b, DType::fp32, Shape{1024, 1024}, xv), y(b, DType::bf16, Shape{1024, 1024});
    sdk::facet<sdk::DropoutFacet>(b)->dropout_forward(x, y, 0.5f, kKey);
    outs.push_back(y.get());
  }
  EXPECT_EQ(bits_of(outs[0]), bits_of(outs[1])) << "1 vs 2 threads";
  EXPECT_EQ(bits_of(outs[0]), bits_of(outs[2])) << "1 vs 4 threads";
}

TEST(CpuDropout, InPlaceEqualsOutOfPlace) {
  CpuBackend b(2);
  const auto xv = random_values(40000, 9);
  for (DType t : kFloats) {
    DeviceTensor x(b, t, Shape{40000}, xv), y(b, t, Shape{40000}), z(b, t, Shape{40000}, xv);
    sdk::facet<sdk::DropoutFacet>(b)->dropout_forward(x, y, 0.2f, kKey);
    sdk::facet<sdk::DropoutFacet>(b)->dropout_forward(z, z, 0.2f, kKey);
    EXPECT_EQ(bits_of(y.get()), bits_of(z.get())) << sdk::dtype_name(t);
  }
}

TEST(CpuDropout, BadArgumentsRaiseBackendErrorsNamingTheOpAndTheTensor) {
  CpuBackend b(1);
  DeviceTensor x(b, DType::fp32, Shape{64}), y(b, DType::fp32, Shape{64});
  DeviceTensor ids(b, DType::int32, Shape{64}), fp8(b, DType::fp8_e4m3, Shape{64});
  DeviceTensor short_y(b, DType::fp32, Shape{63});
  auto expect_error = [](const std::function<void()>& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const sdk::BackendError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { sdk::facet<sdk::DropoutFacet>(b)->dropout_forward(x, y, 1.0f, kKey); },
               "p = 1");
  expect_error([&] { sdk::facet<sdk::DropoutFacet>(b)->dropout_forward(x, y, -0.25f, kKey); },
               "outside [0, 1)");
  expect_error(
      [&] { sdk::facet<sdk::DropoutFacet>(b)->dropout_backward(x, y, std::nanf(""), kKey); },
      "outside [0, 1)");
  expect_error([&] { sdk::facet<sdk::DropoutFacet>(b)->dropout_forward(ids, y, 0.5f, kKey); },
               "int32");
  expect_error([&] { sdk::facet<sdk::DropoutFacet>(b)->dropout_backward(x, fp8, 0.5f, kKey); },
               "fp8");
  expect_error([&] { sdk::facet<sdk::DropoutFacet>(b)->dropout_forward(x, short_y, 0.5f, kKey); },
               "dropout_forward");
  // A partial overlap: y starts in the middle of x.
  TensorView shifted = x.view();
  shifted.data = x.view().as<float>() + 8;
  shifted.shape = Shape{56};
  TensorView head = x.view();
  head.shape = Shape{56};
  expect_error(
      [&] { sdk::facet<sdk::DropoutFacet>(b)->dropout_forward(head, shifted, 0.5f, kKey); },
      "dropout_forward");
  // supports() is the SDK's table: storage floats only.
  const DType fp8_fp32[] = {DType::fp8_e4m3, DType::fp32};
  const DType int_fp32[] = {DType::int32, DType::fp32};
  const DType bf16_fp16[] = {DType::bf16, DType::fp16};
  EXPECT_FALSE(
      sdk::facet<sdk::DropoutFacet>(b)->supports(sdk::DropoutOp::dropout_forward, fp8_fp32));
  EXPECT_FALSE(
      sdk::facet<sdk::DropoutFacet>(b)->supports(sdk::DropoutOp::dropout_backward, int_fp32));
  EXPECT_TRUE(
      sdk::facet<sdk::DropoutFacet>(b)->supports(sdk::DropoutOp::dropout_forward, bf16_fp16));
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
