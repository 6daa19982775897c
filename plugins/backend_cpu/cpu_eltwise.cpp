#include "cpu_eltwise.h"

namespace mixtrain::backend_cpu {

using dnnl::memory;

namespace {

std::optional<memory::data_type> dnnl_type(sdk::DType t) {
  switch (t) {
    case sdk::DType::fp32: return memory::data_type::f32;
    case sdk::DType::bf16: return memory::data_type::bf16;
    default: return std::nullopt;  // fp16 eltwise is not in oneDNN 2.6 on CPU
  }
}

memory::desc flat(std::int64_t numel, memory::data_type dt) {
  return memory::desc({numel}, dt, memory::format_tag::a);
}

}  // namespace

EltwiseEngine::EltwiseEngine() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

std::optional<dnnl::primitive>& EltwiseEngine::lookup(dnnl::algorithm alg, sdk::DType dtype,
                                                      std::int64_t numel, bool backward) {
  const Key key{static_cast<int>(alg), static_cast<int>(dtype), numel, backward};
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  std::optional<dnnl::primitive> prim;
  if (auto dt = dnnl_type(dtype)) {
    try {
      const auto md = flat(numel, *dt);
      const dnnl::eltwise_forward::primitive_desc fwd_pd(
          dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, alg, md, 0.0f, 0.0f),
          engine_);
      if (!backward) {
        prim = dnnl::eltwise_forward(fwd_pd);
      } else {
        const dnnl::eltwise_backward::primitive_desc bwd_pd(
            dnnl::eltwise_backward::desc(alg, md, md, 0.0f, 0.0f), engine_, fwd_pd);
        prim = dnnl::eltwise_backward(bwd_pd);
      }
    } catch (const dnnl::error&) {
      prim.reset();  // the portable kernel takes over
    }
  }
  return cache_.emplace(key, std::move(prim)).first->second;
}

bool EltwiseEngine::try_forward(sdk::Activation act, const sdk::TensorView& x,
                                const sdk::TensorView& y) {
  // GELU only: oneDNN's eltwise_relu turns NaN into 0 (and its backward passes dy where x is
  // NaN), which would hide an overflow from the non-finite check.
  if (act != sdk::Activation::gelu || x.dtype != y.dtype || x.numel() == 0) return false;
  auto& prim = lookup(dnnl::algorithm::eltwise_gelu_tanh, x.dtype, x.numel(), false);
  if (!prim) return false;
  const auto md = flat(x.numel(), *dnnl_type(x.dtype));
  prim->execute(stream_, {{DNNL_ARG_SRC, memory(md, engine_, x.data)},
                          {DNNL_ARG_DST, memory(md, engine_, y.data)}});
  stream_.wait();
  return true;
}

bool EltwiseEngine::try_backward(sdk::Activation act, const sdk::TensorView& x,
                                 const sdk::TensorView& dy, const sdk::TensorView& dx) {
  if (act != sdk::Activation::gelu || x.dtype != dy.dtype || x.dtype != dx.dtype || x.numel() == 0)
    return false;
  auto& prim = lookup(dnnl::algorithm::eltwise_gelu_tanh, x.dtype, x.numel(), true);
  if (!prim) return false;
  const auto md = flat(x.numel(), *dnnl_type(x.dtype));
  prim->execute(stream_, {{DNNL_ARG_SRC, memory(md, engine_, x.data)},
                          {DNNL_ARG_DIFF_DST, memory(md, engine_, dy.data)},
                          {DNNL_ARG_DIFF_SRC, memory(md, engine_, dx.data)}});
  stream_.wait();
  return true;
}

bool EltwiseEngine::try_exp(float* x, std::int64_t numel) {
  if (numel == 0) return false;
  auto& prim = lookup(dnnl::algorithm::eltwise_exp, sdk::DType::fp32, numel, false);
  if (!prim) return false;
  const auto md = flat(numel, memory::data_type::f32);
  const memory m(md, engine_, x);
  prim->execute(stream_, {{DNNL_ARG_SRC, m}, {DNNL_ARG_DST, m}});
  stream_.wait();
  return true;
}

}  // namespace mixtrain::backend_cpu
