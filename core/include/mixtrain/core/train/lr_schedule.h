// Learning-rate schedules. The schedule advances on applied optimizer steps only: a step the
// loss scaler skipped does not move the learning rate (PyTorch's warning about calling
// scheduler.step() after a skipped optimizer.step() is built in).
#pragma once

#include <cstdint>
#include <string>

namespace mixtrain::core {

struct LrSchedule {
  std::string kind = "constant";  // constant | warmup_cosine
  double base_lr = 1e-3;
  double min_lr = 0.0;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;

  // lr for the optimizer step that follows `applied_steps` earlier applied steps (0-based).
  double lr_at(std::int64_t applied_steps) const;
};

}  // namespace mixtrain::core
