// The core tests' CPU backend (one thread, shared by every test of a binary) and host copies of
// its tensors.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cpu_backend.h"
#include "forwarding_backend.h"
#include "mixtrain/core/graph/diagnostics.h"
#include "mixtrain/core/graph/model.h"
#include "mixtrain/sdk/backend_call_observer.h"
#include "mixtrain/sdk/support/backend_features.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::core::test_support {

inline std::shared_ptr<sdk::DeviceBackend> cpu() {
  static auto b = std::make_shared<backend_cpu::CpuBackend>(1);
  return b;
}

// The shared CPU backend's core, forwarded (forwarding_backend.h): a test backend derives from it
// and overrides find_facet to hide, replace or stand in for one facet.
class ForwardingBackend : public test::ForwardingBackend {
 public:
  ForwardingBackend() : test::ForwardingBackend(cpu()) {}
};

// The shared CPU backend listing sdk::kFeatureGemmBf16GeluUnfused or not, as asked, whatever this
// CPU's GEMMs are: a test of bf16 gelu epilogues means the same on every CPU.
class GeluFeatureBackend : public ForwardingBackend {
 public:
  explicit GeluFeatureBackend(bool gelu_unfused) : gelu_unfused_(gelu_unfused) {}
  sdk::BackendCapabilities capabilities() const override {
    auto caps = ForwardingBackend::capabilities();
    std::erase(caps.features, std::string(sdk::kFeatureGemmBf16GeluUnfused));
    if (gelu_unfused_) caps.features.emplace_back(sdk::kFeatureGemmBf16GeluUnfused);
    return caps;
  }

 private:
  bool gelu_unfused_;
};

// The shared CPU backend with a call observer (sdk/backend_call_observer.h) counting the facet
// calls by op name while `counting` is set, and the core's casts as "cast"; a facet in
// `stand_ins` (by name, not owned) is found in place of the CPU backend's. Its gelu epilogues are
// fused on every CPU (GeluFeatureBackend).
class CallCountingBackend final : public GeluFeatureBackend, public sdk::CallObserverFacet {
 public:
  CallCountingBackend() : GeluFeatureBackend(false) {}
  sdk::Facet* find_facet(std::string_view name) override {
    if (name == sdk::CallObserverFacet::kName) return static_cast<sdk::CallObserverFacet*>(this);
    if (const auto it = stand_ins.find(name); it != stand_ins.end()) return it->second;
    return in_->find_facet(name);
  }
  std::map<std::string_view, sdk::Facet*> stand_ins;
  void begin_facet_call() noexcept override {}
  void end_facet_call(std::string_view op) noexcept override {
    if (counting) ++calls[std::string(op)];
  }
  void cast(sdk::TensorView src, sdk::TensorView dst, const sdk::CastArgs& args = {}) override {
    if (counting) ++calls["cast"];
    GeluFeatureBackend::cast(src, dst, args);
  }
  // The calls of `op` counted so far.
  int count(std::string_view op) const {
    const auto it = calls.find(std::string(op));
    return it == calls.end() ? 0 : it->second;
  }
  bool counting = false;
  std::map<std::string, int> calls;
};

// The values of a device view, read as fp32.
inline std::vector<float> read(const sdk::TensorView& v) {
  std::vector<float> h(static_cast<std::size_t>(v.numel()));
  cpu()->copy_to_host(h.data(), v);
  return h;
}

inline void write(const sdk::TensorView& v, const std::vector<float>& h) {
  cpu()->copy_from_host(v, h.data());
}

// Central differences of the model's loss (on the batch already fed) against `analytic`, the
// gradient backward wrote for `p`: the largest |fd - analytic| and the largest |fd| (a check
// whose differences are all ~0 tests nothing). Leaves p's master as it found it.
struct FiniteDifference {
  double max_err = 0, max_ref = 0;
};
inline FiniteDifference finite_difference(Model& m, ModelParameter& p, std::int64_t rows,
                                          const std::vector<float>& analytic, float eps) {
  FiniteDifference r;
  auto values = read(p.master.view());
  auto loss_at = [&](std::size_t i, float v) {
    values[i] = v;
    write(p.master.view(), values);
    m.forward(rows);
    return static_cast<double>(m.loss(rows, 1.0f, false).loss);
  };
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float saved = values[i];
    const double lp = loss_at(i, saved + eps);
    const double lm = loss_at(i, saved - eps);
    values[i] = saved;
    write(p.master.view(), values);
    const double fd = (lp - lm) / (2.0 * eps);
    r.max_err = std::max(r.max_err, std::abs(fd - analytic[i]));
    r.max_ref = std::max(r.max_ref, std::abs(fd));
  }
  return r;
}

// Every parameter's gradient that backward wrote, in parameters() order (frozen ones have none).
inline std::vector<float> all_gradients(Model& m) {
  std::vector<float> all;
  for (auto* p : m.parameters()) {
    if (p->grad.empty()) continue;
    const auto g = read(p->grad.view());
    all.insert(all.end(), g.begin(), g.end());
  }
  return all;
}

// The gradients backward wrote for the parameters named, each against central differences of
// the loss on the batch already fed: within tol · max(1, the largest difference), and not all ~0.
inline void expect_finite_differences(Model& m, std::int64_t rows,
                                      const std::vector<std::string>& names, float eps,
                                      double tol) {
  int checked = 0;
  for (auto* p : m.parameters()) {
    if (std::find(names.begin(), names.end(), p->name) == names.end()) continue;
    SCOPED_TRACE(p->name);
    const auto fd = finite_difference(m, *p, rows, read(p->grad.view()), eps);
    EXPECT_GT(fd.max_ref, 1e-4) << "a gradient that is all ~0 checks nothing";
    EXPECT_LT(fd.max_err, tol * std::max(1.0, fd.max_ref));
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(names.size())) << "a name that is no parameter";
}

// A fused model's step, then the non-finite replay (which runs every fused pair apart), then the
// step again, from the batch already fed: the replay finds every tensor finite and leaves the
// gradients as the step wrote them, and the step after it gives the first one's loss and
// gradients. Returns the facet calls `backend` (the model's, counting) saw in the replay and in
// the step after it.
struct ReplayCalls {
  std::map<std::string, int> replay, step_after;
};
inline ReplayCalls replay_between_steps(Model& m, std::int64_t rows, CallCountingBackend& backend) {
  m.forward(rows);
  const float loss = m.loss(rows, 1.0f, true).loss;
  m.backward(rows);
  const std::vector<float> step = all_gradients(m);
  ReplayCalls calls;
  backend.calls.clear();
  EXPECT_EQ(locate_first_nonfinite(m, rows, 1.0f).where, "");
  calls.replay = backend.calls;
  EXPECT_EQ(all_gradients(m), step) << "the replay moved a gradient";
  backend.calls.clear();
  m.forward(rows);
  EXPECT_EQ(m.loss(rows, 1.0f, true).loss, loss) << "the step after the replay";
  m.backward(rows);
  calls.step_after = backend.calls;
  EXPECT_EQ(all_gradients(m), step) << "the step after the replay";
  return calls;
}

// A model node written in code: `op("linear", "fc1", {{"out", 6}})`.
struct OptionValueArg {
  std::string key;
  sdk::OptionValue value;
  OptionValueArg(std::string k, int v) : key(std::move(k)), value(std::int64_t{v}) {}
  OptionValueArg(std::string k, std::int64_t v) : key(std::move(k)), value(v) {}
  OptionValueArg(std::string k, double v) : key(std::move(k)), value(v) {}
  OptionValueArg(std::string k, bool v) : key(std::move(k)), value(v) {}
};
inline LayerSpec op(std::string type, std::string name, std::vector<OptionValueArg> options = {},
                    std::vector<std::string> inputs = {}, sdk::SourceLocation where = {}) {
  LayerSpec l;
  l.type = std::move(type);
  l.name = std::move(name);
  l.where = where;
  l.inputs = std::move(inputs);
  for (auto& o : options) l.options.push_back({o.key, o.value, where});
  return l;
}

// An op's plan with its weights, GEMM inputs, activations and activation gradients all in `d`.
inline sdk::OpPrecision uniform_precision(sdk::DType d) {
  sdk::OpPrecision p;
  p.weight = p.gemm_input = p.activation = p.activation_grad = d;
  return p;
}

}  // namespace mixtrain::core::test_support
