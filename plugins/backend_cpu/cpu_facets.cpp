// CpuBackend's facets (found by name) and the strided-batched GEMM's dispatch.
#include "cpu_access.h"
#include "cpu_backend.h"
#include "cpu_gemm.h"

namespace mixtrain::backend_cpu {

sdk::Facet* CpuBackend::find_facet(std::string_view name) {
  return sdk::facet_among<sdk::GemmFacet, sdk::ActivationFacet, sdk::ResidualFacet,
                          sdk::GradientCheckFacet, sdk::ForeachFacet, sdk::LayerNormFacet,
                          sdk::BatchNormFacet, sdk::LossFacet, sdk::OptimizerFacet,
                          sdk::AttentionFacet, sdk::EmbeddingFacet, sdk::ConvolutionFacet,
                          sdk::DropoutFacet>(*this, name);
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
