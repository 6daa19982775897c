// ReferenceBackend: the smallest DeviceBackend worth writing — host memory, FP32 only, and one
// facet (GemmFacet) as a plain triple loop. A sample of the SDK's two layers: the required core
// every backend implements, and a facet object it offers by name (docs/writing-plugins.md).
//
// Contract
// - Memory is host memory, 64-byte aligned; memory_stats counts it.
// - Tensors: fp32 only (cast accepts fp32 -> fp32); anything else raises sdk::BackendError.
// - Facets: find_facet("gemm") returns the GemmFacet object this backend owns; every other name
//   is nullptr, so a model needing more stops at plan time naming what is missing.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/device_backend.h"
#include "mixtrain/sdk/plugin.h"

namespace reference {

// GemmFacet: C = alpha·op(A)·op(B) + beta·C (+ bias, then the activation), FP32 only.
class ReferenceGemm final : public mixtrain::sdk::GemmFacet {
 public:
  bool supports(mixtrain::sdk::GemmOp op,
                std::span<const mixtrain::sdk::DType> dtypes) const override;
  void gemm(const mixtrain::sdk::GemmArgs& args) override;
  void gemm_strided_batched(const mixtrain::sdk::GemmBatchedArgs& args) override;
};

class ReferenceBackend final : public mixtrain::sdk::DeviceBackend {
 public:
  ReferenceBackend(const mixtrain::sdk::Options& options,
                   const mixtrain::sdk::PluginContext& context);

  mixtrain::sdk::BackendCapabilities capabilities() const override;
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr) noexcept override;
  mixtrain::sdk::MemoryStats memory_stats() const override { return stats_; }
  void copy_from_host(mixtrain::sdk::TensorView dst, const void* src) override;
  void copy_to_host(void* dst, mixtrain::sdk::TensorView src) override;
  void copy(mixtrain::sdk::TensorView dst, mixtrain::sdk::TensorView src) override;
  void synchronize() override {}
  void cast(mixtrain::sdk::TensorView src, mixtrain::sdk::TensorView dst,
            const mixtrain::sdk::CastArgs& args) override;
  void fill(mixtrain::sdk::TensorView x, float value) override;
  mixtrain::sdk::Facet* find_facet(std::string_view name) override;

 private:
  mixtrain::sdk::MemoryStats stats_;
  ReferenceGemm gemm_;
};

}  // namespace reference
