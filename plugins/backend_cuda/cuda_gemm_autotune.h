// GEMM autotuning's choice: which of cuBLASLt's heuristic candidates a plan keeps, from the times
// GemmEngine measured for them (cuda_gemm.cpp). Pure host code (no CUDA call), so the rule is
// unit-tested without a GPU (test_cuda_gemm_autotune).
//
// Contract
// - times[i] lists the milliseconds measured for heuristic candidate i, one per timed round
//   (the rounds interleave the candidates, so a drifting clock touches them alike). A candidate
//   with no time, or with a negative or non-finite one (cuBLASLt declined it, an event failed),
//   is skipped.
// - A candidate's score is the median of its times (one disturbed round does not decide).
// - Candidates are taken in heuristic order; one replaces the current choice only when its score
//   is lower than the choice's by more than `tolerance` (a fraction of the choice's score). With
//   tolerance 0 that is the fastest score, ties going to the earlier heuristic index; a small
//   tolerance keeps the heuristic's own order where the difference is within measurement noise,
//   so repeated runs pick the same kernel more often.
// - Returns the chosen index, or -1 when no candidate has a usable time.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace mixtrain::backend_cuda {

// The median of `ms` (the mean of the middle two for an even count); -1 when ms is empty or any
// entry is negative or not finite.
float autotune_score(std::span<const float> ms);

int pick_autotuned_candidate(std::span<const std::vector<float>> times, float tolerance = 0.0f);

// What a plan reports after tuning (pick >= 0): "autotuned over 4 candidates x 3 rounds: #2
// 0.0812 ms", and ", #0 0.1204 ms" after it when the first candidate lost and has a score.
std::string autotune_summary(std::span<const std::vector<float>> times, int pick, int rounds);

}  // namespace mixtrain::backend_cuda
