#include "train/host_tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "mixtrain/core/graph/layer.h"
#include "mixtrain/core/graph/tensor.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::core {

sdk::HostTensor to_host(sdk::DeviceBackend& b, const std::string& name, sdk::TensorView v) {
  sdk::HostTensor h;
  h.name = name;
  h.dtype = v.dtype;
  h.shape = v.shape.to_vector();
  h.bytes.resize(v.bytes());
  b.copy_to_host(h.bytes.data(), v);
  return h;
}

sdk::HostTensor to_host_fp32(const std::shared_ptr<sdk::DeviceBackend>& b, const std::string& name,
                             sdk::TensorView v) {
  if (v.dtype == sdk::DType::fp32) return to_host(*b, name, v);
  sdk::HostTensor h;
  h.name = name;
  h.dtype = sdk::DType::fp32;
  h.shape = v.shape.to_vector();
  const auto n = static_cast<std::size_t>(v.numel());
  h.bytes.resize(n * 4);
  const std::span<float> wide(reinterpret_cast<float*>(h.bytes.data()), n);
  // The narrow bits come over as they are and widen on the host, by the SDK's exact decoders: a
  // device cast would need an FP32 scratch of the whole tensor on the device, above the peak the
  // run's steps reach (a checkpoint of frozen bf16 weights; check forecasts the steps).
  const sdk::HostTensor narrow = to_host(*b, name, v);
  switch (v.dtype) {
    case sdk::DType::fp16:
    case sdk::DType::bf16: {
      std::vector<std::uint16_t> bits(n);
      std::memcpy(bits.data(), narrow.bytes.data(), n * 2);
      sdk::convert(std::span<const std::uint16_t>(bits), v.dtype, wide);
      return h;
    }
    case sdk::DType::fp8_e4m3:
    case sdk::DType::fp8_e5m2:
      sdk::convert(std::span<const std::uint8_t>(
                       reinterpret_cast<const std::uint8_t*>(narrow.bytes.data()), n),
                   v.dtype, wide);
      return h;
    default: {
      Tensor scratch;
      copy_to_host_fp32(b, v, wide.data(), scratch);
      return h;
    }
  }
}

sdk::HostTensor parameter_to_host(const std::shared_ptr<sdk::DeviceBackend>& b,
                                  const std::string& name, const ModelParameter& p) {
  if (!p.quantized()) return to_host_fp32(b, name, p.value());
  const std::vector<float> values = parameter_to_host_fp32(b, p);
  sdk::HostTensor h;
  h.name = name;
  h.dtype = sdk::DType::fp32;
  h.shape = p.shape().to_vector();
  h.bytes.resize(values.size() * sizeof(float));
  std::memcpy(h.bytes.data(), values.data(), h.bytes.size());
  return h;
}

std::optional<std::string> first_nonfinite_fp32(const sdk::HostTensor& t) {
  return first_nonfinite_fp32(t.dtype, t.bytes);
}

std::optional<std::string> first_nonfinite_fp32(sdk::DType dtype,
                                                std::span<const std::byte> bytes) {
  if (dtype != sdk::DType::fp32) return std::nullopt;
  const std::size_t n = bytes.size() / sizeof(float);
  // One pass without an early exit first (it vectorises: a checkpoint's weights, at memory speed),
  // then the element, only when there is one.
  constexpr std::uint32_t kExponent = 0x7F800000u;
  bool any = false;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, bytes.data() + i * sizeof bits, sizeof bits);
    any |= (bits & kExponent) == kExponent;
  }
  if (!any) return std::nullopt;
  for (std::size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, bytes.data() + i * sizeof(float), sizeof v);
    if (!std::isfinite(v))
      return std::string(std::isnan(v) ? "nan"
                         : v > 0       ? "inf"
                                       : "-inf") +
             " at element " + std::to_string(i);
  }
  return std::nullopt;
}

StagedTensor staged_view(const std::shared_ptr<sdk::DeviceBackend>& b, const std::string& name,
                         sdk::TensorView v) {
  StagedTensor t;
  t.info = {name, v.dtype, v.shape.to_vector()};
  t.read = [b, v](std::span<std::byte> buffer) {
    if (!buffer.empty()) b->copy_to_host(buffer.data(), v);  // an empty tensor has no data
    return std::span<const std::byte>(buffer);
  };
  return t;
}

StagedTensor staged_parameter(const std::shared_ptr<sdk::DeviceBackend>& b, const std::string& name,
                              const ModelParameter& p) {
  if (!p.quantized() && p.value().dtype == sdk::DType::fp32) return staged_view(b, name, p.value());
  // Widened or decoded on the host (to_host_fp32, parameter_to_host), then copied into the buffer:
  // frozen 16-bit or quantized weights, a rarer and smaller part of a state.
  StagedTensor t;
  t.info = {name, sdk::DType::fp32, p.shape().to_vector()};
  t.read = [b, name, &p](std::span<std::byte> buffer) {
    const sdk::HostTensor h = parameter_to_host(b, name, p);
    if (!h.bytes.empty())
      std::memcpy(buffer.data(), h.bytes.data(), std::min(buffer.size(), h.bytes.size()));
    return std::span<const std::byte>(buffer);
  };
  return t;
}

StagedTensor staged_host(sdk::HostTensor h) {
  StagedTensor t;
  t.info = {h.name, h.dtype, h.shape};
  t.read = [held = std::make_shared<const sdk::HostTensor>(std::move(h))](std::span<std::byte>) {
    return std::span<const std::byte>(held->bytes);
  };
  t.held = true;
  return t;
}

}  // namespace mixtrain::core
