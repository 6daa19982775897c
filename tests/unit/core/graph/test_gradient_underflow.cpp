// underflow_threshold: the underflow pass counts a gradient value as flushed when its magnitude is
// at most the dtype's threshold, where it used to encode and decode each value. The threshold is
// the formats' own (half the smallest subnormal: round to nearest even takes that tie to zero), and
// the compare agrees with the encoders on values of every magnitude near it. A backend's tally
// (gradient_check 1.2) gives the pass the counts the host's gives.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "cnn_test_support.h"
#include "cpu_test_backend.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/sdk/backend_gradient_check.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::core {
namespace {

using sdk::DType;

bool stored_as_zero(float v, DType dt) {
  switch (dt) {
    case DType::fp16:
      return sdk::decode_fp16(sdk::encode_fp16(v)) == 0.0f;
    case DType::bf16:
      return sdk::decode_bf16(sdk::encode_bf16(v)) == 0.0f;
    case DType::fp8_e4m3:
      return sdk::decode_fp8_e4m3(sdk::encode_fp8_e4m3(v, sdk::Overflow::saturate)) == 0.0f;
    case DType::fp8_e5m2:
      return sdk::decode_fp8_e5m2(sdk::encode_fp8_e5m2(v, sdk::Overflow::saturate)) == 0.0f;
    default:
      return false;
  }
}

TEST(UnderflowThreshold, IsHalfTheSmallestSubnormalOfEachFormat) {
  EXPECT_EQ(underflow_threshold(DType::bf16), std::ldexp(1.0f, -134));     // 2^-133 / 2
  EXPECT_EQ(underflow_threshold(DType::fp16), std::ldexp(1.0f, -25));      // 2^-24 / 2
  EXPECT_EQ(underflow_threshold(DType::fp8_e4m3), std::ldexp(1.0f, -10));  // 2^-9 / 2
  EXPECT_EQ(underflow_threshold(DType::fp8_e5m2), std::ldexp(1.0f, -17));  // 2^-16 / 2
  EXPECT_EQ(underflow_threshold(DType::fp32), 0.0f);  // keeps every non-zero float
}

TEST(UnderflowThreshold, TheCompareAgreesWithTheEncodersAtEveryMagnitudeNearIt) {
  std::mt19937 gen(7);
  for (const DType dt : {DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2}) {
    const float t = underflow_threshold(dt);
    const float inf = std::numeric_limits<float>::infinity();
    // Its neighbours, either sign.
    for (const float v : {t, std::nextafter(t, inf), std::nextafter(t, 0.0f)}) {
      EXPECT_EQ(std::fabs(v) <= t, stored_as_zero(v, dt)) << v;
      EXPECT_EQ(std::fabs(-v) <= t, stored_as_zero(-v, dt)) << -v;
    }
    // Random bit patterns within 2^±8 of it, and across the fp32 subnormals.
    std::uniform_int_distribution<std::int32_t> shift(-8 << 23, 8 << 23);
    std::uniform_int_distribution<std::uint32_t> subnormal(1, 0x007fffffu);
    for (int i = 0; i < 20000; ++i) {
      const auto bits = static_cast<std::uint32_t>(
          static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(t)) + shift(gen));
      for (const float v : {std::bit_cast<float>(bits), std::bit_cast<float>(subnormal(gen))})
        ASSERT_EQ(std::fabs(v) <= t, stored_as_zero(v, dt)) << v << " " << sdk::dtype_name(dt);
    }
  }
}

// The shared CPU backend without its gradient_check facet: the pass counts on the host.
class NoGradientCheck final : public test_support::ForwardingBackend {
 public:
  sdk::Facet* find_facet(std::string_view name) override {
    return name == sdk::GradientCheckFacet::kName ? nullptr : in_->find_facet(name);
  }
};

std::vector<UnderflowCount> counts_on(std::shared_ptr<sdk::DeviceBackend> backend,
                                      float grad_scale) {
  using test_support::op;
  ModelSpec spec = cnn_testing::graph(
      {op("linear", "fc1", {{"out", 32}}, {"input"}), op("relu", "relu1", {}, {"fc1"}),
       op("linear", "fc2", {{"out", 16}}, {"relu1"}), op("relu", "relu2", {}, {"fc2"}),
       op("linear", "head", {{"out", 3}}, {"relu2"})});
  Model m(std::move(backend), spec, 8, 3);
  for (auto& l : m.layers()) l->set_precision(test_support::uniform_precision(DType::fp16));
  constexpr std::int64_t kRows = 64;
  m.allocate({kRows, kRows}, false);
  m.init_parameters(11);
  cnn_testing::feed(m, kRows, 3);
  m.forward(kRows);
  return measure_gradient_underflow(m, kRows, grad_scale);
}

TEST(GradientUnderflow, TheBackendsTallyGivesTheHostsCounts) {
  // fp16: a loss scale small enough that some of each tensor's gradients flush, and not all.
  for (const float grad_scale : {1.0f, 1e-4f}) {
    const auto facet = counts_on(test_support::cpu(), grad_scale);
    const auto host = counts_on(std::make_shared<NoGradientCheck>(), grad_scale);
    ASSERT_EQ(facet.size(), host.size());
    std::int64_t flushed = 0;
    for (std::size_t i = 0; i < facet.size(); ++i) {
      EXPECT_EQ(facet[i].tensor, host[i].tensor);
      EXPECT_EQ(facet[i].nonzero, host[i].nonzero) << facet[i].tensor;
      EXPECT_EQ(facet[i].flushed, host[i].flushed) << facet[i].tensor;
      if (grad_scale == 1.0f) {
        EXPECT_GT(facet[i].nonzero, 0) << facet[i].tensor;
      }
      flushed += facet[i].flushed;
    }
    if (grad_scale < 1.0f) {
      EXPECT_GT(flushed, 1000);
    }
  }
}

}  // namespace
}  // namespace mixtrain::core
