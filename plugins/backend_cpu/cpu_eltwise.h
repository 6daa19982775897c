// EltwiseEngine: activation forward/backward, and exp, through cached oneDNN eltwise primitives.
//
// Contract
// - try_forward/try_backward run the op and return true when oneDNN has a primitive for the
//   tensors' dtypes (all operands the same dtype: fp32 or bf16 on this build); they return false,
//   touching nothing, otherwise so the caller runs the portable fp32 kernel instead. Only GELU is
//   run: ReLU always returns false, as oneDNN's eltwise_relu turns NaN into 0
//   (cpu_activation_kernels.h keeps it).
// - try_backward also takes mixed storages (fp32 / bf16 / fp16 in any mix: a bf16 activation
//   whose gradient is an fp32 sum, as where LoRA's adapter and its base read one tensor): blocks
//   of kMixedBlock elements of x and dy decoded to fp32 (in place where already fp32), the fp32
//   primitive, dx rounded once RNE into its dtype. So its numbers are the fp32 op's on the decoded
//   values, as the GEMM facet's gelu gradient epilogue's are. The decoded blocks live in grow-only
//   scratch, reported by scratch_bytes() (at most two blocks: 2 MiB).
// - Tensors are treated as flat 1-D arrays of numel elements; in-place (y == x, dx == dy) is
//   supported as oneDNN allows it.
// - Not thread-safe: one engine per backend.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <tuple>

#include <oneapi/dnnl/dnnl.hpp>

#include "cpu_scratch_buffer.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/facet_list.h"

namespace mixtrain::backend_cpu {

class EltwiseEngine {
 public:
  EltwiseEngine();
  bool try_forward(sdk::Activation act, const sdk::TensorView& x, const sdk::TensorView& y);
  bool try_backward(sdk::Activation act, const sdk::TensorView& x, const sdk::TensorView& dy,
                    const sdk::TensorView& dx);
  // 2^18 elements: GPT-2's [1024, 3072] GELU gradient (bf16 x, fp32 dy, bf16 dx) took 2.55-2.72
  // ms a call, 2.59-2.74 with 2^20 and 2.80-3.08 with 2^16 (an AMX Xeon, 2 threads; RESULTS.md,
  // session 74), in a quarter of 2^20's scratch.
  static constexpr std::int64_t kMixedBlock = std::int64_t{1} << 18;
  std::size_t scratch_bytes() const { return x_block_.capacity() + dy_block_.capacity(); }
  // x = exp(x) in place over numel fp32 elements (oneDNN's vectorised exp: the attention
  // softmax's); false, touching nothing, when oneDNN has no primitive.
  bool try_exp(float* x, std::int64_t numel);

 private:
  // (algorithm, dtype, numel, backward?) -> primitive; nullopt remembers "not available".
  using Key = std::tuple<int, int, std::int64_t, bool>;
  std::optional<dnnl::primitive>& lookup(dnnl::algorithm alg, sdk::DType dtype, std::int64_t numel,
                                         bool backward);
  bool backward_mixed(dnnl::algorithm alg, const sdk::TensorView& x, const sdk::TensorView& dy,
                      const sdk::TensorView& dx);

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<Key, std::optional<dnnl::primitive>> cache_;
  ScratchBuffer x_block_, dy_block_;  // backward_mixed's decoded blocks
};

}  // namespace mixtrain::backend_cpu
