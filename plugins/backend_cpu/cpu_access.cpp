#include "cpu_access.h"

namespace mixtrain::backend_cpu {

const sdk::BackendArgumentChecks& checks() {
  static const sdk::BackendArgumentChecks instance("backend_cpu");
  return instance;
}

void fail(std::string_view op, const std::string& what, std::string hint) {
  checks().fail(op, what, std::move(hint));
}

void require_present(std::string_view op, std::string_view name, const sdk::TensorView& v) {
  checks().require_present(op, name, v);
}

void require_storage(std::string_view op, std::string_view name, const sdk::TensorView& v) {
  checks().require_storage(op, name, v);
}

void require_fp32(std::string_view op, std::string_view name, const sdk::TensorView& v) {
  checks().require_fp32(op, name, v);
}

void require_numel(std::string_view op, std::string_view name, const sdk::TensorView& v,
                   std::int64_t numel) {
  checks().require_numel(op, name, v, numel);
}






}  // namespace mixtrain::backend_cpu
