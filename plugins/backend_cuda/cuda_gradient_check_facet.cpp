// CudaGradientCheck: the unscale / inf-NaN check, sum-of-squares and first-non-finite kernels
// over multi-tensor tables, and the read back of their answers.
#include "cuda_gradient_check_facet.h"
#include "mixtrain/sdk/support/facet_registry.h"

#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_access.h"
#include "cuda_gradient_check.h"

namespace mixtrain::backend_cuda {

using sdk::TensorView;

namespace {

// The tables of one multi-tensor call, uploaded to the device.
struct TensorTables {
  const kernels::TensorRef* refs = nullptr;
  const kernels::Chunk* chunks = nullptr;
  int count = 0;
};

// Checks `tensors` (fp32 only, or any storage float) and uploads their multi-tensor tables.
TensorTables tensor_tables(CudaContext& context, std::span<const TensorView> tensors,
                           const char* op, const char* name, bool fp32_only) {
  std::vector<kernels::TensorRef> refs;
  std::vector<std::int64_t> numels;
  // The unscale writes every tensor in one launch: a tensor listed twice (or two that overlap)
  // would be scaled by two blocks at once, so the foreach ops' rule: fp32, present, apart.
  if (fp32_only) checks().foreach_lists(op, tensors);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string what = std::string(name) + "[" + std::to_string(i) + "]";
    if (!fp32_only) require_storage(op, what, tensors[i]);
    refs.push_back({tensors[i].data, tensors[i].numel(), elem_of(tensors[i].dtype), 0});
    numels.push_back(tensors[i].numel());
  }
  TensorTables t;
  t.count = context.upload_tables(refs, numels, &t.refs, &t.chunks, op);
  return t;
}

// Enqueues the unscale/check kernel; returns the device flag.
int* enqueue_unscale(CudaContext& context, const TensorTables& t, float inv_scale, const char* op) {
  int* found = context.flags.as<int>(1, context.stream, op);
  context.account_buffers();
  check_cuda(cudaMemsetAsync(found, 0, sizeof(int), context.stream), op, "cudaMemsetAsync");
  check_cuda(
      kernels::unscale_and_check(t.refs, t.chunks, t.count, inv_scale, found, context.stream), op,
      "unscale kernel launch");
  return found;
}

// Enqueues the sum of squares; returns the device result.
double* enqueue_sum_of_squares(CudaContext& context, const TensorTables& t, const char* op) {
  double* partial = context.partial.as<double>(std::max(1, t.count), context.stream, op);
  double* result = context.partial2.as<double>(1, context.stream, op);
  context.account_buffers();
  check_cuda(kernels::sum_of_squares(t.refs, t.chunks, t.count, partial, result, context.stream),
             op, "sum of squares kernel launch");
  return result;
}

}  // namespace

bool CudaGradientCheck::unscale_and_check_finite(std::span<const TensorView> grads,
                                                 float inv_scale) {
  context_.activate();
  constexpr const char* op = "unscale_and_check_finite";
  int* found =
      enqueue_unscale(context_, tensor_tables(context_, grads, op, "grads", true), inv_scale, op);
  int* host = context_.host_result<int>(1);
  check_cuda(cudaMemcpyAsync(host, found, sizeof(int), cudaMemcpyDeviceToHost, context_.stream), op,
             "cudaMemcpyAsync");
  context_.sync(op);
  return *host != 0;
}

double CudaGradientCheck::sum_of_squares(std::span<const TensorView> tensors) {
  context_.activate();
  constexpr const char* op = "sum_of_squares";
  double* result =
      enqueue_sum_of_squares(context_, tensor_tables(context_, tensors, op, "tensors", false), op);
  double* host = context_.host_result<double>(1);
  check_cuda(cudaMemcpyAsync(host, result, sizeof(double), cudaMemcpyDeviceToHost, context_.stream),
             op, "cudaMemcpyAsync");
  context_.sync(op);
  return *host;
}

sdk::GradientCheckFacet::GradientCheck CudaGradientCheck::unscale_check_and_sum_squares(
    std::span<const TensorView> grads, float inv_scale) {
  context_.activate();
  constexpr const char* op = "unscale_check_and_sum_squares";
  // One table for both kernels; the sum runs the same kernel and partition as sum_of_squares(),
  // after the unscale in stream order, so the result equals the two calls made in turn.
  const TensorTables t = tensor_tables(context_, grads, op, "grads", true);
  int* found = enqueue_unscale(context_, t, inv_scale, op);
  double* result = enqueue_sum_of_squares(context_, t, op);
  double* host =
      context_.host_result<double>(2);  // [0]: the sum, [1]: found_inf's int in its first bytes
  check_cuda(cudaMemcpyAsync(host, result, sizeof(double), cudaMemcpyDeviceToHost, context_.stream),
             op, "cudaMemcpyAsync");
  check_cuda(cudaMemcpyAsync(host + 1, found, sizeof(int), cudaMemcpyDeviceToHost, context_.stream),
             op, "cudaMemcpyAsync");
  context_.sync(op);
  GradientCheck r;
  r.sum_of_squares = host[0];
  int flag = 0;
  std::memcpy(&flag, host + 1, sizeof flag);
  r.found_inf = flag != 0;
  return r;
}

static_assert(sizeof(kernels::StatusRecord) == sizeof(sdk::GradientStatus) &&
              offsetof(kernels::StatusRecord, sum_of_squares) ==
                  offsetof(sdk::GradientStatus, sum_of_squares) &&
              offsetof(kernels::StatusRecord, found_inf) ==
                  offsetof(sdk::GradientStatus, found_inf));

CudaGradientCheck::~CudaGradientCheck() {
  if (status_copied_ != nullptr) {
    context_.activate_quietly();
    cudaEventSynchronize(status_copied_);  // the copy into pinned_status_ may still be running
    cudaEventDestroy(status_copied_);
  }
  if (pinned_status_ != nullptr) cudaFreeHost(pinned_status_);
}

void CudaGradientCheck::queue_unscale_check(std::span<const TensorView> grads, float inv_scale,
                                            bool sum_squares, TensorView status) {
  context_.activate();
  constexpr const char* op = "queue_unscale_check";
  checks().gradient_status(op, status);
  // Each made once, and each on its own: a failed event creation is retried at the next call
  // rather than left null beside an allocated slot.
  if (pinned_status_ == nullptr)
    check_cuda(cudaMallocHost(reinterpret_cast<void**>(&pinned_status_), sizeof(*pinned_status_)),
               op, "cudaMallocHost of the status read back");
  if (status_copied_ == nullptr)
    check_cuda(cudaEventCreateWithFlags(&status_copied_, cudaEventDisableTiming), op,
               "cudaEventCreateWithFlags");
  const TensorTables t = tensor_tables(context_, grads, op, "grads", true);
  int* found = enqueue_unscale(context_, t, inv_scale, op);
  const double* sum = sum_squares ? enqueue_sum_of_squares(context_, t, op) : nullptr;
  queued_labels_ = context_.labels_pending;
  queued_ids_ = context_.ids_pending;
  const int* label_flag = queued_labels_ ? &context_.label_record->flag : nullptr;
  const int* id_flag = queued_ids_ ? &context_.id_record(op)->flag : nullptr;
  auto* device_status = static_cast<kernels::StatusRecord*>(status.data);
  check_cuda(kernels::write_status(found, sum, label_flag, id_flag, device_status, context_.stream),
             op, "status kernel launch");
  check_cuda(cudaMemcpyAsync(pinned_status_, device_status, sizeof(*pinned_status_),
                             cudaMemcpyDeviceToHost, context_.stream),
             op, "cudaMemcpyAsync of the status");
  check_cuda(cudaEventRecord(status_copied_, context_.stream), op, "cudaEventRecord");
  queued_ = true;
}

sdk::GradientCheckFacet::GradientCheck CudaGradientCheck::queued_check_result() {
  constexpr const char* op = "queued_check_result";
  if (!queued_)
    throw std::logic_error(
        "backend_cuda.queued_check_result: no queue_unscale_check to read (each is read once)");
  queued_ = false;
  context_.activate();
  check_cuda(cudaEventSynchronize(status_copied_), op, "cudaEventSynchronize");
  const kernels::StatusRecord r = *pinned_status_;
  if (r.deferred != 0) context_.sync(op);  // raises the label or id error the records hold
  // The records were read clean as of the check; the next loss or gather sets them pending again.
  if (queued_labels_) context_.labels_pending = false;
  if (queued_ids_) context_.ids_pending = false;
  GradientCheck out;
  out.found_inf = r.found_inf != 0;
  out.sum_of_squares = r.sum_of_squares;
  return out;
}

int CudaGradientCheck::first_nonfinite(std::span<const TensorView> tensors) {
  context_.activate();
  constexpr const char* op = "first_nonfinite";
  if (tensors.empty()) return -1;
  const TensorTables t = tensor_tables(context_, tensors, op, "tensors", false);
  int* flags = context_.flags.as<int>(tensors.size(), context_.stream, op);
  context_.account_buffers();
  check_cuda(cudaMemsetAsync(flags, 0, tensors.size() * sizeof(int), context_.stream), op,
             "cudaMemsetAsync");
  check_cuda(kernels::find_nonfinite(t.refs, t.chunks, t.count, flags, context_.stream), op,
             "kernel launch");
  std::vector<int> host(tensors.size());
  check_cuda(cudaMemcpyAsync(host.data(), flags, host.size() * sizeof(int), cudaMemcpyDeviceToHost,
                             context_.stream),
             op, "cudaMemcpyAsync");
  context_.sync(op);
  for (std::size_t t = 0; t < host.size(); ++t)
    if (host[t] != 0) return static_cast<int>(t);
  return -1;
}

sdk::UnderflowTally CudaGradientCheck::count_underflow(TensorView values, float threshold) {
  context_.activate();
  constexpr const char* op = "count_underflow";
  checks().count_underflow(values, threshold);
  auto* tally = context_.flags.as<unsigned long long>(2, context_.stream, op);
  context_.account_buffers();
  check_cuda(cudaMemsetAsync(tally, 0, 2 * sizeof(unsigned long long), context_.stream), op,
             "cudaMemsetAsync");
  check_cuda(kernels::count_underflow(static_cast<const float*>(values.data), values.numel(),
                                      threshold, tally, context_.stream),
             op, "kernel launch");
  unsigned long long host[2] = {0, 0};
  check_cuda(cudaMemcpyAsync(host, tally, sizeof host, cudaMemcpyDeviceToHost, context_.stream), op,
             "cudaMemcpyAsync");
  context_.sync(op);
  return {static_cast<std::int64_t>(host[0]), static_cast<std::int64_t>(host[1])};
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::GradientCheckFacet, CudaGradientCheck> kCudaGradientCheckRegistration;

}  // namespace mixtrain::backend_cuda
