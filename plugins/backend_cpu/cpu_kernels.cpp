// CpuBackend layer kernels and element-wise ops. All math is fp32 (statistics and long sums in
// double); storage may be fp32, bf16 or fp16 where the SDK says "storage dtype". fp32 storage is
// read and written in place, so those loops vectorise; 16-bit storage goes through stack
// chunks converted with sdk/float_formats.h's bulk (vectorised, RNE) conversions. Parallel
// regions open only for tensors of at least kParallelMin elements (cpu_access.h).
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_access.h"
#include "cpu_backend.h"
#include "cpu_eltwise.h"

namespace mixtrain::backend_cpu {

using sdk::Activation;
using sdk::DType;
using sdk::TensorView;

namespace {

// A small fp32 vector ([n] parameters such as bias or gamma): the tensor itself when fp32,
// else a converted copy. An empty view yields `fallback` everywhere.
class Fp32Vector {
 public:
  Fp32Vector(const TensorView& v, std::int64_t n, float fallback) {
    if (!v.empty() && is_fp32_storage(v.dtype)) {
      ptr_ = v.as<const float>();
      return;
    }
    copy_.assign(static_cast<std::size_t>(n), fallback);
    if (!v.empty())
      for (std::int64_t c0 = 0; c0 < n; c0 += kChunk) {
        const std::int64_t len = std::min(kChunk, n - c0);
        const float* src = read_chunk(v, c0, len, copy_.data() + c0);
        (void)src;  // 16-bit storage: converted straight into copy_
      }
    ptr_ = copy_.data();
  }
  const float* data() const { return ptr_; }

 private:
  const float* ptr_ = nullptr;
  std::vector<float> copy_;
};

// fp32 view of a whole row [n]: the row itself for fp32 storage, else converted into `buf`.
const float* read_row(const TensorView& v, std::int64_t row, std::int64_t n,
                      std::vector<float>& buf) {
  if (is_fp32_storage(v.dtype)) return v.as<const float>() + row * n;
  buf.resize(static_cast<std::size_t>(n));
  for (std::int64_t c0 = 0; c0 < n; c0 += kChunk)
    read_chunk(v, row * n + c0, std::min(kChunk, n - c0), buf.data() + c0);
  return buf.data();
}

float* row_target(const TensorView& v, std::int64_t row, std::int64_t n, std::vector<float>& buf) {
  if (is_fp32_storage(v.dtype)) return v.as<float>() + row * n;
  buf.resize(static_cast<std::size_t>(n));
  return buf.data();
}

void commit_row(const TensorView& v, std::int64_t row, std::int64_t n, const float* values) {
  if (is_fp32_storage(v.dtype)) return;  // written in place
  commit_chunk(v, row * n, n, values);
}

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

inline float gelu(float x) {
  const float u = kGeluK * (x + kGeluC * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(u));
}

inline float gelu_grad(float x) {
  const float u = kGeluK * (x + kGeluC * x * x * x);
  const float t = std::tanh(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
}

}  // namespace

void CpuBackend::bias_grad(TensorView dy, TensorView dbias, bool accumulate) {
  use_threads();
  // Plain variables, not structured bindings: clang 14 cannot capture those in OpenMP regions.
  const auto shape = checks().bias_grad_shape(dy, dbias);
  const std::int64_t rows = shape.rows, n = shape.cols;
  constexpr std::int64_t kBlock = 256;
  float* out = dbias.as<float>();
#pragma omp parallel for schedule(static) if (parallel_worth(rows * n))
  for (std::int64_t c0 = 0; c0 < n; c0 += kBlock) {
    const std::int64_t len = std::min(kBlock, n - c0);
    double acc[kBlock] = {};
    float buf[kBlock];
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = read_chunk(dy, r * n + c0, len, buf);
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) acc[j] += row[j];
    }
    for (std::int64_t j = 0; j < len; ++j)
      out[c0 + j] = static_cast<float>((accumulate ? out[c0 + j] : 0.0) + acc[j]);
  }
}

void CpuBackend::activation_forward(Activation act, TensorView x, TensorView y) {
  use_threads();
  require_storage("activation_forward", "x", x);
  require_storage("activation_forward", "y", y);
  require_numel("activation_forward", "y", y, x.numel());
  const std::int64_t total = x.numel();
  // Small ReLUs stay on this thread (bit-identical to oneDNN's); GELU always takes the same
  // path so its numbers never depend on the tensor size.
  const bool small_relu = act == Activation::relu && !parallel_worth(total);
  if (!small_relu && eltwise_->try_forward(act, x, y)) return;
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float in_buf[kChunk];
    float out_buf[kChunk];
    const float* in = read_chunk(x, c0, len, in_buf);
    float* out = write_target(y, c0, out_buf);
    if (act == Activation::relu) {
#pragma omp simd
      for (std::int64_t i = 0; i < len; ++i) out[i] = in[i] < 0.0f ? 0.0f : in[i];  // NaN stays
    } else {
      for (std::int64_t i = 0; i < len; ++i) out[i] = gelu(in[i]);
    }
    commit_chunk(y, c0, len, out);
  }
}

void CpuBackend::activation_backward(Activation act, TensorView x, TensorView dy, TensorView dx) {
  use_threads();
  require_storage("activation_backward", "x", x);
  require_storage("activation_backward", "dy", dy);
  require_storage("activation_backward", "dx", dx);
  require_numel("activation_backward", "dy", dy, x.numel());
  require_numel("activation_backward", "dx", dx, x.numel());
  const std::int64_t total = x.numel();
  const bool small_relu = act == Activation::relu && !parallel_worth(total);
  if (!small_relu && eltwise_->try_backward(act, x, dy, dx)) return;
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float x_buf[kChunk];
    float dy_buf[kChunk];
    float out_buf[kChunk];
    const float* xs = read_chunk(x, c0, len, x_buf);
    const float* g = read_chunk(dy, c0, len, dy_buf);
    float* out = write_target(dx, c0, out_buf);
    if (act == Activation::relu) {
      // dy where x > 0, else +0 (x NaN too), as a bit mask: branch-free, so it vectorises (a
      // compare-and-branch per element ran at ~2 ns/element on random signs).
#pragma omp simd
      for (std::int64_t i = 0; i < len; ++i) {
        const std::uint32_t keep = xs[i] > 0.0f ? 0xffffffffu : 0u;
        out[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(g[i]) & keep);
      }
    } else {
      for (std::int64_t i = 0; i < len; ++i) out[i] = g[i] * gelu_grad(xs[i]);
    }
    commit_chunk(dx, c0, len, out);
  }
}

void CpuBackend::layernorm_forward(TensorView x, TensorView gamma, TensorView beta, float eps,
                                   TensorView y, TensorView mean, TensorView rstd) {
  use_threads();
  const auto shape = checks().layernorm_forward_shape(x, gamma, beta, y, mean, rstd);
  const std::int64_t rows = shape.rows, n = shape.cols;
  const Fp32Vector g(gamma, n, 1.0f);
  const Fp32Vector b(beta, n, 0.0f);
  const float* gp = g.data();
  const float* bp = b.data();
  float* mean_out = mean.as<float>();
  float* rstd_out = rstd.as<float>();
#pragma omp parallel if (parallel_worth(rows * n))
  {
    std::vector<float> in_buf, out_buf;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* in = read_row(x, r, n, in_buf);
      double sum = 0.0;
#pragma omp simd reduction(+ : sum)
      for (std::int64_t j = 0; j < n; ++j) sum += in[j];
      const float mu = static_cast<float>(sum / static_cast<double>(n));
      double sq = 0.0;  // two-pass variance: no cancellation for large means
#pragma omp simd reduction(+ : sq)
      for (std::int64_t j = 0; j < n; ++j) {
        const float d = in[j] - mu;
        sq += static_cast<double>(d) * d;
      }
      const float rs = static_cast<float>(
          1.0 / std::sqrt(sq / static_cast<double>(n) + static_cast<double>(eps)));
      mean_out[r] = mu;
      rstd_out[r] = rs;
      float* out = row_target(y, r, n, out_buf);  // may alias `in` when y == x: element-wise
#pragma omp simd
      for (std::int64_t j = 0; j < n; ++j) out[j] = (in[j] - mu) * rs * gp[j] + bp[j];
      commit_row(y, r, n, out);
    }
  }
}

void CpuBackend::layernorm_backward(TensorView dy, TensorView x, TensorView gamma, TensorView mean,
                                    TensorView rstd, TensorView dx, TensorView dgamma,
                                    TensorView dbeta, bool accumulate) {
  use_threads();
  const auto shape = checks().layernorm_backward_shape(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  const std::int64_t rows = shape.rows, n = shape.cols;
  const bool want_dgamma = !dgamma.empty();
  const bool want_dbeta = !dbeta.empty();
  const Fp32Vector g(gamma, n, 1.0f);
  const float* gp = g.data();
  const float* mean_in = mean.as<const float>();
  const float* rstd_in = rstd.as<const float>();
  std::vector<double> dgamma_sum(static_cast<std::size_t>(n), 0.0);
  std::vector<double> dbeta_sum(static_cast<std::size_t>(n), 0.0);
#pragma omp parallel if (parallel_worth(rows * n))
  {
    std::vector<float> x_buf, dy_buf, out_buf;
    std::vector<double> dgamma_part(want_dgamma ? static_cast<std::size_t>(n) : 0, 0.0);
    std::vector<double> dbeta_part(want_dbeta ? static_cast<std::size_t>(n) : 0, 0.0);
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xs = read_row(x, r, n, x_buf);
      const float* gy = read_row(dy, r, n, dy_buf);
      const float mu = mean_in[r];
      const float rs = rstd_in[r];
      double sum_g = 0.0, sum_gx = 0.0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
      for (std::int64_t j = 0; j < n; ++j) {
        const float xhat = (xs[j] - mu) * rs;
        const float gj = gy[j] * gp[j];
        sum_g += gj;
        sum_gx += static_cast<double>(gj) * xhat;
      }
      if (want_dgamma) {
        double* part = dgamma_part.data();
#pragma omp simd
        for (std::int64_t j = 0; j < n; ++j)
          part[j] += static_cast<double>(gy[j]) * ((xs[j] - mu) * rs);
      }
      if (want_dbeta) {
        double* part = dbeta_part.data();
#pragma omp simd
        for (std::int64_t j = 0; j < n; ++j) part[j] += gy[j];
      }
      const float mean_g = static_cast<float>(sum_g / static_cast<double>(n));
      const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(n));
      float* out = row_target(dx, r, n, out_buf);  // dx may alias dy: element-wise after sums
#pragma omp simd
      for (std::int64_t j = 0; j < n; ++j) {
        const float xhat = (xs[j] - mu) * rs;
        out[j] = rs * (gy[j] * gp[j] - mean_g - xhat * mean_gx);
      }
      commit_row(dx, r, n, out);
    }
#pragma omp critical
    {
      for (std::size_t j = 0; j < dgamma_part.size(); ++j) dgamma_sum[j] += dgamma_part[j];
      for (std::size_t j = 0; j < dbeta_part.size(); ++j) dbeta_sum[j] += dbeta_part[j];
    }
  }
  if (want_dgamma) {
    float* out = dgamma.as<float>();
    for (std::int64_t j = 0; j < n; ++j)
      out[j] =
          static_cast<float>((accumulate ? out[j] : 0.0) + dgamma_sum[static_cast<std::size_t>(j)]);
  }
  if (want_dbeta) {
    float* out = dbeta.as<float>();
    for (std::int64_t j = 0; j < n; ++j)
      out[j] =
          static_cast<float>((accumulate ? out[j] : 0.0) + dbeta_sum[static_cast<std::size_t>(j)]);
  }
}

void CpuBackend::softmax_cross_entropy(TensorView logits, TensorView labels, float grad_scale,
                                       float label_smoothing, TensorView loss, TensorView correct,
                                       TensorView dlogits) {
  use_threads();
  constexpr const char* op = "softmax_cross_entropy";
  const auto shape =
      checks().softmax_cross_entropy_shape(logits, labels, label_smoothing, loss, correct, dlogits);
  const std::int64_t rows = shape.rows, classes = shape.cols;
  const bool want_correct = !correct.empty();
  const bool want_grad = !dlogits.empty();
  const auto* label = labels.as<const std::int32_t>();
  for (std::int64_t r = 0; r < rows; ++r)  // validate before writing anything
    if (label[r] < 0 || label[r] >= classes)
      fail(op,
           "label " + std::to_string(label[r]) + " at row " + std::to_string(r) +
               " is outside [0, " + std::to_string(classes) + ")",
           "check the dataset's labels against the model's number of classes");

  const float grad_factor = grad_scale / static_cast<float>(rows);
  // The smoothed target: `on` at the label, `off` elsewhere (exactly 1 and 0 without smoothing).
  // These expressions, and the row loss's below, are the CUDA backend's (cuda_element_math.h,
  // xent_*), checked against this code on the host.
  const float eps = label_smoothing;
  const float off = eps / static_cast<float>(classes);
  const float on = (1.0f - eps) + off;
  double loss_sum = 0.0;
  std::int64_t correct_count = 0;
#pragma omp parallel if (parallel_worth(rows * classes)) reduction(+ : loss_sum, correct_count)
  {
    std::vector<float> in_buf, out_buf;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* z = read_row(logits, r, classes, in_buf);
      float max_z = z[0];
      std::int64_t arg = 0;
      for (std::int64_t j = 1; j < classes; ++j)
        if (z[j] > max_z) {
          max_z = z[j];
          arg = j;
        }
      double sum_exp = 0.0;
      for (std::int64_t j = 0; j < classes; ++j) sum_exp += std::exp(z[j] - max_z);
      const double lse = static_cast<double>(max_z) + std::log(sum_exp);
      const std::int32_t y = label[r];
      if (eps == 0.0f) {
        loss_sum += lse - static_cast<double>(z[y]);
      } else {
        // -Σ_j t_j (z_j - lse) = lse - (1 - ε) z_y - ε / classes · Σ_j z_j
        double z_sum = 0.0;
        for (std::int64_t j = 0; j < classes; ++j) z_sum += static_cast<double>(z[j]);
        const double e = static_cast<double>(eps);
        loss_sum +=
            lse - (1.0 - e) * static_cast<double>(z[y]) - e / static_cast<double>(classes) * z_sum;
      }
      correct_count += arg == y ? 1 : 0;
      if (want_grad) {
        float* out = row_target(dlogits, r, classes, out_buf);
        for (std::int64_t j = 0; j < classes; ++j) {
          const float p = static_cast<float>(std::exp(static_cast<double>(z[j]) - lse));
          out[j] = (p - (j == y ? on : off)) * grad_factor;
        }
        commit_row(dlogits, r, classes, out);
      }
    }
  }
  *loss.as<float>() = static_cast<float>(loss_sum / static_cast<double>(rows));
  if (want_correct) *correct.as<std::int32_t>() = static_cast<std::int32_t>(correct_count);
}

// --- element-wise ------------------------------------------------------------------------------

void CpuBackend::fill(TensorView x, float value) {
  use_threads();
  require_present("fill", "x", x);
  const std::int64_t total = x.numel();
  if (x.dtype == DType::int32) {
    auto* p = x.as<std::int32_t>();
    const auto v = static_cast<std::int32_t>(value);
#pragma omp parallel for simd schedule(static) if (parallel_worth(total))
    for (std::int64_t i = 0; i < total; ++i) p[i] = v;
    return;
  }
  require_storage("fill", "x", x);
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float buf[kChunk];
    float* out = write_target(x, c0, buf);
    for (std::int64_t i = 0; i < len; ++i) out[i] = value;
    commit_chunk(x, c0, len, out);
  }
}

void CpuBackend::add(std::span<const TensorView> xs, bool relu, TensorView y) {
  use_threads();
  const std::int64_t total = checks().residual_add(xs, y);
  // One pass: each chunk of every input is read (decoded) once, summed in FP32, rectified and
  // rounded once into y; y may be an input, whose chunk is read before it is written.
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float sum[kChunk], buf[kChunk];
    const float* first = read_chunk(xs[0], c0, len, buf);
    std::copy(first, first + len, sum);
    for (std::size_t k = 1; k < xs.size(); ++k) {
      const float* in = read_chunk(xs[k], c0, len, buf);
#pragma omp simd
      for (std::int64_t i = 0; i < len; ++i) sum[i] += in[i];
    }
    if (relu) {
#pragma omp simd
      for (std::int64_t i = 0; i < len; ++i) sum[i] = sum[i] < 0.0f ? 0.0f : sum[i];  // NaN stays
    }
    commit_chunk(y, c0, len, sum);
  }
}

void CpuBackend::axpy(float alpha, TensorView x, TensorView y) {
  use_threads();
  require_storage("axpy", "x", x);
  require_fp32("axpy", "y", y);
  require_numel("axpy", "y", y, x.numel());
  const std::int64_t total = x.numel();
  float* out = y.as<float>();
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float buf[kChunk];
    const float* in = read_chunk(x, c0, len, buf);
    float* o = out + c0;
#pragma omp simd
    for (std::int64_t i = 0; i < len; ++i) o[i] += alpha * in[i];
  }
}

}  // namespace mixtrain::backend_cpu
