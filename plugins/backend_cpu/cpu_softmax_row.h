// softmax_row: one row of the softmax cross-entropy (facets/cpu_loss.cpp), the part that touches
// every logit: its max and first argmax, its log-sum-exp, optionally its probabilities and the sum
// of its logits.
//
// Contract
// - z [classes] fp32 or bf16 (read in place: the values of a decoded row, without its pass),
//   classes >= 1. p: null, or [classes] fp32 that receives p_j = e^(z_j - max) / Σ_k e^(z_k -
//   max) (it may be z itself when z is fp32). The caller owns both; nothing is allocated.
// - lse = max + log Σ e^(z_j - max) in double; argmax is what a scan from z[0] that moves on a
//   strictly greater z finds (the first index of the largest non-NaN value; 0 when z[0] is NaN);
//   z_sum = Σ z_j in double when asked for (in the lanes below), else 0. All three are read
//   before p is written.
// - The exponentials are exp_shifted's (cpu_exp.h, within 1 ulp), summed in double in 32 fixed
//   lanes added pairwise in a fixed tree; p_j is e_j times the rounded 1 / Σ, so within a few ulp
//   of the exact quotient. A NaN logit makes lse NaN; +inf makes it NaN too (inf - inf).
// - Compiled for x86-64-v4, v3 and the baseline and picked by cpuid (cpu_isa.h). One CPU gives the
//   same bits every run and on every thread count (a row is one thread's work); the variants with
//   FMA (v4, v3) give the same bits as each other, the baseline may differ from them in the last
//   bits of an exponential.
#pragma once

#include <cstdint>

#include "cpu_bf16_bits.h"

namespace mixtrain::backend_cpu {

struct SoftmaxRow {
  double lse = 0.0;
  std::int64_t argmax = 0;
  double z_sum = 0.0;
};

SoftmaxRow softmax_row(const float* z, std::int64_t classes, float* p, bool want_z_sum);
SoftmaxRow softmax_row(const Bf16Bits* z, std::int64_t classes, float* p, bool want_z_sum);

// The cross-entropy's gradient of one row from its probabilities p [classes] (softmax_row's):
// g_j = (p_j - off)·grad_factor, and (p_label - on)·grad_factor at the label (the loss facet's
// expressions, cuda_element_math.h's xent_grad), stored as fp32 (dst may be p) or rounded once
// into bf16 (cpu_bf16_bits.h, the SDK's encode_bf16 bit for bit), in one pass compiled per ISA.
void softmax_gradient_row(const float* p, std::int64_t classes, std::int64_t label, float off,
                          float on, float grad_factor, float* dst);
void softmax_gradient_row(const float* p, std::int64_t classes, std::int64_t label, float off,
                          float on, float grad_factor, Bf16Bits* dst);

}  // namespace mixtrain::backend_cpu
