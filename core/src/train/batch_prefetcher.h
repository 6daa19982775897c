// BatchPrefetcher: the next training batch's host side (gather, augmentation) prepared on a loader
// thread while the current step computes, so the step's critical path only uploads it. Internal
// to the core.
//
// Contract
// - Constructed with its spare HostBatch (train/host_batch.h: sized, and in the backend's upload
//   memory where it has some, by the step's thread).
// - start(job, prepare): prepare(buffers) runs on a thread of its own, writing the spare
//   HostBatch (prepare calls its prepare_to_write() first: the batch sent from it before may still
//   be read by its upload); at most one job is in flight (start waits for the previous one first).
//   `job` names what is prepared: the batch's rows and its batch number (augmentation's key).
// - take(job, into): when the job in flight is `job` exactly, waits for it and swaps its buffers
//   with `into`, true; otherwise waits for it (a job is never abandoned while it writes), drops it
//   and returns false, and the caller prepares the batch itself. So every step sees exactly the
//   batch the synchronous path gives, whatever was guessed: the order and augmentation of the data
//   and a resume's bit-exactness do not depend on prefetching. A failure inside a taken job is
//   rethrown by take(); inside a dropped one it is dropped (the caller's own preparation meets it).
// - prepare() reads only what does not change while a run trains (the datasets, the augmentation
//   settings, the normalised black): the caller captures those, never the trainer's mutable state.
// - Destruction waits for the job in flight. One owner thread calls start() and take().
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <utility>
#include <vector>

#include "train/host_batch.h"

namespace mixtrain::core {

struct PrefetchJob {
  std::vector<std::int64_t> rows;
  std::uint64_t number = 0;
  friend bool operator==(const PrefetchJob&, const PrefetchJob&) = default;
};

class BatchPrefetcher {
 public:
  explicit BatchPrefetcher(HostBatch spare) : spare_(std::move(spare)) {}
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  void start(PrefetchJob job, std::function<void(HostBatch&)> prepare);
  bool take(const PrefetchJob& job, HostBatch& into);
  bool in_flight() const { return pending_.valid(); }

  // Jobs taken and dropped so far (the run's summary says how often the guess was right).
  std::int64_t taken() const { return taken_; }
  std::int64_t dropped() const { return dropped_; }

 private:
  void wait_quietly() noexcept;

  HostBatch spare_;
  PrefetchJob job_;
  std::future<void> pending_;
  std::int64_t taken_ = 0, dropped_ = 0;
};

}  // namespace mixtrain::core
