// CpuContext: construction, threads and memory accounting.
#include "cpu_context.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "cpu_access.h"
#include "cpu_eltwise.h"
#include "cpu_features.h"
#include "cpu_gemm.h"
#include "cpu_primitive_cache.h"

namespace mixtrain::backend_cpu {

namespace {
// The OpenMP runtime's starting team size: OMP_NUM_THREADS where it is set, else every core the
// process may run on (its affinity mask). Read when the plugin loads, before any CpuContext sets
// its own count with omp_set_num_threads, so that `threads = 0` honours OMP_NUM_THREADS as
// PyTorch and oneDNN do: two ranks under `mpirun -x OMP_NUM_THREADS=1`, or two test programs
// side by side, then stop fighting over the same cores.
const int kRuntimeDefaultThreads = std::max(1, omp_get_max_threads());
}  // namespace

CpuContext::CpuContext(int threads, Bf16GemmPath bf16_gemm, Bf16ConvPath bf16_conv,
                       ConvAlgorithm conv_algorithm)
    : threads_(threads > 0 ? threads : kRuntimeDefaultThreads),
      gemm_(std::make_unique<GemmEngine>(bf16_gemm)),
      eltwise_(std::make_unique<EltwiseEngine>()),
      prims_(std::make_unique<PrimitiveCache>()),
      bf16_conv_request_(bf16_conv),
      conv_algorithm_(conv_algorithm) {
  if (threads < 0)
    fail("create", "threads = " + std::to_string(threads) + " is negative",
         "use 0 for OMP_NUM_THREADS (all cores where it is unset) or a positive thread count");
  use_threads();
}

CpuContext::~CpuContext() {
  std::lock_guard lock(memory_mutex_);
  for (auto& [ptr, bytes] : live_) std::free(ptr);
}

bool CpuContext::has_amx_bf16() const {
  if (amx_state_ < 0) amx_state_ = detect_cpu().has("amx_bf16") ? 1 : 0;
  return amx_state_ == 1;
}

bool CpuContext::amx_bf16_gemms() const {
  return has_amx_bf16() && gemm_->bf16_native();
}

void CpuContext::use_threads() const {
  if (omp_get_max_threads() != threads_) omp_set_num_threads(threads_);
}

void* CpuContext::allocate(std::size_t bytes) {
  const std::size_t rounded = std::max<std::size_t>(64, (bytes + 63) / 64 * 64);
  void* p = rounded < bytes ? nullptr : std::aligned_alloc(64, rounded);
  if (p == nullptr)
    throw sdk::BackendError("backend_cpu.allocate: cannot allocate " + std::to_string(bytes) +
                                " bytes (" + std::to_string(available_memory_bytes()) +
                                " bytes available on the host)",
                            "reduce the batch size or the model, or free host memory");
  std::lock_guard lock(memory_mutex_);
  live_.emplace(p, bytes);
  current_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, current_bytes_);
  return p;
}

void CpuContext::deallocate(void* ptr) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard lock(memory_mutex_);
  const auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours (or freed twice): never free what we did not allocate
  current_bytes_ -= it->second;
  live_.erase(it);
  std::free(ptr);
}

sdk::MemoryStats CpuContext::memory_stats() const {
  std::lock_guard lock(memory_mutex_);
  return {current_bytes_, peak_bytes_, live_.size()};
}

std::size_t CpuContext::scratch_bytes() const {
  std::lock_guard lock(memory_mutex_);
  return scratch_bytes_;
}

void CpuContext::account_scratch() {
  const std::size_t now =
      gemm_->scratch_bytes() + prims_->scratch_bytes() + eltwise_->scratch_bytes();
  if (now == scratch_bytes_) return;  // the steady state: scratch is grow-only
  std::lock_guard lock(memory_mutex_);
  current_bytes_ = current_bytes_ - scratch_bytes_ + now;
  scratch_bytes_ = now;
  peak_bytes_ = std::max(peak_bytes_, current_bytes_);
}

}  // namespace mixtrain::backend_cpu
