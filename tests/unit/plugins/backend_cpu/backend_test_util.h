// Helpers for the CpuBackend tests: device tensors filled from host vectors (converted to the
// requested storage dtype with sdk/float_formats.h's scalar RNE encoders, the project's one
// definition of each format), read back as floats.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu_backend.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cpu::testing {

using sdk::DType;
using sdk::Shape;
using sdk::TensorView;

// The SDK's scalar conversions under the names these tests grew up with.
inline std::uint16_t float_to_bf16(float x, bool saturate = false) {
  return sdk::encode_bf16(x, saturate ? sdk::Overflow::saturate : sdk::Overflow::to_inf_or_nan);
}
inline std::uint16_t float_to_fp16(float x, bool saturate = false) {
  return sdk::encode_fp16(x, saturate ? sdk::Overflow::saturate : sdk::Overflow::to_inf_or_nan);
}
inline float bf16_to_float(std::uint16_t b) { return sdk::decode_bf16(b); }
inline float fp16_to_float(std::uint16_t h) { return sdk::decode_fp16(h); }
inline float round_to_tf32(float x) { return sdk::round_to_tf32(x); }

// Value a narrow dtype stores for x (fp8: to_inf_or_nan, as the backend's cast without saturate).
inline float stored_value(float x, DType dtype) {
  switch (dtype) {
    case DType::bf16: return bf16_to_float(float_to_bf16(x));
    case DType::fp16: return fp16_to_float(float_to_fp16(x));
    case DType::fp8_e4m3: return sdk::decode_fp8_e4m3(sdk::encode_fp8_e4m3(x, sdk::Overflow::to_inf_or_nan));
    case DType::fp8_e5m2: return sdk::decode_fp8_e5m2(sdk::encode_fp8_e5m2(x, sdk::Overflow::to_inf_or_nan));
    case DType::tf32: return round_to_tf32(x);
    default: return x;
  }
}

class DeviceTensor {
 public:
  DeviceTensor(CpuBackend& backend, DType dtype, Shape shape) : backend_(&backend) {
    view_.dtype = dtype;
    view_.shape = shape;
    view_.data = backend.allocate(view_.bytes());
    std::memset(view_.data, 0, view_.bytes());
  }
  DeviceTensor(CpuBackend& backend, DType dtype, Shape shape, const std::vector<float>& values)
      : DeviceTensor(backend, dtype, shape) {
    set(values);
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() { backend_->deallocate(view_.data); }

  const TensorView& view() const { return view_; }
  operator TensorView() const { return view_; }

  void set(const std::vector<float>& values) {
    EXPECT_EQ(static_cast<std::int64_t>(values.size()), view_.numel());
    for (std::size_t i = 0; i < values.size(); ++i) {
      switch (view_.dtype) {
        case DType::bf16: view_.as<std::uint16_t>()[i] = float_to_bf16(values[i]); break;
        case DType::fp16: view_.as<std::uint16_t>()[i] = float_to_fp16(values[i]); break;
        case DType::fp8_e4m3:
          view_.as<std::uint8_t>()[i] = sdk::encode_fp8_e4m3(values[i], sdk::Overflow::to_inf_or_nan);
          break;
        case DType::fp8_e5m2:
          view_.as<std::uint8_t>()[i] = sdk::encode_fp8_e5m2(values[i], sdk::Overflow::to_inf_or_nan);
          break;
        case DType::int32: view_.as<std::int32_t>()[i] = static_cast<std::int32_t>(values[i]); break;
        default: view_.as<float>()[i] = values[i]; break;
      }
    }
  }
  std::vector<float> get() const {
    std::vector<float> out(static_cast<std::size_t>(view_.numel()));
    for (std::size_t i = 0; i < out.size(); ++i) {
      switch (view_.dtype) {
        case DType::bf16: out[i] = bf16_to_float(view_.as<std::uint16_t>()[i]); break;
        case DType::fp16: out[i] = fp16_to_float(view_.as<std::uint16_t>()[i]); break;
        case DType::fp8_e4m3: out[i] = sdk::decode_fp8_e4m3(view_.as<std::uint8_t>()[i]); break;
        case DType::fp8_e5m2: out[i] = sdk::decode_fp8_e5m2(view_.as<std::uint8_t>()[i]); break;
        case DType::int32: out[i] = static_cast<float>(view_.as<std::int32_t>()[i]); break;
        default: out[i] = view_.as<float>()[i]; break;
      }
    }
    return out;
  }

 private:
  CpuBackend* backend_;
  TensorView view_;
};

inline std::vector<float> random_values(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Values representable in `dtype`, so a reference computed from them is exact about the inputs.
inline std::vector<float> representable(std::vector<float> v, DType dtype) {
  for (auto& x : v) x = stored_value(x, dtype);
  return v;
}

// max |got − want| / max(max |want|, 1e-30).
inline double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0.0, scale = 1e-30;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

inline void expect_close(const std::vector<float>& actual, const std::vector<double>& expected,
                         double rel, double abs, const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i)
    ASSERT_NEAR(actual[i], expected[i], abs + rel * std::fabs(expected[i]))
        << what << " element " << i;
}

}  // namespace mixtrain::backend_cpu::testing
