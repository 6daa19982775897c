// CpuBackend's residual backward (ResidualFacet::add_backward) bit for bit against the facet's
// contract computed here element by element: g = dy, masked to +0 where y is not positive (NaN
// too), rounded once into each gradient's dtype by the SDK's scalar encoders. The one-loop kernel
// (cpu_residual_kernels.h) takes fp32 and bf16 with one or two gradients; fp16 anywhere and three
// gradients take the chunked path. Both are run here, with mixed dtypes of dy and y (a ResNet
// block's FP32 gradient sum against its bf16 output, which the conformance case does not mix), on
// every ISA variant, and across the kernel's blocks on two threads.
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend_test_util.h"
#include "isa_variants.h"
#include "mixtrain/sdk/backend_residual.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cpu::testing {
namespace {

constexpr DType kDtypes[] = {DType::fp32, DType::bf16, DType::fp16};

// Raw storage codes of a tensor: fp32 bits, or 16-bit codes widened.
std::vector<std::uint32_t> codes(const TensorView& v) {
  std::vector<std::uint32_t> out(static_cast<std::size_t>(v.numel()));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = v.dtype == DType::fp32 ? v.as<std::uint32_t>()[i] : v.as<std::uint16_t>()[i];
  return out;
}

void set_codes(const TensorView& v, const std::vector<std::uint32_t>& c) {
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (v.dtype == DType::fp32)
      v.as<std::uint32_t>()[i] = c[i];
    else
      v.as<std::uint16_t>()[i] = static_cast<std::uint16_t>(c[i]);
  }
}

float decode(std::uint32_t code, DType t) {
  switch (t) {
    case DType::bf16:
      return sdk::decode_bf16(static_cast<std::uint16_t>(code));
    case DType::fp16:
      return sdk::decode_fp16(static_cast<std::uint16_t>(code));
    default:
      return std::bit_cast<float>(code);
  }
}

std::uint32_t encode(float g, DType t) {
  switch (t) {
    case DType::bf16:
      return sdk::encode_bf16(g, sdk::Overflow::to_inf_or_nan);
    case DType::fp16:
      return sdk::encode_fp16(g, sdk::Overflow::to_inf_or_nan);
    default:
      return std::bit_cast<std::uint32_t>(g);
  }
}

// Codes of n values in storage t: specials first (signed zeros, a subnormal, infinities, quiet
// and signaling NaNs, values that round), then random values around zero.
std::vector<std::uint32_t> make_codes(std::int64_t n, DType t, unsigned seed) {
  std::vector<float> values = {0.0f,        -0.0f, 1e-40f, -1e-40f, INFINITY, -INFINITY,
                               1.00390625f, -2.5f, 3.0f,   65520.f, 1e-6f,    -7.25f};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  while (static_cast<std::int64_t>(values.size()) < n) values.push_back(dist(rng));
  std::vector<std::uint32_t> out(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = encode(values[i], t);
  // NaNs as codes, so a signaling one reaches the kernel as it is.
  if (t == DType::fp32) {
    out[12] = 0x7fc00001u;  // quiet, with payload
    out[13] = 0xff800001u;  // signaling, negative
  } else if (t == DType::bf16) {
    out[12] = 0x7fc1u;
    out[13] = 0xff81u;
  } else {
    out[12] = 0x7e01u;
    out[13] = 0xfc01u;
  }
  return out;
}

struct Case {
  DType dy, y;  // y unused without the relu
  bool relu;
  std::vector<DType> dxs;
};

std::string describe(const Case& c) {
  std::string s = std::string("dy ") + std::string(sdk::dtype_name(c.dy));
  if (c.relu) s += ", y " + std::string(sdk::dtype_name(c.y));
  s += ", dx";
  for (DType t : c.dxs) s += " " + std::string(sdk::dtype_name(t));
  return s;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType dy : kDtypes)
    for (DType y : kDtypes)
      for (bool relu : {false, true}) {
        if (!relu && y != DType::fp32) continue;
        for (DType a : kDtypes) {
          out.push_back({dy, y, relu, {a}});
          for (DType b : kDtypes) out.push_back({dy, y, relu, {a, b}});
        }
        out.push_back({dy, y, relu, {DType::bf16, DType::fp32, DType::bf16}});
      }
  return out;
}

TEST(BackendCpuResidual, AddBackwardIsDyMaskedAndRoundedOnceIntoEveryGradient) {
  // Two threads cross the kernel's blocks of 2^14 elements; the tail is not a multiple of any
  // vector width.
  for (const auto& [threads, isa] : thread_and_isa_runs()) {
    const IsaScope as_isa(isa);
    CpuBackend be(threads);
    auto* residual = sdk::facet<sdk::ResidualFacet>(be);
    ASSERT_NE(residual, nullptr);
    const std::int64_t n = threads == 1 ? 1000 : 2 * 16384 + 77;
    for (const Case& c : cases()) {
      const std::string what =
          isa_name(isa) + ", threads " + std::to_string(threads) + ", " + describe(c);
      DeviceTensor dy(be, c.dy, Shape{n}), y(be, c.y, Shape{n});
      const auto dy_codes = make_codes(n, c.dy, 1);
      auto y_codes = make_codes(n, c.y, 2);
      set_codes(dy, dy_codes);
      set_codes(y, y_codes);
      std::vector<std::unique_ptr<DeviceTensor>> dxs;
      std::vector<TensorView> views;
      for (DType t : c.dxs) {
        dxs.push_back(std::make_unique<DeviceTensor>(be, t, Shape{n}));
        views.push_back(*dxs.back());
        views.push_back(TensorView{});  // an empty gradient is skipped
      }
      residual->add_backward(dy, c.relu ? y.view() : TensorView{}, c.relu, views);
      for (std::size_t k = 0; k < dxs.size(); ++k) {
        const auto got = codes(*dxs[k]);
        for (std::size_t i = 0; i < got.size(); ++i) {
          const bool pass = !c.relu || decode(y_codes[i], c.y) > 0.0f;
          const float g = pass ? decode(dy_codes[i], c.dy) : 0.0f;
          ASSERT_EQ(got[i], encode(g, c.dxs[k])) << what << ", gradient " << k << ", element " << i;
        }
      }
    }
  }
}

TEST(BackendCpuResidual, AddBackwardMasksDyInPlaceBesideASecondGradient) {
  for (const auto& [threads, isa] : thread_and_isa_runs()) {
    const IsaScope as_isa(isa);
    CpuBackend be(threads);
    auto* residual = sdk::facet<sdk::ResidualFacet>(be);
    const std::int64_t n = 2 * 16384 + 5;
    for (DType t : {DType::fp32, DType::bf16})
      for (DType other : {DType::fp32, DType::bf16}) {
        const std::string what = isa_name(isa) + ", threads " + std::to_string(threads) + ", dy " +
                                 std::string(sdk::dtype_name(t)) + ", other " +
                                 std::string(sdk::dtype_name(other));
        DeviceTensor dy(be, t, Shape{n}), y(be, DType::bf16, Shape{n});
        DeviceTensor second(be, other, Shape{n});
        const auto dy_codes = make_codes(n, t, 3);
        const auto y_codes = make_codes(n, DType::bf16, 4);
        set_codes(dy, dy_codes);
        set_codes(y, y_codes);
        const TensorView views[] = {dy, second};
        residual->add_backward(dy, y, true, views);
        const auto in_place = codes(dy), apart = codes(second);
        for (std::size_t i = 0; i < in_place.size(); ++i) {
          const float g = decode(y_codes[i], DType::bf16) > 0.0f ? decode(dy_codes[i], t) : 0.0f;
          ASSERT_EQ(in_place[i], encode(g, t)) << what << ", element " << i;
          ASSERT_EQ(apart[i], encode(g, other)) << what << ", element " << i;
        }
      }
  }
}

}  // namespace
}  // namespace mixtrain::backend_cpu::testing
