// DataPosition: where the training data stands and the host memory a batch passes through on its
// way to the device. Internal to the core.
//
// Contract
// - sampler: the global batches, data.batch_size rows each whatever the world size; its cursor
//   is saved in checkpoints ("sampler") and restored by a resume.
// - micro_batches[k], micro_batch_numbers[k]: the rows this rank computes in micro-batch k of the
//   current step and that batch's number (epoch · batches_per_epoch + position, augmentation's
//   key); kept so a skipped step can replay them. run.accumulate entries after a step.
// - host_memory: where the host batches' arrays come from (train/host_batch.h): the backend's
//   upload memory with data.pin_memory and a host_memory facet, else ordinary memory. Declared
//   before the batches, so it outlives them.
// - Host batch `host`, sized for the model's largest batch (Model::max_rows rows) and grown by
//   a larger one: x, a table's or images' features [rows, F] in FP32; pixels, byte images
//   decoded on the device [rows, F] as bytes; ids, token windows' ids
//   [rows, T]; y, the labels [rows · labels_per_row]. After a batch is fed, host.y holds its
//   labels (evaluation's top-k reads them).
// - prefetcher: with data.prefetch, the loader thread that prepares the next training batch
//   (train/batch_prefetcher.h) while a step computes; its buffers are swapped into `host`.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mixtrain/core/data/batch_sampler.h"
#include "train/batch_prefetcher.h"

namespace mixtrain::core {

struct DataPosition {
  std::unique_ptr<BatchSampler> sampler;
  std::vector<std::vector<std::int64_t>> micro_batches;
  std::vector<std::uint64_t> micro_batch_numbers;
  std::unique_ptr<HostMemory> host_memory;
  HostBatch host;
  std::unique_ptr<BatchPrefetcher> prefetcher;
};

}  // namespace mixtrain::core
