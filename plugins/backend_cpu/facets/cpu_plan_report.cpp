// CpuPlanReport: the CPU backend's PlanReportFacet. Its plans are the oneDNN primitives it has
// cached, each with the problem it was made for and oneDNN's implementation (impl_info_str: a
// "brg", "jit", Winograd or reference kernel, for the ISA it found): the GEMM engine's matmuls,
// then the convolution and pooling primitives. oneDNN picks one implementation per problem, so
// there are no timings to report.
#include "cpu_context.h"
#include "cpu_gemm.h"
#include "cpu_primitive_cache.h"
#include "mixtrain/sdk/backend_plan_report.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

namespace {

class CpuPlanReport final : public sdk::PlanReportFacet {
 public:
  explicit CpuPlanReport(CpuContext& context) : context_(context) {}

  std::vector<sdk::PlanReport> plan_reports() const override {
    std::vector<sdk::PlanReport> reports;
    auto add = [&](const char* library, std::vector<std::string> plans) {
      if (!plans.empty()) reports.push_back({library, std::move(plans)});
    };
    add("oneDNN GEMM", context_.gemm().report());
    add("oneDNN convolution and pooling", context_.prims().report());
    return reports;
  }

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::PlanReportFacet, CpuPlanReport> kRegistration;

}  // namespace

}  // namespace mixtrain::backend_cpu
