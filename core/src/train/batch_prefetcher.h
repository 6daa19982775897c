// BatchPrefetcher: the next training batch's host side (gather, augmentation) prepared on a loader
// thread while the current step computes, so the step's critical path only uploads it. Internal
// to the core.
//
// Contract
// - Constructed with its spare HostBatch (train/host_batch.h: sized, and in the backend's upload
//   memory where it has some, by the step's thread).
// - start(job, prepare): prepare(buffers) runs on the prefetcher's loader thread (one for its
//   whole life, started by the first job: a thread per batch would cost its start-up on every
//   step of a small model), writing the spare HostBatch (prepare calls its prepare_to_write()
//   first: the batch sent from it before may still be read by its upload); at most one job is in
//   flight (start waits for the previous one first). `job` names what is prepared: the batch's rows
//   and its batch number (augmentation's key).
// - take(job, into): when the job in flight is `job` exactly, waits for it and swaps its buffers
//   with `into`, true; otherwise waits for it (a job is never abandoned while it writes), drops it
//   and returns false, and the caller prepares the batch itself. So every step sees exactly the
//   batch the synchronous path gives, whatever was guessed: the order and augmentation of the data
//   and a resume's bit-exactness do not depend on prefetching. A failure inside a taken job is
//   rethrown by take(); inside a dropped one it is dropped (the caller's own preparation meets it).
// - prepare() reads only what does not change while a run trains (the datasets, the augmentation
//   settings, the normalised black): the caller captures those, never the trainer's mutable state.
// - Destruction waits for the job in flight, then ends the loader thread. One owner thread calls
//   start() and take().
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
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
  bool in_flight() const { return in_flight_; }

  // Jobs taken and dropped so far (the run's summary says how often the guess was right).
  std::int64_t taken() const { return taken_; }
  std::int64_t dropped() const { return dropped_; }

 private:
  void loop();
  std::exception_ptr wait();  // for the job in flight: its failure, if any
  void wait_quietly() noexcept;

  HostBatch spare_;
  PrefetchJob job_;
  bool in_flight_ = false;  // started, not yet taken or dropped (the owner's view)
  std::int64_t taken_ = 0, dropped_ = 0;
  // Shared with the loader thread, under mutex_: the job to run, whether it finished, its failure.
  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void(HostBatch&)> task_;
  bool done_ = false, stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace mixtrain::core
