// CudaForeach: validation of the tensor lists and one multi-tensor launch per call.
#include "cuda_foreach_facet.h"
#include "mixtrain/sdk/support/facet_registry.h"

#include <string>
#include <vector>

#include "cuda_access.h"

namespace mixtrain::backend_cuda {

using sdk::TensorView;

void CudaForeach::launch(const char* op, kernels::ForeachKind kind,
                         std::span<const TensorView> self, std::span<const TensorView> a,
                         std::span<const TensorView> b, float s0, float s1, int lists) {
  context_.activate();
  if (lists == 0)
    checks().foreach_lists(op, self);
  else if (lists == 1)
    checks().foreach_lists(op, self, {a});
  else
    checks().foreach_lists(op, self, {a, b});
  // One launch for the whole list: the tensors' chunks go through the multi-tensor tables.
  std::vector<kernels::ForeachRef> refs;
  std::vector<std::int64_t> numels;
  for (std::size_t i = 0; i < self.size(); ++i) {
    refs.push_back({self[i].as<float>(), lists < 1 ? nullptr : a[i].as<const float>(),
                    lists < 2 ? nullptr : b[i].as<const float>(), self[i].numel()});
    numels.push_back(self[i].numel());
  }
  if (refs.empty()) return;
  const kernels::ForeachRef* dev_refs = nullptr;
  const kernels::Chunk* dev_chunks = nullptr;
  const int count = context_.upload_tables(refs, numels, &dev_refs, &dev_chunks, op);
  check_cuda(kernels::foreach_op(kind, dev_refs, dev_chunks, count, s0, s1, context_.stream), op,
             "kernel launch");
}

void CudaForeach::foreach_mul_scalar(std::span<const TensorView> self, float scalar) {
  launch("foreach_mul_scalar", kernels::ForeachKind::mul, self, {}, {}, scalar, 0.0f, 0);
}
void CudaForeach::foreach_mul(std::span<const TensorView> self, std::span<const TensorView> other) {
  launch("foreach_mul", kernels::ForeachKind::mul, self, other, {}, 1.0f, 0.0f, 1);
}
void CudaForeach::foreach_add_scalar(std::span<const TensorView> self, float scalar) {
  launch("foreach_add_scalar", kernels::ForeachKind::add_scalar, self, {}, {}, scalar, 0.0f, 0);
}
void CudaForeach::foreach_add(std::span<const TensorView> self, std::span<const TensorView> other,
                              float alpha) {
  launch("foreach_add", kernels::ForeachKind::add, self, other, {}, alpha, 0.0f, 1);
}
void CudaForeach::foreach_addcmul(std::span<const TensorView> self, std::span<const TensorView> t1,
                                  std::span<const TensorView> t2, float value) {
  launch("foreach_addcmul", kernels::ForeachKind::addcmul, self, t1, t2, value, 0.0f, 2);
}
void CudaForeach::foreach_sqrt(std::span<const TensorView> self) {
  launch("foreach_sqrt", kernels::ForeachKind::sqrt, self, {}, {}, 0.0f, 0.0f, 0);
}
void CudaForeach::foreach_sign(std::span<const TensorView> self) {
  launch("foreach_sign", kernels::ForeachKind::sign, self, {}, {}, 0.0f, 0.0f, 0);
}
void CudaForeach::foreach_lerp(std::span<const TensorView> self, std::span<const TensorView> end,
                               float weight) {
  launch("foreach_lerp", kernels::ForeachKind::lerp, self, end, {}, weight, 0.0f, 1);
}
void CudaForeach::foreach_clamp(std::span<const TensorView> self, float lo, float hi) {
  if (!(lo <= hi))
    fail("foreach_clamp", "lo = " + std::to_string(lo) + " is above hi = " + std::to_string(hi),
         "pass lo <= hi");
  launch("foreach_clamp", kernels::ForeachKind::clamp, self, {}, {}, lo, hi, 0);
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::ForeachFacet, CudaForeach> kCudaForeachRegistration;

}  // namespace mixtrain::backend_cuda
