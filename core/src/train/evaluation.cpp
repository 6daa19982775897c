#include <algorithm>
#include <optional>
#include <vector>

#include "train/trainer_state.h"

namespace mixtrain::core {

namespace {

// Swaps the EMA into the master weights (and their working copies) for the scope: evaluation with
// eval.weights = "ema". The swap is exact both ways, so training resumes on the same bits.
class EmaWeights {
 public:
  explicit EmaWeights(Trainer::State& s) : s_(s) { swap(); }
  ~EmaWeights() { swap(); }
  EmaWeights(const EmaWeights&) = delete;
  EmaWeights& operator=(const EmaWeights&) = delete;

 private:
  void swap() {
    auto& b = *s_.c.backend;
    const auto params = s_.model->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const sdk::TensorView master = params[i]->master.view();
      if (tmp_.empty() || tmp_.shape().numel() < master.numel())
        tmp_ = Tensor(s_.c.backend, sdk::DType::fp32, master.shape);
      const sdk::TensorView t{tmp_.view().data, sdk::DType::fp32, master.shape};
      b.copy(t, master);
      b.copy(master, s_.ema[i].view());
      b.copy(s_.ema[i].view(), t);
    }
    s_.model->refresh_working_copies();
  }
  Trainer::State& s_;
  Tensor tmp_;
};

// Evaluation mode for the scope; training mode after.
struct EvalMode {
  explicit EvalMode(Model& m) : model(m) { model.set_mode(Model::Mode::eval); }
  ~EvalMode() { model.set_mode(Model::Mode::train); }
  Model& model;
};

}  // namespace

// The eval split (the training split when there is none) in eval_batch_size batches, under the
// same precision plan as training, in evaluation mode, with the master weights or their EMA
// (eval.weights); loss and accuracy are means over all labels (a language model's: over every
// held-out next token, so the loss is in nats per token).
EvalResult Trainer::evaluate() {
  auto& s = *s_;
  EvalResult r;
  EvalMode mode(*s.model);
  std::optional<EmaWeights> ema;
  if (s.e.eval.weights == "ema" && !s.ema.empty()) ema.emplace(s);
  const Dataset& d = s.eval.rows > 0 ? s.eval : s.train;
  const std::int64_t bs = s.e.data.eval_batch_size;
  double loss_sum = 0.0;
  std::int64_t correct = 0;
  std::vector<std::int64_t> idx;
  for (std::int64_t start = 0; start < d.rows; start += bs) {
    const std::int64_t rows = std::min(bs, d.rows - start);
    idx.resize(static_cast<std::size_t>(rows));
    for (std::int64_t i = 0; i < rows; ++i) idx[static_cast<std::size_t>(i)] = start + i;
    feed_batch(s, d, idx);
    s.model->forward(rows);
    auto lv = s.model->loss(rows, 1.0f, false);
    loss_sum += static_cast<double>(lv.loss) * static_cast<double>(rows);
    correct += lv.correct;
  }
  // Every row carries labels_per_row labels (a token window's next tokens), so the mean over rows
  // of the per-row mean loss is the mean over labels; accuracy counts labels.
  r.rows = d.rows;
  const double labels = static_cast<double>(d.rows) * static_cast<double>(d.labels_per_row());
  r.loss = d.rows > 0 ? loss_sum / static_cast<double>(d.rows) : 0.0;
  r.accuracy = d.rows > 0 ? static_cast<double>(correct) / labels : 0.0;
  return r;
}

}  // namespace mixtrain::core
