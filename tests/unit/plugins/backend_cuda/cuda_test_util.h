// Helpers for the CUDA backend tests: a fixture that skips (visibly, with CUDA's error text) when
// no device is present, tensors on either backend filled from host floats through the SDK's
// scalar encoders, and comparisons of the CUDA results against the CPU reference backend.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_backend.h"
#include "cuda_backend.h"
#include "mixtrain/sdk/support/float_formats.h"

namespace mixtrain::backend_cuda::testing {

using sdk::DType;
using sdk::Shape;
using sdk::TensorView;

// Empty when a device is usable, else why not ("cudaErrorNoDevice: no CUDA-capable device ...").
inline std::string no_device_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
  }
  if (count == 0) return "cudaGetDeviceCount reports 0 devices";
  return {};
}

inline std::uint16_t bits16(float x, DType t) {
  return t == DType::bf16 ? sdk::encode_bf16(x) : sdk::encode_fp16(x);
}

// Host bytes of `values` stored as `dtype` (fp8: to_inf_or_nan, as cast() without saturate).
inline std::vector<std::uint8_t> encode(const std::vector<float>& values, DType dtype) {
  std::vector<std::uint8_t> out(values.size() * sdk::dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::bf16:
      case DType::fp16: {
        const std::uint16_t b = bits16(values[i], dtype);
        std::memcpy(out.data() + 2 * i, &b, 2);
        break;
      }
      case DType::fp8_e4m3: out[i] = sdk::encode_fp8_e4m3(values[i], sdk::Overflow::to_inf_or_nan); break;
      case DType::fp8_e5m2: out[i] = sdk::encode_fp8_e5m2(values[i], sdk::Overflow::to_inf_or_nan); break;
      case DType::int32: {
        const auto v = static_cast<std::int32_t>(values[i]);
        std::memcpy(out.data() + 4 * i, &v, 4);
        break;
      }
      default: std::memcpy(out.data() + 4 * i, &values[i], 4); break;
    }
  }
  return out;
}

inline std::vector<float> decode(const std::vector<std::uint8_t>& bytes, DType dtype) {
  const std::size_t n = bytes.size() / sdk::dtype_size(dtype);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::bf16:
      case DType::fp16: {
        std::uint16_t b;
        std::memcpy(&b, bytes.data() + 2 * i, 2);
        out[i] = dtype == DType::bf16 ? sdk::decode_bf16(b) : sdk::decode_fp16(b);
        break;
      }
      case DType::fp8_e4m3: out[i] = sdk::decode_fp8_e4m3(bytes[i]); break;
      case DType::fp8_e5m2: out[i] = sdk::decode_fp8_e5m2(bytes[i]); break;
      case DType::int32: {
        std::int32_t v;
        std::memcpy(&v, bytes.data() + 4 * i, 4);
        out[i] = static_cast<float>(v);
        break;
      }
      default: std::memcpy(&out[i], bytes.data() + 4 * i, 4); break;
    }
  }
  return out;
}

// A tensor allocated on either backend, zero-filled, set/read as host floats.
class Tensor {
 public:
  Tensor(sdk::DeviceBackend& backend, DType dtype, Shape shape) : backend_(&backend) {
    view_.dtype = dtype;
    view_.shape = shape;
    view_.data = backend.allocate(std::max<std::size_t>(view_.bytes(), 1));
    std::vector<std::uint8_t> zeros(view_.bytes());
    backend.copy_from_host(view_, zeros.data());
  }
  Tensor(sdk::DeviceBackend& backend, DType dtype, Shape shape, const std::vector<float>& values)
      : Tensor(backend, dtype, shape) {
    set(values);
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor() { backend_->deallocate(view_.data); }

  const TensorView& view() const { return view_; }
  operator TensorView() const { return view_; }

  void set(const std::vector<float>& values) {
    ASSERT_EQ(static_cast<std::int64_t>(values.size()), view_.numel());
    const auto bytes = encode(values, view_.dtype);
    backend_->copy_from_host(view_, bytes.data());
  }
  std::vector<std::uint8_t> raw() const {
    std::vector<std::uint8_t> bytes(view_.bytes());
    backend_->copy_to_host(bytes.data(), view_);
    return bytes;
  }
  std::vector<float> get() const { return decode(raw(), view_.dtype); }

 private:
  sdk::DeviceBackend* backend_;
  TensorView view_;
};

inline std::vector<float> random_values(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// |gpu - cpu| <= abs + rel * |cpu| element-wise; NaN must match NaN, inf must match inf.
inline void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel,
                         double abs, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < gpu.size() && reported < 5; ++i) {
    const double g = gpu[i], c = cpu[i];
    bool ok;
    if (std::isnan(c) || std::isnan(g))
      ok = std::isnan(c) && std::isnan(g);
    else if (std::isinf(c) || std::isinf(g))
      ok = g == c;
    else
      ok = std::fabs(g - c) <= abs + rel * std::fabs(c);
    if (!ok) {
      ++reported;
      ADD_FAILURE() << what << ": element " << i << " gpu " << g << " cpu " << c
                    << " (rel " << rel << ", abs " << abs << ")";
    }
  }
}

// Bit-exact equality of the stored values (NaN == NaN of any payload and sign).
inline void expect_same_values(const std::vector<float>& gpu, const std::vector<float>& cpu,
                               const std::string& what) {
  expect_close(gpu, cpu, 0.0, 0.0, what);
}

// Relative tolerance of one rounding to a storage dtype.
inline double ulp_rel(DType t) {
  switch (t) {
    case DType::bf16: return 0x1p-7;
    case DType::fp16: return 0x1p-10;
    default: return 1e-6;
  }
}

// The backend's facet F (an SDK facet interface, or the CUDA class implementing one, for its
// extras); a missing facet fails the test by throwing.
template <class F>
F& facet_of(sdk::DeviceBackend& backend) {
  F* f = sdk::facet<F>(backend);
  if (f == nullptr) throw std::runtime_error("the backend offers no " + std::string(F::kName));
  return *f;
}

// Fixture: a CUDA backend on device 0 and the CPU reference; skipped without a device.
class backend_cuda_vs_cpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = no_device_reason();
    if (!reason.empty()) GTEST_SKIP() << "no CUDA device: " << reason;
    gpu_ = std::make_unique<CudaBackend>(0);
    cpu_ = std::make_unique<backend_cpu::CpuBackend>(2);
  }
  CudaBackend& gpu() { return *gpu_; }
  // gpu<sdk::GemmFacet>().gemm(...): the facet as the host finds it (find_facet).
  template <class F>
  F& gpu() {
    return facet_of<F>(*gpu_);
  }
  backend_cpu::CpuBackend& cpu() { return *cpu_; }

  std::unique_ptr<CudaBackend> gpu_;
  std::unique_ptr<backend_cpu::CpuBackend> cpu_;
};

}  // namespace mixtrain::backend_cuda::testing
