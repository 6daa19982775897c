// PlanReportFacet (backend_plan_report.h): its out-of-line anchor (the facet has no planned ops).
#include "mixtrain/sdk/backend_plan_report.h"

namespace mixtrain::sdk {

PlanReportFacet::~PlanReportFacet() = default;

}  // namespace mixtrain::sdk
