// CUDA kernels for casts, element-wise ops and the layer kernels (bias, activations, layernorm,
// softmax cross-entropy). Math in fp32; storage per tensor as the SDK allows (fp32/bf16/fp16, fp8
// for casts), decoded and encoded with cuda_device.cuh's helpers, which follow
// sdk/float_formats.h. Row kernels use one warp per row; column reductions use a fixed split of
// the rows and a fixed summation order, so results are reproducible run to run.
#include <algorithm>
#include <climits>

#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float gelu(float x) {
  const float u = kGeluK * (x + kGeluC * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kGeluK * (x + kGeluC * x * x * x);
  const float t = tanhf(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
}

// --- casts and element-wise ------------------------------------------------------------------------

__global__ void cast_kernel(const void* src, Elem st, void* dst, Elem dt, bool tf32_out,
                            std::int64_t n, float scale, bool saturate, float* amax) {
  int local = 0;  // max |x| as fp32 bits: non-negative floats order as ints, NaN bits on top
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float x = load(src, st, i);
    local = max(local, __float_as_int(fabsf(x)));
    float v = scale != 1.0f ? x * scale : x;
    if (tf32_out) {
      static_cast<float*>(dst)[i] = round_tf32(v, saturate);
    } else {
      store(dst, dt, i, v, saturate);
    }
  }
  if (amax == nullptr) return;
  for (int o = 16; o > 0; o >>= 1) local = max(local, __shfl_xor_sync(0xFFFFFFFFu, local, o));
  __shared__ int block_max[kThreads / 32];
  if ((threadIdx.x & 31) == 0) block_max[threadIdx.x >> 5] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    int m = block_max[0];
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) m = max(m, block_max[w]);
    if (m > 0x7F800000) m = 0x7FFFFFFF;  // any NaN: the largest positive NaN wins every max
    atomicMax(reinterpret_cast<int*>(amax), m);
  }
}

__global__ void fill_kernel(void* x, Elem t, std::int64_t n, float value) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    store(x, t, i, value);
}

__global__ void scale_kernel(void* x, Elem t, std::int64_t n, float alpha) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    store(x, t, i, load(x, t, i) * alpha);
}

__global__ void axpy_kernel(float alpha, const void* x, Elem xt, float* y, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    y[i] += alpha * load(x, xt, i);
}

// fp32 -> fp32 fast paths use float4 when both pointers are 16-byte aligned.
__global__ void act_fwd_f32x4(int act, const float4* x, float4* y, std::int64_t n4) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += stride) {
    float4 v = x[i];
    if (act == 0) {
      v.x = v.x < 0.0f ? 0.0f : v.x;
      v.y = v.y < 0.0f ? 0.0f : v.y;
      v.z = v.z < 0.0f ? 0.0f : v.z;
      v.w = v.w < 0.0f ? 0.0f : v.w;
    } else {
      v.x = gelu(v.x);
      v.y = gelu(v.y);
      v.z = gelu(v.z);
      v.w = gelu(v.w);
    }
    y[i] = v;
  }
}

__global__ void act_fwd_kernel(int act, const void* x, Elem xt, void* y, Elem yt, std::int64_t begin,
                               std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = begin + static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const float v = load(x, xt, i);
    store(y, yt, i, act == 0 ? (v < 0.0f ? 0.0f : v) : gelu(v));  // relu keeps NaN
  }
}

__global__ void act_bwd_kernel(int act, const void* x, Elem xt, const void* dy, Elem dyt, void* dx,
                               Elem dxt, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = load(x, xt, i);
    const float g = load(dy, dyt, i);
    store(dx, dxt, i, act == 0 ? (v > 0.0f ? g : 0.0f) : g * gelu_grad(v));
  }
}

template <class T>
__global__ void transpose_kernel(const T* in, T* out, std::int64_t rows, std::int64_t cols) {
  __shared__ T tile[32][33];
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * 32;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * 32;
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    const std::int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[k][threadIdx.x] = in[r * cols + c];
  }
  __syncthreads();
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    const std::int64_t c = c0 + k, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][k];
  }
}

// --- layer kernels ------------------------------------------------------------------------------------

__global__ void add_bias_kernel(void* y, Elem yt, const void* bias, Elem bt, std::int64_t rows,
                                std::int64_t n) {
  // blockIdx.y walks rows, x covers columns: one modulo-free index per element.
  for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
         j += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      const std::int64_t i = r * n + j;
      store(y, yt, i, load(y, yt, i) + load(bias, bt, j));
    }
}

constexpr int kColRows = 8;  // threadIdx.y lanes per column block

std::int64_t rows_per_split(std::int64_t rows) {
  const std::int64_t target = (rows + 255) / 256;  // at most 256 splits
  return target < 64 ? 64 : target;
}

// partial[s, j] (and partial2) = sums over rows [s*rps, (s+1)*rps) of column j; mode 0: dy,
// mode 1: dy * xhat (and dy into partial2).
template <int kMode>
__global__ void column_partial_kernel(const void* dy, Elem dyt, const void* x, Elem xt,
                                      const float* mean, const float* rstd, std::int64_t rows,
                                      std::int64_t n, std::int64_t rps, float* partial,
                                      float* partial2) {
  __shared__ float s1[kColRows][33];
  __shared__ float s2[kColRows][33];
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const std::int64_t r_begin = static_cast<std::int64_t>(blockIdx.y) * rps;
  const std::int64_t r_end = min(rows, r_begin + rps);
  float a1 = 0.0f, a2 = 0.0f;
  if (j < n)
    for (std::int64_t r = r_begin + threadIdx.y; r < r_end; r += kColRows) {
      const float g = load(dy, dyt, r * n + j);
      if (kMode == 0) {
        a1 += g;
      } else {
        const float xhat = (load(x, xt, r * n + j) - mean[r]) * rstd[r];
        a1 += g * xhat;
        a2 += g;
      }
    }
  s1[threadIdx.y][threadIdx.x] = a1;
  s2[threadIdx.y][threadIdx.x] = a2;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    float t1 = 0.0f, t2 = 0.0f;
    for (int k = 0; k < kColRows; ++k) {
      t1 += s1[k][threadIdx.x];
      t2 += s2[k][threadIdx.x];
    }
    partial[static_cast<std::int64_t>(blockIdx.y) * n + j] = t1;
    if (kMode == 1) partial2[static_cast<std::int64_t>(blockIdx.y) * n + j] = t2;
  }
}

__global__ void column_finish_kernel(const float* partial, std::int64_t splits, std::int64_t n,
                                     float* out, bool accumulate) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n || out == nullptr) return;
  double acc = 0.0;
  for (std::int64_t s = 0; s < splits; ++s) acc += partial[s * n + j];
  out[j] = static_cast<float>((accumulate ? static_cast<double>(out[j]) : 0.0) + acc);
}

// One warp per row.
__global__ void layernorm_forward_kernel(const void* x, Elem xt, const void* gamma, Elem gt,
                                         const void* beta, Elem bt, float eps, void* y, Elem yt,
                                         float* mean, float* rstd, std::int64_t rows,
                                         std::int64_t n) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const std::int64_t base = row * n;
  float sum = 0.0f;
  for (std::int64_t j = lane; j < n; j += 32) sum += load(x, xt, base + j);
  const float mu = warp_sum(sum) / static_cast<float>(n);
  float sq = 0.0f;  // two-pass variance: no cancellation for large means
  for (std::int64_t j = lane; j < n; j += 32) {
    const float d = load(x, xt, base + j) - mu;
    sq += d * d;
  }
  const float rs = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(n) + eps);
  for (std::int64_t j = lane; j < n; j += 32) {
    const float g = gamma != nullptr ? load(gamma, gt, j) : 1.0f;
    const float b = beta != nullptr ? load(beta, bt, j) : 0.0f;
    store(y, yt, base + j, (load(x, xt, base + j) - mu) * rs * g + b);
  }
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

__global__ void layernorm_backward_kernel(const void* dy, Elem dyt, const void* x, Elem xt,
                                          const void* gamma, Elem gt, const float* mean,
                                          const float* rstd, void* dx, Elem dxt, std::int64_t rows,
                                          std::int64_t n) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const std::int64_t base = row * n;
  const float mu = mean[row], rs = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (std::int64_t j = lane; j < n; j += 32) {
    const float xhat = (load(x, xt, base + j) - mu) * rs;
    const float g = load(dy, dyt, base + j) * (gamma != nullptr ? load(gamma, gt, j) : 1.0f);
    sum_g += g;
    sum_gx += g * xhat;
  }
  const float mean_g = warp_sum(sum_g) / static_cast<float>(n);
  const float mean_gx = warp_sum(sum_gx) / static_cast<float>(n);
  for (std::int64_t j = lane; j < n; j += 32) {  // dx may alias dy: each lane rewrites its own
    const float xhat = (load(x, xt, base + j) - mu) * rs;
    const float g = load(dy, dyt, base + j) * (gamma != nullptr ? load(gamma, gt, j) : 1.0f);
    store(dx, dxt, base + j, rs * (g - mean_g - xhat * mean_gx));
  }
}

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

// One warp per row: max and argmax (first maximum), log-sum-exp, per-row loss, dlogits.
__global__ void softmax_xent_rows_kernel(const void* logits, Elem lt, const std::int32_t* labels,
                                         float grad_factor, void* dlogits, Elem dt,
                                         std::int64_t rows, std::int64_t classes, double* row_loss,
                                         int* row_ok, const ErrorRecord* error) {
  if (error->flag != 0) return;  // a bad label: write nothing, the host raises
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const std::int64_t base = row * classes;
  float best = 0.0f;
  long long arg = -1;  // -1: no element seen yet (lanes beyond `classes`)
  for (std::int64_t j = lane; j < classes; j += 32) {
    const float z = load(logits, lt, base + j);
    if (arg < 0 || z > best) {  // strict: the first maximum wins, as in the CPU reference
      best = z;
      arg = j;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xFFFFFFFFu, best, o);
    const long long oa = __shfl_xor_sync(0xFFFFFFFFu, arg, o);
    if (oa >= 0 && (arg < 0 || ob > best || (ob == best && oa < arg))) {
      best = ob;
      arg = oa;
    }
  }
  float sum = 0.0f;
  for (std::int64_t j = lane; j < classes; j += 32) sum += expf(load(logits, lt, base + j) - best);
  const float lse = best + logf(warp_sum(sum));
  const std::int32_t y = labels[row];
  if (lane == 0) {
    row_loss[row] = static_cast<double>(lse) - static_cast<double>(load(logits, lt, base + y));
    row_ok[row] = arg == y ? 1 : 0;
  }
  if (dlogits != nullptr)
    for (std::int64_t j = lane; j < classes; j += 32) {
      const float p = expf(load(logits, lt, base + j) - lse);
      store(dlogits, dt, base + j, (p - (j == y ? 1.0f : 0.0f)) * grad_factor);
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

unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>((rows + kThreads / 32 - 1) / (kThreads / 32));
}

}  // namespace

// --- launchers ------------------------------------------------------------------------------------------

cudaError_t cast(const void* src, Elem src_t, void* dst, Elem dst_t, bool tf32_out, std::int64_t n,
                 float scale, bool saturate, float* amax, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  cast_kernel<<<grid_for(n), kThreads, 0, stream>>>(src, src_t, dst, dst_t, tf32_out, n, scale,
                                                    saturate, amax);
  return cudaGetLastError();
}

cudaError_t fill(void* x, Elem t, std::int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, t, n, value);
  return cudaGetLastError();
}

cudaError_t scale(void* x, Elem t, std::int64_t n, float alpha, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, t, n, alpha);
  return cudaGetLastError();
}

cudaError_t axpy(float alpha, const void* x, Elem xt, float* y, std::int64_t n,
                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  axpy_kernel<<<grid_for(n), kThreads, 0, stream>>>(alpha, x, xt, y, n);
  return cudaGetLastError();
}

cudaError_t activation_forward(int act, const void* x, Elem xt, void* y, Elem yt, std::int64_t n,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  std::int64_t begin = 0;
  const bool aligned = (reinterpret_cast<std::uintptr_t>(x) % 16 == 0) &&
                       (reinterpret_cast<std::uintptr_t>(y) % 16 == 0);
  if (xt == Elem::f32 && yt == Elem::f32 && aligned && n >= 4) {
    const std::int64_t n4 = n / 4;
    act_fwd_f32x4<<<grid_for(n4), kThreads, 0, stream>>>(act, static_cast<const float4*>(x),
                                                         static_cast<float4*>(y), n4);
    begin = n4 * 4;
  }
  if (begin < n)
    act_fwd_kernel<<<grid_for(n - begin), kThreads, 0, stream>>>(act, x, xt, y, yt, begin, n);
  return cudaGetLastError();
}

cudaError_t activation_backward(int act, const void* x, Elem xt, const void* dy, Elem dyt,
                                void* dx, Elem dxt, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  act_bwd_kernel<<<grid_for(n), kThreads, 0, stream>>>(act, x, xt, dy, dyt, dx, dxt, n);
  return cudaGetLastError();
}

cudaError_t transpose(const void* in, void* out, std::int64_t rows, std::int64_t cols,
                      int elem_bytes, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const dim3 block(32, 8);
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32));
  switch (elem_bytes) {
    case 1:
      transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const std::uint8_t*>(in),
                                                   static_cast<std::uint8_t*>(out), rows, cols);
      break;
    case 2:
      transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const std::uint16_t*>(in),
                                                   static_cast<std::uint16_t*>(out), rows, cols);
      break;
    default:
      transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const std::uint32_t*>(in),
                                                   static_cast<std::uint32_t*>(out), rows, cols);
      break;
  }
  return cudaGetLastError();
}

cudaError_t add_bias(void* y, Elem yt, const void* bias, Elem bt, std::int64_t rows, std::int64_t n,
                     cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  const unsigned gx = static_cast<unsigned>(std::min<std::int64_t>((n + kThreads - 1) / kThreads, 64));
  const unsigned gy = static_cast<unsigned>(std::min<std::int64_t>(rows, 4096));
  add_bias_kernel<<<dim3(gx, gy), kThreads, 0, stream>>>(y, yt, bias, bt, rows, n);
  return cudaGetLastError();
}

std::size_t column_sum_scratch(std::int64_t rows, std::int64_t n) {
  const std::int64_t rps = rows_per_split(rows);
  const std::int64_t splits = rows == 0 ? 1 : (rows + rps - 1) / rps;
  return static_cast<std::size_t>(splits * n);
}

cudaError_t bias_grad(const void* dy, Elem dyt, float* dbias, std::int64_t rows, std::int64_t n,
                      bool accumulate, float* partial, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const std::int64_t rps = rows_per_split(rows);
  const std::int64_t splits = rows == 0 ? 0 : (rows + rps - 1) / rps;
  if (splits > 0)
    column_partial_kernel<0><<<dim3(static_cast<unsigned>((n + 31) / 32), static_cast<unsigned>(splits)),
                               dim3(32, kColRows), 0, stream>>>(dy, dyt, nullptr, Elem::f32, nullptr,
                                                                nullptr, rows, n, rps, partial,
                                                                nullptr);
  column_finish_kernel<<<grid_for(n), kThreads, 0, stream>>>(partial, splits, n, dbias, accumulate);
  return cudaGetLastError();
}

cudaError_t layernorm_forward(const void* x, Elem xt, const void* gamma, Elem gt, const void* beta,
                              Elem bt, float eps, void* y, Elem yt, float* mean, float* rstd,
                              std::int64_t rows, std::int64_t n, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  layernorm_forward_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(x, xt, gamma, gt, beta, bt, eps,
                                                                     y, yt, mean, rstd, rows, n);
  return cudaGetLastError();
}

cudaError_t layernorm_backward(const void* dy, Elem dyt, const void* x, Elem xt, const void* gamma,
                               Elem gt, const float* mean, const float* rstd, void* dx, Elem dxt,
                               float* dgamma, float* dbeta, bool accumulate, std::int64_t rows,
                               std::int64_t n, float* partial, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // Column sums first: dx may alias dy.
  if (dgamma != nullptr || dbeta != nullptr) {
    const std::int64_t rps = rows_per_split(rows);
    const std::int64_t splits = rows == 0 ? 0 : (rows + rps - 1) / rps;
    float* partial2 = partial + column_sum_scratch(rows, n);
    if (splits > 0)
      column_partial_kernel<1><<<dim3(static_cast<unsigned>((n + 31) / 32), static_cast<unsigned>(splits)),
                                 dim3(32, kColRows), 0, stream>>>(dy, dyt, x, xt, mean, rstd, rows, n,
                                                                  rps, partial, partial2);
    column_finish_kernel<<<grid_for(n), kThreads, 0, stream>>>(partial, splits, n, dgamma,
                                                               accumulate);
    column_finish_kernel<<<grid_for(n), kThreads, 0, stream>>>(partial2, splits, n, dbeta,
                                                               accumulate);
  }
  if (rows > 0)
    layernorm_backward_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(dy, dyt, x, xt, gamma, gt,
                                                                        mean, rstd, dx, dxt, rows, n);
  return cudaGetLastError();
}

cudaError_t softmax_cross_entropy(const void* logits, Elem lt, const std::int32_t* labels,
                                  float grad_scale, float* loss, std::int32_t* correct,
                                  void* dlogits, Elem dt, std::int64_t rows, std::int64_t classes,
                                  double* row_loss, int* row_ok, ErrorRecord* error,
                                  cudaStream_t stream) {
  check_labels_kernel<<<grid_for(rows), kThreads, 0, stream>>>(labels, rows, classes, error);
  const float grad_factor = grad_scale / static_cast<float>(rows);
  softmax_xent_rows_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(
      logits, lt, labels, grad_factor, dlogits, dt, rows, classes, row_loss, row_ok, error);
  softmax_xent_finish_kernel<<<1, kThreads, 0, stream>>>(row_loss, row_ok, rows, loss, correct,
                                                         error);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
