// CpuBackend mixed-precision machinery (fused unscale + finite check, sum of squares, first
// non-finite) and the fused SGD / AdamW updates. Each works on a flat list of pieces (tensor,
// range) so many small parameters and a few huge ones share one parallel region, and each
// element is read and written exactly once per call. The low-precision working copy of a piece
// is refreshed right after its update, while the piece is still in cache, by the SDK's bulk
// (vectorised, RNE) encoder: the one definition of bf16/fp16 in the project.
#include <omp.h>

#include <bit>
#include <cmath>
#include <vector>

#include "cpu_access.h"
#include "cpu_backend.h"

namespace mixtrain::backend_cpu {

using sdk::DType;
using sdk::TensorView;

namespace {

constexpr std::int64_t kPiece = 1 << 15;

struct Piece {
  std::size_t tensor;
  std::int64_t begin;
  std::int64_t len;
};

std::int64_t total_len(const std::vector<Piece>& pieces) {
  std::int64_t n = 0;
  for (const Piece& p : pieces) n += p.len;
  return n;
}

// working[b, b+len) = master[b, b+len) in the working dtype (fp32 storage: a copy).
void refresh_working(const sdk::ParamTensors& t, std::int64_t b, std::int64_t len) {
  if (t.working.empty()) return;
  commit_chunk(t.working, b, len, t.master.as<const float>() + b);
}

template <class NumelOf>
std::vector<Piece> split(std::size_t count, NumelOf numel_of) {
  std::vector<Piece> pieces;
  for (std::size_t t = 0; t < count; ++t) {
    const std::int64_t n = numel_of(t);
    for (std::int64_t b = 0; b < n; b += kPiece) pieces.push_back({t, b, std::min(kPiece, n - b)});
  }
  return pieces;
}

inline int nonfinite_flag(float v) {
  return static_cast<int>((std::bit_cast<std::uint32_t>(v) & 0x7F800000u) == 0x7F800000u);
}

void validate_param(std::string_view op, std::size_t i, const sdk::ParamTensors& p,
                    bool need_state1, bool need_state2) {
  checks().optimizer_param(op, i, p, need_state1, need_state2);
}

// The template flag keeps the loop body free of control flow so it vectorises.
template <bool kMomentum>
void sgd_piece(const sdk::SgdHyper& h, const sdk::ParamTensors& t, std::int64_t b,
               std::int64_t len) {
  float* p = t.master.as<float>() + b;
  const float* grad = t.grad.as<const float>() + b;
  float* buf = kMomentum ? t.state1.as<float>() + b : nullptr;
  const float lr = h.lr, wd = h.weight_decay, mom = h.momentum, damp = 1.0f - h.dampening;
  const float gs = h.grad_scale;
  const bool nesterov = h.nesterov, first = h.first_step;
#pragma omp simd
  for (std::int64_t i = 0; i < len; ++i) {
    float g = grad[i] * gs + wd * p[i];
    if constexpr (kMomentum) {
      const float m = first ? g : mom * buf[i] + damp * g;
      buf[i] = m;
      g = nesterov ? g + mom * m : m;
    }
    p[i] = p[i] - lr * g;
  }
  refresh_working(t, b, len);
}

void adamw_piece(const sdk::AdamWHyper& h, float decay, float step_size, float bc2_sqrt,
                 const sdk::ParamTensors& t, std::int64_t b, std::int64_t len) {
  float* p = t.master.as<float>() + b;
  const float* grad = t.grad.as<const float>() + b;
  float* m = t.state1.as<float>() + b;
  float* v = t.state2.as<float>() + b;
  const float b1 = h.beta1, b2 = h.beta2, eps = h.eps, gs = h.grad_scale;
  const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;
#pragma omp simd
  for (std::int64_t i = 0; i < len; ++i) {
    const float g = grad[i] * gs;
    const float mi = b1 * m[i] + one_minus_b1 * g;
    const float vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * mi / denom;
  }
  refresh_working(t, b, len);
}

}  // namespace

bool CpuBackend::unscale_and_check_finite(std::span<const TensorView> grads, float inv_scale) {
  use_threads();
  for (std::size_t i = 0; i < grads.size(); ++i)
    require_fp32("unscale_and_check_finite", "grads[" + std::to_string(i) + "]", grads[i]);
  const auto pieces = split(grads.size(), [&](std::size_t t) { return grads[t].numel(); });
  const std::int64_t count = static_cast<std::int64_t>(pieces.size());
  int found = 0;
#pragma omp parallel for schedule(static) if (parallel_worth(total_len(pieces))) \
    reduction(| : found)
  for (std::int64_t k = 0; k < count; ++k) {
    const Piece& pc = pieces[static_cast<std::size_t>(k)];
    float* g = grads[pc.tensor].as<float>() + pc.begin;
    int local = 0;
    if (inv_scale == 1.0f) {
      // No loss scale to remove: a read-only pass, half the memory traffic.
#pragma omp simd reduction(| : local)
      for (std::int64_t i = 0; i < pc.len; ++i) local |= nonfinite_flag(g[i]);
    } else {
#pragma omp simd reduction(| : local)
      for (std::int64_t i = 0; i < pc.len; ++i) {
        // inf or NaN before scaling stays inf/NaN after (inf*0 is NaN), so one check suffices.
        const float v = g[i] * inv_scale;
        g[i] = v;
        local |= nonfinite_flag(v);
      }
    }
    found |= local;
  }
  return found != 0;
}

double CpuBackend::sum_of_squares(std::span<const TensorView> tensors) {
  use_threads();
  for (std::size_t i = 0; i < tensors.size(); ++i)
    require_storage("sum_of_squares", "tensors[" + std::to_string(i) + "]", tensors[i]);
  const auto pieces = split(tensors.size(), [&](std::size_t t) { return tensors[t].numel(); });
  const std::int64_t count = static_cast<std::int64_t>(pieces.size());
  double total = 0.0;
#pragma omp parallel for schedule(static) if (parallel_worth(total_len(pieces))) \
    reduction(+ : total)
  for (std::int64_t k = 0; k < count; ++k) {
    const Piece& pc = pieces[static_cast<std::size_t>(k)];
    double local = 0.0;
    for (std::int64_t c0 = 0; c0 < pc.len; c0 += kChunk) {
      const std::int64_t len = std::min(kChunk, pc.len - c0);
      float buf[kChunk];
      const float* x = read_chunk(tensors[pc.tensor], pc.begin + c0, len, buf);
#pragma omp simd reduction(+ : local)
      for (std::int64_t i = 0; i < len; ++i) local += static_cast<double>(x[i]) * x[i];
    }
    total += local;
  }
  return total;
}

sdk::GradientCheckFacet::GradientCheck CpuBackend::unscale_check_and_sum_squares(
    std::span<const TensorView> grads, float inv_scale) {
  // Synchronous backend: the two passes in turn wait no more than one fused pass would.
  GradientCheck r;
  r.found_inf = unscale_and_check_finite(grads, inv_scale);
  r.sum_of_squares = sum_of_squares(grads);
  return r;
}

int CpuBackend::first_nonfinite(std::span<const TensorView> tensors) {
  use_threads();
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const TensorView& v = tensors[t];
    require_storage("first_nonfinite", "tensors[" + std::to_string(t) + "]", v);
    const std::int64_t total = v.numel();
    int found = 0;
#pragma omp parallel for schedule(static) if (parallel_worth(total)) reduction(| : found)
    for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
      const std::int64_t len = std::min(kChunk, total - c0);
      float buf[kChunk];
      const float* x = read_chunk(v, c0, len, buf);
      int local = 0;
#pragma omp simd reduction(| : local)
      for (std::int64_t i = 0; i < len; ++i) local |= nonfinite_flag(x[i]);
      found |= local;
    }
    if (found != 0) return static_cast<int>(t);
  }
  return -1;
}

void CpuBackend::sgd_update(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> params) {
  use_threads();
  if (h.nesterov && (h.momentum <= 0.0f || h.dampening != 0.0f))
    fail("sgd_update",
         "nesterov needs momentum > 0 and dampening = 0 (momentum " + std::to_string(h.momentum) +
             ", dampening " + std::to_string(h.dampening) + ")",
         "set momentum > 0 and dampening = 0, or turn nesterov off (as torch.optim.SGD requires)");
  for (std::size_t i = 0; i < params.size(); ++i)
    validate_param("sgd_update", i, params[i], h.momentum != 0.0f, false);
  const auto pieces = split(params.size(), [&](std::size_t t) { return params[t].master.numel(); });
  const std::int64_t count = static_cast<std::int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (parallel_worth(total_len(pieces)))
  for (std::int64_t k = 0; k < count; ++k) {
    const Piece& pc = pieces[static_cast<std::size_t>(k)];
    const auto& t = params[pc.tensor];
    if (h.momentum != 0.0f)
      sgd_piece<true>(h, t, pc.begin, pc.len);
    else
      sgd_piece<false>(h, t, pc.begin, pc.len);
  }
}

void CpuBackend::adamw_update(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> params) {
  use_threads();
  if (h.step < 1)
    fail("adamw_update", "step = " + std::to_string(h.step) + " but it is the 1-based count of "
                         "applied steps",
         "pass step >= 1 (1 on the first update)");
  for (std::size_t i = 0; i < params.size(); ++i)
    validate_param("adamw_update", i, params[i], true, true);
  // Bias corrections in double, as PyTorch computes them on the host.
  const double t = static_cast<double>(h.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
  const float step_size = static_cast<float>(static_cast<double>(h.lr) / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = 1.0f - h.lr * h.weight_decay;
  const auto pieces = split(params.size(), [&](std::size_t i) { return params[i].master.numel(); });
  const std::int64_t count = static_cast<std::int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (parallel_worth(total_len(pieces)))
  for (std::int64_t k = 0; k < count; ++k) {
    const Piece& pc = pieces[static_cast<std::size_t>(k)];
    adamw_piece(h, decay, step_size, bc2_sqrt, params[pc.tensor], pc.begin, pc.len);
  }
}

}  // namespace mixtrain::backend_cpu
