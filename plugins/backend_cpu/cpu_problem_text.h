// How the CPU backend names a oneDNN problem in its plan list (the plan_report facet): the pieces
// the GEMM engine, the convolutions and the pooling share.
#pragma once

#include <cstdint>
#include <string>

#include <oneapi/dnnl/dnnl.hpp>

namespace mixtrain::backend_cpu {

// The dtype a primitive reads or writes here: oneDNN's f32 or bf16 (the only two it is given).
inline const char* dnnl_type_text(dnnl::memory::data_type t) {
  return t == dnnl::memory::data_type::bf16 ? "bf16" : "fp32";
}

// "AxB", for heights and widths, kernels, strides and pads.
inline std::string extent_text(std::int64_t a, std::int64_t b) {
  return std::to_string(a) + "x" + std::to_string(b);
}

}  // namespace mixtrain::backend_cpu
