#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "train/top_k.h"
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
    const auto params = s_.model->trainable_parameters();  // the EMA's order (trainer_state.h)
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

// Loss and accuracy are means over all labels (a language model's: over every labelled next
// token, so the loss is in nats per token). Top-k accuracy ([eval] top_k) is counted on the
// host from each batch's FP32 logits and the labels feed_batch left in host.y.
EvalResult Trainer::evaluate() {
  auto& s = *s_;
  if (!s.evaluates)
    throw std::logic_error(
        "Trainer::evaluate: this trainer was opened with TrainOptions::splits = none and holds "
        "no held-out rows");
  const Dataset& d = s.eval.rows > 0 ? s.eval : s.train;
  // A run says so once at its start; `mixtrain eval` (a session that writes nothing) says it here.
  if (s.eval.rows == 0 && !s.opt.write_outputs)
    s.log.warn(
        "no held-out rows (data.eval_fraction = 0 and no eval file): these numbers read "
        "the training rows");
  const std::int64_t k = s.e.eval.top_k;
  if (k == 0) return predict(d, d.rows, nullptr);
  const std::int64_t classes = s.model->classes(), per_row = d.labels_per_row();
  std::int64_t hits = 0;
  EvalResult r = predict(d, d.rows, [&](const PredictionBatch& batch) {
    const auto labels = static_cast<std::size_t>(batch.rows * per_row);
    hits += top_k_hits(batch.logits, {s.data.host.y.data(), labels}, classes, k);
  });
  r.top_k = k;
  const double labels = static_cast<double>(d.rows) * static_cast<double>(per_row);
  r.top_k_accuracy = d.rows > 0 ? static_cast<double>(hits) / labels : 0.0;
  return r;
}

namespace {

// The inputs' form against the training split's, and their sizes against their rows: an
// embedding program's Dataset of another form would read past its vectors in the batch gather.
void check_prediction_inputs(const Trainer::State& s, const Dataset& d) {
  auto refuse = [](const std::string& what) {
    throw std::invalid_argument("Trainer::predict: " + what);
  };
  const Dataset& t = s.train;
  if (d.is_tokens() != t.is_tokens() || d.features != t.features)
    refuse(std::string("the inputs are ") + (d.is_tokens() ? "token windows" : "rows") + " of " +
           std::to_string(d.features) + (d.is_tokens() ? " tokens" : " features") +
           ", the model reads " + (t.is_tokens() ? "token windows" : "rows") + " of " +
           std::to_string(t.features));
  if (d.rows < 0) refuse("rows = " + std::to_string(d.rows));
  if (d.rows == 0) return;
  const auto rows = static_cast<std::size_t>(d.rows),
             features = static_cast<std::size_t>(d.features);
  if (d.is_tokens()) {
    const std::size_t last_window_end =
        static_cast<std::size_t>(d.rows - 1) * static_cast<std::size_t>(d.stride) + features + 1;
    if (d.tokens.size() < last_window_end)
      refuse(std::to_string(d.rows) + " windows of " + std::to_string(d.features + 1) +
             " tokens every " + std::to_string(d.stride) + " need " +
             std::to_string(last_window_end) + " tokens, the inputs hold " +
             std::to_string(d.tokens.size()));
    return;
  }
  const std::size_t held = d.is_image_files() ? d.image_files.size() * features
                           : d.is_bytes()     ? d.pixels.size()
                                              : d.x.size();
  if (held / features < rows)
    refuse(std::to_string(held) + " values for " + std::to_string(d.rows) + " rows of " +
           std::to_string(d.features));
  // The batch gather reads a label per row, labelled_rows or not (the CLI's predict gives
  // unlabelled rows a 0).
  if (d.y.size() < rows)
    refuse(std::to_string(d.y.size()) + " labels for " + std::to_string(d.rows) +
           " rows: every row needs one (any class where it is unknown; only the first "
           "labelled_rows count)");
}

}  // namespace

EvalResult Trainer::predict(const Dataset& d, std::int64_t labelled_rows,
                            const std::function<void(const PredictionBatch&)>& on_batch) {
  auto& s = *s_;
  if (labelled_rows < 0 || labelled_rows > d.rows)
    throw std::invalid_argument("Trainer::predict: labelled_rows " + std::to_string(labelled_rows) +
                                " is outside [0, " + std::to_string(d.rows) + "]");
  check_prediction_inputs(s, d);
  EvalMode mode(*s.model);
  std::optional<EmaWeights> ema;
  if (s.e.eval.weights == EvalWeights::ema && !s.ema.empty()) ema.emplace(s);
  const std::int64_t bs = s.eval_batch_rows;  // the batch the model was allocated for
  // The logits per row: [classes], or [T, classes] for a language model.
  const std::int64_t row_values = d.labels_per_row() * s.model->classes();
  std::vector<float> logits_host;
  Tensor logits_fp32;  // the cast of narrower logits, on the device
  double loss_sum = 0.0;
  std::int64_t correct = 0;
  std::vector<std::int64_t> idx;
  auto run_batch = [&](std::int64_t start, std::int64_t rows, bool labelled) {
    idx.resize(static_cast<std::size_t>(rows));
    for (std::int64_t i = 0; i < rows; ++i) idx[static_cast<std::size_t>(i)] = start + i;
    feed_batch(s, d, idx);
    s.model->forward(rows);
    if (labelled) {
      // Plain cross-entropy: label smoothing is part of the training objective only.
      auto lv = s.model->evaluation_loss(rows);
      loss_sum += static_cast<double>(lv.loss) * static_cast<double>(rows);
      correct += lv.correct;
    }
    if (!on_batch) return;
    const sdk::TensorView logits = s.model->logits(rows);
    const sdk::TensorView flat{logits.data, logits.dtype, sdk::Shape{rows * row_values}};
    logits_host.resize(static_cast<std::size_t>(rows * row_values));
    copy_to_host_fp32(s.c.backend, flat, logits_host.data(), logits_fp32);
    on_batch(PredictionBatch{start, rows, logits_host});
  };
  // The labelled rows in evaluate()'s batches, then the rest in batches of their own.
  for (std::int64_t start = 0; start < labelled_rows; start += bs)
    run_batch(start, std::min(bs, labelled_rows - start), true);
  for (std::int64_t start = labelled_rows; start < d.rows; start += bs)
    run_batch(start, std::min(bs, d.rows - start), false);
  // Every row carries labels_per_row labels (a token window's next tokens), so the mean over rows
  // of the per-row mean loss is the mean over labels; accuracy counts labels.
  EvalResult r;
  r.rows = labelled_rows;
  const double labels =
      static_cast<double>(labelled_rows) * static_cast<double>(d.labels_per_row());
  r.loss = labelled_rows > 0 ? loss_sum / static_cast<double>(labelled_rows) : 0.0;
  r.accuracy = labelled_rows > 0 ? static_cast<double>(correct) / labels : 0.0;
  return r;
}

}  // namespace mixtrain::core
