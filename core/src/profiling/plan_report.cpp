// format_plan_reports (profiling_backend.h): the backend's plan reports as text.
#include "mixtrain/core/profiling/profiling_backend.h"

namespace mixtrain::core {

std::string format_plan_reports(const std::vector<sdk::PlanReport>* reports) {
  if (reports == nullptr)
    return "plans: the backend reports none (it offers no plan_report facet)\n";
  std::string out = "plans: what the backend's libraries ran, per problem\n";
  for (const sdk::PlanReport& r : *reports) {
    out += "  " + r.library + " (" + std::to_string(r.plans.size()) + " plans)\n";
    for (const std::string& line : r.plans) out += "    " + line + "\n";
  }
  return out;
}

}  // namespace mixtrain::core
