// The loss facet's kernels: the label check, a warp or a block per row for the softmax, the loss
// and dlogits, and one block for the fixed-order mean.
#include "cuda_device.cuh"
#include "cuda_loss.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

__global__ void check_labels_kernel(const std::int32_t* labels, std::int64_t rows,
                                    std::int64_t classes, int code, ErrorRecord* error) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += stride) {
    const std::int32_t y = labels[r];
    if (y < 0 || y >= classes) {
      // The record belongs to the first failing call: an earlier call's flag keeps its row.
      const int owner = atomicCAS(&error->flag, 0, code);
      if (owner != 0 && owner != code) return;
      atomicMin(&error->first, (static_cast<unsigned long long>(r) << 32) |
                                   static_cast<unsigned long long>(static_cast<std::uint32_t>(y)));
      error->classes = static_cast<int>(classes);
    }
  }
}

// The row kernel's width: kRowThreads threads per row, a warp (8 rows a block) for narrow rows,
// the whole block for rows of at least kBlockRowClasses classes. A language model's chunked loss
// runs 1024 rows of 50257 a launch: a warp per row made 128 blocks of 8 warps, one per SM, too few
// loads in flight to near the memory's bandwidth; a block per row makes 1024 blocks of 256
// threads (6 resident per SM at its 40 registers for bf16, 8 loads in flight each).
constexpr std::int64_t kBlockRowClasses = 512;

// A candidate maximum: the value and its class (-1: none seen).
struct ArgMax {
  float value;
  long long at;
};

// Lane (this lane ^ o)'s value, for row_reduce's butterfly.
__device__ __forceinline__ double shuffle_xor(double v, int o) {
  return __shfl_xor_sync(0xFFFFFFFFu, v, o);
}
__device__ __forceinline__ ArgMax shuffle_xor(ArgMax v, int o) {
  return {__shfl_xor_sync(0xFFFFFFFFu, v.value, o), __shfl_xor_sync(0xFFFFFFFFu, v.at, o)};
}

// The row's threads' combined value, the same in every thread of the row: a warp's butterfly
// (every lane ends with the same value), then, for a block-wide row, the warps' values combined in
// warp order from shared memory. The trailing barrier lets the next reduction reuse `partial`.
template <int kRowThreads, class T, class Combine>
__device__ __forceinline__ T row_reduce(T v, T* partial, Combine&& combine) {
  for (int o = 16; o > 0; o >>= 1) v = combine(v, shuffle_xor(v, o));
  if constexpr (kRowThreads == 32) {
    return v;
  } else {
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    T total = partial[0];
    for (int w = 1; w < kRowThreads / 32; ++w) total = combine(total, partial[w]);
    __syncthreads();
    return total;
  }
}

// kRowThreads threads per row: max and argmax (the CPU's scan: first maximum; a NaN z[0] stays),
// log-sum-exp and the row's loss in double (sum of fp32 exponentials, as the CPU reference),
// dlogits from each class's exponential times the rounded reciprocal sum (the CPU reference's p,
// element::xent_probability; a double exponential a logit was the kernel's FP64 bottleneck). L and
// D are the logits' and dlogits' storage (element::storage), so each load is one typed load. A
// thread owns the row's elements t, t + kRowThreads, ... (t its index in the row); each pass takes
// kUnroll of them per round, their loads first, then works through them in order: the same
// operations in the same order as one at a time (the same bits), with kUnroll loads in flight
// instead of one. The sums' order is fixed by kRowThreads, so a row's bits are the same run to run.
// kPacked (a block per row, classes a multiple of 8, logits and dlogits 16-byte aligned: the
// chunked loss's padded blocks, model.loss_pad_classes): a thread owns packs of 8 consecutive
// elements instead, packs t, t + kRowThreads, ..., kPackUnroll packs a round, each one 16-byte
// load (32 for fp32) and dlogits one 16-byte store a pack. A warp's load then moves 512 bytes, not
// 64: GPT-2's padded rows (50304 classes) ran at about a sixth of the memory's rate with 2-byte
// loads (session 58, 2.36 ms a step for 8 blocks of 1024 rows). Each element's operations are the
// same; only the order of a thread's terms in the sums differs, fixed, so the bits are still the
// same run to run, and the argmax (a total order) is the same.
template <class L, class D, int kRowThreads, bool kPacked>
__device__ __forceinline__ void softmax_xent_rows(const typename L::T* logits,
                                                  const std::int32_t* labels, float grad_factor,
                                                  float eps, typename D::T* dlogits,
                                                  std::int64_t rows, std::int64_t classes,
                                                  double* row_loss, int* row_ok,
                                                  const ErrorRecord* error) {
  static_assert(kRowThreads == 32 || kRowThreads == kThreads, "a warp or the block per row");
  static_assert(!kPacked || kRowThreads == kThreads, "packs for block-wide rows only");
  constexpr int kUnroll = kRowThreads == 32 ? 4 : 8;
  constexpr int kPackUnroll = 2;
  using LPack = Pack<typename L::T, 8>;
  using DPack = Pack<typename D::T, 8>;
  constexpr int kRowsPerBlock = kThreads / kRowThreads;
  __shared__ double sum_partial[kRowThreads / 32];
  __shared__ ArgMax max_partial[kRowThreads / 32];
  if (error->flag != 0) return;  // a bad label: write nothing, the host raises (block-uniform)
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowThreads;
  const int t = static_cast<int>(threadIdx.x % kRowThreads);
  // A block-wide row always exists (one block per row); a warp's row may not.
  if (row >= rows) return;
  const typename L::T* z = logits + row * classes;
  // for_row_packs(f): f(p, pack p of z) for this thread's packs (t, t + kRowThreads, ...) in
  // order, kPackUnroll loads ahead.
  const auto for_row_packs = [&](auto&& f) {
    const std::int64_t packs = classes / 8;
    std::int64_t p = t;
    for (; p + (kPackUnroll - 1) * kRowThreads < packs; p += kPackUnroll * kRowThreads) {
      LPack w[kPackUnroll];
#pragma unroll
      for (int u = 0; u < kPackUnroll; ++u) w[u] = load_pack<8>(z + (p + u * kRowThreads) * 8);
#pragma unroll
      for (int u = 0; u < kPackUnroll; ++u) f(p + u * kRowThreads, w[u]);
    }
    for (; p < packs; p += kRowThreads) f(p, load_pack<8>(z + p * 8));
  };
  // for_row(f): f(j, z[j]) for this thread's j in order (its elements, or its packs' elements),
  // kUnroll loads ahead.
  const auto for_row = [&](auto&& f) {
    if constexpr (kPacked) {
      for_row_packs([&](std::int64_t p, const LPack& w) {
#pragma unroll
        for (int e = 0; e < 8; ++e) f(p * 8 + e, L::load(w.v[e]));
      });
      return;
    }
    std::int64_t j = t;
    for (; j + (kUnroll - 1) * kRowThreads < classes; j += kUnroll * kRowThreads) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = L::load(z[j + u * kRowThreads]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) f(j + u * kRowThreads, v[u]);
    }
    for (; j < classes; j += kRowThreads) f(j, L::load(z[j]));
  };
  ArgMax best{0.0f, -1};
  for_row([&](std::int64_t j, float v) {
    // A thread's first candidate: z[0] always, else any non-NaN (NaNs past z[0] never win).
    if (best.at < 0 ? (j == 0 || v == v) : element::argmax_beats(v, j, best.value, best.at))
      best = ArgMax{v, j};
  });
  // argmax_beats is a total order, so every thread of the row ends with the same winner.
  const auto better = [](ArgMax a, ArgMax b) {
    return element::argmax_beats(b.value, b.at, a.value, a.at) ? b : a;
  };
  best = row_reduce<kRowThreads>(best, max_partial, better);
  // z[y] is read by every thread before the sums' shuffles and barriers, so no thread's dlogits
  // write below can precede it even when dlogits shares the logits' buffer.
  const std::int32_t y = labels[row];
  const float zy = L::load(z[y]);
  const auto add = [](double a, double b) { return a + b; };
  double sum = 0.0;
  for_row([&](std::int64_t, float v) { sum += expf(v - best.value); });
  const double total = row_reduce<kRowThreads>(sum, sum_partial, add);
  const double lse = static_cast<double>(best.value) + log(total);
  const float inverse_sum = element::xent_inverse_sum(total);
  // Label smoothing's term needs the row's logit sum; without smoothing the pass is skipped (eps
  // is the same for every thread, so the shuffles and barriers stay uniform).
  double z_sum = 0.0;
  if (eps != 0.0f) {
    for_row([&](std::int64_t, float v) { z_sum += static_cast<double>(v); });
    z_sum = row_reduce<kRowThreads>(z_sum, sum_partial, add);
  }
  if (t == 0) {
    row_loss[row] = element::xent_row_loss(lse, zy, z_sum, eps, classes);
    row_ok[row] = best.at == y ? 1 : 0;
  }
  // A warp's shuffles order its lanes' registers, not their memory: the barrier orders every
  // lane's read of z[y] above before the label lane's dlogits write over it (in place).
  if constexpr (kRowThreads == 32) __syncwarp();
  if (dlogits != nullptr) {
    const float on = element::xent_target_on(eps, classes);
    const float off = element::xent_target_off(eps, classes);
    typename D::T* dz = dlogits + row * classes;
    // Each thread reads its own elements before it writes them: in place over the logits is safe.
    const auto grad = [&](std::int64_t j, float v) {
      const float p = element::xent_probability(v, best.value, inverse_sum);
      return D::store(element::xent_grad(p, j == y ? on : off, grad_factor), false);
    };
    if constexpr (kPacked) {
      for_row_packs([&](std::int64_t p, const LPack& w) {
        DPack out;
#pragma unroll
        for (int e = 0; e < 8; ++e) out.v[e] = grad(p * 8 + e, L::load(w.v[e]));
        store_pack<8>(dz + p * 8, out);
      });
    } else {
      for_row([&](std::int64_t j, float v) { dz[j] = grad(j, v); });
    }
  }
}

// The row kernels: a warp or a block per row, one element at a time, as ptxas allocates them.
template <class L, class D, int kRowThreads>
__global__ void softmax_xent_rows_kernel(const typename L::T* logits, const std::int32_t* labels,
                                         float grad_factor, float eps, typename D::T* dlogits,
                                         std::int64_t rows, std::int64_t classes, double* row_loss,
                                         int* row_ok, const ErrorRecord* error) {
  softmax_xent_rows<L, D, kRowThreads, false>(logits, labels, grad_factor, eps, dlogits, rows,
                                              classes, row_loss, row_ok, error);
}

// A block per row in packs, at least 4 blocks an SM: 61 registers for bf16 logits and dlogits, no
// spills. While each probability took a double exponential it needed 67 (3 blocks an SM), and
// capped at 4 blocks it spilled.
template <class L, class D>
__global__ void __launch_bounds__(kThreads, 4)
    softmax_xent_packed_rows_kernel(const typename L::T* logits, const std::int32_t* labels,
                                    float grad_factor, float eps, typename D::T* dlogits,
                                    std::int64_t rows, std::int64_t classes, double* row_loss,
                                    int* row_ok, const ErrorRecord* error) {
  softmax_xent_rows<L, D, kThreads, true>(logits, labels, grad_factor, eps, dlogits, rows, classes,
                                          row_loss, row_ok, error);
}

template <class L, class D>
void launch_rows(const void* logits, const std::int32_t* labels, float grad_factor, float eps,
                 void* dlogits, std::int64_t rows, std::int64_t classes, double* row_loss,
                 int* row_ok, const ErrorRecord* error, cudaStream_t stream) {
  const auto* z = static_cast<const typename L::T*>(logits);
  auto* dz = static_cast<typename D::T*>(dlogits);
  const bool packed =
      classes % 8 == 0 && aligned16(logits) && (dlogits == nullptr || aligned16(dlogits));
  if (classes >= kBlockRowClasses && packed) {
    softmax_xent_packed_rows_kernel<L, D><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        z, labels, grad_factor, eps, dz, rows, classes, row_loss, row_ok, error);
  } else if (classes >= kBlockRowClasses) {
    softmax_xent_rows_kernel<L, D, kThreads><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        z, labels, grad_factor, eps, dz, rows, classes, row_loss, row_ok, error);
  } else {
    softmax_xent_rows_kernel<L, D, 32><<<warp_row_blocks(rows), kThreads, 0, stream>>>(
        z, labels, grad_factor, eps, dz, rows, classes, row_loss, row_ok, error);
  }
}

// The storage type of a logits or dlogits Elem: fp32, bf16 or fp16 (the facet's dtypes).
template <class L>
void launch_rows_for_d(Elem dt, const void* logits, const std::int32_t* labels, float grad_factor,
                       float eps, void* dlogits, std::int64_t rows, std::int64_t classes,
                       double* row_loss, int* row_ok, const ErrorRecord* error,
                       cudaStream_t stream) {
  switch (dt) {
    case Elem::bf16:
      return launch_rows<L, storage::Bf16>(logits, labels, grad_factor, eps, dlogits, rows, classes,
                                           row_loss, row_ok, error, stream);
    case Elem::f16:
      return launch_rows<L, storage::F16>(logits, labels, grad_factor, eps, dlogits, rows, classes,
                                          row_loss, row_ok, error, stream);
    default:
      return launch_rows<L, storage::F32>(logits, labels, grad_factor, eps, dlogits, rows, classes,
                                          row_loss, row_ok, error, stream);
  }
}

// One block: fixed-order sums of the per-row losses (double) and correct flags.
__global__ void softmax_xent_finish_kernel(const double* row_loss, const int* row_ok,
                                           std::int64_t rows, float* loss, std::int32_t* correct,
                                           const ErrorRecord* error) {
  if (error->flag != 0) return;
  __shared__ double s_loss[kThreads];
  __shared__ long long s_ok[kThreads];
  double l = 0.0;
  long long ok = 0;
  for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    l += row_loss[r];
    ok += row_ok[r];
  }
  s_loss[threadIdx.x] = l;
  s_ok[threadIdx.x] = ok;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) {
      s_loss[threadIdx.x] += s_loss[threadIdx.x + w];
      s_ok[threadIdx.x] += s_ok[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    loss[0] = static_cast<float>(s_loss[0] / static_cast<double>(rows));
    if (correct != nullptr) correct[0] = static_cast<std::int32_t>(s_ok[0]);
  }
}

}  // namespace

cudaError_t softmax_cross_entropy(const void* logits, Elem lt, const std::int32_t* labels,
                                  float grad_scale, float label_smoothing, float* loss,
                                  std::int32_t* correct, void* dlogits, Elem dt, std::int64_t rows,
                                  std::int64_t classes, double* row_loss, int* row_ok, int code,
                                  ErrorRecord* error, cudaStream_t stream) {
  check_labels_kernel<<<grid_for(rows), kThreads, 0, stream>>>(labels, rows, classes, code, error);
  const float grad_factor = grad_scale / static_cast<float>(rows);
  switch (lt) {
    case Elem::bf16:
      launch_rows_for_d<storage::Bf16>(dt, logits, labels, grad_factor, label_smoothing, dlogits,
                                       rows, classes, row_loss, row_ok, error, stream);
      break;
    case Elem::f16:
      launch_rows_for_d<storage::F16>(dt, logits, labels, grad_factor, label_smoothing, dlogits,
                                      rows, classes, row_loss, row_ok, error, stream);
      break;
    default:
      launch_rows_for_d<storage::F32>(dt, logits, labels, grad_factor, label_smoothing, dlogits,
                                      rows, classes, row_loss, row_ok, error, stream);
      break;
  }
  softmax_xent_finish_kernel<<<1, kThreads, 0, stream>>>(row_loss, row_ok, rows, loss, correct,
                                                         error);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
