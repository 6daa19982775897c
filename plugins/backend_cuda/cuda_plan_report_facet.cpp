// CudaPlanReport: the CUDA backend's PlanReportFacet (sdk/backend_plan_report.h), whole in one
// file. It lists the plan caches the context keeps, in this order, each only once it holds a plan:
// cuBLASLt's GEMM plans (GemmEngine::plan_report: the heuristic's choice, its runs, what
// gemm_autotune measured), cuDNN's convolution plans (ConvPlans::report: the engine with its
// numerical notes, workspace, runs, what conv_autotune measured, or why a key was declined) and
// cuDNN's SDPA graphs (SdpaGraphs::report). A build without cuDNN or its frontend has no such
// cache and reports none.
#include "cuda_context.h"
#include "cuda_gemm.h"
#include "mixtrain/sdk/backend_plan_report.h"
#include "mixtrain/sdk/support/facet_registry.h"
#ifdef MIXTRAIN_HAVE_CUDNN
#include "cuda_conv_plans.h"
#endif
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
#include "cuda_sdpa_graphs.h"
#endif

namespace mixtrain::backend_cuda {

namespace {

class CudaPlanReport final : public sdk::PlanReportFacet {
 public:
  explicit CudaPlanReport(CudaContext& context) : context_(context) {}

  std::vector<sdk::PlanReport> plan_reports() const override {
    std::vector<sdk::PlanReport> reports;
    auto add = [&](const char* library, std::vector<std::string> plans) {
      if (!plans.empty()) reports.push_back({library, std::move(plans)});
    };
    add("cuBLASLt GEMM", context_.gemm->plan_report());
#ifdef MIXTRAIN_HAVE_CUDNN
    if (context_.conv) add("cuDNN convolution", context_.conv->plans.report());
#endif
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
    if (context_.sdpa) add("cuDNN SDPA (flash attention)", context_.sdpa->graphs.report());
#endif
    return reports;
  }

 private:
  CudaContext& context_;
};

const sdk::FacetRegistration<CudaContext, sdk::PlanReportFacet, CudaPlanReport> kRegistration;

}  // namespace

}  // namespace mixtrain::backend_cuda
