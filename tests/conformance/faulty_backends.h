// Backends the backend kit must fail, registered by mixtrain's own conformance run only with
// MIXTRAIN_CONFORMANCE_FAULTS=1 (faulty_backends_fail.sh checks that it fails them). Each is a
// backend given to it (the CPU backend) with its gemm facet swapped for a faulty one:
// - faulty_gemm_square_transposes: gemm() ignores the transpose flag of a square operand (its
//   shape stays in bounds, so only the values tell);
// - faulty_gemm_short_k: gemm() drops the last term of every reduction longer than 64;
// - faulty_gemm_other_major: the gemm facet is of the next major, one the host refuses at plan
//   time (sdk/facet.h), where the kit once skipped it as a facet the backend lacks.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "mixtrain/conformance/backend_conformance.h"

namespace mixtrain::conformance::faults {

std::vector<std::pair<std::string, BackendFactory>> faulty_backends(BackendFactory inner);

}  // namespace mixtrain::conformance::faults
