// CpuBackend's facet answers (supports()) and the strided-batched GEMM's dispatch.
#include <algorithm>
#include <initializer_list>

#include "cpu_access.h"
#include "cpu_backend.h"
#include "cpu_gemm.h"

namespace mixtrain::backend_cpu {

using sdk::DType;

namespace {

// Each position of `dtypes` checked against its rule; more dtypes than the op has tensors is a
// question about another op, answered no.
bool matches(std::span<const DType> dtypes, std::initializer_list<bool (*)(DType)> rules) {
  if (dtypes.size() > rules.size()) return false;
  auto rule = rules.begin();
  for (DType t : dtypes)
    if (!(*rule++)(t)) return false;
  return true;
}

bool storage(DType t) {
  return is_storage_float(t);
}
bool fp32(DType t) {
  return is_fp32_storage(t);
}
bool gemm_operand(DType t) {
  return is_storage_float(t) || sdk::is_fp8(t);
}

}  // namespace

bool CpuBackend::supports(sdk::GemmOp op, std::span<const DType> dtypes) const {
  switch (op) {
    case sdk::GemmOp::gemm:
    case sdk::GemmOp::gemm_strided_batched:
      return matches(dtypes, {gemm_operand, gemm_operand, storage});
  }
  return false;
}

bool CpuBackend::supports(sdk::ElementwiseOp op, std::span<const DType> dtypes) const {
  using E = sdk::ElementwiseOp;
  switch (op) {
    case E::bias_grad:
      return matches(dtypes, {storage, fp32});
    case E::activation_forward:
      return matches(dtypes, {storage, storage});
    case E::activation_backward:
      return matches(dtypes, {storage, storage, storage});
    case E::axpy:
      return matches(dtypes, {storage, fp32});
    case E::unscale_and_check_finite:
    case E::unscale_check_and_sum_squares:
      return matches(dtypes, {fp32});
    case E::first_nonfinite:
      return matches(dtypes, {storage});
    case E::foreach_mul_scalar:
    case E::foreach_add_scalar:
    case E::foreach_sqrt:
    case E::foreach_sign:
    case E::foreach_clamp:
      return matches(dtypes, {fp32});
    case E::foreach_mul:
    case E::foreach_add:
    case E::foreach_lerp:
      return matches(dtypes, {fp32, fp32});
    case E::foreach_addcmul:
      return matches(dtypes, {fp32, fp32, fp32});
    case E::add:
      return matches(dtypes, {storage, storage});
  }
  return false;
}

bool CpuBackend::supports(sdk::NormalizationOp op, std::span<const DType> dtypes) const {
  switch (op) {
    case sdk::NormalizationOp::layernorm_forward:
    case sdk::NormalizationOp::layernorm_backward:
      return matches(dtypes, {storage});
    case sdk::NormalizationOp::batchnorm_forward_training:
    case sdk::NormalizationOp::batchnorm_forward_inference:
    case sdk::NormalizationOp::batchnorm_backward:
      return matches(dtypes, {storage});
  }
  return false;
}

bool CpuBackend::supports(sdk::LossOp op, std::span<const DType> dtypes) const {
  switch (op) {
    case sdk::LossOp::softmax_cross_entropy:
      return matches(dtypes, {storage});
  }
  return false;
}

bool CpuBackend::supports(sdk::OptimizerOp op, std::span<const DType> dtypes) const {
  switch (op) {
    case sdk::OptimizerOp::sgd_update:
    case sdk::OptimizerOp::adamw_update:
      return matches(dtypes, {fp32, storage});
  }
  return false;
}

bool CpuBackend::supports(sdk::AttentionOp op, std::span<const DType> dtypes) const {
  switch (op) {
    case sdk::AttentionOp::split_heads:
    case sdk::AttentionOp::merge_heads:
      return matches(dtypes, {storage, storage});
    case sdk::AttentionOp::softmax_forward:
    case sdk::AttentionOp::softmax_backward:
      return matches(dtypes, {fp32});
  }
  return false;
}

bool CpuBackend::supports(sdk::EmbeddingOp op, std::span<const DType> dtypes) const {
  switch (op) {
    case sdk::EmbeddingOp::gather:
      return matches(dtypes, {storage, storage});
    case sdk::EmbeddingOp::scatter_add:
      return matches(dtypes, {storage});
  }
  return false;
}

bool CpuBackend::supports(sdk::ConvolutionOp op, std::span<const DType> dtypes) const {
  using C = sdk::ConvolutionOp;
  switch (op) {
    case C::conv2d_forward:
    case C::conv2d_backward_data:
      return matches(dtypes, {gemm_operand, gemm_operand, storage});
    case C::conv2d_backward_weights:
      return matches(dtypes, {gemm_operand, gemm_operand});
    case C::pool2d_forward:
    case C::pool2d_backward:
      // One dtype for both tensors (fp32 and tf32 share storage).
      return matches(dtypes, {storage, storage}) &&
             (dtypes.size() < 2 || dtypes[0] == dtypes[1] || (fp32(dtypes[0]) && fp32(dtypes[1])));
    case C::to_channels_last:
    case C::to_channels_first:
      return matches(dtypes, {storage, storage});
  }
  return false;
}

void CpuBackend::gemm_strided_batched(const sdk::GemmBatchedArgs& args) {
  use_threads();
  const bool done = gemm_->run_batched(args);  // checks the arguments
  account_scratch();
  if (done) return;
  // What one 3-D primitive cannot express (see cpu_gemm.h): batch i's operands are batch 0's
  // views moved by i strides, each through gemm() and its cached 2-D primitive.
  auto moved = [](sdk::TensorView v, std::int64_t elements) {
    v.data =
        static_cast<char*>(v.data) + elements * static_cast<std::int64_t>(sdk::dtype_size(v.dtype));
    return v;
  };
  sdk::GemmArgs g = args.gemm;
  for (std::int64_t i = 0; i < args.batch; ++i) {
    g.a.view = moved(args.gemm.a.view, i * args.stride_a);
    g.b.view = moved(args.gemm.b.view, i * args.stride_b);
    g.c = moved(args.gemm.c, i * args.stride_c);
    gemm(g);
  }
}

}  // namespace mixtrain::backend_cpu
