// CpuContext's convolution decisions: whether bf16 convolutions run in oneDNN's bf16 kernels,
// whether the direct convolution's blocked layout pays here, whether oneDNN has an fp32
// Winograd kernel, and which convolution gradients run as GEMMs. The first three are probed once,
// on first use, by asking oneDNN which kernel it would run for a ResNet-like convolution; the
// last reads the CPU's features once.
#include <optional>
#include <string>

#include "cpu_context.h"
#include "cpu_conv_algorithm.h"
#include "cpu_conv_gemm_rule.h"
#include "cpu_conv_primitives.h"
#include "cpu_features.h"
#include "cpu_gemm.h"
#include "cpu_primitive_cache.h"

namespace mixtrain::backend_cpu {

using dnnl::memory;

namespace {

// A ResNet-like 3x3 convolution (batch 8, 64 channels, 16x16) to ask oneDNN which kernel it runs.
sdk::Conv2dGeometry probe_geometry() {
  sdk::Conv2dGeometry g;
  g.batch = 8;
  g.in_channels = g.out_channels = 64;
  g.height = g.width = 16;
  g.kernel_h = g.kernel_w = 3;
  g.pad_h = g.pad_w = 1;
  return g;
}

}  // namespace

bool CpuContext::bf16_conv_native() const {
  if (bf16_conv_state_ >= 0) return bf16_conv_state_ == 1;
  // What oneDNN runs for a ResNet-like bf16 3x3 convolution here; none means no bf16 kernel.
  std::string impl;
  try {
    impl = forward_pd(prims_->engine(), probe_geometry(), memory::data_type::bf16,
                      memory::data_type::f32, false, ConvMethod::direct)
               .impl_info_str();
  } catch (const dnnl::error&) {
    impl.clear();
  }
  const bool usable = !impl.empty() && !is_reference_kernel(impl);
  bool native = false;
  switch (bf16_conv_request_) {
    case Bf16ConvPath::emulated:
      bf16_conv_note_ = "bf16_conv = emulated";
      break;
    case Bf16ConvPath::onednn:
      native = !impl.empty();
      bf16_conv_note_ = native ? "bf16_conv = onednn (" + impl + ")"
                               : "oneDNN has no bf16 convolution on this CPU";
      break;
    case Bf16ConvPath::automatic: {
      const CpuInfo cpu = detect_cpu();
      native = usable && onednn_bf16_preferred(cpu);
      if (impl.empty())
        bf16_conv_note_ = "oneDNN has no bf16 convolution on this CPU";
      else if (!usable)
        bf16_conv_note_ = "oneDNN's bf16 convolution here is a reference kernel (" + impl + ")";
      else if (!native)
        bf16_conv_note_ = "oneDNN's " + impl +
                          " is not preferred on this CPU (bf16 kernels run natively with AMX-BF16, "
                          "or AVX512-BF16 on AMD); bf16_conv = \"onednn\" forces it";
      else
        bf16_conv_note_ = impl + (cpu.has("amx_bf16") ? " (AMX-BF16)" : " (AVX512-BF16, AMD)");
      break;
    }
  }
  bf16_conv_state_ = native ? 1 : 0;
  return native;
}

std::string CpuContext::bf16_conv_note() const {
  bf16_conv_native();
  return bf16_conv_note_;
}

bool CpuContext::conv_winograd_available() const {
  if (winograd_state_ >= 0) return winograd_state_ == 1;
  // What oneDNN runs for a ResNet-like fp32 3x3 Winograd convolution here.
  bool usable = false;
  try {
    winograd_impl_ = forward_pd(prims_->engine(), probe_geometry(), memory::data_type::f32,
                                memory::data_type::f32, false, ConvMethod::winograd)
                         .impl_info_str();
    usable = !is_reference_kernel(winograd_impl_);
    if (!usable) winograd_impl_ = "only a reference kernel (" + winograd_impl_ + ")";
  } catch (const dnnl::error& e) {
    winograd_impl_ = std::string("no kernel: ") + e.what();
  }
  winograd_state_ = usable ? 1 : 0;
  return usable;
}

namespace {

// conv_gemm's answer where the option decides alone (gemm: yes; convolution: no), else none.
std::optional<bool> forced(ConvGemm choice) {
  switch (choice) {
    case ConvGemm::gemm:
      return true;
    case ConvGemm::convolution:
      return false;
    case ConvGemm::automatic:
      break;
  }
  return std::nullopt;
}

// auto's answer for a shape: bf16_pays on the native bf16 route (the GEMM engine's bf16 GEMMs on
// AMX), fp32_pays on the fp32 route (on the CPU class measured: AMX-BF16), never on another.
bool automatic_takes(ConvGemmOperands operands, bool bf16_pays, bool fp32_pays, bool amx_bf16_gemms,
                     bool amx_bf16) {
  switch (operands) {
    case ConvGemmOperands::native_bf16:
      return bf16_pays && amx_bf16_gemms;
    case ConvGemmOperands::fp32:
      return fp32_pays && amx_bf16;
    case ConvGemmOperands::other:
      break;
  }
  return false;
}

}  // namespace

bool CpuContext::wgrad_as_gemm(const sdk::Conv2dGeometry& g, ConvGemmOperands operands,
                               bool fp8_dy_with_bias) const {
  if (!wgrad_gemm_shape(g) || fp8_dy_with_bias) return false;
  if (const auto f = forced(conv_gemm_)) return *f;
  return automatic_takes(operands, wgrad_gemm_pays(g), fp32_gemm_pays(g), amx_bf16_gemms(),
                         has_amx_bf16());
}

bool CpuContext::dgrad_as_gemm(const sdk::Conv2dGeometry& g, ConvGemmOperands operands,
                               sdk::DType dx, bool accumulate) const {
  // The GEMM engine writes fp32, bf16 and fp16; an accumulating call adds into fp32 only.
  const bool writable =
      dx == sdk::DType::fp32 || (!accumulate && (dx == sdk::DType::bf16 || dx == sdk::DType::fp16));
  if (!dgrad_gemm_shape(g) || !writable) return false;
  if (const auto f = forced(conv_gemm_)) return *f;
  return automatic_takes(operands, true, fp32_dgrad_gemm_pays(g), amx_bf16_gemms(), has_amx_bf16());
}

bool CpuContext::fprop_as_gemm(const sdk::Conv2dGeometry& g, ConvGemmOperands operands) const {
  // A forward's y is fp32, bf16 or fp16 (checked), all of which the GEMM engine writes.
  if (!fprop_gemm_shape(g)) return false;
  if (const auto f = forced(conv_gemm_)) return *f;
  return automatic_takes(operands, fprop_gemm_pays(g), fp32_gemm_pays(g), amx_bf16_gemms(),
                         has_amx_bf16());
}

bool CpuContext::offers_dgrad_accumulate(sdk::DType dy, sdk::DType w, sdk::DType dx) const {
  if (dx != sdk::DType::fp32) return false;
  if (const auto f = forced(conv_gemm_)) return *f;
  if (dy == sdk::DType::fp32 && w == sdk::DType::fp32) return has_amx_bf16();
  return dy == sdk::DType::bf16 && w == sdk::DType::bf16 && bf16_conv_native() && amx_bf16_gemms();
}

std::string CpuContext::conv_gemm_note() const {
  switch (conv_gemm_) {
    case ConvGemm::gemm:
      return "conv_gemm = gemm: every weight gradient of one group, and every unpadded 1x1 "
             "data gradient and forward, as one GEMM";
    case ConvGemm::convolution:
      return "conv_gemm = convolution: every convolution in oneDNN's convolution";
    case ConvGemm::automatic:
      break;
  }
  if (!has_amx_bf16())
    return "conv_gemm = auto: every convolution in oneDNN's convolution (the GEMM is taken with "
           "AMX-BF16 only)";
  const std::string fp32 =
      "fp32 1x1 weight gradients, data gradients (into an fp32 sum or not) and forwards on small "
      "maps or with many weights a pixel, and fp32 1x1 data gradients on wide stride-1 maps, as "
      "one fp32 GEMM";
  if (!bf16_conv_native() || !amx_bf16_gemms())
    return "conv_gemm = auto: " + fp32 +
           "; bf16 and the others in oneDNN's convolution (bf16 convolutions or GEMMs are "
           "emulated here)";
  return "conv_gemm = auto: bf16 weight gradients of 1x1 and wide 3x3 convolutions, bf16 1x1 "
         "data gradients (into an fp32 sum or not) and bf16 1x1 forwards on small maps, as one "
         "AMX-BF16 GEMM; " +
         fp32 + "; the others in oneDNN's convolution";
}

bool CpuContext::blocked_layout_pays() const {
  if (blocked_state_ >= 0) return blocked_state_ == 1;
  try {
    direct_impl_ = forward_pd(prims_->engine(), probe_geometry(), memory::data_type::f32,
                              memory::data_type::f32, false, ConvMethod::direct)
                       .impl_info_str();
  } catch (const dnnl::error& e) {
    direct_impl_ = std::string("no kernel: ") + e.what();
  }
  blocked_state_ = direct_impl_ == "jit:avx2" ? 1 : 0;
  return blocked_state_ == 1;
}

bool CpuContext::blocked_layout_for(Direction dir, const sdk::Conv2dGeometry& g) const {
  switch (conv_algorithm_) {
    case ConvAlgorithm::direct_nhwc:
      return false;
    case ConvAlgorithm::blocked_everywhere:
      return true;
    default:
      return blocked_pays(dir, g) && blocked_layout_pays();
  }
}

// What the direct convolution does here, for the note below.
std::string CpuContext::direct_note() const {
  switch (conv_algorithm_) {
    case ConvAlgorithm::direct_nhwc:
      return "direct convolutions in nhwc";
    case ConvAlgorithm::blocked_everywhere:
      return "direct convolutions in oneDNN's blocked layout everywhere";
    default:
      return blocked_layout_pays()
                 ? "direct 3x3 convolutions with C, O >= 32 in oneDNN's blocked layout "
                   "(backward-data from 28x28 inputs; its nhwc kernel here is " +
                       direct_impl_ + "), the others in nhwc"
                 : "direct convolutions in nhwc (oneDNN's " + direct_impl_ + ")";
  }
}

std::string CpuContext::conv_algorithm_note() const {
  if (conv_algorithm_ == ConvAlgorithm::direct || conv_algorithm_ == ConvAlgorithm::direct_nhwc ||
      conv_algorithm_ == ConvAlgorithm::blocked_everywhere)
    return "conv_algorithm = direct: " + direct_note();
  if (!conv_winograd_available())
    return "conv_algorithm = winograd, but oneDNN has no fp32 Winograd convolution on this CPU (" +
           winograd_impl_ + "; it needs AVX-512): every convolution runs direct, " + direct_note();
  if (conv_algorithm_ == ConvAlgorithm::winograd_everywhere)
    return "conv_algorithm = winograd everywhere (no rule): oneDNN's " + winograd_impl_ +
           " for every fp32 3x3 stride-1 convolution it computes; elsewhere " + direct_note();
  return "conv_algorithm = winograd: oneDNN's " + winograd_impl_ +
         " for fp32 3x3 stride-1 convolutions with N*OH*OW*C*O >= 2^23 and C, O >= 16 "
         "(forward: C >= 32; backward-data: O >= 32); elsewhere " +
         direct_note();
}

}  // namespace mixtrain::backend_cpu
