// A DeviceBackend that forwards its core to another: a test backend derives from it and overrides
// find_facet (by default the inner backend's answer) to hide, replace or stand in for one facet.
// SDK headers only, so a test plugin can use it as well as the core's tests.
#pragma once

#include <memory>
#include <string_view>
#include <utility>

#include "mixtrain/sdk/device_backend.h"

namespace mixtrain::test {

class ForwardingBackend : public sdk::DeviceBackend {
 public:
  explicit ForwardingBackend(std::shared_ptr<sdk::DeviceBackend> in) : in_(std::move(in)) {}

  sdk::BackendCapabilities capabilities() const override { return in_->capabilities(); }
  void* allocate(std::size_t bytes) override { return in_->allocate(bytes); }
  void deallocate(void* p) noexcept override { in_->deallocate(p); }
  sdk::MemoryStats memory_stats() const override { return in_->memory_stats(); }
  void copy_from_host(sdk::TensorView d, const void* s) override { in_->copy_from_host(d, s); }
  void copy_to_host(void* d, sdk::TensorView s) override { in_->copy_to_host(d, s); }
  void copy(sdk::TensorView d, sdk::TensorView s) override { in_->copy(d, s); }
  void synchronize() override { in_->synchronize(); }
  void cast(sdk::TensorView s, sdk::TensorView d, const sdk::CastArgs& a) override {
    in_->cast(s, d, a);
  }
  void fill(sdk::TensorView x, float v) override { in_->fill(x, v); }
  sdk::Facet* find_facet(std::string_view name) override { return in_->find_facet(name); }

 protected:
  std::shared_ptr<sdk::DeviceBackend> in_;
};

}  // namespace mixtrain::test
