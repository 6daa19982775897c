// Flushing subnormal floats to zero on the threads that run the CPU backend's kernels (the
// `flush_denormals` option), what torch.set_flush_denormal(True) does.
//
// Why: x86 cores take a slow microcode path for every subnormal operand or result. A run that
// has converged (loss ~0, so gradients and Adam's second moments decay below 2^-126) ran at a
// quarter of its early speed; with FTZ/DAZ it keeps it. The price: values below fp32's smallest
// normal (1.2e-38) become 0, so the numbers differ from PyTorch's default in that range only.
//
// Contract
// - DenormalFlush(threads) sets MXCSR's FTZ and DAZ bits on the calling thread and on every
//   thread of an OpenMP team of `threads` (oneDNN runs on the same OpenMP threads); threads
//   started later (a larger OpenMP team, the data loader's prefetch thread) copy the calling
//   thread's state. The calling thread is the training thread: its host code (data generation,
//   losses summed on the host) flushes too. The destructor gives the same threads the calling
//   thread's two bits as they were before; threads started meanwhile keep theirs.
// - supported(): false off x86, where the constructor throws std::logic_error (the plugin
//   refuses the option there).
#pragma once

namespace mixtrain::backend_cpu {

class DenormalFlush {
 public:
  explicit DenormalFlush(int threads);
  ~DenormalFlush();
  DenormalFlush(const DenormalFlush&) = delete;
  DenormalFlush& operator=(const DenormalFlush&) = delete;

  static bool supported() noexcept;

 private:
  int threads_;
  unsigned previous_ = 0;  // the calling thread's FTZ and DAZ bits before
};

}  // namespace mixtrain::backend_cpu
