// CpuGemm: the CPU backend's GemmFacet on the shared GemmEngine (cpu_gemm.h): cached oneDNN
// matmul primitives with FP32 accumulation, the fused epilogue's activation from
// cpu_activation_kernels.h, and the strided-batched GEMM as one 3-D matmul where one can express
// the call, else a loop over gemm(); the block-scaled ops on the exact simulator
// (cpu_block_scaled.h); gemm_gradient as gemm() whose epilogue multiplies the FP32 product by the
// activation's gradient before its one rounding, then the bias-gradient sums of
// cpu_activation_kernels.h, the activation facet's own, over C and A as stored; cast_transpose by
// the tile loop of cpu_cast_transpose.h, whose codes are cast()'s, and cast_transpose_gradient as
// the ops it fuses in turn (both implemented as the reference, not offered: supports() answers
// false for them).
#include <algorithm>
#include <cstdint>

#include "cpu_access.h"
#include "cpu_activation_kernels.h"
#include "cpu_block_scaled.h"
#include "cpu_cast_transpose.h"
#include "cpu_context.h"
#include "cpu_gemm.h"
#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

namespace {

class CpuGemm final : public sdk::GemmFacet {
 public:
  explicit CpuGemm(CpuContext& context) : context_(context) {}

  void gemm(const sdk::GemmArgs& args) override;
  // One cached 3-D oneDNN matmul (batch, m, k) x (batch, k, n), same dtype routing as gemm();
  // a loop over gemm() for what that cannot express (cpu_gemm.h).
  void gemm_strided_batched(const sdk::GemmBatchedArgs& args) override;
  // The SDK's table and the block-scaled ops on fp32 / bf16 / fp16 (src; C); not the FP8 casts.
  bool supports(sdk::GemmOp op, std::span<const sdk::DType> dtypes) const override;
  void quantize_block_scaled(const sdk::BlockQuantizeArgs& args) override;
  void gemm_block_scaled(const sdk::BlockScaledGemmArgs& args) override;
  void gemm_gradient(const sdk::GemmGradientArgs& args) override;
  void cast_transpose(const sdk::CastTransposeArgs& args) override {
    backend_cpu::cast_transpose(context_, args);
  }
  void cast_transpose_gradient(const sdk::CastTransposeGradientArgs& args) override {
    backend_cpu::cast_transpose_gradient(context_, args);
  }

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::GemmFacet, CpuGemm> kRegistration;

}  // namespace

void CpuGemm::gemm(const sdk::GemmArgs& args) {
  context_.use_threads();
  context_.gemm().run(args, [this](sdk::Activation act, const TensorView& z) {
    apply_activation(context_, act, z, z);
  });
  context_.account_scratch();
}

bool CpuGemm::supports(sdk::GemmOp op, std::span<const sdk::DType> dtypes) const {
  if (op == sdk::GemmOp::gemm_gradient) return GemmFacet::supports(sdk::GemmOp::gemm, dtypes);
  // Implemented (cast_transpose below), not offered: this GEMM decodes an FP8 operand to fp32
  // and reads either layout through oneDNN's strides at the same cost, so the host's casts alone
  // keep less (no Wᵀ) at the same speed (plugins/backend_cpu/README.md).
  if (op == sdk::GemmOp::cast_transpose || op == sdk::GemmOp::cast_transpose_gradient) return false;
  if (op != sdk::GemmOp::quantize_block_scaled && op != sdk::GemmOp::gemm_block_scaled)
    return GemmFacet::supports(op, dtypes);
  if (dtypes.size() > 1) return false;
  for (sdk::DType t : dtypes)
    if (t != sdk::DType::fp32 && t != sdk::DType::bf16 && t != sdk::DType::fp16) return false;
  return true;
}

void CpuGemm::gemm_gradient(const sdk::GemmGradientArgs& args) {
  context_.use_threads();
  const auto shape = checks().gemm_gradient_shape(args);
  const std::int64_t m = shape.m, n = shape.n;
  const sdk::GemmArgs& g = args.gemm;
  // The product's epilogue multiplies by the activation's gradient and rounds once into C, a
  // block at a time (cpu_activation_kernels.h).
  if (args.has_activation_grad) {
    GemmEngine& engine = context_.gemm();
    const auto block = static_cast<std::size_t>(std::min(kEpilogueBlock, m * n));
    float* decoded = engine.epilogue_scratch(std::max<std::size_t>(block, 1));
    engine.run_into(args.gemm, [&](const TensorView& z, const TensorView& c) {
      apply_activation_grad_into(context_, args.activation, args.pre_activation, z, c, decoded);
    });
  } else
    context_.gemm().run(args.gemm);
  context_.account_scratch();
  if (!args.c_column_sums.empty())
    sum_columns(context_, g.c, m, n, args.c_column_sums.as<float>(), args.accumulate_c_column_sums);
  // A is stored [k, m] (transposed, checked): Σ_k op(A)[m, k] is the sum of its columns.
  if (!args.a_row_sums.empty())
    sum_columns(context_, g.a.view, g.a.view.shape.rows(), m, args.a_row_sums.as<float>(),
                args.accumulate_a_row_sums);
}

void CpuGemm::quantize_block_scaled(const sdk::BlockQuantizeArgs& args) {
  quantize_block_scaled_cpu(args);
  context_.account_scratch();
}

void CpuGemm::gemm_block_scaled(const sdk::BlockScaledGemmArgs& args) {
  gemm_block_scaled_cpu(args, [this](sdk::Activation act, const TensorView& z) {
    apply_activation(context_, act, z, z);
  });
  context_.account_scratch();
}

void CpuGemm::gemm_strided_batched(const sdk::GemmBatchedArgs& args) {
  context_.use_threads();
  const bool done = context_.gemm().run_batched(args);  // checks the arguments
  context_.account_scratch();
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
