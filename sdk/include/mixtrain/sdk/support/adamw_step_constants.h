// The constants of one fused AdamW update (backend_optimizer_updates.h's formula), derived on the
// host once a call: one definition for every backend's update, so that their element loops run
// the same formula on the same floats.
//
// Contract
// - adamw_step_constants(h): the bias corrections in double from the float betas, as PyTorch
//   computes them on the host; step_size = lr / (1 - beta1^t) and bc2_sqrt = sqrt(1 - beta2^t),
//   each rounded to float once; decay = 1 - lr * weight_decay in float. h.step >= 1 is the
//   caller's check (the facets refuse step 0).
// - AdamWStepConstants is a plain struct of floats, passed by value to device kernels.
#pragma once

#include <cmath>

#include "mixtrain/sdk/backend_optimizer_updates.h"

namespace mixtrain::sdk {

struct AdamWStepConstants {
  float beta1, beta2, eps, grad_scale;
  float decay;      // 1 - lr * weight_decay
  float step_size;  // lr / (1 - beta1^t)
  float bc2_sqrt;   // sqrt(1 - beta2^t)
};

inline AdamWStepConstants adamw_step_constants(const AdamWHyper& h) {
  const double t = static_cast<double>(h.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
  return {h.beta1,
          h.beta2,
          h.eps,
          h.grad_scale,
          1.0f - h.lr * h.weight_decay,
          static_cast<float>(static_cast<double>(h.lr) / bc1),
          static_cast<float>(std::sqrt(bc2))};
}

}  // namespace mixtrain::sdk
