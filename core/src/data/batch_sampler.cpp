#include "mixtrain/core/data/batch_sampler.h"

#include "mixtrain/core/data/dataset.h"
#include "mixtrain/sdk/error.h"

#include <limits>
#include <numeric>
#include <string>

namespace mixtrain::core {

BatchSampler::BatchSampler(std::int64_t rows, std::int64_t batch_size, bool shuffle,
                           std::uint64_t seed)
    : rows_(rows), batch_size_(batch_size), batches_per_epoch_(0), shuffle_(shuffle), seed_(seed) {
  if (rows <= 0)
    throw sdk::DataError("batch sampler: the dataset has " + std::to_string(rows) + " rows",
                         "give a dataset with at least one row");
  if (batch_size <= 0)
    throw sdk::DataError(
        "batch sampler: batch_size must be >= 1, found " + std::to_string(batch_size),
        "set data.batch_size to a positive number");
  if (batch_size > rows)
    throw sdk::DataError(
        "batch sampler: batch_size " + std::to_string(batch_size) + " is larger than the " +
            std::to_string(rows) + " training rows, so no full batch exists",
        "lower data.batch_size to at most " + std::to_string(rows) + " or provide more data");
  batches_per_epoch_ = rows / batch_size;
}

void BatchSampler::fill_order(std::int64_t epoch, std::vector<std::int64_t>& order) const {
  order.resize(static_cast<std::size_t>(rows_));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  if (shuffle_) {
    // Stream e+1: stream 0 of the same seed is what split_holdout uses.
    DataRng rng(seed_, static_cast<std::uint64_t>(epoch) + 1);
    seeded_shuffle(order, rng);
  }
}

void BatchSampler::build_order(std::int64_t epoch) {
  if (order_epoch_ == epoch) return;
  fill_order(epoch, order_);
  order_epoch_ = epoch;
}

BatchSampler::Cursor BatchSampler::upcoming() const {
  if (position_ < batches_per_epoch_) return {epoch_, position_};
  // Unreachable from a checked checkpoint (epoch <= step <= run.steps), but a cursor set by any
  // caller must not overflow.
  if (epoch_ == std::numeric_limits<std::int64_t>::max())
    throw sdk::DataError("batch sampler: the epoch counter is at its maximum",
                         "the sampler state is damaged; resume from another checkpoint");
  return {epoch_ + 1, 0};
}

std::vector<std::int64_t> BatchSampler::peek() const {
  const Cursor at = upcoming();
  const auto begin = static_cast<std::ptrdiff_t>(at.position * batch_size_);
  std::vector<std::int64_t> aside;
  if (order_epoch_ != at.epoch) fill_order(at.epoch, aside);
  const std::vector<std::int64_t>& order = order_epoch_ == at.epoch ? order_ : aside;
  return {order.begin() + begin, order.begin() + begin + static_cast<std::ptrdiff_t>(batch_size_)};
}

std::span<const std::int64_t> BatchSampler::next() {
  const Cursor at = upcoming();
  epoch_ = at.epoch;
  position_ = at.position;
  build_order(epoch_);
  const auto begin = static_cast<std::size_t>(position_ * batch_size_);
  ++position_;
  return std::span<const std::int64_t>(order_).subspan(begin,
                                                       static_cast<std::size_t>(batch_size_));
}

void BatchSampler::set_cursor(Cursor cursor) {
  if (cursor.epoch < 0 || cursor.position < 0 || cursor.position > batches_per_epoch_)
    throw sdk::DataError("batch sampler: cursor (epoch " + std::to_string(cursor.epoch) +
                             ", batch " + std::to_string(cursor.position) +
                             ") is outside the epoch of " + std::to_string(batches_per_epoch_) +
                             " batches",
                         "the checkpoint was taken with a different dataset or batch_size; "
                         "resume with the same data settings");
  epoch_ = cursor.epoch;
  position_ = cursor.position;
}

}  // namespace mixtrain::core
