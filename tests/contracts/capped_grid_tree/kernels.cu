// The check's own fixture: two kernels launched over grid_for, one of them without a grid-stride
// walk (it would skip items past 8192 blocks). Never compiled.
__global__ void strided_kernel(float* y, long n) {
  for (long i = global_thread(); i < n; i += grid_threads()) y[i] = 0.0f;
}

template <class S>
__global__ void one_item_kernel(float* y, long n) {
  const long i = global_thread();
  if (i >= n) return;
  y[i] = 1.0f;
}

void launch(float* y, long n, cudaStream_t stream) {
  strided_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, n);
  one_item_kernel<Fp32, std::int64_t><<<kernels::grid_for(n), kThreads, 0, stream>>>(y, n);
}
