// Multi-tensor kernels: fused unscale + finite check, sum of squares, first non-finite tensor, and
// the fused SGD / AdamW updates that also refresh the low-precision working copies. The host cuts
// every tensor into chunks of at most kChunkElems elements (kernels::Chunk) and uploads the chunk
// and tensor tables once per call; one block handles one chunk, so many small parameters and a
// few huge ones share one launch. Each element is read and written exactly once per call.
#include "cuda_device.cuh"

namespace mixtrain::backend_cuda::kernels {

namespace {

__global__ void unscale_kernel(const TensorRef* tensors, const Chunk* chunks, float inv_scale,
                               int* found) {
  const Chunk c = chunks[blockIdx.x];
  float* g = static_cast<float*>(tensors[c.tensor].data) + c.begin;
  int local = 0;
  for (int i = threadIdx.x; i < c.len; i += blockDim.x) {
    // inf or NaN before scaling stays inf/NaN after (inf*0 is NaN), so one check suffices.
    const float v = g[i] * inv_scale;
    g[i] = v;
    local |= nonfinite(v) ? 1 : 0;
  }
  if (__syncthreads_or(local) && threadIdx.x == 0) *found = 1;
}

__global__ void sum_squares_kernel(const TensorRef* tensors, const Chunk* chunks, double* partial) {
  const Chunk c = chunks[blockIdx.x];
  const TensorRef t = tensors[c.tensor];
  double local = 0.0;
  for (int i = threadIdx.x; i < c.len; i += blockDim.x) {
    const float x = load(t.data, t.type, c.begin + i);
    local += static_cast<double>(x) * x;
  }
  __shared__ double s[kThreads];
  s[threadIdx.x] = local;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = s[0];
}

__global__ void sum_partials_kernel(const double* partial, int count, double* result) {
  __shared__ double s[kThreads];
  double local = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) local += partial[i];
  s[threadIdx.x] = local;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) *result = s[0];
}

__global__ void nonfinite_kernel(const TensorRef* tensors, const Chunk* chunks, int* flags) {
  const Chunk c = chunks[blockIdx.x];
  const TensorRef t = tensors[c.tensor];
  int local = 0;
  for (int i = threadIdx.x; i < c.len; i += blockDim.x)
    local |= nonfinite(load(t.data, t.type, c.begin + i)) ? 1 : 0;
  if (__syncthreads_or(local) && threadIdx.x == 0) flags[c.tensor] = 1;
}

__global__ void sgd_kernel(SgdArgs h, const ParamRef* params, const Chunk* chunks) {
  const Chunk c = chunks[blockIdx.x];
  const ParamRef p = params[c.tensor];
  float* w = p.master + c.begin;
  const float* grad = p.grad + c.begin;
  float* buf = h.use_momentum ? p.state1 + c.begin : nullptr;
  const float damp = 1.0f - h.dampening;
  for (int i = threadIdx.x; i < c.len; i += blockDim.x) {
    float g = grad[i] * h.grad_scale + h.weight_decay * w[i];
    if (h.use_momentum) {
      const float m = h.first_step ? g : h.momentum * buf[i] + damp * g;
      buf[i] = m;
      g = h.nesterov ? g + h.momentum * m : m;
    }
    const float updated = w[i] - h.lr * g;
    w[i] = updated;
    if (p.working != nullptr) store(p.working, p.working_type, c.begin + i, updated);
  }
}

__global__ void adamw_kernel(AdamWArgs h, const ParamRef* params, const Chunk* chunks) {
  const Chunk c = chunks[blockIdx.x];
  const ParamRef p = params[c.tensor];
  float* w = p.master + c.begin;
  const float* grad = p.grad + c.begin;
  float* m = p.state1 + c.begin;
  float* v = p.state2 + c.begin;
  const float one_minus_b1 = 1.0f - h.beta1, one_minus_b2 = 1.0f - h.beta2;
  for (int i = threadIdx.x; i < c.len; i += blockDim.x) {
    const float g = grad[i] * h.grad_scale;
    const float mi = h.beta1 * m[i] + one_minus_b1 * g;
    const float vi = h.beta2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / h.bc2_sqrt + h.eps;
    const float updated = w[i] * h.decay - h.step_size * mi / denom;
    w[i] = updated;
    if (p.working != nullptr) store(p.working, p.working_type, c.begin + i, updated);
  }
}

}  // namespace

cudaError_t unscale_and_check(const TensorRef* tensors, const Chunk* chunks, int num_chunks,
                              float inv_scale, int* found, cudaStream_t stream) {
  if (num_chunks == 0) return cudaSuccess;
  unscale_kernel<<<num_chunks, kThreads, 0, stream>>>(tensors, chunks, inv_scale, found);
  return cudaGetLastError();
}

cudaError_t sum_of_squares(const TensorRef* tensors, const Chunk* chunks, int num_chunks,
                           double* partial, double* result, cudaStream_t stream) {
  if (num_chunks > 0)
    sum_squares_kernel<<<num_chunks, kThreads, 0, stream>>>(tensors, chunks, partial);
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(partial, num_chunks, result);
  return cudaGetLastError();
}

cudaError_t find_nonfinite(const TensorRef* tensors, const Chunk* chunks, int num_chunks,
                           int* flags, cudaStream_t stream) {
  if (num_chunks == 0) return cudaSuccess;
  nonfinite_kernel<<<num_chunks, kThreads, 0, stream>>>(tensors, chunks, flags);
  return cudaGetLastError();
}

cudaError_t sgd_update(const SgdArgs& h, const ParamRef* params, const Chunk* chunks,
                       int num_chunks, cudaStream_t stream) {
  if (num_chunks == 0) return cudaSuccess;
  sgd_kernel<<<num_chunks, kThreads, 0, stream>>>(h, params, chunks);
  return cudaGetLastError();
}

cudaError_t adamw_update(const AdamWArgs& h, const ParamRef* params, const Chunk* chunks,
                         int num_chunks, cudaStream_t stream) {
  if (num_chunks == 0) return cudaSuccess;
  adamw_kernel<<<num_chunks, kThreads, 0, stream>>>(h, params, chunks);
  return cudaGetLastError();
}

}  // namespace mixtrain::backend_cuda::kernels
