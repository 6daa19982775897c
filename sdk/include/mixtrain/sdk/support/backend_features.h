// Feature names the host reads from sdk::BackendCapabilities::features. The other entries of that
// list ("avx512_bf16", "sm_90", ...) are informational; these change what the host says or does.
//
// Contract: header-only constants, in no ABI record (support/); a backend lists a name only when
// what it describes holds for every call of this backend object.
#pragma once

#include <string_view>

namespace mixtrain::sdk {

// The GEMM facet copies an operand (or C) of a large 16-bit GEMM whose rows are not 16 bytes apart
// (an odd vocabulary's logits) into scratch with padded rows before its Tensor Core kernels, so
// such a dimension costs a copy, not the slow kernels. `mixtrain check`'s alignment lint reports
// the dimension of a 16-bit linear layer as handled.
inline constexpr std::string_view kFeatureGemmRealignsRows = "gemm_realigns_rows";

}  // namespace mixtrain::sdk
