// CpuBackend's foreach ops (ForeachFacet): in place over lists of fp32 tensors. Like the
// fused optimizer updates, each call flattens its lists into pieces (tensor, range) so that many
// small tensors and a few large ones share one parallel region.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_access.h"
#include "cpu_context.h"
#include "mixtrain/sdk/backend_foreach.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

namespace {

constexpr std::int64_t kPiece = 1 << 15;

struct Piece {
  std::size_t tensor;
  std::int64_t begin;
  std::int64_t len;
};

// Runs body(i, x, a, b, len) over every piece: x = self[i] + begin, a/b the same range of the
// other lists (nullptr when absent).
template <class Body>
void for_pieces(std::span<const TensorView> self, std::span<const TensorView> a,
                std::span<const TensorView> b, Body body) {
  std::vector<Piece> pieces;
  std::int64_t total = 0;
  for (std::size_t t = 0; t < self.size(); ++t) {
    const std::int64_t n = self[t].numel();
    total += n;
    for (std::int64_t p = 0; p < n; p += kPiece) pieces.push_back({t, p, std::min(kPiece, n - p)});
  }
  const auto count = static_cast<std::int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t k = 0; k < count; ++k) {
    const Piece& pc = pieces[static_cast<std::size_t>(k)];
    float* x = self[pc.tensor].as<float>() + pc.begin;
    const float* pa = a.empty() ? nullptr : a[pc.tensor].as<const float>() + pc.begin;
    const float* pb = b.empty() ? nullptr : b[pc.tensor].as<const float>() + pc.begin;
    body(x, pa, pb, pc.len);
  }
}

}  // namespace

namespace {

class CpuForeach final : public sdk::ForeachFacet {
 public:
  explicit CpuForeach(CpuContext& context) : context_(context) {}

  void foreach_mul_scalar(std::span<const sdk::TensorView> self, float scalar) override;
  void foreach_mul(std::span<const sdk::TensorView> self,
                   std::span<const sdk::TensorView> other) override;
  void foreach_add_scalar(std::span<const sdk::TensorView> self, float scalar) override;
  void foreach_add(std::span<const sdk::TensorView> self, std::span<const sdk::TensorView> other,
                   float alpha = 1.0f) override;
  void foreach_addcmul(std::span<const sdk::TensorView> self, std::span<const sdk::TensorView> t1,
                       std::span<const sdk::TensorView> t2, float value = 1.0f) override;
  void foreach_sqrt(std::span<const sdk::TensorView> self) override;
  void foreach_sign(std::span<const sdk::TensorView> self) override;
  void foreach_lerp(std::span<const sdk::TensorView> self, std::span<const sdk::TensorView> end,
                    float weight) override;
  void foreach_clamp(std::span<const sdk::TensorView> self, float lo, float hi) override;

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::ForeachFacet, CpuForeach> kRegistration;

}  // namespace

void CpuForeach::foreach_mul_scalar(std::span<const TensorView> self, float scalar) {
  context_.use_threads();
  checks().foreach_lists("foreach_mul_scalar", self);
  for_pieces(self, {}, {}, [scalar](float* x, const float*, const float*, std::int64_t n) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) x[i] *= scalar;
  });
}

void CpuForeach::foreach_mul(std::span<const TensorView> self, std::span<const TensorView> other) {
  context_.use_threads();
  checks().foreach_lists("foreach_mul", self, {other});
  for_pieces(self, other, {}, [](float* x, const float* o, const float*, std::int64_t n) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) x[i] *= o[i];
  });
}

void CpuForeach::foreach_add_scalar(std::span<const TensorView> self, float scalar) {
  context_.use_threads();
  checks().foreach_lists("foreach_add_scalar", self);
  for_pieces(self, {}, {}, [scalar](float* x, const float*, const float*, std::int64_t n) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) x[i] += scalar;
  });
}

void CpuForeach::foreach_add(std::span<const TensorView> self, std::span<const TensorView> other,
                             float alpha) {
  context_.use_threads();
  checks().foreach_lists("foreach_add", self, {other});
  for_pieces(self, other, {}, [alpha](float* x, const float* o, const float*, std::int64_t n) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) x[i] += alpha * o[i];
  });
}

void CpuForeach::foreach_addcmul(std::span<const TensorView> self, std::span<const TensorView> t1,
                                 std::span<const TensorView> t2, float value) {
  context_.use_threads();
  checks().foreach_lists("foreach_addcmul", self, {t1, t2});
  for_pieces(self, t1, t2, [value](float* x, const float* a, const float* b, std::int64_t n) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) x[i] += value * a[i] * b[i];
  });
}

void CpuForeach::foreach_sqrt(std::span<const TensorView> self) {
  context_.use_threads();
  checks().foreach_lists("foreach_sqrt", self);
  for_pieces(self, {}, {}, [](float* x, const float*, const float*, std::int64_t n) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) x[i] = std::sqrt(x[i]);
  });
}

void CpuForeach::foreach_sign(std::span<const TensorView> self) {
  context_.use_threads();
  checks().foreach_lists("foreach_sign", self);
  for_pieces(self, {}, {}, [](float* x, const float*, const float*, std::int64_t n) {
  // ±0 and NaN are returned as they are: x > 0 and x < 0 are both false for them.
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.0f ? 1.0f : (x[i] < 0.0f ? -1.0f : x[i]);
  });
}

void CpuForeach::foreach_lerp(std::span<const TensorView> self, std::span<const TensorView> end,
                              float weight) {
  context_.use_threads();
  checks().foreach_lists("foreach_lerp", self, {end});
  for_pieces(self, end, {}, [weight](float* x, const float* e, const float*, std::int64_t n) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) x[i] += weight * (e[i] - x[i]);
  });
}

void CpuForeach::foreach_clamp(std::span<const TensorView> self, float lo, float hi) {
  context_.use_threads();
  if (!(lo <= hi))
    fail("foreach_clamp", "lo = " + std::to_string(lo) + " is above hi = " + std::to_string(hi),
         "pass lo <= hi");
  checks().foreach_lists("foreach_clamp", self);
  for_pieces(self, {}, {}, [lo, hi](float* x, const float*, const float*, std::int64_t n) {
  // Written so NaN compares false both times and is kept.
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) x[i] = x[i] < lo ? lo : (x[i] > hi ? hi : x[i]);
  });
}

}  // namespace mixtrain::backend_cpu
