// PlanReportFacet: which library plan ran each kind of op a backend was asked for — a cuBLASLt
// algorithm, a cuDNN engine, a oneDNN kernel per problem — how often it ran, and what
// autotuning measured, so that a profile says not only how long an op took but what ran it.
//
// Contract
// - plan_reports() returns one PlanReport per plan cache the backend keeps, in a fixed order
//   ("cuBLASLt GEMM", "cuDNN convolution", "oneDNN convolution", ...), each with one line per plan
//   made so far in the backend's own words: the problem (shape, dtypes, layout), the kernel or
//   engine chosen or why none was, its runs. A cache with no plan yet may be left out.
// - The lines are for people and benchmark logs: a host prints them and never branches on them;
//   their wording is the backend's and may change in any release.
// - No device work and no synchronisation; one caller thread at a time, like the backend.
// - Optional: a backend that keeps no plans, or does not report them, offers no such facet
//   (find_facet answers nullptr).
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <string>
#include <string_view>
#include <vector>

#include "mixtrain/sdk/facet.h"

namespace mixtrain::sdk {

struct PlanReport {
  std::string library;             // the cache, e.g. "cuDNN convolution"
  std::vector<std::string> plans;  // one line per plan
};

class MIXTRAIN_SDK_API PlanReportFacet : public Facet {
 public:
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "plan_report";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }

  virtual std::vector<PlanReport> plan_reports() const = 0;

 protected:
  ~PlanReportFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
