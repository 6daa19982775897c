// Parameters living in a CpuBackend for the optimizer tests: fp32 master and grad tensors
// allocated through the backend, filled from and read back into host vectors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cpu_backend.h"
#include "mixtrain/sdk/optimizer.h"

namespace mixtrain::test {

class CpuParams {
 public:
  explicit CpuParams(backend_cpu::CpuBackend& backend) : backend_(backend) {}
  ~CpuParams() {
    for (void* p : owned_) backend_.deallocate(p);
  }
  CpuParams(const CpuParams&) = delete;
  CpuParams& operator=(const CpuParams&) = delete;

  void add(const std::string& name, const std::vector<float>& master,
           const std::vector<float>& grad, bool weight_decay = true) {
    sdk::Parameter p;
    p.name = name;
    p.weight_decay = weight_decay;
    p.tensors.master = tensor(master);
    p.tensors.grad = tensor(grad);
    params_.push_back(p);
  }

  sdk::TensorView tensor(const std::vector<float>& values) {
    sdk::TensorView v{nullptr, sdk::DType::fp32,
                      sdk::Shape{static_cast<std::int64_t>(values.size())}};
    v.data = backend_.allocate(v.bytes());
    owned_.push_back(v.data);
    backend_.copy_from_host(v, values.data());
    return v;
  }

  std::vector<float> read(sdk::TensorView v) const {
    std::vector<float> out(static_cast<std::size_t>(v.numel()));
    backend_.copy_to_host(out.data(), v);
    return out;
  }
  std::vector<float> master(std::size_t i) const { return read(params_[i].tensors.master); }
  void set_grad(std::size_t i, const std::vector<float>& g) {
    backend_.copy_from_host(params_[i].tensors.grad, g.data());
  }
  void set_master(std::size_t i, const std::vector<float>& m) {
    backend_.copy_from_host(params_[i].tensors.master, m.data());
  }

  const std::vector<sdk::Parameter>& params() const { return params_; }

 private:
  backend_cpu::CpuBackend& backend_;
  std::vector<sdk::Parameter> params_;
  std::vector<void*> owned_;
};

// |a - b| <= 1e-6 * max(1, |b|) elementwise: the backend may fuse multiply-adds.
#define EXPECT_FLOATS_NEAR(actual, expected)                                      \
  do {                                                                            \
    const auto& a_ = (actual);                                                    \
    const auto& e_ = (expected);                                                  \
    ASSERT_EQ(a_.size(), e_.size());                                              \
    for (std::size_t i_ = 0; i_ < a_.size(); ++i_)                                \
      EXPECT_NEAR(a_[i_], e_[i_], 1e-6 * std::max(1.0, std::abs(double(e_[i_])))) \
          << "element " << i_;                                                    \
  } while (0)

}  // namespace mixtrain::test
