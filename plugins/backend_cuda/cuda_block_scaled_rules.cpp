// Which block-scaled layouts the CUDA backend runs where (contract in the header).
#include "cuda_block_scaled_rules.h"

#include <algorithm>

#include "mixtrain/sdk/support/block_scaling.h"

namespace mixtrain::backend_cuda {

using sdk::BlockElement;
using sdk::BlockScale;
using sdk::BlockScaledLayout;

namespace {

std::string version_text(int v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

std::string device_text(const BlockScaledDevice& d) {
  return (d.name.empty() ? std::string("this GPU") : d.name) + " (sm_" + std::to_string(d.sm) + ")";
}

bool fp32_scales(const BlockScaledLayout& l) {
  return l.scale == BlockScale::fp32 || l.scale == BlockScale::fp32_pow2;
}

// The headers this backend was built against (its block-scaled engine compiles only against
// cuBLAS 12.9+ headers, whatever the mode) and the library it loaded (needed: the mode's).
std::string library_shortfall(const BlockScaledDevice& d, int needed, const char* modes) {
  if (d.cublaslt_headers < kCublasBlockScaledEngine)
    return std::string("this backend was built against cuBLAS ") +
           version_text(d.cublaslt_headers) + " headers, older than the " +
           version_text(kCublasBlockScaledEngine) + " its block-scaled GEMMs (" + modes +
           ") need: rebuild it with CUDA 12.9 or later";
  if (d.cublaslt_runtime < needed)
    return std::string("the cuBLASLt library loaded is ") + version_text(d.cublaslt_runtime) +
           ", older than the " + version_text(needed) + " that has " + modes +
           ": put a newer libcublasLt first on the library path";
  return {};
}

}  // namespace

std::string block_recipe_name(const BlockScaledLayout& layout) {
  const char* recipe = fp32_scales(layout)                    ? "fp8-block"
                       : layout.scale == BlockScale::e4m3     ? "nvfp4"
                       : layout.element == BlockElement::e2m1 ? "mxfp4"
                                                              : "mxfp8";
  return std::string("\"") + recipe + "\" (" + sdk::describe(layout) + ")";
}

BlockScaledRoute block_scaled_route(const BlockScaledDevice& device,
                                    const BlockScaledLayout& layout) {
  BlockScaledRoute r;
  const std::string what = block_recipe_name(layout);
  const std::int64_t lo = std::min(layout.block_rows, layout.block_cols);
  const std::int64_t hi = std::max(layout.block_rows, layout.block_cols);
  if (fp32_scales(layout)) {
    if (layout.element == BlockElement::e2m1 || layout.tensor_scale) {
      r.refusal = what + " is not a layout cuBLASLt scales with fp32 blocks";
      return r;
    }
    const bool one_d = lo == 1 && hi == 128, two_d = lo == 128 && hi == 128;
    if (!one_d && !two_d) {
      r.refusal = what +
                  " has blocks cuBLASLt does not scale: its fp32 block scales are 1x128 "
                  "along the reduction dim (VEC128_32F) or 128x128 (BLK128x128_32F)";
      return r;
    }
    if (device.sm / 10 != 9) {
      r.refusal = what +
                  " runs natively only on Hopper (sm_90): cuBLAS documents its fp32 block "
                  "scale modes (VEC128_32F, BLK128x128_32F) for compute capability 9.0 "
                  "alone, and this device is " +
                  device_text(device) +
                  (device.sm >= 100 ? " (on Blackwell the recipe to run natively is mxfp8)" : "");
      return r;
    }
    r.refusal = library_shortfall(device, kCublasFp32BlockScales, "VEC128_32F and BLK128x128_32F");
    if (!r.refusal.empty()) {
      r.refusal = what + ": " + r.refusal;
      return r;
    }
    r.mode = one_d ? BlockScaleMode::vec128_fp32 : BlockScaleMode::blk128x128_fp32;
    return r;
  }
  const bool mx = layout.scale == BlockScale::e8m0 || layout.scale == BlockScale::e8m0_round_up;
  const bool nv = layout.scale == BlockScale::e4m3 && layout.element == BlockElement::e2m1;
  const bool mx_shape = mx && lo == 1 && hi == 32 && layout.element != BlockElement::e2m1;
  const bool nv_shape = nv && ((lo == 1 && hi == 16) || (lo == 16 && hi == 16));
  if (!mx_shape && !nv_shape) {
    r.refusal = what +
                " has no cuBLASLt scale mode: cuBLASLt scales fp8 elements by E8M0 per 1x32 "
                "(VEC32_UE8M0) and e2m1 elements by E4M3 per 1x16 (VEC16_UE4M3)";
    return r;
  }
  const char* mode_name = mx_shape ? "VEC32_UE8M0" : "VEC16_UE4M3";
  if (device.sm < 100) {
    r.refusal = what + " runs natively only on Blackwell (sm_100 and later), where cuBLASLt has " +
                mode_name + "; this device is " + device_text(device);
    return r;
  }
  r.refusal = library_shortfall(device, kCublasMxScales, mode_name);
  if (!r.refusal.empty()) {
    r.refusal = what + ": " + r.refusal;
    return r;
  }
  r.mode = mx_shape ? BlockScaleMode::vec32_ue8m0 : BlockScaleMode::vec16_ue4m3;
  return r;
}

std::string block_layout_refusal(const BlockScaledDevice& device, const BlockScaledLayout& layout) {
  return block_scaled_route(device, layout).refusal;
}

bool block_scaled_ops_available(const BlockScaledDevice& device) {
  for (const BlockScaledLayout& l : {sdk::fp8_block_layout(sdk::ReductionAxis::cols),
                                     sdk::mx_layout(sdk::ReductionAxis::cols, BlockElement::e4m3),
                                     sdk::nvfp4_layout(sdk::ReductionAxis::cols)})
    if (block_layout_refusal(device, l).empty()) return true;
  return false;
}

}  // namespace mixtrain::backend_cuda
