// Top-k accuracy on the host, from FP32 logits ([eval] top_k): evaluation hands each batch's
// logits to it (Trainer::predict's callback). Internal to the core.
//
// Contract: a label is a hit when its rank is below k, its rank being the number of classes
// whose logit is greater, plus those with an equal logit and a lower index: the position of the
// label in a stable sort by descending logit. Ties thus resolve as eval_accuracy's argmax does
// (the lowest index wins), so k = 1 counts exactly eval_accuracy's correct labels; torch.topk
// leaves the order of ties unspecified. NaNs rank as that argmax ranks them (the backends' loss:
// a scan from z[0] that moves on a strictly greater logit): a NaN at class 0 ranks first, a NaN
// anywhere else ranks last and, at the label, is a miss.
#pragma once

#include <cstdint>
#include <span>

namespace mixtrain::core {

// `logits` holds labels.size() rows of `classes` values (a language model's positions are rows);
// returns how many labels are hits. Labels are trusted to lie in [0, classes) (the loss checked
// them).
std::int64_t top_k_hits(std::span<const float> logits, std::span<const std::int32_t> labels,
                        std::int64_t classes, std::int64_t k);

}  // namespace mixtrain::core
