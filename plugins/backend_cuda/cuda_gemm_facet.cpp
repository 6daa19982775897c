// CudaGemm: GEMMs through the context's cuBLASLt engine (cuda_gemm.cpp), block-scaled ones through
// its block-scaled engine (cuda_block_scaled_gemm.cpp) and the quantize kernels (fp8-block:
// cuda_block_quantize.h; MXFP8 / NVFP4: cuda_byte_scaled_quantize.h); gemm_gradient through the
// cuBLASLt engine and the column-sum kernel of bias_grad (cuda_activation.h); cast_transpose
// through its tile kernel (cuda_cast_transpose.h).
#include "cuda_gemm_facet.h"

#include <cublasLt.h>
#include <cublas_api.h>

#include <algorithm>
#include <stdexcept>

#include "cuda_access.h"
#include "cuda_activation.h"
#include "cuda_block_quantize.h"
#include "cuda_block_scaled_gemm.h"
#include "cuda_byte_scaled_quantize.h"
#include "cuda_cast_transpose.h"
#include "cuda_gemm.h"
#include "cuda_gemm_routes.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cuda {

using sdk::DType;

namespace {

constexpr const char* kQuantize = "quantize_block_scaled";

bool fp32_scaled(const sdk::BlockScaledLayout& l) {
  return l.scale == sdk::BlockScale::fp32 || l.scale == sdk::BlockScale::fp32_pow2;
}

// Checks one quantize output's views against src's shape (srcᵀ's for a transposed output) and the
// device's layouts.
void check_output(const sdk::BlockScaledOperand& out, std::int64_t src_rows, std::int64_t src_cols,
                  const BlockScaledDevice& device) {
  const std::int64_t rows = out.transpose ? src_cols : src_rows;
  const std::int64_t cols = out.transpose ? src_rows : src_cols;
  const std::string refusal = block_layout_refusal(device, out.layout);
  if (!refusal.empty())
    fail(kQuantize, refusal,
         "run this policy on the CPU backend's simulator (--set backend.type=cpu)");
  sdk::BlockExtent grid{};
  try {
    grid = sdk::block_grid(out.layout, rows, cols);
  } catch (const std::invalid_argument& e) {
    fail(kQuantize, e.what(), "a host bug: the quantize output does not fit its layout");
  }
  const bool tensor_scale_ok = !out.layout.tensor_scale || (out.tensor_scale.data != nullptr &&
                                                            out.tensor_scale.dtype == DType::fp32 &&
                                                            out.tensor_scale.numel() == 1);
  if (sdk::dtype_size(out.codes.dtype) != 1 || out.codes.numel() != rows * cols ||
      out.scales.data == nullptr || out.scales.dtype != DType::fp32 ||
      out.scales.numel() != grid.rows * grid.cols || !tensor_scale_ok)
    fail(kQuantize,
         "an output for " + sdk::describe(out.layout) + " of a [" + std::to_string(rows) + ", " +
             std::to_string(cols) + "] source needs 1-byte codes of that shape and fp32 scales [" +
             std::to_string(grid.rows) + ", " + std::to_string(grid.cols) + "]" +
             (out.layout.tensor_scale ? " and an fp32 tensor scale [1]" : "") + "; got codes " +
             describe(out.codes) + ", scales " + describe(out.scales),
         "a host bug: the quantize output does not fit its layout");
}

// An fp8-block output as the tile kernel takes it: block extents relative to src.
kernels::BlockQuantizeOutput fp32_scaled_output(const sdk::BlockScaledOperand& out) {
  kernels::BlockQuantizeOutput k;
  k.codes = static_cast<std::uint8_t*>(out.codes.data);
  k.scales = static_cast<float*>(out.scales.data);
  k.transposed = out.transpose;
  k.block_rows = static_cast<int>(out.transpose ? out.layout.block_cols : out.layout.block_rows);
  k.block_cols = static_cast<int>(out.transpose ? out.layout.block_rows : out.layout.block_cols);
  k.e5m2 = out.layout.element == sdk::BlockElement::e5m2;
  k.pow2 = out.layout.scale == sdk::BlockScale::fp32_pow2;
  return k;
}

// An MX / NVFP4 output as the byte-scaled kernels take it: block extents relative to src.
kernels::ByteScaledQuantizeOutput byte_scaled_output(const sdk::BlockScaledOperand& out) {
  namespace bq = block_quantize;
  kernels::ByteScaledQuantizeOutput k;
  k.codes = static_cast<std::uint8_t*>(out.codes.data);
  k.scales = static_cast<float*>(out.scales.data);
  k.tensor_scale = out.layout.tensor_scale ? static_cast<float*>(out.tensor_scale.data) : nullptr;
  k.transposed = out.transpose;
  k.block_rows = static_cast<int>(out.transpose ? out.layout.block_cols : out.layout.block_rows);
  k.block_cols = static_cast<int>(out.transpose ? out.layout.block_rows : out.layout.block_cols);
  k.element = out.layout.element == sdk::BlockElement::e5m2   ? bq::ByteElement::e5m2
              : out.layout.element == sdk::BlockElement::e2m1 ? bq::ByteElement::e2m1
                                                              : bq::ByteElement::e4m3;
  k.rule = out.layout.scale == sdk::BlockScale::e4m3            ? bq::ByteScaleRule::nvfp4
           : out.layout.scale == sdk::BlockScale::e8m0_round_up ? bq::ByteScaleRule::e8m0_round_up
                                                                : bq::ByteScaleRule::e8m0_floor;
  return k;
}

}  // namespace

void CudaGemm::gemm(const sdk::GemmArgs& args) {
  context_.activate();
  context_.gemm->run(args);
  context_.account_buffers();
}

void CudaGemm::gemm_strided_batched(const sdk::GemmBatchedArgs& args) {
  context_.activate();
  checks().gemm_batched_shape(args);
  context_.gemm->run_batched(args);
  context_.account_buffers();
}

void CudaGemm::gemm_gradient(const sdk::GemmGradientArgs& args) {
  context_.activate();
  const auto [m, n, k] = checks().gemm_gradient_shape(args);
  context_.gemm->run_gradient(args);
  const bool c_sums = !args.c_column_sums.empty(), a_sums = !args.a_row_sums.empty();
  if (c_sums || a_sums) {
    // One scratch for both: the second reduction reuses it after the first on the same stream.
    std::size_t floats = 1;
    if (c_sums) floats = std::max(floats, kernels::column_sum_scratch(m, n));
    if (a_sums) floats = std::max(floats, kernels::column_sum_scratch(k, m));
    float* partial = context_.partial.as<float>(floats, context_.stream, "gemm_gradient");
    // C is [m, n] as stored (after its single rounding).
    if (c_sums)
      check_cuda(kernels::bias_grad(args.gemm.c.data, elem_of(args.gemm.c.dtype),
                                    args.c_column_sums.as<float>(), m, n,
                                    args.accumulate_c_column_sums, partial, context_.stream),
                 "gemm_gradient", "column sums of C");
    // A is stored [k, m] (transposed, checked): Σ_k op(A)[i, k] is the column sum of its column i.
    if (a_sums)
      check_cuda(kernels::bias_grad(args.gemm.a.view.data, elem_of(args.gemm.a.view.dtype),
                                    args.a_row_sums.as<float>(), k, m, args.accumulate_a_row_sums,
                                    partial, context_.stream),
                 "gemm_gradient", "row sums of op(A)");
  }
  context_.account_buffers();
}

BlockScaledDevice CudaGemm::block_device() const {
  return {context_.sm, context_.device_name, static_cast<int>(cublasLtGetVersion()),
          CUBLAS_VERSION};
}

void CudaGemm::cast_transpose(const sdk::CastTransposeArgs& args) {
  context_.activate();
  const auto [rows, cols] = checks().cast_transpose_shape(args);
  const DType to = args.out.empty() ? args.out_transposed.dtype : args.out.dtype;
  check_cuda(kernels::cast_transpose(
                 args.src.data, elem_of(args.src.dtype), args.out.data, args.out_transposed.data,
                 elem_of(to), rows, cols, args.cast.scale, args.cast.saturate,
                 args.cast.amax.empty() ? nullptr : args.cast.amax.as<float>(), context_.stream),
             "cast_transpose", "FP8 cast-transpose kernel");
}

void CudaGemm::cast_transpose_gradient(const sdk::CastTransposeGradientArgs& args) {
  context_.activate();
  const auto [rows, cols] = checks().cast_transpose_gradient_shape(args);
  const sdk::CastTransposeArgs& cast = args.cast;
  const DType to = cast.out.empty() ? cast.out_transposed.dtype : cast.out.dtype;
  const bool sums = !args.column_sums.empty();
  float* partial =
      sums ? context_.partial.as<float>(
                 std::max<std::size_t>(1, kernels::cast_transpose_sum_scratch(rows, cols)),
                 context_.stream, "cast_transpose_gradient")
           : nullptr;
  context_.account_buffers();
  check_cuda(kernels::cast_transpose_gradient(
                 cast.src.data, args.has_activation_grad ? args.pre_activation.data : nullptr,
                 elem_of(cast.src.dtype), cast.out.data, cast.out_transposed.data, elem_of(to),
                 rows, cols, cast.cast.scale, cast.cast.saturate,
                 cast.cast.amax.empty() ? nullptr : cast.cast.amax.as<float>(),
                 sums ? args.column_sums.as<float>() : nullptr, args.accumulate_column_sums,
                 partial, context_.stream),
             "cast_transpose_gradient", "FP8 cast-transpose kernel");
}

bool CudaGemm::supports(sdk::GemmOp op, std::span<const DType> dtypes) const {
  if (op == sdk::GemmOp::cast_transpose_gradient && !context_.fp8_gradient_cast) return false;
  if (op == sdk::GemmOp::cast_transpose || op == sdk::GemmOp::cast_transpose_gradient)
    return context_.fp8_cast_transpose && context_.sm >= 89 && dtypes.size() == 2 &&
           (dtypes[0] == DType::fp32 || dtypes[0] == DType::bf16 || dtypes[0] == DType::fp16) &&
           sdk::is_fp8(dtypes[1]);
  if (op != sdk::GemmOp::quantize_block_scaled && op != sdk::GemmOp::gemm_block_scaled)
    return gemm_supported(context_.capabilities(), op, dtypes);
  if (dtypes.size() != 1 || !is_storage_float(dtypes[0]) || dtypes[0] == DType::tf32) return false;
  return block_scaled_ops_available(block_device());
}

bool CudaGemm::quantizes_transposed() const {
  return true;
}

std::string CudaGemm::block_layout_refusal(const sdk::BlockScaledLayout& layout) const {
  return backend_cuda::block_layout_refusal(block_device(), layout);
}

void CudaGemm::quantize_block_scaled(const sdk::BlockQuantizeArgs& args) {
  context_.activate();
  const sdk::TensorView& src = args.src;
  if (src.data == nullptr && src.numel() != 0) fail(kQuantize, "src has no data", "a host bug");
  if (!is_storage_float(src.dtype) || src.dtype == DType::tf32)
    fail(kQuantize, "src " + describe(src) + " must be fp32, bf16 or fp16",
         "cast it first (backend.cast)");
  const std::int64_t cols = src.shape.cols();
  const std::int64_t rows = cols == 0 ? 0 : src.numel() / cols;
  const BlockScaledDevice device = block_device();
  for (const sdk::BlockScaledOperand& out : args.outputs)
    if (!out.codes.empty()) check_output(out, rows, cols, device);
  // fp8-block outputs share one read of src in the tile kernel; MX / NVFP4 ones run one by one.
  kernels::BlockQuantizeOutput tiles[2];
  bool any_tiles = false;
  for (int i = 0; i < 2; ++i)
    if (!args.outputs[i].codes.empty() && fp32_scaled(args.outputs[i].layout)) {
      tiles[i] = fp32_scaled_output(args.outputs[i]);
      any_tiles = true;
    }
  if (any_tiles) {
    check_cuda(
        kernels::quantize_fp8_blocks(src.data, elem_of(src.dtype), rows, cols, tiles[0], tiles[1],
                                     args.stochastic_rounding, args.seed, context_.stream),
        kQuantize, "fp8-block quantize kernel");
  }
  for (const sdk::BlockScaledOperand& out : args.outputs) {
    if (out.codes.empty() || fp32_scaled(out.layout)) continue;
    auto* global_amax = context_.flags.as<std::uint32_t>(1, context_.stream, kQuantize);
    check_cuda(kernels::quantize_byte_scaled_blocks(
                   src.data, elem_of(src.dtype), rows, cols, byte_scaled_output(out),
                   args.stochastic_rounding, args.seed, global_amax, context_.stream),
               kQuantize, "MXFP8 / NVFP4 quantize kernels");
  }
  context_.account_buffers();
}

void CudaGemm::gemm_block_scaled(const sdk::BlockScaledGemmArgs& args) {
  context_.activate();
  context_.block_gemm->run(args);
  context_.account_buffers();
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::GemmFacet, CudaGemm> kCudaGemmRegistration;

}  // namespace mixtrain::backend_cuda
