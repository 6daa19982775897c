#include "mixtrain/core/graph/quantized_weight.h"

#include <cmath>
#include <span>
#include <stdexcept>

#include "mixtrain/core/graph/bound_facets.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/nf4.h"

namespace mixtrain::core {

using sdk::DType;

namespace {

bool block_format(FrozenFormat format) {
  return format == FrozenFormat::fp8_block || format == FrozenFormat::mxfp8;
}

void require_block_format(FrozenFormat format, const char* who) {
  if (!block_format(format))
    throw std::logic_error(std::string(who) + ": not a block-scaled base format");
}

bool fp32_scales(const sdk::BlockScaledLayout& layout) {
  return layout.scale == sdk::BlockScale::fp32 || layout.scale == sdk::BlockScale::fp32_pow2;
}

std::vector<std::uint8_t> bytes_to_host(sdk::DeviceBackend& backend, const Tensor& t) {
  std::vector<std::uint8_t> out(t.bytes());
  backend.copy_to_host(out.data(), t.view());
  return out;
}

}  // namespace

sdk::BlockScaledLayout base_layout(FrozenFormat format) {
  require_block_format(format, "base_layout");
  // W is [out, in]; the MX weight blocks run along in, as the recipe's forward GEMM takes them.
  if (format == FrozenFormat::fp8_block)
    return sdk::fp8_block_weight_layout(sdk::BlockElement::e4m3, /*power_of_two_scales=*/true);
  // The scale that saturates nothing: the OCP rule's floor would clamp a block's top binade.
  return sdk::mx_layout(sdk::ReductionAxis::cols, sdk::BlockElement::e4m3,
                        sdk::MxScaleRule::round_up);
}

std::string format_label(FrozenFormat format) {
  switch (format) {
    case FrozenFormat::compute:
      return "compute";
    case FrozenFormat::nf4:
      return "NF4";
    case FrozenFormat::fp8_block:
      return "fp8-block";
    case FrozenFormat::mxfp8:
      return "mxfp8";
  }
  return "?";
}

std::string format_detail(const QuantizedWeight& w) {
  if (w.format == FrozenFormat::nf4) return "blocks of " + std::to_string(w.block);
  return sdk::describe(base_layout(w.format));
}

QuantizedWeight make_quantized_weight(const std::shared_ptr<sdk::DeviceBackend>& backend,
                                      FrozenFormat format, sdk::Shape shape, std::int64_t block) {
  QuantizedWeight w;
  w.format = format;
  w.shape = shape;
  const std::int64_t n = shape.numel();
  // Codes and scale codes as bytes: a 1-byte dtype holds them, nothing decodes it as that dtype.
  if (format == FrozenFormat::nf4) {
    w.block = block;
    w.codes = Tensor(backend, DType::fp8_e4m3, sdk::Shape{sdk::nf4_code_bytes(n)});
    w.scales = Tensor(backend, DType::fp32, sdk::Shape{sdk::nf4_block_count(n, block)});
    return w;
  }
  require_block_format(format, "make_quantized_weight");
  if (shape.rank != 2)
    throw std::logic_error("make_quantized_weight: a block-scaled base weight is [out, in], not " +
                           shape.to_string());
  const sdk::BlockScaledLayout layout = base_layout(format);
  const sdk::BlockExtent grid = sdk::block_grid(layout, shape[0], shape[1]);
  w.codes = Tensor(backend, DType::fp8_e4m3, sdk::Shape{n});
  w.scales = Tensor(backend, fp32_scales(layout) ? DType::fp32 : DType::fp8_e4m3,
                    sdk::Shape{grid.rows * grid.cols});
  return w;
}

void quantize_from_host(sdk::DeviceBackend& backend, QuantizedWeight& w, const float* host) {
  const std::span values(host, static_cast<std::size_t>(w.shape.numel()));
  if (w.format == FrozenFormat::nf4) {
    const auto q = sdk::nf4_quantize(values, w.block);
    backend.copy_from_host(w.codes.view(), q.codes.data());
    backend.copy_from_host(w.scales.view(), q.absmax.data());
    return;
  }
  // The block quantizer gives a non-finite value's block NaN scales; a frozen base must encode.
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      throw std::invalid_argument("element " + std::to_string(i) + " is " +
                                  std::to_string(values[i]) + ", which " + format_label(w.format) +
                                  " cannot encode");
  const sdk::BlockScaledLayout layout = base_layout(w.format);
  const auto q = sdk::quantize_block_scaled(values, w.shape[0], w.shape[1], layout);
  backend.copy_from_host(w.codes.view(), q.codes.data());
  backend.copy_from_host(w.scales.view(), fp32_scales(layout)
                                              ? static_cast<const void*>(q.scales.data())
                                              : static_cast<const void*>(q.scale_codes.data()));
}

std::vector<float> dequantize_to_host(sdk::DeviceBackend& backend, const QuantizedWeight& w) {
  if (w.format == FrozenFormat::nf4) {
    sdk::Nf4Tensor t;
    t.numel = w.shape.numel();
    t.block = w.block;
    t.codes = bytes_to_host(backend, w.codes);
    t.absmax.resize(static_cast<std::size_t>(w.scales.shape().numel()));
    backend.copy_to_host(t.absmax.data(), w.scales.view());
    return sdk::nf4_dequantize(t);
  }
  sdk::BlockScaledTensor t;
  t.layout = base_layout(w.format);
  t.rows = w.shape[0];
  t.cols = w.shape[1];
  t.codes = bytes_to_host(backend, w.codes);
  if (fp32_scales(t.layout)) {
    t.scales.resize(static_cast<std::size_t>(w.scales.shape().numel()));
    backend.copy_to_host(t.scales.data(), w.scales.view());
  } else {
    t.scale_codes = bytes_to_host(backend, w.scales);
  }
  return sdk::dequantize_block_scaled(t);
}

void decode(const BoundFacets& facets, const QuantizedWeight& w, sdk::TensorView out) {
  if (w.format == FrozenFormat::nf4) {
    facets.call(sdk::QuantizedWeightOp::dequantize_nf4)
        ->dequantize_nf4(w.codes.view().data, w.scales.view(), w.block, out);
    return;
  }
  facets.call(sdk::QuantizedWeightOp::dequantize_block_scaled)
      ->dequantize_block_scaled({w.codes.view(), w.scales.view(), {}, base_layout(w.format)}, out);
}

sdk::QuantizedWeightOp decode_op(FrozenFormat format) {
  return format == FrozenFormat::nf4 ? sdk::QuantizedWeightOp::dequantize_nf4
                                     : sdk::QuantizedWeightOp::dequantize_block_scaled;
}

}  // namespace mixtrain::core
