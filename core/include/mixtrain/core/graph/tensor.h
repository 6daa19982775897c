// Tensor: an owning, move-only device buffer allocated through a DeviceBackend.
//
// Contract: contiguous row-major storage of shape × dtype, freed through the same backend when
// the Tensor dies. The Tensor holds a shared_ptr to its backend (and so to the backend's plugin
// library), so a backend always outlives the memory it handed out.
#pragma once

#include <memory>

#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::core {

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<sdk::DeviceBackend> backend, sdk::DType dtype, sdk::Shape shape);
  ~Tensor();
  Tensor(Tensor&& o) noexcept;
  Tensor& operator=(Tensor&& o) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  // A tensor over memory another owner keeps alive and frees (data parallel: a parameter's
  // gradient living in its bucket, docs/architecture.md "Data parallel"); it frees nothing.
  static Tensor borrowed(sdk::TensorView view);

  bool empty() const { return data_ == nullptr; }
  sdk::DType dtype() const { return dtype_; }
  const sdk::Shape& shape() const { return shape_; }
  std::size_t bytes() const { return view().bytes(); }
  sdk::TensorView view() const { return {data_, dtype_, shape_}; }
  // The first `rows` rows as a [rows, cols] view (for batches smaller than the allocation).
  sdk::TensorView rows(std::int64_t rows) const;
  // The same bytes viewed as [rows, cols] of another dtype that fits in the allocation.
  sdk::TensorView reinterpret(sdk::DType dtype, std::int64_t rows, std::int64_t cols) const;

 private:
  void release() noexcept;
  std::shared_ptr<sdk::DeviceBackend> backend_;
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
  sdk::DType dtype_ = sdk::DType::fp32;
  sdk::Shape shape_;
};

// `src`'s values as FP32 in `dst` (src.numel() floats), waiting for the device. A src that is
// not fp32 is cast on the device into `scratch`, which is (re)allocated only when it holds fewer
// elements than src, so a caller reading batch after batch allocates once.
void copy_to_host_fp32(const std::shared_ptr<sdk::DeviceBackend>& backend, sdk::TensorView src,
                       float* dst, Tensor& scratch);

}  // namespace mixtrain::core
