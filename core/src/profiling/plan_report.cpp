// format_plan_reports (profiling_backend.h): the backend's plan reports as text.
#include "mixtrain/core/profiling/profiling_backend.h"
#include "mixtrain/sdk/backend_plan_report.h"

namespace mixtrain::core {

std::string format_plan_reports(sdk::DeviceBackend& backend) {
  const auto* facet = sdk::facet<sdk::PlanReportFacet>(backend);
  if (facet == nullptr) return "plans: the backend reports none (it offers no plan_report facet)\n";
  std::string out = "plans: what the backend's libraries ran, per problem\n";
  for (const sdk::PlanReport& r : facet->plan_reports()) {
    out += "  " + r.library + " (" + std::to_string(r.plans.size()) + " plans)\n";
    for (const std::string& line : r.plans) out += "    " + line + "\n";
  }
  return out;
}

}  // namespace mixtrain::core
