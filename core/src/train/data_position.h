// DataPosition: where the training data stands and the host memory a batch passes through on its
// way to the device. Internal to the core.
//
// Contract
// - sampler: the global batches, data.batch_size rows each whatever the world size; its cursor
//   is saved in checkpoints ("sampler") and restored by a resume.
// - micro_batches[k], micro_batch_numbers[k]: the rows this rank computes in micro-batch k of the
//   current step and that batch's number (epoch · batches_per_epoch + position, augmentation's
//   key); kept so a skipped step can replay them. run.accumulate entries after a step.
// - Host staging, sized for the model's largest batch (Model::max_rows rows): x_host, a table's
//   or images' features [rows, F] in FP32; ids_host, token windows' ids [rows, T]; y_host, the
//   labels [rows · labels_per_row]. After a batch is fed, y_host holds its labels (evaluation's
//   top-k reads them).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mixtrain/core/data/batch_sampler.h"

namespace mixtrain::core {

struct DataPosition {
  std::unique_ptr<BatchSampler> sampler;
  std::vector<std::vector<std::int64_t>> micro_batches;
  std::vector<std::uint64_t> micro_batch_numbers;
  std::vector<float> x_host;
  std::vector<std::int32_t> ids_host;
  std::vector<std::int32_t> y_host;
};

}  // namespace mixtrain::core
