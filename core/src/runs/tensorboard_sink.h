// TensorBoardSink: the run's records as TensorBoard scalars, and its text (config, precision plan)
// for the text plugin, in an event file of the run folder (runs/tensorboard_writer.h).
//
// Contract
// - Tags (tensorboard_scalars() maps one record): a step record gives train/loss,
//   train/loss_scale, train/lr, train/grad_norm (when finite), train/samples_per_s, train/skipped
//   (1 for a skipped step, else 0), train/epoch and memory/device_bytes,
//   memory/device_peak_bytes, memory/host_peak_rss_bytes; an evaluation eval/<name> for each
//   eval_<name> (eval/loss, eval/accuracy, eval/top5_accuracy); an underflow report
//   underflow/<tensor> (the flushed share) and underflow/loss_scale; FP8 statistics
//   fp8/<slot>/<amax|scale|saturated_share|underflow_share>; an escalation record
//   precision/escalations_standing; a skipped step's underflow and FP8
//   records (tagged "skipped": true) give none. Values are float32, as TensorBoard keeps scalars.
// - A resumed run (first_step > 0) writes a new file that starts with a session start at
//   first_step + 1, so TensorBoard drops what an abandoned continuation wrote past the resume;
//   readers that ignore the marker (its data server) need the folder's files rewritten, which
//   resuming in place does (drop_events_after_step, runs/tensorboard_writer.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "runs/metrics_sink.h"
#include "runs/tensorboard_writer.h"

namespace mixtrain::core {

std::vector<std::pair<std::string, float>> tensorboard_scalars(const nlohmann::json& record);

class TensorBoardSink final : public MetricsSink {
 public:
  TensorBoardSink(const std::filesystem::path& run_dir, std::int64_t first_step);
  void write(const nlohmann::json& record) override;
  void write_text(std::int64_t step, const std::string& tag, const std::string& markdown) override;
  bool keeps_text() const override { return true; }

 private:
  TensorBoardWriter writer_;
};

}  // namespace mixtrain::core
