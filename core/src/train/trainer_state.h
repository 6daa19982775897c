// Trainer::State: what one training run holds, shared by the files that implement the Trainer
// (train/trainer.cpp: construction and the loop; train/step.cpp: one step; train/checkpointing.cpp:
// save and resume; train/evaluation.cpp: evaluation). Internal to the core.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "distributed/data_parallel.h"
#include "mixtrain/core/console/log_sink.h"
#include "mixtrain/core/data/batch_sampler.h"
#include "mixtrain/core/train/lr_schedule.h"
#include "mixtrain/core/train/trainer.h"
#include "precision/escalation.h"
#include "runs/metrics_log.h"
#include "train/metric_watch.h"
#include "train/step_graph.h"

namespace mixtrain::core {

struct Trainer::State {
  Experiment e;
  Components c;
  TrainOptions opt;
  sdk::Logger log = core_logger("trainer");
  Dataset train, eval;
  std::unique_ptr<Model> model;
  std::vector<sdk::Parameter> params;
  std::vector<sdk::TensorView> grads;
  std::unique_ptr<BatchSampler> sampler;
  LrSchedule schedule;
  std::int64_t step = 0, applied = 0, skipped = 0;
  std::filesystem::path run_dir;
  MetricsLog metrics;
  std::vector<float> x_host;           // a table's features [rows, F]
  std::vector<std::int32_t> ids_host;  // token windows' ids [rows, T]
  std::vector<std::int32_t> y_host;    // labels [rows · labels_per_row]
  float last_loss = 0.0f;
  std::filesystem::path resumed_from;
  bool underflow_watch = false;  // some layer stores activation gradients in < 32 bits
  // Gradient accumulation (run.accumulate > 1): the mean loss of the step's micro-batches, summed
  // on the device, and each micro-batch's rows (a skipped step replays them).
  Tensor loss_sum;
  std::vector<std::vector<std::int64_t>> micro_batches;
  std::vector<std::uint64_t> micro_batch_numbers;  // each one's batch number (augmentation)
  // Image data: what a raw 0 pixel is after normalisation, per channel (crop padding's fill).
  std::vector<float> black;
  ChannelStats normalization;  // [data.normalize] as applied; empty: none
  // [ema]: an FP32 copy per parameter (model.parameters() order), updated after applied steps.
  std::vector<Tensor> ema;
  // Forward, loss and backward recorded and replayed where the backend and the step allow.
  std::unique_ptr<StepGraph> step_graph;
  // run.early_stopping_patience > 0 and checkpoint.keep_best: the watched metrics, saved in
  // checkpoints ("watch"); best_path is the best checkpoint's file once one exists.
  std::optional<MetricWatch> early_stopping, keep_best;
  std::filesystem::path best_path;
  // [precision.escalate]: which ops were promoted and the blames counting towards the next
  // promotion; its overrides are part of the plan (train/planned_model.h), saved in checkpoints.
  Escalation escalation;
  // [distributed]: this rank's part of the data-parallel step (distributed/data_parallel.h);
  // null in one process. rank_batch is the rows each rank computes per micro-batch
  // (data.batch_size / world: data.batch_size is the global batch). Only rank 0 writes files
  // (`writes`); every rank runs the collectives that checkpoints and evaluation need.
  std::unique_ptr<DataParallel> dp;
  std::int64_t rank_batch = 0;
  bool writes = true;
};

// Copies the given rows of `d` (features or token ids, and their labels) into the model's batch.
// A training batch passes its batch number — the sampler's count of batches drawn before it,
// epoch · batches_per_epoch + position, which a resumed run restores — and gets [data.augment]
// (augment_batch with the run seed); evaluation passes none and is never augmented.
void feed_batch(Trainer::State& s, const Dataset& d, std::span<const std::int64_t> rows,
                std::optional<std::uint64_t> training_batch = std::nullopt);

// checkpoint.keep_best: writes the whole training state to checkpoints/best<ext> (atomically, as
// every checkpoint) after an evaluation improved the best.
void save_best_checkpoint(Trainer::State& s);
// After a resume into the run folder: a best checkpoint written after the resumed step belongs to
// the abandoned continuation and moves aside (checkpoints.discarded-after-step-N/), and the
// restored best's file is found in the folder, or copied from the resumed run's, or its absence
// is a warning (the next improvement writes one).
void reconcile_best_checkpoint(Trainer::State& s);

// ema = decay * ema + (1 - decay) * master, on the device, for every parameter.
void update_ema(Trainer::State& s);
// ema = master (a fresh EMA: at initialisation, or after loading initial weights).
void reset_ema(Trainer::State& s);

// A device tensor's bytes on the host, named (checkpoints; a replan's round trip of the state).
sdk::HostTensor to_host(sdk::DeviceBackend& b, const std::string& name, sdk::TensorView v);

}  // namespace mixtrain::core
