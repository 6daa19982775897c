#include "cuda_gemm_routes.h"

#include <optional>

#include "mixtrain/sdk/op_signatures.h"

namespace mixtrain::backend_cuda {

using sdk::DType;

bool gemm_supported(const sdk::BackendCapabilities& caps, sdk::GemmOp op,
                    std::span<const DType> dtypes) {
  if (!sdk::signature_accepts(op, dtypes)) return false;
  for (std::size_t i = 0; i < dtypes.size() && i < 2; ++i)
    if (!caps.supports(dtypes[i])) return false;
  return true;
}

bool gemm_direct_output(DType input, DType c) {
  switch (input) {
    case DType::fp32: return c == DType::fp32;
    case DType::bf16: return c == DType::fp32 || c == DType::bf16;
    case DType::fp16: return c == DType::fp32 || c == DType::fp16;
    case DType::fp8_e4m3:
    case DType::fp8_e5m2: return c == DType::fp32 || c == DType::bf16 || c == DType::fp16;
    default: return false;
  }
}

namespace {

std::optional<GemmRoute> route(const GemmRouteQuery& q, GemmRoute::Output output) {
  using Output = GemmRoute::Output;
  GemmRoute r;
  r.output = output;
  const bool d_is_c = output == Output::direct || output == Output::direct_narrow_bias;
  r.d_dtype = d_is_c ? q.c : DType::fp32;
  r.bias_in_epilogue = q.bias && output != Output::fp32_kernel_bias;
  r.bias_dtype = output == Output::direct_narrow_bias ? q.c : DType::fp32;
  r.bias_by_kernel = q.bias && output == Output::fp32_kernel_bias;
  const bool pre = q.activation && q.pre_activation;
  if (q.activation && d_is_c) {
    r.activation_in_epilogue =
        !pre || (q.act == sdk::Activation::gelu && q.pre_activation_dtype == q.c && q.n % 8 == 0);
    // D is C, so a kernel would read z back from C: only exact when C is fp32.
    if (!r.activation_in_epilogue && q.c != DType::fp32) return std::nullopt;
  }
  r.aux_in_epilogue = r.activation_in_epilogue && pre;
  r.activation_by_kernel = q.activation && !r.activation_in_epilogue;
  r.pre_activation_by_kernel = pre && !r.aux_in_epilogue;
  r.encode_by_kernel = !q.activation && r.d_dtype != q.c;
  return r;
}

}  // namespace

std::vector<GemmRoute> gemm_routes(const GemmRouteQuery& q) {
  using Output = GemmRoute::Output;
  std::vector<Output> outputs;
  if (gemm_direct_output(q.input, q.c)) {
    outputs.push_back(Output::direct);
    if (q.bias && q.c != DType::fp32) outputs.push_back(Output::direct_narrow_bias);
  }
  if (q.c != DType::fp32) outputs.push_back(Output::fp32_epilogue);
  if (q.bias || q.activation) outputs.push_back(Output::fp32_kernel_bias);
  std::vector<GemmRoute> routes;
  for (Output o : outputs)
    if (auto r = route(q, o)) routes.push_back(*r);
  return routes;
}

}  // namespace mixtrain::backend_cuda
