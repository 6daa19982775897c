#include "cpu_eltwise.h"

#include <algorithm>

#include "cpu_access.h"

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
  if (act != sdk::Activation::gelu || x.numel() == 0) return false;
  if (x.dtype != dy.dtype || x.dtype != dx.dtype)
    return backward_mixed(dnnl::algorithm::eltwise_gelu_tanh, x, dy, dx);
  auto& prim = lookup(dnnl::algorithm::eltwise_gelu_tanh, x.dtype, x.numel(), true);
  if (!prim) return false;
  const auto md = flat(x.numel(), *dnnl_type(x.dtype));
  prim->execute(stream_, {{DNNL_ARG_SRC, memory(md, engine_, x.data)},
                          {DNNL_ARG_DIFF_DST, memory(md, engine_, dy.data)},
                          {DNNL_ARG_DIFF_SRC, memory(md, engine_, dx.data)}});
  stream_.wait();
  return true;
}

bool EltwiseEngine::backward_mixed(dnnl::algorithm alg, const sdk::TensorView& x,
                                   const sdk::TensorView& dy, const sdk::TensorView& dx) {
  const std::int64_t total = x.numel();
  const std::int64_t first = std::min(kMixedBlock, total), tail = total % kMixedBlock;
  auto& block_prim = lookup(alg, sdk::DType::fp32, first, true);
  if (!block_prim ||
      (tail != 0 && total > kMixedBlock && !lookup(alg, sdk::DType::fp32, tail, true)))
    return false;  // before anything is written
  const bool x32 = sdk::is_fp32_storage(x.dtype), dy32 = sdk::is_fp32_storage(dy.dtype);
  const bool dx32 = sdk::is_fp32_storage(dx.dtype);
  float* xs = x32 ? nullptr : x_block_.as<float>(static_cast<std::size_t>(first));
  // The gradient block: dy decoded, then dx computed over it in place; or, dy being fp32 and dx
  // not, dx's fp32 values before their rounding.
  float* gs = dy32 && dx32 ? nullptr : dy_block_.as<float>(static_cast<std::size_t>(first));
  for (std::int64_t b0 = 0; b0 < total; b0 += kMixedBlock) {
    const std::int64_t len = std::min(kMixedBlock, total - b0);
    // Decoding is exact (every narrow value is an fp32), so only dx's rounding is new.
#pragma omp parallel for schedule(static) if (parallel_worth(len))
    for (std::int64_t c0 = 0; c0 < len; c0 += kChunk) {
      const std::int64_t n = std::min(kChunk, len - c0);
      if (!x32) decode_into(x, b0 + c0, n, xs + c0);
      if (!dy32) decode_into(dy, b0 + c0, n, gs + c0);
    }
    const float* in = x32 ? x.as<const float>() + b0 : xs;
    const float* g = dy32 ? dy.as<const float>() + b0 : gs;
    float* out = dx32 ? dx.as<float>() + b0 : gs;
    const auto md = flat(len, memory::data_type::f32);
    auto& prim = *lookup(alg, sdk::DType::fp32, len, true);
    prim.execute(stream_, {{DNNL_ARG_SRC, memory(md, engine_, const_cast<float*>(in))},
                           {DNNL_ARG_DIFF_DST, memory(md, engine_, const_cast<float*>(g))},
                           {DNNL_ARG_DIFF_SRC, memory(md, engine_, out)}});
    stream_.wait();
    if (dx32) continue;
#pragma omp parallel for schedule(static) if (parallel_worth(len))
    for (std::int64_t c0 = 0; c0 < len; c0 += kChunk)
      commit_chunk(dx, b0 + c0, std::min(kChunk, len - c0), gs + c0);
  }
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
