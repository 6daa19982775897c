#include "cpu_optimizer_kernels.h"

#include <cmath>

#include "cpu_isa.h"
#include "cpu_prefetch.h"  // streamed: the update streams its 3-4 arrays from memory

namespace mixtrain::backend_cpu {

namespace {

#define MIXTRAIN_OPTIMIZER_INLINE __attribute__((always_inline))

[[gnu::always_inline]] inline void adamw_loop(const sdk::AdamWStepConstants* k, float* p,
                                              const float* grad, float* m, float* v,
                                              std::int64_t len) {
  const float b1 = k->beta1, b2 = k->beta2, eps = k->eps, gs = k->grad_scale;
  const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;
  const float decay = k->decay, step_size = k->step_size, bc2_sqrt = k->bc2_sqrt;
  streamed(
      len,
      [&](std::int64_t i) MIXTRAIN_OPTIMIZER_INLINE {
        const float g = grad[i] * gs;
        const float mi = b1 * m[i] + one_minus_b1 * g;
        const float vi = b2 * v[i] + one_minus_b2 * g * g;
        m[i] = mi;
        v[i] = vi;
        const float denom = std::sqrt(vi) / bc2_sqrt + eps;
        p[i] = p[i] * decay - step_size * mi / denom;
      },
      grad, m, v, p);
}

// The template flag keeps the loop body free of control flow so it vectorises.
template <bool kMomentum>
[[gnu::always_inline]] inline void sgd_loop(const SgdConstants* k, float* p, const float* grad,
                                            float* buf, std::int64_t len) {
  const float lr = k->lr, wd = k->weight_decay, mom = k->momentum, damp = k->damp;
  const float gs = k->grad_scale;
  const bool nesterov = k->nesterov, first = k->first_step;
  streamed(
      len,
      [&](std::int64_t i) MIXTRAIN_OPTIMIZER_INLINE {
        float g = grad[i] * gs + wd * p[i];
        if constexpr (kMomentum) {
          const float mi = first ? g : mom * buf[i] + damp * g;
          buf[i] = mi;
          g = nesterov ? g + mom * mi : mi;
        }
        p[i] = p[i] - lr * g;
      },
      grad, p, kMomentum ? buf : p);
}

[[gnu::always_inline]] inline void sgd_momentum_loop(const SgdConstants* k, float* p,
                                                     const float* grad, float* buf,
                                                     std::int64_t len) {
  sgd_loop<true>(k, p, grad, buf, len);
}
[[gnu::always_inline]] inline void sgd_plain_loop(const SgdConstants* k, float* p,
                                                  const float* grad, float* buf, std::int64_t len) {
  sgd_loop<false>(k, p, grad, buf, len);
}
MIXTRAIN_ISA_VARIANTS(adamw_loop)
MIXTRAIN_ISA_VARIANTS(sgd_momentum_loop)
MIXTRAIN_ISA_VARIANTS(sgd_plain_loop)

}  // namespace

void adamw_range(const sdk::AdamWStepConstants& k, float* p, const float* grad, float* m, float* v,
                 std::int64_t len) {
  adamw_loop_best(&k, p, grad, m, v, len);
}

void sgd_range(const SgdConstants& k, bool momentum, float* p, const float* grad, float* m,
               std::int64_t len) {
  if (momentum)
    sgd_momentum_loop_best(&k, p, grad, m, len);
  else
    sgd_plain_loop_best(&k, p, grad, m, len);
}

}  // namespace mixtrain::backend_cpu
