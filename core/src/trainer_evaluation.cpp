#include <algorithm>
#include <vector>

#include "trainer_state.h"

namespace mixtrain::core {

// The eval split (the training split when there is none) in eval_batch_size batches, under the
// same precision plan as training; loss and accuracy are means over all rows.
EvalResult Trainer::evaluate() {
  auto& s = *s_;
  EvalResult r;
  const Dataset& d = s.eval.rows > 0 ? s.eval : s.train;
  const std::int64_t bs = s.e.data.eval_batch_size;
  double loss_sum = 0.0;
  std::int64_t correct = 0;
  std::vector<std::int64_t> idx;
  for (std::int64_t start = 0; start < d.rows; start += bs) {
    const std::int64_t rows = std::min(bs, d.rows - start);
    idx.resize(static_cast<std::size_t>(rows));
    for (std::int64_t i = 0; i < rows; ++i) idx[static_cast<std::size_t>(i)] = start + i;
    gather_batch(d, idx, s.x_host.data(), s.y_host.data());
    s.c.backend->copy_from_host(s.model->input(rows), s.x_host.data());
    s.c.backend->copy_from_host(s.model->labels(rows), s.y_host.data());
    s.model->forward(rows);
    auto lv = s.model->loss(rows, 1.0f, false);
    loss_sum += static_cast<double>(lv.loss) * static_cast<double>(rows);
    correct += lv.correct;
  }
  r.rows = d.rows;
  r.loss = d.rows > 0 ? loss_sum / static_cast<double>(d.rows) : 0.0;
  r.accuracy = d.rows > 0 ? static_cast<double>(correct) / static_cast<double>(d.rows) : 0.0;
  return r;
}

}  // namespace mixtrain::core
