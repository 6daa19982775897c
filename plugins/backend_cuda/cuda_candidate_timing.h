// Autotuning's measurement, shared by the GEMM engine (gemm_autotune) and the convolution plans
// (conv_autotune): header-only, since each caller enqueues its candidates its own way.
//
// Contract
// - stream_capturing(stream): whether work enqueued now would be recorded into a CUDA graph (or
//   the query failed): timing then would break the capture, so callers time nothing.
// - time_candidates(stream, count, rounds, run): run(i) enqueues candidate i on `stream` and says
//   whether it was accepted. Each candidate runs once untimed (a first launch may load its kernel;
//   one that is not accepted is dropped), then `rounds` rounds time every remaining candidate once
//   each with CUDA events, interleaved, so a clock drifting over the tuning (heat, power) touches
//   them alike. Before each timed run a short kernel holds the stream (kernels::hold_stream) while
//   the host enqueues the start event, the candidate and the stop event, so a sample is the
//   candidate's device time: on an idle stream the start event would fire at once and the sample
//   would add the host's enqueue time (cuBLASLt's or cuDNN's setup), a large share of a GEMM of a
//   few microseconds, and favour candidates with a cheaper host path. Returns times[i]: the
//   milliseconds of each round (-1 where a round failed), empty for a dropped candidate; nullopt
//   when no CUDA event could be created. The CUDA error state is cleared afterwards (a failed event
//   or refused call leaves nothing behind). The scores and the choice are cuda_gemm_autotune.h's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <vector>

#include "cuda_stream_hold.h"

namespace mixtrain::backend_cuda {

// Longer than the host takes to enqueue an event, a candidate (a cuDNN execute builds its variant
// pack) and another event; short beside the candidates' count times rounds.
inline constexpr unsigned kHoldMicroseconds = 200;

inline bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
         capture != cudaStreamCaptureStatusNone;
}

template <class Run>
std::optional<std::vector<std::vector<float>>> time_candidates(cudaStream_t stream,
                                                               std::size_t count, int rounds,
                                                               Run&& run) {
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess) return std::nullopt;
  if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaEventDestroy(start);
    return std::nullopt;
  }
  std::vector<bool> live(count, false);
  for (std::size_t i = 0; i < count; ++i) live[i] = run(i);
  std::vector<std::vector<float>> times(count);
  for (int r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < count; ++i) {
      if (!live[i]) continue;
      float ms = -1.0f;
      // A failed hold only makes the sample include the host's time: not a reason to stop.
      if (kernels::hold_stream(stream, kHoldMicroseconds) != cudaSuccess) (void)cudaGetLastError();
      const bool timed = cudaEventRecord(start, stream) == cudaSuccess && run(i) &&
                         cudaEventRecord(stop, stream) == cudaSuccess &&
                         cudaEventSynchronize(stop) == cudaSuccess &&
                         cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
      times[i].push_back(timed ? ms : -1.0f);
    }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  (void)cudaGetLastError();
  return times;
}

}  // namespace mixtrain::backend_cuda
