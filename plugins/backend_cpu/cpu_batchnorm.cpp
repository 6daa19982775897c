// Batch norm (training forward, inference forward, backward) on oneDNN's batch_normalization.
//
// - Data: x, y, dy, dx [rows, C] (rows = N·H·W of channels-last images) are described to oneDNN
//   as nhwc {rows, C, 1, 1}: per-channel statistics over every row, the caller's memory as is.
// - Statistics are FP32 whatever the activations: oneDNN writes the batch mean and the biased
//   variance straight into save_mean / save_var; the backward reads them back.
// - dtypes: fp32 natively; bf16 natively in oneDNN's bf16 batch norm (f32 statistics and math,
//   y / dx rounded to bf16 by oneDNN, RNE) unless oneDNN has only a reference kernel for it; fp16
//   (and that fallback) through fp32 scratch: exact decode, fp32 batch norm, one RNE encode.
// - Affine: gamma and beta are oneDNN's scale and shift (use_scale | use_shift); both empty means
//   not affine. dgamma / dbeta are diff_scale / diff_shift, written in place or added.
// - Fused ReLU: fuse_norm_relu. The training forward leaves oneDNN's ReLU bit mask in the caller's
//   workspace (batchnorm_workspace_bytes), or in scratch when none is given; the backward reads
//   the workspace, or, without one, masks dy where y is not positive into scratch and runs the
//   plain backward (the same gradient: y > 0 exactly where the normalised value is).
// - Running statistics (PyTorch's BatchNorm2d): r = (1 − momentum)·r + momentum·s, with the
//   unbiased variance s = var·rows/(rows − 1) for running_var, computed in double and rounded
//   once to fp32. As in PyTorch, training needs more than one row.
// - Primitives are cached per (op, rows, C, eps, dtype, affine, relu) in the PrimitiveCache.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

#include "cpu_access.h"
#include "cpu_backend.h"
#include "cpu_primitive_cache.h"

namespace mixtrain::backend_cpu {

using dnnl::memory;
using sdk::DType;
using sdk::TensorView;
using Slot = PrimitiveCache::Slot;
using Flags = dnnl::normalization_flags;

namespace {

enum Tag : std::int64_t { kBnTraining = 20, kBnInference = 21, kBnBackward = 22 };

struct BnEntry {
  dnnl::primitive primitive;
  memory::desc data_md, stat_md, ws_md;
  std::string implementation;
};

Flags flags_of(bool affine, bool relu) {
  Flags f = Flags::none;
  if (affine) f = f | Flags::use_scale | Flags::use_shift;
  if (relu) f = f | Flags::fuse_norm_relu;
  return f;
}

memory::desc data_md(const sdk::BatchNormShape& s, memory::data_type dt) {
  return memory::desc({s.rows, s.channels, 1, 1}, dt, memory::format_tag::nhwc);
}

PrimitiveCache::Key key_of(Tag tag, const sdk::BatchNormShape& s, memory::data_type dt, bool affine,
                           bool relu) {
  return {
      tag,    s.rows, s.channels, std::bit_cast<std::int32_t>(s.eps), static_cast<std::int64_t>(dt),
      affine, relu};
}

dnnl::batch_normalization_forward::primitive_desc forward_pd(const dnnl::engine& engine,
                                                             const sdk::BatchNormShape& s,
                                                             memory::data_type dt, bool affine,
                                                             bool relu, bool training) {
  Flags f = flags_of(affine, relu);
  if (!training) f = f | Flags::use_global_stats;
  return {{training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference,
           data_md(s, dt), s.eps, f},
          engine};
}

[[noreturn]] void creation_failed(std::string_view op, const sdk::BatchNormShape& s,
                                  const dnnl::error& e) {
  fail(op,
       "oneDNN cannot create a batch norm over " + std::to_string(s.rows) + " rows of " +
           std::to_string(s.channels) + " channels: " + e.what(),
       "report this shape");
}

BnEntry& forward_entry(PrimitiveCache& cache, std::string_view op, const sdk::BatchNormShape& s,
                       memory::data_type dt, bool affine, bool relu, bool training) {
  return cache.get<BnEntry>(
      key_of(training ? kBnTraining : kBnInference, s, dt, affine, relu), [&] {
        try {
          const auto pd = forward_pd(cache.engine(), s, dt, affine, relu, training);
          return BnEntry{dnnl::batch_normalization_forward(pd), pd.src_desc(), pd.mean_desc(),
                         pd.workspace_desc(), pd.impl_info_str()};
        } catch (const dnnl::error& err) {
          creation_failed(op, s, err);
        }
      });
}

BnEntry& backward_entry(PrimitiveCache& cache, std::string_view op, const sdk::BatchNormShape& s,
                        memory::data_type dt, bool affine, bool relu) {
  return cache.get<BnEntry>(key_of(kBnBackward, s, dt, affine, relu), [&] {
    try {
      const auto hint = forward_pd(cache.engine(), s, dt, affine, relu, true);
      const dnnl::batch_normalization_backward::primitive_desc pd(
          {affine ? dnnl::prop_kind::backward : dnnl::prop_kind::backward_data, data_md(s, dt),
           data_md(s, dt), s.eps, flags_of(affine, relu)},
          cache.engine(), hint);
      return BnEntry{dnnl::batch_normalization_backward(pd), pd.src_desc(), pd.mean_desc(),
                     pd.workspace_desc(), pd.impl_info_str()};
    } catch (const dnnl::error& err) {
      creation_failed(op, s, err);
    }
  });
}

// bf16 natively unless oneDNN's bf16 batch norm is a reference kernel; fp32 storage natively;
// fp16 (and that fallback) in fp32.
memory::data_type bn_type(PrimitiveCache& cache, std::string_view op, const sdk::BatchNormShape& s,
                          DType dtype, bool affine, bool relu) {
  if (dtype != DType::bf16) return memory::data_type::f32;
  const auto& e = forward_entry(cache, op, s, memory::data_type::bf16, affine, relu, true);
  return is_reference_kernel(e.implementation) ? memory::data_type::f32 : memory::data_type::bf16;
}

// The arguments of a forward (training or inference): data, the statistics it writes or reads,
// and scale / shift when affine.
std::unordered_map<int, memory> forward_args(PrimitiveCache& cache, BnEntry& e, const void* src,
                                             void* dst, const TensorView& mean,
                                             const TensorView& var, const TensorView& gamma,
                                             const TensorView& beta, bool affine) {
  std::unordered_map<int, memory> exec{{DNNL_ARG_SRC, cache.wrap(e.data_md, src)},
                                       {DNNL_ARG_DST, cache.wrap(e.data_md, dst)},
                                       {DNNL_ARG_MEAN, cache.wrap(e.stat_md, mean.data)},
                                       {DNNL_ARG_VARIANCE, cache.wrap(e.stat_md, var.data)}};
  if (affine) {
    exec.emplace(DNNL_ARG_SCALE, cache.wrap(e.stat_md, gamma.data));
    exec.emplace(DNNL_ARG_SHIFT, cache.wrap(e.stat_md, beta.data));
  }
  return exec;
}

void check_shape(std::string_view op, const sdk::BatchNormShape& s) {
  if (s.rows < 1 || s.channels < 1)
    fail(op,
         "shape rows = " + std::to_string(s.rows) + ", channels = " + std::to_string(s.channels) +
             " must both be at least 1",
         "rows = N·H·W of the channels-last activations, channels = C");
  if (!(s.eps >= 0.0f))
    fail(op, "eps = " + std::to_string(s.eps) + " must be non-negative", "use eps = 1e-5");
}

void check_data(std::string_view op, std::string_view name, const TensorView& v,
                const sdk::BatchNormShape& s) {
  require_storage(op, name, v);
  if (v.numel() != checked_product(op, name, {s.rows, s.channels}) || v.shape.cols() != s.channels)
    fail(op,
         std::string(name) + " is " + describe(v) + " but the shape expects [rows, C] = [" +
             std::to_string(s.rows) + ", " + std::to_string(s.channels) +
             "] (or [N, H, W, C] with N·H·W = rows)",
         "batch norm takes channels-last activations");
}

void check_same_dtype(std::string_view op, std::string_view a_name, const TensorView& a,
                      std::string_view b_name, const TensorView& b) {
  if (a.dtype != b.dtype && !(is_fp32_storage(a.dtype) && is_fp32_storage(b.dtype)))
    fail(op,
         std::string(a_name) + " is " + describe(a) + " but " + std::string(b_name) + " is " +
             describe(b) + "; batch norm keeps one activation dtype",
         "cast one of them");
}

void check_channel_vector(std::string_view op, std::string_view name, const TensorView& v,
                          std::int64_t channels) {
  require_fp32(op, name, v);
  require_numel(op, name, v, channels);
}

// Whether gamma and beta make the norm affine (both given) or not (both empty).
bool affine_of(std::string_view op, const TensorView& gamma, const TensorView& beta,
               std::int64_t channels) {
  if (gamma.empty() != beta.empty())
    fail(op, "gamma and beta must be both given (affine) or both empty (not affine)",
         "pass both parameters or neither");
  if (gamma.empty()) return false;
  check_channel_vector(op, "gamma", gamma, channels);
  check_channel_vector(op, "beta", beta, channels);
  return true;
}

void check_workspace(std::string_view op, const TensorView& ws, std::size_t bytes) {
  require_bytes(
      op, "workspace", ws, bytes,
      "allocate batchnorm_workspace_bytes(shape, dtype) bytes and pass the same workspace to "
      "the training forward and the backward");
}

}  // namespace

std::size_t CpuBackend::batchnorm_workspace_bytes(const sdk::BatchNormShape& shape, DType x) const {
  constexpr std::string_view op = "batchnorm_workspace_bytes";
  check_shape(op, shape);
  if (!shape.relu) return 0;
  if (!is_storage_float(x))
    fail(op, "x dtype " + std::string(sdk::dtype_name(x)) + " is not supported",
         "batch norm takes fp32, bf16 or fp16 activations");
  use_threads();
  // The mask does not depend on affine; ask the affine primitive (what layers use).
  const auto dt = bn_type(*prims_, op, shape, x, true, true);
  return forward_entry(*prims_, op, shape, dt, true, true, true).ws_md.get_size();
}

void CpuBackend::batchnorm_forward_training(TensorView x, TensorView gamma, TensorView beta,
                                            const sdk::BatchNormShape& shape, float momentum,
                                            TensorView y, TensorView save_mean, TensorView save_var,
                                            TensorView running_mean, TensorView running_var,
                                            TensorView workspace) {
  constexpr std::string_view op = "batchnorm_forward_training";
  use_threads();
  check_shape(op, shape);
  const std::int64_t c = shape.channels;
  check_data(op, "x", x, shape);
  check_data(op, "y", y, shape);
  check_same_dtype(op, "x", x, "y", y);
  require_same_or_disjoint(op, "x", x, "y", y);
  const bool affine = affine_of(op, gamma, beta, c);
  check_channel_vector(op, "save_mean", save_mean, c);
  check_channel_vector(op, "save_var", save_var, c);
  if (!running_mean.empty()) check_channel_vector(op, "running_mean", running_mean, c);
  if (!running_var.empty()) check_channel_vector(op, "running_var", running_var, c);
  if (shape.rows < 2)
    fail(op, "training needs more than one value per channel (rows = 1)",
         "use a batch of at least two, or the inference forward");

  const auto dt = bn_type(*prims_, op, shape, x.dtype, affine, shape.relu);
  BnEntry& e = forward_entry(*prims_, op, shape, dt, affine, shape.relu, true);
  const void* src = as_input(*prims_, x, dt, Slot::src);
  void* dst = as_output(*prims_, y, dt, Slot::dst);
  auto exec = forward_args(*prims_, e, src, dst, save_mean, save_var, gamma, beta, affine);
  if (shape.relu) {
    const std::size_t bytes = e.ws_md.get_size();
    void* ws = workspace.data;
    if (workspace.empty())
      ws = prims_->scratch<char>(Slot::extra_b, bytes);  // nobody reads it: backward uses y
    else
      check_workspace(op, workspace, bytes);
    exec.emplace(DNNL_ARG_WORKSPACE, prims_->wrap(e.ws_md, ws));
  }
  prims_->execute(e.primitive, exec);
  if (dst != y.data) encode_tensor(y, static_cast<const float*>(dst), y.numel());

  const double m = momentum;
  const double unbiased = static_cast<double>(shape.rows) / static_cast<double>(shape.rows - 1);
  const float* mean = save_mean.as<const float>();
  const float* var = save_var.as<const float>();
  for (std::int64_t j = 0; j < c; ++j) {
    if (!running_mean.empty()) {
      float& r = running_mean.as<float>()[j];
      r = static_cast<float>((1.0 - m) * r + m * mean[j]);
    }
    if (!running_var.empty()) {
      float& r = running_var.as<float>()[j];
      r = static_cast<float>((1.0 - m) * r + m * unbiased * var[j]);
    }
  }
  account_scratch();
}

void CpuBackend::batchnorm_forward_inference(TensorView x, TensorView gamma, TensorView beta,
                                             TensorView running_mean, TensorView running_var,
                                             const sdk::BatchNormShape& shape, TensorView y) {
  constexpr std::string_view op = "batchnorm_forward_inference";
  use_threads();
  check_shape(op, shape);
  const std::int64_t c = shape.channels;
  check_data(op, "x", x, shape);
  check_data(op, "y", y, shape);
  check_same_dtype(op, "x", x, "y", y);
  require_same_or_disjoint(op, "x", x, "y", y);
  const bool affine = affine_of(op, gamma, beta, c);
  check_channel_vector(op, "running_mean", running_mean, c);
  check_channel_vector(op, "running_var", running_var, c);

  const auto dt = bn_type(*prims_, op, shape, x.dtype, affine, shape.relu);
  BnEntry& e = forward_entry(*prims_, op, shape, dt, affine, shape.relu, false);
  const void* src = as_input(*prims_, x, dt, Slot::src);
  void* dst = as_output(*prims_, y, dt, Slot::dst);
  auto exec = forward_args(*prims_, e, src, dst, running_mean, running_var, gamma, beta, affine);
  prims_->execute(e.primitive, exec);
  if (dst != y.data) encode_tensor(y, static_cast<const float*>(dst), y.numel());
  account_scratch();
}

void CpuBackend::batchnorm_backward(TensorView dy, TensorView x, TensorView y, TensorView gamma,
                                    TensorView save_mean, TensorView save_var,
                                    const sdk::BatchNormShape& shape, TensorView workspace,
                                    TensorView dx, TensorView dgamma, TensorView dbeta,
                                    bool accumulate) {
  constexpr std::string_view op = "batchnorm_backward";
  use_threads();
  check_shape(op, shape);
  const std::int64_t c = shape.channels;
  check_data(op, "dy", dy, shape);
  check_data(op, "x", x, shape);
  check_data(op, "dx", dx, shape);
  check_same_dtype(op, "x", x, "dy", dy);
  check_same_dtype(op, "x", x, "dx", dx);
  require_same_or_disjoint(op, "dy", dy, "dx", dx);
  check_channel_vector(op, "save_mean", save_mean, c);
  check_channel_vector(op, "save_var", save_var, c);
  const bool affine = !gamma.empty();
  if (affine) check_channel_vector(op, "gamma", gamma, c);
  if (!dgamma.empty()) check_channel_vector(op, "dgamma", dgamma, c);
  if (!dbeta.empty()) check_channel_vector(op, "dbeta", dbeta, c);
  if (!affine && (!dgamma.empty() || !dbeta.empty()))
    fail(op, "dgamma / dbeta were given but gamma is empty (the norm is not affine)",
         "pass gamma for an affine norm, or no dgamma and dbeta");
  // The fused ReLU reads oneDNN's mask from the workspace; without one, dy is masked by y here.
  const bool use_ws = shape.relu && !workspace.empty();
  const bool mask_by_y = shape.relu && workspace.empty();
  if (mask_by_y) {
    if (y.empty())
      fail(op, "the fused ReLU's backward needs the forward's workspace or y",
           "pass the workspace filled by batchnorm_forward_training, or y");
    check_data(op, "y", y, shape);
    check_same_dtype(op, "x", x, "y", y);
  }

  const auto dt = bn_type(*prims_, op, shape, x.dtype, affine, shape.relu);
  BnEntry& e = backward_entry(*prims_, op, shape, dt, affine, use_ws);
  const void* src = as_input(*prims_, x, dt, Slot::src);
  const void* diff_dst = as_input(*prims_, dy, dt, Slot::weights);
  const std::int64_t n = dy.numel();
  if (mask_by_y) {
    // dy where y > 0, else 0, in the dtype the primitive reads.
    if (dt == memory::data_type::bf16) {
      auto* masked = prims_->scratch<std::uint16_t>(Slot::extra_b, static_cast<std::size_t>(n));
      const auto* g = dy.as<const std::uint16_t>();
#pragma omp parallel for schedule(static) if (parallel_worth(n))
      for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
        const std::int64_t len = std::min(kChunk, n - c0);
        float buf[kChunk];
        const float* yv = read_chunk(y, c0, len, buf);
        for (std::int64_t i = 0; i < len; ++i)
          masked[c0 + i] = yv[i] > 0.0f ? g[c0 + i] : std::uint16_t{0};
      }
      diff_dst = masked;
    } else {
      auto* masked = prims_->scratch<float>(Slot::extra_b, static_cast<std::size_t>(n));
      const auto* g = static_cast<const float*>(diff_dst);
#pragma omp parallel for schedule(static) if (parallel_worth(n))
      for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
        const std::int64_t len = std::min(kChunk, n - c0);
        float buf[kChunk];
        const float* yv = read_chunk(y, c0, len, buf);
        for (std::int64_t i = 0; i < len; ++i) masked[c0 + i] = yv[i] > 0.0f ? g[c0 + i] : 0.0f;
      }
      diff_dst = masked;
    }
  }
  void* diff_src = as_output(*prims_, dx, dt, Slot::dst);
  std::unordered_map<int, memory> exec{{DNNL_ARG_SRC, prims_->wrap(e.data_md, src)},
                                       {DNNL_ARG_DIFF_DST, prims_->wrap(e.data_md, diff_dst)},
                                       {DNNL_ARG_MEAN, prims_->wrap(e.stat_md, save_mean.data)},
                                       {DNNL_ARG_VARIANCE, prims_->wrap(e.stat_md, save_var.data)},
                                       {DNNL_ARG_DIFF_SRC, prims_->wrap(e.data_md, diff_src)}};
  float* diff_scale = nullptr;
  float* diff_shift = nullptr;
  if (affine) {
    // In place when overwriting, else into scratch (added below, or dropped when not asked for).
    float* tmp = prims_->scratch<float>(Slot::extra_a, static_cast<std::size_t>(2 * c));
    diff_scale = !dgamma.empty() && !accumulate ? dgamma.as<float>() : tmp;
    diff_shift = !dbeta.empty() && !accumulate ? dbeta.as<float>() : tmp + c;
    exec.emplace(DNNL_ARG_SCALE, prims_->wrap(e.stat_md, gamma.data));
    // oneDNN 2.6's backward with use_shift refuses to run without a shift argument, which its
    // math never reads (the ReLU mask comes from the workspace); the SDK passes no beta here, so
    // gamma stands in (read-only).
    exec.emplace(DNNL_ARG_SHIFT, prims_->wrap(e.stat_md, gamma.data));
    exec.emplace(DNNL_ARG_DIFF_SCALE, prims_->wrap(e.stat_md, diff_scale));
    exec.emplace(DNNL_ARG_DIFF_SHIFT, prims_->wrap(e.stat_md, diff_shift));
  }
  if (use_ws) {
    check_workspace(op, workspace, e.ws_md.get_size());
    exec.emplace(DNNL_ARG_WORKSPACE, prims_->wrap(e.ws_md, workspace.data));
  }
  prims_->execute(e.primitive, exec);
  if (diff_src != dx.data) encode_tensor(dx, static_cast<const float*>(diff_src), dx.numel());
  if (affine && accumulate) {
    for (std::int64_t j = 0; j < c; ++j) {
      if (!dgamma.empty()) dgamma.as<float>()[j] += diff_scale[j];
      if (!dbeta.empty()) dbeta.as<float>()[j] += diff_shift[j];
    }
  }
  account_scratch();
}

}  // namespace mixtrain::backend_cpu
