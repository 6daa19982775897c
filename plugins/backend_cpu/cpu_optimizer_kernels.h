// The fused optimizers' element loops over one range of one parameter, compiled per ISA
// (cpu_isa.h): PyTorch's torch.optim.SGD and AdamW per element (backend_optimizer_updates.h).
//
// Contract
// - p, grad, m (and v) are fp32 arrays of `len` elements, apart from each other; p, m and v are
//   updated in place, grad is read. sgd_range's m (the momentum buffer) is null when `momentum`
//   is false.
// - Every ISA gives the same bits: each step is one IEEE operation, contracted into no FMA
//   (the file is compiled with -ffp-contract=off), sqrt and division correctly rounded.
// - Why per ISA: the build targets the baseline, where AdamW's division and square root ran four
//   lanes at a time and made the update compute-bound (bench/optimizer/bench_optimizer_updates).
//   The loops also ask for their streams' lines ahead (the arrays come from memory); a prefetch
//   changes no value.
#pragma once

#include <cstdint>

#include "mixtrain/sdk/support/adamw_step_constants.h"

namespace mixtrain::backend_cpu {

// k: the call's constants (sdk::adamw_step_constants).
void adamw_range(const sdk::AdamWStepConstants& k, float* p, const float* grad, float* m, float* v,
                 std::int64_t len);

struct SgdConstants {
  float lr, momentum, damp /* 1 - dampening */, weight_decay, grad_scale;
  bool nesterov, first_step;
};

void sgd_range(const SgdConstants& k, bool momentum, float* p, const float* grad, float* m,
               std::int64_t len);

}  // namespace mixtrain::backend_cpu
