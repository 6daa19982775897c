// CudaLayerNorm: validation and launch of the layernorm kernels.
#include "cuda_layer_norm_facet.h"
#include "mixtrain/sdk/support/facet_registry.h"

#include <algorithm>
#include <cstddef>

#include "cuda_access.h"
#include "cuda_layer_norm.h"

namespace mixtrain::backend_cuda {

using sdk::TensorView;

namespace {

const void* ptr_or_null(const TensorView& v) {
  return v.empty() ? nullptr : v.data;
}

}  // namespace

void CudaLayerNorm::layernorm_forward(TensorView x, TensorView gamma, TensorView beta, float eps,
                                      TensorView y, TensorView mean, TensorView rstd) {
  context_.activate();
  constexpr const char* op = "layernorm_forward";
  const auto [rows, n] = checks().layernorm_forward_shape(x, gamma, beta, y, mean, rstd);
  check_cuda(kernels::layernorm_forward(
                 x.data, elem_of(x.dtype), ptr_or_null(gamma), elem_of(gamma.dtype),
                 ptr_or_null(beta), elem_of(beta.dtype), eps, y.data, elem_of(y.dtype),
                 mean.as<float>(), rstd.as<float>(), rows, n, context_.stream),
             op, "kernel launch");
}

void CudaLayerNorm::layernorm_add_forward(const sdk::LayerNormAddArgs& args) {
  context_.activate();
  constexpr const char* op = "layernorm_add_forward";
  const auto [rows, n] = checks().layernorm_add_forward_shape(args);
  check_cuda(kernels::layernorm_add_forward(
                 args.a.data, elem_of(args.a.dtype), args.b.data, elem_of(args.b.dtype),
                 args.sum.data, elem_of(args.sum.dtype), ptr_or_null(args.gamma),
                 elem_of(args.gamma.dtype), ptr_or_null(args.beta), elem_of(args.beta.dtype),
                 args.eps, args.y.data, elem_of(args.y.dtype), args.mean.as<float>(),
                 args.rstd.as<float>(), rows, n, context_.stream),
             op, "kernel launch");
}

bool CudaLayerNorm::supports(sdk::LayerNormOp op, std::span<const sdk::DType> dtypes) const {
  if (op == sdk::LayerNormOp::layernorm_backward_accumulate)
    return LayerNormFacet::supports(sdk::LayerNormOp::layernorm_backward, dtypes);
  if (op == sdk::LayerNormOp::layernorm_add_forward)  // {a, b, sum, y}: any storage float each
    return dtypes.size() == 4 && std::all_of(dtypes.begin(), dtypes.end(),
                                             [](sdk::DType t) { return sdk::is_storage_float(t); });
  return LayerNormFacet::supports(op, dtypes);
}

void CudaLayerNorm::layernorm_backward(TensorView dy, TensorView x, TensorView gamma,
                                       TensorView mean, TensorView rstd, TensorView dx,
                                       TensorView dgamma, TensorView dbeta, bool accumulate) {
  checks().layernorm_backward_shape(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, accumulate, false);
}

void CudaLayerNorm::layernorm_backward_accumulate(TensorView dy, TensorView x, TensorView gamma,
                                                  TensorView mean, TensorView rstd, TensorView dx,
                                                  TensorView dgamma, TensorView dbeta,
                                                  bool accumulate) {
  checks().layernorm_backward_accumulate_shape(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta, accumulate, true);
}

void CudaLayerNorm::backward(TensorView dy, TensorView x, TensorView gamma, TensorView mean,
                             TensorView rstd, TensorView dx, TensorView dgamma, TensorView dbeta,
                             bool accumulate, bool add_into_dx) {
  context_.activate();
  constexpr const char* op = "layernorm_backward";
  const std::int64_t rows = x.shape.rows(), n = x.shape.cols();
  const auto route = layer_norm_plan::backward_route(!dgamma.empty() || !dbeta.empty(),
                                                     context_.layernorm_backward_one_pass, n,
                                                     context_.shared_memory_optin);
  float* partial = nullptr;
  if (route != layer_norm_plan::BackwardRoute::rows_only) {
    const std::size_t floats =
        route == layer_norm_plan::BackwardRoute::one_pass
            ? layer_norm_plan::one_pass_scratch_floats(rows, n)
            : std::max<std::size_t>(1, 2 * kernels::column_sum_scratch(rows, n));
    partial = context_.partial.as<float>(floats, context_.stream, op);
    context_.account_buffers();
  }
  check_cuda(kernels::layernorm_backward(
                 dy.data, elem_of(dy.dtype), x.data, elem_of(x.dtype), ptr_or_null(gamma),
                 elem_of(gamma.dtype), mean.as<const float>(), rstd.as<const float>(), dx.data,
                 elem_of(dx.dtype), dgamma.empty() ? nullptr : dgamma.as<float>(),
                 dbeta.empty() ? nullptr : dbeta.as<float>(), accumulate, rows, n, partial,
                 context_.stream, add_into_dx, route),
             op, "kernel launch");
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::LayerNormFacet, CudaLayerNorm> kCudaLayerNormRegistration;

}  // namespace mixtrain::backend_cuda
