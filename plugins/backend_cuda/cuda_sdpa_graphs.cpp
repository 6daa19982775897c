// SdpaGraphs (cuda_sdpa_graphs.h): cuDNN's SDPA forward and backward graphs through the cuDNN
// frontend. The frontend's JSON support is left out (CUDNN_FRONTEND_SKIP_JSON_LIB, set by CMake):
// nothing here serialises a graph, and the backend keeps to one JSON library.
#include "cuda_sdpa_graphs.h"

#include <cudnn_frontend.h>

#include <algorithm>
#include <exception>
#include <unordered_map>
#include <utility>

#include "cuda_access.h"

namespace mixtrain::backend_cuda {

namespace fe = cudnn_frontend;
using sdpa::Key;
using sdpa::Strided;

namespace {

// The variant pack's tensor ids.
enum Uid : std::int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

fe::DataType_t io_type(sdk::DType t) {
  return t == sdk::DType::fp16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

std::vector<std::int64_t> dims(const Strided& s) {
  return {s.dim.begin(), s.dim.end()};
}
std::vector<std::int64_t> strides(const Strided& s) {
  return {s.stride.begin(), s.stride.end()};
}

// sm > 0: the target architecture (sm_90: 90) instead of the current device's, which the frontend
// asks CUDA for while it validates (host_validate's graphs, built where no device is).
std::shared_ptr<fe::graph::Graph> new_graph(const Key& k, int sm) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io_type(k.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (sm > 0) g->set_sm_version(sm);
  return g;
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name,
                                                    std::int64_t uid, const Strided& s) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims(s)).set_stride(
          strides(s)));
}

void output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, std::int64_t uid,
            const Strided& s) {
  t->set_output(true).set_uid(uid).set_dim(dims(s)).set_stride(strides(s));
}

// q·kᵀ scaled, causal (top-left: query i sees keys j <= i), softmax with its statistics, ·v.
std::shared_ptr<fe::graph::Graph> forward_graph(const Key& k, int sm = 0) {
  auto g = new_graph(k, sm);
  auto q = input(*g, "q", kQ, sdpa::qkv_part(k, 0));
  auto kk = input(*g, "k", kK, sdpa::qkv_part(k, 1));
  auto v = input(*g, "v", kV, sdpa::qkv_part(k, 2));
  auto options = fe::graph::SDPA_attributes()
                     .set_name("flash_forward")
                     .set_generate_stats(true)
                     .set_attn_scale(k.scale)
                     .set_causal_mask(true);
  auto [o, stats] = g->sdpa(q, kk, v, options);
  output(o, kO, sdpa::token_major(k));
  output(stats, kStats, sdpa::stats(k));
  stats->set_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const Key& k, int sm = 0) {
  auto g = new_graph(k, sm);
  auto q = input(*g, "q", kQ, sdpa::qkv_part(k, 0));
  auto kk = input(*g, "k", kK, sdpa::qkv_part(k, 1));
  auto v = input(*g, "v", kV, sdpa::qkv_part(k, 2));
  auto o = input(*g, "o", kO, sdpa::token_major(k));
  auto dout = input(*g, "do", kDO, sdpa::token_major(k));
  auto stats = input(*g, "stats", kStats, sdpa::stats(k));
  stats->set_data_type(fe::DataType_t::FLOAT);
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("flash_backward")
                     .set_attn_scale(k.scale)
                     .set_causal_mask(true)
                     .set_deterministic_algorithm(k.deterministic);
  auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dout, stats, options);
  output(dq, kDQ, sdpa::qkv_part(k, 0));
  output(dk, kDK, sdpa::qkv_part(k, 1));
  output(dv, kDV, sdpa::qkv_part(k, 2));
  return g;
}

// The frontend's build steps, stopping at the first that fails: "" or "<step>: <cuDNN's text>".
std::string build(fe::graph::Graph& g, cudnnHandle_t handle) {
  auto step = [](const char* what, fe::error_t status) -> std::string {
    if (status.is_good()) return {};
    return std::string(what) + ": " + status.get_message();
  };
  std::string why = step("validate", g.validate());
  if (why.empty()) why = step("build_operation_graph", g.build_operation_graph(handle));
  if (why.empty())
    why = step("create_execution_plans", g.create_execution_plans({fe::HeurMode_t::A}));
  if (why.empty()) why = step("check_support", g.check_support());
  if (why.empty()) why = step("build_plans", g.build_plans());
  return why;
}

void* at(const void* base, std::int64_t elements, sdk::DType t) {
  return const_cast<char*>(static_cast<const char*>(base)) +
         elements * static_cast<std::int64_t>(sdk::dtype_size(t));
}

}  // namespace

struct SdpaGraphs::Impl {
  struct Entry {
    std::shared_ptr<fe::graph::Graph> forward, backward;
    std::int64_t workspace = 0;
    std::string why;  // not empty: declined
    std::int64_t runs = 0;
  };
  std::unordered_map<Key, Entry, sdpa::KeyHash> entries;

  Entry& get(const Key& k, cudnnHandle_t handle) {
    auto it = entries.find(k);
    if (it != entries.end()) return it->second;
    Entry e;
    // The frontend reports through error_t, but may also throw (an attribute it rejects while
    // the graph is assembled): either declines the key, remembered like a failed build.
    try {
      auto fwd = forward_graph(k);
      e.why = build(*fwd, handle);
      if (!e.why.empty()) {
        e.why = "forward graph, " + e.why;
      } else {
        auto bwd = backward_graph(k);
        e.why = build(*bwd, handle);
        if (!e.why.empty()) e.why = "backward graph, " + e.why;
        std::int64_t wf = 0, wb = 0;
        if (e.why.empty() && fwd->get_workspace_size(wf).is_good() &&
            bwd->get_workspace_size(wb).is_good()) {
          e.forward = std::move(fwd);
          e.backward = std::move(bwd);
          e.workspace = std::max(wf, wb);
        } else if (e.why.empty()) {
          e.why = "get_workspace_size failed";
        }
      }
    } catch (const std::exception& ex) {
      e = Entry{};
      e.why = std::string("the cuDNN frontend threw: ") + ex.what();
    }
    return entries.emplace(k, std::move(e)).first->second;
  }

  Entry& usable(const Key& k, cudnnHandle_t handle, const char* op) {
    Entry& e = get(k, handle);
    if (!e.why.empty())
      fail(op, "cuDNN declined flash attention for " + sdpa::key_text(k) + ": " + e.why,
           "run the attention unfused (node option fused = false); the host does so by itself "
           "for a shape the plan-time check (flash_refusal) declines");
    return e;
  }
};

SdpaGraphs::SdpaGraphs() : impl_(std::make_unique<Impl>()) {}
SdpaGraphs::~SdpaGraphs() = default;

std::string SdpaGraphs::host_validate(const Key& key, int sm) {
  try {
    fe::error_t f = forward_graph(key, sm)->validate();
    if (!f.is_good()) return "forward graph, validate: " + f.get_message();
    fe::error_t b = backward_graph(key, sm)->validate();
    if (!b.is_good()) return "backward graph, validate: " + b.get_message();
  } catch (const std::exception& ex) {
    return std::string("the cuDNN frontend threw: ") + ex.what();
  }
  return {};
}

std::string SdpaGraphs::refusal(const Key& key, cudnnHandle_t handle) {
  return impl_->get(key, handle).why;
}

std::int64_t SdpaGraphs::workspace_bytes(const Key& key, cudnnHandle_t handle, const char* op) {
  return impl_->usable(key, handle, op).workspace;
}

void SdpaGraphs::forward(const Key& key, cudnnHandle_t handle, const void* qkv, void* out,
                         float* lse, void* workspace, const char* op) {
  Impl::Entry& e = impl_->usable(key, handle, op);
  const sdk::DType t = key.dtype;
  std::unordered_map<std::int64_t, void*> pack{{kQ, at(qkv, sdpa::qkv_part(key, 0).offset, t)},
                                               {kK, at(qkv, sdpa::qkv_part(key, 1).offset, t)},
                                               {kV, at(qkv, sdpa::qkv_part(key, 2).offset, t)},
                                               {kO, out},
                                               {kStats, lse}};
  fe::error_t status = e.forward->execute(handle, pack, workspace);
  if (!status.is_good())
    fail(op,
         "cuDNN's SDPA forward failed for " + sdpa::key_text(key) + ": " + status.get_message());
  ++e.runs;
}

void SdpaGraphs::backward(const Key& key, cudnnHandle_t handle, const void* qkv, const void* out,
                          const void* dout, const float* lse, void* dqkv, void* workspace,
                          const char* op) {
  Impl::Entry& e = impl_->usable(key, handle, op);
  const sdk::DType t = key.dtype;
  std::unordered_map<std::int64_t, void*> pack{{kQ, at(qkv, sdpa::qkv_part(key, 0).offset, t)},
                                               {kK, at(qkv, sdpa::qkv_part(key, 1).offset, t)},
                                               {kV, at(qkv, sdpa::qkv_part(key, 2).offset, t)},
                                               {kO, const_cast<void*>(out)},
                                               {kDO, const_cast<void*>(dout)},
                                               {kStats, const_cast<float*>(lse)},
                                               {kDQ, at(dqkv, sdpa::qkv_part(key, 0).offset, t)},
                                               {kDK, at(dqkv, sdpa::qkv_part(key, 1).offset, t)},
                                               {kDV, at(dqkv, sdpa::qkv_part(key, 2).offset, t)}};
  fe::error_t status = e.backward->execute(handle, pack, workspace);
  if (!status.is_good())
    fail(op,
         "cuDNN's SDPA backward failed for " + sdpa::key_text(key) + ": " + status.get_message());
  ++e.runs;
}

std::vector<std::string> SdpaGraphs::report() const {
  std::vector<std::string> lines;
  for (const auto& [k, e] : impl_->entries)
    lines.push_back(sdpa::key_text(k) + ": " +
                    (e.why.empty() ? "workspace " + std::to_string(e.workspace) + " B, " +
                                         std::to_string(e.runs) + " runs"
                                   : "declined: " + e.why));
  std::sort(lines.begin(), lines.end());
  return lines;
}

}  // namespace mixtrain::backend_cuda
