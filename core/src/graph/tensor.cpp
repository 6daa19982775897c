#include "mixtrain/core/graph/tensor.h"

#include <stdexcept>

namespace mixtrain::core {

Tensor::Tensor(std::shared_ptr<sdk::DeviceBackend> backend, sdk::DType dtype, sdk::Shape shape)
    : backend_(std::move(backend)), dtype_(dtype), shape_(shape) {
  capacity_ = sdk::TensorView{nullptr, dtype_, shape_}.bytes();  // throws on overflow
  // Zero-sized tensors still get a distinct allocation so views are never null.
  data_ = backend_->allocate(capacity_ == 0 ? 64 : capacity_);
}

Tensor::~Tensor() {
  release();
}

Tensor::Tensor(Tensor&& o) noexcept
    : backend_(std::move(o.backend_)),
      data_(o.data_),
      capacity_(o.capacity_),
      dtype_(o.dtype_),
      shape_(o.shape_) {
  o.data_ = nullptr;
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    release();
    backend_ = std::move(o.backend_);
    data_ = o.data_;
    capacity_ = o.capacity_;
    dtype_ = o.dtype_;
    shape_ = o.shape_;
    o.data_ = nullptr;
  }
  return *this;
}

void copy_to_host_fp32(const std::shared_ptr<sdk::DeviceBackend>& backend, sdk::TensorView src,
                       float* dst, Tensor& scratch) {
  if (src.dtype == sdk::DType::fp32) {
    backend->copy_to_host(dst, src);
    return;
  }
  if (scratch.empty() || scratch.shape().numel() < src.numel())
    scratch = Tensor(backend, sdk::DType::fp32, sdk::Shape{src.numel()});
  const sdk::TensorView wide{scratch.view().data, sdk::DType::fp32, src.shape};
  backend->cast(src, wide);
  backend->copy_to_host(dst, wide);
}

Tensor Tensor::borrowed(sdk::TensorView view) {
  Tensor t;
  t.data_ = view.data;
  t.capacity_ = view.bytes();
  t.dtype_ = view.dtype;
  t.shape_ = view.shape;
  return t;  // no backend: release() leaves the memory to its owner
}

void Tensor::release() noexcept {
  if (data_ != nullptr && backend_) backend_->deallocate(data_);
  data_ = nullptr;
}

sdk::TensorView Tensor::rows(std::int64_t rows) const {
  if (rows > shape_.rows())
    throw std::logic_error("Tensor::rows: " + std::to_string(rows) + " rows requested from " +
                           shape_.to_string());
  return {data_, dtype_, sdk::Shape{rows, shape_.cols()}};
}

sdk::TensorView Tensor::reinterpret(sdk::DType dtype, std::int64_t rows, std::int64_t cols) const {
  auto need = static_cast<std::size_t>(rows * cols) * sdk::dtype_size(dtype);
  if (need > capacity_)
    throw std::logic_error("Tensor::reinterpret: " + std::to_string(need) +
                           " bytes requested from a buffer of " + std::to_string(capacity_));
  return {data_, dtype, sdk::Shape{rows, cols}};
}

}  // namespace mixtrain::core
