// Seeded mini-batch index sampler with exact resume.
//
// Contract:
// - Yields batches of `batch_size` row indices in [0, rows); the last partial batch of an epoch
//   is dropped, so batches_per_epoch() = rows / batch_size (rows >= batch_size >= 1 required).
// - With shuffle, epoch e visits the rows in the permutation seeded_shuffle(DataRng(seed, e+1))
//   of 0..rows-1; without shuffle, in order. An epoch's order depends only on (seed, e), never on
//   history, so a Cursor is the whole state.
// - Cursor{epoch, position}: position = batches already returned from `epoch`, in
//   [0, batches_per_epoch()]. After set_cursor(c), next() returns exactly what a sampler that
//   had reported cursor() == c would have returned. The span from next() stays valid until the
//   next call to next() or set_cursor().
// - Bad arguments (sizes, a cursor out of range — e.g. a checkpoint taken with other data)
//   throw sdk::DataError. Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mixtrain::core {

class BatchSampler {
 public:
  BatchSampler(std::int64_t rows, std::int64_t batch_size, bool shuffle, std::uint64_t seed);

  // Indices of the next batch; moves to the next epoch (a new permutation) when exhausted.
  std::span<const std::int64_t> next();
  // A copy of what next() would return, without moving (at an epoch's end the next epoch's
  // permutation is built on the side): a loader thread prepares that batch ahead.
  std::vector<std::int64_t> peek() const;

  struct Cursor {
    std::int64_t epoch = 0, position = 0;
    friend bool operator==(const Cursor&, const Cursor&) = default;
  };
  Cursor cursor() const { return {epoch_, position_}; }
  void set_cursor(Cursor cursor);

  std::int64_t batches_per_epoch() const { return batches_per_epoch_; }
  std::int64_t rows() const { return rows_; }
  std::int64_t batch_size() const { return batch_size_; }

 private:
  void build_order(std::int64_t epoch);
  void fill_order(std::int64_t epoch, std::vector<std::int64_t>& order) const;
  // next()'s epoch and position once an exhausted epoch has rolled over.
  Cursor upcoming() const;

  std::int64_t rows_, batch_size_, batches_per_epoch_;
  bool shuffle_;
  std::uint64_t seed_;
  std::int64_t epoch_ = 0, position_ = 0;
  std::int64_t order_epoch_ = -1;  // epoch whose permutation is in order_
  std::vector<std::int64_t> order_;
};

}  // namespace mixtrain::core
