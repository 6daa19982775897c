// CpuLoss: the CPU backend's LossFacet: softmax cross-entropy (optionally label-smoothed) per
// row, log-sum-exp in double, the mean loss, the count of correct argmaxes and the gradient. The
// per-logit work (max, exponentials, probabilities) is softmax_row's (cpu_softmax_row.h); the
// loss is the same bits on any number of threads.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu_access.h"
#include "cpu_context.h"
#include "cpu_softmax_row.h"
#include "mixtrain/sdk/backend_loss.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cpu {

using sdk::TensorView;

namespace {

class CpuLoss final : public sdk::LossFacet {
 public:
  explicit CpuLoss(CpuContext& context) : context_(context) {}

  void softmax_cross_entropy(sdk::TensorView logits, sdk::TensorView labels, float grad_scale,
                             float label_smoothing, sdk::TensorView loss, sdk::TensorView correct,
                             sdk::TensorView dlogits) override;

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::LossFacet, CpuLoss> kRegistration;

}  // namespace

void CpuLoss::softmax_cross_entropy(TensorView logits, TensorView labels, float grad_scale,
                                    float label_smoothing, TensorView loss, TensorView correct,
                                    TensorView dlogits) {
  context_.use_threads();
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
  // Each row's loss is kept and the mean summed in row order afterwards, so the loss has the same
  // bits on any number of threads (a reduction's order would follow the team's partition).
  std::vector<double> row_loss(static_cast<std::size_t>(rows));
  std::int64_t correct_count = 0;
#pragma omp parallel if (parallel_worth(rows * classes)) reduction(+ : correct_count)
  {
    std::vector<float> in_buf, out_buf;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      float* out = want_grad ? row_target(dlogits, r, classes, out_buf) : nullptr;
      // out receives the probabilities, then their gradient in place. dlogits may be the logits'
      // own buffer (LossFacet's contract does not forbid it; the CUDA kernel supports it), so the
      // label's logit is read first. bf16 logits are read in place, without a pass decoding the
      // row into fp32 (GPT-2 small's 512-row blocks, 2 threads: 16.4-17.7 -> 14.8-16.5 ms,
      // bench/RESULTS.md session 71); a bf16 dlogits, the one that may share their buffer, is
      // written through the scratch row out after the row's last read.
      const std::int32_t y = label[r];
      double zy = 0.0;
      SoftmaxRow row;
      if (logits.dtype == sdk::DType::bf16) {
        const Bf16Bits* z = logits.as<const Bf16Bits>() + r * classes;
        zy = static_cast<double>(float_from_bf16(z[y]));
        row = softmax_row(z, classes, out, eps != 0.0f);
      } else {
        const float* z = read_row(logits, r, classes, in_buf);
        zy = static_cast<double>(z[y]);
        row = softmax_row(z, classes, out, eps != 0.0f);
      }
      if (eps == 0.0f) {
        row_loss[static_cast<std::size_t>(r)] = row.lse - zy;
      } else {
        // -Σ_j t_j (z_j - lse) = lse - (1 - ε) z_y - ε / classes · Σ_j z_j
        const double e = static_cast<double>(eps);
        row_loss[static_cast<std::size_t>(r)] =
            row.lse - (1.0 - e) * zy - e / static_cast<double>(classes) * row.z_sum;
      }
      correct_count += row.argmax == y ? 1 : 0;
      if (want_grad) {
        // (p - t)·grad_factor with t = `off` everywhere, then the label's own target `on`: in
        // place for fp32 storage, straight into a bf16 dlogits row (one pass over p where the
        // fp32 row, then its bulk encode, took two), else in place and encoded.
        if (dlogits.dtype == sdk::DType::bf16) {
          softmax_gradient_row(out, classes, y, off, on, grad_factor,
                               dlogits.as<Bf16Bits>() + r * classes);
        } else {
          softmax_gradient_row(out, classes, y, off, on, grad_factor, out);
          commit_row(dlogits, r, classes, out);
        }
      }
    }
  }
  double loss_sum = 0.0;
  for (const double l : row_loss) loss_sum += l;
  *loss.as<float>() = static_cast<float>(loss_sum / static_cast<double>(rows));
  if (want_correct) *correct.as<std::int32_t>() = static_cast<std::int32_t>(correct_count);
}

}  // namespace mixtrain::backend_cpu
