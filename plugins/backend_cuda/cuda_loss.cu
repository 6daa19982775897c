// The loss facet's kernels: the label check, one warp per row for the softmax, the loss and
// dlogits, and one block for the fixed-order mean.
#include "cuda_device.cuh"
#include "cuda_loss.h"

namespace mixtrain::backend_cuda::kernels {

namespace {

__global__ void check_labels_kernel(const std::int32_t* labels, std::int64_t rows,
                                    std::int64_t classes, ErrorRecord* error) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += stride) {
    const std::int32_t y = labels[r];
    if (y < 0 || y >= classes) {
      atomicMin(&error->first, (static_cast<unsigned long long>(r) << 32) |
                                   static_cast<unsigned long long>(static_cast<std::uint32_t>(y)));
      error->flag = 1;
      error->classes = static_cast<int>(classes);
    }
  }
}

// One warp per row: max and argmax (the CPU's scan: first maximum; a NaN z[0] stays), log-sum-exp
// and the row's loss in double (sum of fp32 exponentials, as the CPU reference), dlogits.
// L and D are the logits' and dlogits' storage (element::storage), so each load is one typed load.
// Each pass takes kUnroll of a lane's elements (32 apart) per round, their loads first, then works
// through them in the lane's order: the same operations in the same order as one at a time (the
// same bits), with kUnroll loads in flight instead of one.
constexpr int kUnroll = 4;

template <class L, class D>
__global__ void softmax_xent_rows_kernel(const typename L::T* logits, const std::int32_t* labels,
                                         float grad_factor, float eps, typename D::T* dlogits,
                                         std::int64_t rows, std::int64_t classes, double* row_loss,
                                         int* row_ok, const ErrorRecord* error) {
  if (error->flag != 0) return;  // a bad label: write nothing, the host raises
  const std::int64_t row =
      static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const typename L::T* z = logits + row * classes;
  // for_row(f): f(j, z[j]) for this lane's j (lane, lane + 32, ...) in order, kUnroll loads ahead.
  const auto for_row = [&](auto&& f) {
    std::int64_t j = lane;
    for (; j + (kUnroll - 1) * 32 < classes; j += kUnroll * 32) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = L::load(z[j + u * 32]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) f(j + u * 32, v[u]);
    }
    for (; j < classes; j += 32) f(j, L::load(z[j]));
  };
  float best = 0.0f;
  long long arg = -1;  // -1: no element seen yet (lanes beyond `classes`)
  for_row([&](std::int64_t j, float v) {
    // A lane's first candidate: z[0] always, else any non-NaN (NaNs past z[0] never win).
    if (arg < 0 ? (j == 0 || v == v) : element::argmax_beats(v, j, best, arg)) {
      best = v;
      arg = j;
    }
  });
  for (int o = 16; o > 0; o >>= 1) {  // a total order: every lane ends with the same winner
    const float ob = __shfl_xor_sync(0xFFFFFFFFu, best, o);
    const long long oa = __shfl_xor_sync(0xFFFFFFFFu, arg, o);
    if (element::argmax_beats(ob, oa, best, arg)) {
      best = ob;
      arg = oa;
    }
  }
  // z[y] is read by every lane before warp_sum's shuffles, so no lane's dlogits write below can
  // precede it even when dlogits shares the logits' buffer.
  const std::int32_t y = labels[row];
  const float zy = L::load(z[y]);
  double sum = 0.0;
  for_row([&](std::int64_t, float v) { sum += expf(v - best); });
  const double lse = static_cast<double>(best) + log(warp_sum(sum));
  // Label smoothing's term needs the row's logit sum; without smoothing the pass is skipped (eps
  // is the same for every lane, so the warp's shuffles stay uniform).
  double z_sum = 0.0;
  if (eps != 0.0f) {
    for_row([&](std::int64_t, float v) { z_sum += static_cast<double>(v); });
    z_sum = warp_sum(z_sum);
  }
  if (lane == 0) {
    row_loss[row] = element::xent_row_loss(lse, zy, z_sum, eps, classes);
    row_ok[row] = arg == y ? 1 : 0;
  }
  __syncwarp();
  if (dlogits != nullptr) {
    const float on = element::xent_target_on(eps, classes);
    const float off = element::xent_target_off(eps, classes);
    typename D::T* dz = dlogits + row * classes;
    // Each lane reads its own elements before it writes them: in place over the logits is safe.
    for_row([&](std::int64_t j, float v) {
      const float p = static_cast<float>(exp(static_cast<double>(v) - lse));
      dz[j] = D::store(element::xent_grad(p, j == y ? on : off, grad_factor), false);
    });
  }
}

template <class L, class D>
void launch_rows(const void* logits, const std::int32_t* labels, float grad_factor, float eps,
                 void* dlogits, std::int64_t rows, std::int64_t classes, double* row_loss,
                 int* row_ok, const ErrorRecord* error, cudaStream_t stream) {
  softmax_xent_rows_kernel<L, D><<<warp_row_blocks(rows), kThreads, 0, stream>>>(
      static_cast<const typename L::T*>(logits), labels, grad_factor, eps,
      static_cast<typename D::T*>(dlogits), rows, classes, row_loss, row_ok, error);
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
                                  std::int64_t classes, double* row_loss, int* row_ok,
                                  ErrorRecord* error, cudaStream_t stream) {
  check_labels_kernel<<<grid_for(rows), kThreads, 0, stream>>>(labels, rows, classes, error);
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
