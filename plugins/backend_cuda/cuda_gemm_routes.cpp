#include "cuda_gemm_routes.h"

#include <optional>

#include "mixtrain/sdk/op_signatures.h"

namespace mixtrain::backend_cuda {

using sdk::DType;

bool gemm_supported(const sdk::BackendCapabilities& caps, sdk::GemmOp op,
                    std::span<const DType> dtypes) {
  // gemm_gradient runs its GEMM through the same engine routes as gemm (cuda_gemm.h).
  if (op == sdk::GemmOp::gemm_gradient) op = sdk::GemmOp::gemm;
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

// gemm_gradient with gelu's gradient: DGELU where cuBLASLt takes it (D = C, then D in fp32), then
// a plain GEMM into fp32 and the gradient kernel.
std::vector<GemmRoute> gradient_routes(const GemmRouteQuery& q) {
  using Output = GemmRoute::Output;
  const bool sixteen_or_32 =
      q.input == DType::fp32 || q.input == DType::bf16 || q.input == DType::fp16;
  const bool dgelu = sixteen_or_32 && !q.beta_nonzero && q.n % 8 == 0;
  std::vector<GemmRoute> routes;
  auto add_dgelu = [&](Output output, DType d) {
    if (!dgelu || q.pre_activation_dtype != d) return;
    GemmRoute r;
    r.output = output;
    r.d_dtype = d;
    r.dgelu_in_epilogue = true;
    r.encode_by_kernel = d != q.c;
    routes.push_back(r);
  };
  if (gemm_direct_output(q.input, q.c)) add_dgelu(Output::direct, q.c);
  if (q.c != DType::fp32) add_dgelu(Output::fp32_epilogue, DType::fp32);
  GemmRoute last;  // D is an fp32 C itself (the kernel runs in place), else fp32 scratch
  last.output = q.c == DType::fp32 ? Output::direct : Output::fp32_epilogue;
  last.d_dtype = DType::fp32;
  last.activation_grad_by_kernel = true;
  routes.push_back(last);
  return routes;
}

}  // namespace

std::vector<GemmRoute> gemm_routes(const GemmRouteQuery& q) {
  using Output = GemmRoute::Output;
  if (q.activation_grad) return gradient_routes(q);
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

std::int64_t aligned_ld(std::int64_t cols, sdk::DType t) {
  const auto per16 = static_cast<std::int64_t>(16 / sdk::dtype_size(t));
  return (cols + per16 - 1) / per16 * per16;
}

Realign realign_for(const RealignQuery& q) {
  Realign r;
  const bool sixteen_bit = q.input == sdk::DType::bf16 || q.input == sdk::DType::fp16;
  if (!sixteen_bit || q.batched || q.m <= 0 || q.n <= 0 || q.k <= 0) return r;
  // Overflow-safe m·n·k >= kRealignMinMacs.
  if (static_cast<double>(q.m) * static_cast<double>(q.n) * static_cast<double>(q.k) <
      static_cast<double>(kRealignMinMacs))
    return r;
  r.a = aligned_ld(q.a_cols, q.input) != q.a_cols;
  r.b = aligned_ld(q.b_cols, q.input) != q.b_cols;
  r.c = aligned_ld(q.n, q.c) != q.n;
  return r;
}

bool route_writes_c_directly(const GemmRoute& r) {
  return (r.output == GemmRoute::Output::direct ||
          r.output == GemmRoute::Output::direct_narrow_bias) &&
         !r.bias_by_kernel && !r.aux_in_epilogue && !r.pre_activation_by_kernel &&
         !r.activation_by_kernel && !r.encode_by_kernel && !r.dgelu_in_epilogue &&
         !r.activation_grad_by_kernel;
}

}  // namespace mixtrain::backend_cuda
